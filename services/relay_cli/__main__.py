"""``relay``: migrations, workspaces, keys, ``dev`` (the local system of ``make run``, in a
source checkout only: :mod:`relay_batches.services.relay_dev`), ``batch …`` and
``models`` (the public API from a terminal, see :mod:`relay_batches.services.relay_cli.batch`)."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Callable
from datetime import timedelta

from relay_batches.durations import SPELLING, format_duration, parse_duration
from relay_batches.model import iso
from relay_batches.reach import EXIT_UNREACHABLE, Unreachable
from relay_batches.services.relay_cli import admin
from relay_batches.services.relay_cli.args import add_batch_parser
from relay_batches.services.relay_cli.batch import run_batch
from relay_batches.settings import RETENTION_MAX_DIGITS, ConfigError, Settings


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
    retries = spaces_sub.add_parser(
        "webhook-retries",
        help="how many attempts each completion webhook of the workspace gets (1: no retry)",
    )
    retries.add_argument("name")
    retries.add_argument(
        "--max-attempts",
        type=_attempts,
        required=True,
        help=f"1 to {admin.MAX_WEBHOOK_ATTEMPTS}; failed attempts are retried with backoff"
        " for up to 24 h",
    )

    keep = spaces_sub.add_parser(
        "retention",
        help="how long the workspace's ended jobs are kept before they are purged",
    )
    keep.add_argument("name")
    keep.add_argument(
        "retention",
        type=_retention,
        help="a duration such as 7d, 12h or 30m; 'default' for RELAY_RETENTION",
    )

    dev = sub.add_parser(
        "dev",
        help="run every service and the simulator locally (make run; a source checkout only)",
    )
    dev.add_argument(
        "--verbose", action="store_true", help="services log their settings when they start"
    )
    add_batch_parser(sub)
    return parser


def _retention(raw: str) -> timedelta | None:
    """The ``retention`` argument: a duration above 0, or ``default`` (None)."""
    if raw == "default":
        return None
    value = parse_duration(raw, RETENTION_MAX_DIGITS)
    if value is None or value <= timedelta(0):
        raise argparse.ArgumentTypeError(f"write {SPELLING} (for example 7d) or default")
    return value


def _attempts(raw: str) -> int:
    """``--max-attempts``: an integer from 1 to ``MAX_WEBHOOK_ATTEMPTS``."""
    top = admin.MAX_WEBHOOK_ATTEMPTS
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 3 and 1 <= int(raw) <= top):
        raise argparse.ArgumentTypeError(f"must be an integer from 1 to {top}, got {raw!r}")
    return int(raw)


def main(argv: list[str] | None = None) -> None:
    """Console entry point."""
    args = _parser().parse_args(argv)
    if args.command in ("batch", "models"):
        sys.exit(run_batch(args))
    try:
        settings = Settings.from_env()
    except ConfigError as exc:
        sys.exit(f"relay: configuration error: {exc}")
    command = _COMMANDS[(args.command, getattr(args, "action", None))]
    try:
        command(settings, args)
    except ConfigError as exc:
        sys.exit(f"relay: configuration error: {exc}")
    except admin.AdminError as exc:
        sys.exit(f"relay: {exc}")
    except Unreachable as exc:
        print(f"relay: {exc.line()}", file=sys.stderr)
        sys.exit(EXIT_UNREACHABLE)
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


def _workspaces_retries(settings: Settings, args: argparse.Namespace) -> None:
    url = settings.database_url
    stored = asyncio.run(admin.set_webhook_retries(url, args.name, args.max_attempts))
    rule = "once, no retry" if stored == 1 else "failed attempts retried with backoff, up to 24 h"
    print(f"workspace {args.name}: webhook max attempts {stored} ({rule})")


def _workspaces_retention(settings: Settings, args: argparse.Namespace) -> None:
    asyncio.run(admin.set_retention(settings.database_url, args.name, args.retention))
    kept = "RELAY_RETENTION" if args.retention is None else format_duration(args.retention)
    print(f"workspace {args.name}: ended jobs kept for {kept}, then purged")


# What ``relay dev`` says where it is not installed: the image and a wheel carry neither
# it nor the simulator (pyproject.toml, [tool.relay] dev-packages).
DEV_MISSING = (
    "relay: `relay dev` is not in this build: it and the upstream simulator are dev-only"
    " and left out of the wheel and the image; run it from a source checkout (make run)"
)


def _dev_command(settings: Settings, args: argparse.Namespace) -> None:
    try:
        from relay_batches.services.relay_dev import dev
    except ModuleNotFoundError as exc:
        if exc.name is None or not exc.name.startswith("relay_batches.services.relay_dev"):
            raise
        sys.exit(DEV_MISSING)
    options = dev.DevOptions.from_env(os.environ, verbose=args.verbose)
    asyncio.run(dev.run(settings, options, os.environ))


_COMMANDS: dict[tuple[str, str | None], Callable[[Settings, argparse.Namespace], None]] = {
    ("migrate", None): _migrate,
    ("keys", "create"): _keys_create,
    ("keys", "list"): _keys_list,
    ("keys", "revoke"): _keys_revoke,
    ("workspaces", "create"): _workspaces_create,
    ("workspaces", "list"): _workspaces_list,
    ("workspaces", "webhook-secret"): _workspaces_secret,
    ("workspaces", "webhook-retries"): _workspaces_retries,
    ("workspaces", "retention"): _workspaces_retention,
    ("dev", None): _dev_command,
}


if __name__ == "__main__":
    main()
