"""The bus messages that steer work rather than carry rows: dispatch wake-ups,
job events, a cron template's creation, row-workers' holding reports, rate-limit grants
and throttling events."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from relay_batches.messages.codec import MessageError, dump, load
from relay_batches.model import JobStatus


@dataclass(frozen=True)
class DispatchWakeup:
    """`<ns>.dispatch`: a job became runnable; a dispatcher should look at the ledger."""

    batch_id: str
    priority: int

    KIND = "dispatch"

    def encode(self) -> bytes:
        """Serialise for the bus."""
        return dump(self.KIND, {"batch_id": self.batch_id, "priority": self.priority})

    @classmethod
    def decode(cls, body: bytes) -> DispatchWakeup:
        """Parse a bus body; raise :class:`MessageError` if it is not one."""
        d = load(body, cls.KIND)
        try:
            return cls(batch_id=str(d["batch_id"]), priority=int(d["priority"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise MessageError(f"{cls.KIND}: {exc!r}") from exc


@dataclass(frozen=True)
class JobEvent:
    """`<ns>.events` (topic): ``job.progress``, ``job.finished`` or ``job.canceled``.

    ``latency_ms`` is the mean upstream time of the job's rows whose outcomes the event
    follows (0: none measured), by which the dispatcher paces the job's releases.
    ``level`` is the broker level of the job's rows a ``job.overtaking`` announces."""

    batch_id: str
    status: JobStatus
    total: int
    completed: int
    failed: int
    pauses: int = 0  # how many times the job was paused (``job.paused`` says which pause)
    latency_ms: float = 0.0
    level: int = 0

    KIND = "job"

    def encode(self) -> bytes:
        """Serialise for the bus."""
        body: dict[str, object] = {
            "batch_id": self.batch_id,
            "status": self.status,
            "total": self.total,
            "completed": self.completed,
            "failed": self.failed,
        }
        if self.pauses:
            body["pauses"] = self.pauses
        if self.latency_ms > 0:
            body["latency_ms"] = self.latency_ms
        if self.level > 0:
            body["level"] = self.level
        return dump(self.KIND, body)

    @classmethod
    def decode(cls, body: bytes) -> JobEvent:
        """Parse a bus body; raise :class:`MessageError` if it is not one."""
        d = load(body, cls.KIND)
        try:
            return cls(
                batch_id=str(d["batch_id"]),
                status=JobStatus(d["status"]),
                total=int(d["total"]),
                completed=int(d["completed"]),
                failed=int(d["failed"]),
                pauses=int(d.get("pauses") or 0),
                latency_ms=float(d.get("latency_ms", 0.0)),
                level=int(d.get("level") or 0),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise MessageError(f"{cls.KIND}: {exc!r}") from exc


@dataclass(frozen=True)
class TemplateCreated:
    """`<ns>.events` (topic) ``template.created``: a cron template was stored.

    A wake-up for the schedulers, so a template whose first tick is sooner than their
    current sleep is not late; the ledger (``next_run_at``) stays the truth.
    """

    template_id: str
    next_run_at: str

    KIND = "template"

    def encode(self) -> bytes:
        """Serialise for the bus."""
        return dump(self.KIND, {"template_id": self.template_id, "next_run_at": self.next_run_at})

    @classmethod
    def decode(cls, body: bytes) -> TemplateCreated:
        """Parse a bus body; raise :class:`MessageError` if it is not one."""
        d = load(body, cls.KIND)
        try:
            return cls(template_id=str(d["template_id"]), next_run_at=str(d["next_run_at"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise MessageError(f"{cls.KIND}: {exc!r}") from exc


@dataclass(frozen=True)
class HeldRows:
    """Rows of one job a row-worker holds (taken from the broker, outcome not yet out)."""

    batch_id: str
    rows: tuple[int, ...]


@dataclass(frozen=True)
class HoldingReport:
    """`<ns>.events` (topic) ``worker.holding``: a row-worker's heartbeat.

    ``held`` is every row the worker holds now; the report is valid for ``ttl_s``
    (a worker that stops reporting, killed or cut off, holds nothing after that).
    ``marks`` are ``(dispatcher, broker level, sent_at)`` of the latest slice per
    publishing dispatcher and broker level the worker took since its previous report:
    each dispatcher's evidence, on its own clock, of how far the broker's queue has
    been delivered of what it published. A mark of a worker that predates owners
    (two fields) has owner ``""``. ``concurrency`` is how many rows the worker runs at
    once (its ``RELAY_BATCH_CONCURRENCY``; 0 from a worker that predates it): dispatchers
    size their windows by the live fleet's concurrency.
    """

    worker: str
    ttl_s: float
    held: tuple[HeldRows, ...]
    marks: tuple[tuple[str, int, float], ...] = ()
    concurrency: int = 0

    KIND = "holding"

    def encode(self) -> bytes:
        """Serialise for the bus."""
        return dump(
            self.KIND,
            {
                "worker": self.worker,
                "ttl_s": self.ttl_s,
                "held": [[h.batch_id, list(h.rows)] for h in self.held],
                "marks": [list(m) for m in self.marks],
                "concurrency": self.concurrency,
            },
        )

    @classmethod
    def decode(cls, body: bytes) -> HoldingReport:
        """Parse a bus body; raise :class:`MessageError` if it is not one."""
        d = load(body, cls.KIND)
        try:
            return cls(
                worker=str(d["worker"]),
                ttl_s=float(d["ttl_s"]),
                held=tuple(HeldRows(str(b), tuple(int(i) for i in rows)) for b, rows in d["held"]),
                marks=tuple(_mark(m) for m in d.get("marks", [])),
                concurrency=max(0, int(d.get("concurrency", 0))),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise MessageError(f"{cls.KIND}: {exc!r}") from exc


def _mark(value: Any) -> tuple[str, int, float]:
    """One delivery mark: ``[owner, level, sent_at]``, or ``[level, sent_at]`` of a worker
    from before marks named their dispatcher (owner ``""``, which no dispatcher has)."""
    if len(value) == 2:
        return "", int(value[0]), float(value[1])
    owner, level, sent_at = value
    return str(owner), int(level), float(sent_at)


@dataclass(frozen=True)
class GrantMessage:
    """`<ns>.ratelimit.grants.<deployment>`: budget the rate-limit leader issued for one
    deployment, for whichever worker takes it: ``requests`` calls and ``tokens`` tokens,
    usable until ``expires_at`` (Unix seconds, on the leader's clock, which stamped it
    ``issued_at``: a worker whose clock differs reads it on its own by that offset).
    ``call_tokens`` is the leader's typical call (the unit it issues tokens in; 0: none
    known), which every worker averages in, so a new leader issues in the fleet's unit;
    ``leader`` names the issuer (a worker's clock offset is measured per leader)."""

    deployment: str
    requests: int
    tokens: int
    expires_at: float
    issued_at: float = 0.0  # 0: not given (read on the worker's clock as it is)
    call_tokens: int = 0
    leader: str = ""
    start_at: float = 0.0

    KIND = "grant"

    def encode(self) -> bytes:
        """Serialise for the bus."""
        return dump(
            self.KIND,
            {
                "deployment": self.deployment,
                "requests": self.requests,
                "tokens": self.tokens,
                "expires_at": self.expires_at,
                "issued_at": self.issued_at,
                "call_tokens": self.call_tokens,
                "leader": self.leader,
                "start_at": self.start_at,
            },
        )

    @classmethod
    def decode(cls, body: bytes) -> GrantMessage:
        """Parse a bus body; raise :class:`MessageError` if it is not one."""
        d = load(body, cls.KIND)
        try:
            return cls(
                deployment=str(d["deployment"]),
                requests=max(0, int(d["requests"])),
                tokens=max(0, int(d["tokens"])),
                expires_at=float(d["expires_at"]),
                issued_at=float(d.get("issued_at") or 0.0),
                call_tokens=max(0, int(d.get("call_tokens") or 0)),
                leader=str(d.get("leader") or ""),
                start_at=float(d.get("start_at") or 0.0),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise MessageError(f"{cls.KIND}: {exc!r}") from exc


@dataclass(frozen=True)
class ThrottledEvent:
    """`<ns>.events` (topic) ``ratelimit.throttled``: a call to ``deployment`` got a 429
    (or a retryable status with ``Retry-After``, in seconds; None without one)."""

    deployment: str
    retry_after: float | None = None

    KIND = "throttled"

    def encode(self) -> bytes:
        """Serialise for the bus."""
        return dump(self.KIND, {"deployment": self.deployment, "retry_after": self.retry_after})

    @classmethod
    def decode(cls, body: bytes) -> ThrottledEvent:
        """Parse a bus body; raise :class:`MessageError` if it is not one."""
        d = load(body, cls.KIND)
        try:
            retry_after = d.get("retry_after")
            return cls(
                deployment=str(d["deployment"]),
                retry_after=None if retry_after is None else max(0.0, float(retry_after)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise MessageError(f"{cls.KIND}: {exc!r}") from exc
