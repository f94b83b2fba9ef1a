"""The repeated-call breaker and context slimming through real worker processes.

- A model repeating the same echo round is stopped at exactly the limit, with the count
  carried in the rounds table while the run moves between two workers.
- The same script on a ``local`` tool is not stopped by the breaker.
- A 1 MB tool output is stored whole (invocation, event, message), while the model's
  next input is the slimmed form: small in the ledger, and the round's messages digest
  is the chain of the slimmed context, recomputable from the stored bodies.
"""

from __future__ import annotations

from typing import Any

import pytest

from runtime.breaker import REPEATED_IDENTICAL_TOOL_CALL
from runtime.config import MAX_TOOL_OUTPUT_BYTES
from runtime.context import context_chain, slim_tool_results_for_next_round
from runtime.loop import MAX_ROUNDS_EXCEEDED
from runtime.messages import Message
from schema.store.bodies import event_data_sql, message_body_sql
from tests.support.cluster import Cluster, events, wait_ready
from tests.support.db import model_calls, round_rows, rows, wait_terminal
from tests.support.requests import scripted_request
from tests.support.wait import wait_until
from worker import client

ECHO_ARGS = {"q": "same again", "n": 2}
ECHO_TURN = {"tool_calls": [{"name": "echo", "args": ECHO_ARGS}]}
LOCAL_ECHO_TURN = {"tool_calls": [{"name": "local_echo", "args": ECHO_ARGS}]}
WAIT_S = 30.0

BODY = message_body_sql()
EVENT_DATA = event_data_sql()  # a tool message's output is stored once, in tool_invocations


def _request(turns: list[dict[str, Any]], *, tools: list[str], max_rounds: int = 50,
             **policy: Any) -> dict[str, Any]:
    raw = scripted_request(turns, tools=tools, max_rounds=max_rounds)
    raw["config"]["policy"].update(policy)
    return raw


def _run_events(ctx, run_id) -> list[dict[str, Any]]:
    return rows(ctx.engine, f"SELECT seq, kind, {EVENT_DATA} AS data FROM run_events AS e WHERE run_id = :id "
                "ORDER BY seq", id=run_id)


def _committers(cluster: Cluster, run_id, names: tuple[str, ...], count: int) -> dict[int, str]:
    """Which worker committed each of the run's ``count`` rounds (from their logs, once the
    last line is written: it comes just after the commit the test saw)."""

    def logged() -> dict[int, str]:
        out: dict[int, str] = {}
        for name in names:
            for line in events(cluster, name, "round_committed", run_id=run_id):
                assert line["boundary_seq"] not in out, f"round {line['boundary_seq']} committed twice"
                out[line["boundary_seq"]] = name
        return out

    return wait_until(lambda: len(c := logged()) >= count and c, what=f"{count} commits logged")


# --- (1) the breaker across two workers ---------------------------------------------------------


@pytest.mark.parametrize("limit", [None, 5], ids=["default-limit-3", "limit-5"])
def test_identical_echo_rounds_are_stopped_at_exactly_the_limit_across_two_workers(
    cluster: Cluster, ctx, limit: int | None
) -> None:
    # One thread each: the next round's task is sent while the committing worker still
    # holds its only slot, so rounds move between the two processes.
    cluster.start_worker("w1", concurrency=1)
    cluster.start_worker("w2", concurrency=1)
    wait_ready(cluster, "w1", "w2")
    expected = limit or 3
    policy = {} if limit is None else {"repeated_tool_call_limit": limit}

    submitted = client.submit(_request([ECHO_TURN] * 20, tools=["echo", "local_echo"], **policy), ctx=ctx)
    run = wait_terminal(ctx.engine, submitted.run_id, timeout_s=WAIT_S)

    assert run["status"] == "failed", run
    assert run["error_code"] == REPEATED_IDENTICAL_TOOL_CALL
    assert "echo" in run["error_message"]
    assert f"{expected} times" in run["error_message"]
    assert run["boundary_seq"] == expected

    rounds = round_rows(ctx.engine, submitted.run_id)
    assert [r["boundary_seq"] for r in rounds] == list(range(expected))
    assert [r["repeat_count"] for r in rounds] == list(range(1, expected + 1))
    assert [r["outcome"] for r in rounds] == ["continue"] * (expected - 1) + ["fail"]
    fingerprints = {r["tool_fingerprint"] for r in rounds}
    assert len(fingerprints) == 1 and len(next(iter(fingerprints))) == 64

    calls = model_calls(ctx.engine, submitted.run_id)
    assert [(c["boundary_seq"], c["status"]) for c in calls] == [(b, "succeeded") for b in range(expected)]
    invocations = rows(ctx.engine, "SELECT boundary_seq, tool_name, result FROM tool_invocations "
                                   "WHERE run_id = :id ORDER BY boundary_seq", id=submitted.run_id)
    assert [(i["boundary_seq"], i["tool_name"], i["result"]) for i in invocations] == [
        (b, "echo", ECHO_ARGS) for b in range(expected)
    ]

    evs = _run_events(ctx, submitted.run_id)
    kinds = [e["kind"] for e in evs]
    assert kinds.count("breaker_tripped") == 1
    assert kinds.count("model_responded") == expected
    assert kinds[-2:] == ["breaker_tripped", "run_failed"]
    assert evs[-2]["data"] == {"tools": ["echo"], "repeat_count": expected}
    assert evs[-1]["data"] == {"error_code": REPEATED_IDENTICAL_TOOL_CALL, "message": run["error_message"]}
    assert [e["seq"] for e in evs] == list(range(1, len(evs) + 1))

    # The count really travelled between processes: both workers committed rounds.
    committers = _committers(cluster, submitted.run_id, ("w1", "w2"), expected)
    assert sorted(committers) == list(range(expected))
    assert set(committers.values()) == {"w1", "w2"}, committers


