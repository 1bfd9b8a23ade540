"""``relay batch submit|status|list|cancel|results|watch|retry|pause|resume|deliveries|
redeliver|delete``: the public API from a terminal.

The server URL and key come from ``RELAY_URL`` / ``RELAY_API_KEY`` or ``--url`` /
``--api-key``. Output for scripts goes to stdout (job ids, results); progress and
messages go to stderr. Exit codes: 0 success (for ``watch``, ``submit --wait`` and
``retry --wait``: every job ``completed``), 1 an API or network error or a job that ended
otherwise, 2 a usage error. An API error is printed as one line: ``relay: invalid API key (401 …)``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TextIO

import orjson

from relay_batches.model import TERMINAL, JobStatus
from relay_batches.services.relay_cli.client import ApiFailure, RelayClient
from relay_batches.services.relay_cli.progress import (
    RateMeter,
    clock,
    cost_text,
    done_rows,
    percent_bar,
    progress_line,
    summary_line,
)
from relay_batches.settings import ClientSettings, ConfigError

DEFAULT_INTERVAL_S = 1.0
RETRY_ROWS = ("failed", "dead_letter")
DELIVERIES_PAGE = 100


class UsageError(Exception):
    """The command line asks for something that cannot work."""


# --- argument parsing -------------------------------------------------------------------


def add_batch_parser(sub: Any) -> None:
    """Add ``relay batch …`` to the top-level subparsers ``sub``."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", help="API base URL (default: $RELAY_URL or 127.0.0.1:8080)")
    common.add_argument("--api-key", help="API key (default: $RELAY_API_KEY)")
    common.add_argument("--timeout", type=float, help="seconds to wait for the API to answer")
    batch = sub.add_parser("batch", help="submit and follow batches through the public API")
    commands = batch.add_subparsers(dest="batch_command", required=True)

    submit = commands.add_parser(
        "submit",
        parents=[common],
        help="one job per .csv/.jsonl file (.jsonl: Relay, OpenAI batch or Anthropic lines)",
    )
    submit.add_argument("files", nargs="+", metavar="FILE", type=Path)
    submit.add_argument(
        "--model",
        help="a public model alias (default: each file's first row's model, which OpenAI"
        " and Anthropic lines always name)",
    )
    submit.add_argument("--priority", help="integer; higher runs first (default 0)")
    submit.add_argument("--name", help="job name (default: the file name)")
    submit.add_argument("--webhook", help="completion webhook URL")
    submit.add_argument("--cron", help="5-field cron expression (UTC): a recurring template")
    submit.add_argument("--budget", help="USD; no more rows run once their cost reaches it")
    submit.add_argument("--wait", action="store_true", help="watch the jobs until they end")
    submit.add_argument("--interval", type=float, default=DEFAULT_INTERVAL_S, help="poll seconds")

    status = commands.add_parser("status", parents=[common], help="one job's state")
    status.add_argument("id")
    status.add_argument("--json", action="store_true", help="print the batch object as JSON")

    listing = commands.add_parser("list", parents=[common], help="jobs, newest first")
    listing.add_argument("--status", choices=[s.value for s in JobStatus])
    listing.add_argument("--limit", type=int, default=20, help="1-100 (default 20)")
    listing.add_argument("--after", help="the last id of the previous page")

    cancel = commands.add_parser("cancel", parents=[common], help="cancel a job")
    cancel.add_argument("id")

    results = commands.add_parser("results", parents=[common], help="a finished job's results")
    results.add_argument("id")
    results.add_argument("-o", "--output", type=Path, help="write JSONL here (default stdout)")

    watch = commands.add_parser("watch", parents=[common], help="progress bar until the end")
    watch.add_argument("id")
    watch.add_argument("--interval", type=float, default=DEFAULT_INTERVAL_S, help="poll seconds")
    _add_operate_parsers(commands, common)


