"""Rate limits, as providers enforce them (:class:`RateWindows`), for each requested model
on its own: with ``SimConfig.rpm`` a calendar second admits at most ``rpm / 60`` calls
(the remainder spread over the minute, :func:`per_second`), and with ``SimConfig.tpm`` at
most ``tpm / 60`` tokens, a call counting its prompt tokens plus its
``max_tokens`` (``max_completion_tokens``; without either, its reply's tokens); a call over
either answers 429 at once with ``Retry-After: 1`` and the provider's error shape, and is
not counted in the window. ``GET /stats`` counts those answers as ``throttled``.
"""

from __future__ import annotations

import time
from collections.abc import Callable

THROTTLE_RETRY_AFTER_S = 1  # a throttled call may come back with the next second


MAX_RATE_MODELS = 1024  # models with a window of their own; beyond, the oldest is forgotten


def per_second(per_minute: int, second: int) -> int:
    """What calendar second ``second`` admits of a per-minute limit: ``per_minute / 60``
    with the remainder spread evenly (90 rpm: 1, 2, 1, 2, …; 30 rpm: one call every
    other second), so any 60 consecutive seconds admit exactly ``per_minute``."""
    return (second + 1) * per_minute // 60 - second * per_minute // 60


class RateWindows:
    """Per-model, per-calendar-second windows of calls and tokens, as a provider
    quantizes its per-minute limits (each model has its own, as providers limit each
    model): a second admits :func:`per_second` of ``rpm`` calls and of ``tpm`` tokens;
    0 means that limit is off."""

    def __init__(self, rpm: int, tpm: int, clock: Callable[[], float] = time.time) -> None:
        self._rpm = rpm
        self._tpm = tpm
        self._clock = clock
        self._windows: dict[str, list[int]] = {}  # model -> [second, calls, tokens]

    @property
    def active(self) -> bool:
        """Whether any limit is on."""
        return bool(self._rpm or self._tpm)

    def admit(self, tokens: int, model: str = "") -> bool:
        """Count a call of ``tokens`` to ``model`` in this second's window if it fits;
        False if over."""
        second = int(self._clock())
        window = self._windows.get(model)
        if window is None:
            if len(self._windows) >= MAX_RATE_MODELS:
                del self._windows[next(iter(self._windows))]
            window = self._windows[model] = [second, 0, 0]
        if window[0] != second:
            window[:] = [second, 0, 0]
        if self._rpm and window[1] + 1 > per_second(self._rpm, second):
            return False
        if self._tpm and window[2] + tokens > per_second(self._tpm, second):
            return False
        window[1] += 1
        window[2] += tokens
        return True
