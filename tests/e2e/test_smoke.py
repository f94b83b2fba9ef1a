from __future__ import annotations

from tests.support.cluster import Cluster
from tests.support.db import rows
from tests.support.requests import scripted_request
from worker import client


def test_scripted_run_completes_through_a_real_worker(cluster: Cluster, ctx) -> None:
    cluster.start_worker("w1")
    submitted = client.submit(
        scripted_request([{"tool_calls": [{"name": "add", "args": {"a": 2, "b": 3}}]}, {"content": "5"}]), ctx=ctx
    )
    view = client.wait(submitted.run_id, ctx=ctx, timeout_s=30)
    assert view.status == "completed"
    assert view.output == "5"
    assert view.rounds == 2
    assert rows(ctx.engine, "SELECT count(*) AS n FROM rounds")[0]["n"] == 2
