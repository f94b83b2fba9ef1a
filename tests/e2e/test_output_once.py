"""A tool's output is stored once (its tool_invocations row); the tool message and the
``tool_completed`` event reference it, and every reader still gets the full raw output:
the next round's context, ``client.events`` (``aidawork watch``) and the API's event
stream (``read_event_tails``)."""

from __future__ import annotations

from typing import Any

from schema.store.owners import TailKey, read_event_tails
from tests.support.cluster import Cluster, wait_ready
from tests.support.db import rows
from tests.support.env import WAIT_S
from tests.support.requests import scripted_request
from worker import client

MARKER = "once-" + "x" * 100_000  # a 100 kB tool output


def test_a_100_kb_output_is_stored_once_and_read_back_whole(cluster: Cluster, ctx: Any) -> None:
    cluster.start_worker("w1")
    wait_ready(cluster, "w1")
    script = [{"tool_calls": [{"name": "echo", "args": {"text": MARKER}}]}, {"content": "echoed"}]
    submitted = client.submit(scripted_request(script, tools=["echo"]), ctx=ctx)
    view = client.wait(submitted.run_id, ctx=ctx, timeout_s=WAIT_S)
    assert (view.status, view.output) == ("completed", "echoed")

    def copies(sql: str) -> int:
        return sum(r["t"].count(MARKER) for r in rows(ctx.engine, sql, id=submitted.run_id))

    # Stored: once in the invocation, plus the call's own arguments (the model's request).
    assert copies("SELECT result::text AS t FROM tool_invocations WHERE run_id = :id") == 1
    assert copies("SELECT body::text AS t FROM messages WHERE run_id = :id AND role = 'tool'") == 0
    assert copies("SELECT data::text AS t FROM run_events WHERE run_id = :id AND kind = 'tool_completed'") == 0

    # Read back whole, by every reader.
    (completed,) = [e for e in client.events(submitted.run_id, ctx=ctx) if e.kind == "tool_completed"]
    assert completed.data["result"] == {"text": MARKER}
    tails = read_event_tails(ctx.engine, [TailKey(submitted.run_id, "team-test", 0)])
    (streamed,) = [e for tail in tails.values() for e in tail.events if e.kind == "tool_completed"]
    assert streamed.data == completed.data
    # The second model call saw the output in its context (the ledger's input tokens
    # count the 100 kB, slimmed to the policy's limit, not a reference).
    calls = rows(ctx.engine, "SELECT input_tokens FROM model_calls WHERE run_id = :id ORDER BY boundary_seq",
                 id=submitted.run_id)
    assert calls[1]["input_tokens"] > 4000
