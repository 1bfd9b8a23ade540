"""Settings: every ``RELAY_*`` environment variable, declared once and read once.

Each variable is a field of one of four frozen dataclasses, declared with
:func:`~relay_batches.settings.declare.setting` (its variable, kind, default, section,
the processes that read it and what it does): :class:`Settings` (the services),
:class:`ClientSettings` (``relay batch``), :class:`DevSettings` (``relay dev``) and
:class:`SimSettings` (the upstream simulator). The loader, the start-up log and the
generated page ``docs/operations/configuration.md`` (``make config-docs``) all come from
those declarations.
"""

from __future__ import annotations

from relay_batches.settings.declare import Setting, declarations
from relay_batches.settings.kinds import RETENTION_MAX_DIGITS, ConfigError
from relay_batches.settings.service import Settings, check_spool_dir, pool_bounds
from relay_batches.settings.tools import ClientSettings, DevSettings, SimSettings

GROUPS: tuple[type[object], ...] = (Settings, ClientSettings, DevSettings, SimSettings)

__all__ = [
    "GROUPS",
    "RETENTION_MAX_DIGITS",
    "ClientSettings",
    "ConfigError",
    "DevSettings",
    "Settings",
    "SimSettings",
    "check_spool_dir",
    "every_setting",
    "pool_bounds",
]


def every_setting() -> tuple[Setting, ...]:
    """Every declared ``RELAY_*`` variable, group by group in field order."""
    return tuple(declared for group in GROUPS for _, declared in declarations(group))
