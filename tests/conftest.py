"""Fixtures only (what tests share otherwise is in tests/support).

Tiers, selected by path or by marker (each test is marked by the folder it is in):
- tests/unit: no services (``-m "not db and not e2e and not docs"``);
- tests/db (``-m db``): real PostgreSQL, a fresh database per test copied from a template
  migrated once per session (``CREATE DATABASE ... TEMPLATE`` is fast); no Redis: tasks the
  code sends go to a recording broker (``broker``);
- tests/e2e (``-m e2e``, fixtures in tests/e2e/conftest.py): also real Redis (a flushed
  test database) and real ``aidawork worker`` / ``beat`` / ``api`` processes;
- tests/docs (``-m docs``, ``make docs-test``): the examples of README.md and docs/, run
  against real PostgreSQL, Redis and worker processes (tests/docs/blocks.py).

When ``CI`` is set, a missing PostgreSQL or Redis fails the tests instead of skipping.

Two tiers of time (``make test``, ``make test-slow``): the few storm tests are marked
``slow`` and only ``make test-slow`` runs them, alone; ``make test`` runs the rest with
pytest-xdist (``-n 2 --dist loadfile``). Each xdist worker has its own Redis database
(tests/support/env.py), PostgreSQL template and port block (tests/support/api.py); a test
file goes to one worker whole, so its module-scoped fixtures (the docs tier's stack, a built
site) are built once and its tests run in the order they are written.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text

from schema.store.tx import make_engine
from tests.support import docs_summary
from tests.support.env import PG_BASE, admin_engine, make_context, unavailable
from tests.support.fakes import RecordingBroker

TEMPLATE_DB = f"aidawork_test_template_{os.getpid()}"  # one per session: sessions may overlap
TIERS = ("db", "e2e", "docs")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        tier = Path(item.path).parent.name
        if tier in TIERS:
            item.add_marker(getattr(pytest.mark, tier))


# The docs tier's summary, printed by the process that reports (the xdist controller, which
# loads this conftest but not tests/docs/conftest.py).


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    docs_summary.record(report)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    docs_summary.write(terminalreporter)


@pytest.fixture(scope="session")
def pg_template() -> Iterator[str]:
    from schema.migrate import upgrade_head

    try:
        admin = admin_engine()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{TEMPLATE_DB}" WITH (FORCE)'))
            conn.execute(text(f'CREATE DATABASE "{TEMPLATE_DB}"'))
    except Exception as exc:
        unavailable("PostgreSQL", exc)
    upgrade_head(f"{PG_BASE}/{TEMPLATE_DB}")
    yield TEMPLATE_DB
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{TEMPLATE_DB}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture
def db_url(pg_template: str) -> Iterator[str]:
    name = f"aidawork_t_{uuid.uuid4().hex[:12]}"
    admin = admin_engine()
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{pg_template}"'))
    yield f"{PG_BASE}/{name}"
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    eng = make_engine(db_url, pool_size=8)
    yield eng
    eng.dispose()


@pytest.fixture
def broker() -> RecordingBroker:
    """Every task the db tier's context sends is recorded here instead of reaching Redis."""
    return RecordingBroker()


@pytest.fixture
def ctx(db_url: str, broker: RecordingBroker) -> Iterator[Any]:
    """An in-process context (client side) on the test database; what it sends is recorded
    by ``broker`` (tests/e2e overrides this with one on the real broker)."""
    from worker.ops.celery_app import Dispatcher

    base = make_context(db_url)
    # No Redis: tasks go to the recording broker and no model deltas are published.
    context = replace(base, dispatch=Dispatcher(broker, base.settings.round_queues), deltas=None)  # type: ignore[arg-type]
    yield context
    context.leases.stop()  # a context that claimed rounds registered itself and heartbeats
    context.engine.dispose()
