"""``aidawork audit`` after real workers ran real rounds, one of them killed with its model
call on the wire: every run audits clean (exit 0), and the dead holder's call is the one
warning (the call may have been paid for; its outcome is not on record)."""

from __future__ import annotations

import json

from tests.support.cluster import Cluster, cli, wait_exit
from tests.support.db import wait_terminal
from tests.support.requests import scripted_request
from worker import client
from worker.engine.failpoints import EXIT_CODE

SCRIPT = [
    {"tool_calls": [{"name": "add", "args": {"a": 2, "b": 3}}]},
    {"tool_calls": [{"name": "echo", "args": {"k": "v"}}]},
    {"content": "done"},
]


def test_runs_audit_clean_after_a_worker_died_mid_call(cluster: Cluster, ctx, db_url: str) -> None:
    # A dies in round 0's model call, the call on the ledger as started and never finished.
    cluster.start_worker("a", concurrency=1, env={"AIDAWORK_FAILPOINTS": "in_model_call"})
    cluster.start_beat()
    crashed = client.submit(scripted_request(SCRIPT), ctx=ctx).run_id
    assert wait_exit(cluster, "a") == EXIT_CODE
    cluster.start_worker("b")
    healthy = client.submit(scripted_request(SCRIPT), ctx=ctx).run_id
    for run_id in (crashed, healthy):
        run = wait_terminal(ctx.engine, run_id)
        assert (run["status"], run["boundary_seq"]) == ("completed", 3), run

    done = cli(db_url, "audit", "--json")

    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert (report["clean"], report["runs_checked"]) == (True, 2)
    assert [(p["check"], p["severity"], p["run_id"], p["boundary_seq"]) for p in report["problems"]] == [
        ("call_unfinished", "warning", str(crashed), 0)]
    assert cli(db_url, "audit", "--run", str(healthy)).stdout.strip() == "1 run(s) checked: clean"