# --- (2) a local tool is not the breaker's business --------------------------------------------


def test_identical_local_echo_rounds_are_not_stopped_by_the_breaker(cluster: Cluster, ctx) -> None:
    cluster.start_worker("w1", concurrency=2)
    wait_ready(cluster, "w1")

    to_max = client.submit(_request([LOCAL_ECHO_TURN] * 20, tools=["echo", "local_echo"], max_rounds=6), ctx=ctx)
    to_end = client.submit(
        _request([LOCAL_ECHO_TURN] * 5 + [{"content": "done"}], tools=["local_echo"], repeated_tool_call_limit=2),
        ctx=ctx,
    )
    run = wait_terminal(ctx.engine, to_max.run_id, timeout_s=WAIT_S)
    finished = wait_terminal(ctx.engine, to_end.run_id, timeout_s=WAIT_S)

    assert run["status"] == "failed", run
    assert run["error_code"] == MAX_ROUNDS_EXCEEDED
    assert run["boundary_seq"] == 6
    assert finished["status"] == "completed", finished
    assert finished["output"] == "done"
    assert finished["boundary_seq"] == 6

    for run_id, n in ((to_max.run_id, 6), (to_end.run_id, 6)):
        rounds = round_rows(ctx.engine, run_id)
        assert len(rounds) == n
        assert [r["repeat_count"] for r in rounds] == [0] * n
        assert [r["tool_fingerprint"] for r in rounds] == [None] * n
        assert len(model_calls(ctx.engine, run_id)) == n
        assert "breaker_tripped" not in [e["kind"] for e in _run_events(ctx, run_id)]
    domains = rows(ctx.engine, "SELECT DISTINCT tool_domain FROM tool_invocations WHERE run_id = :id",
                   id=to_max.run_id)
    assert domains == [{"tool_domain": "local"}]


# --- (3) a 1 MB tool output: stored whole, slimmed in the next context -------------------------

MB = 1_000_000


