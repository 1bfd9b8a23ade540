"""The local supervisor behind ``make run``: every service as its own process.

It starts the children :mod:`relay_batches.services.relay_dev.dev` describes (the upstream
simulator and every service), says where each one listens, restarts a child that dies (as
Kubernetes would, with one log line saying which and why), and on SIGINT/SIGTERM stops
them with SIGTERM in the order work flows (:data:`STOP_STAGES`), waiting for each stage
to drain before the next, so rows in flight finish against a simulator that is still up
and their outcomes are recorded by an aggregator that is still up.

Each child runs in its own session (a terminal's Ctrl-C reaches only the supervisor, which
then stops them in order) and, on Linux, is sent SIGTERM if the supervisor itself dies,
so a ``kill -9`` of ``relay dev`` leaves no service running.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from relay_batches.services.relay_dev.ports import HealthPort

RESTART_PAUSE_S = 1.0
MAX_RESTART_PAUSE_S = 30.0
STABLE_RUN_S = 30.0
STOP_TIMEOUT_S = 30.0
# Who stops first: intake (API, cron, dispatch), then the workers with rows in flight,
# then what records and tells, and the upstream simulator last.
STOP_STAGES = (
    ("ingest-api", "scheduler", "dispatcher"),
    ("row-worker", "offloader"),
    ("aggregator", "notifier"),
    ("upstream-sim",),
)
PR_SET_PDEATHSIG = 1


@dataclass
class Child:
    """One supervised process: ``health`` is its health port (given to it as
    ``RELAY_HEALTH_PORT`` at every start), ``where`` what else to say it listens on."""

    name: str
    argv: list[str]
    env: dict[str, str]
    health: HealthPort | None = None
    where: str = ""
    process: asyncio.subprocess.Process | None = None
    restarts: int = 0
    started_at: float = field(default=0.0)
    crash_streak: int = 0


def say(message: str) -> None:
    """One line for the person running ``make run`` (stderr, so logs stay JSON)."""
    print(f"[relay dev] {message}", file=sys.stderr, flush=True)


async def start(child: Child) -> None:
    """Start ``child``'s process and say, in one line, its pid and where it listens."""
    where = child.where
    if child.health is not None:
        port, moved = child.health.claim()
        child.env["RELAY_HEALTH_PORT"] = str(port)
        where = (
            f"health {child.health.url}"
            + (" (moved: the last port is taken)" if moved else "")
            + (f"; {child.where}" if child.where else "")
        )
    child.process = await asyncio.create_subprocess_exec(
        *child.argv, env=child.env, start_new_session=True, preexec_fn=_die_with_parent()
    )
    child.started_at = time.monotonic()
    say(f"{child.name} (pid {child.process.pid}) started" + (f"; {where}" if where else ""))


async def supervise(children: list[Child], stop: asyncio.Event) -> None:
    """Run every child, restart the ones that die, stop them all when ``stop`` is set."""
    for child in children:
        await start(child)
    watchers = {asyncio.create_task(_watch(c, stop), name=f"watch-{c.name}") for c in children}
    await stop.wait()
    say("stopping every service")
    for stage in stop_stages(children):
        for child in stage:
            if child.process and child.process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    child.process.send_signal(signal.SIGTERM)
        await _wait_all(stage)
    for task in watchers:
        task.cancel()
    await asyncio.gather(*watchers, return_exceptions=True)


def stop_stages(children: list[Child]) -> list[list[Child]]:
    """``children`` grouped by :data:`STOP_STAGES` (a name matches its stage's prefix, so
    ``row-worker-2`` stops with the row-workers); anything unknown stops with the last."""

    def stage_of(child: Child) -> int:
        for n, names in enumerate(STOP_STAGES):
            if any(child.name == name or child.name.startswith(f"{name}-") for name in names):
                return n
        return len(STOP_STAGES) - 1

    stages: list[list[Child]] = [[] for _ in STOP_STAGES]
    for child in children:
        stages[stage_of(child)].append(child)
    return [stage for stage in stages if stage]


def _die_with_parent() -> Callable[[], None] | None:
    """A pre-exec hook that asks Linux to SIGTERM the child when the supervisor dies."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)

    def request() -> None:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)

    return request


def exit_reason(code: int) -> str:
    """Why a child ended, from its return code (negative: killed by that signal)."""
    if code >= 0:
        return f"exited with code {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    return f"was killed by {name}"


def restart_pause(child: Child, now: float) -> float:
    """Pause before restarting: short after a long run, doubling while it keeps crashing
    at once (Kubernetes' crash-loop back-off, in small)."""
    if now - child.started_at >= STABLE_RUN_S:
        child.crash_streak = 0
    pause = min(MAX_RESTART_PAUSE_S, RESTART_PAUSE_S * 2.0**child.crash_streak)
    child.crash_streak += 1
    return pause


async def _watch(child: Child, stop: asyncio.Event) -> None:
    while not stop.is_set():
        assert child.process is not None
        code = await child.process.wait()
        if stop.is_set():
            return
        child.restarts += 1
        pause = restart_pause(child, time.monotonic())
        say(
            f"{child.name} (pid {child.process.pid}) {exit_reason(code)}; "
            f"restarting in {pause:g}s (restart #{child.restarts})"
        )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), pause)
        if not stop.is_set():
            await start(child)


async def _wait_all(children: list[Child]) -> None:
    async def wait_one(child: Child) -> None:
        if child.process is None:
            return
        try:
            await asyncio.wait_for(child.process.wait(), STOP_TIMEOUT_S)
        except TimeoutError:
            say(f"{child.name} did not stop in {STOP_TIMEOUT_S:g}s; killing it")
            with contextlib.suppress(ProcessLookupError):
                child.process.kill()
            await child.process.wait()

    await asyncio.gather(*(wait_one(c) for c in children))
