"""The upstream simulator for ``make container-check``, run from the host's virtualenv.

The image carries neither the simulator nor ``relay dev`` (dev-only: pyproject.toml keeps
them out of the wheel it installs), so the check runs the simulator as the tests do, the
module of the source tree, on a loopback port the containers reach over the host's
network; and it checks that the image has neither.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp

from relay_batches.services.relay_cli.__main__ import DEV_MISSING
from tests.container.podman import Podman
from tests.helpers.support import wait_until

SIM_MODULE = "relay_batches.services.upstream_sim"
DEV_MODULE = "relay_batches.services.relay_dev"
# Run in the image: where each dev-only module is found (None: nowhere) and whether a
# relay-upstream-sim is on its PATH.
_PROBE = (
    "import importlib.util, shutil, sys;"
    " print(*(importlib.util.find_spec(n) for n in sys.argv[1:]),"
    " shutil.which('relay-upstream-sim'))"
)


def check_image_has_no_dev_code(podman: Podman, image: str) -> str:
    """Fail unless ``image`` has no simulator, no ``relay dev`` and no simulator
    launcher, and its ``relay dev`` says it is not in this build; a note for the step."""
    found = podman.out(
        "run", "--rm", "--network", "none", image, "python", "-c", _PROBE, SIM_MODULE, DEV_MODULE
    )
    assert found == "None None None", found
    dev = podman.run("run", "--rm", "--network", "none", image, "relay", "dev", check=False)
    assert (dev.returncode, dev.stderr.strip()) == (1, DEV_MISSING), (dev.returncode, dev.stderr)
    return "no upstream_sim, no relay_dev, no relay-upstream-sim; `relay dev`: not in this build"


class HostSimulator:
    """The simulator as a process of this machine on ``127.0.0.1:port``, its output in
    ``log``."""

    def __init__(self, port: int, log: Path, latency_ms: int) -> None:
        self.port = port
        self.log = log
        self.latency_ms = latency_ms
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start it (in a session of its own, so a stop reaches it alone)."""
        env = {
            **os.environ,
            "RELAY_SIM_HOST": "127.0.0.1",
            "RELAY_SIM_PORT": str(self.port),
            "RELAY_SIM_LATENCY_MS": str(self.latency_ms),
        }
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", SIM_MODULE],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    async def wait_ready(self, http: aiohttp.ClientSession, timeout: float) -> None:
        """Wait until its ``/healthz`` answers 200; fail if it exits first."""

        async def ready() -> bool:
            assert self.process is not None and self.process.poll() is None, self.log.read_text()
            try:
                async with http.get(f"http://127.0.0.1:{self.port}/healthz") as response:
                    return response.status == 200
            except aiohttp.ClientError:
                return False

        await wait_until(ready, timeout, "the host's upstream simulator to answer /healthz")

    def stop(self, grace_s: float) -> int:
        """SIGTERM, then its exit code once it exited within ``grace_s`` (killed past it:
        the code then says so)."""
        if self.process is None:
            return 0
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(grace_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait(10)

    def errors(self) -> list[str]:
        """Its error-level log lines and tracebacks."""
        lines = self.log.read_text(errors="replace").splitlines()
        return [
            line[:200]
            for line in lines
            if '"level":"error"' in line or '"level":"critical"' in line or "Traceback" in line
        ]
