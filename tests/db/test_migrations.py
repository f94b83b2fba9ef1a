from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, text

from schema.migrate import alembic_config
from schema.tables import metadata
from tests.support.cluster import non_json_lines
from tests.support.env import PG_BASE, REPO, admin_engine

MIGRATORS = 3


def test_upgrade_head_equals_tables_py(engine: Engine) -> None:
    # The per-test database is a copy of a template built by `alembic upgrade head`.
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True, "compare_server_default": True})
        diff = compare_metadata(context, metadata)
    assert diff == []


@pytest.fixture
def fresh_db_name(pg_template: str) -> Iterator[str]:
    """A database name nobody uses; dropped afterwards (``pg_template``: PostgreSQL is up)."""
    name = f"aidawork_m_{uuid.uuid4().hex[:12]}"
    yield name
    admin = admin_engine()
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.mark.parametrize("database", ["created_empty", "missing"])
def test_concurrent_migrate_commands_all_succeed_and_migrate_once(fresh_db_name: str, database: str) -> None:
    if database == "created_empty":
        admin = admin_engine()
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{fresh_db_name}"'))
        admin.dispose()
    url = f"{PG_BASE}/{fresh_db_name}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIDAWORK_")}
    env["AIDAWORK_DATABASE_URL"] = url
    migrators = [
        subprocess.Popen(
            [sys.executable, "-m", "worker.cli", "migrate"],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for _ in range(MIGRATORS)
    ]
    outputs = [m.communicate(timeout=120)[0].decode(errors="replace") for m in migrators]

    assert [m.returncode for m in migrators] == [0] * MIGRATORS, outputs
    # Our lines and Alembic's alike: JSON objects only, on stdout and stderr.
    assert [non_json_lines(out) for out in outputs] == [[]] * MIGRATORS, outputs
    assert all('"event": "database_migrated"' in out for out in outputs), outputs
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            assert [r[0] for r in conn.execute(text("SELECT version_num FROM alembic_version"))] == [head]
            context = MigrationContext.configure(conn, opts={"compare_type": True, "compare_server_default": True})
            assert compare_metadata(context, metadata) == []
    finally:
        engine.dispose()
