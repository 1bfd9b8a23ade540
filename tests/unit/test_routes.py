"""Unit tests of the routes file: aliases → deployments, and one clear line per mistake."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from relay_batches.dialects.endpoints import ALL_ENDPOINTS, CHAT, RESPONSES
from relay_batches.router.aliases import (
    BatchOptions,
    Deployment,
    Price,
    load_aliases,
    parse_aliases,
)
from relay_batches.settings import ConfigError

REPO = Path(__file__).resolve().parents[2]

VALID = """
[aliases."gpt-4o-mini"]
deployments = ["primary", "backup"]

[aliases.claude]
deployments = ["backup"]

[deployments.primary]
provider = "openai"
base_url = "https://api.example.com/v1/"
model = "gpt-4o-mini-2024"
api_key_env = "PRIMARY_KEY"
timeout_s = 12.5
max_retries = 2
headers = { "X-Team" = "relay" }
params = { temperature = 0.2 }

[deployments.backup]
provider = "anthropic"
base_url = "http://127.0.0.1:9000"
model = "claude-x"
"""


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "routes.toml"
    path.write_text(text, encoding="utf-8")
    return str(path)


def deployment(**overrides: object) -> dict[str, object]:
    spec: dict[str, object] = {
        "provider": "openai",
        "base_url": "http://127.0.0.1:8090/v1",
        "model": "sim-echo",
    }
    spec.update(overrides)
    return spec


def routes_data(spec: object, names: list[str] | None = None) -> dict[str, object]:
    return {
        "deployments": {"d1": spec},
        "aliases": {"a": {"deployments": names if names is not None else ["d1"]}},
    }


def test_valid_file_loads_aliases_in_order(tmp_path: Path) -> None:
    routes = load_aliases(write(tmp_path, VALID), {"PRIMARY_KEY": "sk-123"})
    assert list(routes.aliases) == ["gpt-4o-mini", "claude"]
    assert routes.names() == ["claude", "gpt-4o-mini"]
    primary, backup = routes.resolve("gpt-4o-mini") or ()
    assert primary == Deployment(
        name="primary",
        provider="openai",
        base_url="https://api.example.com/v1",
        model="gpt-4o-mini-2024",
        api_key="sk-123",
        timeout_s=12.5,
        max_retries=2,
        headers={"X-Team": "relay"},
        params={"temperature": 0.2},
    )
    assert backup == Deployment(
        name="backup", provider="anthropic", base_url="http://127.0.0.1:9000", model="claude-x"
    )
    assert routes.resolve("claude") == (backup,)
    assert routes.resolve("nope") is None


def test_local_routes_file_loads() -> None:
    routes = load_aliases(str(REPO / "deploy" / "routes.local.toml"), {})
    assert routes.names() == ["gpt-4o-mini", "sim-claude", "text-embedding-3-small"]
    assert routes.resolve("text-embedding-3-small") == routes.resolve("gpt-4o-mini")
    (sim,) = routes.resolve("gpt-4o-mini") or ()
    assert sim == Deployment(
        name="local-sim",
        provider="openai",
        base_url="http://127.0.0.1:8090/v1",
        model="sim-echo",
        api_key=None,
        timeout_s=30.0,
        max_retries=3,
        endpoints=frozenset(ALL_ENDPOINTS),
    )
    (claude,) = routes.resolve("sim-claude") or ()
    assert claude == Deployment(
        name="local-sim-claude",
        provider="anthropic",
        base_url="http://127.0.0.1:8090/v1",
        model="sim-claude",
        api_key=None,
        timeout_s=30.0,
        max_retries=3,
        headers={"x-api-key": "sim"},
        endpoints=frozenset({CHAT, RESPONSES}),
    )


def test_endpoints_default_to_chat_and_are_checked() -> None:
    routes = parse_aliases(routes_data(deployment()), {})
    (only,) = routes.resolve("a") or ()
    assert only.endpoints == {CHAT}
    with pytest.raises(ConfigError, match=r"endpoints must be a non-empty list of"):
        parse_aliases(routes_data(deployment(endpoints=["/v1/audio/speech"])), {})
    claude = deployment(provider="anthropic", endpoints=[CHAT, "/v1/embeddings"])
    with pytest.raises(ConfigError, match=r"cannot serve /v1/embeddings"):
        parse_aliases(routes_data(claude), {})


def test_unknown_provider() -> None:
    with pytest.raises(ConfigError) as err:
        parse_aliases(routes_data(deployment(provider="cohere")), {})
    assert str(err.value) == (
        "routes: deployment 'd1' has unknown provider 'cohere' (expected one of anthropic,"
        " anthropic-batch, openai, openai-batch)"
    )


def test_missing_provider() -> None:
    spec = deployment()
    del spec["provider"]
    with pytest.raises(ConfigError, match=r"deployment 'd1' has unknown provider None"):
        parse_aliases(routes_data(spec), {})


def test_alias_naming_a_missing_deployment() -> None:
    with pytest.raises(ConfigError) as err:
        parse_aliases(routes_data(deployment(), ["d1", "ghost"]), {})
    assert str(err.value) == "routes: alias 'a' names missing deployment 'ghost'"


def test_alias_with_empty_deployments_list() -> None:
    with pytest.raises(ConfigError) as err:
        parse_aliases(routes_data(deployment(), []), {})
    assert str(err.value) == "routes: alias 'a' needs a non-empty deployments list"


def test_missing_api_key_variable() -> None:
    data = routes_data(deployment(api_key_env="RELAY_TEST_KEY"))
    with pytest.raises(ConfigError) as err:
        parse_aliases(data, {"OTHER": "x"})
    assert str(err.value) == "routes: deployment 'd1' needs environment variable RELAY_TEST_KEY"


def test_empty_api_key_variable_counts_as_missing() -> None:
    data = routes_data(deployment(api_key_env="RELAY_TEST_KEY"))
    with pytest.raises(ConfigError, match="needs environment variable RELAY_TEST_KEY"):
        parse_aliases(data, {"RELAY_TEST_KEY": ""})


def test_api_key_read_from_env() -> None:
    data = routes_data(deployment(api_key_env="RELAY_TEST_KEY"))
    routes = parse_aliases(data, {"RELAY_TEST_KEY": "sk-live"})
    assert (routes.resolve("a") or ())[0].api_key == "sk-live"


@pytest.mark.parametrize("base_url", ["ftp://example.com", "example.com/v1", "", 42, None])
def test_bad_base_url(base_url: object) -> None:
    with pytest.raises(ConfigError) as err:
        parse_aliases(routes_data(deployment(base_url=base_url)), {})
    assert str(err.value) == "routes: deployment 'd1' needs an http(s) base_url"


def test_missing_model() -> None:
    with pytest.raises(ConfigError) as err:
        parse_aliases(routes_data(deployment(model="")), {})
    assert str(err.value) == "routes: deployment 'd1' needs a model"


@pytest.mark.parametrize("value", [-1, "30", True])
def test_bad_timeout(value: object) -> None:
    with pytest.raises(ConfigError) as err:
        parse_aliases(routes_data(deployment(timeout_s=value)), {})
    assert str(err.value) == "routes: deployment 'd1': timeout_s must be a non-negative number"


def test_bad_headers() -> None:
    with pytest.raises(ConfigError) as err:
        parse_aliases(routes_data(deployment(headers={"X-N": 1})), {})
    assert str(err.value) == "routes: deployment 'd1': headers must be a table of strings"


def test_deployment_not_a_table() -> None:
    with pytest.raises(ConfigError) as err:
        parse_aliases(routes_data("openai"), {})
    assert str(err.value) == "routes: deployment 'd1' must be a table"


def test_sections_not_tables() -> None:
    with pytest.raises(ConfigError) as err:
        parse_aliases({"deployments": [], "aliases": {}}, {})
    assert str(err.value) == "routes: [deployments] and [aliases] must be tables"


def test_no_aliases(tmp_path: Path) -> None:
    path = write(
        tmp_path, '[deployments.d1]\nprovider = "openai"\nbase_url = "http://x"\nmodel = "m"\n'
    )
    with pytest.raises(ConfigError) as err:
        load_aliases(path, {})
    assert str(err.value) == f"routes file {path!r}: no [aliases.*] defined"


def test_missing_file(tmp_path: Path) -> None:
    path = str(tmp_path / "absent.toml")
    with pytest.raises(ConfigError) as err:
        load_aliases(path, {})
    assert str(err.value) == f"routes file {path!r} does not exist (RELAY_ROUTES_FILE)"


def test_invalid_toml(tmp_path: Path) -> None:
    path = write(tmp_path, "[aliases\nbroken = ")
    with pytest.raises(ConfigError) as err:
        load_aliases(path, {})
    message = str(err.value)
    assert message.startswith(f"routes file {path!r} is not valid TOML: ")
    assert "\n" not in message


def test_errors_name_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, VALID)
    with pytest.raises(ConfigError) as err:
        load_aliases(path, {})
    assert str(err.value) == (
        f"routes file {path!r}: deployment 'primary' needs environment variable PRIMARY_KEY"
    )


def test_a_zero_timeout_is_refused() -> None:
    with pytest.raises(ConfigError) as err:
        parse_aliases(
            {
                "aliases": {"m": {"deployments": ["d"]}},
                "deployments": {
                    "d": {
                        "provider": "openai",
                        "base_url": "http://x",
                        "model": "m",
                        "timeout_s": 0,
                    }
                },
            },
            {},
        )
    assert "timeout_s must be greater than 0" in str(err.value)


def test_a_price_is_read_per_deployment(tmp_path: Path) -> None:
    text = VALID.replace(
        'model = "claude-x"',
        'model = "claude-x"\nprice = { prompt_per_mtok = 0.8, completion_per_mtok = 4 }',
    ).replace("max_retries = 2", "max_retries = 2\nprice = { completion_per_mtok = 0.6 }")
    routes = load_aliases(write(tmp_path, text), {"PRIMARY_KEY": "sk-123"})
    primary, backup = routes.resolve("gpt-4o-mini") or ()
    assert primary.price == Price(prompt_per_mtok=0.0, completion_per_mtok=0.6)
    assert backup.price == Price(prompt_per_mtok=0.8, completion_per_mtok=4.0)
    assert routes.prices() == {"primary": primary.price, "backup": backup.price}


def test_an_unpriced_deployment_has_no_price() -> None:
    routes = parse_aliases(routes_data(deployment()), {})
    (d1,) = routes.resolve("a") or ()
    assert d1.price is None
    assert routes.prices() == {}


def test_a_price_costs_tokens_per_million() -> None:
    price = Price(prompt_per_mtok=0.15, completion_per_mtok=0.60)
    assert price.cost_usd(1_000_000, 0) == pytest.approx(0.15)
    assert price.cost_usd(2000, 500) == pytest.approx((2000 * 0.15 + 500 * 0.60) / 1e6)
    assert price.cost_usd(0, 0) == 0.0


@pytest.mark.parametrize(
    ("price", "message"),
    [
        (
            {"prompt_per_mtok": -1},
            "routes: deployment 'd1': price.prompt_per_mtok must be a non-negative number"
            " (USD per million tokens)",
        ),
        (
            {"completion_per_mtok": "0.6"},
            "routes: deployment 'd1': price.completion_per_mtok must be a non-negative number"
            " (USD per million tokens)",
        ),
        (
            {"completion_per_mtok": True},
            "routes: deployment 'd1': price.completion_per_mtok must be a non-negative number"
            " (USD per million tokens)",
        ),
        (
            {"prompt_per_mtok": float("inf")},
            "routes: deployment 'd1': price.prompt_per_mtok must be a non-negative number"
            " (USD per million tokens)",
        ),
        (
            {"prompt_per_mtok": float("nan")},
            "routes: deployment 'd1': price.prompt_per_mtok must be a non-negative number"
            " (USD per million tokens)",
        ),
        (
            {"input_per_mtok": 1.0},
            "routes: deployment 'd1': price.input_per_mtok is not a price key"
            " (expected prompt_per_mtok, completion_per_mtok or cached_prompt_per_mtok)",
        ),
        (
            0.15,
            "routes: deployment 'd1': price must be a table such as"
            " { prompt_per_mtok = 0.15, completion_per_mtok = 0.60 }",
        ),
    ],
)
def test_a_bad_price_is_one_line_naming_the_deployment_and_key(price: object, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_aliases(routes_data(deployment(price=price)), {})
    assert str(err.value) == message


BATCH_ROUTES = {
    "deployments": {
        "ob": {"provider": "openai-batch", "base_url": "http://127.0.0.1:1/v1", "model": "m"},
        "ab": {"provider": "anthropic-batch", "base_url": "http://127.0.0.1:1/v1", "model": "c"},
        "rt": {"provider": "openai", "base_url": "http://127.0.0.1:1/v1", "model": "m"},
    },
    "aliases": {
        "half": {"deployments": ["ob", "rt"]},
        "claude-half": {"deployments": ["ab"]},
        "plain": {"deployments": ["rt"]},
    },
}


def batch_routes(**overrides: object) -> dict[str, object]:
    """``BATCH_ROUTES`` with deployment ``ob``'s keys overridden."""
    deployments = dict(BATCH_ROUTES["deployments"])
    deployments["ob"] = {**deployments["ob"], **overrides}
    return {**BATCH_ROUTES, "deployments": deployments}


