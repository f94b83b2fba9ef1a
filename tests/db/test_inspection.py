"""The run inspector's reads on a real PostgreSQL, runs driven by real rounds in process:
each round's context rebuilt from the store verifies against its stored
``messages_digest`` (slimmed tool outputs, a later run of the same Root, a rebuilt
context); a changed stored message shows as a mismatch; the full tool outputs and the
model-call ledger are there; another owner's run is 404."""

from __future__ import annotations

import json
from typing import Any
from uuid import UUID

import anyio
import httpx
from sqlalchemy import text

from runtime.rebuild import SUMMARY_PREFIX
from tests.support.env import BROKER_URL
from tests.support.requests import scripted_request
from tests.support.suspensions import drive
from worker import client
from worker.api import create_app
from worker.ops.settings import Settings

TOKEN_A, TOKEN_B = "inspect-a-" + "a" * 16, "inspect-b-" + "b" * 16
BLOB = [{"tool_calls": [{"name": "text_blob", "args": {"size_bytes": 5000}}]}, {"content": "done"}]


def call(ctx: Any, db_url: str, method: str, url: str, token: str = TOKEN_A, **kwargs: Any) -> httpx.Response:
    settings = Settings(
        database_url=db_url, broker_url=BROKER_URL, api_tokens=json.dumps({TOKEN_A: "team-a", TOKEN_B: "team-b"})
    )
    app = create_app(settings, lambda: ctx)

    async def go() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as http:
            return await http.request(method, url, headers={"Authorization": f"Bearer {token}"}, **kwargs)

    return anyio.run(go)


def run(ctx: Any, turns: list[dict[str, Any]], *, root_id: str | None = None, **kwargs: Any) -> UUID:
    request = scripted_request(turns, owner="team-a", root_id=root_id, **kwargs)
    request["config"]["policy"]["max_tool_output_bytes"] = 1024
    run_id = client.submit(request, ctx=ctx).run_id
    assert drive(ctx, run_id)["status"] == "completed"
    return run_id


def rounds_of(ctx: Any, db_url: str, run_id: UUID) -> list[dict[str, Any]]:
    response = call(ctx, db_url, "GET", f"/v1/runs/{run_id}/rounds")
    assert response.status_code == 200, response.text
    return response.json()["rounds"]  # type: ignore[no-any-return]


def test_every_round_of_a_run_verifies_against_the_context_rebuilt_from_the_store(ctx: Any, db_url: str) -> None:
    first = run(ctx, BLOB, tools=["text_blob"])
    rounds = rounds_of(ctx, db_url, first)
    assert [(r["boundary_seq"], r["outcome"], r["digest_check"]) for r in rounds] == [
        (0, "continue", "verified"), (1, "finish", "verified")]
    assert all(r["recomputed_digest"] == r["messages_digest"] for r in rounds)
    assert [m["role"] for m in rounds[0]["context"]] == ["user"]
    user, assistant, tool = rounds[1]["context"]
    assert (user["content"], assistant["role"], tool["role"]) == ("go", "assistant", "tool")
    # The model saw the output slimmed; the tool call row has it whole.
    assert "[output truncated for the model context" in tool["content"]
    (blob,) = rounds[0]["tool_calls"]
    assert (blob["tool_name"], blob["status"], blob["result"]) == ("text_blob", "completed", {"text": "x" * 5000})
    assert [len(r["model_calls"]) for r in rounds] == [1, 1]
    assert not any(r["duplicate_model_calls"] for r in rounds)
    # A second call at a boundary (as a holder that died after its call leaves behind).
    with ctx.engine.begin() as conn:
        conn.execute(text("INSERT INTO model_calls (run_id, boundary_seq, attempt, claim_fence, status, "
                          "request_digest) VALUES (:id, 1, 2, 9, 'started', 'again')"), {"id": first})
    again = rounds_of(ctx, db_url, first)
    assert [(len(r["model_calls"]), r["duplicate_model_calls"]) for r in again] == [(1, False), (2, True)]
    assert all(r["duration_ms"] is not None and r["duration_ms"] >= 0 for r in rounds)

    # A later run of the same Root saw the earlier run's conversation, then its own input.
    root_id = str(client.status(first, ctx=ctx).root_id)
    second = run(ctx, [{"content": "again"}], root_id=root_id, text_input="and now?")
    (only,) = rounds_of(ctx, db_url, second)
    assert only["digest_check"] == "verified"
    assert [m["role"] for m in only["context"]] == ["user", "assistant", "tool", "assistant", "user"]
    assert only["context"][-1]["content"] == "and now?"


