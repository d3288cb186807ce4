"""What every console and API action that changes something needs (poison replay and purge, close, void):
``BILLING_CONSOLE_TOKEN`` configured and given (compared in constant time), a POST, and a CSRF value: a random
value a page (or ``GET /api/csrf``) puts in a ``SameSite=Strict`` cookie, which the form must carry too. Without
a configured token the console is read-only: no forms, and every action is refused."""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import Form, HTTPException, Request, Response
from fastapi.responses import HTMLResponse

from shared.settings import Settings

CSRF_COOKIE = "billing_csrf"

#: The form fields an action carries.
Token = Annotated[str, Form(description="the console token (BILLING_CONSOLE_TOKEN)")]
Csrf = Annotated[str, Form(description="the CSRF value of the `billing_csrf` cookie (GET /api/csrf)")]


def csrf_value(request: Request) -> str:
    """The request's CSRF value, or a new one."""
    return request.cookies.get(CSRF_COOKIE) or secrets.token_urlsafe(32)


def set_csrf(response: Response, value: str) -> None:
    """Give the browser ``value`` as its CSRF cookie (read by the server only)."""
    response.set_cookie(CSRF_COOKIE, value, httponly=True, samesite="strict", path="/")


def form_page(
    request: Request, settings: Settings, render: Callable[..., str], *args: Any, **context: Any
) -> HTMLResponse:
    """A page that may carry action forms: ``render(*args, actions=…, csrf=…, **context)``, ``actions`` true when a
    token is configured (then the CSRF cookie is set too)."""
    csrf = csrf_value(request)
    actions = settings.console_token is not None
    page = HTMLResponse(render(*args, actions=actions, csrf=csrf, **context))
    if actions:
        set_csrf(page, csrf)
    return page


def authorise(request: Request, settings: Settings, token: str, csrf: str) -> None:
    """Refuse the action (403, one line) unless a token is configured, the CSRF value matches the cookie's, and
    ``token`` is the configured one."""
    configured = settings.console_token
    if configured is None:
        raise HTTPException(403, "the console is read-only: BILLING_CONSOLE_TOKEN is not set")
    cookie = request.cookies.get(CSRF_COOKIE, "")
    if not cookie or not hmac.compare_digest(cookie.encode(), csrf.encode()):
        raise HTTPException(403, "the form is stale or came from elsewhere (CSRF check failed): reload the page")
    if not hmac.compare_digest(configured.get_secret_value().encode(), token.encode()):
        raise HTTPException(403, "wrong console token")
