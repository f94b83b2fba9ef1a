"""Fixtures of the docs tier (``make docs-test``, ``pytest -m docs``): the stack the examples
of README.md and docs/ run against, started once per module (and stopped before the next
tier's tests, which flush the same Redis database): a fresh PostgreSQL database copied
from the migrated template, the flushed test Redis database, a real ``aidawork worker``
(the example plugin is installed) and ``aidawork beat``, ``AIDAWORK_DEV=1``.

At the end of the run the examples' results per kind and every block skipped by a
``<!-- docs-test: skip: REASON -->`` marker are printed, with the reasons."""

from __future__ import annotations

import logging
import os
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from tests.docs.blocks import REPO, Block, drop_namespace
from tests.docs.stack import PythonPages, Stack
from tests.support.cluster import Cluster, wait_ready
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
        if structlog_was_configured:
            structlog.configure(**saved_structlog)
        else:
            structlog.reset_defaults()


# --- the summary ----------------------------------------------------------------------

_blocks: dict[str, Block] = {}  # node id -> the block it checks
_outcomes: dict[str, str] = {}  # node id -> passed / failed / skipped


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        callspec = getattr(item, "callspec", None)
        block = callspec.params.get("block") if callspec is not None else None
        if isinstance(block, Block):
            _blocks[item.nodeid] = block


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.nodeid not in _blocks:
        return
    if report.failed:
        _outcomes[report.nodeid] = "failed"
    elif report.skipped and _outcomes.get(report.nodeid) != "failed":
        _outcomes[report.nodeid] = "skipped"
    elif report.when == "call" and report.passed:
        _outcomes[report.nodeid] = "passed"


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _outcomes:
        return
    counts: Counter[tuple[str, str]] = Counter()
    for nodeid, outcome in _outcomes.items():
        counts[(_blocks[nodeid].kind or "?", outcome)] += 1
    tr = terminalreporter
    tr.write_sep("=", "docs examples (README.md, docs/)")
    for kind in ("python", "sh", "console", "json"):
        row = {o: counts[(kind, o)] for o in ("passed", "failed", "skipped")}
        if any(row.values()):
            tr.write_line(f"{kind:8} {row['passed']:3} passed  {row['failed']:3} failed  {row['skipped']:3} skipped")
    skipped = [_blocks[n] for n, o in _outcomes.items() if o == "skipped" and _blocks[n].skip]
    tr.write_line(f"{len(skipped)} block(s) skipped by a docs-test marker" + (":" if skipped else ""))
    for block in skipped:
        tr.write_line(f"  {block.id} [{block.info}]: {block.skip}")
    failed = [_blocks[n] for n, o in _outcomes.items() if o == "failed"]
    if failed:
        tr.write_line(f"{len(failed)} block(s) failed: " + ", ".join(b.id for b in failed))
