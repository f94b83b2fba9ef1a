"""``Store``: the store operations the worker shell uses (``worker.engine.round``, ``worker.engine.resume``,
``worker.engine.rebuild`` and ``worker.ops.celery_app.send_or_defer``), bound to one engine.

The one seam between the shell and PostgreSQL: each method is the module function of the
same name with the engine bound, and nothing else (no logic, no extra round trip). The
unit tests put an in-memory double with the same methods in its place
(``tests/support/memory_store.py``), kept honest against this one by a db test.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from uuid import UUID

from sqlalchemy import Engine

from schema.store import budgets, claims, effects, leases, rebuilds, resumes, rounds, routes, runs, suspensions
from schema.store.claims import ClaimRefusal
from schema.store.effects import ExecutionRecord
from schema.store.leases import Due
from schema.store.rebuilds import PlanReservation, Reservation, VerifyPrefix
from schema.store.resumes import SuspensionMaterial
from schema.wire import OriginalToolRoundResume
from schema.wire.claim import Claim, LoadedMessage
from schema.wire.rebuild import RebuildCandidate, SourceMessage
from schema.wire.record import Committed, RoundRecord
from schema.wire.route import Route


class Store:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    # --- claims ---------------------------------------------------------------------------

    def claim_round(
        self,
        run_id: UUID,
        boundary_seq: int,
        *,
        lease_s: float,
        after_position: int,
        cold: bool,
        holder: UUID,
        resume_of: list[str] | None = None,
        held_fence: int | None = None,
    ) -> Claim | None:
        return claims.claim_round(
            self.engine,
            run_id,
            boundary_seq,
            lease_s=lease_s,
            after_position=after_position,
            cold=cold,
            holder=holder,
            resume_of=resume_of,
            held_fence=held_fence,
        )

    def explain_refused_claim(self, run_id: UUID, boundary_seq: int, *, resume: bool) -> ClaimRefusal:
        return claims.explain_refused_claim(self.engine, run_id, boundary_seq, resume=resume)

    def load_messages(self, root_id: UUID, from_position: int) -> tuple[LoadedMessage, ...]:
        return claims.load_messages(self.engine, root_id, from_position)

    # --- rounds and the model-call ledger -------------------------------------------------

    def record_model_call_started(
        self, run_id: UUID, boundary_seq: int, attempt: int, fence: int, request_digest: str,
        estimate_tokens: int = 0,
    ) -> int:
        return rounds.record_model_call_started(
            self.engine, run_id, boundary_seq, attempt, fence, request_digest, estimate_tokens
        )

    def park_for_budget(self, run_id: UUID, fence: int, boundary_seq: int, wait: dict[str, Any]) -> tuple[UUID, ...]:
        return budgets.park_for_budget(self.engine, run_id, fence, boundary_seq, wait)

    def record_model_call_finished(
        self,
        call_id: int,
        run_id: UUID,
        fence: int,
        *,
        response_digest: str | None,
        input_tokens: int | None,
        output_tokens: int | None,
        error_code: str | None,
        response: dict[str, Any] | None = None,
    ) -> None:
        rounds.record_model_call_finished(
            self.engine,
            call_id,
            run_id,
            fence,
            response_digest=response_digest,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            error_code=error_code,
            response=response,
        )

    def commit_round(self, record: RoundRecord) -> Committed:
        return rounds.commit_round(self.engine, record)

    # --- at-most-once tool calls ----------------------------------------------------------

    def start_tool_execution(
        self, run_id: UUID, boundary_seq: int, tool_call_id: str, fence: int, *, retry_of: str | None
    ) -> ExecutionRecord | None:
        return effects.start_execution(self.engine, run_id, boundary_seq, tool_call_id, fence, retry_of=retry_of)

    def finish_tool_execution(
        self, run_id: UUID, tool_call_id: str, fence: int, status: str | None, result: object
    ) -> None:
        effects.finish_execution(self.engine, run_id, tool_call_id, fence, status, result)

    # --- giving a claim back, ending a run, dispatch --------------------------------------

    def release_lease(
        self, run_id: UUID, fence: int, *, round_at_fault: bool, dispatch_after_s: float | None = None
    ) -> bool:
        return leases.release_lease(
            self.engine, run_id, fence, round_at_fault=round_at_fault, dispatch_after_s=dispatch_after_s
        )

    def fail_claimed_run(self, run_id: UUID, fence: int, error_code: str, message: str) -> tuple[UUID, ...]:
        return runs.fail_claimed_run(self.engine, run_id, fence, error_code, message)

    def end_interrupted_run(self, run_id: UUID, fence: int) -> tuple[bool, tuple[UUID, ...]]:
        return runs.end_interrupted_run(self.engine, run_id, fence)

    def route_of(self, run_id: UUID, owner: str | None = None) -> Route:
        return routes.route_of(self.engine, run_id, owner)

    def due_of(self, run_id: UUID, owner: str | None = None) -> Due:
        return leases.due_of(self.engine, run_id, owner)

    def pending_resumes(self, run_id: UUID) -> list[OriginalToolRoundResume]:
        return suspensions.pending_resumes(self.engine, run_id)

    def dispatch_failed(self, run_id: UUID) -> None:
        leases.dispatch_failed(self.engine, run_id)

    # --- suspensions ----------------------------------------------------------------------

    def resume_if_ready(self, run_id: UUID) -> list[OriginalToolRoundResume]:
        return suspensions.resume_if_ready(self.engine, run_id)

    def load_suspension(self, invocation_id: str) -> SuspensionMaterial | None:
        return resumes.load_suspension(self.engine, invocation_id)

    # --- context rebuilds -----------------------------------------------------------------

    def reserve_model_rebuild(
        self,
        *,
        run_id: UUID,
        fence: int,
        boundary_seq: int,
        chain_anchor: int,
        predecessor_build_id: UUID | None,
        plan_reservation: PlanReservation,
    ) -> Reservation:
        return rebuilds.reserve_model_rebuild(
            self.engine,
            run_id=run_id,
            fence=fence,
            boundary_seq=boundary_seq,
            chain_anchor=chain_anchor,
            predecessor_build_id=predecessor_build_id,
            plan_reservation=plan_reservation,
        )

    def load_context_sources(self, root_id: UUID, from_position: int) -> list[SourceMessage]:
        return rebuilds.load_context_sources(self.engine, root_id, from_position)

    def record_candidate(self, build_id: UUID, run_id: UUID, fence: int, candidate: RebuildCandidate) -> None:
        rebuilds.record_candidate(self.engine, build_id, run_id, fence, candidate)

    def admit_model_rebuild_request(
        self,
        *,
        build_id: UUID,
        run_id: UUID,
        fence: int,
        boundary_seq: int,
        chain_anchor: int,
        context_start: int,
        candidate: RebuildCandidate,
        authorize: Callable[[int], None],
        verify_prefix: VerifyPrefix,
        after_snapshot: Callable[[], None] | None = None,
    ) -> None:
        rebuilds.admit_model_rebuild_request(
            self.engine,
            build_id=build_id,
            run_id=run_id,
            fence=fence,
            boundary_seq=boundary_seq,
            chain_anchor=chain_anchor,
            context_start=context_start,
            candidate=candidate,
            authorize=authorize,
            verify_prefix=verify_prefix,
            after_snapshot=after_snapshot,
        )
