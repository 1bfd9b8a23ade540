"""Unit tests of the ledger pool settings: each service's own maximum unless
``RELAY_DB_POOL_MAX_SIZE`` is set, a minimum within it, and the statement cache."""

from __future__ import annotations

import pytest

from relay_batches.settings import ConfigError, Settings, pool_bounds
from tests.helpers.config import config_error


def test_unset_keeps_each_services_own_maximum() -> None:
    settings = Settings.from_env({})
    assert (settings.db_pool_max_size, settings.db_pool_min_size) == (None, 1)
    assert settings.db_statement_cache_size == 100
    assert pool_bounds(settings, 10) == (1, 10)
    assert pool_bounds(settings, 4) == (1, 4)


def test_the_maximum_overrides_every_services_own() -> None:
    settings = Settings.from_env({"RELAY_DB_POOL_MAX_SIZE": "3", "RELAY_DB_POOL_MIN_SIZE": "2"})
    assert pool_bounds(settings, 10) == (2, 3)
    assert pool_bounds(settings, 2) == (2, 3)


def test_the_statement_cache_can_be_turned_off_for_pgbouncer() -> None:
    assert Settings.from_env({"RELAY_DB_STATEMENT_CACHE_SIZE": "0"}).db_statement_cache_size == 0


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"RELAY_DB_POOL_MAX_SIZE": "0"}, "RELAY_DB_POOL_MAX_SIZE must be 1 or more, got '0'"),
        ({"RELAY_DB_POOL_MAX_SIZE": "ten"}, "RELAY_DB_POOL_MAX_SIZE must be an integer, got 'ten'"),
        ({"RELAY_DB_POOL_MIN_SIZE": "-1"}, "RELAY_DB_POOL_MIN_SIZE must be 0 or more, got -1"),
        (
            {"RELAY_DB_POOL_MAX_SIZE": "2", "RELAY_DB_POOL_MIN_SIZE": "3"},
            "RELAY_DB_POOL_MIN_SIZE (3) exceeds RELAY_DB_POOL_MAX_SIZE (2)",
        ),
        (
            {"RELAY_DB_STATEMENT_CACHE_SIZE": "-5"},
            "RELAY_DB_STATEMENT_CACHE_SIZE must be 0 or more, got -5",
        ),
    ],
)
def test_bad_values_stop_the_start_with_one_line(env: dict[str, str], message: str) -> None:
    assert config_error(Settings.from_env, env) == message


def test_a_minimum_above_a_services_own_maximum_is_an_error() -> None:
    settings = Settings.from_env({"RELAY_DB_POOL_MIN_SIZE": "5"})
    assert pool_bounds(settings, 10) == (5, 10)
    with pytest.raises(ConfigError) as err:
        pool_bounds(settings, 4)
    assert str(err.value) == (
        "RELAY_DB_POOL_MIN_SIZE (5) exceeds this service's pool maximum (4);"
        " set RELAY_DB_POOL_MAX_SIZE too"
    )
