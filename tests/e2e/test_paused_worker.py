from __future__ import annotations

import json
import signal
import subprocess
import sys
from datetime import datetime

from tests.support.cluster import Cluster, events, wait_exit
from tests.support.db import calls_per_boundary, round_rows, rows, run_row, wait_model_call_succeeded, wait_terminal
from tests.support.env import REPO, default_timings
from tests.support.requests import scripted_request
from tests.support.wait import wait_until
from worker import client

SLEEP_S = 2
SCRIPT = [
    {"tool_calls": [{"name": "sleep", "args": {"seconds": SLEEP_S}}]},
    {"content": "once"},
]


def _ts(line: dict) -> datetime:
    return datetime.fromisoformat(line["timestamp"])


def test_worker_paused_past_its_lease_cannot_commit_after_another_took_over(cluster: Cluster, ctx) -> None:
    # The paused worker runs one thread: while stopped it holds round 0's message and so
    # reserves nothing else (a stopped consumer would otherwise swallow the re-sent task).
    cluster.start_worker("paused", concurrency=1)
    cluster.start_beat()
    submitted = client.submit(scripted_request(SCRIPT), ctx=ctx)
    run_id = submitted.run_id

    stale_call = wait_model_call_succeeded(ctx.engine, run_id, 0)  # now inside the sleep tool
    cluster.signal("paused", signal.SIGSTOP)
    stale_fence = stale_call["claim_fence"]
    assert [e["claim_fence"] for e in events(cluster, "paused", "round_claimed", run_id=run_id)] == [stale_fence]

    # Another worker takes the run over once the paused worker's lease has expired.
    cluster.start_worker("other")
    takeover = wait_until(
        lambda: events(cluster, "other", "round_claimed", run_id=run_id, boundary_seq=0),
        what="the other worker to claim round 0",
    )[0]
    assert takeover["claim_fence"] > stale_fence
    assert run_row(ctx.engine, run_id)["claim_fence"] >= takeover["claim_fence"]
    assert run_row(ctx.engine, run_id)["boundary_seq"] == 0, "round 0 committed while its holder was paused"

    # Its sleep ends (wall clock ran on while it was stopped): it tries to commit round 0
    # under its stale fence and is refused.
    resumed_at_lines = assert_stale_round_refused_after_resume(cluster)
    dropped = events(cluster, "paused", "round_dropped", run_id=run_id, boundary_seq=0)
    assert [d["claim_fence"] for d in dropped] == [stale_fence]
    # Stop it now (warm shutdown) so that it cannot take round 1 legitimately: every round
    # must then be the other worker's.
    cluster.signal("paused", signal.SIGTERM)
    assert wait_exit(cluster, "paused") == 0

    run = wait_terminal(ctx.engine, run_id)
    assert run["status"] == "completed", run
    assert run["output"] == "once"

    # The paused worker's writes did not land: every round is under the other worker's claims.
    rounds = round_rows(ctx.engine, run_id)
    assert [r["boundary_seq"] for r in rounds] == [0, 1]
    other_fences = {e["claim_fence"] for e in events(cluster, "other", "round_claimed", run_id=run_id)}
    assert {r["claim_fence"] for r in rounds} <= other_fences
    assert rounds[0]["claim_fence"] == takeover["claim_fence"]
    assert stale_fence not in {r["claim_fence"] for r in rounds}
    tools = rows(ctx.engine, "SELECT claim_fence FROM tool_invocations WHERE run_id = :id", id=run_id)
    assert [t["claim_fence"] for t in tools] == [takeover["claim_fence"]]
    assert rows(ctx.engine, "SELECT count(*) AS n FROM messages WHERE run_id = :id", id=run_id)[0]["n"] == 4

    # Its log after the resume: the refused commit, and nothing committed or sent.
    after_resume = [line for line in cluster.logs("paused")[resumed_at_lines:] if line.get("run_id") == str(run_id)]
    kinds = [line["event"] for line in after_resume]
    assert "round_dropped" in kinds
    assert "round_committed" not in kinds
    assert "round_enqueued" not in kinds
    assert not events(cluster, "paused", "round_committed")
    # (Only a round it held sends a next round: such a line carries its claim.)
    assert not [e for e in events(cluster, "paused", "round_enqueued") if "claim_fence" in e]
    # Its own fence is the only one it ever held. Its call is the only one of round 0: it
    # had returned (the round was in its tool) when the other worker took over, which
    # went on from that response instead of calling the model again.
    assert calls_per_boundary(ctx.engine, run_id) == {0: 1, 1: 1}
    assert [e["claim_fence"] for e in events(cluster, "other", "model_response_reused", run_id=run_id)] == [
        takeover["claim_fence"]
    ]
    assert _ts(dropped[0]) > _ts(takeover)


