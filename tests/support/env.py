"""Where the test services are, read once. Nothing is set in the environment: the tests
pass ``BROKER_URL`` (the test Redis database) to every ``Settings`` they build.

``AIDAWORK_TEST_REDIS_DB`` picks the Redis database (default 9); under pytest-xdist
(``make test`` runs ``-n 2``) each worker process takes its own, the base plus its index
(``gw0`` 9, ``gw1`` 10), since the e2e tests flush theirs. ``AIDAWORK_TEST_BROKER_URL``
replaces the whole URL, e.g. with a closed port to prove a tier needs no Redis (run such a
session with ``-n 0``: every worker would share it).
``AIDAWORK_TEST_PG`` is the PostgreSQL server the per-test databases are created on (each
test's database has a random name, each session's template its process id: nothing else
is shared between xdist workers)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine


def xdist_index() -> int:
    """This process's pytest-xdist worker index (``gw3`` is 3), 0 without xdist."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0


TEST_REDIS_DB = str(int(os.environ.get("AIDAWORK_TEST_REDIS_DB", "9")) + xdist_index())
if int(TEST_REDIS_DB) > 15:  # Redis has 16 databases unless configured otherwise
    raise RuntimeError(f"the test Redis database would be {TEST_REDIS_DB} (AIDAWORK_TEST_REDIS_DB plus the "
                       "xdist worker index): pick a lower AIDAWORK_TEST_REDIS_DB or fewer workers (-n)")
BROKER_URL = os.environ.get("AIDAWORK_TEST_BROKER_URL", f"redis://127.0.0.1:6379/{TEST_REDIS_DB}")
PG_BASE = os.environ.get("AIDAWORK_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432")
REPO = Path(__file__).resolve().parent.parent.parent

# Timings for tests: short leases so crash recovery takes seconds, not minutes.
FAST_ENV = {
    "AIDAWORK_LEASE_S": "2",
    "AIDAWORK_DISPATCH_GRACE_S": "1",
    "AIDAWORK_RECONCILE_INTERVAL_S": "0.5",
    "AIDAWORK_LOG_LEVEL": "INFO",
    # The in-process test context signs with the development secret; so do the workers.
    "AIDAWORK_DEV": "1",
}

def default_timings() -> dict[str, str]:
    """FAST_ENV's timings put back to their defaults, and the dead-worker ones stated: for
    the processes of a test that measures recovery as a deployment would see it."""
    from worker.ops.settings import Settings

    names = ("lease_s", "dispatch_grace_s", "reconcile_interval_s", "worker_heartbeat_s", "worker_dead_after_s")
    return {f"AIDAWORK_{n.upper()}": str(Settings.model_fields[n].default) for n in names}


# What the processes a test starts take from the test's own environment: everything but
# the AIDAWORK_ settings (each test gives its processes theirs), except these, which set
# the mode the whole suite runs in (.ci/run runs the e2e tier once with the stock broker).
INHERITED = ("AIDAWORK_STOCK_BROKER",)


def process_environ(*strip: str) -> dict[str, str]:
    """This process's environment for a process a test starts: no ``AIDAWORK_`` variables
    (nor any starting with one of ``strip``) but ``INHERITED``."""
    prefixes = ("AIDAWORK_", *strip)
    return {k: v for k, v in os.environ.items() if k in INHERITED or not k.startswith(prefixes)}


def stock_broker() -> bool:
    """Whether the suite runs with the stock kombu transport and Celery consumer."""
    from worker.ops.settings import Settings

    return Settings(broker_url=BROKER_URL).stock_broker


WAIT_S = 60.0  # generous: a loaded 2-core machine boots a Celery worker in a few seconds


def unavailable(what: str, exc: Exception) -> None:
    """A missing service skips the test, or fails it when ``CI`` is set."""
    message = f"{what} is not reachable: {exc}"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def admin_engine() -> Engine:
    return create_engine(f"{PG_BASE}/postgres", isolation_level="AUTOCOMMIT")


def broker_app() -> Any:
    """The Celery app on the test broker: for pings, inspection and raw sends."""
    from worker.ops.celery_app import app_for
    from worker.ops.settings import Settings

    return app_for(Settings(broker_url=BROKER_URL))


def make_context(db_url: str) -> Any:
    """An in-process worker context (client side) on the test database and broker."""
    from worker.engine.bootstrap import build_context
    from worker.ops.settings import Settings

    settings = Settings(database_url=db_url, broker_url=BROKER_URL, lease_s=2, dispatch_grace_s=1)
    return build_context(settings)
