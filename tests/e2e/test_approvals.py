"""Approvals with real workers, the CLI and the HTTP API: a call of a tool named in
``config.policy.require_approval`` (or any tool, with ``"*"``) suspends BEFORE it runs
(kind ``approval``, with the proposed args). Approved, it runs once - with the args as
proposed or as edited (the edit shows in the ``input_delivered`` and ``tool_completed``
events); rejected, it never runs and the model gets a ``TOOL_REJECTED`` failed result with
the reason, and the run goes on. Edited args that fail the tool's schema are refused and
nothing is stored."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from uuid import UUID

from schema.store.bodies import event_data_sql, message_body_sql
from tests.support.api import A, ApiServer, B
from tests.support.cluster import Cluster, cli, wait_ready
from tests.support.db import calls_per_boundary, rows, wait_suspended, wait_terminal
from tests.support.requests import scripted_request
from tests.support.suspensions import assert_unchanged, snapshot
from worker import client


def append_then(path: Path, text: str, *then: dict[str, Any]) -> list[dict[str, Any]]:
    call = {"name": "append_line", "args": {"path": str(path), "text": text}}
    return [{"tool_calls": [call]}, *then, {"content": "done"}]


def submit(ctx: Any, turns: list[dict[str, Any]], require_approval: list[str]) -> UUID:
    request = scripted_request(turns, tools=["append_line", "echo"], owner="team-a", require_approval=require_approval)
    return client.submit(request, ctx=ctx).run_id


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def events_of(ctx: Any, run_id: UUID, kind: str) -> list[dict[str, Any]]:
    found = rows(ctx.engine, f"SELECT {event_data_sql()} AS data FROM run_events AS e WHERE run_id = :id "
                 "AND kind = :k ORDER BY seq", id=run_id, k=kind)
    return [e["data"] for e in found]


def test_approve_as_proposed_or_edited_and_reject_each_do_what_was_decided(
    cluster: Cluster, api: ApiServer, ctx, db_url: str, tmp_path: Path
) -> None:
    cluster.start_worker("w1", concurrency=4)
    wait_ready(cluster, "w1")
    proposed, edited, rejected = tmp_path / "proposed.txt", tmp_path / "edited.txt", tmp_path / "rejected.txt"
    as_proposed = submit(ctx, append_then(proposed, "as proposed"), ["append_line"])
    as_edited = submit(ctx, append_then(edited, "before the edit"), ["*"])
    # After the rejection the model calls echo (no approval needed): the run went on.
    after = {"tool_calls": [{"name": "echo", "args": {"after": "the rejection"}}]}
    to_reject = submit(ctx, append_then(rejected, "never", after), ["append_line"])
    for run_id in (as_proposed, as_edited, to_reject):
        wait_suspended(ctx.engine, run_id)
    # Suspended before the handler ran: no line, no at-most-once start record.
    assert (lines(proposed), lines(edited), lines(rejected)) == ([], [], [])
    assert rows(ctx.engine, "SELECT * FROM tool_executions") == []
    (wait,) = client.status(as_proposed, ctx=ctx).waiting_for
    assert (wait.tool_call_id, wait.tool_name, wait.kind, wait.args) == (
        "call_0_0", "append_line", "approval", {"path": str(proposed), "text": "as proposed"})
    shown = cli(db_url, "status", str(as_proposed), "--json")
    assert shown.returncode == 0, shown.stderr
    (listed,) = json.loads(shown.stdout)["waiting_for"]
    assert (listed["tool_call_id"], listed["kind"], listed["args"]) == ("call_0_0", "approval", wait.args)

    # Edited args that fail the tool's schema: refused, naming the field; nothing stored.
    before = snapshot(ctx)
    bad = cli(db_url, "approve", str(as_proposed), "call_0_0", "--args", f'{{"path": "{proposed}", "text": 5}}')
    assert bad.returncode == 2, bad
    assert "REQUEST_INVALID: args.text: Input should be a valid string" in bad.stderr and bad.stdout == ""
    http_bad = api.http.post(f"/v1/runs/{as_edited}/approvals", headers=A,
                             json={"tool_call_id": "call_0_0", "decision": "approve", "args": {"text": "no path"}})
    assert (http_bad.status_code, http_bad.json()["error"]["field"]) == (422, "args.path"), http_bad.text
    theirs = api.http.post(f"/v1/runs/{as_edited}/approvals", headers=B,
                           json={"tool_call_id": "call_0_0", "decision": "reject", "reason": "not yours"})
    assert (theirs.status_code, theirs.json()["error"]["code"]) == (404, "RUN_NOT_FOUND"), theirs.text
    wrong_call = api.http.post(f"/v1/runs/{as_edited}/approvals", headers=A,
                               json={"tool_call_id": "call_1_0", "decision": "approve"})
    assert (wrong_call.status_code, wrong_call.json()["error"]["code"]) == (409, "DELIVERY_REFUSED"), wrong_call.text
    assert_unchanged(ctx, before, "refused approvals")

    approved = cli(db_url, "approve", str(as_proposed), "call_0_0")
    assert (approved.returncode, approved.stdout) == (0, "call_0_0: approved; the run resumes\n"), approved
    new_args = {"path": str(edited), "text": "after the edit"}
    sent = api.http.post(f"/v1/runs/{as_edited}/approvals", headers=A,
                         json={"tool_call_id": "call_0_0", "decision": "approve", "args": new_args})
    assert sent.json() == {"stored": True, "resuming": True}, sent.text
    refusal = cli(db_url, "reject", str(to_reject), "call_0_0", "--reason", "no writes on Fridays")
    assert (refusal.returncode, refusal.stdout) == (0, "call_0_0: rejected; the run resumes\n"), refusal

    for run_id in (as_proposed, as_edited, to_reject):
        run = wait_terminal(ctx.engine, run_id)
        assert (run["status"], run["output"]) == ("completed", "done"), run
    # Each ran once, with the args decided on (the line carries the call's idempotency key).
    assert [line.split("\t")[0] for line in lines(proposed)] == ["as proposed"]
    assert [line.split("\t")[0] for line in lines(edited)] == ["after the edit"]
    assert lines(rejected) == []
    (completed,) = events_of(ctx, as_edited, "tool_completed")
    assert completed["approval"] == {"decision": "approve", "args": new_args}
    assert completed["result"] == {"appended": "after the edit"}
    (delivered,) = events_of(ctx, as_edited, "input_delivered")
    assert (delivered["answer"], delivered["args"], delivered["resumable"]) == ("approve", new_args, True)
    assert events_of(ctx, as_proposed, "tool_completed")[0]["approval"] == {"decision": "approve"}
    decided = rows(ctx.engine, "SELECT run_id, approval FROM tool_invocations WHERE tool_call_id = 'call_0_0'")
    assert {r["run_id"]: r["approval"] for r in decided} == {
        as_proposed: {"decision": "approve"},
        as_edited: {"decision": "approve", "args": new_args},
        to_reject: {"decision": "reject", "reason": "no writes on Fridays"},
    }

    # The model saw the rejection as a failed result with the reason, and went on.
    (message,) = rows(ctx.engine, f"SELECT {message_body_sql()} AS body FROM messages AS m WHERE run_id = :id "
                      "AND role = 'tool' AND body->>'tool_call_id' = 'call_0_0'", id=to_reject)
    assert message["body"]["is_error"] is True
    assert message["body"]["result"]["error"]["code"] == "TOOL_REJECTED"
    assert "no writes on Fridays" in message["body"]["result"]["error"]["message"]
    assert [e["name"] for e in events_of(ctx, to_reject, "tool_completed")] == ["append_line", "echo"]

    # The model was asked once per round it had to answer; a decision costs no model call.
    assert calls_per_boundary(ctx.engine, as_proposed) == {0: 1, 1: 1}
    assert calls_per_boundary(ctx.engine, as_edited) == {0: 1, 1: 1}
    assert calls_per_boundary(ctx.engine, to_reject) == {0: 1, 1: 1, 2: 1}
