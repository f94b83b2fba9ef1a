from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Engine

from schema.tables import metadata


def test_upgrade_head_equals_tables_py(engine: Engine) -> None:
    # The per-test database is a copy of a template built by `alembic upgrade head`.
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True, "compare_server_default": True})
        diff = compare_metadata(context, metadata)
    assert diff == []
