"""Unit tests of the settings object: defaults, clamping, clear errors, masked URLs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from relay_batches.services.ingest_api.__main__ import check_ingest_settings
from relay_batches.settings import ConfigError, Settings, check_spool_dir
from tests.helpers.config import config_error


def test_defaults_with_an_empty_environment() -> None:
    settings = Settings.from_env({})
    assert settings == Settings()
    assert settings.database_url == "postgresql://postgres@127.0.0.1:5432/relay"
    assert settings.amqp_url == "amqp://guest:guest@127.0.0.1:5672/"
    assert settings.namespace == "relay"
    assert settings.routes_file == "deploy/routes.local.toml"
    assert settings.api_port == 8080
    assert settings.batch_concurrency == 4
    assert settings.webhook_timeout_s == 10.0
    assert settings.max_rows == 1_000_000
    assert settings.max_body_bytes == 256 * 1024 * 1024
    assert settings.log_level == "INFO"


def test_empty_values_mean_default() -> None:
    env = {"RELAY_API_PORT": "", "RELAY_NAMESPACE": "", "RELAY_LEASE_SECONDS": ""}
    assert Settings.from_env(env) == Settings()


def test_values_are_read() -> None:
    env = {
        "RELAY_DATABASE_URL": "postgresql://relay:pw@db:5432/prod",
        "RELAY_AMQP_URL": "amqps://relay:pw@mq:5671/",
        "RELAY_NAMESPACE": "t_ns-1",
        "RELAY_ROUTES_FILE": "/etc/relay/routes.toml",
        "RELAY_API_PORT": "9000",
        "RELAY_BATCH_CONCURRENCY": "16",
        "RELAY_SLICE_ROWS": "8",
        "RELAY_LEASE_SECONDS": "2.5",
        "RELAY_LOG_LEVEL": "debug",
        "UNRELATED": "ignored",
    }
    settings = Settings.from_env(env)
    assert settings.database_url == "postgresql://relay:pw@db:5432/prod"
    assert settings.amqp_url == "amqps://relay:pw@mq:5671/"
    assert settings.namespace == "t_ns-1"
    assert settings.routes_file == "/etc/relay/routes.toml"
    assert settings.api_port == 9000
    assert settings.batch_concurrency == 16
    assert settings.slice_rows == 8
    assert settings.lease_seconds == 2.5
    assert settings.log_level == "DEBUG"


def test_reads_the_process_environment_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RELAY_API_PORT", "8181")
    assert Settings.from_env().api_port == 8181


@pytest.mark.parametrize(
    ("raw", "expected"), [("0", 1), ("-3", 1), ("1", 1), ("4", 4), ("32", 32), ("99", 32)]
)
def test_batch_concurrency_is_clamped(raw: str, expected: int) -> None:
    assert Settings.from_env({"RELAY_BATCH_CONCURRENCY": raw}).batch_concurrency == expected


@pytest.mark.parametrize(
    ("name", "attr", "raw", "expected"),
    [
        ("RELAY_SLICE_ROWS", "slice_rows", "0", 1),
        ("RELAY_SLICE_ROWS", "slice_rows", "5000", 1000),
        ("RELAY_DISPATCH_WINDOW", "dispatch_window", "0", 1),
        ("RELAY_RESULTS_FLUSH_ROWS", "results_flush_rows", "-1", 1),
        ("RELAY_AGGREGATOR_PREFETCH", "aggregator_prefetch", "0", 1),
        ("RELAY_MAX_RUNNING_JOBS_PER_WORKSPACE", "max_running_jobs_per_workspace", "-3", 0),
        ("RELAY_MAX_RUNNING_JOBS_PER_WORKSPACE", "max_running_jobs_per_workspace", "4", 4),
        ("RELAY_DISPATCH_WINDOW_BYTES", "dispatch_window_bytes", "0", 1),
        ("RELAY_DISPATCH_WINDOW_BYTES", "dispatch_window_bytes", "", 16 * 1024 * 1024),
        ("RELAY_DISPATCH_WINDOW_MAX", "dispatch_window_max", "0", 1),
        ("RELAY_DISPATCH_WINDOW_MAX", "dispatch_window_max", "", 65536),
        ("RELAY_DISPATCH_WINDOW_MAX_BYTES", "dispatch_window_max_bytes", "-1", 1),
        ("RELAY_DISPATCH_WINDOW_MAX_BYTES", "dispatch_window_max_bytes", "", 256 * 1024 * 1024),
        ("RELAY_AGGREGATOR_CHUNK_BYTES", "aggregator_chunk_bytes", "-5", 1),
        ("RELAY_AGGREGATOR_CHUNK_BYTES", "aggregator_chunk_bytes", "", 16 * 1024 * 1024),
        ("RELAY_RESULTS_PAGE_BYTES", "results_page_bytes", "0", 1),
        ("RELAY_RESULTS_PAGE_BYTES", "results_page_bytes", "", 4 * 1024 * 1024),
        ("RELAY_RESULTS_PAGE_BYTES", "results_page_bytes", "65536", 65536),
    ],
)
def test_other_bounded_integers(name: str, attr: str, raw: str, expected: int) -> None:
    assert getattr(Settings.from_env({name: raw}), attr) == expected


@pytest.mark.parametrize("name", ["RELAY_BATCH_CONCURRENCY", "RELAY_MAX_ROWS", "RELAY_SLICE_ROWS"])
@pytest.mark.parametrize("raw", ["four", "1.5", "0x10"])
def test_bad_integer_names_the_variable(name: str, raw: str) -> None:
    assert config_error(Settings.from_env, {name: raw}) == f"{name} must be an integer, got {raw!r}"


@pytest.mark.parametrize("name", ["RELAY_API_PORT", "RELAY_HEALTH_PORT"])
@pytest.mark.parametrize("raw", ["four", "1.5", "0x10", "-1", "65536"])
def test_bad_port_names_the_variable(name: str, raw: str) -> None:
    assert (
        config_error(Settings.from_env, {name: raw})
        == f"{name} must be a port number 0..65535, got {raw!r}"
    )


def test_bad_number_names_the_variable() -> None:
    assert (
        config_error(Settings.from_env, {"RELAY_LEASE_SECONDS": "soon"})
        == "RELAY_LEASE_SECONDS must be a number, got 'soon'"
    )


@pytest.mark.parametrize("raw", ["relay.prod", "a b", "ns/1", "ns*", "-_"])
def test_bad_namespace(raw: str) -> None:
    assert config_error(Settings.from_env, {"RELAY_NAMESPACE": raw}) == (
        f"RELAY_NAMESPACE may hold letters, digits, '-' and '_', got {raw!r}"
    )


@pytest.mark.parametrize("raw", ["relay", "t_abc-123", "X9"])
def test_good_namespace(raw: str) -> None:
    assert Settings.from_env({"RELAY_NAMESPACE": raw}).namespace == raw


def test_describe_masks_passwords_in_urls() -> None:
    settings = Settings.from_env(
        {
            "RELAY_DATABASE_URL": "postgresql://relay:s3cr3t-db@db.internal:5432/relay",
            "RELAY_AMQP_URL": "amqp://relay:hunter2@mq.internal:5672/vhost",
        }
    )
    described = settings.describe()
    assert described["database_url"] == "postgresql://relay:***@db.internal:5432/relay"
    assert described["amqp_url"] == "amqp://relay:***@mq.internal:5672/vhost"
    assert "s3cr3t-db" not in repr(described)
    assert "hunter2" not in repr(described)
    # Everything else is reported as is, one key per setting.
    assert described["namespace"] == "relay"
    assert described["batch_concurrency"] == 4
    assert set(described) == set(Settings.__dataclass_fields__)


def test_describe_masks_a_password_containing_at_signs() -> None:
    settings = Settings(amqp_url="amqp://user:p@ss@w0rd@mq:5672/")
    assert settings.describe()["amqp_url"] == "amqp://user:***@mq:5672/"


def test_describe_leaves_urls_without_credentials_alone() -> None:
    settings = Settings(database_url="postgresql:///relay", amqp_url="amqp://mq:5672/")
    described = settings.describe()
    assert described["database_url"] == "postgresql:///relay"
    assert described["amqp_url"] == "amqp://mq:5672/"


def test_settings_are_frozen() -> None:
    settings = Settings()
    with pytest.raises(AttributeError):
        settings.namespace = "other"  # type: ignore[misc]


POSITIVE_DURATIONS = [
    ("RELAY_LEASE_SECONDS", "lease_seconds"),
    ("RELAY_RECONCILE_SECONDS", "reconcile_seconds"),
    ("RELAY_RESULTS_FLUSH_MS", "results_flush_ms"),
    ("RELAY_WEBHOOK_TIMEOUT_S", "webhook_timeout_s"),
    ("RELAY_RETRY_CAP_S", "retry_cap_s"),
    ("RELAY_COOLDOWN_WINDOW_S", "cooldown_window_s"),
    ("RELAY_COOLDOWN_S", "cooldown_s"),
    # A grace of 0 would hand back every in-flight row at once on SIGTERM: refused too.
    ("RELAY_SHUTDOWN_GRACE_S", "shutdown_grace_s"),
    ("RELAY_EXPIRY_INTERVAL_S", "expiry_interval_s"),
    ("RELAY_WEBHOOK_RETRY_BASE_S", "webhook_retry_base_s"),
]


@pytest.mark.parametrize(("name", "attr"), POSITIVE_DURATIONS)
@pytest.mark.parametrize("raw", ["0", "-1", "-0.5", "nan"])
def test_durations_must_be_above_zero(name: str, attr: str, raw: str) -> None:
    # 0 would disable an aiohttp timeout or spin a loop; a negative one is meaningless.
    assert (
        config_error(Settings.from_env, {name: raw})
        == f"{name} must be a number above 0, got {raw!r}"
    )


@pytest.mark.parametrize(("name", "attr"), POSITIVE_DURATIONS)
def test_positive_durations_are_read(name: str, attr: str) -> None:
    assert getattr(Settings.from_env({name: "0.25"}), attr) == 0.25


@dataclass(frozen=True)
class _OtherDefaults(Settings):
    batch_concurrency: int = 7
    results_flush_rows: int = 9
    aggregator_prefetch: int = 11


def test_integer_defaults_come_from_the_dataclass() -> None:
    # from_env must not repeat the defaults as literals that can drift from the fields.
    settings = _OtherDefaults.from_env({})
    assert settings.batch_concurrency == 7
    assert settings.results_flush_rows == 9
    assert settings.aggregator_prefetch == 11


def test_the_expiry_interval_defaults_to_one_second_and_must_be_finite() -> None:
    assert Settings.from_env({}).expiry_interval_s == 1.0
    for raw in ("inf", "Infinity"):
        assert config_error(Settings.from_env, {"RELAY_EXPIRY_INTERVAL_S": raw}) == (
            f"RELAY_EXPIRY_INTERVAL_S must be a finite number above 0, got {raw!r}"
        )
    assert (
        config_error(Settings.from_env, {"RELAY_EXPIRY_INTERVAL_S": "1s"})
        == "RELAY_EXPIRY_INTERVAL_S must be a number, got '1s'"
    )


@pytest.mark.parametrize(
    ("raw", "kept"),
    [
        ("", ""),
        ("https://relay.example.com", "https://relay.example.com"),
        ("https://relay.example.com/gw/", "https://relay.example.com/gw"),
        ("http://127.0.0.1:8080", "http://127.0.0.1:8080"),
    ],
)
def test_public_base_url(raw: str, kept: str) -> None:
    assert Settings.from_env({"RELAY_PUBLIC_BASE_URL": raw}).public_base_url == kept


@pytest.mark.parametrize(
    "raw",
    ["relay.example.com", "ftp://relay.example.com", "https://", "https://h/?a=1", "https://h#x"],
)
def test_bad_public_base_url(raw: str) -> None:
    assert config_error(Settings.from_env, {"RELAY_PUBLIC_BASE_URL": raw}) == (
        f"RELAY_PUBLIC_BASE_URL must be an http(s) URL like https://relay.example.com, got {raw!r}"
    )


def test_public_base_url_with_a_bad_port() -> None:
    assert (
        config_error(Settings.from_env, {"RELAY_PUBLIC_BASE_URL": "https://h:99999"})
        == "RELAY_PUBLIC_BASE_URL has an invalid port, got 'https://h:99999'"
    )


def test_the_webhook_retry_base_defaults_to_thirty_seconds_and_must_be_finite() -> None:
    assert Settings.from_env({}).webhook_retry_base_s == 30.0
    assert (
        config_error(Settings.from_env, {"RELAY_WEBHOOK_RETRY_BASE_S": "inf"})
        == "RELAY_WEBHOOK_RETRY_BASE_S must be a finite number above 0, got 'inf'"
    )


@pytest.mark.parametrize("raw", ["classic", "quorum"])
def test_the_queue_type_is_read(raw: str) -> None:
    assert Settings().queue_type == "classic"
    assert Settings.from_env({"RELAY_QUEUE_TYPE": raw}).queue_type == raw


@pytest.mark.parametrize("raw", ["Quorum", "stream", "qourum"])
def test_a_bad_queue_type_names_the_variable(raw: str) -> None:
    assert (
        config_error(Settings.from_env, {"RELAY_QUEUE_TYPE": raw})
        == f"RELAY_QUEUE_TYPE must be one of classic, quorum, got {raw!r}"
    )


def test_body_and_row_limits_are_read() -> None:
    env = {
        "RELAY_MAX_BODY_BYTES": "2000",
        "RELAY_MAX_JSON_BODY_BYTES": "2000",
        "RELAY_MAX_ROWS": "1",
        "RELAY_MAX_ROW_BYTES": "300",
    }
    settings = Settings.from_env(env)
    assert (settings.max_body_bytes, settings.max_json_body_bytes) == (2000, 2000)
    assert (settings.max_rows, settings.max_row_bytes) == (1, 300)
    assert Settings().max_row_bytes == 8 * 1024 * 1024


def test_a_json_body_limit_above_the_body_limit_is_refused() -> None:
    env = {"RELAY_MAX_BODY_BYTES": "1000", "RELAY_MAX_JSON_BODY_BYTES": "1001"}
    assert config_error(Settings.from_env, env) == (
        "RELAY_MAX_JSON_BODY_BYTES (1001) exceeds RELAY_MAX_BODY_BYTES (1000)"
    )


@pytest.mark.parametrize(
    "name",
    ["RELAY_MAX_BODY_BYTES", "RELAY_MAX_JSON_BODY_BYTES", "RELAY_MAX_ROWS", "RELAY_MAX_ROW_BYTES"],
)
@pytest.mark.parametrize("raw", ["0", "-5"])
def test_a_body_or_row_limit_below_one_is_refused(name: str, raw: str) -> None:
    assert config_error(Settings.from_env, {name: raw}) == f"{name} must be 1 or more, got {raw!r}"


def test_the_spool_dir_must_be_a_writable_directory(tmp_path: Path) -> None:
    check_spool_dir(None)  # the system temporary directory
    check_spool_dir(str(tmp_path))
    missing = tmp_path / "missing"
    with pytest.raises(ConfigError) as err:
        check_spool_dir(str(missing))
    assert str(err.value) == f"RELAY_UPLOAD_SPOOL_DIR {str(missing)!r} is not an existing directory"
    a_file = tmp_path / "file"
    a_file.write_text("")
    with pytest.raises(ConfigError, match=r"is not an existing directory$"):
        check_spool_dir(str(a_file))


def test_the_ingest_api_refuses_a_pool_long_stores_could_take_whole(tmp_path: Path) -> None:
    check_ingest_settings(Settings.from_env({"RELAY_DB_POOL_MAX_SIZE": "4"}))
    check_ingest_settings(Settings.from_env({}))  # its own 10
    with pytest.raises(ConfigError) as err:
        check_ingest_settings(Settings.from_env({"RELAY_DB_POOL_MAX_SIZE": "3"}))
    assert str(err.value) == (
        "RELAY_DB_POOL_MAX_SIZE (3) is below 4, what the ingest-api needs:"
        " 2 for uploads storing at once + 2 for every other request"
    )
    missing = str(tmp_path / "gone")
    with pytest.raises(ConfigError, match=r"^RELAY_UPLOAD_SPOOL_DIR "):
        check_ingest_settings(Settings.from_env({"RELAY_UPLOAD_SPOOL_DIR": missing}))


def test_lowering_only_the_body_limit_lowers_the_json_limit_with_it() -> None:
    settings = Settings.from_env({"RELAY_MAX_BODY_BYTES": str(64 * 1024 * 1024)})
    assert (settings.max_body_bytes, settings.max_json_body_bytes) == (64 << 20, 64 << 20)


def test_describe_masks_every_password_of_a_cluster_and_a_standby() -> None:
    settings = Settings(
        amqp_url="amqp://relay:one@mq-1:5672/,amqp://relay:two@mq-2:5672/",
        database_url="postgresql://relay:three@db-1:5432,db-2:5432/relay"
        "?target_session_attrs=read-write",
    )
    described = settings.describe()
    assert described["amqp_url"] == "amqp://relay:***@mq-1:5672/,amqp://relay:***@mq-2:5672/"
    assert described["database_url"] == (
        "postgresql://relay:***@db-1:5432,db-2:5432/relay?target_session_attrs=read-write"
    )
