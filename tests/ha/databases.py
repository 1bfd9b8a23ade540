"""Postgres with a hot standby on this machine, from Debian's Postgres binaries.

Two clusters of their own (``initdb`` under a temporary folder, run as ``postgres``, on
their own ports and socket folder; the machine's own cluster on 5432 is never touched):
a primary with synchronous replication (``synchronous_standby_names = '*'``: a commit
returns once the standby has flushed it, so a promoted standby has every committed
transaction) and a standby made by ``pg_basebackup -R``, streaming from it. Failing over
is what an operator (or Patroni) does: stop the primary, promote the standby.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

PG_BIN = Path("/usr/lib/postgresql/15/bin")
TIMEOUT_S = 180


def _as_postgres(*command: str, timeout: float = TIMEOUT_S) -> str:
    done = subprocess.run(
        ["runuser", "-u", "postgres", "--", *command],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd="/",
    )
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed: {done.stdout}{done.stderr}")
    return done.stdout


@dataclass
class PgPair:
    """A primary on ``ports[0]`` and its standby on ``ports[1]``, under ``base``."""

    base: Path
    ports: tuple[int, int]

    def _dir(self, n: int) -> Path:
        return self.base / f"pg-{n}"

    @property
    def sockets(self) -> Path:
        """The clusters' socket folder."""
        return self.base / "pg-sockets"

    def database_url(self, database: str) -> str:
        """``RELAY_DATABASE_URL`` for ``database``: both hosts, read-write wanted."""
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.ports)
        return f"postgresql://postgres@{hosts}/{database}?target_session_attrs=read-write"

    def _ctl(self, n: int, *args: str) -> str:
        port = self.ports[n]
        options = f"-p {port} -k {self.sockets}"
        return _as_postgres(
            str(PG_BIN / "pg_ctl"), "-D", str(self._dir(n)), "-o", options,
            "-l", str(self.base / f"pg-{n}.log"), "-w", "-t", str(TIMEOUT_S), *args,
        )  # fmt: skip

    def start(self) -> None:
        """Make and start the primary, then copy it into a standby and start that."""
        self.base.chmod(0o755)
        self.sockets.mkdir()
        shutil.chown(self.sockets, "postgres", "postgres")
        primary = self._dir(0)
        primary.mkdir()
        shutil.chown(primary, "postgres", "postgres")
        _as_postgres(str(PG_BIN / "initdb"), "-D", str(primary), "-U", "postgres",
                     "--auth=trust", "--no-sync")  # fmt: skip
        with open(primary / "postgresql.conf", "a") as conf:
            conf.write(
                "listen_addresses = '127.0.0.1'\n"
                "synchronous_standby_names = '*'\n"
                "max_connections = 200\n"
                "fsync = on\n"
            )
        (self.base / "pg-0.log").touch()
        shutil.chown(self.base / "pg-0.log", "postgres", "postgres")
        (self.base / "pg-1.log").touch()
        shutil.chown(self.base / "pg-1.log", "postgres", "postgres")
        self._ctl(0, "start")
        standby = self._dir(1)
        standby.mkdir(mode=0o700)
        shutil.chown(standby, "postgres", "postgres")
        _as_postgres(str(PG_BIN / "pg_basebackup"), "-h", "127.0.0.1", "-p", str(self.ports[0]),
                     "-U", "postgres", "-D", str(standby), "-R", "-X", "stream",
                     "--checkpoint=fast")  # fmt: skip
        # Promoted, it waits for no standby of its own.
        with open(standby / "postgresql.conf", "a") as conf:
            conf.write("synchronous_standby_names = ''\n")
        self._ctl(1, "start")

    def streaming(self) -> bool:
        """True while the primary has a synchronous standby streaming from it."""
        out = self.psql(0, "SELECT count(*) FROM pg_stat_replication"
                           " WHERE state = 'streaming' AND sync_state = 'sync'")  # fmt: skip
        return out.strip() == "1"

    def psql(self, n: int, sql: str) -> str:
        """One query on cluster ``n``, its unaligned output."""
        return _as_postgres(str(PG_BIN / "psql"), "-h", "127.0.0.1", "-p", str(self.ports[n]),
                            "-U", "postgres", "-At", "-c", sql, "postgres")  # fmt: skip

    def stop_primary(self) -> None:
        """Stop the primary at once (``immediate``: as a crash leaves it)."""
        self._ctl(0, "stop", "-m", "immediate")

    def promote_standby(self) -> None:
        """Promote the standby and wait until it accepts writes."""
        self._ctl(1, "promote")

    def stop(self) -> None:
        """Stop both clusters (whichever still run)."""
        for n in (0, 1):
            if (self._dir(n) / "postmaster.pid").exists():
                try:
                    self._ctl(n, "stop", "-m", "immediate")
                except RuntimeError:
                    pass
