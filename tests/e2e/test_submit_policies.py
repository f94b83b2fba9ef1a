"""Idempotent submit through the CLI, the client and HTTP, and each root_policy with a
real worker: interrupt (the old run's round in flight commits, the run ends at that
boundary, and the new run sees all its committed messages), rollback (cancelled at once;
the new run sees none of them), reject (nothing stored)."""

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
from tests.support.db import model_calls, rows, wait_terminal
from tests.support.requests import scripted_request, without_owner
from tests.support.wait import wait_until
from worker import client

BODY = message_body_sql()
# Round 0 commits a tool round (3 messages); round 1's model call then takes 3 s and asks
# for another tool: the run is active, with committed messages and a round in flight,
# when the next run comes. Round 2 would answer.
BUSY = [
    {"tool_calls": [{"name": "echo", "args": {"x": 1}}]},
    {"tool_calls": [{"name": "echo", "args": {"x": 2}}], "latency_ms": 3_000},
    {"content": "too late"},
]


def root_messages(ctx: Any, root_id: Any) -> list[dict[str, Any]]:
    return rows(ctx.engine, f"SELECT position, run_id, {BODY} AS body FROM messages AS m WHERE root_id = :r "
                "ORDER BY position", r=root_id)


def busy_root(ctx: Any) -> tuple[Any, Any]:
    """A Root whose first run completed and whose second is in a round, 3 messages committed."""
    first = client.submit(scripted_request([{"content": "hi"}], text_input="hello"), ctx=ctx)
    wait_terminal(ctx.engine, first.run_id)
    busy = client.submit(scripted_request(BUSY, root_id=str(first.root_id), text_input="work"), ctx=ctx)
    wait_until(lambda: any(c["boundary_seq"] == 1 for c in model_calls(ctx.engine, busy.run_id)),
               what="the busy run's second round calling its model")
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
    # An interrupt lets the round in flight finish; a rollback stops it at once.
    assert new.interrupting == ((busy.run_id,) if policy == "interrupt" else ())
    assert wait_terminal(ctx.engine, new.run_id)["output"] == "new"
    old = wait_terminal(ctx.engine, busy.run_id)
    code = "INTERRUPTED" if policy == "interrupt" else "ROLLED_BACK"
    assert (old["status"], old["error_code"], old["interrupted_by"]) == ("cancelled", code, new.run_id)
    assert str(new.run_id) in old["error_message"]
    # The interrupted run ended at boundary 2, after the round that was in flight: both of
    # its tool calls are on record, and its third model turn was never asked for.
    calls = [(c["boundary_seq"], c["stale"]) for c in model_calls(ctx.engine, busy.run_id)]
    tools = rows(ctx.engine, "SELECT boundary_seq FROM tool_invocations WHERE run_id = :r ORDER BY boundary_seq",
                 r=busy.run_id)
    if policy == "interrupt":
        assert old["boundary_seq"] == 2 and calls == [(0, False), (1, False)]
        assert [t["boundary_seq"] for t in tools] == [0, 1]
    else:
        assert old["boundary_seq"] == 1 and [t["boundary_seq"] for t in tools] == [0]

    messages = root_messages(ctx, first.root_id)
    owners = [m["run_id"] for m in messages]
    kept = 5 if policy == "interrupt" else 0
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


def test_an_interrupted_run_whose_worker_died_mid_round_ends_at_its_last_boundary(cluster: Cluster, ctx: Any) -> None:
    # A short lease, so the dead worker's round is given up soon.
    cluster.start_worker("w1", env={"AIDAWORK_LEASE_S": "5"})
    first, busy = busy_root(ctx)
    cluster.kill("w1")  # round 1 in flight: its model call is on the wire
    new = client.submit(
        {**scripted_request([{"content": "new"}], root_id=str(first.root_id), text_input="instead"),
         "root_policy": "interrupt"},
        ctx=ctx,
    )
    assert new.interrupting == (busy.run_id,)  # its lease is live: the round may still commit
    # The reconciler re-sends the round once the lease is out; its claim is refused (the
    # interrupt is pending) and the worker it reached ends the run there.
    cluster.start_worker("w2")
    cluster.start_beat()
    assert wait_terminal(ctx.engine, new.run_id, timeout_s=60)["output"] == "new"
    old = wait_terminal(ctx.engine, busy.run_id)
    assert (old["status"], old["error_code"], old["boundary_seq"]) == ("cancelled", "INTERRUPTED", 1)
    assert [m["run_id"] for m in root_messages(ctx, first.root_id)] == \
        [first.run_id] * 2 + [busy.run_id] * 3 + [new.run_id] * 2
    assert any(line.get("event") == "run_interrupted" for line in cluster.logs("w2"))
