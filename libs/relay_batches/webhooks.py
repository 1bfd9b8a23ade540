"""Standard Webhooks signatures (https://www.standardwebhooks.com): what Relay sends and
how a receiver checks it; and the OpenAI event a webhook endpoint is sent.

Signed content is ``"{webhook-id}.{webhook-timestamp}.{body}"``; the key is the base64
part of the secret (``whsec_…``: the workspace's, or a webhook endpoint's); the header is
``v1,<base64 HMAC-SHA256>``.

A webhook endpoint's body is an OpenAI event, ``{id: "evt_…", object: "event", type,
created_at, data: {id}}``, whose ``type`` is ``batch.<how the batch ended>`` and whose
``data.id`` is the batch's id as the surface that created it shows it; the event id is
its ``webhook-id`` too, as OpenAI's are.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from typing import Any

import orjson

from relay_batches.dialects.anthropic.render import ID_PREFIX as ANTHROPIC_PREFIX
from relay_batches.dialects.openai.render import BATCH_PREFIX as OPENAI_PREFIX
from relay_batches.model import JobStatus

SECRET_PREFIX = "whsec_"
TOLERANCE_S = 5 * 60


def _key(secret: str) -> bytes:
    return base64.b64decode(secret.removeprefix(SECRET_PREFIX))


def signature(secret: str, message_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` header value for one message."""
    signed = f"{message_id}.{timestamp}.".encode() + body
    digest = hmac.new(_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def signed_headers(
    secret: str, message_id: str, body: bytes, now: float | None = None
) -> dict[str, str]:
    """The three Standard Webhooks headers for ``body``."""
    timestamp = int(time.time() if now is None else now)
    return {
        "webhook-id": message_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": signature(secret, message_id, timestamp, body),
    }


def verify(secret: str, headers: dict[str, str], body: bytes, now: float | None = None) -> bool:
    """Check a received webhook: a matching v1 signature and a timestamp within 5 min."""
    try:
        message_id = headers["webhook-id"]
        timestamp = int(headers["webhook-timestamp"])
        received = headers["webhook-signature"].split()
    except (KeyError, ValueError):
        return False
    current = time.time() if now is None else now
    if abs(current - timestamp) > TOLERANCE_S:
        return False
    expected = signature(secret, message_id, timestamp, body)
    return any(hmac.compare_digest(expected, candidate) for candidate in received)


EVENT_PREFIX = "evt_"
# The event each way a batch ends sends (OpenAI's spelling: ``cancelled``).
EVENT_TYPES: dict[JobStatus, str] = {
    JobStatus.COMPLETED: "batch.completed",
    JobStatus.FAILED: "batch.failed",
    JobStatus.CANCELED: "batch.cancelled",
    JobStatus.EXPIRED: "batch.expired",
}
ALL_EVENTS: tuple[str, ...] = tuple(EVENT_TYPES.values())
# The surfaces whose batch ids carry a prefix (``batches.surface``, or the OpenAI link).
SURFACE_PREFIXES: dict[str, str] = {"openai": OPENAI_PREFIX, "anthropic": ANTHROPIC_PREFIX}


def shown_batch_id(job_id: str, surface: str | None) -> str:
    """The id of job ``job_id`` as the surface that created it shows it (None: native)."""
    return SURFACE_PREFIXES.get(surface or "", "") + job_id


def batch_event(event_id: str, event_type: str, created_at: int, batch_id: str) -> bytes:
    """The body of one OpenAI event about a batch, as a webhook endpoint receives it."""
    event: dict[str, Any] = {
        "id": event_id,
        "object": "event",
        "type": event_type,
        "created_at": created_at,
        "data": {"id": batch_id},
    }
    return orjson.dumps(event)
