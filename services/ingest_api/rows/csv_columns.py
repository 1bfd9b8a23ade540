"""Which fields of an uploaded CSV file's records are the prompt and the custom id.

A file whose first record (on line 1) names the prompt column (``prompt`` by default, any
case) has a header row: every record then has the header's number of fields, the prompt
is read from that column, the custom id from the id column (``custom_id`` when the header
has one, unless another is chosen; else ``row-1``, ``row-2``, …), other columns are
ignored. A file without such a header is one prompt per record, as before. Choosing a
column the first record does not name is an error.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_PROMPT = "prompt"
DEFAULT_ID = "custom_id"


class RecordError(Exception):
    """What is wrong with one record (the caller names its line)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class CsvColumns:
    """The columns asked for (None: the defaults): by header name, any case."""

    prompt: str | None = None
    id: str | None = None


NO_COLUMNS = CsvColumns()  # the defaults


def _key(name: str) -> str:
    return name.strip().lower()


class CsvLayout:
    """Reads a CSV file's records as requests; :meth:`header` is shown its first record."""

    def __init__(self, columns: CsvColumns) -> None:
        self._columns = columns
        self._width = 1
        self._prompt_at = 0
        self._id_at: int | None = None

    def header(self, first: list[str] | None) -> bool:
        """Look at the file's first record (None when it is not on line 1, so cannot be
        a header); True when it is the header row, to be skipped. :class:`RecordError`
        when a column was chosen and the file has no header naming it."""
        chosen = self._columns
        names = [_key(field) for field in first or []]
        prompt = _key(chosen.prompt or DEFAULT_PROMPT)
        if prompt not in names:
            if chosen.prompt is not None or chosen.id is not None:
                shown = ", ".join(repr(field) for field in first or [])
                raise RecordError(
                    f"no column named {prompt!r} in the header row (line 1: {shown or 'none'});"
                    " a file without a header holds one prompt per record"
                )
            return False
        self._width = len(names)
        self._prompt_at = names.index(prompt)
        if chosen.id is not None:
            if _key(chosen.id) not in names:
                raise RecordError(f"no column named {_key(chosen.id)!r} in the header row")
            self._id_at = names.index(_key(chosen.id))
        elif DEFAULT_ID in names:
            self._id_at = names.index(DEFAULT_ID)
        return True

    def request(self, record: list[str]) -> tuple[dict[str, object], int]:
        """One record's request and the bytes of text it was read from."""
        if len(record) != self._width:
            if self._width == 1:
                raise RecordError(
                    f"expected one field (the prompt), found {len(record)}; put a prompt that"
                    " holds commas in double quotes, or start the file with a header row"
                    " naming its prompt column"
                )
            raise RecordError(
                f"expected {self._width} fields, as the header row has, found {len(record)}"
            )
        prompt = record[self._prompt_at]
        if not prompt.strip():
            raise RecordError("the prompt is empty")
        request: dict[str, object] = {"messages": [{"role": "user", "content": prompt}]}
        size = len(prompt)
        if self._id_at is not None:
            custom_id = record[self._id_at]
            if not custom_id:
                raise RecordError("the custom id is empty")
            request["custom_id"] = custom_id
            size += len(custom_id)
        return request, size
