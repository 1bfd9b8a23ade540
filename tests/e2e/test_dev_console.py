"""What ``make run`` says to a person: one ready line last (API, panel, key), the key kept
across restarts, no settings without ``--verbose``, ``GET /`` to the panel; and a start-up
without Postgres or RabbitMQ is one line naming the variable, exit code 2, for
``relay dev`` and for every service alone."""

from __future__ import annotations

import asyncio
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest

from tests.e2e.test_dev import relay_dev
from tests.helpers.support import Isolation, free_port, wait_until

BIN = Path(sys.executable).parent
READY = re.compile(
    r"^\[relay dev\] ready: API (http://\S+) · panel (http://\S+/panel) · RELAY_API_KEY=(\S+)$",
    re.M,
)
SERVICES = (
    "ingest-api",
    "scheduler",
    "dispatcher",
    "row-worker",
    "aggregator",
    "notifier",
    "offloader",
)


async def _ready(run_output: Callable[[], str]) -> re.Match[str]:
    async def found() -> re.Match[str] | None:
        return READY.search(run_output())

    return await wait_until(found, 60, "the ready line")


async def test_the_ready_line_comes_last_and_the_key_survives_a_restart(
    isolation: Isolation, http: aiohttp.ClientSession, output_dir: Path
) -> None:
    key_file = output_dir / "dev" / "console.key"
    key_file.unlink(missing_ok=True)
    log = output_dir / "dev" / "console-1.log"
    async with relay_dev(isolation, log, http, RELAY_DEV_KEY_FILE=str(key_file)) as run:
        ready = await _ready(run.output)
        assert ready[1] == run.api_url and ready[2] == f"{run.api_url}/panel"
        key = ready[3]
        lines = [line for line in run.output().splitlines() if line.startswith("[relay dev]")]
        assert lines[-1] == ready[0]  # nothing of relay dev's after it
        assert '"settings"' not in run.output()  # no settings without --verbose
        assert len(run.output()) < 8000, len(run.output())
        async with http.get(f"{run.api_url}/", allow_redirects=False) as response:
            assert (response.status, response.headers["Location"]) == (302, "/panel")
        async with http.get(f"{run.api_url}/v1/models", headers=_auth(key)) as response:
            assert response.status == 200
    assert key_file.read_text().strip() == key
    assert key_file.stat().st_mode & 0o077 == 0  # the owner's only

    log = output_dir / "dev" / "console-2.log"
    async with relay_dev(isolation, log, http, RELAY_DEV_KEY_FILE=str(key_file)) as run:
        assert (await _ready(run.output))[3] == key


async def test_verbose_shows_the_settings_and_a_given_key_wins(
    isolation: Isolation, http: aiohttp.ClientSession, output_dir: Path
) -> None:
    log = output_dir / "dev" / "console-verbose.log"
    key_file = output_dir / "dev" / "console-verbose.key"
    key_file.unlink(missing_ok=True)
    env = {"RELAY_DEV_KEY_FILE": str(key_file), "RELAY_DEV_API_KEY": "rk_given_dev_key_0123456789"}
    async with relay_dev(isolation, log, http, ("--verbose",), **env) as run:
        ready = await _ready(run.output)
        assert ready[3] == "rk_given_dev_key_0123456789"
        assert '"settings"' in run.output()
    assert not key_file.exists()  # a given key is not kept


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def _relay(*argv: str, env: dict[str, str]) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        *argv,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    _, err = await asyncio.wait_for(process.communicate(), 90)
    assert process.returncode is not None
    return process.returncode, err.decode()


def _env(**overrides: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
    return {**base, "RELAY_HEALTH_PORT": "0", "RELAY_API_PORT": str(free_port()), **overrides}


async def test_relay_dev_without_postgres_or_rabbitmq_is_one_line_and_exit_2(
    isolation: Isolation,
) -> None:
    no_db = "postgresql://relay:s3cret@127.0.0.1:1/relay"
    code, err = await _relay(
        str(BIN / "relay"), "dev", env=_env(RELAY_DATABASE_URL=no_db, RELAY_SIM_PORT="0")
    )
    assert code == 2, err
    assert err.splitlines()[-1].startswith(
        "relay: cannot reach Postgres at postgresql://relay:***@127.0.0.1:1/relay"
        " (RELAY_DATABASE_URL): "
    ), err
    assert "s3cret" not in err and "Traceback" not in err

    no_broker = "amqp://guest:guest@127.0.0.1:1/"
    env = _env(
        RELAY_DATABASE_URL=isolation.database_url, RELAY_AMQP_URL=no_broker, RELAY_SIM_PORT="0"
    )
    code, err = await _relay(str(BIN / "relay"), "dev", env=env)
    assert code == 2, err
    assert err.splitlines()[-1].startswith(
        "relay: cannot reach RabbitMQ at amqp://guest:***@127.0.0.1:1/ (RELAY_AMQP_URL): "
    ), err
    assert "started" not in err  # no service was started


@pytest.mark.parametrize("service", SERVICES)
async def test_every_service_without_its_broker_is_one_line_and_exit_2(
    isolation: Isolation, service: str
) -> None:
    env = _env(
        RELAY_DATABASE_URL=isolation.database_url,
        RELAY_NAMESPACE=isolation.namespace,
        RELAY_AMQP_URL="amqp://guest:guest@127.0.0.1:1/",
    )
    code, err = await _relay(str(BIN / f"relay-{service}"), env=env)
    assert code == 2, err
    assert err == (
        f"relay-{service}: cannot reach RabbitMQ at amqp://guest:***@127.0.0.1:1/"
        f" (RELAY_AMQP_URL): {err.split('(RELAY_AMQP_URL): ', 1)[1]}"
    )
    assert err.count("\n") == 1


async def test_a_service_without_its_database_is_one_line_and_exit_2() -> None:
    env = _env(RELAY_DATABASE_URL="postgresql://postgres:pw@127.0.0.1:5432/relay_no_such_db")
    code, err = await _relay(str(BIN / "relay-aggregator"), env=env)
    assert code == 2, err
    assert err.startswith(
        "relay-aggregator: cannot reach Postgres at"
        " postgresql://postgres:***@127.0.0.1:5432/relay_no_such_db (RELAY_DATABASE_URL):"
    ), err
    assert 'database "relay_no_such_db" does not exist' in err and err.count("\n") == 1
