"""The routes file (TOML): public aliases → ordered deployments, validated at start-up.

A deployment of a batch provider (``openai-batch``: Files + Batches API;
``anthropic-batch``: Message Batches) takes no realtime call: it carries
:class:`BatchOptions` (rows and bytes per provider batch, how long to gather rows, the
poll interval, the provider's completion window) and may only lead an alias, followed by
the realtime deployments its failed rows fall back to. ``rpm``/``tpm`` on it, or a batch
key on a realtime deployment, is a :class:`ConfigError` naming the key.

An alias may also list ``patterns``: name prefixes ending in one ``*``
(``patterns = ["gpt-4o-mini-*"]``), so a dated snapshot name such as
``gpt-4o-mini-2024-07-18`` routes to it. An alias's own name always wins; among
patterns of different aliases that match a name, the longest prefix wins. A malformed
pattern, or one given twice, is a :class:`ConfigError`.

``endpoints`` lists the OpenAI endpoints a deployment serves (default: chat completions
only, as before the key existed); an ``anthropic`` deployment serves chat and, translated
to Messages, ``/v1/responses``, and no other.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from relay_batches.dialects.endpoints import ALL_ENDPOINTS, CHAT, RESPONSES
from relay_batches.durations import SPELLING, parse_duration
from relay_batches.lanes.plan import Lane
from relay_batches.ratelimit.limits import RateLimit
from relay_batches.router.lane_keys import FLEX, rows_per_s, service_tier, turnaround
from relay_batches.router.prices import Price as Price
from relay_batches.router.prices import parse_price
from relay_batches.settings import ConfigError

REALTIME_PROVIDERS = frozenset({"openai", "anthropic"})
# A batch provider → the realtime provider whose request builder and reply parser its
# lines use, and its caps on one provider batch (rows, bytes of the input file).
BATCH_PROVIDERS: Mapping[str, tuple[str, int, int]] = {
    "openai-batch": ("openai", 50_000, 200 * 1024 * 1024),
    "anthropic-batch": ("anthropic", 100_000, 256 * 1024 * 1024),
}
PROVIDERS = REALTIME_PROVIDERS | frozenset(BATCH_PROVIDERS)
BATCH_KEYS = ("max_rows", "max_bytes", "linger_s", "poll_s", "window", "turnaround")
DEFAULT_LINGER_S = 60.0
DEFAULT_POLL_S = 30.0
DEFAULT_WINDOW = "24h"
OPENAI_WINDOW = timedelta(hours=24)  # the one completion window OpenAI takes
# A pattern: a name prefix of visible ASCII (no space, no glob character) and one "*".
PATTERN = re.compile(r"([!-)+-Z^-~]+)\*")
PATTERN_EXAMPLE = "gpt-4o-mini-*"
ALIAS_KEYS = ("deployments", "patterns")


@dataclass(frozen=True, slots=True)
class BatchOptions:
    """How a batch deployment gathers rows into provider batches and follows them.

    ``max_rows`` and ``max_bytes`` cap one provider batch (its input file); rows are
    submitted once either is reached or the oldest waited ``linger_s``; a submitted
    batch is polled every ``poll_s`` (backing off while it makes no progress); the
    provider promises an answer within ``window``.
    """

    wire: str  # the realtime provider whose request builder and reply parser it uses
    max_rows: int
    max_bytes: int
    linger_s: float = DEFAULT_LINGER_S
    poll_s: float = DEFAULT_POLL_S
    window: timedelta = timedelta(hours=24)
    turnaround: timedelta = timedelta(hours=12)  # expected submit → results, declared


@dataclass(frozen=True)
class Deployment:
    """One upstream model endpoint (``batch`` is set on a batch provider's only)."""

    name: str
    provider: str
    base_url: str
    model: str
    api_key: str | None = None
    timeout_s: float = 60.0
    max_retries: int = 3
    headers: Mapping[str, str] = field(default_factory=dict)
    params: Mapping[str, Any] = field(default_factory=dict)
    price: Price | None = None  # None: unpriced (its rows have no cost)
    limit: RateLimit | None = None  # None: no shared rate limit (rpm, tpm)
    batch: BatchOptions | None = None  # None: a realtime deployment
    endpoints: frozenset[str] = frozenset({CHAT})  # the endpoints it serves
    service_tier: str | None = None  # "flex": the flex lane (see router.lane_keys)
    rows_per_s: float | None = None  # declared throughput for the planner

    @property
    def is_batch(self) -> bool:
        """Whether this deployment is a provider's batch API (never called realtime)."""
        return self.batch is not None

    @property
    def lane(self) -> Lane:
        """The lane its answers come from: batch, flex or realtime."""
        if self.batch is not None:
            return "batch"
        return "flex" if self.service_tier == FLEX else "realtime"


@dataclass(frozen=True)
class AliasTable:
    """Every alias with its deployments in fallback order, and the name prefixes of its
    ``patterns`` (``(prefix, alias)``, the longest prefix first)."""

    aliases: Mapping[str, tuple[Deployment, ...]]
    patterns: tuple[tuple[str, str], ...] = ()

    def alias_of(self, name: str) -> str | None:
        """The alias ``name`` routes to: itself when it is an alias, else the alias of
        the longest pattern prefix it starts with; None if none."""
        if name in self.aliases:
            return name
        for prefix, alias in self.patterns:
            if name.startswith(prefix):
                return alias
        return None

    def resolve(self, alias: str) -> tuple[Deployment, ...] | None:
        """The deployments ``alias`` routes to (an alias, or a name one of its patterns
        matches), or None if it is unknown."""
        found = self.aliases.get(alias)
        if found is None and self.patterns:
            canonical = self.alias_of(alias)
            found = None if canonical is None else self.aliases[canonical]
        return found

    def names(self) -> list[str]:
        """The public aliases, sorted."""
        return sorted(self.aliases)

    def batch_lead(self, alias: str) -> Deployment | None:
        """The batch deployment that leads ``alias``, or None (unknown alias, or one that
        starts with a realtime deployment)."""
        deployments = self.resolve(alias)
        if not deployments or deployments[0].batch is None:
            return None
        return deployments[0]

    def lead_patterns(self) -> list[tuple[str, str]]:
        """Each pattern prefix with the batch deployment leading its alias (``""`` for an
        alias led by a realtime one), the longest prefix first: what the offloader's
        intake matches a row's model against when it names no alias."""
        return [
            (prefix, getattr(self.batch_lead(alias), "name", "")) for prefix, alias in self.patterns
        ]

    def batch_deployments(self) -> dict[str, Deployment]:
        """Every batch deployment an alias names, by name."""
        return {
            d.name: d
            for deployments in self.aliases.values()
            for d in deployments
            if d.batch is not None
        }

    def limits(self) -> dict[str, RateLimit]:
        """The rate-limited deployments' limits by deployment name."""
        return {
            d.name: d.limit
            for deployments in self.aliases.values()
            for d in deployments
            if d.limit is not None
        }

    def realtime_references(self) -> dict[str, Price]:
        """Each deployment's *realtime reference* price by deployment name (what the
        saving against all-realtime prices its rows' tokens at): a realtime deployment's
        own price (its rows saved nothing; an unpriced one has none), and for a batch or
        flex deployment the price of the first priced realtime deployment of the first
        alias that lists it."""
        references: dict[str, Price] = {}
        for deployments in self.aliases.values():
            reference = next(
                (d.price for d in deployments if d.lane == "realtime" and d.price is not None),
                None,
            )
            for d in deployments:
                own = d.price if d.lane == "realtime" else reference
                if own is not None:
                    references.setdefault(d.name, own)
        return references

    def prices(self) -> dict[str, Price]:
        """The priced deployments' prices by deployment name (what a row-worker looks a
        row's answering deployment up in)."""
        return {
            d.name: d.price
            for deployments in self.aliases.values()
            for d in deployments
            if d.price is not None
        }


def load_aliases(path: str, env: Mapping[str, str]) -> AliasTable:
    """Read and validate a routes file; raise :class:`ConfigError` with one clear line."""
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"routes file {path!r} does not exist (RELAY_ROUTES_FILE)") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"routes file {path!r} is not valid TOML: {exc}") from None
    return parse_aliases(data, env, source=path)