def test_a_changed_stored_message_shows_as_a_digest_mismatch(ctx: Any, db_url: str) -> None:
    run_id = run(ctx, [{"tool_calls": [{"name": "add", "args": {"a": 2, "b": 3}}]}, {"content": "5"}])
    with ctx.engine.begin() as conn:
        conn.execute(
            text("UPDATE messages SET body = jsonb_set(body, '{content}', '\"gone\"') "
                 "WHERE run_id = :id AND role = 'user'"),
            {"id": run_id},
        )
    rounds = rounds_of(ctx, db_url, run_id)
    assert [r["digest_check"] for r in rounds] == ["mismatch", "mismatch"]
    assert rounds[0]["context"][0]["content"] == "gone"  # shown as stored now
    assert all(r["recomputed_digest"] != r["messages_digest"] for r in rounds)


def test_the_inspector_reads_are_scoped_to_the_tokens_owner(ctx: Any, db_url: str) -> None:
    mine = run(ctx, [{"content": "hi"}])
    waiting = client.submit(scripted_request([{"content": "later"}], owner="team-a"), ctx=ctx).run_id
    listed = call(ctx, db_url, "GET", "/v1/runs").json()["runs"]
    assert [(r["run_id"], r["status"], r["rounds"], r["model_calls"]) for r in listed] == [
        (str(waiting), "queued", 0, 0), (str(mine), "completed", 1, 1)]
    done = call(ctx, db_url, "GET", "/v1/runs", params={"status": "completed"}).json()["runs"]
    assert [r["run_id"] for r in done] == [str(mine)]
    bad = call(ctx, db_url, "GET", "/v1/runs", params={"status": "finished"})
    assert (bad.status_code, bad.json()["error"]["field"]) == (422, "status"), bad.text

    assert call(ctx, db_url, "GET", "/v1/runs", token=TOKEN_B).json() == {"runs": []}
    for method, path in [("GET", "rounds"), ("POST", "stream-token")]:
        theirs = call(ctx, db_url, method, f"/v1/runs/{mine}/{path}", token=TOKEN_B)
        assert (theirs.status_code, theirs.json()["error"]["code"]) == (404, "RUN_NOT_FOUND"), (path, theirs.text)
    issued = call(ctx, db_url, "POST", f"/v1/runs/{mine}/stream-token")
    assert issued.status_code == 200 and set(issued.json()) == {"token", "expires_at"}, issued.text


def test_after_a_context_rebuild_the_rounds_under_the_new_context_verify(ctx: Any, db_url: str) -> None:
    report = [{"tool_calls": [{"name": "echo", "args": {"report": f"region {i}: " + "figures and notes " * 6}}]}
              for i in range(5)]
    request = scripted_request([*report, {"content": "done"}], owner="team-a", tools=["echo"])
    request["config"]["model"]["context_limit_tokens"] = 330
    run_id = client.submit(request, ctx=ctx).run_id
    assert drive(ctx, run_id)["status"] == "completed"
    (cp,) = ctx.engine.connect().execute(
        text("SELECT boundary_seq, rebuilds FROM run_checkpoints WHERE run_id = :id"), {"id": run_id}).all()
    assert cp.rebuilds >= 1 and cp.boundary_seq > 0
    checks = [(r["boundary_seq"], r["digest_check"]) for r in rounds_of(ctx, db_url, run_id)]
    assert checks == [(b, "unchecked" if b < cp.boundary_seq else "verified") for b in range(6)]
    first = rounds_of(ctx, db_url, run_id)[cp.boundary_seq]["context"][0]
    assert first["role"] == "user" and first["content"].startswith(SUMMARY_PREFIX)  # the summary comes first
