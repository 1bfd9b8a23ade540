"""The ``make run`` supervisor: a child that dies is restarted, with one line saying why.

Real child processes (a sleeping Python), real signals; no servers needed.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys

import pytest

from relay_batches.services.relay_dev import supervisor
from relay_batches.services.relay_dev.supervisor import Child, exit_reason, restart_pause, supervise
from tests.helpers.support import wait_until

SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]


def test_exit_reason_names_the_signal_or_the_code() -> None:
    assert exit_reason(-signal.SIGKILL) == "was killed by SIGKILL"
    assert exit_reason(-signal.SIGSEGV) == "was killed by SIGSEGV"
    assert exit_reason(3) == "exited with code 3"
    assert exit_reason(0) == "exited with code 0"


def test_restart_pause_backs_off_a_crash_loop_and_resets_after_a_stable_run() -> None:
    child = Child("x", SLEEPER, {})
    pauses = [restart_pause(child, now=child.started_at + 0.1) for _ in range(7)]
    assert pauses == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert restart_pause(child, now=child.started_at + supervisor.STABLE_RUN_S) == 1.0


async def test_a_killed_child_is_restarted_with_one_line_saying_which_and_why(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(supervisor, "RESTART_PAUSE_S", 0.05)
    children = [Child("row-worker", SLEEPER, dict(os.environ)), Child("notifier", SLEEPER, {})]
    stop = asyncio.Event()
    running = asyncio.create_task(supervise(children, stop))
    try:

        async def all_started() -> bool:
            return all(c.process is not None for c in children)

        await wait_until(all_started, 10, "both children to start")
        worker = children[0]
        assert worker.process is not None
        first_pid = worker.process.pid
        os.kill(first_pid, signal.SIGKILL)

        async def restarted() -> bool:
            proc = worker.process
            return proc is not None and proc.pid != first_pid and proc.returncode is None

        await wait_until(restarted, 10, "the killed child to be restarted")
        assert worker.restarts == 1
        assert children[1].restarts == 0
    finally:
        stop.set()
        await asyncio.wait_for(running, 30)
    lines = [line for line in capsys.readouterr().err.splitlines() if "restarting" in line]
    assert lines == [
        f"[relay dev] row-worker (pid {first_pid}) was killed by SIGKILL; "
        "restarting in 0.05s (restart #1)"
    ]
    assert all(c.process is not None and c.process.returncode is not None for c in children)
