"""Runs suspended by a real round in-process (``worker.engine.round.execute_round``), their inputs
delivered through ``worker.client``, and snapshots of every table the feature touches, so
a test can prove that a refusal changed nothing at all."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from uuid import UUID

from sqlalchemy import text

from runtime.proofs import ProofAuthority
from runtime.resume import ResumeRefused
from schema.store.bodies import message_body_sql
from schema.wire import OriginalToolRoundResume, RoundTask
from tests.support.db import rows
from tests.support.requests import PICK_COLOR, scripted_request
from worker import client
from worker.engine.resume import execute_resume
from worker.engine.round import RoundDisposition, execute_round

# Every table a round, a delivery or a resume writes (with their stable orders).
TABLES = {
    "runs": "id",
    "roots": "id",
    "run_checkpoints": "run_id",
    "rounds": "run_id, boundary_seq",
    "tool_invocations": "id",
    "messages": "id",
    "run_events": "id",
    "model_calls": "id",
    "local_reads": "run_id, tool_call_id, path",
    "prerequisites": "run_id, key",
    "tool_answers": "run_id, invocation_id",
    "tool_executions": "run_id, tool_call_id",
}



READ_ONE = [
    {"tool_calls": [{"name": "read_files", "args": {"paths": ["notes/a.txt"]}}]},
    {"content": "read"},
]



READ_AND_COUNT = [
    {
        "tool_calls": [
            {"name": "read_files", "args": {"paths": ["notes/a.txt", "notes/b.txt"]}},
            {"name": "count_words", "args": {"path": "poem.txt"}},
        ]
    },
    {"content": "read and counted"},
]



BODY_A = "alpha body: the quick brown fox"



BODY_B = "beta body\nsecond line"



POEM = "one two three\nfour five\n"



BODY = message_body_sql()  # a tool message's output is stored once, in tool_invocations



def snapshot(ctx: Any) -> dict[str, list[dict[str, Any]]]:
    return {name: rows(ctx.engine, f"SELECT * FROM {name} ORDER BY {order}") for name, order in TABLES.items()}



def assert_unchanged(ctx: Any, before: dict[str, list[dict[str, Any]]], what: str) -> None:
    after = snapshot(ctx)
    changed = [name for name in TABLES if after[name] != before[name]]
    assert not changed, f"{what} changed tables {changed}"



def run_row(ctx: Any, run_id: UUID) -> dict[str, Any]:
    return rows(ctx.engine, "SELECT * FROM runs WHERE id = :id", id=run_id)[0]



def submit(ctx: Any, turns: list[dict[str, Any]], tools: list[str], **kwargs: Any) -> UUID:
    return client.submit(scripted_request(turns, tools=tools, **kwargs), ctx=ctx).run_id



def suspended_run(ctx: Any, turns: list[dict[str, Any]], tools: list[str], **kwargs: Any) -> UUID:
    """A run whose round 0 ran for real and suspended."""
    run_id = submit(ctx, turns, tools, **kwargs)
    assert execute_round(ctx, RoundTask(run_id=run_id, boundary_seq=0)) is RoundDisposition.COMMITTED
    row = run_row(ctx, run_id)
    assert (row["status"], row["boundary_seq"], row["lease_expires_at"]) == ("suspended", 0, None)
    return run_id



def ready_read_one(ctx: Any) -> tuple[UUID, list[OriginalToolRoundResume]]:
    """A run suspended on one read_files call, its file delivered: ready to resume."""
    run_id = suspended_run(ctx, READ_ONE, ["read_files"])
    receipt = client.deliver(run_id, "call_0_0", {"notes/a.txt": BODY_A}, ctx=ctx)
    assert receipt.stored and len(receipt.resumes) == 1
    return run_id, receipt.resumes



def ready_read_and_count(ctx: Any) -> tuple[UUID, list[OriginalToolRoundResume]]:
    """A run suspended on read_files and count_words, all delivered: ready to resume."""
    run_id = suspended_run(ctx, READ_AND_COUNT, ["read_files", "count_words"])
    first = client.deliver(run_id, "call_0_0", {"notes/a.txt": BODY_A, "notes/b.txt": BODY_B}, ctx=ctx)
    assert first.stored and first.resumes == []  # count_words still waits
    second = client.deliver(run_id, "call_0_1", {"poem.txt": POEM}, ctx=ctx)
    assert second.stored and [r.tool_call_id for r in second.resumes] == ["call_0_0", "call_0_1"]
    return run_id, second.resumes



PICK = [{"tool_calls": [{"name": "pick_color", "args": {"hint": "warm"}}]}, {"content": "picked"}]


def _append(path: str) -> list[dict[str, Any]]:
    return [{"tool_calls": [{"name": "append_line", "args": {"path": path, "text": "t"}}]}, {"content": "done"}]


def ready_client_tool(ctx: Any, tmp: Path) -> tuple[UUID, list[OriginalToolRoundResume]]:
    """A run suspended on a client tool's call, its result sent: ready to resume."""
    run_id = suspended_run(ctx, PICK, [], client_tools=[PICK_COLOR])
    receipt = client.tool_result(run_id, "call_0_0", {"color": "red"}, ctx=ctx)
    assert receipt.stored and len(receipt.resumes) == 1
    return run_id, receipt.resumes


