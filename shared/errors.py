"""One error tree for the whole pipeline.

::

    BillingError
    ├── InputError                  permanent: the input is wrong, retrying cannot help
    │   ├── FileRefused             a batch file cannot be read at all (nothing is enqueued)
    │   ├── ReferenceDataError      an invalid price book or tax table
    │   └── PoisonMessage           a queue message that can never be processed
    ├── InfrastructureError         transient: storage, SQL or the bus failed; retry later
    └── ConfigurationError          settings or credentials are wrong; never retried, never failed over

Row-level problems are not exceptions: rejected rows are data (a reason code per row).
"""

from __future__ import annotations


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
