"""The command line of ``relay batch …`` and ``relay models``: every subcommand's
arguments (argparse), and the ``key=value`` options of ``submit`` read into JSON
objects."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import orjson

from relay_batches.model import JobStatus

DEFAULT_INTERVAL_S = 1.0
RETRY_ROWS = ("failed", "dead_letter")
RESULT_FORMATS = ("jsonl", "json", "csv")
JSON_HELP = "print the API's JSON instead of text"


class UsageError(Exception):
    """The command line asks for something that cannot work (exit code 2)."""


def add_batch_parser(sub: Any) -> None:
    """Add ``relay batch …`` and ``relay models`` to the top-level subparsers ``sub``."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", help="API base URL (default: $RELAY_URL or 127.0.0.1:8080)")
    common.add_argument("--api-key", help="API key (default: $RELAY_API_KEY)")
    common.add_argument("--timeout", type=float, help="seconds to wait for the API to answer")
    models = sub.add_parser(
        "models", parents=[common], help="the model aliases the API key can submit to"
    )
    models.add_argument("--json", action="store_true", help=JSON_HELP)
    models.set_defaults(batch_command="models")
    batch = sub.add_parser("batch", help="submit and follow batches through the public API")
    commands = batch.add_subparsers(dest="batch_command", required=True)
    _add_submit_parser(commands, common)

    status = commands.add_parser("status", parents=[common], help="one job's state")
    status.add_argument("id")
    status.add_argument("--json", action="store_true", help="print the batch object as JSON")

    listing = commands.add_parser("list", parents=[common], help="jobs, newest first")
    listing.add_argument("--status", choices=[s.value for s in JobStatus])
    listing.add_argument("--limit", type=int, default=20, help="1-100 (default 20)")
    listing.add_argument("--after", help="the last id of the previous page")
    listing.add_argument("--json", action="store_true", help=JSON_HELP)

    cancel = commands.add_parser("cancel", parents=[common], help="cancel a job")
    cancel.add_argument("id")

    results = commands.add_parser("results", parents=[common], help="a finished job's results")
    results.add_argument("id")
    results.add_argument(
        "-o",
        "--output",
        type=Path,
        help="write here, in the format its extension names (.jsonl, .json, .csv)"
        " unless --format says (default: JSONL on stdout)",
    )
    results.add_argument("--format", choices=RESULT_FORMATS, help="jsonl, json or csv")
    results.add_argument("--failed", action="store_true", help="only the rows that failed")
    results.add_argument(
        "--partial", action="store_true", help="the rows finished so far, while the job runs"
    )
    results.add_argument(
        "--details",
        action="store_true",
        help="each row's usage, attempts, deployment, latency, finish reason and cost",
    )

    dead = commands.add_parser(
        "dead-letter", parents=[common], help="a job's dead-letter rows (worth replaying)"
    )
    dead.add_argument("id")
    dead.add_argument("--details", action="store_true", help="each row's details too")
    dead.add_argument("--json", action="store_true", help=JSON_HELP)

    watch = commands.add_parser("watch", parents=[common], help="progress bar until the end")
    watch.add_argument("id")
    watch.add_argument("--interval", type=float, default=DEFAULT_INTERVAL_S, help="poll seconds")
    watch.add_argument(
        "--json", action="store_true", help="print the ended job's batch object on stdout"
    )
    _add_operate_parsers(commands, common)


def _add_submit_parser(commands: Any, common: argparse.ArgumentParser) -> None:
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
    submit.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a request parameter for every row (repeatable); VALUE is read as JSON"
        ' (0.2, true, ["a"]), else as a string',
    )
    submit.add_argument("--temperature", type=float, help="the same as --param temperature=…")
    submit.add_argument("--max-tokens", type=int, help="the same as --param max_tokens=…")
    submit.add_argument(
        "--completion-window", help="e.g. 24h: rows not finished by then end as expired"
    )
    submit.add_argument(
        "--metadata",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a string pair stored with the job (repeatable)",
    )
    submit.add_argument(
        "--prompt-column", help="a CSV file's prompt column, by its header (default: prompt)"
    )
    submit.add_argument(
        "--id-column",
        help="a CSV file's custom id column, by its header (default: custom_id if there"
        " is one, else row-1, row-2, …)",
    )
    submit.add_argument("--wait", action="store_true", help="watch the jobs until they end")
    submit.add_argument("--interval", type=float, default=DEFAULT_INTERVAL_S, help="poll seconds")


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
        ("delete", "delete an ended job or a cron template and everything stored for it"),
    ):
        commands.add_parser(name, parents=[common], help=text).add_argument("id")
    deliveries = commands.add_parser(
        "deliveries", parents=[common], help="every attempt of an ended job's completion webhook"
    )
    deliveries.add_argument("id")
    deliveries.add_argument("--json", action="store_true", help=JSON_HELP)


def pairs(raw: list[str], option: str, as_json: bool) -> dict[str, Any]:
    """``KEY=VALUE`` options as an object; with ``as_json`` each value is read as JSON
    when it is JSON, else kept as a string. :class:`UsageError` naming ``option`` for an
    item without ``=`` or with an empty key, or a key given twice."""
    found: dict[str, Any] = {}
    for item in raw:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"{option} takes KEY=VALUE, got {item!r}")
        if key in found:
            raise UsageError(f"{option} {key} is given more than once")
        found[key] = _json_or_text(value) if as_json else value
    return found


def _json_or_text(value: str) -> Any:
    try:
        return orjson.loads(value)
    except orjson.JSONDecodeError:
        return value
