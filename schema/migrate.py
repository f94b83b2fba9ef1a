"""Running the Alembic migrations from code (``aidawork migrate``).

Safe to run concurrently (every replica's start-up may run it): creating the database
tolerates another migrator creating it first, and the upgrade runs under a
session-level advisory lock on a fixed key, taken on the very connection Alembic
migrates with. The lock is held across the migration transaction's COMMIT, so the next
migrator reads ``alembic_version`` only once the schema is committed, finds it at head,
and does nothing.

A revision that breaks older code declares ``requires_code_level`` (``schema.store.compat``):
before anything is applied, under the same lock, the upgrade is refused while a live worker
(a fresh heartbeat, never stopped) runs code of a lower level, unless ``force``.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import NullPool

from schema.store.compat import SchemaIncompatible, live_workers_below_txn
from schema.store.tx import sqlstate_of

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
# Any fixed bigint; the same in every version of the project, so old and new migrators
# exclude each other too. Advisory locks are per database: one key serves every database.
MIGRATE_LOCK_KEY = 0x6169_6461_776F_726B  # "aidawork"
# CREATE DATABASE racing another: duplicate_database, or the catalog's unique index.
_ALREADY_CREATED = frozenset({"42P04", "23505"})


def alembic_config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    return cfg


def ensure_database(url: str) -> bool:
    """Create the database named in ``url`` if it does not exist (a new user's first
    ``aidawork migrate`` should just work). Returns True if it was created."""
    target = make_url(url)
    admin = create_engine(target.set(database="postgres"), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            exists = conn.execute(
                text("SELECT 1 FROM pg_database WHERE datname = :name"), {"name": target.database}
            ).scalar()
            if exists:
                return False
            try:
                conn.execute(text(f'CREATE DATABASE "{target.database}"'))
            except DBAPIError as exc:
                if sqlstate_of(exc) not in _ALREADY_CREATED:
                    raise
                return False  # another migrator created it a moment ago
            return True
    finally:
        admin.dispose()


def pending_code_level(conn: Connection, cfg: Config) -> tuple[int, str | None]:
    """The highest ``requires_code_level`` of the revisions not yet applied, and a revision
    that declares it (0 and None: no pending revision breaks older code)."""
    applied = MigrationContext.configure(conn).get_current_heads()
    pending = ScriptDirectory.from_config(cfg).iterate_revisions("heads", applied or ())
    declared = [(int(getattr(s.module, "requires_code_level", 0)), s.revision) for s in pending]
    level, revision = max(declared, default=(0, None))
    return (level, revision) if level > 0 else (0, None)


def refuse_breaking(conn: Connection, cfg: Config, *, live_s: float) -> None:
    """``SchemaIncompatible`` when a pending revision needs a higher code level than a live
    worker runs (nothing applied)."""
    level, revision = pending_code_level(conn, cfg)
    if level == 0:
        return
    below = live_workers_below_txn(conn, level, live_s=live_s)
    if not below:
        return
    names = ", ".join(f"{w.name} (level {w.code_level})" for w in below)
    raise SchemaIncompatible(
        f"migration {revision} needs workers of compatibility level {level} or higher, but {len(below)} live "
        f"worker(s) run an older level: {names}. Stop them first (SIGTERM: they finish their rounds), or run "
        f"`aidawork migrate --force`: they then stop claiming and shut down",
        code_level=min(w.code_level for w in below),
        schema_level=level,
    )


def upgrade_head(url: str, *, force: bool = False, live_s: float = 60.0) -> None:
    """Upgrade to the newest revision. ``live_s``: a worker that heartbeat within it is live
    (the lease); ``force``: apply a revision that breaks live workers all the same."""
    engine = create_engine(url, poolclass=NullPool)  # closing the connection ends the session
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT pg_advisory_lock(:key)"), {"key": MIGRATE_LOCK_KEY})
            conn.commit()  # the lock is the session's, not this transaction's
            with conn.begin():
                cfg = alembic_config()
                cfg.attributes["connection"] = conn
                if not force:
                    refuse_breaking(conn, cfg, live_s=live_s)
                command.upgrade(cfg, "head")
            # On an error the connection is closed instead, which ends the session and its lock.
            conn.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": MIGRATE_LOCK_KEY})
            conn.commit()
    finally:
        engine.dispose()
