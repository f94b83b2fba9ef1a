"""Proofs of rounds: a result whose projection this process did not issue is not recorded, and
a run whose stored round proof was tampered with fails instead of running.

A run is suspended by a real round (``worker.engine.round.execute_round``), its input delivered
through ``worker.client`` (helpers in tests/support/suspensions.py). Every refusal is checked
against a snapshot of every table the feature touches: a refusal must change nothing at all.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import text

from runtime.deps import DEV_SECRET
from runtime.loop import drive_react_loop
from runtime.proofs import OwnedRoundProjection, OwnedToolCallProjection, ProjectionRefused, ProofAuthority
from schema.store.store import Store
from schema.wire import RoundTask
from tests.support.db import observed, rows
from tests.support.store import HOLDER
from tests.support.suspensions import (
    READ_ONE,
    events_of,
    run_row,
    snapshot,
    submit,
)
from worker.engine import round as round_mod
from worker.engine.ledger import LedgerHooks
from worker.engine.round import RoundDisposition, execute_round, run_claimed

# --- proofs of rounds ------------------------------------------------------------------------------


def _copied_round(result: Any) -> Any:
    original = result.projection
    return dataclasses.replace(result, projection=OwnedRoundProjection(**original.fields(), proof=original.proof))


def _other_authority_round(result: Any) -> Any:
    """Issued by another authority with the same secret: its proof verifies here, but this
    process's driver did not issue it."""
    original = result.projection
    return dataclasses.replace(result, projection=ProofAuthority(DEV_SECRET).issue_round(**original.fields()))


def _copied_tool_call(result: Any) -> Any:
    invocations = []
    for inv in result.tool_invocations:
        if inv.projection is not None:
            p = inv.projection
            inv = dataclasses.replace(inv, projection=OwnedToolCallProjection(**p.fields(), proof=p.proof))
        invocations.append(inv)
    return dataclasses.replace(result, tool_invocations=tuple(invocations))


PROJECTION_TAMPERS: dict[str, Callable[[Any], Any]] = {
    "round projection copied": _copied_round,
    "round projection of another authority": _other_authority_round,
    "tool call projection copied": _copied_tool_call,
}


def test_a_result_whose_projection_this_process_did_not_issue_is_not_recorded(ctx) -> None:
    proofs = ctx.runtime.base.proofs
    for what, tamper in PROJECTION_TAMPERS.items():
        run_id = submit(ctx, READ_ONE, ["read_files"])
        claim = Store(ctx.engine).claim_round(run_id, 0, lease_s=30, after_position=-1, cold=True, holder=HOLDER)
        assert claim is not None
        seen: dict[str, Any] = {}

        def step(
            deps: Any,
            state: Any,
            hooks: Any = None,
            tamper: Callable[[Any], Any] = tamper,
            claim: Any = claim,
            seen: dict[str, Any] = seen,
        ) -> Any:
            genuine = drive_react_loop(deps, state, hooks or LedgerHooks(ctx, claim, observed(ctx, claim)))
            seen["genuine"] = genuine
            seen["tampered"] = tampered = tamper(genuine)
            return tampered

        before = snapshot(ctx)
        with pytest.raises(ProjectionRefused):
            run_claimed(ctx, claim, None, step, observed(ctx, claim))

        tampered = seen["tampered"]
        # The copies carry valid proofs: only their provenance is wrong.
        assert proofs.verifies("round", tampered.projection.fields(), tampered.projection.proof)
        for inv in tampered.tool_invocations:
            assert proofs.verifies("tool_call", inv.projection.fields(), inv.projection.proof)
        round_mod.record_of(ctx, claim, seen["genuine"])  # the genuine result would have been recorded

        after = snapshot(ctx)
        for name in ("rounds", "tool_invocations", "messages", "run_events", "local_reads"):
            assert after[name] == before[name], f"{what}: {name} changed"
        row = run_row(ctx, run_id)
        assert (row["status"], row["boundary_seq"], row["lease_expires_at"]) == ("running", 0, None), what


def _round_1_after_tampering(ctx: Any, assignment: str | None) -> tuple[Any, dict[str, Any], list[int], list[int]]:
    """Round 0 commits; its stored row is altered with ``assignment``; round 1 is executed
    on a cold worker. Returns the disposition, the run row, and the boundaries of model
    calls and rounds."""
    turns = [{"tool_calls": [{"name": "add", "args": {"a": 1, "b": 2}}]}, {"content": "three"}]
    run_id = submit(ctx, turns, ["add"])
    assert execute_round(ctx, RoundTask(run_id=run_id, boundary_seq=0)) is RoundDisposition.COMMITTED
    if assignment is not None:
        with ctx.engine.begin() as conn:
            conn.execute(text(f"UPDATE rounds SET {assignment} WHERE run_id = :id"), {"id": run_id})
    ctx.runtime.contexts.discard(run_id)
    disposition = execute_round(ctx, RoundTask(run_id=run_id, boundary_seq=1))
    calls = rows(ctx.engine, "SELECT boundary_seq FROM model_calls WHERE run_id = :id ORDER BY id", id=run_id)
    rounds = rows(ctx.engine, "SELECT boundary_seq FROM rounds WHERE run_id = :id ORDER BY boundary_seq", id=run_id)
    return disposition, run_row(ctx, run_id), [c["boundary_seq"] for c in calls], [r["boundary_seq"] for r in rounds]


TAMPERED_ROUND = {
    "messages_digest": "messages_digest = 'x'",
    "system_digest": "system_digest = 'x'",
    "claim_fence": "claim_fence = claim_fence + 1",
    "proof": "proof = CASE WHEN left(proof, 1) = '0' THEN '1' ELSE '0' END || substr(proof, 2)",
    "proof removed": "proof = NULL",
}


def test_a_run_whose_previous_round_proof_was_tampered_fails_instead_of_running(ctx) -> None:
    disposition, row, calls, rounds = _round_1_after_tampering(ctx, None)  # the control: untampered
    assert disposition is RoundDisposition.COMMITTED
    assert (row["status"], row["output"], calls, rounds) == ("completed", "three", [0, 1], [0, 1])

    for what, assignment in TAMPERED_ROUND.items():
        disposition, row, calls, rounds = _round_1_after_tampering(ctx, assignment)
        assert disposition is RoundDisposition.RUN_FAILED, what
        assert (row["status"], row["error_code"]) == ("failed", "ROUND_PROOF_INVALID"), what
        assert (calls, rounds) == ([0], [0]), f"{what}: round 1 ran on a tampered predecessor"
        assert [e["error_code"] for e in events_of(ctx, row["id"], "run_failed")] == ["ROUND_PROOF_INVALID"]


def test_a_non_ascii_stored_round_proof_fails_the_run_with_round_proof_invalid(ctx) -> None:
    disposition, row, calls, rounds = _round_1_after_tampering(ctx, "proof = repeat(chr(233), 64)")
    assert disposition is RoundDisposition.RUN_FAILED
    assert (row["status"], row["error_code"]) == ("failed", "ROUND_PROOF_INVALID")
    assert (calls, rounds) == ([0], [0])