def ready_approval(ctx: Any, tmp: Path) -> tuple[UUID, list[OriginalToolRoundResume]]:
    """A run suspended on a call that needs approval, approved: ready to resume."""
    run_id = suspended_run(ctx, _append(str(tmp / "approved.txt")), ["append_line"], require_approval=["*"])
    receipt = client.approve(run_id, "call_0_0", ctx=ctx)
    assert receipt.stored and len(receipt.resumes) == 1
    return run_id, receipt.resumes


def ready_unknown_outcome(ctx: Any, tmp: Path) -> tuple[UUID, list[OriginalToolRoundResume]]:
    """A run suspended on an at_most_once call whose outcome is unknown (the start of an
    earlier execution planted, as a worker that died inside the handler leaves it), its
    result told: ready to resume."""
    run_id = submit(ctx, _append(str(tmp / "unknown.txt")), ["append_line"])
    with ctx.engine.begin() as conn:
        conn.execute(text("INSERT INTO tool_executions (run_id, tool_call_id, boundary_seq, claim_fence) "
                          "VALUES (:id, 'call_0_0', 0, 0)"), {"id": run_id})
    assert execute_round(ctx, RoundTask(run_id=run_id, boundary_seq=0)) is RoundDisposition.COMMITTED
    (wait,) = client.status(run_id, ctx=ctx).waiting_for
    assert wait.kind == "outcome_unknown"
    receipt = client.tool_result(run_id, "call_0_0", {"appended": "t"}, ctx=ctx)
    assert receipt.stored and len(receipt.resumes) == 1
    return run_id, receipt.resumes


def attempt(ctx: Any, resumes: list[OriginalToolRoundResume]) -> str:
    """``refused:<field>`` or the disposition of ``execute_resume``."""
    try:
        return execute_resume(ctx, resumes).value
    except ResumeRefused as exc:
        return f"refused:{exc.field}"



def drive(ctx: Any, run_id: UUID, *, max_steps: int = 10) -> dict[str, Any]:
    """Run the run in-process the way workers would (a round, or the resume of a ready
    suspended round) until it ends or waits; returns its row."""
    for _ in range(max_steps):
        row = run_row(ctx, run_id)
        if row["status"] not in ("queued", "running"):
            return row
        boundary = row["boundary_seq"]
        if rows(ctx.engine, "SELECT 1 FROM rounds WHERE run_id = :id AND boundary_seq = :b", id=run_id, b=boundary):
            disposition = execute_resume(ctx, ctx.store.pending_resumes(run_id))
        else:
            disposition = execute_round(ctx, RoundTask(run_id=run_id, boundary_seq=boundary))
        assert disposition is not RoundDisposition.DROPPED, f"run {run_id} at {boundary}: {row['status']}"
    raise AssertionError(f"run {run_id} did not end in {max_steps} steps")



def events_of(ctx: Any, run_id: UUID, kind: str) -> list[dict[str, Any]]:
    return [
        e["data"]
        for e in rows(ctx.engine, "SELECT kind, data FROM run_events WHERE run_id = :id ORDER BY seq", id=run_id)
        if e["kind"] == kind
    ]



def flip_last(value: str) -> str:
    return value[:-1] + ("0" if value[-1] != "0" else "1")



def forged_proof(resume: OriginalToolRoundResume) -> str:
    """A well-formed proof of the genuine fields under a secret that is not the server's."""
    return ProofAuthority(b"not-the-server-secret-0123456789").sign("tool_call", resume.projection_fields())



def resigned(ctx: Any, resume: OriginalToolRoundResume, **update: Any) -> OriginalToolRoundResume:
    """The resume with ``update`` applied and its proof re-signed with the real secret:
    only the field-by-field check against the stored suspension can refuse it."""
    altered = resume.model_copy(update=update)
    return altered.model_copy(update={"proof": ctx.runtime.base.proofs.sign("tool_call", altered.projection_fields())})
