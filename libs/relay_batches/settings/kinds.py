"""The kinds of value a setting takes: how its text is read and checked, what the
configuration page says of it, and how the start-up log shows it.

A kind reads a variable's text (``read``); unset or empty (or blank, for a kind that drops
surrounding space), the setting keeps its default.
A bad value raises :class:`ConfigError` with one line naming the variable. A kind that
bounds one setting by another (``at_most``, ``count``) names that other variable; the
loader hands it the values read so far (``earlier``, by variable name), so the other is
declared first.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, ClassVar
from urllib.parse import urlsplit

from relay_batches.durations import SPELLING, format_duration, parse_duration
from relay_batches.netguard import parse_networks

RETENTION_MAX_DIGITS = 6  # 999999d at most: far beyond any retention, and no overflow
MAX_PORT = 65535

Earlier = Mapping[str, Any]  # the values read so far, by variable name


class ConfigError(Exception):
    """A setting has a value the service cannot start with."""


class Kind(ABC):
    """How one setting's text becomes its value."""

    type_name: ClassVar[str] = "text"
    strips: ClassVar[bool] = False  # surrounding space is dropped, and blank is unset

    def type_text(self) -> str:
        """What the value is, for the configuration page."""
        return self.type_name

    def read(self, name: str, raw: str | None, default: Any, earlier: Earlier) -> Any:
        """The value of variable ``name`` whose text is ``raw`` (None: unset)."""
        text = raw.strip() if raw is not None and self.strips else raw
        if text is None or text == "":
            return self.unset(default, earlier)
        return self.parse(name, text, default, earlier)

    def unset(self, default: Any, earlier: Earlier) -> Any:
        """The value when the variable is unset or empty: its default."""
        return default

    @abstractmethod
    def parse(self, name: str, raw: str, default: Any, earlier: Earlier) -> Any:
        """The value of a non-empty ``raw``; :class:`ConfigError` when it is not one."""

    def bounds(self) -> str:
        """What values are accepted, for the configuration page ("" when any)."""
        return ""

    def shown(self, value: Any) -> object:
        """``value`` as the start-up log shows it."""
        return value

    def text(self, value: Any) -> str:
        """``value`` as the configuration page writes it (Markdown; "" for None)."""
        return "" if value is None else f"`{value}`"


@dataclass(frozen=True)
class Text(Kind):
    """Any text, as given (``upper``: upper-cased)."""

    upper: bool = False

    def parse(self, name: str, raw: str, default: Any, earlier: Earlier) -> Any:
        """The text (upper-cased if so declared)."""
        return raw.upper() if self.upper else raw


@dataclass(frozen=True)
class Stripped(Text):
    """Text without its surrounding space; blank is unset."""

    strips = True


@dataclass(frozen=True)
class Url(Text):
    """A URL whose password the start-up log masks."""

    type_name = "URL"

    def shown(self, value: Any) -> object:
        """The URL with its password replaced by ``***``."""
        return mask_url(str(value))


@dataclass(frozen=True)
class Choice(Kind):
    """One of a few words."""

    allowed: tuple[str, ...]
    type_name = "choice"

    def parse(self, name: str, raw: str, default: Any, earlier: Earlier) -> Any:
        """``raw`` if it is one of :attr:`allowed`."""
        if raw not in self.allowed:
            raise ConfigError(f"{name} must be one of {', '.join(self.allowed)}, got {raw!r}")
        return raw

    def bounds(self) -> str:
        """The allowed words."""
        return " or ".join(f"`{word}`" for word in self.allowed)


@dataclass(frozen=True)
class Namespace(Kind):
    """A prefix of bus names: letters, digits, ``-`` and ``_``."""

    def parse(self, name: str, raw: str, default: Any, earlier: Earlier) -> Any:
        """``raw`` if it holds only letters, digits, ``-`` and ``_``."""
        if not raw.replace("_", "").replace("-", "").isalnum():
            raise ConfigError(f"{name} may hold letters, digits, '-' and '_', got {raw!r}")
        return raw

    def bounds(self) -> str:
        """The characters allowed."""
        return "letters, digits, `-`, `_`"


