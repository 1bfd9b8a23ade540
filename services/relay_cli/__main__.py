"""``relay``: ``migrate``, ``keys create --workspace W``, ``dev`` (the local system) and
``batch …`` (the public API from a terminal, see :mod:`relay_cli.batch`)."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys

from relay.settings import ConfigError, Settings
from relay_cli import admin
from relay_cli.batch import add_batch_parser, run_batch
from relay_cli.supervisor import say, service_children, supervise

DEV_WORKSPACE = "dev"
DEV_SIM_PORT = 8090


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="relay", description="Relay Batches admin")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("migrate", help="create the database if needed and apply migrations")
    keys = sub.add_parser("keys", help="API keys")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True)
    create = keys_sub.add_parser("create", help="create an API key (printed once)")
    create.add_argument("--workspace", required=True, help="workspace name (created if new)")
    sub.add_parser("dev", help="run every service and the simulator locally (make run)")
    add_batch_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> None:
    """Console entry point."""
    args = _parser().parse_args(argv)
    if args.command == "batch":
        sys.exit(run_batch(args))
    try:
        settings = Settings.from_env()
    except ConfigError as exc:
        sys.exit(f"relay: configuration error: {exc}")
    try:
        if args.command == "migrate":
            applied = asyncio.run(admin.migrate(settings.database_url))
            print(
                f"applied {len(applied)} migration(s){': ' + ', '.join(applied) if applied else ''}"
            )
        elif args.command == "keys":
            created = asyncio.run(admin.create_key(settings.database_url, args.workspace))
            print(f"workspace {args.workspace}: key id {created.id} (shown once)")
            print(created.key)
        elif args.command == "dev":
            asyncio.run(_dev(settings))
    except (OSError, ConnectionError) as exc:
        sys.exit(f"relay: cannot reach a dependency: {exc}")


async def _dev(settings: Settings) -> None:
    await admin.migrate(settings.database_url)
    dev_key = os.environ.get("RELAY_DEV_API_KEY") or None
    created = await admin.create_key(settings.database_url, DEV_WORKSPACE, dev_key)
    env = dict(os.environ)
    env.setdefault("RELAY_ROUTES_FILE", settings.routes_file)
    children = service_children(env, DEV_SIM_PORT)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    say(f"API on http://{settings.api_host}:{settings.api_port}  (Ctrl-C stops everything)")
    say(f"dev API key: {created.key}")
    say(f"export RELAY_API_KEY={created.key}")
    await supervise(children, stop)
    say("stopped")


if __name__ == "__main__":
    main()
