"""``relay batch submit|status|list|cancel|results|dead-letter|watch|retry|pause|resume|
deliveries|redeliver|delete`` and ``relay models``: the public API from a terminal.

The server URL and key come from ``RELAY_URL`` / ``RELAY_API_KEY`` or ``--url`` /
``--api-key``. Output for scripts goes to stdout (job ids, results; ``--json`` on the
read commands); progress and messages go to stderr. Exit codes: 0 success (for
``watch``, ``submit --wait`` and ``retry --wait``: every job ``completed`` without a
failed row), 1 an API or network error, 2 a usage error, 3 a job completed with failed
rows, 4 a job failed, was canceled or expired (several jobs: the highest). An API error
is printed as one line: ``relay: invalid API key (401 …)``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any, TextIO

import orjson

from relay_batches.model import TERMINAL, JobStatus
from relay_batches.services.relay_cli.args import UsageError, pairs
from relay_batches.services.relay_cli.client import ApiFailure, RelayClient
from relay_batches.services.relay_cli.outputs import dead_letter, results
from relay_batches.services.relay_cli.progress import (
    EXIT_COMPLETED,
    EXIT_JOB_ENDED_OTHERWISE,
    EXIT_ROWS_FAILED,
    RateMeter,
    clock,
    cost_text,
    done_rows,
    exit_code,
    percent_bar,
    progress_line,
    status_text,
    summary_line,
)
from relay_batches.settings import ClientSettings, ConfigError

DELIVERIES_PAGE = 100
EXIT_MEANINGS = {
    EXIT_ROWS_FAILED: "the job completed, but rows failed",
    EXIT_JOB_ENDED_OTHERWISE: "the job failed, was canceled or expired",
}


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
    created = await client.upload(args.files, upload_fields(args))
    for batch in created:
        print(job_line(batch), file=out)
    out.flush()
    if not args.wait:
        return 0
    codes = [await watch_job(client, b["id"], args.interval, err) for b in created]
    return max(codes)


def upload_fields(args: argparse.Namespace) -> dict[str, str]:
    """The upload's form fields from ``submit``'s options: ``params`` from ``--param``,
    ``--temperature`` and ``--max-tokens``, ``metadata`` from ``--metadata`` (both
    JSON-encoded), the rest as given; an option not given is left out."""
    params = pairs(args.param, "--param", as_json=True)
    for key, value in (("temperature", args.temperature), ("max_tokens", args.max_tokens)):
        if value is not None:
            if key in params:
                raise UsageError(f"{key} is given twice (--{key.replace('_', '-')} and --param)")
            params[key] = value
    metadata = pairs(args.metadata, "--metadata", as_json=False)
    optional = {
        "model": args.model,
        "priority": args.priority,
        "name": args.name,
        "webhookUrl": args.webhook,
        "cron": args.cron,
        "budget_usd": args.budget,
        "completion_window": args.completion_window,
        "params": orjson.dumps(params).decode() if params else None,
        "metadata": orjson.dumps(metadata).decode() if metadata else None,
        "prompt_column": args.prompt_column,
        "id_column": args.id_column,
    }
    return {k: v for k, v in optional.items() if v is not None}


def job_line(batch: dict[str, Any]) -> str:
    """``<id>  <status>  <n> rows  <name>``: a created job, as ``submit`` and ``retry`` print it."""
    return f"{batch['id']}  {batch['status']}  {batch['total']} rows  {batch['name']}"


def print_json(value: Any, out: TextIO) -> None:
    """``value`` as indented JSON on ``out`` (``--json``)."""
    out.write(orjson.dumps(value, option=orjson.OPT_INDENT_2).decode() + "\n")


async def status(client: RelayClient, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Print one job's state (or its batch object with ``--json``)."""
    batch = await client.get(args.id)
    if args.json:
        print_json(batch, out)
        return 0
    for label, value in _status_lines(batch):
        print(f"{label:<10}{value}", file=out)
    return 0


def _status_lines(batch: dict[str, Any]) -> list[tuple[str, str]]:
    lines = [
        ("id", batch["id"]),
        ("name", batch["name"]),
        ("status", status_text(batch)),
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
    if args.json:
        print_json(page, out)
        return 0
    print(f"{'ID':<32}  {'STATUS':<20}  {'DONE':>13}  {'CREATED':<20}  NAME", file=out)
    for batch in page["data"]:
        done = f"{done_rows(batch)}/{batch['total']}"
        print(
            f"{batch['id']:<32}  {status_text(batch):<20}  {done:>13}"
            f"  {batch['created_at']:<20}  {batch['name']}",
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


async def watch(client: RelayClient, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Show a live progress bar until the job ends; the exit code of :func:`exit_code`
    (``--json``: the ended job's batch object on stdout)."""
    ended: list[dict[str, Any]] = []
    code = await watch_job(client, args.id, args.interval, err, ended)
    if args.json:
        print_json(ended[-1], out)
    return code


async def watch_job(
    client: RelayClient,
    batch_id: str,
    interval: float,
    err: TextIO,
    ended: list[dict[str, Any]] | None = None,
) -> int:
    """Poll the job every ``interval`` seconds, drawing the progress line on ``err``; at
    the end its summary (and a hint when rows failed), the ended batch appended to
    ``ended``; the exit code of :func:`exit_code`."""
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
    print(summary_line(batch), file=err)
    code = exit_code(batch)
    if batch["failed"]:
        print(
            f"relay: {batch['failed']} row(s) failed: relay batch results {batch_id} --failed",
            file=err,
        )
    if code != EXIT_COMPLETED:
        print(f"relay: exit {code} ({EXIT_MEANINGS[code]})", file=err)
    if ended is not None:
        ended.append(batch)
    return code


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
    attempts: list[dict[str, Any]] = []
    while True:
        page = await client.deliveries(args.id, DELIVERIES_PAGE, after)
        attempts += page["data"]
        if not args.json:
            for attempt in page["data"]:
                print(delivery_line(attempt), file=out)
        if not page["has_more"] or not page["data"]:
            break
        after = page["data"][-1]["id"]
    if args.json:
        print_json({**page, "data": attempts, "has_more": False}, out)
        return 0
    print(delivery_state(page), file=err)
    return 0


async def models(client: RelayClient, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """The model aliases the key can submit to, one a line (``--json``: the API's list)."""
    listing = await client.models()
    if args.json:
        print_json(listing, out)
        return 0
    for model in listing["data"]:
        print(model["id"], file=out)
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
    "dead-letter": dead_letter,
    "watch": watch,
    "retry": retry,
    "pause": pause,
    "resume": resume,
    "deliveries": deliveries,
    "redeliver": redeliver,
    "delete": delete,
    "models": models,
}
