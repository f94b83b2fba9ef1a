"""Retention through the real processes: beat with a tiny AIDAWORK_RETENTION_DAYS prunes an
ended run; ``aidawork prune`` counts (--dry-run) and deletes through the CLI."""

from __future__ import annotations

import json
from typing import Any

from tests.support.cluster import Cluster, cli, wait_events
from tests.support.db import rows
from tests.support.requests import scripted_request
from tests.support.retention import age, completed, table_rows
from tests.support.wait import wait_until
from worker import client

TINY_RETENTION = {"AIDAWORK_RETENTION_DAYS": "0.00002", "AIDAWORK_RETENTION_INTERVAL_S": "0.3"}  # ~1.7 s


def test_beat_prunes_a_run_once_it_has_ended_longer_than_the_retention(cluster: Cluster, ctx: Any) -> None:
    cluster.start_worker("w1")
    cluster.start_beat(env=TINY_RETENTION)
    submitted = client.submit(scripted_request([{"content": "bye"}]), ctx=ctx)
    assert client.wait(submitted.run_id, ctx=ctx, timeout_s=30).status == "completed"

    wait_until(lambda: not rows(ctx.engine, "SELECT 1 FROM roots WHERE id = :id", id=submitted.root_id),
               timeout_s=30, what="beat to prune the ended run's Root")
    [line] = wait_events(cluster, "beat", "runs_pruned", count=1)
    assert (line["source"], line["runs"], line["roots"]) == ("beat", 1, 1)
    assert line["rows"]["rounds"] == 1 and line["rows"]["messages"] >= 2
    assert set(table_rows(ctx.engine).values()) == {0}


def test_prune_cli_dry_run_counts_and_prune_deletes(ctx: Any, db_url: str) -> None:
    old = completed(ctx.engine)
    age(ctx.engine, old.run_id, 31)
    fresh = completed(ctx.engine)
    before = table_rows(ctx.engine)

    dry = cli(db_url, "prune", "--dry-run", "--older-than-days", "30", "--json")
    assert dry.returncode == 0, dry.stderr
    plan = json.loads(dry.stdout)
    assert (plan["dry_run"], plan["runs"], plan["roots"], plan["rows"]["messages"]) == (True, 1, 1, 2)
    assert table_rows(ctx.engine) == before

    refused = cli(db_url, "prune", "--older-than-days", "nan")
    assert refused.returncode == 2 and "--older-than-days" in refused.stderr
    unset = cli(db_url, "prune")  # no flag, no AIDAWORK_RETENTION_DAYS
    assert unset.returncode == 2 and "aidawork: error: --older-than-days" in unset.stderr
    assert table_rows(ctx.engine) == before

    done = cli(db_url, "prune", "--older-than-days", "30")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("pruned 1 runs of 1 Roots")
    assert [r["id"] for r in rows(ctx.engine, "SELECT id FROM runs")] == [fresh.run_id]
    logged = [json.loads(line) for line in done.stderr.splitlines() if '"runs_pruned"' in line]
    assert [(x["source"], x["runs"]) for x in logged] == [("cli", 1)]
