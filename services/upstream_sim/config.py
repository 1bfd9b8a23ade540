"""How one simulator behaves: its settings (:class:`SimConfig`, read from ``RELAY_SIM_*`` by
:mod:`.__main__`) and the limits every endpoint shares."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from relay_batches.settings.tools import RATE_COUNTINGS as COUNTINGS

Sleep = Callable[[float], Awaitable[None]]

HANG_SECONDS = 3600.0
MODEL_ID = "sim-echo"
MAX_BODY_BYTES = 16 * 1024 * 1024
MAX_REPLY_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class SimConfig:
    """How the simulator behaves on every call."""

    latency_ms: float = 0
    error_rate: float = 0.0
    seed: int | None = None
    rpm: int = 0  # requests per minute, enforced per second (0: unlimited)
    tpm: int = 0  # tokens per minute, enforced per second (0: unlimited)
    # How rpm and tpm count their second: calendar, sliding or bucket (RELAY_SIM_RATE_COUNTING).
    rate_counting: str = "calendar"
    batch_delay_s: float = 0  # a provider batch ends at the first poll this long after creation
    # A provider batch's input (OpenAI's file upload, Anthropic's create) is answered this
    # long after it is read, before the file or batch is made.
    batch_input_delay_s: float = 0
    # A provider batch's results download stops this long halfway through its lines.
    batch_results_pause_s: float = 0
    cache_prefixes: int = 0  # prompt prefixes the simulated prompt cache holds (0: none)
    cache_ttl_s: float = 300.0  # how long a prefix stays cached after it was last seen
    # The flex lane (calls with service_tier "flex"): the share refused with 429 (capacity
    # short; deterministic: every 1/share-th flex call), and the latency they add.
    flex_refusal: float = 0.0
    flex_latency_ms: float = 0
    # 1: every provider batch stalls (in progress, no request answered) until canceled.
    batch_stall: int = 0

    def __post_init__(self) -> None:
        if not self.latency_ms >= 0:
            raise ValueError(f"latency_ms must be >= 0, got {self.latency_ms!r}")
        if not 0.0 <= self.error_rate <= 1.0:
            raise ValueError(f"error_rate must be within 0..1, got {self.error_rate!r}")
        if self.rpm < 0 or self.tpm < 0:
            raise ValueError(f"rpm and tpm must be >= 0, got {self.rpm!r} and {self.tpm!r}")
        if self.rate_counting not in COUNTINGS:
            raise ValueError(
                f"rate_counting must be one of {', '.join(COUNTINGS)}, got {self.rate_counting!r}"
            )
        if not 0.0 <= self.flex_refusal <= 1.0:
            raise ValueError(f"flex_refusal must be within 0..1, got {self.flex_refusal!r}")
        for name in (
            "batch_delay_s",
            "batch_input_delay_s",
            "batch_results_pause_s",
            "flex_latency_ms",
        ):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")
