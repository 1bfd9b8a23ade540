"""What the offload clients share: custom ids, the provider's state of a batch, a result
line, and reading a streamed JSONL body line by line in bounded memory.

A line's ``custom_id`` is ``<offload batch id>-<job id>-<row index>``: digits, the job's
32 hex characters and a hyphen or two, so it fits Anthropic's ``^[a-zA-Z0-9_-]{1,64}$``
(and OpenAI's free-form ids); :func:`parse_custom_id` reads it back and refuses anything
else (a line the provider made up, or another record's).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
import orjson

from relay_batches.ids import is_valid_id
from relay_batches.router.aliases import Deployment
from relay_batches.router.types import ProviderReply

# A reply is read up to the router's cap; a result line holds one and its envelope.
MAX_LINE_BYTES = 8 * 1024 * 1024 + 64 * 1024
READ_CHUNK = 64 * 1024
ERROR_SNIPPET_CHARS = 200
MAX_JSON_BYTES = 1024 * 1024
PARSE_LINES = 256  # result lines parsed together in a worker thread
PARSE_BYTES = 8 * 1024 * 1024
_CUSTOM_ID = re.compile(r"^([0-9]{1,19})-([0-9a-f]{32})-([0-9]{1,10})$")


async def read_capped(response: aiohttp.ClientResponse, limit: int) -> bytes:
    """The body, read until EOF or until it exceeds ``limit`` bytes (then ``limit + 1``)."""
    declared = response.content_length
    if declared is not None and declared <= limit:
        return await response.read()  # the usual case: one read of a known, small body
    parts: list[bytes] = []
    size = 0
    while size <= limit:
        chunk = await response.content.read(limit + 1 - size)
        if not chunk:
            break
        parts.append(chunk)
        size += len(chunk)
    return b"".join(parts)


def custom_id(offload_id: int, batch_id: str, row_index: int) -> str:
    """The ``custom_id`` of a row's line in provider batch ``offload_id``."""
    return f"{offload_id}-{batch_id}-{row_index}"


def parse_custom_id(value: Any, offload_id: int) -> tuple[str, int] | None:
    """``(job id, row index)`` of a line of provider batch ``offload_id``, or None when
    ``value`` is not one of its custom ids."""
    match = _CUSTOM_ID.match(value) if isinstance(value, str) else None
    if match is None or int(match[1]) != offload_id or not is_valid_id(match[2]):
        return None
    return match[2], int(match[3])


