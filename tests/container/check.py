"""``make container-check``: the image, its services and the dev overlay, run for real.

With podman (root) on this machine, against its Postgres and RabbitMQ:

1. podman, runc and mmdebstrap are installed with apt when missing; a Debian bookworm
   base with Python 3.11 is built locally unless ``RELAY_BASE_IMAGE`` names one (a real
   user passes ``docker.io/library/python:3.11-slim-bookworm``); the image is built from
   ``deploy/docker/Dockerfile`` and must hold exactly the lock's packages, and neither the
   upstream simulator nor ``relay dev`` (dev-only: ``relay dev`` says it is not there).
2. ``relay migrate`` and every service run from the image on the host's network, on a
   fresh database and bus namespace, with the simulator run from the host's virtualenv
   (tests/container/sim.py); each container runs as uid 10001 with a read-only
   root, no capabilities and no-new-privileges, answers ``/healthz`` ``/readyz``
   ``/metrics``; a batch submitted through the containerised ingest-api completes with
   exact results and its webhook; SIGTERM stops each container with exit 0 within the
   grace period its Deployment gives it.
3. the dev overlay, rendered and adapted (tests/container/kube.py says how and why; its
   simulator is again the host's), runs under ``podman kube play``: the migration Pod,
   then every Deployment, each pod ready, with its ConfigMap and Secret env and its
   security context; a batch completes through it, with its webhook.

Every listener is on a free port of 127.0.0.1. Every container, pod, volume and secret
is named with the run's prefix and removed at the end, failed or not, with the databases
and queues; the last step checks that nothing is left. One line per step, with its time;
podman's commands and outputs go to test-output/container-check/podman.log.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aio_pika
import aiohttp
import asyncpg
import yaml

from relay_batches.bus.topology import Names
from relay_batches.services.relay_cli import admin
from tests.container import kube
from tests.container.podman import (
    Podman,
    base_tag,
    build_base,
    build_image,
    install_tools,
    missing_tools,
)
from tests.container.sim import HostSimulator, check_image_has_no_dev_code
from tests.deploy.manifests import K8S, ROOT, kustomize
from tests.helpers.processes import SERVICES
from tests.helpers.support import (
    AMQP_URL,
    PG_ADMIN_URL,
    ApiClient,
    Isolation,
    WebhookReceiver,
    create_isolation,
    drop_isolation,
    free_port,
    rows,
    wait_until,
)

# The tag the build leaves for people (and for the build cache); each run also tags the
# exact image it built with its own prefix and runs only that, so a concurrent run that
# re-tags ``IMAGE`` cannot swap the image under it (its tag goes in the cleanup).
IMAGE = "localhost/relay-batches:check"
UID = 10001
OUTPUT = ROOT / "test-output" / "container-check"
# How every container of the plain run is started: on the host's network (its 127.0.0.1
# is the host's), a read-only root with no tmpfs of podman's own, nothing privileged.
HARDENED = (
    "--network",
    "host",
    "--read-only",
    "--read-only-tmpfs=false",
    "--cap-drop",
    "ALL",
    "--security-opt",
    "no-new-privileges",
)
BATCH_ROWS = 20
UPLOAD_ROWS = 5
DRAIN_ROWS = 400  # with SIM_LATENCY_MS, seconds of work for 4 slots: in flight at the stop
SIM_LATENCY_MS = 50
READY_TIMEOUT_S = 90.0
BATCH_TIMEOUT_S = 120.0


class Steps:
    """Prints one line per step: its name, its time and what it found."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.passed = 0
        self.failed = 0

    @contextmanager
    def step(self, name: str) -> Iterator[list[str]]:
        """Time the body; it appends what it found to the yielded list."""
        notes: list[str] = []
        began = time.monotonic()
        try:
            yield notes
        except BaseException:
            self.failed += 1
            print(f"FAIL {name:<40} {time.monotonic() - began:6.1f}s", flush=True)
            raise
        self.passed += 1
        print(f"ok   {name:<40} {time.monotonic() - began:6.1f}s  {'; '.join(notes)}", flush=True)

    def total(self) -> float:
        """Seconds since the first step."""
        return time.monotonic() - self.started


