"""Benchmark of row validation, in process: rows/s for plain, rich and dialect rows.

The figures that must hold are >= 50,000 rows/s (:data:`FLOORS`): a ``POST /v1/batches``
body of plain rows through :func:`scan_submit` (decode, validate, encode), the CPU-bound
part of ingest that runs in a worker thread; an OpenAI batch file whose lines carry
``max_tokens`` and ``temperature``, as real files do; and an Anthropic create body of
simple requests (``max_tokens`` is mandatory there) through
:func:`.anthropic_create.scan_requests`. Beside each rate are
the CPU it took per row (this thread's CPU time, so other processes do not count) and
the machine's busy share while it ran (from ``/proc/stat``: on a shared machine a low
rate with a high busy share means contention, not slow code).

Run alone with ``python -m tests.bench.test_row_validation`` (prints the figures).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import orjson

from relay_batches.services.ingest_api.rows.files import parse_upload_file
from relay_batches.services.ingest_api.rows.validation import (
    SubmitLimits,
    scan_submit,
)
from relay_batches.services.ingest_api.surfaces.anthropic.create import scan_requests
from tests.bench.harness import RUNS, Figure, busy_share, machine_ticks

ROWS = 50_000
MODEL = "gpt-4o-mini"
MODELS = frozenset({MODEL})
LIMITS = SubmitLimits(max_rows=100_000)
FLOOR_ROWS_PER_S = 50_000
FLOORS = (
    "ingest_validate_plain_rows_per_s",
    "upload_validate_openai_params_rows_per_s",
    "ingest_validate_anthropic_rows_per_s",
)


def plain_rows() -> list[dict[str, Any]]:
    messages = [
        {"role": "system", "content": "You classify product reviews."},
        {"role": "user", "content": "Classify: great product, would buy again"},
    ]
    return [{"custom_id": f"r-{i}", "messages": messages} for i in range(ROWS)]


def rich_rows() -> list[dict[str, Any]]:
    tool = {"type": "function", "function": {"name": "label", "parameters": {"type": "object"}}}
    messages = [
        {"role": "system", "content": "You classify product reviews."},
        {"role": "user", "content": [{"type": "text", "text": "Classify: great product"}]},
    ]
    return [
        {"custom_id": f"r-{i}", "messages": messages, "tools": [tool], "max_tokens": 16}
        for i in range(ROWS)
    ]


def openai_file(**params: Any) -> bytes:
    lines = (
        orjson.dumps(
            {
                "custom_id": f"r-{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": MODEL, **row, **params},
            }
        )
        for i, row in enumerate({"messages": r["messages"]} for r in plain_rows())
    )
    return b"\n".join(lines) + b"\n"


def anthropic_requests() -> list[dict[str, Any]]:
    params = {
        "model": MODEL,
        "max_tokens": 16,
        "system": "You classify product reviews.",
        "messages": [{"role": "user", "content": "Classify: great product, would buy again"}],
    }
    return [{"custom_id": f"r_{i}", "params": params} for i in range(ROWS)]


def anthropic_file() -> bytes:
    lines = (orjson.dumps(request) for request in anthropic_requests())
    return b"\n".join(lines) + b"\n"


def measure(run: Callable[[], int]) -> dict[str, Figure]:
    """Rows/s, CPU µs per row and machine busy share of ``RUNS`` runs of ``run``."""
    rates, cpu, busy = Figure(), Figure(), Figure()
    for _ in range(RUNS):
        ticks = machine_ticks()
        cpu0, wall0 = time.thread_time(), time.perf_counter()
        n = run()
        wall, used = time.perf_counter() - wall0, time.thread_time() - cpu0
        rates.samples.append(n / wall)
        cpu.samples.append(used / n * 1e6)
        busy.samples.append(busy_share(ticks, machine_ticks()))
    return {"rows_per_s": rates, "cpu_us_per_row": cpu, "machine_busy_share": busy}


def figures() -> dict[str, float]:
    """Every figure of this benchmark, by report key."""
    plain = orjson.dumps({"model": MODEL, "requests": plain_rows()})
    rich = orjson.dumps({"model": MODEL, "requests": rich_rows()})
    openai, anthropic = openai_file(), anthropic_file()
    openai_params = openai_file(max_tokens=16, temperature=0.2)
    create = orjson.dumps({"requests": anthropic_requests()})
    cases: dict[str, Callable[[], int]] = {
        "ingest_validate_plain": lambda: len(scan_submit(plain, LIMITS, MODELS).rows),
        "ingest_validate_rich": lambda: len(scan_submit(rich, LIMITS, MODELS).rows),
        "upload_validate_openai": lambda: len(parse_upload_file("b.jsonl", openai, LIMITS, MODELS)),
        "upload_validate_openai_params": lambda: len(
            parse_upload_file("b.jsonl", openai_params, LIMITS, MODELS)
        ),
        "upload_validate_anthropic": lambda: len(
            parse_upload_file("b.jsonl", anthropic, LIMITS, MODELS)
        ),
        "ingest_validate_anthropic": lambda: len(scan_requests(create, LIMITS, MODELS)),
    }
    out: dict[str, float] = {}
    for case, run in cases.items():
        for name, figure in measure(run).items():
            out.update(figure.keys(f"{case}_{name}"))
    return out


def test_row_validation_rates(report: dict[str, Any]) -> None:
    found = figures()
    report.update(found)
    for key in sorted(k for k in found if not k.endswith(("_min", "_max"))):
        print(f"{key:50} {found[key]:>14,.3f}")
    slow = {key: found[key] for key in FLOORS if found[key] < FLOOR_ROWS_PER_S}
    assert not slow, f"under {FLOOR_ROWS_PER_S:,} rows/s: {slow}"


if __name__ == "__main__":
    for key, value in sorted(figures().items()):
        print(f"{key:50} {value:>14,.3f}")