def test_model_call_of_a_worker_taken_over_mid_call_is_on_the_ledger_as_stale_with_its_usage(
    cluster: Cluster, ctx
) -> None:
    # The worker is paused while its model call is in flight (the scripted latency), past
    # its lease; another worker takes the round over. When the paused worker resumes, its
    # call returns - it was paid for - and the ledger must record its outcome and usage,
    # marked stale, without the stale holder changing anything else.
    cluster.start_worker("paused", concurrency=1)
    cluster.start_beat()
    script = [{"tool_calls": [{"name": "add", "args": {"a": 2, "b": 3}}], "latency_ms": 3000}, {"content": "5"}]
    run_id = client.submit(scripted_request(script), ctx=ctx).run_id

    in_flight = wait_until(
        lambda: rows(ctx.engine, "SELECT * FROM model_calls WHERE run_id = :id AND status = 'started'", id=run_id),
        interval_s=0.02,
        what="the paused worker's model call to start",
    )[0]
    cluster.signal("paused", signal.SIGSTOP)
    stale_fence = in_flight["claim_fence"]
    assert rows(ctx.engine, "SELECT status FROM model_calls WHERE id = :id", id=in_flight["id"]) == [
        {"status": "started"}
    ], "the call returned before the worker was paused: the test did not set up its interleaving"

    cluster.start_worker("other")
    wait_until(
        lambda: [e for e in events(cluster, "other", "round_claimed", run_id=run_id) if e["claim_fence"] > stale_fence],
        what="the other worker to take round 0 over",
    )
    before_resume = run_row(ctx.engine, run_id)
    assert_stale_round_refused_after_resume(cluster)
    cluster.signal("paused", signal.SIGTERM)
    assert wait_exit(cluster, "paused") == 0

    run = wait_terminal(ctx.engine, run_id)
    assert (run["status"], run["output"]) == ("completed", "5")
    assert run["claim_fence"] >= before_resume["claim_fence"]
    rounds = round_rows(ctx.engine, run_id)
    assert stale_fence not in {r["claim_fence"] for r in rounds}

    calls = rows(ctx.engine, "SELECT * FROM model_calls WHERE run_id = :id ORDER BY id", id=run_id)
    stale = [c for c in calls if c["id"] == in_flight["id"]]
    assert [(c["status"], c["stale"], c["claim_fence"]) for c in stale] == [("succeeded", True, stale_fence)]
    assert stale[0]["input_tokens"] > 0 and stale[0]["output_tokens"] > 0 and stale[0]["response_digest"]
    assert [(c["boundary_seq"], c["status"], c["stale"]) for c in calls if c["id"] != in_flight["id"]] == [
        (0, "succeeded", False),
        (1, "succeeded", False),
    ]

    # `aidawork status` counts the stale call and its tokens in the run's spend.
    status = subprocess.run(
        [sys.executable, "-m", "worker.cli", "status", str(run_id), "--json"],
        cwd=REPO, env=cluster.env(), capture_output=True, text=True, timeout=60, check=True,
    )
    view = json.loads(status.stdout)
    assert (view["model_calls"], view["stale_model_calls"]) == (3, 1)
    assert view["input_tokens"] == sum(c["input_tokens"] for c in calls)
    assert view["output_tokens"] == sum(c["output_tokens"] for c in calls)