def _add_operate_parsers(commands: Any, common: argparse.ArgumentParser) -> None:
    retry = commands.add_parser(
        "retry", parents=[common], help="a new job of an ended job's failed rows"
    )
    retry.add_argument("id")
    retry.add_argument(
        "--rows",
        choices=RETRY_ROWS,
        default="failed",
        help="failed: every row with an error (default); dead_letter: the dead-letter list",
    )
    retry.add_argument("--wait", action="store_true", help="watch the new job until it ends")
    retry.add_argument("--interval", type=float, default=DEFAULT_INTERVAL_S, help="poll seconds")
    for name, text in (
        ("pause", "stop releasing a queued or running job's rows"),
        ("resume", "let a paused job run again"),
        ("redeliver", "POST an ended job's completion webhook again"),
        ("deliveries", "every attempt of an ended job's completion webhook"),
        ("delete", "delete an ended job or a cron template and everything stored for it"),
    ):
        commands.add_parser(name, parents=[common], help=text).add_argument("id")


def run_batch(args: argparse.Namespace, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    """Run one ``relay batch`` command; return the exit code."""
    try:
        settings = _client_settings(args)
        assert settings.api_key is not None
        command = COMMANDS[args.batch_command]
        return asyncio.run(_with_client(settings, command, args, out, err))
    except (UsageError, ConfigError) as exc:
        print(f"relay: {exc}", file=err)
        return 2
    except ApiFailure as exc:
        print(f"relay: {exc.line()}", file=err)
        return 1
    except KeyboardInterrupt:
        print("relay: interrupted", file=err)
        return 130


def _client_settings(args: argparse.Namespace) -> ClientSettings:
    env = ClientSettings.from_env()
    settings = ClientSettings(
        url=args.url or env.url,
        api_key=args.api_key or env.api_key,
        timeout_s=args.timeout if args.timeout is not None else env.timeout_s,
    )
    if not settings.api_key:
        raise UsageError("no API key: set RELAY_API_KEY or pass --api-key")
    if settings.timeout_s <= 0:
        raise UsageError("--timeout must be positive")
    if getattr(args, "interval", 1.0) <= 0:
        raise UsageError("--interval must be positive")
    return settings


Command = Callable[[RelayClient, argparse.Namespace, TextIO, TextIO], Awaitable[int]]


async def _with_client(
    settings: ClientSettings, command: Command, args: argparse.Namespace, out: TextIO, err: TextIO
) -> int:
    assert settings.api_key is not None
    async with RelayClient(settings.url, settings.api_key, settings.timeout_s) as client:
        return await command(client, args, out, err)


# --- commands ---------------------------------------------------------------------------


async def submit(client: RelayClient, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Upload the files (one job each); print ``<id>  <status>  <n> rows  <name>`` lines.

    The server reads each file's format (CSV; ``.jsonl`` of Relay requests, OpenAI batch
    lines or Anthropic requests) and, without ``--model``, takes each job's model from
    its file's first row.
    """
    if args.wait and args.cron:
        raise UsageError("--wait cannot be used with --cron: a cron template never ends")
    for path in args.files:
        if not path.is_file():
            raise UsageError(f"cannot read {path}: no such file")
    fields: dict[str, str] = {}
    optional = {
        "model": args.model,
        "priority": args.priority,
        "name": args.name,
        "webhookUrl": args.webhook,
        "cron": args.cron,
        "budget_usd": args.budget,
    }
    fields.update({k: v for k, v in optional.items() if v is not None})
    created = await client.upload(args.files, fields)
    for batch in created:
        print(job_line(batch), file=out)
    out.flush()
    if not args.wait:
        return 0
    codes = [await watch_job(client, b["id"], args.interval, err) for b in created]
    return max(codes)


def job_line(batch: dict[str, Any]) -> str:
    """``<id>  <status>  <n> rows  <name>``: a created job, as ``submit`` and ``retry`` print it."""
    return f"{batch['id']}  {batch['status']}  {batch['total']} rows  {batch['name']}"


async def status(client: RelayClient, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Print one job's state (or its batch object with ``--json``)."""
    batch = await client.get(args.id)
    if args.json:
        out.write(orjson.dumps(batch, option=orjson.OPT_INDENT_2).decode() + "\n")
        return 0
    for label, value in _status_lines(batch):
        print(f"{label:<10}{value}", file=out)
    return 0


def _status_lines(batch: dict[str, Any]) -> list[tuple[str, str]]:
    lines = [
        ("id", batch["id"]),
        ("name", batch["name"]),
        ("status", batch["status"]),
        ("model", batch["model"]),
        ("priority", str(batch["priority"])),
        ("progress", percent_bar(batch)),
        (
            "rows",
            f"{batch['total']} total, {batch['completed']} completed, {batch['failed']} failed,"
            f" {batch['dead_letter']} dead letter",
        ),
        ("created", batch["created_at"] or "-"),
        ("started", batch["started_at"] or "-"),
        ("finished", batch["completed_at"] or "-"),
        ("cost", cost_text(batch)),
    ]
    if batch.get("rows_per_s") is not None:
        lines.append(("rate", f"{batch['rows_per_s']:.1f} rows/s"))
    if batch.get("eta_s") is not None:
        lines.append(("eta", clock(float(batch["eta_s"]))))
    optional = [
        ("expires", "expires_at"),
        ("cron", "cron"),
        ("next run", "next_run_at"),
        ("template", "template_id"),
        ("retry of", "retry_of"),
    ]
    lines += [(label, str(batch[key])) for label, key in optional if batch.get(key)]
    if batch.get("retries"):
        lines.append(("retries", " ".join(batch["retries"])))
    if batch.get("metadata"):
        lines.append(("metadata", orjson.dumps(batch["metadata"]).decode()))
    if batch.get("error"):
        lines.append(("error", str(batch["error"])))
    return lines


async def list_jobs(client: RelayClient, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """One page of jobs as a table, newest first."""
    if not 1 <= args.limit <= 100:
        raise UsageError("--limit must be from 1 to 100")
    page = await client.list_page(args.limit, args.status, args.after)
    print(f"{'ID':<32}  {'STATUS':<9}  {'DONE':>13}  {'CREATED':<20}  NAME", file=out)
    for batch in page["data"]:
        done = f"{done_rows(batch)}/{batch['total']}"
        print(
            f"{batch['id']:<32}  {batch['status']:<9}  {done:>13}  {batch['created_at']:<20}"
            f"  {batch['name']}",
            file=out,
        )
    if page["has_more"] and page["data"]:
        print(f"more: relay batch list --after {page['data'][-1]['id']}", file=err)
    return 0


async def cancel(client: RelayClient, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Cancel a job; print ``<id>  canceled``."""
    batch = await client.cancel(args.id)
    print(f"{batch['id']}  {batch['status']}", file=out)
    return 0


async def results(client: RelayClient, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Write a finished job's results as JSONL, one row object per line, in row order."""
    batch = await client.get(args.id)
    if batch["status"] not in TERMINAL:
        raise ApiFailure(
            f"job {batch['id']} is {batch['status']}; results appear when it ends"
            f" (relay batch watch {batch['id']})"
        )
    if args.output is None:
        rows = await _copy_results(client, batch["id"], sys.stdout.buffer)
        return 0
    partial = args.output.with_name(args.output.name + ".part")
    try:
        with partial.open("wb") as target:
            rows = await _copy_results(client, batch["id"], target)
        partial.replace(args.output)
    except OSError as exc:
        raise UsageError(f"cannot write {args.output}: {exc.strerror or exc}") from None
    finally:
        partial.unlink(missing_ok=True)
    print(f"wrote {rows} rows of {batch['id']} ({batch['status']}) to {args.output}", file=err)
    return 0


async def _copy_results(client: RelayClient, batch_id: str, target: Any) -> int:
    rows = 0
    async for chunk in client.results(batch_id):
        target.write(chunk)
        rows += chunk.count(b"\n")
    target.flush()
    return rows


async def watch(client: RelayClient, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Show a live progress bar until the job ends; 0 only for ``completed``."""
    return await watch_job(client, args.id, args.interval, err)


async def watch_job(client: RelayClient, batch_id: str, interval: float, err: TextIO) -> int:
    """Poll the job every ``interval`` seconds, drawing the progress line on ``err``."""
    started = time.monotonic()
    meter = RateMeter()
    live = err.isatty()
    shown: tuple[int, str] | None = None
    while True:
        batch = await client.get(batch_id)
        if batch["status"] == JobStatus.SCHEDULED:
            raise UsageError(f"job {batch_id} is a cron template; watch one of its runs instead")
        meter.observe(time.monotonic(), done_rows(batch))
        line = progress_line(batch, meter.rate())
        if live:
            err.write("\r" + line + "\x1b[K")
        elif shown != (done_rows(batch), batch["status"]):
            err.write(line + "\n")
        shown = (done_rows(batch), batch["status"])
        err.flush()
        if batch["status"] in TERMINAL:
            break
        await asyncio.sleep(interval)
    if live:
        err.write("\n")
    print(summary_line(batch, time.monotonic() - started), file=err)
    return 0 if batch["status"] == JobStatus.COMPLETED else 1


async def retry(client: RelayClient, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """A new job of an ended job's failed (or dead-letter) rows; print its job line."""
    created = await client.retry(args.id, args.rows)
    print(job_line(created), file=out)
    out.flush()
    if not args.wait:
        return 0
    return await watch_job(client, created["id"], args.interval, err)


async def pause(client: RelayClient, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Pause a queued or running job; print ``<id>  paused``."""
    batch = await client.pause(args.id)
    print(f"{batch['id']}  {batch['status']}", file=out)
    return 0


async def delete(client: RelayClient, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Delete an ended job or a cron template; print ``<id>  deleted``."""
    deleted = await client.delete(args.id)
    print(f"{deleted['id']}  deleted", file=out)
    return 0


async def resume(client: RelayClient, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Resume a paused job; print ``<id>  queued``."""
    batch = await client.resume(args.id)
    print(f"{batch['id']}  {batch['status']}", file=out)
    return 0


async def redeliver(client: RelayClient, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Ask for the completion webhook again; print ``<id>  retrying  next attempt <time>``."""
    scheduled = await client.redeliver(args.id)
    print(
        f"{scheduled['batch_id']}  {scheduled['status']}  next attempt"
        f" {scheduled.get('next_attempt_at') or '-'}",
        file=out,
    )
    return 0


def delivery_line(attempt: dict[str, Any]) -> str:
    """One attempt: ``<n>  <status>  <HTTP status>  <duration>  <attempted at>  <kind>
    <error>``, ``-`` for what is unknown; kind is first, retry or redelivery."""
    code = attempt.get("response_status")
    duration = attempt.get("duration_ms")
    if attempt.get("redelivery"):
        kind = "redelivery"
    else:
        kind = "first" if attempt["attempt"] == 1 else "retry"
    return (
        f"{attempt['attempt']:>3}  {attempt['status']:<9}  {'-' if code is None else code!s:>3}"
        f"  {'-' if duration is None else f'{duration} ms':>8}  {attempt['attempted_at']}"
        f"  {kind:<10}  {attempt.get('error') or '-'}"
    )


async def deliveries(
    client: RelayClient, args: argparse.Namespace, out: TextIO, err: TextIO
) -> int:
    """Every attempt of the job's completion webhook, one line each, oldest first; the
    delivery's state on stderr."""
    after: str | None = None
    while True:
        page = await client.deliveries(args.id, DELIVERIES_PAGE, after)
        for attempt in page["data"]:
            print(delivery_line(attempt), file=out)
        if not page["has_more"] or not page["data"]:
            break
        after = page["data"][-1]["id"]
    print(delivery_state(page), file=err)
    return 0


def delivery_state(page: dict[str, Any]) -> str:
    """``delivery delivered``, ``delivery retrying, next attempt <time>`` or
    ``no webhook delivery``."""
    if page.get("status") is None:
        return f"{page['batch_id']}: no webhook delivery"
    line = f"{page['batch_id']}: delivery {page['status']}"
    if page.get("next_attempt_at"):
        line += f", next attempt {page['next_attempt_at']}"
    return line


COMMANDS: dict[str, Command] = {
    "submit": submit,
    "status": status,
    "list": list_jobs,
    "cancel": cancel,
    "results": results,
    "watch": watch,
    "retry": retry,
    "pause": pause,
    "resume": resume,
    "deliveries": deliveries,
    "redeliver": redeliver,
    "delete": delete,
}