def _grace_periods() -> dict[str, int]:
    """Each dev Deployment's terminationGracePeriodSeconds, by name."""
    return {
        doc["metadata"]["name"]: int(
            doc["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        )
        for doc in kustomize(K8S / "overlays" / "dev")
        if doc["kind"] == "Deployment"
    }


def _proc_status(podman: Podman, container: str) -> dict[str, str]:
    """``/proc/1/status`` of a container, as a dict."""
    text = podman.out("exec", container, "cat", "/proc/1/status")
    return dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)


def check_hardened(podman: Podman, container: str) -> None:
    """The container's first process runs as uid 10001 with no capabilities and
    no-new-privileges, and its root filesystem refuses a write even from root."""
    status = _proc_status(podman, container)
    uids, gids = status["Uid"].split(), status["Gid"].split()
    assert set(uids) == {str(UID)} and set(gids) == {str(UID)}, (container, uids, gids)
    for caps in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(status[caps], 16) == 0, (container, caps, status[caps])
    assert status["NoNewPrivs"].strip() == "1", (container, status["NoNewPrivs"])
    write = podman.run("exec", "--user", "0", container, "touch", "/relay-probe", check=False)
    assert write.returncode != 0 and "Read-only file system" in write.stderr, (container, write)


async def check_probes(
    http: aiohttp.ClientSession, name: str, health_port: int, api_port: int | None
) -> None:
    """/healthz and /readyz answer 200 on the health port (and on ingest-api's API port),
    /metrics exposes Prometheus text on the health port only."""
    base = f"http://127.0.0.1:{health_port}"
    for path in ("/healthz", "/readyz"):
        async with http.get(base + path) as response:
            assert response.status == 200, (name, path, response.status)
    async with http.get(base + "/metrics") as response:
        text = await response.text()
        assert response.status == 200 and response.content_type == "text/plain", (name, response)
        assert "# TYPE process_resident_memory_bytes gauge" in text, name
    if api_port is not None:
        api = f"http://127.0.0.1:{api_port}"
        for path in ("/healthz", "/readyz"):
            async with http.get(api + path) as response:
                assert response.status == 200, (name, "api", path, response.status)
        async with http.get(api + "/metrics") as response:
            assert response.status == 404, ("/metrics must not be on the public port", response)


async def wait_answer(
    http: aiohttp.ClientSession,
    podman: Podman,
    container: str,
    port: int,
    path: str,
    status: int | None = None,
) -> int:
    """Poll ``path`` on ``port`` until it answers (with ``status``, when given), failing
    early if the container exits; return the status it answered."""
    answered: list[int] = []

    async def answers() -> bool:
        _running(podman, container)
        try:
            async with http.get(
                f"http://127.0.0.1:{port}{path}", timeout=aiohttp.ClientTimeout(2)
            ) as response:
                answered.append(response.status)
                return status is None or response.status == status
        except (aiohttp.ClientError, TimeoutError):
            return False

    try:
        await wait_until(answers, READY_TIMEOUT_S, f"{container} {path} {status}", every=0.5)
    except AssertionError as exc:
        logs = podman.run("logs", "--tail", "20", container, check=False)
        raise AssertionError(f"{exc}; its last logs:\n{logs.stdout}{logs.stderr}") from None
    return answered[-1]


async def wait_ready(
    http: aiohttp.ClientSession, podman: Podman, container: str, port: int, path: str
) -> None:
    """Poll ``path`` on ``port`` until it answers 200, failing early if the container exits."""
    await wait_answer(http, podman, container, port, path, 200)


def _running(podman: Podman, container: str) -> None:
    state = podman.out("inspect", "--format", "{{.State.Status}}", container)
    if state not in ("running", "created", "configured"):
        logs = podman.run("logs", "--tail", "20", container, check=False)
        raise AssertionError(f"{container} is {state}: {logs.stdout}{logs.stderr}")


async def run_batch(
    http: aiohttp.ClientSession, api_url: str, key: str, hooks: WebhookReceiver, label: str
) -> str:
    """Submit a batch with a webhook; wait for ``completed``, exact results, the webhook."""
    api = ApiClient(api_url, key, http)
    created = await api.submit(
        {"model": "gpt-4o-mini", "requests": rows(BATCH_ROWS), "webhookUrl": hooks.url}
    )
    batch = await api.wait_status(created["id"], {"completed", "failed"}, BATCH_TIMEOUT_S)
    assert batch["status"] == "completed", batch
    assert (batch["completed"], batch["failed"]) == (BATCH_ROWS, 0), batch
    results = await api.results(created["id"])
    assert results["data"] == [
        {"custom_id": f"r-{i}", "content": f"echo: row {i}"} for i in range(BATCH_ROWS)
    ], results

    async def hooked() -> list[dict[str, Any]]:
        return hooks.for_batch(created["id"])

    (body,) = await wait_until(hooked, 30, f"the {label} batch's webhook")
    assert (body["status"], body["completed"]) == ("completed", BATCH_ROWS), body
    return str(created["id"])


async def run_upload(http: aiohttp.ClientSession, api_url: str, key: str) -> str:
    """Upload a file of rows (spooled to disk by ingest-api); wait for its job to complete."""
    api = ApiClient(api_url, key, http)
    form = aiohttp.FormData(default_to_multipart=True)
    form.add_field("model", "gpt-4o-mini")
    lines = "".join(f"line {i}\n" for i in range(UPLOAD_ROWS)).encode()
    form.add_field("file", lines, filename="rows.csv", content_type="text/csv")
    status, body = await api.request("POST", "/v1/batches/upload", data=form)
    assert status == 201, (status, body)
    (job,) = body["data"]
    batch = await api.wait_status(job["id"], {"completed", "failed"}, BATCH_TIMEOUT_S)
    assert (batch["status"], batch["completed"]) == ("completed", UPLOAD_ROWS), batch
    return str(job["id"])


async def _completed_rows(database_url: str, batch_id: str) -> int:
    conn = await asyncpg.connect(database_url, timeout=10)
    try:
        return int(await conn.fetchval("SELECT completed FROM batches WHERE id = $1", batch_id))
    finally:
        await conn.close()


async def _ledger_migrated(database_url: str) -> int:
    conn = await asyncpg.connect(database_url, timeout=10)
    try:
        return int(await conn.fetchval("SELECT count(*) FROM schema_migrations"))
    finally:
        await conn.close()


def _lock_pins() -> dict[str, str]:
    """Name to version of every package the lock pins (names normalised)."""
    text = (ROOT / "deploy" / "docker" / "requirements.lock").read_text()
    return {
        _normal(name): version
        for name, version in re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", text, re.MULTILINE)
    }


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


BUILD_ONLY = {"setuptools", "wheel", "packaging"}


def check_image_holds_the_lock(podman: Podman, image: str) -> int:
    """The image's virtualenv holds the lock's runtime packages at their pinned versions,
    the project, pip, and nothing else (the build backend is removed)."""
    frozen = podman.out("run", "--rm", "--network", "none", image, "pip", "freeze", "--all")
    installed: dict[str, str] = {}
    for line in frozen.splitlines():
        if " @ " in line:
            installed[_normal(line.split(" @ ")[0])] = "local"
        else:
            name, _, version = line.partition("==")
            installed[_normal(name)] = version
    expected = {n: v for n, v in _lock_pins().items() if n not in BUILD_ONLY}
    assert installed.pop("relay-batches") == "local", installed
    installed.pop("pip")
    assert installed == expected, {
        "extra": sorted(set(installed.items()) - set(expected.items())),
        "missing": sorted(set(expected.items()) - set(installed.items())),
    }
    return len(expected)


def distinct_free_ports() -> Callable[[], int]:
    """A :func:`free_port` that never gives one port twice: each is free when picked and
    released at once, so two picks could otherwise land on the same port."""
    given: set[int] = set()

    def pick() -> int:
        while (port := free_port()) in given:
            pass
        given.add(port)
        return port

    return pick


class Run:
    """One run: its prefix, podman, cleanups in reverse order, the pieces in between."""

    def __init__(self, workdir: Path) -> None:
        self.prefix = f"rc{os.getpid()}x{int(time.time()) % 100000}"
        self.image = f"localhost/relay-batches:{self.prefix}"
        self.free_port = distinct_free_ports()
        self.workdir = workdir
        self.podman = Podman(workdir, OUTPUT / "podman.log")
        self.isolations: list[Isolation] = []
        self.secrets: list[str] = []
        self.simulators: list[HostSimulator] = []
        self.steps = Steps()

    def simulator(self, port: int, phase: str) -> HostSimulator:
        """The host's simulator for ``phase`` (stopped by the cleanup if still running)."""
        sim = HostSimulator(port, OUTPUT / phase / "upstream-sim.log", SIM_LATENCY_MS)
        self.simulators.append(sim)
        return sim

    def name(self, what: str) -> str:
        """A container or pod name of this run."""
        return f"{self.prefix}-{what}"

    def env_file(self, values: dict[str, str], what: str) -> Path:
        """An env file (mode 0600) for ``podman run --env-file``: no value on a command line."""
        path = self.workdir / f"{what}.env"
        path.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
        path.chmod(0o600)
        return path

    def container(
        self, what: str, command: list[str], env: dict[str, str], *mounts: str, tmp: bool = True
    ) -> str:
        """Start a hardened service container on the host's network; return its name.

        Its root is read-only with no tmpfs of podman's own (``--read-only-tmpfs=false``):
        a tmpfs on /tmp only when ``tmp``, as compose.yaml and the manifests give one.
        """
        name = self.name(what)
        volumes = [arg for mount in mounts for arg in ("--volume", mount)]
        if tmp:
            volumes += ["--tmpfs", "/tmp"]
        self.podman.run(
            "run",
            "--detach",
            "--name",
            name,
            *HARDENED,
            "--env-file",
            str(self.env_file(env, what)),
            *volumes,
            self.image,
            *command,
        )
        return name

    def oneshot(self, what: str, env: dict[str, str], *command: str) -> str:
        """Run ``command`` to completion in a hardened container; return its output."""
        return self.podman.out(
            "run",
            "--rm",
            "--name",
            self.name(what),
            *HARDENED,
            "--env-file",
            str(self.env_file(env, what)),
            self.image,
            *command,
        )

    async def cleanup(self) -> list[str]:
        """Remove everything of the run; return what could not be removed. Each removal
        is tried on its own: one that fails or times out (a loaded machine) is reported
        and the rest still go."""
        problems: list[str] = []

        def attempt(what: str, *args: str, timeout: float = 120) -> str:
            try:
                return self.podman.run(*args, check=False, timeout=timeout).stdout
            except (subprocess.TimeoutExpired, OSError) as exc:
                problems.append(f"{what}: {exc!r}")
                return ""

        def named(kind: tuple[str, ...], field: str) -> list[str]:
            listed = attempt(
                f"list {kind[0]}", *kind, "--format", field, "--filter", f"name={self.prefix}"
            )
            return listed.split()

        for sim in self.simulators:
            sim.stop(5)
        if pods := named(("pod", "ls"), "{{.Name}}"):
            attempt("remove pods", "pod", "rm", "--force", "--time", "0", *pods)
        if containers := named(("ps", "--all"), "{{.Names}}"):
            attempt("remove containers", "rm", "--force", "--time", "0", *containers)
        if volumes := named(("volume", "ls"), "{{.Name}}"):
            attempt("remove volumes", "volume", "rm", "--force", *volumes)
        for secret in self.secrets:
            attempt(f"remove secret {secret}", "secret", "rm", secret)
        # Only the run's own tag: the image itself goes with it unless IMAGE still names it.
        attempt("untag the run's image", "rmi", self.image)
        for iso in self.isolations:
            try:
                await drop_isolation(iso)
            except Exception as exc:
                problems.append(f"drop {iso.database}: {exc!r}")
        return problems

    async def leftovers(self) -> list[str]:
        """Whatever of this run still exists: containers, pods, volumes, secrets,
        databases, queues."""
        found: list[str] = []
        for what in (("ps", "--all"), ("pod", "ls"), ("volume", "ls"), ("secret", "ls")):
            listing = self.podman.run(
                *what, "--format", "{{.Name}}" if what[0] != "ps" else "{{.Names}}", check=False
            ).stdout.split()
            found += [f"{' '.join(what)}: {n}" for n in listing if n.startswith(self.prefix)]
        if self.podman.image_exists(self.image):
            found.append(f"image tag {self.image}")
        conn = await asyncpg.connect(PG_ADMIN_URL, timeout=10)
        try:
            names = [iso.database for iso in self.isolations]
            found += [
                f"database {row[0]}"
                for row in await conn.fetch(
                    "SELECT datname FROM pg_database WHERE datname = ANY($1::text[])", names
                )
            ]
        finally:
            await conn.close()
        connection = await aio_pika.connect(AMQP_URL, timeout=10)
        async with connection:
            for iso in self.isolations:
                for queue in Names(iso.namespace).durable_queues():
                    channel = await connection.channel()
                    try:
                        await channel.declare_queue(queue, passive=True)
                        found.append(f"queue {queue}")
                    except aio_pika.exceptions.ChannelClosed:
                        pass
        return found


async def prepare(run: Run) -> str:
    """Tools, podman's configuration, the base image and the project's image."""
    steps, podman = run.steps, run.podman
    with steps.step("tools (apt: podman runc mmdebstrap)") as notes:
        missing = missing_tools()
        if missing:
            install_tools(missing, OUTPUT / "apt.log")
        notes.append(f"installed {' '.join(missing)}" if missing else "already installed")
    with steps.step("podman configuration") as notes:
        assert podman.runtime() == "runc", podman.runtime()
        notes.append(f"runtime runc, {podman.out('--version')}")
    with steps.step("base image") as notes:
        base = os.environ.get("RELAY_BASE_IMAGE", "")
        if base:
            notes.append(f"RELAY_BASE_IMAGE={base}")
        else:
            base = base_tag()
            if podman.image_exists(base):
                notes.append(f"{base} (kept from an earlier run)")
            else:
                build_base(podman, base, OUTPUT / "mmdebstrap.log")
                notes.append(f"{base} built with mmdebstrap")
        version = podman.out("run", "--rm", "--network", "none", base, "python", "--version")
        assert version.startswith("Python 3.11."), version
        notes.append(version)
    with steps.step("image build") as notes:
        built = build_image(podman, ROOT, base, IMAGE)
        podman.run("tag", built, run.image)
        size = podman.image_size(run.image)
        notes.append(f"{IMAGE} {size / 1e6:.0f} MB, run as {run.image}")
    with steps.step("image holds exactly the lock") as notes:
        held = check_image_holds_the_lock(podman, run.image)
        notes.append(f"{held} locked packages, pip, relay-batches")
    with steps.step("image holds no dev-only code") as notes:
        notes.append(check_image_has_no_dev_code(podman, run.image))
    return base


async def containers_phase(run: Run, http: aiohttp.ClientSession, hooks: WebhookReceiver) -> None:
    """Migrate and run every service from the image; probes, hardening, a batch, SIGTERM."""
    steps, podman = run.steps, run.podman
    graces = _grace_periods()
    with steps.step("fresh database and bus namespace") as notes:
        iso = await create_isolation("container", migrated=False)
        run.isolations.append(iso)
        notes.append(f"{iso.database}, namespace {iso.namespace}")
    with steps.step("relay migrate (container)") as notes:
        ledger = {"RELAY_DATABASE_URL": iso.database_url}
        migrate = run.oneshot("migrate", ledger, "relay", "migrate")
        applied = await _ledger_migrated(iso.database_url)
        assert applied > 0, migrate
        notes.append(f"{applied} migrations: {migrate[:60]}")

    sim_port, api_port = run.free_port(), run.free_port()
    health = {name: run.free_port() for name in SERVICES}
    routes = run.workdir / "routes.toml"
    routes.write_text(
        '[aliases."gpt-4o-mini"]\ndeployments = ["sim"]\n\n[deployments.sim]\n'
        f'provider = "openai"\nbase_url = "http://127.0.0.1:{sim_port}/v1"\n'
        'model = "sim-echo"\ntimeout_s = 30\nmax_retries = 3\n'
    )
    routes.chmod(0o644)
    base_env = {
        "RELAY_DATABASE_URL": iso.database_url,
        "RELAY_AMQP_URL": AMQP_URL,
        "RELAY_NAMESPACE": iso.namespace,
        "RELAY_API_HOST": "127.0.0.1",
        "RELAY_API_PORT": str(api_port),
        "RELAY_HEALTH_HOST": "127.0.0.1",
        "RELAY_SHUTDOWN_GRACE_S": "20",
        "RELAY_WEBHOOK_ALLOW_NETWORKS": "127.0.0.0/8",
    }
    names: dict[str, str] = {}
    sim = run.simulator(sim_port, "containers")
    with steps.step(f"start {len(SERVICES)} containers and the simulator") as notes:
        sim.start()
        for name in SERVICES:
            env = {**base_env, "RELAY_HEALTH_PORT": str(health[name])}
            names[name] = run.container(
                name, [f"relay-{name}"], env, f"{routes}:/etc/relay/routes.toml:ro"
            )
        await sim.wait_ready(http, READY_TIMEOUT_S)
        for name in SERVICES:
            await wait_ready(http, podman, names[name], health[name], "/readyz")
        notes.append(f"host's upstream-sim /healthz, {len(SERVICES)} services /readyz")
    with steps.step("non-root, read-only root, no caps") as notes:
        for container in names.values():
            check_hardened(podman, container)
        notes.append(f"{len(names)} containers: uid {UID}, CapEff 0, NoNewPrivs, EROFS")
    with steps.step("/healthz /readyz /metrics") as notes:
        for name in SERVICES:
            await check_probes(http, name, health[name], api_port if name == "ingest-api" else None)
        notes.append(f"{len(SERVICES)} health ports; /metrics not on the API port")
    with steps.step("batch through the containers") as notes:
        created = run.oneshot("keys", ledger, "relay", "keys", "create", "--workspace", "check")
        key = created.splitlines()[-1]
        api_url = f"http://127.0.0.1:{api_port}"
        batch = await run_batch(http, api_url, key, hooks, "container")
        await run_upload(http, api_url, key)
        notes.append(f"{batch}: {BATCH_ROWS} rows completed, results exact, webhook; an upload")
    with steps.step("SIGTERM mid-batch: exit 0 within grace") as notes:
        # As a rollout does: the services are stopped while rows are in flight (the
        # simulator answers each call after SIM_LATENCY_MS), the simulator after them.
        api = ApiClient(api_url, key, http)
        busy = await api.submit({"model": "gpt-4o-mini", "requests": rows(DRAIN_ROWS)})

        async def working() -> bool:
            batch = await api.get(busy["id"])
            return bool(0 < batch["completed"] < DRAIN_ROWS)

        await wait_until(working, 60, "rows of the busy batch to complete", every=0.1)
        slowest = 0.0
        # One kill for the whole group: on a loaded machine each podman call takes a
        # while, and the batch must still be in flight when the row-worker stops.
        podman.run("kill", "--signal", "TERM", *(names[name] for name in SERVICES))
        began = time.monotonic()
        for name in SERVICES:
            code = await _wait_exit(podman, names[name], began + graces[name])
            slowest = max(slowest, time.monotonic() - began)
            assert code == 0, (name, code, podman.run("logs", names[name], check=False))
        sim_code = sim.stop(graces["upstream-sim"])
        assert sim_code == 0, (sim_code, sim.log.read_text()[-2000:])
        done = await _completed_rows(iso.database_url, busy["id"])
        assert done < DRAIN_ROWS, "the batch ended before the stop: nothing was in flight"
        notes.append(
            f"{len(names)} exit 0 with {done}/{DRAIN_ROWS} rows done, then the simulator;"
            f" slowest {slowest:.1f}s (grace 10-45 s)"
        )
    with steps.step("logs: no error, no traceback") as notes:
        assert not sim.errors(), sim.errors()
        notes.append(f"{save_logs(podman, names, 'containers')} lines")
        podman.run("rm", *names.values())


def save_logs(podman: Podman, containers: dict[str, str], phase: str) -> int:
    """Write each container's log under test-output; fail on an error-level line or a
    traceback in any. Return the number of lines."""
    folder = OUTPUT / phase
    folder.mkdir(parents=True, exist_ok=True)
    count, bad = 0, []
    for name, container in containers.items():
        logs = podman.run("logs", container)
        text = logs.stdout + logs.stderr
        (folder / f"{name}.log").write_text(text)
        lines = text.splitlines()
        count += len(lines)
        bad += [
            f"{name}: {line[:200]}"
            for line in lines
            if '"level":"error"' in line or '"level":"critical"' in line or "Traceback" in line
        ]
    assert not bad, "\n".join(bad)
    return count


async def _wait_exit(podman: Podman, container: str, deadline: float) -> int:
    """The container's exit code once it has exited; fail past ``deadline``."""
    while True:
        state = podman.out(
            "inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}", container
        )
        status, code = state.split()
        if status in ("exited", "stopped"):
            return int(code)
        if time.monotonic() > deadline:
            raise AssertionError(f"{container} still {status} at the end of its grace period")
        await asyncio.sleep(0.2)


def _pod_container(deployment: str, container: str) -> str:
    """The container podman 4.3's ``kube play`` makes for a Deployment's container."""
    return f"{deployment}-pod-0-{container}"


async def kube_phase(run: Run, http: aiohttp.ClientSession, hooks: WebhookReceiver) -> None:
    """The dev overlay under ``podman kube play``: migration Pod, Deployments, a batch."""
    steps, podman = run.steps, run.podman
    with steps.step("render and adapt the dev overlay") as notes:
        iso = await create_isolation("kube", migrated=False)
        run.isolations.append(iso)
        rendered = kustomize(K8S / "overlays" / "dev")
        adapted = kube.adapt(
            rendered,
            prefix=run.prefix,
            namespace=iso.namespace,
            connections={"RELAY_DATABASE_URL": iso.database_url, "RELAY_AMQP_URL": AMQP_URL},
            free_port=run.free_port,
        )
        for deployment in adapted.deployments:
            for container in deployment["spec"]["template"]["spec"]["containers"]:
                container["image"] = run.image
        adapted.migrate["spec"]["containers"][0]["image"] = run.image
        # podman 4.3 reads one document from a --configmap file: the ConfigMaps go into
        # each played file instead.
        migrate_yaml = _write_yaml(
            run.workdir / "migrate.yaml", [*adapted.configmaps, adapted.migrate]
        )
        deployments_yaml = _write_yaml(
            run.workdir / "deployments.yaml", [*adapted.configmaps, *adapted.deployments]
        )
        for name, data in adapted.secrets.items():
            podman.run("secret", "create", name, "-", stdin=data)
            run.secrets.append(name)
        kinds = sorted({doc["kind"] for doc in rendered})
        notes.append(
            f"{len(rendered)} resources ({', '.join(kinds)}) -> "
            f"{len(adapted.deployments)} Deployments, 1 Pod, {len(adapted.configmaps)} ConfigMaps"
        )
    pods = {
        d["metadata"]["name"].removeprefix(f"{run.prefix}-"): _pod_container(
            d["metadata"]["name"], d["spec"]["template"]["spec"]["containers"][0]["name"]
        )
        for d in adapted.deployments
    }
    sim = run.simulator(adapted.ports["upstream-sim"]["http"], "kube")
    with steps.step("kube play: Deployments before migrating") as notes:
        sim.start()
        await sim.wait_ready(http, READY_TIMEOUT_S)
        # As `kubectl apply -k` does: the Deployments start with the Job, not after it.
        podman.run("kube", "play", str(deployments_yaml), timeout=300)
        for name, container in pods.items():
            ports = adapted.ports[name]
            status = await wait_answer(http, podman, container, ports["health"], "/readyz")
            # docs/operations/deployment.md: not ready until the migration ran, but the row-worker,
            # which never opens the ledger.
            assert status == (200 if name == "row-worker" else 503), (name, status)
        async with http.post(
            f"http://127.0.0.1:{adapted.ports['ingest-api']['http']}/v1/batches"
        ) as r:
            assert r.status == 503 and r.headers.get("Retry-After"), (r.status, r.headers)
        notes.append("/readyz 503 (row-worker 200), /v1 503 with Retry-After")
    with steps.step("kube play: migration Pod") as notes:
        migrate_name = adapted.migrate["metadata"]["name"]
        podman.run("kube", "play", str(migrate_yaml), timeout=180)
        container = f"{migrate_name}-{adapted.migrate['spec']['containers'][0]['name']}"
        code = await _wait_exit(podman, container, time.monotonic() + 120)
        assert code == 0, podman.run("logs", container, check=False)
        applied = await _ledger_migrated(iso.database_url)
        assert applied > 0
        notes.append(f"exit 0, {applied} migrations")
        podman.run("pod", "rm", "--force", migrate_name, timeout=120)
    with steps.step("kube play: every pod ready, no restart") as notes:
        for name, container in pods.items():
            ports = adapted.ports[name]
            await wait_ready(http, podman, container, ports["health"], "/readyz")
            await check_probes(http, name, ports["health"], ports.get("http"))
            restarts = podman.out("inspect", "--format", "{{.RestartCount}}", container)
            assert restarts == "0", (container, restarts)
            check_hardened(podman, container)
            _check_kube_env(podman, container, name, iso)
        notes.append(
            f"{len(pods)} pods ready by themselves; uid {UID}, read-only, no caps; "
            "ConfigMap and Secret env"
        )
    with steps.step("batch through kube play") as notes:
        key = (await admin.create_key(iso.database_url, "kube-check")).key
        api_port = adapted.ports["ingest-api"]["http"]
        api_url = f"http://127.0.0.1:{api_port}"
        batch = await run_batch(http, api_url, key, hooks, "kube")
        await run_upload(http, api_url, key)
        notes.append(f"{batch}: {BATCH_ROWS} rows completed, results exact, webhook; an upload")
    with steps.step("pods stop on SIGTERM, exit 0; kube down") as notes:
        graces = {
            d["metadata"]["name"]: int(
                d["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
            )
            for d in adapted.deployments
        }
        began = time.monotonic()
        for deployment, grace in graces.items():
            podman.run("pod", "stop", "--time", str(grace), f"{deployment}-pod-0", timeout=120)
        containers: dict[str, str] = {}
        for deployment in adapted.deployments:
            (spec,) = deployment["spec"]["template"]["spec"]["containers"]
            container = _pod_container(deployment["metadata"]["name"], spec["name"])
            containers[spec["name"]] = container
            code = await _wait_exit(podman, container, time.monotonic() + 5)
            assert code == 0, (container, code, podman.run("logs", container, check=False))
        took = time.monotonic() - began
        sim_code = sim.stop(_grace_periods()["upstream-sim"])
        assert sim_code == 0 and not sim.errors(), (sim_code, sim.errors())
        save_logs(podman, containers, "kube")
        podman.run("kube", "down", str(deployments_yaml), timeout=300)
        notes.append(
            f"{len(graces)} pods stopped in {took:.1f}s, every container exit 0, then the"
            " simulator; removed"
        )


def _write_yaml(path: Path, docs: list[dict[str, Any]]) -> Path:
    path.write_text(yaml.safe_dump_all(docs))
    return path


def _check_kube_env(podman: Podman, container: str, name: str, iso: Isolation) -> None:
    """The container's environment has the dev ConfigMap's values and the Secret's."""
    env = dict(
        line.split("=", 1)
        for line in podman.out("exec", container, "env").splitlines()
        if "=" in line
    )
    assert env["RELAY_BATCH_CONCURRENCY"] == "4" and env["RELAY_LOG_LEVEL"] == "DEBUG", env
    assert env["RELAY_NAMESPACE"] == iso.namespace, env
    assert env["RELAY_DATABASE_URL"] == iso.database_url, name
    assert env["RELAY_AMQP_URL"] == AMQP_URL, name


async def main(workdir: Path) -> int:
    """Run every step in ``workdir``; clean up whatever happens; 0 when every step passed."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    for sig in (signal.SIGTERM, signal.SIGHUP):
        loop.add_signal_handler(sig, task.cancel)
    run = Run(workdir)
    print(f"container-check {run.prefix}: podman's log in {OUTPUT / 'podman.log'}", flush=True)
    hooks = WebhookReceiver()
    failed = False
    try:
        await hooks.start()
        await prepare(run)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(10)) as http:
            await containers_phase(run, http, hooks)
            await kube_phase(run, http, hooks)
    except (Exception, asyncio.CancelledError):
        failed = True
        traceback.print_exc()
    finally:
        await hooks.stop()
        failed = not await clean_up(run) or failed
    steps = run.steps
    verdict = "FAILED" if failed else "passed"
    print(f"container-check {verdict} in {steps.total():.0f}s", flush=True)
    print(f"container-check: {steps.passed} passed, {max(steps.failed, int(failed))} failed")
    return 1 if failed else 0


async def clean_up(run: Run) -> bool:
    """Remove everything of the run, then check that nothing of it is left."""
    try:
        with run.steps.step("clean up; nothing left") as notes:
            problems = await run.cleanup()
            problems += await run.leftovers()
            assert not problems, problems
            notes.append("no container, pod, volume, secret, database or queue of the run")
    except Exception:
        traceback.print_exc()
        return False
    return True


def entry() -> None:
    """``python -m tests.container.check``: as root, in a temporary directory."""
    if os.geteuid() != 0:
        print("make container-check needs root (podman rootful, apt-get)", file=sys.stderr)
        sys.exit(2)
    OUTPUT.mkdir(parents=True, exist_ok=True)
    (OUTPUT / "podman.log").write_text("")
    with tempfile.TemporaryDirectory(prefix="relay-container-check-") as tmp:
        workdir = Path(tmp)
        workdir.chmod(0o755)
        code = asyncio.run(main(workdir))
    sys.exit(code)


if __name__ == "__main__":
    entry()
