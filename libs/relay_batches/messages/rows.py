"""The bus messages that carry rows: slices of rows to run (with each row's chat
request) and the outcomes row-workers send back."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from relay_batches.messages.codec import MessageError, dump, load

UNPAUSED = -1
ENDPOINT_KEY = "endpoint"  # a stored row's endpoint (dialects.endpoints.ENDPOINT_KEY)
# A results body up to its outcomes list (see :meth:`OutcomesMessage.encode_parts`).
_RESULTS_HEAD = dump("results", {"outcomes": []})[: -len(b"[]}")]


@dataclass(frozen=True)
class SliceRow:
    """One row of a slice: its index in the job and its chat request (raw JSON text).

    ``request_json`` is as ``batch_rows.request`` stores it: the row's messages array,
    or an object with ``messages`` and the row's own fields (see :class:`RowRequest`).
    """

    index: int
    request_json: str


@dataclass(frozen=True, slots=True)
class RowRequest:
    """One row's chat request as a worker runs it.

    ``model`` is the row's own alias (None: the job's); ``params`` are the row's own
    request fields (tools, tool_choice, max_tokens, …), which override the job's.
    ``endpoint`` is the row's OpenAI endpoint: None for chat; for another (embeddings,
    …) ``messages`` is empty and ``params`` is the row's whole body.
    """

    messages: list[Any]
    model: str | None = None
    params: dict[str, Any] | None = None
    endpoint: str | None = None


def request_json(request: RowRequest) -> str:
    """The JSON text :func:`row_request` reads back as ``request`` (a row's stored
    ``request``: its messages array, or an object with them and its own fields)."""
    if request.endpoint is not None:
        body = {**(request.params or {}), ENDPOINT_KEY: request.endpoint}
        if request.model is not None:
            body["model"] = request.model
        return orjson.dumps(body).decode()
    if request.model is None and not request.params:
        return orjson.dumps(request.messages).decode()
    fields: dict[str, Any] = {**(request.params or {}), "messages": request.messages}
    if request.model is not None:
        fields["model"] = request.model
    return orjson.dumps(fields).decode()


def row_request(value: Any) -> RowRequest:
    """A decoded ``request_json``: a messages array, or an object holding ``messages``."""
    if isinstance(value, list):
        return RowRequest(value)
    if not isinstance(value, dict):
        raise TypeError(f"row request is not an array or object: {type(value).__name__}")
    fields = dict(value)
    endpoint = fields.pop(ENDPOINT_KEY, None)
    model = fields.pop("model", None)
    if model is not None and not isinstance(model, str):
        raise TypeError("row model is not a string")
    if endpoint is not None:
        if not isinstance(endpoint, str):
            raise TypeError("row endpoint is not a string")
        return RowRequest([], model, fields, endpoint)
    messages = _message_list(fields.pop("messages", None))
    return RowRequest(messages, model, fields or None)


@dataclass(frozen=True)
class SliceMessage:
    """`<ns>.rows`: a slice of consecutive rows of one job for a row-worker."""

    batch_id: str
    model: str
    rows: tuple[SliceRow, ...]
    params_json: str = "{}"
    level: int = 0  # the broker priority the slice is published at
    sent_at: float = 0.0  # on the publishing dispatcher's own clock
    owner: str = ""  # the publishing dispatcher, whose clock ``sent_at`` reads
    expires_at: float = 0.0  # the job's deadline, Unix seconds (0: none): no row starts after
    # The job's workspace: its calls go over connections of that workspace's own. Empty
    # (a slice the offloader forwards): the job's own connections.
    workspace: str = ""
    # The job's pause count when it was released (see row_worker.controls); UNPAUSED: a
    # slice the offloader forwards, whose rows a pause never hands back.
    pauses: int = 0
    # Re-sent by stall recovery: some of its rows may have an outcome by the time a
    # worker takes it (recorded since, or on its way), so the worker checks first.
    resent: bool = False

    KIND = "rows"

    def encode(self) -> bytes:
        """Serialise for the bus; row messages are embedded as raw JSON fragments."""
        return dump(
            self.KIND,
            {
                "batch_id": self.batch_id,
                "model": self.model,
                "params": orjson.Fragment(self.params_json),
                "rows": [[r.index, orjson.Fragment(r.request_json)] for r in self.rows],
                "level": self.level,
                "sent_at": self.sent_at,
                "owner": self.owner,
                "expires_at": self.expires_at,
                "workspace": self.workspace,
                **({"pauses": self.pauses} if self.pauses else {}),
                **({"resent": True} if self.resent else {}),  # absent: a first send
            },
        )

    @classmethod
    def decode(cls, body: bytes) -> DecodedSlice:
        """Parse a bus body into a slice whose row requests are already decoded."""
        d = load(body, cls.KIND)
        try:
            rows = tuple((int(i), row_request(m)) for i, m in d["rows"])
            params = d.get("params") or {}
            if not isinstance(params, dict):
                raise TypeError("params is not an object")
            return DecodedSlice(
                str(d["batch_id"]),
                str(d["model"]),
                rows,
                params,
                int(d.get("level", 0)),
                float(d.get("sent_at", 0.0)),
                str(d.get("owner", "")),
                float(d.get("expires_at") or 0.0),
                str(d.get("workspace") or ""),
                int(d.get("pauses") or 0),
                bool(d.get("resent", False)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise MessageError(f"{cls.KIND}: {exc!r}") from exc


def _message_list(value: Any) -> list[Any]:
    """A row's messages as decoded; anything but a JSON array is malformed."""
    if not isinstance(value, list):
        raise TypeError(f"row messages are not an array: {type(value).__name__}")
    return value