def test_worker_paused_past_the_dead_limit_is_taken_over_before_its_lease_and_cannot_commit(
    cluster: Cluster, ctx
) -> None:
    # At the default settings (a 30 s lease): the paused worker's silence past
    # AIDAWORK_WORKER_DEAD_AFTER_S is taken for a death, long before its lease runs out.
    # It was only slow: when it resumes, the fence refuses its late commit.
    defaults = default_timings()
    lease_s = float(defaults["AIDAWORK_LEASE_S"])
    cluster.start_worker("paused", concurrency=1, env=defaults)
    cluster.start_beat(env=defaults)
    run_id = client.submit(scripted_request(SCRIPT), ctx=ctx).run_id
    paused_id = wait_until(lambda: events(cluster, "paused", "worker_registered"), what="its registration")[0][
        "worker_id"
    ]

    stale_call = wait_model_call_succeeded(ctx.engine, run_id, 0)  # now inside the sleep tool
    cluster.signal("paused", signal.SIGSTOP)
    stale_fence = stale_call["claim_fence"]
    lease_at_pause = run_row(ctx.engine, run_id)["lease_expires_at"]

    cluster.start_worker("other", env=defaults)
    takeover = wait_until(
        lambda: events(cluster, "other", "round_claimed", run_id=run_id, boundary_seq=0),
        timeout_s=lease_s - 5,  # within the lease: only the dead-worker path can hand it on
        what="the other worker to claim round 0",
    )[0]
    assert takeover["claim_fence"] == stale_fence + 1
    assert _ts(takeover) < lease_at_pause
    assert [e["count"] for e in events(cluster, "beat", "dead_worker_runs_redispatched")
            if paused_id in e["worker_ids"]] == [1]
    assert events(cluster, "beat", "run_redispatched", run_id=run_id, cause="dead_holder", holder=paused_id)

    assert_stale_round_refused_after_resume(cluster)
    dropped = events(cluster, "paused", "round_dropped", run_id=run_id, boundary_seq=0)
    assert [d["claim_fence"] for d in dropped] == [stale_fence]
    # Its heartbeats came back: alive again for the registry, beat's mark outdated.
    wait_until(
        lambda: rows(ctx.engine, "SELECT heartbeat_at > dead_at AS alive FROM workers WHERE id = :id",
                     id=paused_id)[0]["alive"],
        what="the resumed worker's heartbeat",
    )
    cluster.signal("paused", signal.SIGTERM)
    assert wait_exit(cluster, "paused") == 0

    run = wait_terminal(ctx.engine, run_id)
    assert (run["status"], run["output"]) == ("completed", "once")
    rounds = round_rows(ctx.engine, run_id)
    assert [r["boundary_seq"] for r in rounds] == [0, 1]
    assert rounds[0]["claim_fence"] == takeover["claim_fence"]
    assert not events(cluster, "paused", "round_committed")
    assert calls_per_boundary(ctx.engine, run_id) == {0: 1, 1: 1}  # the other went on from its response


def assert_stale_round_refused_after_resume(cluster: Cluster) -> int:
    """SIGCONT the paused worker: the round it held when stopped must end in one
    ``round_dropped`` for its lost fence, never a commit or a crash. Returns where its log
    stood at the resume."""
    resumed_at_lines = len(cluster.logs("paused"))
    cluster.signal("paused", signal.SIGCONT)
    outcome = wait_until(
        lambda: [
            line
            for line in cluster.logs("paused")[resumed_at_lines:]
            if line.get("event") in ("round_dropped", "round_committed", "round_crashed")
        ],
        what="the resumed worker to finish its stale round",
    )
    assert [(line["event"], line.get("error")) for line in outcome] == [("round_dropped", "FenceLost")]
    return resumed_at_lines
