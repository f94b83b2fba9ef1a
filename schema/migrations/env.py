"""Alembic environment. Two ways in:

- ``aidawork migrate`` (``schema.migrate``) passes the connection to migrate on, already
  holding the migration lock;
- the standard ``alembic`` commands with the repository's ``alembic.ini``: the database
  URL is read from ``AIDAWORK_DATABASE_URL`` (the same variable every process reads, see
  worker/ops/settings.py; schema/ cannot import the worker's settings), and an upgrade takes
  the same advisory lock ``aidawork migrate`` takes, so the two never migrate at once.
"""

from __future__ import annotations

import os

from alembic import context
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from schema.migrate import MIGRATE_LOCK_KEY
from schema.tables import metadata

DATABASE_URL_VAR = "AIDAWORK_DATABASE_URL"

config = context.config


def _url() -> str:
    url = config.get_main_option("sqlalchemy.url") or os.environ.get(DATABASE_URL_VAR, "")
    if not url:
        raise SystemExit(f"alembic: set {DATABASE_URL_VAR} to the database to migrate (postgresql+psycopg://...)")
    return url


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        context.configure(connection=connection, target_metadata=metadata)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = create_engine(_url(), poolclass=NullPool)  # closing the connection ends the lock's session
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT pg_advisory_lock(:key)"), {"key": MIGRATE_LOCK_KEY})
            conn.commit()
            context.configure(connection=conn, target_metadata=metadata)
            with context.begin_transaction():
                context.run_migrations()
    finally:
        engine.dispose()


run_migrations_online()
