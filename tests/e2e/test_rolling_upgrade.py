"""The rolling upgrade of docs/operations/rolling-upgrade.md, on the real stack.

Two releases of a plugin (tests/support/plugins/rolling_v1 and rolling_v2: version 2 changes
``stamp`` compatibly and adds ``shout``): runs start on version-1 workers and wait, half way,
for a person's approval (so the switch lands mid-run whatever the machine's speed);
``deploy-check`` passes for version 2; version-2 workers join on the same database and broker;
the approvals let every run go on, and the version-1 workers are stopped warm while their
rounds are in flight. Every run completes (release 2 runs rounds of runs release 1 began), and
each boundary has one model call and one committed round: 0 lost, 0 done twice.

And the version check: a migration that breaks the live workers' level is refused by
``aidawork migrate`` (naming the migration, the level, the workers) unless ``--force``; with
it, the live old worker stops claiming and shuts down warm, and an old worker refuses to start.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import Any
from uuid import UUID

import pytest
from alembic.script import ScriptDirectory

from schema.migrate import alembic_config
from schema.store.compat import CODE_LEVEL
from tests.support.cluster import Cluster, cli, events, wait_exit, wait_ready
from tests.support.db import calls_per_boundary, rows, wait_suspended, wait_terminal
from tests.support.env import BROKER_URL, REPO
from tests.support.wait import wait_until
from worker import client
from worker.client.context import ClientContext, build_client_context
from worker.ops.settings import Settings

PLUGINS = REPO / "tests" / "support" / "plugins"
RUNS, ROUNDS = 12, 6
GATE = 2  # the round whose call (echo) waits for approval: rounds before it run on release 1
STAMPS = [k for k in range(ROUNDS - 1) if k != GATE]


def release(version: int) -> dict[str, str]:
    """The environment of a process of release ``version``: its plugin on PYTHONPATH."""
    path = os.pathsep.join(p for p in (str(PLUGINS / f"rolling_v{version}"), os.environ.get("PYTHONPATH")) if p)
    return {"AIDAWORK_PLUGINS": "rolling_plugin", "PYTHONPATH": path}


@pytest.fixture
def v1_client(db_url: str, redis_clean: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[ClientContext]:
    """A client (this test process) of release 1: it validates submissions against its plugin."""
    monkeypatch.syspath_prepend(str(PLUGINS / "rolling_v1"))
    context = build_client_context(Settings(database_url=db_url, broker_url=BROKER_URL, plugins="rolling_plugin"))
    yield context
    context.engine.dispose()


def stamp_request(i: int) -> dict[str, Any]:
    """Stamp rounds, and at GATE an echo call that waits for approval; then the answer."""

    def call(k: int) -> dict[str, Any]:
        return {"name": "echo", "args": {"gate": i}} if k == GATE else {"name": "stamp", "args": {"text": f"{i}-{k}"}}

    turns: list[dict[str, Any]] = [{"tool_calls": [call(k)], "latency_ms": 250} for k in range(ROUNDS - 1)]
    turns.append({"content": f"done-{i}", "latency_ms": 250})
    config = {"model": {"provider": "scripted", "turns": turns}, "tools": ["stamp", "echo"],
              "policy": {"require_approval": ["echo"]}}
    return {"owner": "team-test", "input": "go", "config": config}


def claims(cluster: Cluster, *names: str) -> int:
    return sum(len(events(cluster, name, "round_claimed")) for name in names)


def stamp_versions(ctx: ClientContext, run_id: UUID) -> list[int]:
    found = rows(ctx.engine, "SELECT result FROM tool_invocations WHERE run_id = :id AND tool_name = 'stamp' "
                 "ORDER BY boundary_seq", id=run_id)
    return [r["result"]["version"] for r in found]


def test_a_rolling_upgrade_across_two_plugin_releases_loses_nothing_and_does_nothing_twice(
    cluster: Cluster, v1_client: ClientContext, db_url: str
) -> None:
    # One thread each: release 1 cannot finish the load before release 2 has started.
    for name in ("v1a", "v1b"):
        cluster.start_worker(name, concurrency=1, env=release(1))
    cluster.start_beat(env=release(1))
    wait_ready(cluster, "v1a", "v1b")
    runs = [client.submit(stamp_request(i), ctx=v1_client).run_id for i in range(RUNS)]
    for run_id in runs:
        wait_suspended(v1_client.engine, run_id, GATE)

    # 1. The gate: release 2 can carry every run in flight, waiting calls included.
    check = cli(db_url, "deploy-check", env=release(2))
    assert check.returncode == 0, check.stdout + check.stderr
    assert check.stdout.splitlines()[-1].endswith("all compatible with this code")

    # 2. Release 2 joins, side by side with release 1.
    for name in ("v2a", "v2b"):
        cluster.start_worker(name, concurrency=2, env=release(2))
    wait_ready(cluster, "v2a", "v2b")

    # 3. The runs go on, on both releases; release 1 stops warm, mid-load, once it has claimed
    # rounds again: those finish, the messages it holds go back.
    claimed_before = claims(cluster, "v1a", "v1b")
    for run_id in runs:
        client.approve(run_id, f"call_{GATE}_0", ctx=v1_client)
    wait_until(lambda: claims(cluster, "v1a", "v1b") > claimed_before, what="release 1 to claim a round again")
    for name in ("v1a", "v1b"):
        cluster.signal(name, signal.SIGTERM)
    assert [wait_exit(cluster, name) for name in ("v1a", "v1b")] == [0, 0]
    stopped = rows(v1_client.engine, "SELECT count(*) AS n FROM workers WHERE stopped_at IS NOT NULL")[0]["n"]
    assert stopped == 2

    # 4. Release 2's new tool, submitted through a release-2 client.
    turns = [{"tool_calls": [{"name": "shout", "args": {"text": "hi"}}]}, {"content": "shouted"}]
    shout = {"owner": "team-test", "input": "go",
             "config": {"model": {"provider": "scripted", "turns": turns}, "tools": ["shout", "stamp"]}}
    submitted = cli(db_url, "submit", "-", stdin=json.dumps(shout), env=release(2))
    assert submitted.returncode == 0, submitted.stderr
    shout_run = UUID(submitted.stdout.strip())

    # 0 lost: every run completed with its own answer.
    for i, run_id in enumerate(runs):
        row = wait_terminal(v1_client.engine, run_id)
        assert (row["status"], row["output"], row["boundary_seq"]) == ("completed", f"done-{i}", ROUNDS), row
    assert wait_terminal(v1_client.engine, shout_run)["output"] == "shouted"
    (shouted,) = rows(v1_client.engine, "SELECT result FROM tool_invocations WHERE run_id = :id", id=shout_run)
    assert shouted["result"] == {"text": "HI", "version": 2}

    # 0 done twice: one model call and one committed round (its own claim) per boundary.
    for run_id in runs:
        assert calls_per_boundary(v1_client.engine, run_id) == dict.fromkeys(range(ROUNDS), 1)
    committed = rows(
        v1_client.engine,
        "SELECT run_id, array_agg(boundary_seq ORDER BY boundary_seq) AS seqs, count(DISTINCT claim_fence) AS fences "
        "FROM rounds WHERE run_id = ANY(:ids) GROUP BY run_id",
        ids=runs,
    )
    assert len(committed) == RUNS
    assert all(c["seqs"] == list(range(ROUNDS)) and c["fences"] == ROUNDS for c in committed), committed

    # The runs went on across the switch: release 1 ran every run's rounds before the gate,
    # release 2 some after it.
    versions = {run_id: stamp_versions(v1_client, run_id) for run_id in runs}
    assert all(len(v) == len(STAMPS) and v[:GATE] == [1] * GATE for v in versions.values()), versions
    assert any(2 in v for v in versions.values()), f"release 2 ran no round: {versions}"


def breaking_migrate(db_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``aidawork migrate`` with a revision after head that needs code level CODE_LEVEL + 1."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIDAWORK_")}
    env["AIDAWORK_DATABASE_URL"] = db_url
    return subprocess.run([sys.executable, "-m", "tests.support.breaking_migrate", "migrate", *args], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=120)


def json_lines(text: str, event: str) -> list[dict[str, Any]]:
    found = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    return [line for line in found if line.get("event") == event]


def schema_state(ctx: Any) -> tuple[list[str], int]:
    versions = [r["version_num"] for r in rows(ctx.engine, "SELECT version_num FROM alembic_version")]
    return versions, rows(ctx.engine, "SELECT min_code_level FROM schema_compat")[0]["min_code_level"]


def test_a_migration_that_breaks_live_workers_is_refused_and_old_workers_stop_and_refuse_to_start(
    cluster: Cluster, ctx: Any, db_url: str
) -> None:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    cluster.start_worker("old", concurrency=1)
    wait_ready(cluster, "old")
    (old,) = rows(ctx.engine, "SELECT name, code_level FROM workers WHERE stopped_at IS NULL")
    assert old["code_level"] == CODE_LEVEL
    assert schema_state(ctx) == ([head], CODE_LEVEL)

    # Refused while the old worker is live, with what, why and what to do; nothing applied.
    refused = breaking_migrate(db_url)
    assert refused.returncode == 1, refused.stderr
    (line,) = json_lines(refused.stderr, "start_refused")
    assert line["command"] == "migrate"
    assert line["error"] == (
        f"SCHEMA_INCOMPATIBLE: migration t9001 needs workers of compatibility level {CODE_LEVEL + 1} or higher, "
        f"but 1 live worker(s) run an older level: {old['name']} (level {CODE_LEVEL}). Stop them first (SIGTERM: "
        "they finish their rounds), or run `aidawork migrate --force`: they then stop claiming and shut down"
    )
    assert schema_state(ctx) == ([head], CODE_LEVEL)

    # Forced: applied; the live old worker sees the level raised under it and shuts down warm.
    forced = breaking_migrate(db_url, "--force")
    assert forced.returncode == 0, forced.stderr
    assert [line["forced"] for line in json_lines(forced.stderr, "database_migrated")] == [True]
    assert schema_state(ctx) == (["t9001"], CODE_LEVEL + 1)
    assert wait_exit(cluster, "old") == 0
    (seen,) = events(cluster, "old", "schema_level_refused")
    assert (seen["code_level"], seen["schema_level"]) == (CODE_LEVEL, CODE_LEVEL + 1)
    assert rows(ctx.engine, "SELECT count(*) AS n FROM workers WHERE stopped_at IS NULL")[0]["n"] == 0

    # An old worker refuses to start, naming both levels; it never registers.
    cluster.start_worker("old2", concurrency=1)
    assert wait_exit(cluster, "old2") == 1
    (refusal,) = events(cluster, "old2", "start_refused")
    assert refusal["error"] == (
        f"SCHEMA_INCOMPATIBLE: this code's compatibility level is {CODE_LEVEL}, but the database schema needs level "
        f"{CODE_LEVEL + 1} or higher (a migration for newer code was applied): run the newer release"
    )
    assert rows(ctx.engine, "SELECT count(*) AS n FROM workers")[0]["n"] == 1
