"""Reading the one-line configuration error a loader stops with."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import pytest

from relay_batches.settings import ConfigError


def config_error(load: Callable[[Mapping[str, str]], object], env: Mapping[str, str]) -> str:
    """The message of the :class:`ConfigError` that ``load(env)`` must raise."""
    with pytest.raises(ConfigError) as caught:
        load(env)
    return str(caught.value)