@dataclass(frozen=True)
class DecodedSlice:
    """A :class:`SliceMessage` as a worker sees it: rows are ``(index, request)`` pairs."""

    batch_id: str
    model: str
    rows: tuple[tuple[int, RowRequest], ...]
    params: dict[str, Any] = field(default_factory=dict)
    level: int = 0
    sent_at: float = 0.0
    owner: str = ""
    expires_at: float = 0.0
    workspace: str = ""
    pauses: int = 0
    resent: bool = False

    @property
    def tenant(self) -> str:
        """Whose connections the slice's calls use: its workspace's, or (a slice that
        names none) its job's own, never another tenant's."""
        return self.workspace or f"job:{self.batch_id}"

    def with_rows(self, rows: Sequence[tuple[int, RowRequest]]) -> SliceMessage:
        """A slice message of this one's job, level, marks and deadline holding ``rows``
        (a stopping worker hands the rows it did not start back this way)."""
        return SliceMessage(
            self.batch_id,
            self.model,
            tuple(SliceRow(index, request_json(request)) for index, request in rows),
            orjson.dumps(self.params).decode(),
            self.level,
            self.sent_at,
            self.owner,
            self.expires_at,
            self.workspace,
            self.pauses,
            self.resent,
        )


@dataclass(slots=True)
class RowOutcome:
    """The outcome of one row: content or error, with attempts and usage.

    With content, the whole answer: ``tool_calls`` (JSON text of the chat-completions
    ``tool_calls`` array, None when the model called none), ``finish_reason``
    (chat-completions vocabulary: stop, length, tool_calls, content_filter) and
    ``model`` (the model that answered, as its provider named it). ``latency_ms`` is
    the row's time in the router (every attempt and backoff included), ``cost_usd``
    what the answering deployment's ``price`` makes of its tokens (None: unpriced).
    ``body`` is the provider's whole reply (JSON text) when it carries more than those
    fields hold (several choices, log probabilities, audio, …), else None.
    ``cached_tokens`` counts the prompt tokens read from the provider's prompt cache,
    ``all_realtime_usd`` what the tokens would have cost at the realtime reference
    price (None: none priced).
    """

    batch_id: str
    row_index: int
    content: str | None
    error: str | None
    attempts: int
    dead_letter: bool = False
    deployment: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    tool_calls: str | None = None
    finish_reason: str | None = None
    model: str | None = None
    latency_ms: int | None = None
    cost_usd: float | None = None
    body: str | None = None
    lane: str | None = None  # the lane that answered when not realtime: batch, flex
    cached_tokens: int = 0
    all_realtime_usd: float | None = None

    def as_list(self) -> list[Any]:
        """Compact positional form used on the wire."""
        return [
            self.batch_id,
            self.row_index,
            self.content,
            self.error,
            self.attempts,
            self.dead_letter,
            self.deployment,
            self.prompt_tokens,
            self.completion_tokens,
            self.tool_calls,
            self.finish_reason,
            self.model,
            self.latency_ms,
            self.cost_usd,
            *self._tail(),
        ]

    def _tail(self) -> tuple[Any, ...]:
        """The optional fields after ``cost_usd`` (body, lane, cached tokens, all-realtime
        cost), up to the last that carries something."""
        tail = (self.body, self.lane, self.cached_tokens or None, self.all_realtime_usd)
        end = len(tail)
        while end and tail[end - 1] is None:
            end -= 1
        return tail[:end]


