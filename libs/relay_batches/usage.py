"""``--help`` for the service commands: they take no arguments, only ``RELAY_*`` settings.

A service's ``main`` calls :func:`answer_help` first, so ``relay-row-worker --help`` prints
what the command is and exits 0 instead of starting the service.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

HELP_FLAGS = frozenset({"-h", "--help"})


def usage(prog: str, summary: str) -> str:
    """The help text of command ``prog``."""
    return (
        f"usage: {prog}\n\n{summary}\n\n"
        "Takes no arguments: every setting is a RELAY_* environment variable (see\n"
        "docs/operations/configuration.md). SIGTERM or SIGINT drains in-flight work and\n"
        "exits 0.\n"
    )


def answer_help(prog: str, summary: str, argv: Sequence[str] | None = None) -> None:
    """Print :func:`usage` and exit 0 when ``argv`` (default: ``sys.argv[1:]``) asks for it."""
    args = sys.argv[1:] if argv is None else argv
    if HELP_FLAGS.intersection(args):
        sys.stdout.write(usage(prog, summary))
        sys.exit(0)
