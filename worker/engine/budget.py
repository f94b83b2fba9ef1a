"""The round's side of spend budgets (``runtime.budget``, ``schema.store.budgets``): what
a refused reservation means for the round, and parking a run for its owner's budget."""

from __future__ import annotations

from uuid import UUID

import structlog

from runtime.budget import BudgetShortfall, BudgetWaitRequired, OwnerBudgetExceeded
from schema.store.budgets import BudgetRefused
from schema.wire.claim import Claim
from worker.engine.bootstrap import WorkerContext
from worker.ops.observability.rounds import RoundObservation

log = structlog.get_logger("aidawork.round")

BUDGET_WAIT = "budget_wait"  # the round's outcome label: parked for the owner's budget


def refusal_error(refused: BudgetRefused) -> OwnerBudgetExceeded | BudgetWaitRequired:
    """What the hook raises instead of making the call: with ``fail`` a model error that
    ends the round (and the run) with OWNER_BUDGET_EXCEEDED; with ``wait`` an error the
    loop passes on with the round unfinished (``run_claimed`` then parks the run)."""
    shortfall = BudgetShortfall(**refused.shortfall)
    log.info("model_call_refused", reason="owner_budget", on_budget=shortfall.on_budget,
             estimate=shortfall.estimate, token_budget=shortfall.token_budget, used=shortfall.used,
             reserved=shortfall.reserved)
    if shortfall.on_budget == "wait":
        return BudgetWaitRequired(shortfall)
    return OwnerBudgetExceeded(shortfall)


def park_for_budget(
    ctx: WorkerContext, claim: Claim, wait: BudgetWaitRequired, observation: RoundObservation
) -> tuple[UUID, ...]:
    """Suspend the run until its owner's budget can take the call (nothing of the round is
    stored: it starts over when woken, re-dispatched by beat or ``budget_changed``). A
    lost fence raises ``FenceLost``, as for any fenced write."""
    next_runs = ctx.store.park_for_budget(claim.run_id, claim.fence, claim.boundary_seq, wait.shortfall.to_json())
    ctx.runtime.contexts.discard(claim.run_id)  # it may resume on any worker, much later
    observation.ended(BUDGET_WAIT)
    log.info("run_parked", reason="owner_budget", window_ends_at=wait.shortfall.window_ends_at.isoformat(),
             estimate=wait.shortfall.estimate)
    return next_runs
