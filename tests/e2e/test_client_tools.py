"""Client tools with real workers, the CLI and the HTTP API: a call of a tool in the run's
``config.client_tools`` suspends the round (kind ``client_tool``, with the call's args), and
its result - from ``aidawork tool-result``, ``worker.client.tool_result`` or
``POST /v1/runs/{id}/tool-results`` - resumes it without asking the model again. A result
the run is not waiting for is refused and changes nothing; a failed result reaches the
model as a failed tool result."""

from __future__ import annotations

import json
import uuid
from typing import Any
from uuid import UUID

import pytest

from schema.store.bodies import event_data_sql, message_body_sql
from schema.store.suspensions import DeliveryRefused
from tests.support.api import A, ApiServer, B
from tests.support.cluster import Cluster, cli, wait_ready
from tests.support.db import calls_per_boundary, rows, wait_suspended, wait_terminal
from tests.support.requests import PICK_COLOR, scripted_request
from tests.support.suspensions import assert_unchanged, snapshot
from worker import client

ASK = [{"tool_calls": [{"name": "pick_color", "args": {"hint": "warm"}}]}, {"content": "picked"}]
READ = [{"tool_calls": [{"name": "read_files", "args": {"paths": ["a.txt"]}}]}, {"content": "read"}]


def submit(ctx: Any, turns: list[dict[str, Any]], **kwargs: Any) -> UUID:
    request = scripted_request(turns, owner="team-a", **kwargs)
    return client.submit(request, ctx=ctx).run_id


def tool_row(ctx: Any, run_id: UUID) -> dict[str, Any]:
    (row,) = rows(ctx.engine, "SELECT status, result FROM tool_invocations WHERE run_id = :id", id=run_id)
    return row


def tool_message(ctx: Any, run_id: UUID) -> dict[str, Any]:
    (row,) = rows(ctx.engine, f"SELECT {message_body_sql()} AS body FROM messages AS m "
                  "WHERE run_id = :id AND role = 'tool'", id=run_id)
    return row["body"]  # type: ignore[no-any-return]


