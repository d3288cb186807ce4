"""The ASGI application of ``billing serve``: the JSON API under ``/api`` (OpenAPI at ``/openapi.json``), the
console's pages, and their static script; served by uvicorn on 127.0.0.1 unless told otherwise."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager

import sqlalchemy as sa
import uvicorn
from azure.core.exceptions import AzureError
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from fastapi.staticfiles import StaticFiles
from starlette.middleware.trustedhost import TrustedHostMiddleware

from shared.errors import BillingError
from shared.logs import redact
from shared.settings import Settings
from store import Store

from . import api, ledger_api, ledger_pages, pages

log = logging.getLogger(__name__)

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
#: Scripts only from this server; styles inline (the pages' and the SVG charts'); nothing else from anywhere.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; connect-src 'self'; style-src 'unsafe-inline'; img-src 'self' data:; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


def create_app(settings: Settings, store: Store | None = None, *, allowed_hosts: Sequence[str] = ("*",)) -> FastAPI:
    """The API and the console over ``store`` (default: the configured one) and the storage of ``settings``,
    answering only requests whose ``Host`` is one of ``allowed_hosts``."""
    opened = store or Store(settings.sql_url_value, stalled_after=settings.stalled_after)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        if store is None:
            opened.close()

    app = FastAPI(
        title="Billing pipeline",
        summary="Batches, aggregates and invoices across batches, documents and periods, roles, queues, poison, cost; "
        "close and void behind the console token and CSRF.",
        description="Money fields (`net`, `tax`, `total`) are exact integers in minor units of the row's `currency`.",
        version="1",
        docs_url=None,  # the interactive docs would load their scripts from a CDN
        redoc_url=None,
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.store = opened
    app.include_router(api.router)
    app.include_router(ledger_api.router)
    app.include_router(pages.router)
    app.include_router(ledger_pages.router)
    app.mount("/static", StaticFiles(packages=[("billing.console", "static")]), name="static")
    app.add_middleware(TrustedHostMiddleware, allowed_hosts=list(allowed_hosts))

    @app.middleware("http")
    async def security_headers(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        response = await call_next(request)
        response.headers.update(SECURITY_HEADERS)
        return response

    @app.exception_handler(AzureError)
    @app.exception_handler(BillingError)
    @app.exception_handler(sa.exc.OperationalError)
    async def unavailable(request: Request, exc: Exception) -> JSONResponse:
        log.warning("%s %s: %s", request.method, request.url.path, redact(str(exc)))
        return JSONResponse({"detail": "storage or SQL unavailable; try again"}, status_code=503)

    return app


def serve(settings: Settings, *, host: str, port: int) -> None:
    """Serve the API and the console until interrupted. Bound to loopback, it answers only requests naming a
    loopback host, so that a web page elsewhere cannot read it through DNS rebinding."""
    allowed = LOOPBACK_HOSTS if host in LOOPBACK_HOSTS else ("*",)
    uvicorn.run(create_app(settings, allowed_hosts=allowed), host=host, port=port, server_header=False)
