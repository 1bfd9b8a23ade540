"""Calls of the OpenAI endpoints besides chat (embeddings, completions, moderations,
responses) on an OpenAI-compatible deployment: the row's body is sent as it is, over the
deployment's ``params``, with the deployment's ``model``; the reply's JSON body is the
row's answer (:func:`relay_batches.dialects.endpoints.body_reply`).

:class:`BodyWire` has the router's provider interface (``build_request``,
``token_cap``, ``parse_reply``) for one endpoint, plus ``estimate`` (the tokens a call
counts against a tokens-per-minute limit before it is made).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from relay_batches.dialects.endpoints import COMPLETIONS, RESPONSES, body_reply, input_estimate
from relay_batches.ratelimit.estimate import completion_cap
from relay_batches.router.aliases import Deployment
from relay_batches.router.types import ProviderReply

# The key of each endpoint's completion-token cap (none: the endpoint writes no tokens).
CAP_KEYS = {COMPLETIONS: "max_tokens", RESPONSES: "max_output_tokens"}


class BodyWire:
    """The OpenAI wire of one endpoint (see the module docstring)."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self._suffix = endpoint.removeprefix("/v1")
        self._cap_key = CAP_KEYS.get(endpoint)

    def build_request(
        self,
        deployment: Deployment,
        _messages: Sequence[Mapping[str, Any]],
        body: Mapping[str, Any],
    ) -> tuple[str, dict[str, str], bytes]:
        """URL, headers and body of one call: ``body`` over the deployment's params."""
        headers = {"Content-Type": "application/json", **deployment.headers}
        if deployment.api_key:
            headers["Authorization"] = f"Bearer {deployment.api_key}"
        sent = {**deployment.params, **body, "model": deployment.model}
        return f"{deployment.base_url}{self._suffix}", headers, orjson.dumps(sent)

    def token_cap(self, deployment: Deployment, body: Mapping[str, Any]) -> int:
        """The completion-token cap the call sends (the row's, else the deployment's)."""
        if self._cap_key is None:
            return 0
        key = self._cap_key
        return completion_cap({"max_tokens": body.get(key, deployment.params.get(key))})

    def estimate(self, body: Mapping[str, Any], cap: int) -> int:
        """The tokens the call is expected to count: its input text plus the cap."""
        return input_estimate(self.endpoint, body, cap)

    def parse_reply(self, raw: bytes) -> ProviderReply:
        """The reply's body as the row's answer."""
        return body_reply(self.endpoint, raw)
