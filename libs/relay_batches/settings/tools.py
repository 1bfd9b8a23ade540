"""The settings of the tools around the services, declared like the services' own: the
``relay batch`` command line, ``relay dev`` (``make run``) and the upstream simulator.
The last two are development only."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from relay_batches.settings.declare import (
    CLIENT,
    DEV,
    RELAY_BATCH,
    RELAY_DEV,
    SIMULATOR,
    UPSTREAM_SIM,
    load,
    setting,
)
from relay_batches.settings.kinds import Choice, Number, Port, Stripped, Text, Whole, Within

MAX_ROW_WORKERS = 32
MAX_RPM = 1_000_000_000  # the simulator's own bounds (RELAY_SIM_RPM, RELAY_SIM_TPM)
MAX_TPM = 1_000_000_000_000
# How the simulator's limits count a second (RELAY_SIM_RATE_COUNTING; upstream_sim.rate_limits).
RATE_COUNTINGS = ("calendar", "sliding", "bucket")
SIM = (UPSTREAM_SIM, RELAY_DEV)  # relay dev reads the simulator's listener to reach it


@dataclass(frozen=True)
class ClientSettings:
    """The ``relay batch`` command line's settings: which API, which key, how long to wait.

    Flags given on the command line override these.
    """

    url: str = setting(
        "RELAY_URL", Text(), "http://127.0.0.1:8080", CLIENT, (RELAY_BATCH,),
        "The API to talk to (`--url`).",
    )  # fmt: skip
    api_key: str | None = setting(
        "RELAY_API_KEY", Text(), None, CLIENT, (RELAY_BATCH,),
        "The API key to send (`--api-key`).",
        default_doc="none",
    )  # fmt: skip
    timeout_s: float = setting(
        "RELAY_CLI_TIMEOUT_S", Number(positive=True), 60.0, CLIENT, (RELAY_BATCH,),
        "Seconds to wait for the API to answer (`--timeout`).",
    )  # fmt: skip

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ClientSettings:
        """Read ``RELAY_URL``, ``RELAY_API_KEY`` and ``RELAY_CLI_TIMEOUT_S``."""
        return load(cls, env)


@dataclass(frozen=True)
class DevSettings:
    """What only ``relay dev`` reads (it also reads the simulator's listener and
    ``RELAY_ROUTES_FILE``, declared with their owners)."""

    row_workers: int = setting(
        "RELAY_DEV_ROW_WORKERS", Whole(1, MAX_ROW_WORKERS), 1, DEV, (RELAY_DEV,),
        "Row-worker processes to start, each with a health port of its own.",
    )  # fmt: skip
    api_key: str | None = setting(
        "RELAY_DEV_API_KEY", Text(), None, DEV, (RELAY_DEV,),
        "The dev workspace's key to create instead of a random one (reused on later runs).",
        default_doc="the key kept in `RELAY_DEV_KEY_FILE`, else a new random key",
    )  # fmt: skip
    key_file: str = setting(
        "RELAY_DEV_KEY_FILE", Text(), ".relay/dev-api-key", DEV, (RELAY_DEV,),
        "Where `relay dev` keeps the dev key it made, so a restart reuses it (unless"
        " `RELAY_DEV_API_KEY` is set); relative to the directory it runs in.",
    )  # fmt: skip
    rpm: int | None = setting(
        "RELAY_DEV_RPM", Whole(1, MAX_RPM), None, DEV, (RELAY_DEV,),
        "Requests per minute the simulator enforces and every local deployment carries.",
        default_doc="none",
    )  # fmt: skip
    tpm: int | None = setting(
        "RELAY_DEV_TPM", Whole(1, MAX_TPM), None, DEV, (RELAY_DEV,),
        "Tokens per minute, likewise.",
        default_doc="none",
    )  # fmt: skip

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> DevSettings:
        """Read the ``RELAY_DEV_*`` variables; raise ``ConfigError`` on a bad value."""
        return load(cls, env)


@dataclass(frozen=True)
class SimSettings:
    """Everything the upstream simulator process reads."""

    latency_ms: float = setting(
        "RELAY_SIM_LATENCY_MS", Within(0, 3_600_000), 0.0, SIMULATOR, (UPSTREAM_SIM,),
        "Milliseconds every call waits before its answer.",
    )  # fmt: skip
    error_rate: float = setting(
        "RELAY_SIM_ERROR_RATE", Within(0, 1), 0.0, SIMULATOR, (UPSTREAM_SIM,),
        "Fraction of calls answered with a transient error.",
    )  # fmt: skip
    rpm: int = setting(
        "RELAY_SIM_RPM", Within(0, MAX_RPM, whole=True), 0, SIMULATOR, (UPSTREAM_SIM,),
        "Requests per minute enforced per second (`0`: off).",
    )  # fmt: skip
    tpm: int = setting(
        "RELAY_SIM_TPM", Within(0, MAX_TPM, whole=True), 0, SIMULATOR, (UPSTREAM_SIM,),
        "Tokens per minute enforced per second (`0`: off).",
    )  # fmt: skip
    rate_counting: str = setting(
        "RELAY_SIM_RATE_COUNTING", Choice(RATE_COUNTINGS), "calendar", SIMULATOR, (UPSTREAM_SIM,),
        "How the limits count a second: per calendar second, over any sliding second, or"
        " as a token bucket of a second's worth.",
    )  # fmt: skip
    batch_delay_s: float = setting(
        "RELAY_SIM_BATCH_DELAY_S", Within(0, 86_400), 0.0, SIMULATOR, (UPSTREAM_SIM,),
        "Seconds a provider batch takes at least (`0`: done at its first poll).",
    )  # fmt: skip
    batch_input_delay_s: float = setting(
        "RELAY_SIM_BATCH_INPUT_DELAY_S", Within(0, 3_600), 0.0, SIMULATOR, (UPSTREAM_SIM,),
        "Seconds a batch input (upload or create) waits for its answer.",
    )  # fmt: skip
    batch_results_pause_s: float = setting(
        "RELAY_SIM_BATCH_RESULTS_PAUSE_S", Within(0, 3_600), 0.0, SIMULATOR, (UPSTREAM_SIM,),
        "Seconds a results download stops halfway.",
    )  # fmt: skip
    cache_prefixes: int = setting(
        "RELAY_SIM_CACHE_PREFIXES", Within(0, 1_000_000, whole=True), 0, SIMULATOR,
        (UPSTREAM_SIM,),
        "Prompt prefixes (every message but the last) the simulated prompt cache holds,"
        " least recently used dropped first; a call whose prefix it holds reports the"
        " prefix's tokens as cached (`0`: no cache).",
    )  # fmt: skip
    cache_ttl_s: float = setting(
        "RELAY_SIM_CACHE_TTL_S", Within(0, 86_400), 300.0, SIMULATOR, (UPSTREAM_SIM,),
        "Seconds a prefix stays in the simulated prompt cache after it was last seen.",
    )  # fmt: skip
    flex_refusal: float = setting(
        "RELAY_SIM_FLEX_REFUSAL", Within(0, 1), 0.0, SIMULATOR, (UPSTREAM_SIM,),
        "Share of flex calls (`service_tier: \"flex\"`) refused with 429, evenly spread.",
    )  # fmt: skip
    flex_latency_ms: float = setting(
        "RELAY_SIM_FLEX_LATENCY_MS", Within(0, 3_600_000), 0.0, SIMULATOR, (UPSTREAM_SIM,),
        "Milliseconds a flex call waits beyond `RELAY_SIM_LATENCY_MS`.",
    )  # fmt: skip
    batch_stall: int = setting(
        "RELAY_SIM_BATCH_STALL", Within(0, 1, whole=True), 0, SIMULATOR, (UPSTREAM_SIM,),
        "`1`: every provider batch stalls (no progress) until canceled.",
    )  # fmt: skip
    host: str = setting(
        "RELAY_SIM_HOST", Stripped(), "127.0.0.1", SIMULATOR, SIM,
        "Address the simulator listens on.",
    )  # fmt: skip
    port: int = setting(
        "RELAY_SIM_PORT", Port(), 8090, SIMULATOR, SIM,
        "Port the simulator listens on; `relay dev` points the local routes at it.",
    )  # fmt: skip

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> SimSettings:
        """Read the ``RELAY_SIM_*`` variables; raise ``ConfigError`` on a bad value."""
        return load(cls, env)