def parse_aliases(data: Mapping[str, Any], env: Mapping[str, str], source: str = "") -> AliasTable:
    """Validate parsed TOML into :class:`AliasTable`."""
    where = f"routes file {source!r}: " if source else "routes: "
    raw_deployments = data.get("deployments", {})
    raw_aliases = data.get("aliases", {})
    if not isinstance(raw_deployments, dict) or not isinstance(raw_aliases, dict):
        raise ConfigError(where + "[deployments] and [aliases] must be tables")
    deployments = {
        name: _deployment(name, spec, env, where) for name, spec in raw_deployments.items()
    }
    aliases: dict[str, tuple[Deployment, ...]] = {}
    for alias, spec in raw_aliases.items():
        if isinstance(spec, dict):
            for key in spec:
                if key not in ALIAS_KEYS:
                    raise ConfigError(
                        where + f"alias {alias!r}: {key} is not an alias key"
                        f" (expected {' or '.join(ALIAS_KEYS)})"
                    )
        names = spec.get("deployments") if isinstance(spec, dict) else None
        if not isinstance(names, list) or not names:
            raise ConfigError(where + f"alias {alias!r} needs a non-empty deployments list")
        for position, name in enumerate(names):
            if name not in deployments:
                raise ConfigError(where + f"alias {alias!r} names missing deployment {name!r}")
            if position and deployments[name].batch is not None:
                raise ConfigError(
                    where + f"alias {alias!r}: batch deployment {name!r} may only come first"
                )
        aliases[alias] = tuple(deployments[n] for n in names)
    if not aliases:
        raise ConfigError(where + "no [aliases.*] defined")
    return AliasTable(aliases, _patterns(raw_aliases, where))


