"""The shipped example routes file stays valid."""

from __future__ import annotations

from pathlib import Path

from relay_batches.router.aliases import Price, load_aliases

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "routes.example.toml"


def test_the_example_routes_file_loads_with_its_keys_set() -> None:
    routes = load_aliases(
        str(EXAMPLE),
        {"OPENAI_API_KEY": "sk-test", "ANTHROPIC_API_KEY": "sk-ant-test"},
    )
    assert routes.names() == [
        "claude-haiku",
        "gpt-4o-mini",
        "gpt-4o-mini-half",
        "llama-local",
        "text-embedding-3-small",
    ]
    (embed,) = routes.resolve("text-embedding-3-small") or ()
    assert embed.endpoints == {"/v1/embeddings"}
    assert [d.name for d in routes.resolve("gpt-4o-mini") or ()] == [
        "openai-4o-mini",
        "local-vllm",
    ]
    lead = routes.batch_lead("gpt-4o-mini-half")
    assert lead is not None and lead.batch is not None
    assert (lead.provider, lead.batch.linger_s, lead.batch.max_rows) == ("openai-batch", 60, 50_000)
    anthropic = (routes.resolve("claude-haiku") or ())[0]
    assert (anthropic.provider, anthropic.api_key) == ("anthropic", "sk-ant-test")


def test_the_example_routes_file_prices_its_provider_deployments() -> None:
    routes = load_aliases(
        str(EXAMPLE),
        {"OPENAI_API_KEY": "sk-test", "ANTHROPIC_API_KEY": "sk-ant-test"},
    )
    prices = routes.prices()
    assert sorted(prices) == [
        "anthropic-haiku",
        "openai-4o-mini",
        "openai-batch-4o-mini",
        "openai-embed",
    ]
    assert prices["openai-4o-mini"] == Price(prompt_per_mtok=0.15, completion_per_mtok=0.60)
