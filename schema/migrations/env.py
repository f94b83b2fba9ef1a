"""Alembic environment: runs migrations on the connection (or URL) that
``schema.migrate`` passes in; there is no alembic.ini."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from schema.tables import metadata

config = context.config


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        context.configure(connection=connection, target_metadata=metadata)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = create_engine(config.get_main_option("sqlalchemy.url") or "")
    with engine.connect() as conn:
        context.configure(connection=conn, target_metadata=metadata)
        with context.begin_transaction():
            context.run_migrations()


run_migrations_online()
