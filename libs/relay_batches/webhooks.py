"""Standard Webhooks signatures (https://www.standardwebhooks.com): what Relay sends and
how a receiver checks it.

Signed content is ``"{webhook-id}.{webhook-timestamp}.{body}"``; the key is the base64
part of the workspace secret (``whsec_…``); the header is ``v1,<base64 HMAC-SHA256>``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time

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
