"""The job-level ``completion_window`` and ``metadata`` rules (docs/api/native.md),
on the pure validation functions, and what they become: a job's ``expires_at`` (a cron
template's window per run) and ``metadata``, shown on the batch object."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import orjson
import pytest

from relay_batches.errors import ApiError
from relay_batches.model import Job, JobStatus
from relay_batches.services.ingest_api.rows.job_fields import (
    BatchOptions,
    completion_window,
    validate_batch_options,
    validate_metadata,
)
from relay_batches.services.ingest_api.rows.validation import (
    SubmitLimits,
    scan_submit,
    validate_submit,
)
from relay_batches.services.ingest_api.submit import plan_job
from relay_batches.services.ingest_api.surfaces.native.upload import form_payload


@pytest.mark.parametrize(
    ("text", "window"),
    [
        ("24h", timedelta(hours=24)),
        ("1s", timedelta(seconds=1)),
        ("90s", timedelta(seconds=90)),
        ("15m", timedelta(minutes=15)),
        ("7d", timedelta(days=7)),
        ("168h", timedelta(days=7)),
        ("604800s", timedelta(days=7)),
        ("007s", timedelta(seconds=7)),
    ],
)
def test_completion_window_accepts_durations_from_1s_to_7d(text: str, window: timedelta) -> None:
    assert completion_window(text, "completion_window") == window


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (24, 'completion_window must be a string such as "24h"'),
        (None, 'completion_window must be a string such as "24h"'),
        ("24", "completion_window '24' is not a duration"),
        ("h", "completion_window 'h' is not a duration"),
        ("", "completion_window '' is not a duration"),
        ("24H", "completion_window '24H' is not a duration"),
        ("-5s", "completion_window '-5s' is not a duration"),
        ("+5s", "completion_window '+5s' is not a duration"),
        (" 24h", "completion_window ' 24h' is not a duration"),
        ("1.5h", "completion_window '1.5h' is not a duration"),
        ("２４h", "completion_window '２４h' is not a duration"),
        ("24hours", "completion_window '24hours' is not a duration"),
        ("9999999s", "completion_window '9999999s' is not a duration"),
        ("0s", "completion_window must be from 1s to 7d, got '0s'"),
        ("8d", "completion_window must be from 1s to 7d, got '8d'"),
        ("169h", "completion_window must be from 1s to 7d, got '169h'"),
        ("604801s", "completion_window must be from 1s to 7d, got '604801s'"),
    ],
)
def test_completion_window_refuses_anything_else_naming_the_param(
    value: object, message: str
) -> None:
    with pytest.raises(ApiError) as caught:
        completion_window(value, "completion_window")
    assert caught.value.status == 400
    assert caught.value.param == "completion_window"
    assert caught.value.message.startswith(message)


def test_completion_window_names_the_param_it_is_given() -> None:
    with pytest.raises(ApiError) as caught:
        completion_window("1w", "body.completion_window")
    assert caught.value.param == "body.completion_window"
    assert caught.value.message.startswith("body.completion_window '1w' is not a duration")


def test_metadata_is_stored_as_compact_json_in_the_order_given() -> None:
    assert validate_metadata({"team": "search", "run": "7"}) == '{"team":"search","run":"7"}'


def test_metadata_absent_or_empty_is_none() -> None:
    assert validate_metadata(None) is None
    assert validate_metadata({}) is None


def test_metadata_at_the_limits_is_accepted() -> None:
    pairs = {f"{i:02d}" + "k" * 62: "v" * 512 for i in range(16)}
    assert validate_metadata(pairs) is not None


@pytest.mark.parametrize(
    ("value", "param", "message"),
    [
        (["a"], "metadata", "metadata must be an object of string keys and string values"),
        ("a=b", "metadata", "metadata must be an object of string keys and string values"),
        ({f"k{i}": "v" for i in range(17)}, "metadata", "metadata must have at most 16 pairs"),
        ({"k" * 65: "v"}, "metadata", "metadata keys must be 1 to 64 characters"),
        ({"": "v"}, "metadata", "metadata keys must be 1 to 64 characters"),
        ({"a\x00": "v"}, "metadata", "metadata keys must be 1 to 64 characters"),
        ({"team": 7}, "metadata.team", "metadata.team must be a string"),
        ({"team": None}, "metadata.team", "metadata.team must be a string"),
        ({"team": {"a": "b"}}, "metadata.team", "metadata.team must be a string"),
        ({"team": "v" * 513}, "metadata.team", "metadata.team must be at most 512 characters"),
        ({"team": "a\x00"}, "metadata.team", "metadata.team must be at most 512 characters"),
    ],
)
def test_metadata_refuses_what_openai_refuses(value: object, param: str, message: str) -> None:
    with pytest.raises(ApiError) as caught:
        validate_metadata(value)
    assert caught.value.status == 400
    assert caught.value.param == param
    assert caught.value.message.startswith(message)


# --- as job-level fields of a submission ---------------------------------------------

MODELS = frozenset({"gpt-4o-mini"})
HI = [{"role": "user", "content": "hi"}]
T0 = datetime(2030, 1, 1, 12, 0, 0, tzinfo=UTC)


def submission(**fields: object) -> dict[str, object]:
    """A valid one-row submission with ``fields`` added."""
    return {"model": "gpt-4o-mini", "requests": [{"messages": HI}], **fields}


def test_a_submission_carries_its_window_and_metadata() -> None:
    spec = validate_submit(
        submission(completion_window="90s", metadata={"team": "search"}), SubmitLimits(), MODELS
    )
    assert spec.options.completion_window == timedelta(seconds=90)
    assert spec.options.metadata_json == '{"team":"search"}'


def test_the_streamed_body_gives_the_same_options_and_errors() -> None:
    raw = orjson.dumps(submission(completion_window="2h", metadata={"a": "b"}))
    options = scan_submit(raw, SubmitLimits(), MODELS).options
    assert (options.completion_window, options.metadata_json) == (timedelta(hours=2), '{"a":"b"}')
    with pytest.raises(ApiError) as caught:
        scan_submit(orjson.dumps(submission(completion_window="8d")), SubmitLimits(), MODELS)
    assert caught.value.param == "completion_window"


def test_absent_or_null_window_and_metadata_are_none() -> None:
    for payload in (submission(), submission(completion_window=None, metadata=None)):
        options = validate_batch_options(payload, MODELS)
        assert (options.completion_window, options.metadata_json) == (None, None)


def test_a_bad_window_or_metadata_in_a_submission_is_a_400_naming_it() -> None:
    with pytest.raises(ApiError) as caught:
        validate_submit(submission(completion_window="1w"), SubmitLimits(), MODELS)
    assert caught.value.param == "completion_window"
    with pytest.raises(ApiError) as caught:
        validate_submit(submission(metadata={"k": 1}), SubmitLimits(), MODELS)
    assert caught.value.param == "metadata.k"


def test_the_upload_form_decodes_metadata_as_json_and_keeps_the_window_as_text() -> None:
    payload = form_payload({"completion_window": "10m", "metadata": '{"run": "7"}'})
    assert payload == {"completion_window": "10m", "metadata": {"run": "7"}}
    with pytest.raises(ApiError) as caught:
        form_payload({"metadata": "run=7"})
    assert (caught.value.param, caught.value.message) == ("metadata", "metadata must be JSON text")


def options(**fields: object) -> BatchOptions:
    return validate_batch_options(submission(**fields), MODELS)


def test_a_job_carries_its_window_for_the_ledger_to_set_the_deadline() -> None:
    """The deadline is set on the database's clock at insert, not from this process's."""
    planned = plan_job(options(completion_window="90s", metadata={"a": "b"}), [], "ws", T0)
    assert planned.new.expires_at is None
    assert planned.new.completion_window == timedelta(seconds=90)
    assert planned.new.metadata == '{"a":"b"}'


def test_a_job_without_a_window_never_expires() -> None:
    planned = plan_job(options(), [], "ws", T0)
    assert (planned.new.expires_at, planned.new.completion_window, planned.new.metadata) == (
        None,
        None,
        None,
    )


def test_a_cron_template_keeps_the_window_for_its_runs_and_never_expires_itself() -> None:
    planned = plan_job(options(cron="0 3 * * *", completion_window="1h"), [], "ws", T0)
    assert planned.new.expires_at is None
    assert planned.new.completion_window == timedelta(hours=1)


def job(**fields: object) -> Job:
    base: dict[str, object] = {
        "id": "a" * 32,
        "workspace_id": "ws",
        "name": "n",
        "model": "gpt-4o-mini",
        "priority": 0,
        "status": JobStatus.EXPIRED,
        "total": 3,
        "completed": 1,
        "failed": 0,
        "dead_letter": 0,
        "webhook_url": None,
        "cron": None,
        "next_run_at": None,
        "template_id": None,
        "rows_batch_id": "a" * 32,
        "params": "{}",
        "error": None,
        "created_at": T0,
        "started_at": T0,
        "completed_at": T0 + timedelta(seconds=90),
    }
    base.update(fields)
    return Job(**base)  # type: ignore[arg-type]


def test_the_batch_object_shows_expires_at_and_metadata() -> None:
    shown = job(expires_at=T0 + timedelta(seconds=90), metadata='{"team":"search"}').to_api()
    assert shown["status"] == "expired"
    assert shown["expires_at"] == "2030-01-01T12:01:30Z"
    assert shown["metadata"] == {"team": "search"}
    assert job().to_api()["expires_at"] is None
    assert job().to_api()["metadata"] is None
