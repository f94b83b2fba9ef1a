"""Suspension with real worker processes: a suspended run holds no worker, the client's
delivery (Python API or ``aidawork deliver`` / ``aidawork resolve``) resumes it without
calling the model again, and a worker that dies while resuming is recovered from by the
reconciler with the resumed call run to completion exactly once."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from uuid import UUID

from sqlalchemy import Engine

from schema.store.bodies import event_data_sql, message_body_sql
from tests.support.cluster import Cluster, events, node_name, wait_exit, wait_ready
from tests.support.db import calls_per_boundary, model_calls, round_rows, rows, run_row, wait_suspended, wait_terminal
from tests.support.env import BROKER_URL, REPO, broker_app, process_environ
from tests.support.requests import scripted_request
from tests.support.wait import wait_until
from worker import client
from worker.engine.failpoints import EXIT_CODE

WAIT_S = 30.0

BODY = message_body_sql()
EVENT_DATA = event_data_sql()  # a tool message's output is stored once, in tool_invocations


def run_events(engine: Engine, run_id: UUID, kind: str, tool_call_id: str | None = None) -> list[dict[str, Any]]:
    found = rows(engine, f"SELECT {EVENT_DATA} AS data FROM run_events AS e WHERE run_id = :id AND kind = :k "
                 "ORDER BY seq", id=run_id, k=kind)
    return [e["data"] for e in found if tool_call_id is None or e["data"].get("tool_call_id") == tool_call_id]


def tool_rows(engine: Engine, run_id: UUID, tool_call_id: str) -> list[dict[str, Any]]:
    return rows(
        engine, "SELECT * FROM tool_invocations WHERE run_id = :id AND tool_call_id = :c", id=run_id, c=tool_call_id
    )


def tool_messages(engine: Engine, run_id: UUID, tool_call_id: str) -> list[dict[str, Any]]:
    return rows(
        engine,
        f"SELECT {BODY} AS body FROM messages AS m WHERE run_id = :id AND role = 'tool' AND body->>'tool_call_id' = :c",
        id=run_id,
        c=tool_call_id,
    )


def node_of(cluster: Cluster, name: str) -> str:
    return node_name(name)


def cli(db_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = process_environ()
    env.update({"AIDAWORK_DATABASE_URL": db_url, "AIDAWORK_BROKER_URL": BROKER_URL})
    return subprocess.run(
        [sys.executable, "-m", "worker.cli", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )


def test_a_suspended_run_holds_no_worker_and_completes_after_delivery(cluster: Cluster, ctx) -> None:
    app = broker_app()
    cluster.start_worker("w1", concurrency=2)
    cluster.start_beat()  # the reconciler runs too: it must leave a suspended run alone
    wait_ready(cluster, "w1")
    script = [{"tool_calls": [{"name": "read_files", "args": {"paths": ["docs/a.md"]}}]}, {"content": "read it"}]
    run_id = client.submit(scripted_request(script, tools=["read_files"]), ctx=ctx).run_id

    row = wait_suspended(ctx.engine, run_id)
    assert row["lease_expires_at"] is None
    assert [e["tool_call_id"] for e in run_events(ctx.engine, run_id, "tool_suspended")] == ["call_0_0"]
    node = node_of(cluster, "w1")

    def idle() -> bool:
        return (app.control.inspect(destination=[node], timeout=0.5).active() or {}).get(node) == []

    wait_until(idle, timeout_s=5, interval_s=0.1, what="the worker to hold no task while the run is suspended")
    # Longer than the dispatch grace and several reconcile intervals: nothing re-sends it.
    time.sleep(2.0)
    row = run_row(ctx.engine, run_id)
    assert (row["status"], row["boundary_seq"], row["lease_expires_at"], row["claim_fence"]) == (
        "suspended",
        0,
        None,
        1,
    )
    assert idle()
    assert len(model_calls(ctx.engine, run_id)) == 1
    assert events(cluster, "w1", "round_claimed", run_id=run_id) != []
    assert len(events(cluster, "w1", "round_claimed", run_id=run_id)) == 1
    view = client.status(run_id, ctx=ctx)
    assert [(w.tool_call_id, w.kind, w.paths) for w in view.waiting_for] == [("call_0_0", "local_read", ["docs/a.md"])]
    assert (view.rounds, view.model_calls) == (0, 1)

    receipt = client.deliver(run_id, "call_0_0", {"docs/a.md": "# A\nsome text\n"}, ctx=ctx)
    assert receipt.stored and [r.tool_call_id for r in receipt.resumes] == ["call_0_0"]
    run = wait_terminal(ctx.engine, run_id, timeout_s=WAIT_S)
    assert (run["status"], run["output"]) == ("completed", "read it"), run

    view = client.status(run_id, ctx=ctx)
    rounds = round_rows(ctx.engine, run_id)
    assert view.model_calls == len(rounds) == view.rounds == 2
    # The suspended round was not asked of the model again: one ledger row at boundary 0.
    assert calls_per_boundary(ctx.engine, run_id) == {0: 1, 1: 1}
    assert [r["outcome"] for r in rounds] == ["continue", "finish"]
    assert rounds[0]["resume_fence"] is not None and rounds[0]["resume_fence"] > rounds[0]["claim_fence"]
    resumed = events(cluster, "w1", "round_committed", run_id=run_id, boundary_seq=0, resumed=True)
    assert len(resumed) == 1


def test_an_sdk_tool_with_a_local_read_prerequisite_is_re_run_once_after_delivery(cluster: Cluster, ctx) -> None:
    cluster.start_worker("w1", concurrency=2)
    script = [{"tool_calls": [{"name": "count_words", "args": {"path": "poem.txt"}}]}, {"content": "counted"}]
    run_id = client.submit(scripted_request(script, tools=["count_words"]), ctx=ctx).run_id
    wait_suspended(ctx.engine, run_id)
    (suspended,) = tool_rows(ctx.engine, run_id, "call_0_0")
    assert (suspended["status"], suspended["tool_domain"]) == ("suspended", "sdk")
    assert suspended["suspension"] == {"kind": "local_read", "paths": ["poem.txt"]}

    poem = "the cat sat\non the mat today\n\nfin\n"
    client.deliver(run_id, "call_0_0", {"poem.txt": poem}, ctx=ctx)
    run = wait_terminal(ctx.engine, run_id, timeout_s=WAIT_S)
    assert (run["status"], run["output"]) == ("completed", "counted"), run

    (done,) = tool_rows(ctx.engine, run_id, "call_0_0")  # the same row, completed in place
    assert done["id"] == suspended["id"]
    assert (done["args"], done["args_digest"]) == (suspended["args"], suspended["args_digest"])
    assert done["invocation_id"] == suspended["invocation_id"]
    expected = {"path": "poem.txt", "lines": 4, "words": 8, "bytes": len(poem.encode())}
    assert (done["status"], done["result"]) == ("completed", expected)
    assert [e["result"] for e in run_events(ctx.engine, run_id, "tool_completed", "call_0_0")] == [expected]
    assert [m["body"]["result"] for m in tool_messages(ctx.engine, run_id, "call_0_0")] == [expected]
    assert len(run_events(ctx.engine, run_id, "round_resumed")) == 1
    assert calls_per_boundary(ctx.engine, run_id) == {0: 1, 1: 1}


def test_cli_resolve_and_deliver_resume_the_run_and_a_wrong_delivery_exits_2(
    cluster: Cluster, ctx, db_url: str, tmp_path: Path
) -> None:
    cluster.start_worker("w1", concurrency=2)
    script = [
        {"tool_calls": [{"name": "await_prerequisite", "args": {"key": "approval"}}]},
        {"tool_calls": [{"name": "read_files", "args": {"paths": ["report.txt"]}}]},
        {"content": "approved and read"},
    ]
    run_id = client.submit(scripted_request(script, tools=["await_prerequisite", "read_files"]), ctx=ctx).run_id
    wait_suspended(ctx.engine, run_id, 0)

    wrong_key = cli(db_url, "resolve", str(run_id), "other", "--value", "true")
    assert wrong_key.returncode == 2, wrong_key
    assert "not waiting for prerequisite 'other'" in wrong_key.stderr
    resolved = cli(db_url, "resolve", str(run_id), "approval", "--value", '{"by": "ops", "ok": true}')
    assert resolved.returncode == 0, resolved
    assert "approval: resolved; the run resumes" in resolved.stdout

    wait_suspended(ctx.engine, run_id, 1)
    local = tmp_path / "local-report.txt"
    local.write_text("quarterly numbers\n")
    wrong_path = cli(db_url, "deliver", str(run_id), "call_1_0", "--file", f"other.txt={local}")
    assert wrong_path.returncode == 2, wrong_path
    assert "asked for paths ['report.txt'], got ['other.txt']" in wrong_path.stderr
    wrong_call = cli(db_url, "deliver", str(run_id), "call_0_0", "--file", f"report.txt={local}")
    assert wrong_call.returncode == 2, wrong_call
    assert "not waiting for files for tool call 'call_0_0'" in wrong_call.stderr
    assert rows(ctx.engine, "SELECT * FROM local_reads") == []

    delivered = cli(db_url, "deliver", str(run_id), "call_1_0", "--file", f"report.txt={local}")
    assert delivered.returncode == 0, delivered
    assert "call_1_0: stored; the run resumes" in delivered.stdout

    run = wait_terminal(ctx.engine, run_id, timeout_s=WAIT_S)
    assert (run["status"], run["output"]) == ("completed", "approved and read"), run
    (approval,) = tool_rows(ctx.engine, run_id, "call_0_0")
    assert approval["result"] == {"key": "approval", "value": {"by": "ops", "ok": True}}
    (read,) = tool_rows(ctx.engine, run_id, "call_1_0")
    assert read["status"] == "completed" and read["result"]["files"][0]["path"] == "report.txt"
    assert calls_per_boundary(ctx.engine, run_id) == {0: 1, 1: 1, 2: 1}
    again = cli(db_url, "deliver", str(run_id), "call_1_0", "--file", f"report.txt={local}")
    assert again.returncode == 0, again
    assert "already delivered; nothing changed" in again.stdout


def test_a_worker_killed_while_resuming_is_recovered_and_the_call_completes_once(cluster: Cluster, ctx) -> None:
    cluster.start_worker("a", concurrency=1)
    script = [{"tool_calls": [{"name": "read_files", "args": {"paths": ["data.csv"]}}]}, {"content": "survived"}]
    run_id = client.submit(scripted_request(script, tools=["read_files"]), ctx=ctx).run_id
    wait_suspended(ctx.engine, run_id)
    cluster.signal("a", signal.SIGTERM)  # A is idle: the run holds no worker
    assert wait_exit(cluster, "a", timeout_s=WAIT_S) == 0

    cluster.start_worker("b", concurrency=1, env={"AIDAWORK_FAILPOINTS": "after_claim"})
    receipt = client.deliver(run_id, "call_0_0", {"data.csv": "a,b\n1,2\n"}, ctx=ctx)
    assert receipt.resumes
    assert wait_exit(cluster, "b", timeout_s=WAIT_S) == EXIT_CODE
    assert [e["failpoint"] for e in events(cluster, "b", "failpoint_hit")] == ["after_claim"]
    b_claims = events(cluster, "b", "round_claimed", run_id=run_id)
    assert [(e["boundary_seq"], e["claim_fence"], e["attempt"]) for e in b_claims] == [(0, 2, 1)]
    row = run_row(ctx.engine, run_id)
    assert (row["status"], row["boundary_seq"], row["claim_fence"]) == ("running", 0, 2)
    (still,) = tool_rows(ctx.engine, run_id, "call_0_0")
    assert still["status"] == "suspended"  # B died before it ran anything

    cluster.start_worker("c", concurrency=2)
    cluster.start_beat()
    run = wait_terminal(ctx.engine, run_id, timeout_s=WAIT_S)
    assert (run["status"], run["output"]) == ("completed", "survived"), run

    c_resumes = events(cluster, "c", "round_committed", run_id=run_id, boundary_seq=0, resumed=True)
    assert len(c_resumes) == 1
    c_claim = events(cluster, "c", "round_claimed", run_id=run_id, boundary_seq=0)
    assert [(e["claim_fence"], e["attempt"]) for e in c_claim] == [(3, 2)]

    (done,) = tool_rows(ctx.engine, run_id, "call_0_0")
    assert (done["status"], done["claim_fence"]) == ("completed", 3)
    assert len(tool_messages(ctx.engine, run_id, "call_0_0")) == 1
    assert len(run_events(ctx.engine, run_id, "tool_completed", "call_0_0")) == 1
    assert len(run_events(ctx.engine, run_id, "round_resumed")) == 1
    rounds = round_rows(ctx.engine, run_id)
    assert [(r["boundary_seq"], r["claim_fence"], r["resume_fence"]) for r in rounds] == [(0, 1, 3), (1, 4, None)]
    assert calls_per_boundary(ctx.engine, run_id) == {0: 1, 1: 1}
    assert [c["status"] for c in model_calls(ctx.engine, run_id)] == ["succeeded", "succeeded"]
    messages = rows(ctx.engine, "SELECT role FROM messages WHERE run_id = :id ORDER BY position", id=run_id)
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
