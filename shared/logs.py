"""Logging for every process: one format, secrets scrubbed from every record, the trace and span
ids of the work a record is about (when telemetry runs, see :mod:`shared.telemetry`)."""

from __future__ import annotations

import logging
import re

from opentelemetry import trace

_SECRET = re.compile(r"(AccountKey|SharedAccessKey|sig|Password)=[^;&\s]+", re.IGNORECASE)
_URL_PASSWORD = re.compile(r"(://[^/:@\s]+:)[^/@\s]+@")


def redact(text: str) -> str:
    """``text`` with account keys, SAS signatures and passwords (``Password=`` and in URLs) replaced by ``***``."""
    return _URL_PASSWORD.sub(r"\1***@", _SECRET.sub(lambda m: f"{m.group(1)}=***", text))


class RedactingFormatter(logging.Formatter):
    """Scrubs secrets from every formatted log record, tracebacks included."""

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


class TraceIds(logging.Filter):
    """Gives each record a ``trace`` field: `` trace_id=… span_id=…`` of the current span (the ids
    Jaeger and Application Insights' ``operation_Id`` show), empty outside one or with telemetry off."""

    def filter(self, record: logging.LogRecord) -> bool:
        context = trace.get_current_span().get_span_context()
        record.trace = f" trace_id={context.trace_id:032x} span_id={context.span_id:016x}" if context.is_valid else ""
        return True


def configure_logging(verbose: bool = False) -> None:
    """Log to stderr through :class:`RedactingFormatter`, with :class:`TraceIds`; the Azure SDK and
    Alembic only from warnings up."""
    handler = logging.StreamHandler()
    handler.addFilter(TraceIds())
    handler.setFormatter(RedactingFormatter("%(asctime)s %(processName)s %(name)s %(levelname)s%(trace)s %(message)s"))
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, handlers=[handler], force=True)
    for noisy in ("azure", "azure.core.pipeline.policies.http_logging_policy", "alembic", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
