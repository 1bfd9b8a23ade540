"""A job's results read back a keyset page at a time: its outcomes, its dead-letter
rows (either with each row's details) and every input row with its outcome, each page
cut by rows and bytes over stored sizes before any row is read in full."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import asyncpg

from relay_batches.ledger.pool import translated
from relay_batches.model import Job

RESULT_PAGE_ROWS = 5000
RESULT_PAGE_BYTES = 4 * 1024 * 1024
T = TypeVar("T")

# A page is cut at $4 rows or $5 bytes of text, whichever comes first; its first row
# goes out even when it alone is larger. The cut is computed over sizes only
# (octet_length reads a stored value's length without detoasting it), then only the
# rows of the page are read in full.
# $1 batch id, $2 the batch whose rows it uses, $3 last row index seen, $4 rows, $5 bytes.
_PAGE_CUT = (
    "WITH sized AS ("
    "  SELECT o.row_index, row_number() OVER w AS n,"
    "   sum(octet_length(r.custom_id) + {size}) OVER w AS upto"
    "  FROM row_results o JOIN batch_rows r ON r.batch_id = $2 AND r.row_index = o.row_index"
    "  WHERE o.batch_id = $1 AND o.row_index > $3 {only}"
    "  WINDOW w AS (ORDER BY o.row_index ROWS UNBOUNDED PRECEDING)"
    "  ORDER BY o.row_index LIMIT $4)"
    " SELECT o.row_index, r.custom_id, {columns}"
    " FROM sized s JOIN row_results o ON o.batch_id = $1 AND o.row_index = s.row_index"
    " JOIN batch_rows r ON r.batch_id = $2 AND r.row_index = s.row_index"
    " WHERE s.n = 1 OR s.upto <= $5 ORDER BY s.row_index"
)
_RESULT_SIZE = (
    "octet_length(COALESCE(o.content, o.error)) + COALESCE(octet_length(o.tool_calls), 0)"
)
# The outcomes a results read may keep (None: every one): ``content`` the successes,
# ``error`` the failures (dead letters included).
OUTCOMES: dict[str | None, str] = {
    None: "",
    "content": "AND o.error IS NULL",
    "error": "AND o.error IS NOT NULL",
}
_RESULTS_PAGES = {
    outcome: _PAGE_CUT.format(
        size=_RESULT_SIZE, only=only, columns="o.content, o.error, o.tool_calls"
    )
    for outcome, only in OUTCOMES.items()
}
_DEAD_LETTER_PAGE = _PAGE_CUT.format(
    size="octet_length(o.error)", only="AND o.dead_letter", columns="o.error, o.attempts"
)
# A row's details (RowDetails' fields, in order) and what they add to a page: their text
# and about DETAIL_BYTES of keys and numbers as the API writes them.
DETAIL_BYTES = 160
_DETAIL_COLUMNS = (
    "o.prompt_tokens, o.completion_tokens, o.attempts, o.deployment, o.latency_ms,"
    " o.finish_reason, o.cost_usd"
)
_DETAIL_SIZE = (
    f" + {DETAIL_BYTES} + COALESCE(octet_length(o.deployment), 0)"
    " + COALESCE(octet_length(o.finish_reason), 0)"
)
_RESULTS_DETAIL_PAGES = {
    outcome: _PAGE_CUT.format(
        size=_RESULT_SIZE + _DETAIL_SIZE,
        only=only,
        columns=f"o.content, o.error, o.tool_calls, {_DETAIL_COLUMNS}",
    )
    for outcome, only in OUTCOMES.items()
}
_DEAD_LETTER_DETAIL_PAGE = _PAGE_CUT.format(
    size="octet_length(o.error)" + _DETAIL_SIZE,
    only="AND o.dead_letter",
    columns=f"o.error, o.attempts, {_DETAIL_COLUMNS}",
)


# Every row of a job's input with its outcome, if any, for the dialects' renderers
# (OpenAI output and error files, Anthropic results), which show rows without an outcome
# of an ended job as canceled or expired. Pages are cut like _PAGE_CUT's; {only} keeps
# the rows with content (a success) or those without.
# $1 batch id, $2 the batch whose rows it uses, $3 last row index seen, $4 rows, $5 bytes.
_ROW_PAGE = (
    "WITH sized AS ("
    "  SELECT r.row_index, row_number() OVER w AS n,"
    "   sum(octet_length(r.custom_id) + COALESCE(octet_length(o.content), 0)"
    "       + COALESCE(octet_length(o.error), 0) + COALESCE(octet_length(o.tool_calls), 0)"
    "       + COALESCE(octet_length(o.body), 0))"
    "     OVER w AS upto"
    "  FROM batch_rows r LEFT JOIN row_results o"
    "    ON o.batch_id = $1 AND o.row_index = r.row_index AND o.row_index > $3"
    "  WHERE r.batch_id = $2 AND r.row_index > $3 {only}"
    "  WINDOW w AS (ORDER BY r.row_index ROWS UNBOUNDED PRECEDING)"
    "  ORDER BY r.row_index LIMIT $4)"
    " SELECT r.row_index, r.custom_id, o.content, o.error, o.tool_calls, o.finish_reason,"
    "  o.model, o.prompt_tokens, o.completion_tokens, o.attempts, o.dead_letter, o.deployment,"
    "  o.row_index IS NOT NULL AS done, o.body"
    " FROM sized s JOIN batch_rows r ON r.batch_id = $2 AND r.row_index = s.row_index"
    " LEFT JOIN row_results o ON o.batch_id = $1 AND o.row_index = s.row_index"
    " WHERE s.n = 1 OR s.upto <= $5 ORDER BY s.row_index"
)
ROW_SELECTIONS = {
    "all": "",
    "succeeded": "AND o.content IS NOT NULL",
    "unsucceeded": "AND o.content IS NULL",
}
_ROW_PAGES = {name: _ROW_PAGE.format(only=only) for name, only in ROW_SELECTIONS.items()}


@dataclass(frozen=True)
class RowDetails:
    """What an outcome records beside its answer: tokens, attempts, the deployment that
    answered (None if none did), latency and cost (None when unknown or unpriced)."""

    prompt_tokens: int
    completion_tokens: int
    attempts: int
    deployment: str | None
    latency_ms: int | None
    finish_reason: str | None
    cost_usd: float | None


@dataclass(frozen=True)
class ResultRow:
    """One row of a job's results; ``tool_calls`` is the JSON text of the answer's
    chat-completions tool calls (None when the model called none); ``details`` is there
    when the page was asked for with them."""

    row_index: int
    custom_id: str
    content: str | None
    error: str | None
    tool_calls: str | None = None
    details: RowDetails | None = None

    @classmethod
    def with_details(
        cls,
        row_index: int,
        custom_id: str,
        content: str | None,
        error: str | None,
        tool_calls: str | None,
        *details: Any,
    ) -> ResultRow:
        """From a row of the results-with-details page: the row's fields, then details'."""
        return cls(row_index, custom_id, content, error, tool_calls, RowDetails(*details))


@dataclass(frozen=True)
class AnsweredRow:
    """One row of a job's input with its whole outcome; ``done`` is False (and every
    outcome field None) for a row without one."""

    row_index: int
    custom_id: str
    content: str | None
    error: str | None
    tool_calls: str | None
    finish_reason: str | None
    model: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    attempts: int | None
    dead_letter: bool | None
    deployment: str | None
    done: bool
    body: str | None = None  # the provider's whole reply, when the outcome kept it


@dataclass(frozen=True)
class DeadLetterRow:
    """One row on a job's dead-letter list."""

    row_index: int
    custom_id: str
    error: str
    attempts: int
    details: RowDetails | None = None

    @classmethod
    def with_details(
        cls, row_index: int, custom_id: str, error: str, attempts: int, *details: Any
    ) -> DeadLetterRow:
        """From a row of the dead-letter-with-details page: the row's fields, then details'."""
        return cls(row_index, custom_id, error, attempts, RowDetails(*details))


