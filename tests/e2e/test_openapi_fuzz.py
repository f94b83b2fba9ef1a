"""Schemathesis against a real ``aidawork api`` process (uvicorn on loopback, real
PostgreSQL and Redis): every operation the OpenAPI document lists, every check, positive
and negative cases, in a bounded, seeded, deterministic run. Its document is what a
generated client builds from, so it must lead to many accepted runs: the run request's
``config`` is the real TurnConfig schema, not an untyped object."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.api import TOKEN_A, A, ApiServer
from tests.support.db import rows
from tests.support.env import REPO
from tests.support.schemathesis_hooks import FUZZ_AGENT

# Generated Idempotency-Keys repeat (``0``), so many accepted requests return a run stored
# before; about 20 new runs come of the 16 examples per operation.
MIN_CREATED_RUNS = 15


@pytest.fixture
def api_default_limits(db_url: str, redis_clean: None, tmp_path: Path) -> Iterator[ApiServer]:
    """The API with the default body limit (2 MiB, not the fixture's 64 kB): a generated
    request that breaks a schema rule (129 client tools) is then refused for that rule."""
    server = ApiServer(db_url, tmp_path / "api.log", {"AIDAWORK_API_MAX_BODY_BYTES": str(2 * 1_048_576)})
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def test_schemathesis_finds_no_failure_and_builds_valid_runs(
    api_default_limits: ApiServer, ctx, tmp_path: Path
) -> None:
    api = api_default_limits
    # The saved agent a generated run may name (tests.support.schemathesis_hooks).
    config = {"model": {"provider": "scripted", "turns": [{"content": "done"}]}}
    saved = api.http.post("/v1/agents", json={"name": FUZZ_AGENT, "config": config}, headers=A)
    assert saved.status_code == 201, saved.text
    env = {**os.environ, "PYTHONPATH": str(REPO)}  # the hooks module is tests.support's
    command = [
        os.path.join(os.path.dirname(sys.executable), "st"),
        "--no-color",
        "--config-file",
        str(REPO / "tests" / "support" / "schemathesis.toml"),
        "run",
        f"http://127.0.0.1:{api.port}/openapi.json",
        "--checks",
        "all",
        "--header",
        f"Authorization: Bearer {TOKEN_A}",
    ]
    # In tmp_path: st keeps a crash cache (.schemathesis/) in its working directory.
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    (tmp_path / "schemathesis.out").write_text(done.stdout + done.stderr)

    assert done.returncode == 0, f"see {tmp_path / 'schemathesis.out'}:\n{_failures(done.stdout)}{done.stderr[-3_000:]}"
    created = rows(ctx.engine, "SELECT count(*) AS n FROM runs")[0]["n"]
    assert created >= MIN_CREATED_RUNS, f"only {created} runs created:\n{done.stdout[-5_000:]}"


def _failures(report: str) -> str:
    """The report's failures, each body cut short (a generated body can be 100 kB)."""
    return "\n".join(line[:400] for line in report.splitlines())[-15_000:]