def test_batch_deployments_take_the_providers_defaults() -> None:
    routes = parse_aliases(BATCH_ROUTES, {})
    ob, ab = routes.batch_lead("half"), routes.batch_lead("claude-half")
    assert ob is not None and ab is not None
    assert ob.batch == BatchOptions("openai", 50_000, 200 * 1024 * 1024, 60.0, 30.0)
    assert ab.batch == BatchOptions("anthropic", 100_000, 256 * 1024 * 1024, 60.0, 30.0)
    assert ob.batch.window == timedelta(hours=24)
    assert routes.batch_lead("plain") is None and routes.batch_lead("nope") is None
    assert sorted(routes.batch_deployments()) == ["ab", "ob"]
    rt = (routes.resolve("plain") or ())[0]
    assert rt.batch is None and not rt.is_batch and ob.is_batch


def test_batch_options_are_read() -> None:
    routes = parse_aliases(
        batch_routes(max_rows=10, max_bytes=4096, linger_s=0, poll_s=0.5, window="1d"), {}
    )
    lead = routes.batch_lead("half")
    assert lead is not None
    assert lead.batch == BatchOptions("openai", 10, 4096, 0.0, 0.5, timedelta(hours=24))
    data = dict(BATCH_ROUTES)
    data["deployments"] = {**BATCH_ROUTES["deployments"]}
    data["deployments"]["ab"] = {**data["deployments"]["ab"], "window": "2h"}
    claude = parse_aliases(data, {}).batch_lead("claude-half")
    assert claude is not None and claude.batch is not None
    assert claude.batch.window == timedelta(hours=2)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"max_rows": 50_001}, "max_rows must be an integer from 1 to 50000"),
        ({"max_rows": 0}, "max_rows must be an integer from 1 to 50000"),
        ({"max_bytes": 200 * 1024 * 1024 + 1}, "max_bytes must be an integer from 1 to"),
        ({"max_bytes": True}, "max_bytes must be an integer"),
        ({"linger_s": -1}, "linger_s must be a non-negative number"),
        ({"poll_s": 0}, "poll_s must be greater than 0"),
        ({"window": "24 hours"}, "window must be a duration"),
        ({"window": 3600}, "window must be a duration"),
        ({"window": "0h"}, "window must be a duration"),
        ({"window": "2h"}, "window must be '24h' for openai-batch"),
        ({"window": "7d"}, "window must be '24h' for openai-batch"),
        ({"rpm": 10}, "rpm does not apply to a batch deployment"),
        ({"tpm": 10}, "tpm does not apply to a batch deployment"),
    ],
)
def test_bad_batch_options_are_one_line_naming_the_key(
    overrides: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        parse_aliases(batch_routes(**overrides), {})
    assert "'ob'" in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize("key", ["max_rows", "max_bytes", "linger_s", "poll_s", "window"])
def test_a_batch_key_on_a_realtime_deployment_is_refused(key: str) -> None:
    with pytest.raises(ConfigError, match=f"deployment 'd1': {key} is only for batch providers"):
        parse_aliases(routes_data(deployment(**{key: 1})), {})


def test_a_batch_deployment_may_only_lead_an_alias() -> None:
    data = {**BATCH_ROUTES, "aliases": {"late": {"deployments": ["rt", "ob"]}}}
    with pytest.raises(
        ConfigError, match="alias 'late': batch deployment 'ob' may only come first"
    ):
        parse_aliases(data, {})


# --- alias patterns ------------------------------------------------------------------

PATTERNED = {
    "deployments": {"d1": deployment(), "d2": deployment(model="other")},
    "aliases": {
        "gpt-4o": {"deployments": ["d1"], "patterns": ["gpt-4o-*"]},
        "gpt-4o-mini": {"deployments": ["d2"], "patterns": ["gpt-4o-mini-*"]},
    },
}


def test_a_dated_name_routes_to_the_alias_whose_pattern_is_longest() -> None:
    table = parse_aliases(PATTERNED, {})
    assert table.alias_of("gpt-4o-mini-2024-07-18") == "gpt-4o-mini"
    assert table.alias_of("gpt-4o-2024-08-06") == "gpt-4o"
    assert table.alias_of("gpt-4o-mini") == "gpt-4o-mini"  # the alias's own name first
    assert table.alias_of("gpt-4") is None and table.resolve("gpt-4") is None
    resolved = table.resolve("gpt-4o-mini-2024-07-18")
    assert resolved is not None and [d.model for d in resolved] == ["other"]
    assert table.names() == ["gpt-4o", "gpt-4o-mini"]  # patterns are not listed
    assert table.lead_patterns() == [("gpt-4o-mini-", ""), ("gpt-4o-", "")]


@pytest.mark.parametrize(
    ("aliases", "message"),
    [
        (
            {"a": {"deployments": ["d1"], "patterns": "a-*"}},
            "routes: alias 'a': patterns must be a list such as ['gpt-4o-mini-*']",
        ),
        (
            {"a": {"deployments": ["d1"], "patterns": ["a-?"]}},
            "routes: alias 'a': patterns[0] must be a name prefix ending in one '*'"
            " (such as 'gpt-4o-mini-*'), not 'a-?'",
        ),
        (
            {"a": {"deployments": ["d1"], "patterns": ["*"]}},
            "routes: alias 'a': patterns[0] must be a name prefix ending in one '*'"
            " (such as 'gpt-4o-mini-*'), not '*'",
        ),
        (
            {"a": {"deployments": ["d1"], "patterns": ["a*b*"]}},
            "routes: alias 'a': patterns[0] must be a name prefix ending in one '*'"
            " (such as 'gpt-4o-mini-*'), not 'a*b*'",
        ),
        (
            {
                "a": {"deployments": ["d1"], "patterns": ["x-*"]},
                "b": {"deployments": ["d1"], "patterns": ["x-*"]},
            },
            "routes: pattern 'x-*' is given by alias 'a' and alias 'b'",
        ),
        (
            {"a": {"deployments": ["d1"], "pattern": ["a-*"]}},
            "routes: alias 'a': pattern is not an alias key (expected deployments or patterns)",
        ),
    ],
)
def test_a_bad_pattern_is_one_line_naming_the_alias(
    aliases: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError) as err:
        parse_aliases({"deployments": {"d1": deployment()}, "aliases": aliases}, {})
    assert str(err.value) == message
