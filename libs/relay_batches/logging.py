"""JSON logs: one line per event on stdout with a stable ``action`` key and the service name,
and ``request_id`` in every line written while an API request is served
(:func:`request_id_context`)."""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

import orjson

_RESERVED = set(vars(logging.LogRecord("", 0, "", 0, "", None, None)).keys()) | {"message"}
_REQUEST_ID: ContextVar[str | None] = ContextVar("relay_request_id", default=None)


@contextlib.contextmanager
def request_id_context(request_id: str) -> Iterator[None]:
    """Within the block (and the tasks it starts), log lines carry ``request_id``."""
    token = _REQUEST_ID.set(request_id)
    try:
        yield
    finally:
        _REQUEST_ID.reset(token)


class JsonFormatter(logging.Formatter):
    """Render a record as one JSON object: ts, level, service, action, then its extras."""

    def __init__(self, service: str) -> None:
        super().__init__()
        self._service = service

    def format(self, record: logging.LogRecord) -> str:
        """Format ``record``; ``extra=`` fields become top-level keys."""
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "service": self._service,
            "action": record.getMessage(),
        }
        request_id = _REQUEST_ID.get()
        if request_id is not None:
            out["request_id"] = request_id
        for key, value in record.__dict__.items():
            if key not in _RESERVED and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(out, default=str).decode()


def setup_logging(service: str, level: str = "INFO") -> logging.Logger:
    """Send every log record of this process to stdout as JSON; return the service logger."""
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(JsonFormatter(service))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.getLogger("aiormq").setLevel("WARNING")
    logging.getLogger("aio_pika").setLevel("WARNING")
    logging.getLogger("aiohttp.access").setLevel("WARNING")
    return logging.getLogger(f"relay.{service}")
