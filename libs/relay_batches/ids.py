"""Identifiers: 32-character lowercase hex strings, as docs/api/index.md specifies."""

import re
import secrets

_ID_PATTERN = re.compile(r"^[0-9a-f]{32}$")


def new_id() -> str:
    """Return a fresh random 32-hex id (128 bits from the OS CSPRNG)."""
    return secrets.token_hex(16)


def is_valid_id(value: str) -> bool:
    """Tell whether ``value`` has the shape of a Relay id."""
    return bool(_ID_PATTERN.match(value))
