"""Structured JSON logs with the current RPC's request id.

Every record becomes one JSON object per line with ``time`` (UTC, ISO 8601), ``level``, ``logger``,
``message``, the RPC context (``service``, ``method``, ``request_id``) when the record was logged
while an RPC ran, and any ``extra=`` fields (the runtime's access log adds ``code`` and
``duration_ms``). The RPC context lives in a :mod:`contextvars` variable that the server
interceptor sets per call, so logs from domain code carry the request id without passing it around.
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
import traceback
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import IO, Any


@dataclass(frozen=True)
class RpcContext:
    """Identifies the RPC being served: ``service`` is the full proto name, ``method`` the RPC name."""

    service: str
    method: str
    request_id: str


current_rpc: contextvars.ContextVar[RpcContext | None] = contextvars.ContextVar("grpo_rpc", default=None)

# Attributes every LogRecord has; anything else on a record came from ``extra=``.
_RECORD_ATTRIBUTES = frozenset(
    vars(logging.LogRecord("", 0, "", 0, "", None, None)).keys() | {"message", "asctime", "taskName"}
)


def current_request_id() -> str | None:
    """The request id of the RPC this code runs under, or None outside an RPC."""
    rpc = current_rpc.get()
    return rpc.request_id if rpc else None


class JsonFormatter(logging.Formatter):
    """Formats a record as a single-line JSON object (see the module docstring for the keys)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        rpc = current_rpc.get()
        if rpc is not None:
            entry.update(service=rpc.service, method=rpc.method, request_id=rpc.request_id)
        for key, value in vars(record).items():
            if key not in _RECORD_ATTRIBUTES and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exception"] = "".join(traceback.format_exception(*record.exc_info)).rstrip()
        elif record.stack_info:
            entry["stack"] = record.stack_info
        return json.dumps(entry, default=str, ensure_ascii=False)


def configure_logging(level: str | int = "INFO", stream: IO[str] | None = None) -> logging.Handler:
    """Send every log record of the process as JSON lines to ``stream`` (default stderr).

    Replaces the root logger's handlers, so calling it twice does not duplicate lines. Returns the
    handler it installed.
    """
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    # grpc's own C-core logs go through absl, not here; its Python loggers are chatty at DEBUG.
    logging.getLogger("grpc").setLevel(max(root.level, logging.INFO))
    return handler