def test_a_client_tools_result_from_the_cli_the_client_or_http_resumes_the_run_without_a_model_call(
    cluster: Cluster, api: ApiServer, ctx, db_url: str
) -> None:
    cluster.start_worker("w1", concurrency=4)
    wait_ready(cluster, "w1")
    by_cli, by_client, by_http, failed, cancelled = (submit(ctx, ASK, tools=[], client_tools=[PICK_COLOR])
                                                     for _ in range(5))
    reading = submit(ctx, READ, tools=["read_files"])
    for run_id in (by_cli, by_client, by_http, failed, cancelled, reading):
        wait_suspended(ctx.engine, run_id)
    assert client.cancel(cancelled, ctx=ctx)

    (wait,) = client.status(by_cli, ctx=ctx).waiting_for
    assert (wait.tool_call_id, wait.tool_name, wait.kind, wait.args, wait.delivered) == (
        "call_0_0", "pick_color", "client_tool", {"hint": "warm"}, False)
    (suspended,) = rows(ctx.engine, f"SELECT {event_data_sql()} AS data FROM run_events AS e "
                        "WHERE run_id = :id AND kind = 'tool_suspended'", id=by_cli)
    assert suspended["data"] == {"tool_call_id": "call_0_0", "name": "pick_color", "kind": "client_tool",
                                 "args": {"hint": "warm"}}
    shown = cli(db_url, "status", str(by_cli))
    assert shown.returncode == 0, shown.stderr
    needs = 'waiting: call_0_0 (pick_color) needs the client\'s result of pick_color({"hint": "warm"})'
    assert needs in shown.stdout
    assert f"answer with: aidawork tool-result {by_cli} call_0_0 --json VALUE" in shown.stdout
    shown_json = cli(db_url, "status", str(by_cli), "--json")
    assert shown_json.returncode == 0, shown_json.stderr
    (listed,) = json.loads(shown_json.stdout)["waiting_for"]
    assert {k: listed[k] for k in ("tool_call_id", "tool_name", "kind", "args")} == {
        "tool_call_id": "call_0_0", "tool_name": "pick_color", "kind": "client_tool", "args": {"hint": "warm"}}

    # Refusals: nothing stored, no event, no resume.
    before = snapshot(ctx)
    wrong_call = cli(db_url, "tool-result", str(by_cli), "call_9_9", "--json", '"red"')
    assert wrong_call.returncode == 2, wrong_call
    assert "not waiting for tool call 'call_9_9'" in wrong_call.stderr and wrong_call.stdout == ""
    http_wrong = api.http.post(f"/v1/runs/{by_http}/tool-results", json={"tool_call_id": "call_9_9", "result": 1},
                               headers=A)
    assert (http_wrong.status_code, http_wrong.json()["error"]["code"], http_wrong.json()["error"]["field"]) == (
        409, "DELIVERY_REFUSED", "tool_call_id"), http_wrong.text
    theirs = api.http.post(f"/v1/runs/{by_http}/tool-results", json={"tool_call_id": "call_0_0", "result": 1},
                           headers=B)
    unknown = api.http.post(f"/v1/runs/{uuid.uuid4()}/tool-results", json={"tool_call_id": "call_0_0", "result": 1},
                            headers=A)
    # Another owner's run answers exactly like a run that does not exist.
    assert (theirs.status_code, theirs.json()["error"]["code"]) == (404, "RUN_NOT_FOUND"), theirs.text
    assert (unknown.status_code, unknown.json()["error"]["code"]) == (404, "RUN_NOT_FOUND"), unknown.text
    with pytest.raises(DeliveryRefused, match="the run has ended"):
        client.tool_result(cancelled, "call_0_0", {"color": "red"}, ctx=ctx)
    with pytest.raises(DeliveryRefused, match="waits for files, not a result"):
        client.tool_result(reading, "call_0_0", {"a.txt": "text"}, ctx=ctx)
    with pytest.raises(DeliveryRefused, match="not an approval"):
        client.approve(by_client, "call_0_0", ctx=ctx)
    assert_unchanged(ctx, before, "refused results")

    answered = cli(db_url, "tool-result", str(by_cli), "call_0_0", "--json", '{"color": "red"}')
    assert answered.returncode == 0, answered.stderr
    assert answered.stdout == "call_0_0: result stored; the run resumes\n"
    receipt = client.tool_result(by_client, "call_0_0", {"color": "green"}, ctx=ctx)
    assert receipt.stored and [r.tool_call_id for r in receipt.resumes] == ["call_0_0"]
    body = {"tool_call_id": "call_0_0", "result": {"color": "blue"}}
    sent = api.http.post(f"/v1/runs/{by_http}/tool-results", json=body, headers=A)
    assert sent.json() == {"stored": True, "resuming": True}, sent.text
    again = api.http.post(f"/v1/runs/{by_http}/tool-results", json=body, headers=A)
    assert again.json() == {"stored": False, "resuming": False}, again.text
    error = {"tool_call_id": "call_0_0", "result": {"error": "the user closed the dialog"}, "is_error": True}
    assert api.http.post(f"/v1/runs/{failed}/tool-results", json=error, headers=A).json()["stored"] is True

    for run_id, color in [(by_cli, "red"), (by_client, "green"), (by_http, "blue")]:
        run = wait_terminal(ctx.engine, run_id)
        assert (run["status"], run["output"]) == ("completed", "picked"), run
        assert tool_row(ctx, run_id) == {"status": "completed", "result": {"color": color}}
        # One model call per boundary: round 0 was resumed, not asked of the model again.
        assert calls_per_boundary(ctx.engine, run_id) == {0: 1, 1: 1}
    run = wait_terminal(ctx.engine, failed)
    assert run["status"] == "completed", run
    assert tool_row(ctx, failed)["status"] == "failed"
    message = tool_message(ctx, failed)
    assert (message["is_error"], message["result"]) == (True, {"error": "the user closed the dialog"})
    assert calls_per_boundary(ctx.engine, failed) == {0: 1, 1: 1}
    assert rows(ctx.engine, "SELECT count(*) AS n FROM tool_answers WHERE run_id = :id", id=cancelled) == [{"n": 0}]
