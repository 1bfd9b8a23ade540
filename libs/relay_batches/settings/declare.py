"""Declaring a setting once: a dataclass field made by :func:`setting` carries its variable,
kind, default, section, services and one-line doc; the loader (:func:`load`), the start-up
log (:func:`describe`) and the configuration page (``relay_batches.settings.docs``) all
read those declarations.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

from relay_batches.settings.kinds import Kind

T = TypeVar("T")
D = TypeVar("D")

_KEY = "relay_setting"  # where a field's metadata holds its declaration


@dataclass(frozen=True)
class Section:
    """A group of settings: a heading and a table of the configuration page."""

    title: str
    intro: str


ESSENTIALS = Section(
    "Essentials",
    "What an operator sets first: where the ledger and the broker are, the routes file, "
    "where the API and the health ports listen, how long jobs are kept.",
)
LIMITS = Section(
    "Request limits",
    "What the ingest-api accepts: body and row sizes, slow bodies, large uploads at once.",
)
CAPACITY = Section(
    "Capacity and topology",
    "How much each process takes on, its ledger pool, and the bus topology every service "
    "of a namespace must agree on.",
)
UPSTREAM = Section(
    "Upstream calls and webhooks",
    "Retries and cooldowns of calls to the providers, and completion webhooks.",
)
TUNING = Section(
    "Tuning knobs",
    "Windows, slices, flush sizes, chunks and intervals: the defaults suit most "
    "deployments; change one with a measurement in hand.",
)
CLIENT = Section(
    "The relay batch command line",
    "Read by `relay batch` only; its flags override them.",
)
DEV = Section(
    "Development only: relay dev",
    "Read by `relay dev` (`make run`) only; never set in a deployment.",
)
SIMULATOR = Section(
    "Development only: the upstream simulator",
    "Read by the upstream simulator (`python -m relay_batches.services.upstream_sim`), the local"
    " stand-in for a provider in development and tests.",
)
SECTIONS = (ESSENTIALS, LIMITS, CAPACITY, UPSTREAM, TUNING, CLIENT, DEV, SIMULATOR)

# The processes that read settings, as the configuration page names them.
INGEST_API = "ingest-api"
SCHEDULER = "scheduler"
DISPATCHER = "dispatcher"
ROW_WORKER = "row-worker"
AGGREGATOR = "aggregator"
NOTIFIER = "notifier"
OFFLOADER = "offloader"
SERVICES = (INGEST_API, SCHEDULER, DISPATCHER, ROW_WORKER, AGGREGATOR, NOTIFIER, OFFLOADER)
# Those whose ledger pool the pool-size settings bound (a row-worker's is fixed and tiny).
LEDGER_SERVICES = tuple(s for s in SERVICES if s != ROW_WORKER)
RELAY = "relay CLI"  # the command line's migrate, admin and workspace commands
RELAY_BATCH = "relay batch"
RELAY_DEV = "relay dev"
UPSTREAM_SIM = "upstream-sim"


@dataclass(frozen=True)
class Setting:
    """One ``RELAY_*`` variable: what it is, who reads it, what it does."""

    env: str
    kind: Kind
    section: Section
    services: tuple[str, ...]
    doc: str
    default_doc: str = ""  # the default in words, where its value alone says too little

    def read(self, env: Mapping[str, str], default: Any, earlier: Mapping[str, Any]) -> Any:
        """This setting's value in ``env``; ``default`` when unset."""
        return self.kind.read(self.env, env.get(self.env), default, earlier)


def setting(
    env: str,
    kind: Kind,
    default: T,
    section: Section,
    services: tuple[str, ...],
    doc: str,
    *,
    default_doc: str = "",
) -> T:
    """A dataclass field declaring variable ``env`` (see :class:`Setting`)."""
    declared = Setting(env, kind, section, services, doc, default_doc)
    return field(default=default, metadata={_KEY: declared})


def declarations(cls: type[object]) -> tuple[tuple[str, Setting], ...]:
    """``(attribute, declaration)`` of every declared field of dataclass ``cls``, in field
    order; a subclass that only changes a default keeps its parent's declaration."""
    found = []
    for f in fields(cls):  # type: ignore[arg-type]
        for klass in cls.__mro__:
            parent = getattr(klass, "__dataclass_fields__", {}).get(f.name)
            if parent is not None and _KEY in parent.metadata:
                found.append((f.name, parent.metadata[_KEY]))
                break
    return tuple(found)


def declaration(cls: type[object], attribute: str) -> Setting:
    """The declaration of ``cls``'s field ``attribute``."""
    return dict(declarations(cls))[attribute]


def read_one(cls: type[object], attribute: str, env: Mapping[str, str], default: Any = None) -> Any:
    """One setting of ``cls`` read alone (``default`` when unset), for a process that
    needs it but not the rest of ``cls``."""
    return declaration(cls, attribute).read(env, default, {})


def load(cls: type[D], env: Mapping[str, str] | None = None) -> D:
    """An instance of dataclass ``cls`` from ``env`` (default: the process environment):
    each declared field read in order, an unset one keeping ``cls``'s default; raise
    :class:`~relay_batches.settings.kinds.ConfigError` on a bad value."""
    env = os.environ if env is None else env
    defaults = cls()
    earlier: dict[str, Any] = {}
    values: dict[str, Any] = {}
    for attribute, declared in declarations(cls):
        value = declared.read(env, getattr(defaults, attribute), earlier)
        earlier[declared.env] = values[attribute] = value
    return cls(**values)


def describe(settings: object) -> dict[str, object]:
    """Every declared setting of ``settings`` by attribute, as the start-up log shows it
    (passwords in URLs masked)."""
    return {
        attribute: declared.kind.shown(getattr(settings, attribute))
        for attribute, declared in declarations(type(settings))
    }
