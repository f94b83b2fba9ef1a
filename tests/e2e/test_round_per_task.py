from __future__ import annotations

from schema.store.bodies import message_body_sql
from tests.support.cluster import Cluster, events, wait_ready
from tests.support.db import round_rows, rows, wait_terminal
from tests.support.requests import scripted_request
from tests.support.wait import wait_until
from worker import client

SCRIPT = [
    {"tool_calls": [{"name": "add", "args": {"a": 2, "b": 3}}]},
    {"tool_calls": [{"name": "echo", "args": {"note": "hi", "n": 1}}]},
    {"tool_calls": [{"name": "add", "args": {"a": 5, "b": 7}}, {"name": "echo", "args": {"x": [1, 2]}}]},
    {"tool_calls": [{"name": "sleep", "args": {"seconds": 0}}]},
    {"content": "all done"},
]
TOOL_RESULTS = [
    [{"sum": 5.0}],
    [{"note": "hi", "n": 1}],
    [{"sum": 12.0}, {"x": [1, 2]}],
    [{"slept_s": 0}],
]

BODY = message_body_sql()  # a tool message's output is stored once, in tool_invocations


def expected_transcript() -> list[dict]:
    out: list[dict] = [{"role": "user", "content": "go"}]
    for turn, (script_turn, results) in enumerate(zip(SCRIPT[:-1], TOOL_RESULTS, strict=True)):
        calls = [
            {"id": f"call_{turn}_{i}", "name": c["name"], "args": c["args"]}
            for i, c in enumerate(script_turn["tool_calls"])
        ]
        out.append({"role": "assistant", "tool_calls": calls})
        for call, result in zip(calls, results, strict=True):
            out.append({"role": "tool", "tool_call_id": call["id"], "name": call["name"], "result": result})
    out.append({"role": "assistant", "content": "all done"})
    return out


def test_five_round_run_executes_one_task_per_round_across_two_workers(cluster: Cluster, ctx) -> None:
    # One thread each: a worker that is executing a round holds its only prefetch slot,
    # so the next round's task (sent before the ack) must go to the other worker.
    cluster.start_worker("w1", concurrency=1)
    cluster.start_worker("w2", concurrency=1)
    wait_ready(cluster, "w1", "w2")

    submitted = client.submit(scripted_request(SCRIPT), ctx=ctx)
    run = wait_terminal(ctx.engine, submitted.run_id)

    assert run["status"] == "completed", run
    assert run["output"] == "all done"
    assert run["boundary_seq"] == 5

    # Each round is its own task: five commits, five distinct task ids, both workers used.
    def logged() -> dict[str, list[dict]]:
        return {name: events(cluster, name, "round_committed", run_id=submitted.run_id) for name in ("w1", "w2")}

    # (The last commit's line is written just after the commit the run's status showed.)
    commits = wait_until(lambda: sum(map(len, (c := logged()).values())) >= 5 and c, what="5 commits logged")
    all_commits = commits["w1"] + commits["w2"]
    assert sorted(c["boundary_seq"] for c in all_commits) == [0, 1, 2, 3, 4]
    assert len({c["task_id"] for c in all_commits}) == 5
    assert commits["w1"] and commits["w2"], f"one worker did every round: {commits}"

    # One rounds row per boundary, each under its own claim (fence).
    rounds = round_rows(ctx.engine, submitted.run_id)
    assert [r["boundary_seq"] for r in rounds] == [0, 1, 2, 3, 4]
    assert len({r["claim_fence"] for r in rounds}) == 5
    assert [r["outcome"] for r in rounds] == ["continue"] * 4 + ["finish"]
    # The fence in each row is the one its committing task logged.
    assert {(c["boundary_seq"], c["claim_fence"]) for c in all_commits} == {
        (r["boundary_seq"], r["claim_fence"]) for r in rounds
    }

    # The stored transcript is exactly the script, in order, gapless from position 0.
    messages = rows(
        ctx.engine,
        f"SELECT position, role, boundary_seq, {BODY} AS body FROM messages AS m "
        "WHERE root_id = :root ORDER BY position",
        root=submitted.root_id,
    )
    assert [m["position"] for m in messages] == list(range(len(messages)))
    assert [m["body"] for m in messages] == expected_transcript()
    assert [m["role"] for m in messages] == [m["body"]["role"] for m in messages]

    # One ledger row and one set of tool invocations per round.
    calls = rows(
        ctx.engine,
        "SELECT boundary_seq, status FROM model_calls WHERE run_id = :id ORDER BY boundary_seq",
        id=submitted.run_id,
    )
    assert calls == [{"boundary_seq": b, "status": "succeeded"} for b in range(5)]
    tools = rows(
        ctx.engine,
        "SELECT tool_call_id, status FROM tool_invocations WHERE run_id = :id ORDER BY boundary_seq, tool_call_id",
        id=submitted.run_id,
    )
    assert [t["tool_call_id"] for t in tools] == ["call_0_0", "call_1_0", "call_2_0", "call_2_1", "call_3_0"]
    assert {t["status"] for t in tools} == {"completed"}