def _integer(name: str, raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be an integer, got {raw!r}") from None


@dataclass(frozen=True)
class Int(Kind):
    """An integer from ``low`` to ``high`` (None: unbounded).

    ``clamp``: a value outside is brought within; otherwise one below ``low`` is refused
    (naming the text given, or with ``show_value`` the number read). ``at_most``: another
    variable this one may not exceed when set, and follows down when unset. ``unit``:
    "bytes" writes the default in KiB/MiB on the configuration page too.
    """

    low: int | None = None
    high: int | None = None
    clamp: bool = True
    show_value: bool = False
    at_most: str | None = None
    unit: str = ""

    def type_text(self) -> str:
        """The unit the integer counts, else ``integer``."""
        return self.unit or "integer"

    def unset(self, default: Any, earlier: Earlier) -> Any:
        """The default, lowered to :attr:`at_most`'s value when that is lower."""
        limit = earlier[self.at_most] if self.at_most else None
        return default if limit is None or default is None else min(default, limit)

    def parse(self, name: str, raw: str, default: Any, earlier: Earlier) -> Any:
        """The integer, clamped or checked against the bounds."""
        value = _integer(name, raw)
        if self.clamp:
            value = value if self.low is None else max(self.low, value)
            return value if self.high is None else min(self.high, value)
        if self.low is not None and value < self.low:
            got = value if self.show_value else repr(raw)
            raise ConfigError(f"{name} must be {self.low} or more, got {got}")
        limit = earlier[self.at_most] if self.at_most else None
        if limit is not None and value > limit:
            raise ConfigError(f"{name} ({value}) exceeds {self.at_most} ({limit})")
        return value

    def bounds(self) -> str:
        """The range, and whether a value outside it is clamped or refused."""
        if self.low is None and self.high is None:
            return ""
        if self.high is None:
            text = f"≥ {self.low}"
        elif self.low is None:
            text = f"≤ {self.high}"
        else:
            text = f"{self.low}–{self.high}"
        text += " (clamped)" if self.clamp else ""
        return f"{text}, ≤ `{self.at_most}`" if self.at_most else text

    def text(self, value: Any) -> str:
        """The number, with its size in KiB/MiB for bytes."""
        if value is None or self.unit != "bytes" or value < 1024 or value % 1024:
            return super().text(value)
        size = f"{value // 1024**2} MiB" if value % 1024**2 == 0 else f"{value // 1024} KiB"
        return f"`{value}` ({size})"


@dataclass(frozen=True)
class Number(Kind):
    """A number; ``positive``: above 0 (and not NaN); ``finite``: not infinite either."""

    positive: bool = False
    finite: bool = False
    type_name = "number"

    def parse(self, name: str, raw: str, default: Any, earlier: Earlier) -> Any:
        """The number, checked."""
        try:
            value = float(raw)
        except ValueError:
            raise ConfigError(f"{name} must be a number, got {raw!r}") from None
        if (self.positive or self.finite) and not value > 0:
            raise ConfigError(f"{name} must be a number above 0, got {raw!r}")
        if self.finite and math.isinf(value):
            raise ConfigError(f"{name} must be a finite number above 0, got {raw!r}")
        return value

    def text(self, value: Any) -> str:
        """The number, without a ``.0``."""
        return number_text(value)

    def bounds(self) -> str:
        """Above 0 (and finite), or nothing."""
        if self.finite:
            return "> 0, finite"
        return "> 0" if self.positive else ""


@dataclass(frozen=True)
class Within(Kind):
    """A number from ``low`` to ``high`` (surrounding space ignored); ``whole``: its
    integer part is kept."""

    strips = True

    low: float
    high: float
    whole: bool = False

    def type_text(self) -> str:
        """``integer`` when whole, else ``number``."""
        return "integer" if self.whole else "number"

    def parse(self, name: str, raw: str, default: Any, earlier: Earlier) -> Any:
        """The number, checked against the range."""
        try:
            value = float(raw)
        except ValueError:
            raise ConfigError(f"{name} must be a number, got {raw!r}") from None
        if not self.low <= value <= self.high:
            raise ConfigError(f"{name} must be within {self.low:g}..{self.high:g}, got {raw!r}")
        return int(value) if self.whole else value

    def text(self, value: Any) -> str:
        """The number, without a ``.0``."""
        return number_text(value)

    def bounds(self) -> str:
        """The range."""
        return f"{grouped(self.low)}–{grouped(self.high)}"


@dataclass(frozen=True)
class Whole(Within):
    """A whole number written in digits only (no sign, point or exponent), from ``low`` to
    ``high``."""

    whole: bool = True

    def parse(self, name: str, raw: str, default: Any, earlier: Earlier) -> Any:
        """The number, checked against the range."""
        short = raw.isascii() and raw.isdigit() and len(raw) <= len(str(self.high))
        if not short or not self.low <= int(raw) <= self.high:
            raise ConfigError(
                f"{name} must be a whole number from {self.low} to {self.high:_}, got {raw!r}"
            )
        return int(raw)


@dataclass(frozen=True)
class Port(Kind):
    """A TCP port: 0 (any free port) to 65535."""

    strips = True
    type_name = "port"

    def parse(self, name: str, raw: str, default: Any, earlier: Earlier) -> Any:
        """The port number."""
        if not (raw.isascii() and raw.isdigit() and len(raw) <= 5) or int(raw) > MAX_PORT:
            raise ConfigError(f"{name} must be a port number 0..{MAX_PORT}, got {raw!r}")
        return int(raw)

    def bounds(self) -> str:
        """The range; 0 picks a free port."""
        return f"0–{MAX_PORT} (0: any free port)"


@dataclass(frozen=True)
class Duration(Kind):
    """A duration above 0 written ``<n>s``, ``<n>m``, ``<n>h`` or ``<n>d``."""

    type_name = "duration"

    def parse(self, name: str, raw: str, default: Any, earlier: Earlier) -> Any:
        """The duration."""
        value = parse_duration(raw, RETENTION_MAX_DIGITS)
        if value is None or value <= timedelta(0):
            raise ConfigError(f"{name} must be a duration above 0 ({SPELLING}), got {raw!r}")
        return value

    def bounds(self) -> str:
        """The grammar."""
        return "> 0: `<n>s`, `<n>m`, `<n>h` or `<n>d`"

    def shown(self, value: Any) -> object:
        """Seconds."""
        return value.total_seconds()

    def text(self, value: Any) -> str:
        """In the grammar (``30d``)."""
        return f"`{format_duration(value)}`"


@dataclass(frozen=True)
class Networks(Kind):
    """Comma-separated CIDRs (or bare addresses)."""

    type_name = "CIDR list"

    def parse(self, name: str, raw: str, default: Any, earlier: Earlier) -> Any:
        """The networks."""
        try:
            return parse_networks(raw)
        except ValueError as exc:
            raise ConfigError(f"{name} must be comma-separated CIDRs: {exc}") from None

    def shown(self, value: Any) -> object:
        """Each network as text."""
        return [str(network) for network in value]

    def text(self, value: Any) -> str:
        """Comma-separated."""
        return f"`{','.join(str(network) for network in value)}`" if value else ""


@dataclass(frozen=True)
class Shards(Kind):
    """Comma-separated shard numbers, each below the variable ``count`` names (sorted,
    without repeats); empty: every shard."""

    strips = True
    type_name = "shard list"

    count: str

    def parse(self, name: str, raw: str, default: Any, earlier: Earlier) -> Any:
        """The shards, sorted."""
        count = earlier[self.count]
        parts = [part.strip() for part in raw.split(",")]
        if not all(p.isascii() and p.isdigit() and int(p) < count for p in parts):
            raise ConfigError(
                f"{name} must be comma-separated shard numbers 0..{count - 1}"
                f" ({self.count} is {count}), got {raw!r}"
            )
        return tuple(sorted({int(p) for p in parts}))

    def bounds(self) -> str:
        """Each below the shard count."""
        return f"each < `{self.count}`"

    def text(self, value: Any) -> str:
        """Comma-separated."""
        return f"`{','.join(str(shard) for shard in value)}`" if value else ""


@dataclass(frozen=True)
class BaseUrl(Kind):
    """An absolute http(s) URL without query or fragment, its trailing ``/`` removed."""

    strips = True
    type_name = "URL"

    def parse(self, name: str, raw: str, default: Any, earlier: Earlier) -> Any:
        """The URL without its trailing ``/``."""
        parts = urlsplit(raw)
        if (
            parts.scheme not in ("http", "https")
            or not parts.hostname
            or parts.query
            or parts.fragment
        ):
            raise ConfigError(
                f"{name} must be an http(s) URL like https://relay.example.com, got {raw!r}"
            )
        try:
            _ = parts.port  # a port out of range raises here
        except ValueError:
            raise ConfigError(f"{name} has an invalid port, got {raw!r}") from None
        return raw.rstrip("/")

    def bounds(self) -> str:
        """http(s), no query or fragment."""
        return "http(s), no query or fragment"


def number_text(value: float) -> str:
    """``value`` in code, a whole number without a ``.0``."""
    return f"`{int(value)}`" if float(value).is_integer() else f"`{value}`"


def grouped(value: float) -> str:
    """``value`` with commas between thousands, a whole number without a ``.0``."""
    return f"{int(value):,}" if float(value).is_integer() else str(value)


def mask_url(url: str) -> str:
    """``url`` with the password of its credentials replaced by ``***`` (each URL's, in a
    comma-separated list of them: a broker's nodes)."""
    if "," in url:
        return ",".join(mask_url(part) for part in url.split(","))
    if "@" not in url or "://" not in url:
        return url
    scheme, rest = url.split("://", 1)
    creds, host = rest.rsplit("@", 1)
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}"
