"""``POST /v1/batches/estimate`` in the OpenAPI document: its request (a create body, or
an uploaded file's id with the job-level fields) and its answer."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from relay_batches.services.ingest_api.surfaces.native import shapes
from relay_batches.services.ingest_api.surfaces.native.document import (
    BODY_ERRORS,
    json,
    operation,
    schema,
)
from relay_batches.services.ingest_api.surfaces.native.estimate import FILE_KEY


class EstimateFromFile(shapes.Closed):
    """An input file uploaded through `POST /openai/v1/files` (`purpose: batch`), with the
    job-level fields of `POST /v1/batches` (`model` defaults to the file's)."""

    input_file_id: str = Field(description="`file-…`; unknown or another workspace's: 404.")
    model: str | None = None
    completion_window: str | None = None
    budget_usd: float | None = Field(default=None, gt=0)
    params: dict[str, Any] | None = None


class LaneCost(shapes.Closed):
    """What the whole job would cost in one lane."""

    lane: shapes.Lane
    deployment: str
    cost_usd: float = Field(ge=0)


class EstimatePlan(shapes.Closed):
    """The plan Relay would choose: the cheapest lanes that meet the window and budget."""

    steps: list[shapes.PlanStep]
    cost_usd: float = Field(ge=0)
    fits: bool = Field(description="Whether it meets the completion window and the budget.")
    reason: str


class Estimate(shapes.Closed):
    """`POST /v1/batches/estimate`: what the job would cost, and when it would finish."""

    object: Literal["batch.estimate"]
    rows: shapes.Count
    prompt_tokens: shapes.Count = Field(description="A token per four characters of text.")
    completion_tokens: shapes.Count
    completion_basis: Literal["observed", "prompt"] = Field(
        description="`observed`: the workspace's mean completion tokens per answered row of"
        " the alias; `prompt`: none observed yet, as many as each row's prompt. Either is"
        " capped by the row's `max_tokens`."
    )
    lanes: list[LaneCost]
    plan: EstimatePlan
    cost_usd: float = Field(ge=0, description="The plan's cost.")
    expected_finish_s: float = Field(ge=0)
    expected_finish_at: shapes.Timestamp


REQUESTS = (EstimateFromFile,)
RESPONSES = (Estimate,)


def estimate_path() -> dict[str, Any]:
    """``/v1/batches/estimate``."""
    return {
        "post": operation(
            "estimateBatch",
            "Estimate a batch's cost per lane and its finish, before submitting it",
            {"200": json(Estimate, "The estimate; nothing is stored.")},
            (*BODY_ERRORS, 404),
            description="The body of `POST /v1/batches`, or an uploaded file's"
            f" `{FILE_KEY}` with the job-level fields. Rows and tokens are counted from the"
            " requests; each lane the alias offers is priced at its deployment's price, and"
            " the plan is the one Relay would choose within `completion_window` and"
            " `budget_usd`. Errors name the field (`param`), as a create's do.",
            requestBody={
                "required": True,
                "content": {
                    "application/json": {
                        "schema": {"oneOf": [schema(shapes.CreateBatch), schema(EstimateFromFile)]}
                    }
                },
            },
        )
    }
