"""Idempotent submit through the CLI, the client and HTTP, and each root_policy with a
real worker: interrupt (the new run sees the old run's committed messages), rollback
(it does not), reject (nothing stored)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from runtime.messages import Message
from schema.store.bodies import message_body_sql
from schema.store.errors import RootBusy
from tests.support.api import A, ApiServer
from tests.support.cluster import Cluster, cli
from tests.support.db import model_calls, rows, run_row, wait_terminal
from tests.support.requests import scripted_request, without_owner
from tests.support.wait import wait_until
from worker import client

BODY = message_body_sql()
# Round 0 commits a tool round (3 messages); round 1's model call then takes 15 s: the
# run is active, with committed messages and a round in flight, when the next run comes.
BUSY = [{"tool_calls": [{"name": "echo", "args": {"x": 1}}]}, {"content": "too late", "latency_ms": 15_000}]


def root_messages(ctx: Any, root_id: Any) -> list[dict[str, Any]]:
    return rows(ctx.engine, f"SELECT position, run_id, {BODY} AS body FROM messages AS m WHERE root_id = :r "
                "ORDER BY position", r=root_id)


def busy_root(ctx: Any) -> tuple[Any, Any]:
    """A Root whose first run completed and whose second is in a round, 3 messages committed."""
    first = client.submit(scripted_request([{"content": "hi"}], text_input="hello"), ctx=ctx)
    wait_terminal(ctx.engine, first.run_id)
    busy = client.submit(scripted_request(BUSY, root_id=str(first.root_id), text_input="work"), ctx=ctx)
    wait_until(lambda: run_row(ctx.engine, busy.run_id)["boundary_seq"] == 1, what="the busy run's first round")
    return first, busy


def seen_tokens(messages: list[dict[str, Any]]) -> int:
    # As the scripted model counts its input: each message's tokens, plus the system prompt ("test").
    return sum(Message.from_json(m["body"]).token_count for m in messages) + 1


@pytest.mark.parametrize("policy", ["interrupt", "rollback"])
def test_interrupt_keeps_and_rollback_drops_the_active_runs_messages(cluster: Cluster, ctx: Any, policy: str) -> None:
    cluster.start_worker("w1")
    first, busy = busy_root(ctx)
    new = client.submit(
        {**scripted_request([{"content": "new"}], root_id=str(first.root_id), text_input="instead"),
         "root_policy": policy},
        ctx=ctx,
    )
    assert new.interrupted == (busy.run_id,)
    assert wait_terminal(ctx.engine, new.run_id)["output"] == "new"
    old = wait_terminal(ctx.engine, busy.run_id)
    assert (old["status"], old["interrupted_by"]) == ("cancelled", new.run_id)
    assert str(new.run_id) in old["error_message"]

    messages = root_messages(ctx, first.root_id)
    owners = [m["run_id"] for m in messages]
    kept = 3 if policy == "interrupt" else 0
    assert owners == [first.run_id] * 2 + [busy.run_id] * kept + [new.run_id] * 2
    assert [m["position"] for m in messages] == list(range(len(messages)))
    # What the new run's model was sent: everything before its answer, and nothing else.
    (call,) = model_calls(ctx.engine, new.run_id)
    assert call["input_tokens"] == seen_tokens(messages[:-1])
    # The inspector rebuilds what the new run's model saw, and the stored digest verifies.
    rounds = client_rounds(ctx, new.run_id)
    assert [r.digest_check for r in rounds.rounds] == ["verified"]


def client_rounds(ctx: Any, run_id: Any) -> Any:
    from runtime.prepare import parse_turn_config
    from schema.store import inspect as inspect_store
    from worker.api.inspection import rounds_view

    found = inspect_store.read_run_rows(ctx.engine, run_id, "team-test")
    policy = parse_turn_config(found.config, ctx.runtime.base.turn_config).policy
    return rounds_view(run_id, found, policy.max_tool_output_bytes)


def test_reject_refuses_a_busy_root_and_stores_nothing(cluster: Cluster, ctx: Any) -> None:
    cluster.start_worker("w1")
    first = client.submit(scripted_request(BUSY, text_input="work"), ctx=ctx)
    before = rows(ctx.engine, "SELECT (SELECT count(*) FROM runs) AS runs, (SELECT next_run_seq FROM roots) AS seq")
    with pytest.raises(RootBusy):
        client.submit({**scripted_request([{"content": "x"}], root_id=str(first.root_id)), "root_policy": "reject"},
                      ctx=ctx)
    assert rows(ctx.engine, "SELECT (SELECT count(*) FROM runs) AS runs, (SELECT next_run_seq FROM roots) AS seq") \
        == before
    request = {**scripted_request([{"content": "x"}], root_id=str(first.root_id)), "root_policy": "reject"}
    path = cluster.log_dir / "reject.json"
    path.write_text(json.dumps(request))
    refused = cli(cluster.db_url, "submit", str(path))
    assert refused.returncode == 2 and "ROOT_BUSY" in refused.stderr


def test_idempotent_submit_through_the_client_the_cli_and_http(
    api: ApiServer, cluster: Cluster, ctx: Any, tmp_path: Path
) -> None:
    request = {**scripted_request([{"content": "once"}]), "idempotency_key": "order-7"}
    first = client.submit(request, ctx=ctx)
    again = client.submit(request, ctx=ctx)
    assert (again.run_id, again.existing, first.existing) == (first.run_id, True, False)

    path = tmp_path / "request.json"
    path.write_text(json.dumps(request))
    replay = cli(cluster.db_url, "submit", str(path))
    assert (replay.returncode, replay.stdout.strip()) == (0, str(first.run_id))
    assert "existing run" in replay.stderr
    path.write_text(json.dumps({**request, "input": "another question"}))
    reused = cli(cluster.db_url, "submit", str(path))
    assert reused.returncode == 2 and "IDEMPOTENCY_KEY_REUSED" in reused.stderr

    api.wait_ready()
    body = without_owner(scripted_request([{"content": "over http"}], owner="team-a"))
    created = api.http.post("/v1/runs", json=body, headers={**A, "Idempotency-Key": "http-1"})
    replayed = api.http.post("/v1/runs", json={**body, "idempotency_key": "http-1"}, headers=A)
    assert (created.status_code, replayed.status_code) == (201, 200)
    assert replayed.json() == created.json()
    conflict = api.http.post("/v1/runs", json={**body, "input": "changed"}, headers={**A, "Idempotency-Key": "http-1"})
    assert conflict.status_code == 409
    assert conflict.json()["error"]["code"] == "IDEMPOTENCY_KEY_REUSED"
    assert conflict.json()["error"]["field"] == "idempotency_key"
    stored = rows(ctx.engine, "SELECT count(*) AS n FROM runs")[0]["n"]
    assert stored == 2  # one per key, whatever was sent
