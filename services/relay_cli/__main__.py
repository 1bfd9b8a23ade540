"""``relay``: migrations, workspaces, keys, ``dev`` (the local system of ``make run``) and
``batch …`` (the public API from a terminal, see :mod:`relay_batches.services.relay_cli.batch`)."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from collections.abc import Callable

from relay_batches.model import iso
from relay_batches.services.relay_cli import admin
from relay_batches.services.relay_cli.batch import add_batch_parser, run_batch
from relay_batches.services.relay_cli.supervisor import say, service_children, supervise
from relay_batches.settings import ConfigError, Settings

DEV_WORKSPACE = "dev"
DEV_SIM_PORT = 8090
DEV_WEBHOOK_ALLOW = "127.0.0.0/8,::1/128"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="relay", description="Relay Batches admin")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("migrate", help="create the database if needed and apply migrations")

    keys = sub.add_parser("keys", help="API keys").add_subparsers(dest="action", required=True)
    create = keys.add_parser("create", help="create an API key (printed once, last line)")
    create.add_argument("--workspace", required=True, help="workspace name (created if new)")
    listing = keys.add_parser("list", help="list keys (prefix only, never the secret)")
    listing.add_argument("--workspace", help="only this workspace")
    revoke = keys.add_parser("revoke", help="revoke a key by its id")
    revoke.add_argument("key_id")

    spaces = sub.add_parser("workspaces", help="workspaces")
    spaces_sub = spaces.add_subparsers(dest="action", required=True)
    spaces_sub.add_parser("create", help="create a workspace").add_argument("name")
    spaces_sub.add_parser("list", help="list workspaces")
    rotate = spaces_sub.add_parser(
        "webhook-secret", help="rotate the workspace's webhook signing secret (printed once)"
    )
    rotate.add_argument("name")

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
    command = _COMMANDS[(args.command, getattr(args, "action", None))]
    try:
        command(settings, args)
    except admin.AdminError as exc:
        sys.exit(f"relay: {exc}")
    except (OSError, ConnectionError) as exc:
        sys.exit(f"relay: cannot reach a dependency: {exc}")


def _migrate(settings: Settings, _: argparse.Namespace) -> None:
    url = settings.database_url
    applied = asyncio.run(admin.migrate(url))
    print(f"applied {len(applied)} migration(s){': ' + ', '.join(applied) if applied else ''}")


def _keys_create(settings: Settings, args: argparse.Namespace) -> None:
    url = settings.database_url
    created = asyncio.run(admin.create_key(url, args.workspace))
    print(f"workspace {args.workspace}: key id {created.id} (the key is shown once, below)")
    print(created.key)


def _keys_list(settings: Settings, args: argparse.Namespace) -> None:
    url = settings.database_url
    for key in asyncio.run(admin.list_keys(url, args.workspace)):
        state = f"revoked {iso(key.revoked_at)}" if key.revoked_at else "active"
        print(f"{key.id}  {key.workspace}  {key.prefix}…  created {iso(key.created_at)}  {state}")


def _keys_revoke(settings: Settings, args: argparse.Namespace) -> None:
    url = settings.database_url
    asyncio.run(admin.revoke_key(url, args.key_id))
    print(f"revoked {args.key_id}")


def _workspaces_create(settings: Settings, args: argparse.Namespace) -> None:
    url = settings.database_url
    print(f"workspace {args.name}: id {asyncio.run(admin.create_workspace(url, args.name))}")


def _workspaces_list(settings: Settings, _: argparse.Namespace) -> None:
    url = settings.database_url
    for space in asyncio.run(admin.list_workspaces(url)):
        print(f"{space.id}  {space.name}  created {iso(space.created_at)}  {space.keys} key(s)")


def _workspaces_secret(settings: Settings, args: argparse.Namespace) -> None:
    url = settings.database_url
    secret = asyncio.run(admin.rotate_webhook_secret(url, args.name))
    print(f"workspace {args.name}: new webhook signing secret (shown once, below)")
    print(secret)


def _dev_command(settings: Settings, _: argparse.Namespace) -> None:
    asyncio.run(_dev(settings))


_COMMANDS: dict[tuple[str, str | None], Callable[[Settings, argparse.Namespace], None]] = {
    ("migrate", None): _migrate,
    ("keys", "create"): _keys_create,
    ("keys", "list"): _keys_list,
    ("keys", "revoke"): _keys_revoke,
    ("workspaces", "create"): _workspaces_create,
    ("workspaces", "list"): _workspaces_list,
    ("workspaces", "webhook-secret"): _workspaces_secret,
    ("dev", None): _dev_command,
}


async def _dev(settings: Settings) -> None:
    await admin.migrate(settings.database_url)
    dev_key = os.environ.get("RELAY_DEV_API_KEY") or None
    created = await admin.create_key(settings.database_url, DEV_WORKSPACE, dev_key)
    env = dict(os.environ)
    env.setdefault("RELAY_ROUTES_FILE", settings.routes_file)
    env.setdefault("RELAY_WEBHOOK_ALLOW_NETWORKS", DEV_WEBHOOK_ALLOW)
    children = service_children(env, DEV_SIM_PORT)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    say(f"API on http://{settings.api_host}:{settings.api_port}  (Ctrl-C stops everything)")
    say(f"webhooks may go to {DEV_WEBHOOK_ALLOW} in dev (RELAY_WEBHOOK_ALLOW_NETWORKS)")
    say(f"dev API key: {created.key}")
    say(f"export RELAY_API_KEY={created.key}")
    await supervise(children, stop)
    say("stopped")


if __name__ == "__main__":
    main()
