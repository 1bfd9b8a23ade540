"""Reaching Postgres and RabbitMQ at start-up: a failure becomes :class:`Unreachable`,
whose :meth:`~Unreachable.line` names the variable, the address tried (password masked)
and the cause, the one line a service (``run_service``), ``relay dev`` and ``relay
migrate`` print before exiting with :data:`EXIT_UNREACHABLE`."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from relay_batches.settings.kinds import mask_url

EXIT_UNREACHABLE = 2
DATABASE = ("Postgres", "RELAY_DATABASE_URL")
BROKER = ("RabbitMQ", "RELAY_AMQP_URL")


class Unreachable(ConnectionError):
    """A dependency could not be reached (or refused us) when a process started."""

    def __init__(self, what: tuple[str, str], url: str, cause: BaseException) -> None:
        self.name, self.variable = what
        self.address = mask_url(url)
        self.cause = cause
        super().__init__(self.line())

    def line(self) -> str:
        """``cannot reach Postgres at postgresql://u:***@db:5432/relay (RELAY_DATABASE_URL):
        ConnectionRefusedError: …``."""
        reason = " ".join(str(self.cause).split()) or "no detail"
        return (
            f"cannot reach {self.name} at {self.address} ({self.variable}):"
            f" {type(self.cause).__name__}: {reason}"
        )


@contextlib.asynccontextmanager
async def reaching(what: tuple[str, str], url: str) -> AsyncIterator[None]:
    """Any error of the block (a connect) as :class:`Unreachable` of ``what`` at ``url``;
    a cancellation passes through."""
    try:
        yield
    except Unreachable:
        raise
    except Exception as exc:
        raise Unreachable(what, url, exc) from exc
