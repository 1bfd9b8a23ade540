"""Standard Webhooks signing and verification."""

from __future__ import annotations

import base64
import hashlib
import hmac

from relay_batches.webhooks import signature, signed_headers, verify

SECRET = "whsec_" + base64.b64encode(bytes(range(32))).decode()
BODY = b'{"id":"abc","status":"completed"}'
NOW = 1_790_000_000


def test_signature_is_hmac_sha256_of_id_timestamp_body() -> None:
    expected = base64.b64encode(
        hmac.new(bytes(range(32)), b"msg_1.1790000000." + BODY, hashlib.sha256).digest()
    ).decode()
    assert signature(SECRET, "msg_1", NOW, BODY) == "v1," + expected


def test_signed_headers_verify() -> None:
    headers = signed_headers(SECRET, "msg_1", BODY, now=NOW)
    assert headers["webhook-id"] == "msg_1"
    assert headers["webhook-timestamp"] == str(NOW)
    assert verify(SECRET, headers, BODY, now=NOW + 10)


def test_tampered_body_timestamp_or_secret_fail() -> None:
    headers = signed_headers(SECRET, "msg_1", BODY, now=NOW)
    assert not verify(SECRET, headers, BODY.replace(b"completed", b"failed"), now=NOW)
    assert not verify(SECRET, {**headers, "webhook-timestamp": str(NOW + 1)}, BODY, now=NOW)
    other = "whsec_" + base64.b64encode(b"x" * 32).decode()
    assert not verify(other, headers, BODY, now=NOW)


def test_old_or_future_timestamps_fail() -> None:
    headers = signed_headers(SECRET, "msg_1", BODY, now=NOW)
    assert not verify(SECRET, headers, BODY, now=NOW + 301)
    assert not verify(SECRET, headers, BODY, now=NOW - 301)


def test_missing_headers_fail() -> None:
    assert not verify(SECRET, {}, BODY, now=NOW)
