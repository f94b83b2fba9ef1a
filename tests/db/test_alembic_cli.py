"""The standard ``alembic`` commands work on the project's migrations with the
repository's alembic.ini, the database named by AIDAWORK_DATABASE_URL."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, text

from schema.migrate import alembic_config
from tests.support.db import rows
from tests.support.env import PG_BASE, REPO, admin_engine

ALEMBIC = Path(sys.executable).parent / "alembic"  # the console script of this environment


@pytest.fixture
def empty_db_url(pg_template: str) -> Iterator[str]:
    """A new, empty database (no tables, no alembic_version); dropped afterwards."""
    name = f"aidawork_a_{uuid.uuid4().hex[:12]}"
    admin = admin_engine()
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    yield f"{PG_BASE}/{name}"
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def alembic(db_url: str | None, *args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIDAWORK_")}
    if db_url is not None:
        env["AIDAWORK_DATABASE_URL"] = db_url
    command = [str(ALEMBIC), "-c", str(REPO / "alembic.ini"), *args]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_alembic_upgrade_head_then_current_shows_the_head_revision(empty_db_url: str, tmp_path: Path) -> None:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert alembic(empty_db_url, "current").stdout.strip() == ""  # nothing applied yet

    upgraded = alembic(empty_db_url, "upgrade", "head", cwd=tmp_path)  # from anywhere: paths are the ini's
    assert upgraded.returncode == 0, upgraded.stderr

    current = alembic(empty_db_url, "current")
    assert current.returncode == 0, current.stderr
    assert current.stdout.strip() == f"{head} (head)"
    history = alembic(empty_db_url, "history")
    assert history.returncode == 0 and f"-> {head} (head)" in history.stdout, history.stdout

    engine = create_engine(empty_db_url)
    try:
        assert rows(engine, "SELECT version_num FROM alembic_version") == [{"version_num": head}]
    finally:
        engine.dispose()


def test_alembic_without_the_database_url_says_which_variable_to_set() -> None:
    done = alembic(None, "current")
    assert done.returncode != 0
    assert "AIDAWORK_DATABASE_URL" in done.stderr and "Traceback" not in done.stderr