class ResultPages:
    """The result pages of :class:`~relay_batches.ledger.jobs.JobStore`, on its pool,
    ``page_bytes`` per page unless a call says otherwise."""

    def __init__(self, pool: asyncpg.Pool, page_bytes: int = RESULT_PAGE_BYTES) -> None:
        self._pool = pool
        self._page_bytes = page_bytes

    def result_pages(
        self,
        job: Job,
        page_rows: int = RESULT_PAGE_ROWS,
        page_bytes: int | None = None,
        outcome: str | None = None,
    ) -> AsyncIterator[list[ResultRow]]:
        """The job's outcomes in row order, a keyset page at a time: at most ``page_rows``
        rows and ``page_bytes`` of text (the store's budget by default) per page, unless
        one row alone is larger (it then goes out alone, whole); ``outcome`` (a key of
        :data:`OUTCOMES`) keeps only the successes or only the failures."""
        return self._pages(_RESULTS_PAGES[outcome], job, page_rows, page_bytes, ResultRow)

    def dead_letter_pages(
        self,
        job: Job,
        page_rows: int = RESULT_PAGE_ROWS,
        page_bytes: int | None = None,
    ) -> AsyncIterator[list[DeadLetterRow]]:
        """The job's dead-letter rows in row order, pages bounded as :meth:`result_pages`."""
        return self._pages(_DEAD_LETTER_PAGE, job, page_rows, page_bytes, DeadLetterRow)

    def detailed_result_pages(
        self,
        job: Job,
        page_rows: int = RESULT_PAGE_ROWS,
        page_bytes: int | None = None,
        outcome: str | None = None,
    ) -> AsyncIterator[list[ResultRow]]:
        """:meth:`result_pages` with every row's :class:`RowDetails` (counted in the
        page's bytes)."""
        return self._pages(
            _RESULTS_DETAIL_PAGES[outcome], job, page_rows, page_bytes, ResultRow.with_details
        )

    def detailed_dead_letter_pages(
        self,
        job: Job,
        page_rows: int = RESULT_PAGE_ROWS,
        page_bytes: int | None = None,
    ) -> AsyncIterator[list[DeadLetterRow]]:
        """:meth:`dead_letter_pages` with every row's :class:`RowDetails`."""
        return self._pages(
            _DEAD_LETTER_DETAIL_PAGE, job, page_rows, page_bytes, DeadLetterRow.with_details
        )

    def answered_pages(
        self,
        job: Job,
        select: str = "all",
        page_rows: int = RESULT_PAGE_ROWS,
        page_bytes: int | None = None,
    ) -> AsyncIterator[list[AnsweredRow]]:
        """Every row of the job's input in row order with its outcome, if any, pages
        bounded as :meth:`result_pages`; ``select`` is a key of :data:`ROW_SELECTIONS`
        (``succeeded``: rows with content; ``unsucceeded``: rows with an error or none)."""
        return self._pages(_ROW_PAGES[select], job, page_rows, page_bytes, AnsweredRow)

    async def _pages(
        self,
        sql: str,
        job: Job,
        page_rows: int,
        page_bytes: int | None,
        factory: Callable[..., T],
    ) -> AsyncIterator[list[T]]:
        budget = self._page_bytes if page_bytes is None else page_bytes
        last, limit = -1, page_rows
        while True:
            async with translated():
                records = await self._pool.fetch(
                    sql, job.id, job.rows_batch_id, last, limit, budget
                )
            if not records:
                return
            yield [factory(*r) for r in records]
            last = records[-1][0]
            # A short page was cut by bytes or is the last (only an empty one says which).
            # Sizes are looked at for about twice the rows the last page held, so pages of
            # big rows do not each measure thousands of rows they will never hold.
            limit = min(page_rows, 2 * len(records) + 16)
