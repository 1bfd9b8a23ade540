"""An unknown model's 400 lists the aliases the key can submit to, on the real API."""

from __future__ import annotations

import aiohttp

from relay_batches.router.aliases import AliasTable
from tests.helpers.support import ApiClient


async def test_an_unknown_model_is_a_400_listing_the_known_aliases(
    client_a: ApiClient, aliases: AliasTable, http: aiohttp.ClientSession
) -> None:
    body = {
        "model": "gpt-9-imaginary",
        "requests": [{"messages": [{"role": "user", "content": "x"}]}],
    }
    status, answer = await client_a.request("POST", "/v1/batches", json=body)
    assert status == 400
    error = answer["error"]
    assert error["param"] == "model"
    assert error["message"] == (
        f"model 'gpt-9-imaginary' is unknown; known models: {', '.join(aliases.names())}"
    )
    form = aiohttp.FormData()
    form.add_field("model", "nope")
    form.add_field("file", b"hello\n", filename="a.csv")
    status, answer = await client_a.request("POST", "/v1/batches/upload", data=form)
    assert (status, answer["error"]["param"]) == (400, "model")
    assert "; known models: " in answer["error"]["message"]


async def test_a_row_s_unknown_model_is_a_400_listing_the_known_aliases(
    client_a: ApiClient, aliases: AliasTable
) -> None:
    body = {
        "model": "gpt-4o-mini",
        "requests": [
            {"messages": [{"role": "user", "content": "x"}]},
            {"model": "gpt-9-row", "messages": [{"role": "user", "content": "y"}]},
        ],
    }
    status, answer = await client_a.request("POST", "/v1/batches", json=body)
    assert status == 400
    error = answer["error"]
    assert error["param"] == "requests[1].model"
    assert error["message"].endswith(
        f"'gpt-9-row' is unknown; known models: {', '.join(aliases.names())}"
    ), error
