"""``batch_rows.model``: the alias a stored row names itself, read once when the row is
written (migrations 0024 and 0025 add and fill it for rows stored before).

A stored request is either the row's messages array alone (it names no alias: it runs
under its job's) or an object whose ``"model"``, when present, is the row's own alias.
The offload intake routes each row by this column; no statement parses a row's JSON.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import orjson

# The alias of a row whose request cannot be read (the ingest validates every row, so no
# stored row should be one) or whose model no deployment could lead (not a string, or
# holding a NUL, which text cannot store): no batch deployment leads it, so the offload
# intake sends it realtime, where the router reads the row itself and fails it with a
# reason.
UNREADABLE = ""


def row_model(request: str) -> str | None:
    """The alias ``request`` (a row's stored chat request) names, None when it names
    none, :data:`UNREADABLE` when it cannot be read or no deployment could lead it.

    Only an object whose text holds ``"model"`` is parsed (the ingest stores each row
    with orjson, which never escapes a key); another is taken as naming none, readable
    or not (the offloader forwards a row whose request does not decode when it builds
    its provider batch's line)."""
    if not request.startswith("{") or '"model"' not in request:
        return None  # a bare messages array, or an object without a model (no parse)
    try:
        value = orjson.loads(request)
    except orjson.JSONDecodeError:
        return UNREADABLE
    model = value.get("model") if isinstance(value, dict) else None
    if model is None:
        return None
    if not isinstance(model, str) or "\x00" in model:
        return UNREADABLE
    return model


def with_models(
    rows: Iterable[tuple[str, int, str, str]],
) -> Iterator[tuple[str, int, str, str, str | None]]:
    """``(batch_id, row_index, custom_id, request)`` rows with their model appended, as
    :data:`ROW_COLUMNS` COPYs them."""
    for batch_id, row_index, custom_id, request in rows:
        yield batch_id, row_index, custom_id, request, row_model(request)


# The columns of ``batch_rows`` a COPY of :func:`with_models` rows fills.
ROW_COLUMNS = ("batch_id", "row_index", "custom_id", "request", "model")
