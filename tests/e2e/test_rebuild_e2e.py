from __future__ import annotations

from typing import Any

from tests.support.cluster import Cluster
from tests.support.db import rows, wait_terminal
from tests.support.requests import scripted_request
from worker import client


def report(i: int) -> dict[str, Any]:
    return {"tool_calls": [{"name": "echo", "args": {"report": f"region {i}: " + "figures and notes " * 6}}]}


def limited(turns: list[dict[str, Any]], limit: int) -> dict[str, Any]:
    request = scripted_request(turns, tools=["echo"])
    request["config"]["model"]["context_limit_tokens"] = limit
    return request


def test_a_run_over_its_context_limit_rebuilds_and_completes(cluster: Cluster, ctx: Any) -> None:
    cluster.start_worker("w1")
    cluster.start_worker("w2")
    run_id = client.submit(limited([report(i) for i in range(5)] + [{"content": "done"}], 330), ctx=ctx).run_id
    run = wait_terminal(ctx.engine, run_id)
    assert run["status"] == "completed", run
    view = client.status(run_id, ctx=ctx)
    assert view.rebuilds >= 1 and view.rounds == 6
    kinds = [e.kind for e in client.events(run_id, ctx=ctx, follow=False)]
    assert kinds.count("context_rebuilt") == view.rebuilds
    # Every rejected call is in the ledger, followed by the accepted retry of its round.
    calls = rows(ctx.engine, "SELECT boundary_seq, status, error_code FROM model_calls WHERE run_id = :id ORDER BY id",
                 id=run_id)
    rejected = [c for c in calls if c["status"] == "failed"]
    assert rejected and all(c["error_code"] == "MODEL_INPUT_REJECTED" for c in rejected)
    assert len(calls) == view.rounds + len(rejected)
    consumptions = rows(ctx.engine, "SELECT count(*) AS n FROM runtime_work_model_rebuild_consumptions")[0]["n"]
    assert consumptions == view.rebuilds
    # The rebuilt context is what later rounds saw: the checkpoint moved past the start.
    cp = rows(ctx.engine, "SELECT context_start_position, summary FROM run_checkpoints WHERE run_id = :id", id=run_id)
    assert cp[0]["context_start_position"] > 0 and cp[0]["summary"]


def test_a_run_still_over_its_limit_after_two_rebuilds_fails_with_the_exhaustion_code(
    cluster: Cluster, ctx: Any
) -> None:
    cluster.start_worker("w1")
    big = {"tool_calls": [{"name": "echo", "args": {"blob": "z" * 3000}}]}
    run_id = client.submit(limited([report(i) for i in range(4)] + [big, {"content": "never"}], 900), ctx=ctx).run_id
    run = wait_terminal(ctx.engine, run_id)
    assert (run["status"], run["error_code"]) == ("failed", "MODEL_CONTEXT_REBUILD_EXHAUSTED"), run
    builds = rows(ctx.engine, "SELECT ordinal, predecessor_build_id FROM runtime_work_model_rebuilds ORDER BY ordinal")
    assert [b["ordinal"] for b in builds] == [1, 2]
    consumed = rows(ctx.engine, "SELECT count(*) AS n FROM runtime_work_model_rebuild_consumptions")[0]["n"]
    assert consumed == 2
    rejected = rows(
        ctx.engine,
        "SELECT count(*) AS n FROM model_calls WHERE run_id = :id AND error_code = 'MODEL_INPUT_REJECTED'",
        id=run_id,
    )[0]["n"]
    assert rejected == 3  # the first rejection and one after each rebuild
