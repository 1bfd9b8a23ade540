"""A batch's output and error files in OpenAI's line format, rendered from the ledger
(each line as :mod:`relay_batches.dialects.openai.render` writes it).

Files are streamed a ledger page at a time (:meth:`JobStore.answered_pages`), never held
whole. A batch's files exist once it has ended, when its outcomes no longer change, so
a file renders to the same bytes every time: its size is measured by rendering it once
(:func:`output_file`) and recorded with the file.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from functools import partial

from relay_batches.dialects.openai.render import ERROR, OUTPUT, render_page
from relay_batches.ledger.files import LinkedBatch, StoredFile
from relay_batches.model import TERMINAL, Job
from relay_batches.services.ingest_api.deps import ApiDeps

_SELECTIONS = {OUTPUT: "succeeded", ERROR: "unsucceeded"}


@dataclass(frozen=True)
class OutputFiles:
    """The ids (32-hex) of a batch's output and error files, None where it has none."""

    output: str | None
    error: str | None


def output_files(linked: LinkedBatch) -> OutputFiles:
    """Which files an ended batch has: an output file if a row succeeded, an error file
    if one did not; none while it runs or when its input failed validation."""
    job, link = linked.job, linked.link
    if job.status not in TERMINAL or link.errors is not None:
        return OutputFiles(None, None)
    has_errors = job.completed < job.total
    return OutputFiles(
        link.output_file_id if job.completed else None,
        link.error_file_id if has_errors else None,
    )


def kind_of(linked: LinkedBatch, file_id: str) -> str | None:
    """``output`` or ``error`` if ``file_id`` is one of the batch's existing files."""
    files = output_files(linked)
    if file_id == files.output:
        return OUTPUT
    if file_id == files.error:
        return ERROR
    return None


def filename_of(linked: LinkedBatch, kind: str) -> str:
    """OpenAI's names for a batch's files: ``batch_<id>_output.jsonl`` / ``_error.jsonl``."""
    return f"batch_{linked.job.id}_{kind}.jsonl"


async def rendered(deps: ApiDeps, job: Job, kind: str) -> AsyncIterator[bytes]:
    """The file's content, a rendered page at a time (each rendered off the event loop)."""
    loop = asyncio.get_running_loop()
    async for page in deps.jobs.answered_pages(job, _SELECTIONS[kind]):
        yield await loop.run_in_executor(None, partial(render_page, job, kind, page))


async def output_file(deps: ApiDeps, linked: LinkedBatch, kind: str) -> StoredFile | None:
    """The batch's ``kind`` file, registered with its measured size the first time it
    is asked for (one rendering measures it while concurrent callers wait for it);
    None once deleted."""
    job = linked.job
    link = linked.link
    file_id = link.output_file_id if kind == OUTPUT else link.error_file_id

    async def measure() -> int:
        size = 0
        async for chunk in rendered(deps, job, kind):
            size += len(chunk)
        return size

    created = job.completed_at or job.created_at
    name = filename_of(linked, kind)
    return await deps.files.output_file_once(job.workspace_id, file_id, name, created, measure)