@dataclass(frozen=True)
class OutcomesMessage:
    """`<ns>.results`: several row outcomes published together by one worker, or the
    ``(batch_id, row_index, pauses)`` of rows it hands back unstarted (``returned``: their
    job was paused; ``pauses`` is the count of the release they came from; the aggregator
    records them for the job's next release)."""

    outcomes: tuple[RowOutcome, ...]
    returned: tuple[tuple[str, int, int], ...] = ()

    KIND = "results"

    def encode(self) -> bytes:
        """Serialise for the bus."""
        payload: dict[str, Any] = {"outcomes": [o.as_list() for o in self.outcomes]}
        if self.returned:
            payload["returned"] = [list(r) for r in self.returned]
        return dump(self.KIND, payload)

    @classmethod
    def encode_parts(cls, parts: Sequence[bytes]) -> bytes:
        """The bus body of outcomes already encoded one by one (``orjson.dumps`` of each
        one's :meth:`RowOutcome.as_list`): the same bytes as :meth:`encode`, without
        encoding any outcome twice (a worker measures each one's size as it comes)."""
        return b"".join((_RESULTS_HEAD, b"[", b",".join(parts), b"]}"))

    @classmethod
    def decode(cls, body: bytes) -> OutcomesMessage:
        """Parse a bus body; raise :class:`MessageError` if it is not one."""
        d = load(body, cls.KIND)
        try:
            outcomes = tuple(_outcome(o) for o in d["outcomes"])
            returned = tuple((str(b), int(i), int(p)) for b, i, p in d.get("returned") or ())
        except (KeyError, TypeError, ValueError) as exc:
            raise MessageError(f"{cls.KIND}: {exc!r}") from exc
        return cls(outcomes, returned)


def _outcome(value: Any) -> RowOutcome:
    """One outcome of the wire's positional form; the last nine fields are optional
    (a worker from before whole answers sends nine, one from before details twelve, an
    outcome without a ``body`` fourteen, one without a lane fifteen, and one without
    cached tokens or an all-realtime cost sixteen)."""
    b, i, c, e, a, dl, dep, pt, ct, *answer = value
    tool_calls, finish_reason, model, latency_ms, cost_usd, body, lane, cached, realtime = (
        *answer,
        *[None] * 9,
    )[:9]
    return RowOutcome(
        batch_id=str(b),
        row_index=int(i),
        content=c,
        error=e,
        attempts=int(a),
        dead_letter=bool(dl),
        deployment=dep,
        prompt_tokens=int(pt),
        completion_tokens=int(ct),
        tool_calls=tool_calls,
        finish_reason=finish_reason,
        model=model,
        latency_ms=None if latency_ms is None else int(latency_ms),
        cost_usd=None if cost_usd is None else float(cost_usd),
        body=None if body is None else str(body),
        lane=None if lane is None else str(lane),
        cached_tokens=int(cached or 0),
        all_realtime_usd=None if realtime is None else float(realtime),
    )
