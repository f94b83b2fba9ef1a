"""Running the Alembic migrations from code (``aidawork migrate``).

Safe to run concurrently (every replica's start-up may run it): creating the database
tolerates another migrator creating it first, and the upgrade runs under a
session-level advisory lock on a fixed key, taken on the very connection Alembic
migrates with. The lock is held across the migration transaction's COMMIT, so the next
migrator reads ``alembic_version`` only once the schema is committed, finds it at head,
and does nothing.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import NullPool

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


def upgrade_head(url: str) -> None:
    engine = create_engine(url, poolclass=NullPool)  # closing the connection ends the session
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT pg_advisory_lock(:key)"), {"key": MIGRATE_LOCK_KEY})
            conn.commit()  # the lock is the session's, not this transaction's
            with conn.begin():
                cfg = alembic_config()
                cfg.attributes["connection"] = conn
                command.upgrade(cfg, "head")
            # On an error the connection is closed instead, which ends the session and its lock.
            conn.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": MIGRATE_LOCK_KEY})
            conn.commit()
    finally:
        engine.dispose()
