"""``aidawork audit`` against a real PostgreSQL: runs driven the way workers drive them
(rounds with tools, a suspension answered and resumed, a Root's second run, a rollback, a
fork, a cancel, a holder that died with its model call on the wire, an owner with a cap)
audit clean, the dead holder's call as a warning only; then each inconsistency planted by
hand is reported under its own check's code and no other, and the command exits 1 naming
it (0 when clean, 2 for a run that does not exist)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from uuid import UUID, uuid4

import pytest
from sqlalchemy import Engine, text

from schema.store import limits
from schema.store.audit import CHECKS, audit
from schema.store.errors import RunNotFound
from schema.wire.audit import AuditReport, Severity
from schema.wire.owners import OwnerLimitsChange
from tests.support.cluster import cli
from tests.support.db import rows
from tests.support.requests import scripted_request
from tests.support.store import claim, expire_lease, start_execution
from tests.support.suspensions import drive
from worker import client

CAPPED = "team-capped"
THREE_ROUNDS = [
    {"tool_calls": [{"name": "add", "args": {"a": 1, "b": 2}}]},
    {"tool_calls": [{"name": "echo", "args": {"x": 1}}]},
    {"content": "done"},
]
APPROVED = [{"tool_calls": [{"name": "echo", "args": {"x": 2}}]}, {"content": "approved"}]


def submit(ctx: Any, turns: list[dict[str, Any]], **kwargs: Any) -> UUID:
    extra = {k: kwargs.pop(k) for k in ("root_policy",) if k in kwargs}
    return client.submit({**scripted_request(turns, **kwargs), **extra}, ctx=ctx).run_id


def waiting_for_approval(ctx: Any, **kwargs: Any) -> UUID:
    run_id = submit(ctx, APPROVED, require_approval=["echo"], **kwargs)
    assert drive(ctx, run_id)["status"] == "suspended"
    return run_id


@dataclass(frozen=True)
class Runs:
    tools: UUID  # three rounds, two with a tool call, completed; owner CAPPED
    later: UUID  # the second run of the same Root, completed
    suspended: UUID  # waits for an approval
    queued: UUID  # submitted, never claimed; owner CAPPED


def base_runs(ctx: Any) -> Runs:
    limits.set_owner_limits(ctx.engine, CAPPED, OwnerLimitsChange(max_running=3))
    tools = submit(ctx, THREE_ROUNDS, owner=CAPPED)
    assert drive(ctx, tools)["status"] == "completed"
    root = str(client.status(tools, ctx=ctx).root_id)
    later = submit(ctx, [{"content": "again"}], root_id=root, owner=CAPPED)
    assert drive(ctx, later)["status"] == "completed"
    suspended = waiting_for_approval(ctx)
    queued = submit(ctx, [{"content": "later"}], owner=CAPPED)
    return Runs(tools, later, suspended, queued)


def errors(report: AuditReport) -> set[str]:
    return {p.check for p in report.problems if p.severity is Severity.ERROR}


def test_runs_driven_as_workers_drive_them_audit_clean(ctx: Any) -> None:
    runs = base_runs(ctx)
    # A suspension answered and resumed, on a Root that a rollback then reset.
    resumed = waiting_for_approval(ctx)
    client.approve(resumed, "call_0_0", ctx=ctx)
    assert drive(ctx, resumed)["status"] == "completed"
    root = str(client.status(runs.suspended, ctx=ctx).root_id)
    rolled = submit(ctx, [{"content": "instead"}], root_id=root, root_policy="rollback")
    assert drive(ctx, rolled)["status"] == "completed"
    # A fork of the three-round run at round 2, run to its end; a suspended run cancelled.
    forked = client.fork(runs.tools, {"at_round": 2, "edit_input": "once more"}, ctx=ctx).run_id
    assert drive(ctx, forked)["status"] == "completed"
    cancelled = waiting_for_approval(ctx)
    assert client.cancel(cancelled, ctx=ctx)
    # A holder that died with its model call on the wire: the next holder runs the round.
    died = submit(ctx, [{"content": "after a death"}])
    first = claim(ctx.engine, died)
    assert first is not None
    start_execution(ctx.engine, first)
    expire_lease(ctx.engine, died)
    assert drive(ctx, died)["status"] == "completed"

    report = audit(ctx.engine)

    assert report.clean and errors(report) == set(), report.problems
    assert report.runs_checked == 9
    assert [(p.check, p.severity, p.run_id, p.boundary_seq) for p in report.problems] == [
        ("call_unfinished", Severity.WARNING, died, 0)]
    assert "fence 1" in report.problems[0].message
    # Scoped: one run, or one owner's runs (the counter of that owner only).
    assert audit(ctx.engine, run_id=runs.tools).runs_checked == 1
    assert audit(ctx.engine, owner=CAPPED).runs_checked == 4  # with the fork
    with pytest.raises(RunNotFound):
        audit(ctx.engine, run_id=uuid4())
    with pytest.raises(RunNotFound):
        audit(ctx.engine, run_id=runs.tools, owner="team-test")


def execute(engine: Engine, sql: str, **params: Any) -> None:
    with engine.begin() as conn:
        assert conn.execute(text(sql), params).rowcount >= 1, sql


def first_position(engine: Engine, run_id: UUID, boundary_seq: int) -> int:
    found = rows(engine, "SELECT min(position) AS p FROM messages WHERE run_id = :id AND boundary_seq = :b",
                 id=run_id, b=boundary_seq)
    return int(found[0]["p"])


Plant = Callable[[Engine, Runs], None]

# Each planted inconsistency, the boundary it is at, and every check that must report it
# (a round deleted also orphans what its commit wrote with it).
PLANTS: dict[str, tuple[Plant, int | None, set[str]]] = {
    "middle_round_deleted": (
        lambda e, r: execute(e, "DELETE FROM rounds WHERE run_id = :id AND boundary_seq = 1", id=r.tools),
        1, {"rounds_missing", "message_orphan", "tool_call_orphan"},
    ),
    "message_gap": (
        lambda e, r: execute(e, "DELETE FROM messages WHERE run_id = :id AND position = :p", id=r.tools,
                             p=first_position(e, r.tools, 1)),
        1, {"message_gap"},
    ),
    "event_gap": (
        lambda e, r: execute(e, "DELETE FROM run_events WHERE run_id = :id AND seq = 2", id=r.tools),
        None, {"event_gap"},
    ),
    "round_fence_above_the_runs": (
        lambda e, r: execute(e, "UPDATE rounds SET claim_fence = claim_fence + 10 WHERE run_id = :id "
                             "AND boundary_seq = 2", id=r.tools),
        2, {"fence_ahead"},
    ),
    "owner_counter_off_by_one": (
        lambda e, r: execute(e, "UPDATE owners SET running = running + 1 WHERE owner = :o", o=CAPPED),
        None, {"owner_running"},
    ),
    "fences_out_of_order": (
        lambda e, r: execute(e, "UPDATE rounds SET claim_fence = 1 WHERE run_id = :id AND boundary_seq = 2",
                             id=r.tools),
        2, {"fence_order", "stale_commit", "round_unpaid"},  # that round's call is under a newer fence now
    ),
    "newer_claim_called_the_model": (
        lambda e, r: execute(
            e, "INSERT INTO model_calls (run_id, boundary_seq, attempt, claim_fence, status, request_digest) "
            "SELECT run_id, 1, 1, claim_fence + 1, 'failed', 'req' FROM rounds WHERE run_id = :id AND boundary_seq = 1",
            id=r.tools),
        1, {"stale_commit"},
    ),
    "ledger_row_lost": (
        lambda e, r: execute(e, "DELETE FROM model_calls WHERE run_id = :id AND boundary_seq = 1", id=r.tools),
        1, {"round_unpaid"},
    ),
    "call_beyond_the_boundary": (
        lambda e, r: execute(
            e, "INSERT INTO model_calls (run_id, boundary_seq, attempt, claim_fence, status, request_digest) "
            "SELECT id, boundary_seq + 4, 1, claim_fence, 'failed', 'req' FROM runs WHERE id = :id", id=r.tools),
        7, {"call_misplaced"},
    ),
    "message_at_a_boundary_without_round": (
        lambda e, r: execute(e, "UPDATE messages SET boundary_seq = 5 WHERE run_id = :id AND position = :p",
                             id=r.tools, p=first_position(e, r.tools, 2)),
        5, {"message_orphan"},
    ),
    "committed_round_left_suspended": (
        lambda e, r: execute(e, "UPDATE rounds SET outcome = 'suspend' WHERE run_id = :id AND boundary_seq = 0",
                             id=r.tools),
        0, {"round_misplaced"},
    ),
    "tool_call_left_suspended": (
        lambda e, r: execute(e, "UPDATE tool_invocations SET status = 'suspended' WHERE run_id = :id "
                             "AND boundary_seq = 0", id=r.tools),
        0, {"tool_call_orphan"},
    ),
    "suspended_with_nothing_to_wait_for": (
        lambda e, r: execute(e, "UPDATE runs SET status = 'suspended' WHERE id = :id", id=r.queued),
        0, {"suspended_without_wait"},
    ),
    "ended_without_finished_at": (
        lambda e, r: execute(e, "UPDATE runs SET finished_at = NULL WHERE id = :id", id=r.later),
        None, {"run_state"},
    ),
    "checkpoint_lost": (
        lambda e, r: execute(e, "DELETE FROM run_checkpoints WHERE run_id = :id", id=r.queued),
        None, {"checkpoint_missing"},
    ),
}


@pytest.mark.parametrize("planted", list(PLANTS))
def test_a_planted_inconsistency_is_reported_by_its_check_and_no_other(ctx: Any, planted: str) -> None:
    plant, boundary_seq, expected = PLANTS[planted]
    runs = base_runs(ctx)
    assert errors(audit(ctx.engine)) == set()

    plant(ctx.engine, runs)

    report = audit(ctx.engine)
    assert {p.check for p in report.problems} == expected, report.problems
    # A lost ledger row is a warning alone: a PostgreSQL crash loses the ledger's last rows.
    assert report.clean is (planted == "ledger_row_lost")
    found = [p for p in report.problems if p.check in expected]
    assert boundary_seq in {p.boundary_seq for p in found}, found
    if "owner_running" not in expected:
        assert {p.run_id for p in found} <= {runs.tools, runs.later, runs.queued}, found


def test_every_check_has_a_planted_case_or_a_clean_run_that_proves_it_quiet() -> None:
    planted = set().union(*(expected for _, _, expected in PLANTS.values()))
    assert {c.code for c in CHECKS} - planted == {"call_unfinished"}  # the clean test's dead holder shows it
    assert len({c.code for c in CHECKS}) == len(CHECKS)


def test_the_command_exits_1_naming_the_check_0_when_clean_and_2_for_an_unknown_run(ctx: Any, db_url: str) -> None:
    runs = base_runs(ctx)
    clean = cli(db_url, "audit", "--json")
    assert clean.returncode == 0, clean.stderr
    assert json.loads(clean.stdout) == {"clean": True, "runs_checked": 4, "problems": []}

    PLANTS["middle_round_deleted"][0](ctx.engine, runs)
    found = cli(db_url, "audit", "--json")
    assert found.returncode == 1, found.stderr
    report = json.loads(found.stdout)
    assert set(report) == {"clean", "runs_checked", "problems"} and report["clean"] is False
    assert all(set(p) == {"check", "severity", "run_id", "boundary_seq", "message"} for p in report["problems"])
    missing = [p for p in report["problems"] if p["check"] == "rounds_missing"]
    assert [(p["severity"], p["run_id"], p["boundary_seq"]) for p in missing] == [("error", str(runs.tools), 1)]

    table = cli(db_url, "audit")
    assert table.returncode == 1
    assert "rounds_missing" in table.stdout and table.stdout.splitlines()[-1].startswith("4 run(s) checked: ")
    # Another run is unaffected; a run that does not exist is bad input.
    assert cli(db_url, "audit", "--run", str(runs.later)).returncode == 0
    unknown = uuid4()
    refused = cli(db_url, "audit", "--run", str(unknown))
    assert refused.returncode == 2 and refused.stderr.strip() == f"aidawork: error: no run {unknown}"
