"""The native surface's shapes as pydantic models, from which its OpenAPI schemas are
generated (:mod:`.openapi`): the job-level fields of a submission (its rows are
:class:`~relay_batches.dialects.chat.RequestRow`, the model that validates them), the
batch objects it answers and its error object (the rows' outcomes, the stats and the
webhook log are :mod:`.outcomes`). Limits are the constants the code checks.

A model whose name starts with ``_`` is a part of another and is inlined where it is used
(see :func:`relay_batches.services.ingest_api.openapi.model_schemas`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    RootModel,
    WithJsonSchema,
    create_model,
)

from relay_batches.dialects.chat import Params, RequestRow
from relay_batches.dialects.endpoints import (
    CompletionsRow,
    EmbeddingsRow,
    ModerationsRow,
    ResponsesRow,
)
from relay_batches.errors import ERROR_TYPES
from relay_batches.model import JobStatus
from relay_batches.services.ingest_api.rows import job_fields as jf

NO_NUL = r"^[^\u0000]*$"
# The default of a field that may be absent but is never null (no ``default`` in its
# schema: see FlatNullable); typed Any so that a field of any type may take it.
ABSENT: Any = None


class Closed(BaseModel):
    """A JSON object with no keys but its fields (a schema's ``additionalProperties: false``)."""

    model_config = ConfigDict(extra="forbid")


def enum(*values: str | None) -> Any:
    """A string that is one of ``values`` (``None``: or null)."""
    return WithJsonSchema({"enum": list(values)})


class Id(RootModel[str]):
    """A 32-character lowercase hex id."""

    root: str = Field(pattern=r"^[0-9a-f]{32}$")


class Timestamp(RootModel[str]):
    """ISO 8601 UTC, to the second, with a Z."""

    root: str = Field(
        pattern=r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z$",
        json_schema_extra={"format": "date-time"},
    )


class Status(RootModel[str]):
    """`scheduled` is a cron template; `paused` starts no rows until resumed (the rows
    already started still finish); `completed`, `failed`, `canceled` and `expired` (past
    its completion window) are terminal."""

    root: Annotated[str, enum(*JobStatus)]


class CompletionWindow(RootModel[str]):
    """How long the job has to finish: `<n>s`, `<n>m`, `<n>h` or `<n>d`, from `1s` to `7d`
    (`24h` is OpenAI's value). Anything else is 400 (`param: completion_window`). When it
    has passed, the job ends `expired`: rows finished by then keep their results, the
    others never run."""

    root: str = Field(pattern=r"^[0-9]{1,6}[smhd]$", examples=["24h", "90s"])


class Metadata(RootModel[dict[str, str]]):
    """Up to 16 string pairs kept with the job (keys up to 64 characters, values up to 512,
    no NUL): OpenAI's limits. A bad key is 400 (`param: metadata`), a bad value 400
    (`param: metadata.<key>`); `{}` means none."""

    root: dict[
        str, Annotated[str, Field(max_length=jf.MAX_METADATA_VALUE_CHARS, pattern=NO_NUL)]
    ] = Field(
        max_length=jf.MAX_METADATA_PAIRS,
        # A key's bounds as propertyNames (pydantic would make a pattern on the key
        # a patternProperties, which leaves other keys unchecked).
        json_schema_extra={
            "propertyNames": {
                "minLength": 1,
                "maxLength": jf.MAX_METADATA_KEY_CHARS,
                "pattern": NO_NUL,
            }
        },
    )


_AS_CREATE = "As in `POST /v1/batches`."
_WEBHOOK_URL = r"^[Hh][Tt][Tt][Pp][Ss]?://"
_PRIORITY_DOC = (
    "Default 0, from -1000 to 1000 (outside: 400). Orders jobs within the workspace: a"
    " higher job is claimed and releases its rows ahead of the workspace's lower ones, even"
    " those already running; running capacity is shared fairly across workspaces whatever"
    ' their priorities. Must be a JSON integer: `"5"`, `5.5`, `5.0` and `true` are 400.'
)
_CRON_DOC = (
    "A 5-field cron expression (minute hour day month weekday, UTC) that fires at some"
    " future time; the batch becomes a recurring template with status `scheduled`."
    " Six-field expressions, `@daily`-style nicknames and the `R`/`H` extensions are 400"
    " (`param: cron`)."
)
_BUDGET_DOC = (
    "Default none. What the batch's rows may cost, in USD, by the `price` of the deployment"
    " that answers each: once the recorded cost reaches it no new rows are released, the"
    " rows already released (at most the dispatch window) still run and count, and if any"
    " row was held back the batch ends `failed` with `error` beginning `budget_exceeded` and"
    " those rows get the error `budget_exceeded`. A number greater than 0 and at most"
    " 1,000,000; a string, a boolean, 0 or less, or more is 400 (`param: budget_usd`). Each"
    " run of a cron template gets the template's budget."
)


class CreateBatch(Closed):
    """Any other top-level key is 400 (`param: <key>`)."""

    model: str = Field(
        description="A public alias known to the model router (see `GET /v1/models`); an"
        " unknown alias is 400 (`param: model`).",
        examples=["gpt-4o-mini"],
    )
    requests: list[RequestRow | EmbeddingsRow | CompletionsRow | ModerationsRow | ResponsesRow] = (
        Field(
            min_length=1,
            description="At most `RELAY_MAX_ROWS` (default 1,000,000) requests, else 400. Each is"
            " a body of the batch's `endpoint` (chat: `RequestRow`), with an optional"
            " `custom_id`; its `model` defaults to the batch's.",
        )
    )
    endpoint: Literal[
        "/v1/chat/completions",
        "/v1/embeddings",
        "/v1/completions",
        "/v1/moderations",
        "/v1/responses",
    ] = Field(
        "/v1/chat/completions",
        description="The OpenAI endpoint the rows are bodies of (default chat completions);"
        " another value is 400 (`param: endpoint`). It must come before `requests` in the"
        " body (rows are checked as they stream in). `params` is only for chat batches.",
    )
    name: str | None = Field(
        None,
        max_length=jf.MAX_NAME_CHARS,
        pattern=NO_NUL,
        description="No NUL characters. Defaults to `batch <timestamp>`.",
    )
    priority: int | None = Field(
        None, ge=jf.PRIORITY_MIN, le=jf.PRIORITY_MAX, description=_PRIORITY_DOC
    )
    cron: str | None = Field(None, max_length=jf.MAX_CRON_CHARS, description=_CRON_DOC)
    webhookUrl: str | None = Field(
        None,
        max_length=jf.MAX_WEBHOOK_URL_CHARS,
        pattern=_WEBHOOK_URL,
        json_schema_extra={"format": "uri"},
        description="An absolute http or https URL with a host, no spaces or control"
        " characters; the completion webhook is POSTed there.",
    )
    params: Params | None = None
    completion_window: CompletionWindow | None = Field(
        None,
        description="Default none (the job never expires). For a cron template, each run"
        " has this long from when it is spawned.",
    )
    metadata: Metadata | None = None
    budget_usd: float | None = Field(None, gt=0, le=jf.MAX_BUDGET_USD, description=_BUDGET_DOC)


class UploadForm(BaseModel):
    """Every job-level field of `POST /v1/batches` as a form field, plus the files (which
    take the place of `requests`)."""

    file: list[
        Annotated[
            str, WithJsonSchema({"type": "string", "contentMediaType": "application/octet-stream"})
        ]
    ] = Field(
        min_length=1,
        description="One or more files, one job per file, chosen by extension: `.csv` is one"
        " prompt per record (each a `user` message; quoted fields may hold commas and"
        " newlines; with a header row, see `prompt_column`), `.jsonl` is one request per"
        " line, every line in the format of the first: a request row"
        " `{custom_id?, messages, ...}` as in `POST /v1/batches`, an"
        ' OpenAI batch line `{custom_id, method: "POST", url: "/v1/chat/completions",'
        " body}`, or an Anthropic batch request `{custom_id, params}` (Messages parameters,"
        " translated). A line in another format than the first, or an unparsable line is"
        " 400 naming the file and line, and no job is created for any file.",
    )
    model: str = Field(
        ABSENT,
        description="As in `POST /v1/batches`. Optional when the file's rows name their model"
        " (OpenAI and Anthropic lines always do): each job's model is then its file's first"
        " row's.",
    )
    priority: int = Field(
        ABSENT,
        ge=jf.PRIORITY_MIN,
        le=jf.PRIORITY_MAX,
        description="Decimal digits with an optional sign, -1000 to 1000; blank means absent (0).",
    )
    name: str = Field(
        ABSENT,
        max_length=jf.MAX_NAME_CHARS,
        pattern=NO_NUL,
        description="The job name (followed by the file name when there are several files);"
        " defaults to the file name.",
    )
    webhookUrl: str = Field(
        ABSENT,
        max_length=jf.MAX_WEBHOOK_URL_CHARS,
        json_schema_extra={"format": "uri"},
        description=_AS_CREATE,
    )
    cron: str = Field(ABSENT, max_length=jf.MAX_CRON_CHARS, description=_AS_CREATE)
    params: Params = Field(
        ABSENT,
        description="As in `POST /v1/batches`, JSON-encoded in the field (for example"
        ' `{"temperature":0.2,"max_tokens":50}`); a bad value is the same 400 (`param:'
        " params.<key>`), text that is not JSON is 400 (`param: params`); blank means"
        " absent.",
    )
    completion_window: CompletionWindow = Field(
        ABSENT,
        description="As in `POST /v1/batches`; blank means absent. Each file's job has this"
        " long from the upload.",
    )
    metadata: Metadata = Field(
        ABSENT,
        description="As in `POST /v1/batches`, JSON-encoded in the field (for example"
        ' `{"team":"search"}`); text that is not JSON is 400 (`param: metadata`); blank'
        " means absent.",
    )
    budget_usd: float = Field(
        ABSENT,
        gt=0,
        le=jf.MAX_BUDGET_USD,
        description="As in `POST /v1/batches`, as a decimal number (for example `2.5`); blank"
        " means absent. Each file's job has this budget of its own.",
    )
    endpoint: str = Field(
        ABSENT,
        description="As in `POST /v1/batches`. Absent: the url of a file's OpenAI lines (every"
        " line must name the same), else chat completions; a row of another endpoint is 400"
        " naming its file and line.",
    )
    prompt_column: str = Field(
        ABSENT,
        description="A `.csv` file's prompt column, by its header row's name (any case);"
        " default `prompt`. A file whose first record names the prompt column has a header"
        " row: every record then has its number of fields and other columns are ignored; a"
        " file without one holds one prompt per record. A chosen column the header does not"
        " name is 400 naming the file and line 1. Ignored for `.jsonl` files.",
    )
    id_column: str = Field(
        ABSENT,
        description="A `.csv` file's custom id column, by its header row's name (any case);"
        " default `custom_id` when the header has one, else the ids are `row-1`, `row-2`, …"
        " Needs a header row. Ignored for `.jsonl` files.",
    )


class RetryBatch(Closed):
    """`POST /v1/batches/{id}/retry`'s optional body."""

    rows: Literal["failed", "dead_letter"] = Field(
        "failed",
        description="`failed`: every row with an error outcome (dead letters included);"
        " `dead_letter`: only the rows on the dead-letter list.",
    )


Count = Annotated[int, Field(ge=0)]


class _Usage(Closed):
    prompt_tokens: Annotated[int, Field(ge=0, json_schema_extra={"format": "int64"})]
    completion_tokens: Annotated[int, Field(ge=0, json_schema_extra={"format": "int64"})]
    cached_tokens: Annotated[
        int,
        Field(
            ge=0,
            json_schema_extra={"format": "int64"},
            description="Of the prompt tokens, those the providers read from their prompt"
            " caches (priced at the deployment's cached rate).",
        ),
    ]


class Saving(Closed):
    """What the job saved against running every answered row realtime."""

    all_realtime_usd: float = Field(
        ge=0,
        description="The answered rows' tokens priced at their alias's first priced realtime"
        " deployment (0 when none is priced).",
    )
    saved_usd: float = Field(description="`all_realtime_usd` less `cost_usd`.")
    saved_fraction: float | None = Field(
        description="`saved_usd` over `all_realtime_usd` (null while that is 0)."
    )


class LaneSpent(Closed):
    """What one lane answered of the job, and what that cost."""

    rows: Count
    cost_usd: float = Field(ge=0)


class LanesSpent(Closed):
    """The job's answered rows and cost per lane (their costs add up to `cost_usd`)."""

    batch: LaneSpent = Field(description="A provider's batch API.")
    flex: LaneSpent = Field(description="Flex deployments (`service_tier: flex`).")
    realtime: LaneSpent


Lane = Literal["batch", "flex", "realtime"]


class PlanStep(Closed):
    """Rows of a plan in one lane, and when they are expected done (seconds from start)."""

    lane: Lane
    deployment: str
    rows: Count
    cost_usd: float = Field(ge=0)
    finish_s: float = Field(ge=0)


class JobPlan(Closed):
    """The plan the job's dispatcher chose when it claimed it."""

    steps: list[PlanStep]
    expected_finish_s: float = Field(ge=0)
    cost_usd: float = Field(ge=0)
    fits: bool = Field(description="Whether it met the completion window and the budget.")
    reason: str


class Batch(Closed):
    """A batch, as every endpoint answers it."""

    id: Id
    object: Literal["batch"]
    status: Status
    name: str
    model: str
    priority: Annotated[int, Field(json_schema_extra={"format": "int32"})]
    total: Annotated[int, Field(ge=1)]
    completed: Count = Field(description="Rows with content.")
    failed: Count = Field(description="Rows with an error.")
    dead_letter: Count = Field(description="Failed rows on the dead-letter list.")
    created_at: Timestamp
    started_at: Timestamp | None
    completed_at: Timestamp | None = Field(description="When the job reached any terminal state.")
    error: str | None = Field(
        description="Why a `failed` job could not run, or stopped (`budget_exceeded: …`)."
    )
    cron: str | None
    next_run_at: Timestamp | None
    template_id: Id | None = Field(description="The cron template that spawned this run.")
    endpoint: str = Field(description="The OpenAI endpoint its rows are bodies of.")
    params: Params
    expires_at: Timestamp | None = Field(
        description="When the job's completion window ends (null: none). A job still queued"
        " or running then ends `expired`."
    )
    metadata: Metadata | None = Field(description="The pairs given at creation (null: none).")
    usage: _Usage
    cost_usd: float = Field(
        ge=0,
        description="What the rows answered so far cost in USD, by the `price` of the"
        " deployment that answered each (0 when no deployment is priced).",
    )
    saving: Saving
    lanes: LanesSpent
    late_answers: Count = Field(
        description="Answers a provider batch gave for rows already moved to another lane:"
        " discarded, neither recorded nor charged."
    )
    plan: JobPlan | None = Field(
        description="The plan chosen when the job was claimed (null: none was made, e.g."
        " an alias without a batch lane)."
    )
    budget_usd: float | None = Field(
        gt=0,
        description="The budget given at creation (null: none); a retry carries its"
        " original's. Once the recorded cost reaches it no new rows are released; rows in"
        " flight finish, the job ends `failed` with `error` beginning `budget_exceeded`, and"
        " the rows not run get the error `budget_exceeded`.",
    )
    retry_of: Id | None = Field(
        description="The batch whose failed rows this batch retries"
        " (`POST /v1/batches/{id}/retry`)."
    )
    retries: list[Id] = Field(
        description="The batches made by retrying this one's rows, oldest first."
    )
    rows_per_s: float | None = Field(
        ge=0,
        description="Rows finished per second lately, while the job runs (null otherwise, or"
        " before a second of measuring).",
    )
    eta_s: int | None = Field(
        ge=0,
        description="Seconds until every row has an outcome at `rows_per_s`, while the job"
        " runs (null otherwise).",
    )


class BatchList(Closed):
    """`GET /v1/batches`: a page of batches, newest first."""

    object: Literal["list"]
    data: list[Batch]
    has_more: bool


class BatchCreatedList(Closed):
    """`POST /v1/batches/upload`: the batches created, one per file."""

    object: Literal["list"]
    data: list[Batch] = Field(min_length=1)


class BatchDeleted(Closed):
    """`DELETE /v1/batches/{id}`."""

    id: Id
    object: Literal["batch.deleted"]
    deleted: Literal[True]


def _error_model(name: str, kind: str) -> type[BaseModel]:
    """The error object of ``kind`` (``{"error": {"type", "message", "param"}}``)."""
    kind_type: Any = Annotated[str, WithJsonSchema({"const": kind})]
    body = create_model(
        f"_{name}Body",
        __base__=Closed,
        type=(kind_type, ...),
        message=(str, ...),
        param=(str | None, ...),
    )
    return create_model(
        name, __base__=Closed, __doc__=f"An error of type `{kind}`.", error=(body, ...)
    )


# The error object of each status the native surface answers, by schema name.
ERRORS: dict[int, type[BaseModel]] = {
    status: _error_model(name, ERROR_TYPES.get(status, ERROR_TYPES[500]))
    for status, name in (
        (400, "BadRequestError"),
        (401, "UnauthorizedError"),
        (404, "NotFoundError"),
        (408, "RequestTimeoutError"),
        (409, "ConflictError"),
        (413, "TooLargeError"),
        (415, "UnsupportedMediaTypeError"),
        (503, "UnavailableError"),
    )
}
