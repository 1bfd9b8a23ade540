"""The ``Idempotency-Key`` header: validate it, hash the request, replay a stored response.

A creating handler asks, in order: :func:`claim_for` (the key and request hash, or None),
:func:`stored_response` (the first answer for this key, if there was one), then creates
with the claim; when the store raises :class:`KeyTaken` (a concurrent twin won),
:func:`raced_response` answers with the twin's response.
"""

from __future__ import annotations

import hashlib

from aiohttp import web

from relay_batches.errors import ApiError, invalid
from relay_batches.ledger.idempotency import IdempotencyClaim, IdempotencyStore, StoredResponse

HEADER = "Idempotency-Key"
MAX_KEY_CHARS = 255


def claim_for(
    request: web.Request, workspace_id: str, raw_body: bytes | bytearray
) -> IdempotencyClaim | None:
    """The request's claim, or None without the header; 400 for an unusable key.

    The hash covers method, path and the body bytes (a multipart caller passes a
    canonical encoding of its parts instead, since boundaries differ per request).
    """
    key = request.headers.get(HEADER)
    if key is None:
        return None
    if not 0 < len(key) <= MAX_KEY_CHARS or not key.isascii() or not key.isprintable():
        raise invalid(f"{HEADER} must be 1 to {MAX_KEY_CHARS} printable ASCII characters", HEADER)
    digest = hashlib.sha256()
    digest.update(f"{request.method} {request.path}\n".encode())
    digest.update(raw_body)
    return IdempotencyClaim(workspace_id, key, digest.digest())


def replay(stored: StoredResponse, claim: IdempotencyClaim) -> web.Response:
    """The first response for this key; 409 if the key was used for another request."""
    if stored.request_hash != claim.request_hash:
        raise ApiError(
            409, f"{HEADER} {claim.key!r} was already used with a different request", HEADER
        )
    return web.Response(
        text=stored.body,
        status=stored.status,
        content_type="application/json",
        headers={"Idempotent-Replayed": "true"},
    )


async def stored_response(
    store: IdempotencyStore, claim: IdempotencyClaim | None
) -> web.Response | None:
    """The replay of the first response for ``claim``'s key; None if there is none yet."""
    if claim is None:
        return None
    stored = await store.find(claim.workspace_id, claim.key)
    return None if stored is None else replay(stored, claim)


async def raced_response(store: IdempotencyStore, claim: IdempotencyClaim | None) -> web.Response:
    """After :class:`KeyTaken`: the response of the concurrent request that won the key."""
    replayed = await stored_response(store, claim)
    if replayed is None:
        raise ApiError(409, "a concurrent request holds this key", HEADER)
    return replayed
