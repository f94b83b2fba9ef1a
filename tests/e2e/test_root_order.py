from __future__ import annotations

from runtime.messages import Message
from schema.store.bodies import message_body_sql
from tests.support.cluster import Cluster, events
from tests.support.db import model_calls, rows, run_row, wait_terminal
from tests.support.requests import scripted_request
from tests.support.wait import wait_until
from worker import client

BODY = message_body_sql()  # a tool message's output is stored once, in tool_invocations


def test_runs_of_one_root_execute_one_at_a_time_in_submission_order(cluster: Cluster, ctx) -> None:
    cluster.start_worker("w1")
    first = client.submit(
        scripted_request(
            [{"tool_calls": [{"name": "sleep", "args": {"seconds": 1}}]}, {"content": "first done"}],
            text_input="first question",
        ),
        ctx=ctx,
    )
    # Run 2 is submitted to the same Root while run 1 is executing.
    wait_until(lambda: run_row(ctx.engine, first.run_id)["status"] == "running", what="run 1 to start")
    second = client.submit(
        scripted_request([{"content": "second done"}], root_id=str(first.root_id), text_input="second question"),
        ctx=ctx,
    )
    assert second.root_id == first.root_id
    assert (first.root_seq, second.root_seq) == (0, 1)

    run1 = wait_terminal(ctx.engine, first.run_id)
    run2 = wait_terminal(ctx.engine, second.run_id)
    assert (run1["status"], run1["output"]) == ("completed", "first done")
    assert (run2["status"], run2["output"]) == ("completed", "second done")

    # Run 2's task arrived while run 1 held the Root and was refused; it started only
    # after run 1 finished (handed on by run 1's last commit).
    assert events(cluster, "w1", "claim_refused", run_id=second.run_id, boundary_seq=0)
    assert run2["started_at"] >= run1["finished_at"]
    assert run1["started_at"] < run2["created_at"] < run1["finished_at"]

    # One conversation: run 2's messages continue run 1's positions in the Root.
    messages = rows(
        ctx.engine,
        f"SELECT position, run_id, role, {BODY} AS body FROM messages AS m WHERE root_id = :root ORDER BY position",
        root=first.root_id,
    )
    assert [(m["position"], m["run_id"], m["role"]) for m in messages] == [
        (0, first.run_id, "user"),
        (1, first.run_id, "assistant"),
        (2, first.run_id, "tool"),
        (3, first.run_id, "assistant"),
        (4, second.run_id, "user"),
        (5, second.run_id, "assistant"),
    ]
    assert messages[4]["body"] == {"role": "user", "content": "second question"}

    # Run 2's one model call was given run 1's whole transcript plus its own input: the
    # scripted model counts the input tokens of exactly the messages it was sent.
    (call,) = model_calls(ctx.engine, second.run_id)
    # Positions 0-4, plus the system prompt ("test": one token), as the scripted model counts.
    seen = sum(Message.from_json(m["body"]).token_count for m in messages[:5]) + 1
    own_only = Message.from_json(messages[4]["body"]).token_count
    assert call["input_tokens"] == seen
    assert call["input_tokens"] > own_only