class ProviderError(Exception):
    """A provider call failed; ``permanent`` when trying again cannot help (a 4xx other
    than 408/409/429: the request itself is refused)."""

    def __init__(self, message: str, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent


@dataclass(frozen=True, slots=True)
class ProviderState:
    """A provider batch as a poll found it.

    ``ended``: its results may be read (or it failed whole: ``failed`` says why, and
    every row goes realtime); ``progress`` counts the requests it finished (a poll that
    sees it grow resets the backoff); ``output`` and ``errors`` locate its results
    (OpenAI's output and error files; Anthropic's results URL in ``output``).
    """

    ended: bool
    progress: int = 0
    output: str | None = None
    errors: str | None = None
    failed: str | None = None


@dataclass(frozen=True, slots=True)
class ResultLine:
    """One line of a provider batch's results: its row, and the reply when the request
    succeeded (None: failed, errored, expired or canceled; the row goes realtime)."""

    batch_id: str
    row_index: int
    reply: ProviderReply | None


class BatchClient(Protocol):
    """A provider's batch API, as the offloader drives it."""

    deployment: Deployment

    def line(
        self,
        offload_id: int,
        batch_id: str,
        row_index: int,
        messages: Sequence[Mapping[str, Any]],
        params: Mapping[str, Any],
        endpoint: str = "/v1/chat/completions",
    ) -> bytes:
        """One request of the input, built as a realtime call of the row would be (a
        row of another ``endpoint`` than chat: ``params`` is its body); raises
        UnsupportedRequest for what the provider cannot take."""

    def frame(self) -> tuple[bytes, bytes, bytes]:
        """The input's opening, the separator between lines and its closing."""

    async def find(self, offload_id: int, rows: int, since: float) -> list[str]:
        """Provider batches that may be the one made for record ``offload_id`` (``rows``
        requests, created at or after ``since``, Unix seconds), best match first."""

    async def upload(self, offload_id: int, path: str) -> str | None:
        """Upload the input at ``path`` as a file if the API takes one (its id), else
        None (the input goes with :meth:`create`)."""

    async def create(self, offload_id: int, path: str, input_file_id: str | None) -> str:
        """Create the batch of record ``offload_id`` (from the uploaded file, or the
        input at ``path``); its provider id."""

    async def status(self, provider_id: str) -> ProviderState:
        """The batch's state now."""

    async def cancel(self, provider_id: str) -> None:
        """Ask the provider to cancel the batch (it ends with what it finished)."""

    def results(self, state: ProviderState, offload_id: int) -> AsyncIterator[ResultLine]:
        """Every result line of an ended batch, streamed."""


def decoded_line(raw: bytes, offload_id: int) -> tuple[tuple[str, int], dict[str, Any]] | None:
    """A result line's row (from its custom id) and its object; None when the line is
    not JSON, not an object, or names no row of provider batch ``offload_id``."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(data, dict):
        return None
    key = parse_custom_id(data.get("custom_id"), offload_id)
    return None if key is None else (key, data)


def transfer_timeout(deployment: Deployment) -> aiohttp.ClientTimeout:
    """A provider batch call's timeout: uploads and downloads may be large, so it bounds
    each connect and read by the deployment's ``timeout_s``, not the whole transfer."""
    return aiohttp.ClientTimeout(
        total=None, sock_connect=deployment.timeout_s, sock_read=deployment.timeout_s
    )


async def json_lines(response: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
    """The non-empty lines of a streamed body, each at most :data:`MAX_LINE_BYTES`
    (a longer one is skipped whole: its row, missing from the results, goes realtime).
    Memory holds one line and one read at most."""
    pending = bytearray()
    skipping = False
    async for chunk in response.content.iter_chunked(READ_CHUNK):
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            if not skipping:
                pending += chunk[start:end]
                if pending.strip() and len(pending) <= MAX_LINE_BYTES:
                    yield bytes(pending)
            pending.clear()
            skipping = False
            start = end + 1
        if not skipping:
            pending += chunk[start:]
            if len(pending) > MAX_LINE_BYTES:
                pending.clear()
                skipping = True
    if pending.strip() and not skipping:
        yield bytes(pending)


async def result_lines(
    response: aiohttp.ClientResponse,
    offload_id: int,
    parse: Callable[[bytes, int], ResultLine | None],
) -> AsyncIterator[ResultLine]:
    """The result lines of a streamed body, parsed by ``parse`` a page at a time (at
    most :data:`PARSE_LINES` lines or about :data:`PARSE_BYTES`) in a worker thread:
    decoding lines of up to 8 MB, tens of thousands of them, would otherwise hold the
    event loop (health checks, lease renewals) for the whole read."""
    page: list[bytes] = []
    size = 0
    async for raw in json_lines(response):
        page.append(raw)
        size += len(raw)
        if len(page) >= PARSE_LINES or size >= PARSE_BYTES:
            for line in await asyncio.to_thread(_parse_page, page, offload_id, parse):
                yield line
            page, size = [], 0
    if page:
        for line in await asyncio.to_thread(_parse_page, page, offload_id, parse):
            yield line


def _parse_page(
    page: list[bytes], offload_id: int, parse: Callable[[bytes, int], ResultLine | None]
) -> list[ResultLine]:
    return [line for raw in page if (line := parse(raw, offload_id)) is not None]


async def request_json(
    session: aiohttp.ClientSession,
    method: str,
    url: str,
    what: str,
    headers: Mapping[str, str],
    timeout: aiohttp.ClientTimeout,
    **kwargs: Any,
) -> dict[str, Any]:
    """One call whose reply is a JSON object (read to its end, at most
    :data:`MAX_JSON_BYTES`);
    :class:`ProviderError` for a failed call or an unusable reply."""
    try:
        async with session.request(
            method, url, headers=headers, timeout=timeout, allow_redirects=False, **kwargs
        ) as response:
            await check(response, what)
            body = await read_capped(response, MAX_JSON_BYTES)
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise ProviderError(f"{what}: {exc.__class__.__name__}") from exc
    if len(body) > MAX_JSON_BYTES:
        raise ProviderError(f"{what}: the reply is larger than {MAX_JSON_BYTES} bytes")
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise ProviderError(f"{what}: the reply is not JSON") from None
    if not isinstance(data, dict):
        raise ProviderError(f"{what}: the reply is not an object")
    return data


def string_of(data: Mapping[str, Any], key: str, what: str) -> str:
    """``data[key]``, a non-empty string, else :class:`ProviderError`."""
    value = data.get(key)
    if not isinstance(value, str) or not value:
        raise ProviderError(f"{what}: the reply has no {key}")
    return value


def objects(value: Any) -> list[dict[str, Any]]:
    """The objects of a list (a listing's ``data``); none for anything else."""
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


async def check(response: aiohttp.ClientResponse, what: str) -> None:
    """Raise :class:`ProviderError` unless ``response`` is a 2xx (its body's start in the
    message; permanent for a 4xx other than 408, 409 and 429)."""
    if 200 <= response.status < 300:
        return
    body = await response.content.read(ERROR_SNIPPET_CHARS)
    snippet = body.decode("utf-8", "replace")
    permanent = 400 <= response.status < 500 and response.status not in (408, 409, 429)
    raise ProviderError(f"{what}: HTTP {response.status}: {snippet}", permanent)
