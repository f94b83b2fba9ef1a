"""The I/O shell of a context rebuild, run when the provider rejected a round's input as
too long (``RebuildRequired``), under the round's claim:

1. reserve_model_rebuild: a slot in the Root's open chain (ordinal 1, or 2 bound to the
   consumed 1; a third rejection in one chain is ``RebuildExhausted``);
2. prepare_model_rebuild_candidate: choose the source prefix and summarize it - once;
3. admit_model_rebuild_request: at REPEATABLE READ under the claim fence, verify the
   driver's proof and the prefix again, consume the build and advance the checkpoint
   (a serialization conflict retries only this transaction). If the source changed,
   prepare again, a bounded number of times.
The caller then runs the round again on the rebuilt context.
"""

from __future__ import annotations

from dataclasses import replace
from uuid import UUID

import structlog

from runtime.context import context_chain
from runtime.deps import OrchestratorDeps
from runtime.hooks import RoundHooks
from runtime.proofs import ProjectionRefused
from runtime.rebuild import (
    RebuildCandidate,
    RebuildSourceChanged,
    deterministic_summary,
    model_summarizer,
    plan_reservation,
    prepare_model_rebuild_candidate,
    summary_message,
    verify_prepared_prefix,
    with_previous,
)
from runtime.state import RunState
from schema.wire.claim import Claim
from worker.engine.bootstrap import WorkerContext

log = structlog.get_logger("aidawork.rebuild")

MAX_PREPARES = 3


def rebuild_context(
    ctx: WorkerContext, claim: Claim, state: RunState, deps: OrchestratorDeps, hooks: RoundHooks
) -> RunState:
    anchor = state.last_position
    predecessor = state.last_build_id if state.chain_anchor == anchor else None
    reservation = ctx.store.reserve_model_rebuild(
        run_id=claim.run_id,
        fence=claim.fence,
        boundary_seq=claim.boundary_seq,
        chain_anchor=anchor,
        predecessor_build_id=predecessor,
        plan_reservation=plan_reservation,
    )
    log.info("rebuild_reserved", build_id=str(reservation.build_id), ordinal=reservation.ordinal)
    summarizer = with_previous(state.summary, deterministic_summary)
    if deps.policy.context_summarizer == "model":
        summarizer = model_summarizer(deps.model, hooks, state.summary)
    for attempt in range(1, MAX_PREPARES + 1):
        sources = ctx.store.load_context_sources(claim.root_id, state.context_start)
        candidate = prepare_model_rebuild_candidate(sources, summarizer, reservation.ordinal)
        ctx.store.record_candidate(reservation.build_id, claim.run_id, claim.fence, candidate)
        try:
            _admit(ctx, claim, state, reservation.build_id, anchor, candidate)
            break
        except RebuildSourceChanged as exc:
            log.warning("rebuild_source_changed", attempt=attempt, reason=exc.message)
            if attempt == MAX_PREPARES:
                raise
    log.info("context_rebuilt", build_id=str(reservation.build_id), sources=len(candidate.source_message_ids))
    start = candidate.last_source_position + 1
    kept = state.positional()[start - state.context_start :]
    history = (summary_message(candidate.summary), *kept)
    return replace(
        state,
        history=history,
        history_digest=context_chain(history),
        context_start=start,
        summary=candidate.summary,
        last_build_id=reservation.build_id,
        chain_anchor=anchor,
    )


def _admit(
    ctx: WorkerContext, claim: Claim, state: RunState, build_id: UUID, anchor: int, candidate: RebuildCandidate
) -> None:
    proofs = ctx.runtime.base.proofs
    fields = {
        "run_id": str(claim.run_id),
        "boundary_seq": claim.boundary_seq,
        "build_id": str(build_id),
        "source_digest": candidate.source_digest,
    }
    # The driver's authorization for this request, bound to the fence it holds.
    proof = proofs.sign("rebuild", {**fields, "claim_fence": claim.fence})

    def authorize(current_fence: int) -> None:
        if not proofs.verifies("rebuild", {**fields, "claim_fence": current_fence}, proof):
            raise ProjectionRefused(
                f"run {claim.run_id}: the rebuild request is not authorized under fence {current_fence}"
            )

    ctx.store.admit_model_rebuild_request(
        build_id=build_id,
        run_id=claim.run_id,
        fence=claim.fence,
        boundary_seq=claim.boundary_seq,
        chain_anchor=anchor,
        context_start=state.context_start,
        candidate=candidate,
        authorize=authorize,
        verify_prefix=verify_prepared_prefix,
    )
