"""``batch_rows.model`` as the ledger reads it from a stored request: the alias a row
names itself, None for none, '' for one no deployment could lead."""

from __future__ import annotations

import orjson
import pytest

from relay_batches.ledger.row_model import UNREADABLE, row_model, with_models


@pytest.mark.parametrize(
    ("request_json", "model"),
    [
        ('[{"role":"user","content":"model"}]', None),  # a bare messages array
        ('{"messages":[]}', None),
        ('{"messages":[{"role":"user","content":"the \\"model\\" key"}]}', None),
        ('{"messages":[],"model":"gpt-x"}', "gpt-x"),
        ('{"max_tokens":5,"messages":[],"model":"\\u00e9t\\u00e9"}', "été"),
        ('{"messages":[],"model":null}', None),
        ('{"messages":[],"model":5}', UNREADABLE),
        ('{"messages": [ "model"', UNREADABLE),
    ],
)
def test_the_model_a_stored_request_names(request_json: str, model: str | None) -> None:
    assert row_model(request_json) == model


def test_a_nul_elsewhere_is_read_and_a_nul_in_the_model_leads_nowhere() -> None:
    content_nul = orjson.dumps({"messages": [{"content": "a\x00b"}], "model": "m"}).decode()
    assert "\\u0000" in content_nul
    assert row_model(content_nul) == "m"
    assert row_model(orjson.dumps({"messages": [], "model": "half\x00"}).decode()) == UNREADABLE


def test_rows_get_their_model_appended_for_the_copy() -> None:
    rows = [("b", 0, "c-0", "[]"), ("b", 1, "c-1", '{"messages":[],"model":"m"}')]
    assert list(with_models(rows)) == [
        ("b", 0, "c-0", "[]", None),
        ("b", 1, "c-1", rows[1][3], "m"),
    ]
