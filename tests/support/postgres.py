"""Throwaway PostgreSQL clusters from the Debian binaries (initdb + pg_ctl), on free loopback
ports, for the tests that stop, restart or fail over a server (the shared one at 5432 is never
touched): a primary configured for streaming replication, and a replica made from it with
``pg_basebackup -R -S slot``. As root (CI) the server runs as the ``postgres`` user, since
PostgreSQL refuses to run as root."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

from sqlalchemy import create_engine, text

from schema.migrate import upgrade_head
from tests.support.api import free_port
from tests.support.wait import wait_until

_VERSIONS = sorted(os.listdir("/usr/lib/postgresql")) if Path("/usr/lib/postgresql").exists() else []
PG_BIN = Path("/usr/lib/postgresql") / (_VERSIONS[-1] if _VERSIONS else "none") / "bin"
SLOT = "replica1"


def as_postgres(cmd: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


def _owned_tempdir() -> Path:
    path = Path(tempfile.mkdtemp(prefix="aidawork-pg-"))
    if os.geteuid() == 0:
        pg = pwd.getpwnam("postgres")
        os.chown(path, pg.pw_uid, pg.pw_gid)
    return path


class PgNode:
    """One throwaway server: ``primary()`` makes a new cluster, ``replica_of`` a streaming copy."""

    def __init__(self, root: Path) -> None:
        self.dir = root
        self.data = root / "data"
        self.port = free_port()

    @classmethod
    def primary(cls, *, replication: bool = False) -> PgNode:
        node = cls(_owned_tempdir())
        node._run([str(PG_BIN / "initdb"), "-D", str(node.data), "-A", "trust", "-U", "postgres", "--no-sync"])
        conf = ["listen_addresses = '127.0.0.1'", "fsync = off", "max_connections = 200"]
        if replication:
            # initdb's pg_hba.conf already trusts replication connections from loopback.
            conf += ["wal_level = replica", "max_wal_senders = 5", "max_replication_slots = 5",
                     "hot_standby = on", "wal_keep_size = '256MB'"]
        with (node.data / "postgresql.conf").open("a") as f:
            f.write("\n".join(conf) + "\n")
        node.start()
        if replication:
            node.sql(f"SELECT pg_create_physical_replication_slot('{SLOT}')")
        return node

    @classmethod
    def replica_of(cls, primary: PgNode) -> PgNode:
        """A streaming standby of ``primary`` through its replication slot (``-R`` writes
        primary_conninfo and standby.signal)."""
        node = cls(_owned_tempdir())
        node._run([str(PG_BIN / "pg_basebackup"), "-h", "127.0.0.1", "-p", str(primary.port), "-U", "postgres",
                   "-D", str(node.data), "-R", "-S", SLOT, "-X", "stream", "--no-sync", "--checkpoint=fast"])
        node.start()
        return node

    def _run(self, cmd: list[str]) -> None:
        subprocess.run(as_postgres(cmd), check=True, capture_output=True, timeout=120)

    def ctl(self, *args: str) -> None:
        self._run([str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.dir / "log"), "-w", *args])

    def start(self) -> None:
        self.ctl("-o", f"-p {self.port} -k {self.dir}", "start")

    def stop(self, mode: str = "fast") -> None:
        self.ctl("-m", mode, "stop")

    def promote(self) -> None:
        self.ctl("promote")

    def url(self, db: str) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{db}"

    def sql(self, statement: str, db: str = "postgres") -> list[tuple[object, ...]]:
        engine = create_engine(self.url(db), isolation_level="AUTOCOMMIT", poolclass=None)
        try:
            with engine.connect() as conn:
                result = conn.execute(text(statement))
                return [tuple(r) for r in result] if result.returns_rows else []
        finally:
            engine.dispose()

    def destroy(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError, subprocess.TimeoutExpired):
            self.stop("immediate")
        shutil.rmtree(self.dir, ignore_errors=True)


def multi_host_url(db: str, *nodes: PgNode) -> str:
    """The libpq multi-host URL every process is given: libpq tries the hosts in order and
    keeps the first that accepts writes, so after a promotion a new connection lands on the
    new primary without any process being reconfigured."""
    hosts = "&".join(f"host=127.0.0.1:{n.port}" for n in nodes)
    return f"postgresql+psycopg://postgres@/{db}?{hosts}&target_session_attrs=read-write"


def replicate(primary: PgNode, mode: str) -> PgNode:
    """Database ``aidawork`` migrated on ``primary``, and a replica streaming it, with
    synchronous replication (``mode`` ``remote_write``) or asynchronous (``async``)."""
    primary.sql("CREATE DATABASE aidawork")
    upgrade_head(primary.url("aidawork"))
    replica = PgNode.replica_of(primary)
    if mode == "remote_write":
        # Set after the base backup: the replica must not inherit it, or once promoted it
        # would wait for a standby of its own that does not exist.
        primary.sql("ALTER SYSTEM SET synchronous_standby_names = '*'")
        primary.sql("ALTER SYSTEM SET synchronous_commit = 'remote_write'")
        primary.sql("SELECT pg_reload_conf()")
    expected = "sync" if mode == "remote_write" else "async"
    wait_until(lambda: primary.sql("SELECT sync_state FROM pg_stat_replication") == [(expected,)],
               timeout_s=30, what=f"the replica to stream ({expected})")
    return replica
