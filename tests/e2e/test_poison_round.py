from __future__ import annotations

import pytest

from tests.support.cluster import Cluster, events
from tests.support.db import model_calls, round_rows, run_row
from tests.support.requests import scripted_request
from tests.support.wait import wait_until
from worker import client
from worker.engine.failpoints import EXIT_CODE
from worker.engine.round import ROUND_ATTEMPTS_EXHAUSTED
from worker.ops.settings import Settings

# A crash storm (every worker it starts dies until the attempts run out): make test-slow, alone.
pytestmark = pytest.mark.slow

MAX_ATTEMPTS = Settings.model_fields["max_round_attempts"].default


def test_round_that_kills_every_worker_fails_the_run_after_max_attempts(cluster: Cluster, ctx) -> None:
    crash = {"AIDAWORK_FAILPOINTS": "after_model_call"}
    names = ["w0"]
    cluster.start_worker("w0", concurrency=1, env=crash)
    cluster.start_beat()
    submitted = client.submit(
        scripted_request([{"tool_calls": [{"name": "add", "args": {"a": 1, "b": 1}}]}, {"content": "never"}]),
        ctx=ctx,
    )
    run_id = submitted.run_id

    def ended_restarting_dead_workers() -> bool:
        current = names[-1]
        proc = cluster.procs[current]
        if proc.poll() is not None:
            assert proc.returncode == EXIT_CODE, f"{current} exited with {proc.returncode}"
            assert len(names) <= MAX_ATTEMPTS + 1, "workers keep dying: the poison round is looping"
            names.append(f"w{len(names)}")
            cluster.start_worker(names[-1], concurrency=1, env=crash)
        return run_row(ctx.engine, run_id)["status"] in ("completed", "failed", "cancelled")

    wait_until(ended_restarting_dead_workers, timeout_s=90, what="the poison run to end")

    run = run_row(ctx.engine, run_id)
    assert run["status"] == "failed", run
    assert run["error_code"] == ROUND_ATTEMPTS_EXHAUSTED
    assert run["boundary_seq"] == 0
    assert round_rows(ctx.engine, run_id) == []

    # One paid model call: the first holder's, followed by its crash. Every later holder
    # went on from that recorded response (and crashed at the same point, its execution
    # started at its claim); the last claim failed the run instead.
    calls = model_calls(ctx.engine, run_id)
    assert [(c["boundary_seq"], c["attempt"], c["status"]) for c in calls] == [(0, 1, "succeeded")]
    reused = [e for n in names for e in events(cluster, n, "model_response_reused", run_id=run_id)]
    assert sorted(e["claim_fence"] for e in reused) == list(range(2, MAX_ATTEMPTS + 1))
    dead = [n for n in names if cluster.procs[n].poll() == EXIT_CODE]
    assert len(dead) == MAX_ATTEMPTS
    claims = [e for n in names for e in events(cluster, n, "round_claimed", run_id=run_id)]
    assert sorted(e["attempt"] for e in claims) == list(range(1, MAX_ATTEMPTS + 2))
    failed = [e for n in names for e in events(cluster, n, "run_failed", run_id=run_id)]
    assert [e["error_code"] for e in failed] == [ROUND_ATTEMPTS_EXHAUSTED]
    assert failed[0]["claim_fence"] == run["claim_fence"]
