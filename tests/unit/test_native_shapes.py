"""The native surface's pydantic shapes (the source of its OpenAPI schemas) take what the
code answers and what it accepts, and refuse what it refuses."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from relay_batches.errors import ApiError
from relay_batches.services.ingest_api.rows import validation
from relay_batches.services.ingest_api.surfaces.native.shapes import Batch, CreateBatch
from tests.unit.test_openapi_document import EXAMPLE, batch


def test_a_batch_as_answered_is_a_batch_shape() -> None:
    shown = batch(status="completed", template_id="a" * 32).to_api()
    assert Batch.model_validate(shown).model_dump(mode="json", exclude_unset=True) == shown


def test_the_request_example_is_a_create_batch_shape() -> None:
    CreateBatch.model_validate(EXAMPLE)


@pytest.mark.parametrize(
    "payload",
    [
        {**EXAMPLE, "name": "n" * 257},
        {**EXAMPLE, "priority": 1001},
        {**EXAMPLE, "budget_usd": 0},
        {**EXAMPLE, "webhookUrl": "ftp://example.test/hook"},
        {**EXAMPLE, "bogus": 1},
        {**EXAMPLE, "requests": []},
    ],
)
def test_the_create_shape_refuses_what_the_code_refuses(payload: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        CreateBatch.model_validate(payload)
    with pytest.raises(ApiError):
        validation.validate_submit(payload, validation.SubmitLimits(), {"m", "gpt-4o-mini"})