def test_a_one_megabyte_tool_output_is_stored_whole_and_slimmed_in_the_next_model_context(
    cluster: Cluster, ctx
) -> None:
    # Two one-thread workers alternate rounds: round 1 runs on the other worker (its
    # context loaded cold from the stored bodies), round 2 back on the first (its context
    # cached warm from round 0 plus what round 1 committed). Both must slim.
    cluster.start_worker("w1", concurrency=1)
    cluster.start_worker("w2", concurrency=1)
    wait_ready(cluster, "w1", "w2")

    script = [
        {"tool_calls": [{"name": "text_blob", "args": {"size_bytes": MB}}]},
        {"tool_calls": [{"name": "echo", "args": {"after": "blob"}}]},
        {"content": "read it"},
    ]
    submitted = client.submit(_request(script, tools=["text_blob", "echo"]), ctx=ctx)
    run = wait_terminal(ctx.engine, submitted.run_id, timeout_s=WAIT_S)
    assert run["status"] == "completed", run
    assert run["output"] == "read it"
    full = {"text": "x" * MB}

    # The invocation row, the event and the stored message keep every byte.
    invocations = rows(
        ctx.engine,
        "SELECT tool_call_id, status, result, octet_length(result->>'text') AS n FROM tool_invocations "
        "WHERE run_id = :id ORDER BY boundary_seq",
        id=submitted.run_id,
    )
    blob = invocations[0]
    assert (blob["tool_call_id"], blob["status"], blob["n"]) == ("call_0_0", "completed", MB)
    assert blob["result"] == full
    completed = [e for e in _run_events(ctx, submitted.run_id) if e["kind"] == "tool_completed"]
    assert completed[0]["data"] == {
        "tool_call_id": "call_0_0", "name": "text_blob", "status": "completed", "result": full
    }
    messages = rows(
        ctx.engine,
        f"SELECT position, boundary_seq, {BODY} AS body, chain_digest, octet_length({BODY}->'result'->>'text') AS n "
        "FROM messages AS m WHERE root_id = :root ORDER BY position",
        root=submitted.root_id,
    )
    assert [(m["position"], m["boundary_seq"], m["body"]["role"]) for m in messages] == [
        (0, 0, "user"), (1, 0, "assistant"), (2, 0, "tool"), (3, 1, "assistant"), (4, 1, "tool"), (5, 2, "assistant")
    ]
    assert messages[2]["n"] == MB
    assert messages[2]["body"] == {"role": "tool", "tool_call_id": "call_0_0", "name": "text_blob", "result": full}

    # The model's input in rounds 1 and 2 was the slimmed context: a few thousand tokens,
    # where the full output alone is 250,000.
    calls = model_calls(ctx.engine, submitted.run_id)
    assert [c["boundary_seq"] for c in calls] == [0, 1, 2]
    assert Message.from_json(messages[2]["body"]).token_count > 250_000
    for call in calls[1:]:
        assert MAX_TOOL_OUTPUT_BYTES // 4 < call["input_tokens"] < 10_000, calls

    # Each round's messages digest is the chain of the slimmed context, recomputed here
    # from the stored bodies with the default limit, and not the chain of the full bodies.
    stored = [Message.from_json(m["body"]) for m in messages]
    slimmed = [slim_tool_results_for_next_round(m, MAX_TOOL_OUTPUT_BYTES) for m in stored]
    assert slimmed[2] != stored[2] and slimmed[2].result is None
    assert slimmed[:2] + slimmed[3:] == stored[:2] + stored[3:]
    rounds = round_rows(ctx.engine, submitted.run_id)
    assert [r["messages_digest"] for r in rounds] == [context_chain(slimmed[:n]) for n in (1, 3, 5)]
    assert rounds[1]["messages_digest"] != context_chain(stored[:3])
    assert [m["chain_digest"] for m in messages] == [context_chain(slimmed[: i + 1]) for i in range(6)]

    # Round 1 ran cold on the other worker, round 2 warm on the first one.
    committers = _committers(cluster, submitted.run_id, ("w1", "w2"), 3)
    assert committers[0] == committers[2] != committers[1], committers
    (claim1,) = events(cluster, committers[1], "round_claimed", run_id=submitted.run_id, boundary_seq=1)
    (claim2,) = events(cluster, committers[2], "round_claimed", run_id=submitted.run_id, boundary_seq=2)
    assert (claim1["cold"], claim2["cold"]) == (True, False)


# --- the context digest must not depend on which worker ran the round ---------------------------


def test_round_digests_match_the_stored_bodies_when_a_tool_result_holds_a_large_float(cluster: Cluster, ctx) -> None:
    # add(1e16, 0) returns the float 1e16: canonical JSON writes it "1e+16", but the
    # stored JSONB gives it back as the integer 10000000000000000. Rounds alternate
    # between two one-thread workers: round 1 is built cold from the stored bodies,
    # round 2 warm from the first worker's cache. Every round's messages digest (and
    # every stored chain digest) must be the chain recomputed from the stored bodies,
    # whichever worker built it.
    cluster.start_worker("w1", concurrency=1)
    cluster.start_worker("w2", concurrency=1)
    wait_ready(cluster, "w1", "w2")

    script = [
        {"tool_calls": [{"name": "add", "args": {"a": 1e16, "b": 0}}]},
        {"tool_calls": [{"name": "echo", "args": {"next": 1}}]},
        {"content": "ok"},
    ]
    submitted = client.submit(_request(script, tools=["add", "echo"]), ctx=ctx)
    run = wait_terminal(ctx.engine, submitted.run_id, timeout_s=WAIT_S)
    assert run["status"] == "completed", run

    messages = rows(ctx.engine, f"SELECT position, {BODY} AS body, chain_digest FROM messages AS m "
                                "WHERE root_id = :root ORDER BY position", root=submitted.root_id)
    assert len(messages) == 6
    context = [slim_tool_results_for_next_round(Message.from_json(m["body"]), MAX_TOOL_OUTPUT_BYTES)
               for m in messages]
    rounds = round_rows(ctx.engine, submitted.run_id)
    committers = _committers(cluster, submitted.run_id, ("w1", "w2"), 3)
    assert committers[0] == committers[2] != committers[1], committers

    expected = [context_chain(context[:n]) for n in (1, 3, 5)]
    assert [r["messages_digest"] for r in rounds] == expected, (
        "a round's messages digest depends on whether its worker built the context warm or cold"
    )
    assert [m["chain_digest"] for m in messages] == [context_chain(context[: i + 1]) for i in range(6)]
