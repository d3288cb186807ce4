"""One error tree for the whole pipeline, and one rule for what is worth retrying.

::

    BillingError
    ├── InputError                  permanent: the input is wrong, retrying cannot help
    │   ├── FileRefused             a batch file cannot be read at all (nothing is enqueued)
    │   ├── ReferenceDataError      an invalid price book or tax table
    │   └── PoisonMessage           a queue message that can never be processed
    ├── InfrastructureError         transient: storage, SQL or the bus failed; retry later
    └── ConfigurationError          settings or credentials are wrong; never retried, never failed
                                    over; raised in a handler, it stops the role (its message is
                                    handed back)

The SDKs' exceptions sort into the same two sides, by :func:`is_transient` (the one rule the
listener, the back-off, the failover and the trigger buses apply):

    transient   InfrastructureError; ServiceRequestError, ServiceResponseError (no answer),
                OSError and timeouts; HTTP 5xx, 408 and 429; Service Bus errors other than
                those below (connection lost, server busy, timeouts)
    permanent   InputError, ConfigurationError; ClientAuthenticationError; other HTTP 4xx;
                ServiceBusAuthenticationError, ServiceBusAuthorizationError; anything else

Row-level problems are not exceptions: rejected rows are data (a reason code per row).
"""

from __future__ import annotations

import sys

#: HTTP statuses below 500 that still say "try again later": request timeout, too many requests.
TRANSIENT_STATUSES = frozenset({408, 429})


class BillingError(Exception):
    """Base of every error the pipeline raises on purpose."""


class InputError(BillingError):
    """Permanent: the input itself is wrong."""


class FileRefused(InputError):
    """A batch file that cannot be read at all; it is refused whole."""


class ReferenceDataError(InputError):
    """An invalid price book or tax table."""


class PoisonMessage(InputError):
    """A message that can never be processed; it goes to the poison queue with this reason."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


class InfrastructureError(BillingError):
    """Transient: a dependency failed; the work stays queued and is retried."""


class ConfigurationError(BillingError):
    """Settings or credentials are wrong; retrying or failing over cannot help."""


def is_transient(exc: BaseException) -> bool:
    """Whether the operation that raised ``exc`` may succeed if tried again later (after the SDK's
    own retries): an outage, a timeout, a busy or failing service. False for wrong input, wrong
    settings or credentials, refused requests and errors of unknown kind."""
    if isinstance(exc, BillingError):
        return isinstance(exc, InfrastructureError)
    from azure.core.exceptions import (  # here: the command line imports this module, not always the SDK
        ClientAuthenticationError,
        HttpResponseError,
        ServiceRequestError,
        ServiceResponseError,
    )

    # The Service Bus SDK is loaded only where a bus is configured: if it is not, exc is none of its errors.
    if (bus := sys.modules.get("azure.servicebus.exceptions")) is not None and isinstance(exc, bus.ServiceBusError):
        return not isinstance(exc, (bus.ServiceBusAuthenticationError, bus.ServiceBusAuthorizationError))
    if isinstance(exc, ClientAuthenticationError):
        return False
    if isinstance(exc, HttpResponseError) and exc.status_code is not None:
        return exc.status_code >= 500 or exc.status_code in TRANSIENT_STATUSES
    return isinstance(exc, (ServiceRequestError, ServiceResponseError, OSError, TimeoutError))
