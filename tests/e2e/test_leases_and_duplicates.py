from __future__ import annotations

from tests.support.cluster import Cluster, events
from tests.support.db import calls_per_boundary, round_rows, rows, run_row, wait_terminal
from tests.support.requests import scripted_request
from tests.support.wait import wait_until
from worker import client


def test_a_round_longer_than_its_lease_keeps_its_claim_by_heartbeat(cluster: Cluster, ctx) -> None:
    # Lease 2 s; the tool takes 5 s. Without heartbeats the reconciler would hand the
    # run to the second worker and the model would be called again.
    cluster.start_worker("w1")
    cluster.start_worker("w2")
    cluster.start_beat()
    run_id = client.submit(
        scripted_request([{"tool_calls": [{"name": "sleep", "args": {"seconds": 5}}]}, {"content": "ok"}]), ctx=ctx
    ).run_id
    run = wait_terminal(ctx.engine, run_id)
    assert run["status"] == "completed", run
    assert calls_per_boundary(ctx.engine, run_id) == {0: 1, 1: 1}
    assert run["claim_fence"] == 2  # one claim per round, none stolen
    assert not events(cluster, "w1", "lease_lost") and not events(cluster, "w2", "lease_lost")


def test_duplicate_and_stale_deliveries_are_dropped_without_side_effects(cluster: Cluster, ctx) -> None:
    cluster.start_worker("w1")
    run_id = client.submit(
        scripted_request([{"tool_calls": [{"name": "echo", "args": {"x": 1}}]}, {"content": "done"}]), ctx=ctx
    ).run_id
    assert wait_terminal(ctx.engine, run_id)["status"] == "completed"
    before = (run_row(ctx.engine, run_id), round_rows(ctx.engine, run_id),
              rows(ctx.engine, "SELECT count(*) AS n FROM run_events")[0]["n"])

    for boundary in (0, 1, 2, 7):  # redelivered old rounds, and a boundary the run never reached
        ctx.dispatch.round(run_id, boundary, ctx.store.route_of(run_id))
    refused = wait_until(
        lambda: len(events(cluster, "w1", "claim_refused", run_id=run_id)) >= 4 or None,
        what="the four deliveries to be refused",
    )
    assert refused
    after = (run_row(ctx.engine, run_id), round_rows(ctx.engine, run_id),
             rows(ctx.engine, "SELECT count(*) AS n FROM run_events")[0]["n"])
    assert after == before
    assert calls_per_boundary(ctx.engine, run_id) == {0: 1, 1: 1}
