"""The ``Idempotency-Key`` header: validate it, hash the request, replay a stored response."""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable

from aiohttp import web

from relay_batches.errors import ApiError, invalid
from relay_batches.ledger.idempotency import (
    IdempotencyClaim,
    IdempotencyStore,
    KeyTaken,
    StoredResponse,
)

HEADER = "Idempotency-Key"
MAX_KEY_CHARS = 255


def claim_for(request: web.Request, workspace_id: str, raw_body: bytes) -> IdempotencyClaim | None:
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


Respond = Callable[[IdempotencyClaim | None], Awaitable[web.Response]]


async def idempotent(
    request: web.Request,
    store: IdempotencyStore,
    workspace_id: str,
    canonical_body: bytes,
    respond: Respond,
) -> web.Response:
    """Run ``respond`` once per ``Idempotency-Key``: replay the first response otherwise.

    ``respond`` gets the claim to record inside its creating transaction (None when the
    request has no key) and may raise :class:`KeyTaken` if a concurrent twin won.
    """
    claim = claim_for(request, workspace_id, canonical_body)
    if claim is None:
        return await respond(None)
    stored = await store.find(workspace_id, claim.key)
    if stored is not None:
        return replay(stored, claim)
    try:
        return await respond(claim)
    except KeyTaken:
        stored = await store.find(workspace_id, claim.key)
        if stored is None:
            raise ApiError(409, "a concurrent request holds this key", HEADER) from None
        return replay(stored, claim)
