"""Logging for every process: one format, secrets scrubbed from every record."""

from __future__ import annotations

import logging
import re

_SECRET = re.compile(r"(AccountKey|SharedAccessKey|sig|Password)=[^;&\s]+", re.IGNORECASE)
_URL_PASSWORD = re.compile(r"(://[^/:@\s]+:)[^/@\s]+@")


def redact(text: str) -> str:
    """``text`` with account keys, SAS signatures and passwords (``Password=`` and in URLs) replaced by ``***``."""
    return _URL_PASSWORD.sub(r"\1***@", _SECRET.sub(lambda m: f"{m.group(1)}=***", text))


class RedactingFormatter(logging.Formatter):
    """Scrubs secrets from every formatted log record, tracebacks included."""

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


def configure_logging(verbose: bool = False) -> None:
    """Log to stderr through :class:`RedactingFormatter`; the Azure SDK and Alembic only from warnings up."""
    handler = logging.StreamHandler()
    handler.setFormatter(RedactingFormatter("%(asctime)s %(processName)s %(name)s %(levelname)s %(message)s"))
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, handlers=[handler], force=True)
    for noisy in ("azure", "azure.core.pipeline.policies.http_logging_policy", "alembic", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