def _patterns(raw_aliases: Mapping[str, Any], where: str) -> tuple[tuple[str, str], ...]:
    """Every alias's ``patterns`` as ``(prefix, alias)``, the longest prefix first; a
    malformed pattern, or one given twice, is refused."""
    owner: dict[str, str] = {}
    for alias, spec in raw_aliases.items():
        patterns = spec.get("patterns", [])
        if not isinstance(patterns, list):
            raise ConfigError(
                where + f"alias {alias!r}: patterns must be a list such as [{PATTERN_EXAMPLE!r}]"
            )
        for index, pattern in enumerate(patterns):
            match = PATTERN.fullmatch(pattern) if isinstance(pattern, str) else None
            if match is None:
                raise ConfigError(
                    where + f"alias {alias!r}: patterns[{index}] must be a name prefix ending"
                    f" in one '*' (such as {PATTERN_EXAMPLE!r}), not {pattern!r}"
                )
            prefix = match.group(1)
            if prefix in owner:
                raise ConfigError(
                    where + f"pattern {pattern!r} is given by alias {owner[prefix]!r}"
                    f" and alias {alias!r}"
                )
            owner[prefix] = alias
    return tuple(sorted(owner.items(), key=lambda item: (-len(item[0]), item[0])))


def _deployment(name: str, spec: Any, env: Mapping[str, str], where: str) -> Deployment:
    if not isinstance(spec, dict):
        raise ConfigError(where + f"deployment {name!r} must be a table")
    provider = spec.get("provider")
    if provider not in PROVIDERS:
        raise ConfigError(
            where + f"deployment {name!r} has unknown provider {provider!r}"
            f" (expected one of {', '.join(sorted(PROVIDERS))})"
        )
    base_url, model = spec.get("base_url"), spec.get("model")
    if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
        raise ConfigError(where + f"deployment {name!r} needs an http(s) base_url")
    if not isinstance(model, str) or not model:
        raise ConfigError(where + f"deployment {name!r} needs a model")
    return Deployment(
        name=name,
        provider=provider,
        base_url=base_url.rstrip("/"),
        model=model,
        api_key=_api_key(name, spec.get("api_key_env"), env, where),
        timeout_s=_timeout(name, spec, where),
        max_retries=int(_number(name, spec, "max_retries", 3, where)),
        headers=_str_table(name, spec, "headers", where),
        params=dict(spec.get("params", {})),
        price=parse_price(name, spec.get("price"), where),
        limit=_limit(name, spec, where),
        batch=_batch_options(name, provider, spec, where),
        endpoints=_endpoints(name, provider, spec.get("endpoints"), where),
        service_tier=service_tier(name, provider, spec, where),
        rows_per_s=rows_per_s(name, spec, where),
    )


def _endpoints(name: str, provider: str, value: Any, where: str) -> frozenset[str]:
    """``endpoints``: a non-empty list of the endpoints Relay runs (default: chat); an
    Anthropic deployment serves chat and ``/v1/responses`` (translated) only."""
    if value is None:
        return frozenset({CHAT})
    if not isinstance(value, list) or not value or not all(v in ALL_ENDPOINTS for v in value):
        raise ConfigError(
            where + f"deployment {name!r}: endpoints must be a non-empty list of"
            f" {', '.join(ALL_ENDPOINTS)}"
        )
    if provider.startswith("anthropic"):
        others = sorted(set(value) - {CHAT, RESPONSES})
        if others:
            raise ConfigError(
                where + f"deployment {name!r}: an Anthropic deployment cannot serve"
                f" {others[0]} (only {CHAT} and {RESPONSES}, translated to Messages)"
            )
    return frozenset(value)


