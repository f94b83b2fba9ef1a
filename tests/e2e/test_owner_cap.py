"""The concurrency cap across a fleet: an owner capped at 2 never has more than 2 runs
running, on any number of workers, and its queued runs start in submission order as
slots free up; ``aidawork owner set/show/list`` end to end."""

from __future__ import annotations

import json
import threading
from typing import Any

from tests.support.api import A, ApiServer, B
from tests.support.cluster import Cluster, cli, wait_ready
from tests.support.db import rows, wait_terminal
from tests.support.requests import scripted_request
from worker import client

OWNER = "team-capped"


def test_a_cap_of_two_holds_across_two_workers_and_runs_start_in_submission_order(
    cluster: Cluster, ctx: Any, db_url: str
) -> None:
    assert cli(db_url, "owner", "set", OWNER, "--max-running", "2").returncode == 0
    cluster.start_worker("w1")
    cluster.start_worker("w2")
    wait_ready(cluster, "w1", "w2")
    seen: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            (row,) = rows(ctx.engine, "SELECT count(*) AS n FROM runs WHERE owner = :o AND status = 'running'", o=OWNER)
            seen.append(int(row["n"]))
            stop.wait(0.01)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        turns = [{"tool_calls": [{"name": "sleep", "args": {"seconds": 0.3}}]}, {"content": "done"}]
        run_ids = [client.submit(scripted_request(turns, owner=OWNER), ctx=ctx).run_id for _ in range(8)]
        ended = [wait_terminal(ctx.engine, run_id) for run_id in run_ids]
    finally:
        stop.set()
        sampler.join()

    assert [r["status"] for r in ended] == ["completed"] * 8
    assert max(seen) == 2, f"sampled running counts: {sorted(set(seen))}"
    # Submission order, up to the runs admitted together: two slots that free at once let
    # the two oldest waiting runs start, and which of them claims first is a race. So no
    # run starts more than cap - 1 places away from its place in submission order.
    by_created = [r["id"] for r in sorted(ended, key=lambda r: r["created_at"])]
    by_start = [r["id"] for r in sorted(ended, key=lambda r: r["started_at"])]
    assert all(abs(by_start.index(run_id) - i) <= 1 for i, run_id in enumerate(by_created)), (by_created, by_start)
    shown = json.loads(cli(db_url, "owner", "show", OWNER, "--json").stdout)
    assert (shown["max_running"], shown["running"]) == (2, 0)


def test_owner_set_show_and_list_through_the_cli(db_url: str, redis_clean: None) -> None:
    done = cli(db_url, "owner", "set", "team-a", "--max-running", "3", "--weight", "5")
    assert done.returncode == 0, done.stderr
    refused = cli(db_url, "owner", "set", "team-a", "--token-budget", "1000")
    assert refused.returncode == 2 and "--budget-window" in refused.stderr
    assert cli(db_url, "owner", "set", "team-a", "--token-budget", "1000", "--budget-window", "1d").returncode == 0
    assert cli(db_url, "owner", "set", "team-a", "--max-running", "none").returncode == 0
    shown = json.loads(cli(db_url, "owner", "show", "team-a", "--json").stdout)
    assert {k: shown[k] for k in ("max_running", "weight", "token_budget", "budget_window", "running")} == {
        "max_running": None, "weight": 5, "token_budget": 1000, "budget_window": "1d", "running": 0,
    }
    table = cli(db_url, "owner", "list").stdout.splitlines()
    assert table[0].split()[:3] == ["OWNER", "RUNNING", "MAX_RUNNING"]
    assert table[1].split() == ["team-a", "0", "-", "5", "1000", "1d", "fail"]
    listed = json.loads(cli(db_url, "owner", "list", "--json").stdout)
    assert [o["owner"] for o in listed] == ["team-a"]


def test_each_owner_reads_its_own_limits_over_http_and_cannot_change_them(api: ApiServer, ctx: Any) -> None:
    client.set_owner_limits("team-a", max_running=3, weight=2, ctx=ctx)
    api.wait_ready()
    mine = api.http.get("/v1/owner", headers=A)
    assert mine.status_code == 200, mine.text
    assert {k: mine.json()[k] for k in ("owner", "max_running", "weight", "running", "stored")} == {
        "owner": "team-a", "max_running": 3, "weight": 2, "running": 0, "stored": True,
    }
    other = api.http.get("/v1/owner", headers=B).json()  # another token, another owner: the defaults
    assert (other["owner"], other["max_running"], other["stored"]) == ("team-b", None, False)
    assert api.http.get("/v1/owner").status_code == 401
    assert api.http.put("/v1/owner", json={"max_running": 100}, headers=A).status_code == 405
    assert client.owner_limits("team-a", ctx=ctx).max_running == 3
