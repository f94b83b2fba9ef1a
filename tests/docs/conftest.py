"""Fixtures of the docs tier (``make docs-test``, ``pytest -m docs``): the stack the examples
of README.md and docs/ run against, started once per module (and stopped before the next
tier's tests, which flush the same Redis database): a fresh PostgreSQL database copied
from the migrated template, the flushed test Redis database, a real ``aidawork worker``
(the example plugin is installed) and ``aidawork beat``, ``AIDAWORK_DEV=1``.

At the end of the run the examples' results per kind and every block skipped by a
``<!-- docs-test: skip: REASON -->`` marker are printed, with the reasons (tests/support/docs_summary.py).

Under pytest-xdist (``make test``: ``--dist loadfile``) a test file runs whole in one worker:
a page's python blocks share one namespace and run in order, on one module-scoped stack."""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from tests.docs.blocks import REPO, Block, drop_namespace
from tests.docs.stack import PythonPages, Stack
from tests.support.cluster import Cluster, wait_ready
from tests.support.docs_summary import DOCS_BLOCK
from tests.support.env import BROKER_URL, PG_BASE, admin_engine, unavailable


@pytest.fixture(scope="module")
def docs_stack(pg_template: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    import redis

    try:
        redis.Redis.from_url(BROKER_URL).flushdb()
    except Exception as exc:
        unavailable("Redis", exc)
    name = f"aidawork_docs_{uuid.uuid4().hex[:12]}"
    admin = admin_engine()
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{pg_template}"'))
    db_url = f"{PG_BASE}/{name}"
    cluster = Cluster(db_url, tmp_path_factory.mktemp("docs-stack"))
    try:
        cluster.start_worker("w1", concurrency=4)
        cluster.start_beat()
        wait_ready(cluster, "w1")
        yield Stack(db_url=db_url, cluster=cluster, env=cluster.env())
    finally:
        try:
            cluster.stop_all()
        finally:
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            admin.dispose()


@pytest.fixture(scope="module")
def python_stack(docs_stack: Stack) -> Iterator[PythonPages]:
    """This process set up as the examples' Python client: the stack's ``AIDAWORK_*``
    settings in the environment, the cached settings and client contexts cleared (so
    ``from worker import client; client.submit(...)`` uses the stack), the repository as
    the working directory. All of it is put back afterwards."""
    import structlog

    from worker.client import context as client_context
    from worker.engine import bootstrap
    from worker.ops.settings import get_settings

    saved_env = dict(os.environ)
    saved_cwd = Path.cwd()
    root = logging.getLogger()
    saved_handlers, saved_level = list(root.handlers), root.level
    structlog_was_configured = structlog.is_configured()
    saved_structlog = structlog.get_config()
    # A logger used while the examples run is cached (cache_logger_on_first_use) with the
    # processors list configured then, for the rest of this process; structlog.testing's
    # capture_logs, in a later test, changes the configured list in place. So the examples'
    # configure() calls change that one list in place too, and it is put back in place:
    # every logger of the process keeps seeing the configured list, whatever ran first.
    processors = saved_structlog["processors"]
    saved_processors = list(processors)
    configure = structlog.configure

    def configure_in_place(**settings: Any) -> None:
        if settings.get("processors") is not None:
            processors[:] = list(settings["processors"])
            settings["processors"] = processors
        configure(**settings)

    structlog.configure = configure_in_place  # type: ignore[assignment]

    def reset_contexts() -> None:
        for holder in (client_context._client_context, bootstrap._worker_context):
            built: Any = holder._context
            holder._context = None
            if built is not None:
                if hasattr(built, "leases"):
                    built.leases.stop()
                built.engine.dispose()
        get_settings.cache_clear()

    for key in [k for k in os.environ if k.startswith("AIDAWORK_")]:
        del os.environ[key]
    os.environ.update({k: v for k, v in docs_stack.env.items() if k.startswith("AIDAWORK_")})
    reset_contexts()
    os.chdir(REPO)
    pages = PythonPages()
    try:
        yield pages
    finally:
        for module in pages.namespaces.values():
            drop_namespace(module)
        reset_contexts()
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        get_settings.cache_clear()
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)
        structlog.configure = configure
        processors[:] = saved_processors
        structlog.configure(**{**saved_structlog, "processors": processors})
        if not structlog_was_configured:
            structlog._config._CONFIG.is_configured = False  # as reset_defaults() would, keeping the list


# --- the summary ----------------------------------------------------------------------
# Each block's test carries its block in its reports' user properties, which pytest-xdist
# sends to the controlling process: the summary is printed there (tests/support/docs_summary.py).


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        callspec = getattr(item, "callspec", None)
        block = callspec.params.get("block") if callspec is not None else None
        if isinstance(block, Block):
            item.user_properties.append(
                (DOCS_BLOCK, {"id": block.id, "kind": block.kind, "info": block.info, "skip": block.skip})
            )