def _batch_options(
    name: str, provider: str, spec: dict[str, Any], where: str
) -> BatchOptions | None:
    """A batch provider's options (defaults filled in, caps enforced); a batch key on a
    realtime deployment, or a rate limit on a batch one, is refused."""
    caps = BATCH_PROVIDERS.get(provider)
    if caps is None:
        for key in BATCH_KEYS:
            if key in spec:
                raise ConfigError(
                    where + f"deployment {name!r}: {key} is only for batch providers"
                    f" ({', '.join(sorted(BATCH_PROVIDERS))})"
                )
        return None
    for key in ("rpm", "tpm"):
        if key in spec:
            raise ConfigError(
                where + f"deployment {name!r}: {key} does not apply to a batch deployment"
            )
    wire, max_rows, max_bytes = caps
    window = _window(name, spec.get("window", DEFAULT_WINDOW), where)
    if provider == "openai-batch" and window != OPENAI_WINDOW:
        raise ConfigError(
            where + f"deployment {name!r}: window must be '24h' for openai-batch (the only"
            f" completion window OpenAI takes), not {spec.get('window')!r}"
        )
    return BatchOptions(
        wire=wire,
        max_rows=_capped(name, spec, "max_rows", max_rows, where),
        max_bytes=_capped(name, spec, "max_bytes", max_bytes, where),
        linger_s=_number(name, spec, "linger_s", DEFAULT_LINGER_S, where),
        poll_s=_positive(name, spec, "poll_s", DEFAULT_POLL_S, where),
        window=window,
        turnaround=turnaround(name, spec, window, where),
    )


def _capped(name: str, spec: dict[str, Any], key: str, cap: int, where: str) -> int:
    """A positive integer no larger than the provider's ``cap`` (the default)."""
    value = spec.get(key, cap)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= cap:
        raise ConfigError(
            where + f"deployment {name!r}: {key} must be an integer from 1 to {cap}"
            f" (the provider's cap), not {value!r}"
        )
    return value


def _positive(name: str, spec: dict[str, Any], key: str, default: float, where: str) -> float:
    value = _number(name, spec, key, default, where)
    if value <= 0:
        raise ConfigError(where + f"deployment {name!r}: {key} must be greater than 0")
    return value


def _window(name: str, value: Any, where: str) -> timedelta:
    window = parse_duration(value, 6) if isinstance(value, str) else None
    if window is None or window <= timedelta(0):
        raise ConfigError(
            where + f"deployment {name!r}: window must be a duration ({SPELLING}), not {value!r}"
        )
    return window


def _limit(name: str, spec: dict[str, Any], where: str) -> RateLimit | None:
    """``rpm`` and ``tpm``: positive integers, each optional; None when neither is set."""
    values: dict[str, int | None] = {}
    for key in ("rpm", "tpm"):
        value = spec.get(key)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            raise ConfigError(
                where + f"deployment {name!r}: {key} must be a positive integer, not {value!r}"
            )
        values[key] = value
    if values["rpm"] is None and values["tpm"] is None:
        return None
    return RateLimit(rpm=values["rpm"], tpm=values["tpm"])


def _api_key(name: str, var: Any, env: Mapping[str, str], where: str) -> str | None:
    if var in (None, ""):
        return None
    if not isinstance(var, str):
        raise ConfigError(where + f"deployment {name!r}: api_key_env must be a string")
    value = env.get(var)
    if not value:
        raise ConfigError(where + f"deployment {name!r} needs environment variable {var}")
    return value


def _number(name: str, spec: dict[str, Any], key: str, default: float, where: str) -> float:
    value = spec.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ConfigError(where + f"deployment {name!r}: {key} must be a non-negative number")
    return float(value)


def _timeout(name: str, spec: dict[str, Any], where: str) -> float:
    value = _number(name, spec, "timeout_s", 60.0, where)
    if value <= 0:
        # Zero would fail every call at once (and once meant "no timeout"): refuse it.
        raise ConfigError(where + f"deployment {name!r}: timeout_s must be greater than 0")
    return value


def _str_table(name: str, spec: dict[str, Any], key: str, where: str) -> dict[str, str]:
    value = spec.get(key, {})
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise ConfigError(where + f"deployment {name!r}: {key} must be a table of strings")
    return dict(value)
