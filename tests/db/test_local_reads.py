"""Durable local reads: delivered file bodies live in local_reads only, the model still sees
them, and the status shows what a suspended run waits for.

A run is suspended by a real round (``worker.engine.round.execute_round``), its input delivered
through ``worker.client`` (helpers in tests/support/suspensions.py). Every refusal is checked
against a snapshot of every table the feature touches: a refusal must change nothing at all.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any
from uuid import uuid4

from runtime.loop import drive_react_loop
from schema.store.store import Store
from schema.wire import RunStatus
from tests.support.db import observed, rows
from tests.support.store import HOLDER
from tests.support.suspensions import (
    READ_ONE,
    drive,
    run_row,
    suspended_run,
)
from worker import client
from worker.engine.ledger import LedgerHooks
from worker.engine.resume import execute_resume
from worker.engine.round import RoundDisposition, run_claimed

# --- durable local reads: where the bodies are, and what the status shows ---------------------------


def test_delivered_file_bodies_live_in_local_reads_only_and_the_model_still_sees_them(ctx) -> None:
    secret_body = f"BODY-{uuid4().hex} only the model and local_reads may hold this"
    run_id = suspended_run(ctx, READ_ONE, ["read_files"])
    receipt = client.deliver(run_id, "call_0_0", {"notes/a.txt": secret_body}, ctx=ctx)
    assert execute_resume(ctx, receipt.resumes) is RoundDisposition.COMMITTED
    warm = ctx.runtime.contexts.get(run_id)
    assert warm is not None

    # Round 1 on a cold worker: the claim joins the bodies in from the durable store.
    ctx.runtime.contexts.discard(run_id)
    claim = Store(ctx.engine).claim_round(run_id, 1, lease_s=30, after_position=-1, cold=True, holder=HOLDER)
    assert claim is not None
    seen: dict[str, Any] = {}

    def step(deps: Any, state: Any, hooks: Any = None) -> Any:  # (the shell may pass its own hooks)
        seen["state"] = state
        return drive_react_loop(deps, state, hooks or LedgerHooks(ctx, claim, observed(ctx, claim)))

    assert run_claimed(ctx, claim, None, step, observed(ctx, claim)) is RoundDisposition.COMMITTED
    cold = seen["state"]
    assert cold.history_digest == warm.history_digest
    assert secret_body in json.dumps([m.to_json() for m in cold.history])
    assert secret_body in json.dumps([m.to_json() for m in warm.history])
    assert run_row(ctx, run_id)["status"] == "completed"

    bodies = rows(ctx.engine, "SELECT body::text AS t FROM messages")
    assert bodies and not [b for b in bodies if secret_body in b["t"]], "a message stores the file body"
    for table, column in [("tool_invocations", "result"), ("run_events", "data")]:
        stored = rows(ctx.engine, f"SELECT coalesce({column}::text, '') AS t FROM {table}")
        assert not [s for s in stored if secret_body in s["t"]], f"{table}.{column} stores the file body"
    (read,) = rows(
        ctx.engine, "SELECT path, content, digest, size_bytes FROM local_reads WHERE run_id = :id", id=run_id
    )
    expected_digest = hashlib.sha256(secret_body.encode()).hexdigest()
    size = len(secret_body.encode())
    assert read == {"path": "notes/a.txt", "content": secret_body, "digest": expected_digest, "size_bytes": size}
    (tool,) = rows(ctx.engine, "SELECT status, result FROM tool_invocations WHERE run_id = :id", id=run_id)
    assert tool == {
        "status": "completed",
        "result": {
            "files": [{"path": "notes/a.txt", "status": "received", "digest": expected_digest, "size_bytes": size}]
        },
    }


def test_status_shows_what_a_suspended_run_waits_for(ctx) -> None:
    turns = [
        {
            "tool_calls": [
                {"name": "read_files", "args": {"paths": ["a.txt", "b.txt"]}},
                {"name": "await_prerequisite", "args": {"key": "approval"}},
            ]
        },
        {"content": "done"},
    ]
    run_id = suspended_run(ctx, turns, ["read_files", "await_prerequisite"])

    def waiting() -> list[tuple[Any, ...]]:
        view = client.status(run_id, ctx=ctx)
        return [(w.tool_call_id, w.tool_name, w.kind, w.paths, w.key, w.delivered) for w in view.waiting_for]

    view = client.status(run_id, ctx=ctx)
    assert (view.status, view.rounds, view.model_calls) == (RunStatus.SUSPENDED, 0, 1)
    assert waiting() == [
        ("call_0_0", "read_files", "local_read", ["a.txt", "b.txt"], None, False),
        ("call_0_1", "await_prerequisite", "prerequisite", None, "approval", False),
    ]
    client.deliver(run_id, "call_0_0", {"a.txt": "1", "b.txt": "2"}, ctx=ctx)
    assert client.status(run_id, ctx=ctx).status is RunStatus.SUSPENDED
    assert [w[-1] for w in waiting()] == [True, False]
    receipt = client.resolve(run_id, "approval", 42, ctx=ctx)
    assert len(receipt.resumes) == 2
    assert client.status(run_id, ctx=ctx).status is RunStatus.RUNNING
    assert execute_resume(ctx, receipt.resumes) is RoundDisposition.COMMITTED
    assert waiting() == []
    assert drive(ctx, run_id)["status"] == "completed"
    final = client.status(run_id, ctx=ctx)
    assert (final.status, final.rounds, final.model_calls, final.waiting_for) == (RunStatus.COMPLETED, 2, 2, [])
