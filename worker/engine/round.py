"""The I/O shell of one round, top to bottom:

1. claim the run at the expected boundary (fence + 1, lease), loading only the
   messages this process has not cached yet - one statement;
2. stop a poison round: too many failed executions at one boundary fail the run;
3. run exactly one round in the runtime core, under the lease keeper's heartbeat,
   with the model call written to the ledger before and after (or no call at all when
   the claim brought the response an earlier holder accepted for the same request);
4. commit the round - one fenced statement;
5. after the commit, enqueue what comes next (the next round, or the Root's next run).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from enum import StrEnum
from uuid import UUID

import structlog
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from runtime.budget import BudgetWaitRequired, OwnerBudgetExceeded
from runtime.context import loaded_context
from runtime.deps import OrchestratorDeps
from runtime.errors import ModelUnavailable, RequestInvalid
from runtime.hooks import RoundHooks
from runtime.loop import drive_react_loop, request_digest
from runtime.outcomes import Continue, RebuildRequired, RoundResult, Suspend
from runtime.prepare import prepare_turn
from runtime.proofs import ROUND_PROOF_INVALID
from runtime.rebuild import RebuildExhausted, RebuildPredecessorMismatch, RebuildSourceChanged, checkpoint_history
from runtime.record import round_record
from runtime.state import RunState
from runtime.tools import ToolsetUnavailable
from schema.store.claims import CHANGED_SINCE_CLAIM, INTERRUPT_PENDING, OWNER_AT_CAPACITY
from schema.store.errors import FenceLost, ToolCallIdReused
from schema.wire import RoundTask
from schema.wire.claim import Claim
from schema.wire.errors import ErrorCode
from schema.wire.record import Committed, RoundRecord
from worker.engine import failpoints
from worker.engine.bootstrap import WorkerContext
from worker.engine.budget import park_for_budget
from worker.engine.ledger import LedgerHooks, PrestartedCall
from worker.engine.rebuild import rebuild_context
from worker.ops.celery_app import send_next_runs, send_or_defer
from worker.ops.logging import bind
from worker.ops.observability.rounds import GIVEN_BACK, RUN_FAILED, RoundObservation
from worker.ops.rate_limits import RoundRateLimited, listening

log = structlog.get_logger("aidawork.round")

ROUND_ATTEMPTS_EXHAUSTED = ErrorCode.ROUND_ATTEMPTS_EXHAUSTED
CONFIG_INVALID = ErrorCode.CONFIG_INVALID
# Deaths of a round's holders allowed per attempt of the budget: a holder that dies
# before the round's execution is marked (loading a huge context, say) costs no attempt,
# but a round that always kills its worker so must still end. A death while other workers
# die too (schema.store.workers) costs neither.
UNSTARTED_CLAIMS_FACTOR = 3


class RoundDisposition(StrEnum):
    DROPPED = "dropped"  # not claimable: stale or duplicate delivery, nothing written
    COMMITTED = "committed"
    RUN_FAILED = "run_failed"  # ended without a round (poison, invalid stored config)
    PARKED = "parked"  # suspended for the owner's budget, nothing of the round stored


def execute_round(ctx: WorkerContext, task: RoundTask) -> RoundDisposition:
    cached = ctx.runtime.contexts.get(task.run_id)
    # The cache holds the boundary this process last committed: a claim of that boundary or
    # an earlier one succeeds only when the database lost that commit (a failover under
    # asynchronous replication, docs/how-to/postgres-failover.md). Building on such a cache
    # would commit after messages that no longer exist: the round is claimed cold instead.
    ahead = cached is not None and cached.boundary_seq >= task.boundary_seq
    if ahead:
        cached = None
    claim_started_ns = time.time_ns()
    held_fence = ctx.leases.take_unreleased(task.run_id)
    start_call_digest = _expected_request(ctx, cached)
    claim = claim_or_refuse(
        ctx,
        task.run_id,
        task.boundary_seq,
        lambda: ctx.store.claim_round(
            task.run_id,
            task.boundary_seq,
            lease_s=ctx.settings.lease_s,
            after_position=cached.last_position if cached else -1,
            cold=cached is None,
            holder=ctx.leases.worker_id,
            held_fence=held_fence,
            start_call_digest=start_call_digest,
        ),
        resume=False,
    )
    if claim is None:
        return RoundDisposition.DROPPED
    if ahead:
        ctx.runtime.contexts.discard(task.run_id)
        log.warning("context_cache_discarded", reason="ahead_of_database")
    prestarted = PrestartedCall(claim)
    try:
        observation = ctx.observe.claimed(claim, claim_started_ns, resume=False)
        return run_claimed(ctx, claim, cached, drive_react_loop, observation, prestarted)
    finally:
        prestarted.drop_if_unused(ctx)


def _expected_request(ctx: WorkerContext, cached: RunState | None) -> str | None:
    """The digest of the request this process expects the round to send, from its cached
    context (no new message since it cached it): with it, the claim writes the round's
    before-call ledger row in its own statement. None when the context is not cached, or
    when the call first waits for a rate limit's turn (no row before that)."""
    if cached is None or cached.deps is None:
        return None
    if ctx.rate_limits is not None and ctx.rate_limits.gate_for(cached.deps.call_limit) is not None:
        return None
    return request_digest(cached.deps, cached.history_digest)


def claim_or_refuse(
    ctx: WorkerContext, run_id: UUID, boundary_seq: int, claim: Callable[[], Claim | None], *, resume: bool
) -> Claim | None:
    """The claim ``claim`` makes, or None with the refusal logged. A claim refused on a
    snapshot older than the change that let the run start (``changed_since_claim``: the
    run meets every condition when read right after) is made once more; a duplicate
    delivery's claim is refused as usual, so nothing runs twice."""
    for _ in range(2):
        made = claim()
        if made is not None or log_refused_claim(ctx, run_id, boundary_seq, resume=resume) != CHANGED_SINCE_CLAIM:
            return made
    return None


def log_refused_claim(ctx: WorkerContext, run_id: UUID, boundary_seq: int, *, resume: bool) -> str:
    """Log why a claim was refused, and say it. A refused claim of a run that has not
    ended is worth a warning: the run may be waiting for a lease to expire or for the
    reconciler."""
    refusal = ctx.store.explain_refused_claim(run_id, boundary_seq, resume=resume)
    # A run waiting for a slot of its owner's cap, or to be ended by its interrupt, is
    # normal, not a warning; so is a run claimed again because it changed since the claim.
    normal = refusal.finished or refusal.reason in (OWNER_AT_CAPACITY, INTERRUPT_PENDING, CHANGED_SINCE_CLAIM)
    (log.info if normal else log.warning)("claim_refused", reason=refusal.reason, run=refusal.run, resume=resume)
    ctx.observe.claim_refused(refusal.reason)
    if refusal.reason == INTERRUPT_PENDING and refusal.run is not None:
        # Its last claim ended without a commit (its holder died or gave it back): the run
        # is at its boundary, where the interrupt ends it.
        ended, next_runs = ctx.store.end_interrupted_run(run_id, refusal.run["claim_fence"])
        if ended:
            ctx.runtime.contexts.discard(run_id)
            log.info("run_interrupted", at_boundary=boundary_seq)
        send_next_runs(ctx.store, ctx.dispatch, next_runs)
    return refusal.reason


RoundStep = Callable[[OrchestratorDeps, RunState, RoundHooks], RoundResult]

# Errors that say nothing about the round itself: a dependency was unavailable (the
# provider, the database connection), the claim was lost, or the process is stopping.
# Giving the claim back after one of them costs the round no attempt.
NOT_THE_ROUNDS_FAULT: tuple[type[BaseException], ...] = (
    ModelUnavailable,
    ToolsetUnavailable,
    OperationalError,
    InterfaceError,
    PoolTimeout,
    FenceLost,
    KeyboardInterrupt,
    SystemExit,
)


def round_at_fault(exc: BaseException) -> bool:
    """Whether an error raised while executing a round counts as an attempt of it."""
    return not isinstance(exc, NOT_THE_ROUNDS_FAULT)


def run_claimed(
    ctx: WorkerContext,
    claim: Claim,
    cached: RunState | None,
    step: RoundStep,
    observation: RoundObservation,
    prestarted: PrestartedCall | None = None,
) -> RoundDisposition:
    """Everything after a successful claim, for a round and for a resume alike;
    ``cached`` is this process's cached state of the run, if any; ``observation`` gets
    the round's metrics and spans; ``prestarted``: the before-call row the claim wrote."""
    bind(claim_fence=claim.fence)
    log.info("round_claimed", attempt=claim.attempt, cold=cached is None)
    exhausted = _attempts_exhausted(claim, ctx.settings.max_round_attempts)
    if exhausted is not None:
        return _fail_run(ctx, claim, ROUND_ATTEMPTS_EXHAUSTED, exhausted, observation)
    failpoints.hit("after_claim", owner=claim.owner)
    try:
        # Heartbeated, as the round itself is below: a cold state's build (the whole
        # history, the model's SDK client, a plugin's toolset) takes as long as it takes,
        # and the claim's lease must not run out under it while this process is alive.
        with ctx.leases.holding(claim.run_id, claim.fence):
            state = _state_after_claim(ctx, cached, claim)
    except RequestInvalid as exc:
        return _fail_run(ctx, claim, CONFIG_INVALID, f"the stored run config is not valid: {exc.message}", observation)
    except ToolsetUnavailable:
        # A tool of the run comes from an MCP server this process has not reached yet: give
        # the round back at once, costing no attempt; the task is retried after a backoff.
        observation.ended(GIVEN_BACK, error="ToolsetUnavailable")
        ctx.store.release_lease(claim.run_id, claim.fence, round_at_fault=False)
        raise
    previous = claim.previous_round
    # The next round verifies the proof its predecessor stored: a round row altered or
    # written by anyone without the server secret stops the run.
    if previous is not None and not ctx.runtime.base.proofs.verifies_stored_round(
        claim.run_id, claim.boundary_seq - 1, previous
    ):
        return _fail_run(
            ctx, claim, ROUND_PROOF_INVALID, f"the stored proof of round {claim.boundary_seq - 1} does not verify",
            observation,
        )

    try:
        deps = _deps(state)
        gate = ctx.rate_limits.gate_for(deps.call_limit) if ctx.rate_limits is not None else None
        hooks = LedgerHooks(
            ctx, claim, observation, gate, max_output_tokens=deps.max_output_tokens, prestarted=prestarted
        )
        observation.using_model(deps.provider, deps.model_name, deps.model_config)
        with ctx.leases.holding(claim.run_id, claim.fence), listening(gate):
            result = step(deps, state, hooks)
            while isinstance(result.outcome, RebuildRequired):
                state = rebuild_context(ctx, claim, state, deps, hooks)
                result = step(deps, state, hooks)
        observation.commit_started()
        committed = ctx.store.commit_round(record_of(ctx, claim, result))
    except (RebuildExhausted, RebuildSourceChanged, RebuildPredecessorMismatch, ToolCallIdReused) as exc:
        return _fail_run(ctx, claim, exc.code, exc.message, observation)
    except OwnerBudgetExceeded as exc:  # a rebuild's summary call (the round's own call ends in the loop)
        return _fail_run(ctx, claim, exc.code, exc.message, observation)
    except BudgetWaitRequired as wait:
        send_next_runs(ctx.store, ctx.dispatch, park_for_budget(ctx, claim, wait, observation), claim.owner)
        return RoundDisposition.PARKED
    except BaseException as exc:
        observation.ended(GIVEN_BACK, lease_lost=isinstance(exc, FenceLost), error=type(exc).__name__)
        # Give the run back at once rather than at lease expiry; a lost fence makes this a
        # no-op. With the database down the release fails too: the original error is the
        # one that matters (it decides the retry), and the lease expires on its own.
        at_fault = round_at_fault(exc)
        # A round given back to wait for its rate limit is re-sent with a countdown: the
        # reconciler's grace counts from then, so it does not send a duplicate meanwhile.
        later_s = exc.countdown_s if isinstance(exc, RoundRateLimited) else None
        try:
            ctx.store.release_lease(claim.run_id, claim.fence, round_at_fault=at_fault, dispatch_after_s=later_s)
        except Exception as release_error:
            log.warning("lease_release_failed", error=type(release_error).__name__)
            if not at_fault:  # the retried task, if this process gets it, takes the claim back
                ctx.leases.remember_unreleased(claim.run_id, claim.fence)
        raise

    observation.committed(result.outcome.kind)
    return _after_commit(ctx, claim, state, result, committed)


def _deps(state: RunState) -> OrchestratorDeps:
    assert state.deps is not None, "a claimed run's state carries its composed deps"
    return state.deps


def _after_commit(
    ctx: WorkerContext, claim: Claim, state: RunState, result: RoundResult, committed: Committed
) -> RoundDisposition:
    """Cache the new context, then (only now) enqueue what comes next."""
    outcome = result.outcome
    goes_on = isinstance(outcome, (Continue, Suspend)) and not committed.interrupted
    if goes_on and result.new_messages:
        new = tuple(m.context for m in result.new_messages)
        last = result.new_messages[-1]
        ctx.runtime.contexts.put(state.extended(new, last.position, last.chain_digest))
    elif not goes_on:
        ctx.runtime.contexts.discard(claim.run_id)
    log.info("round_committed", outcome=outcome.kind, messages=len(result.new_messages), resumed=result.resumed)
    if committed.interrupted:
        log.info("run_interrupted", at_boundary=claim.boundary_seq + (0 if isinstance(outcome, Suspend) else 1))
    failpoints.hit("after_commit", owner=claim.owner)

    if isinstance(outcome, Continue) and not committed.interrupted:
        send_or_defer(
            ctx.store, claim.run_id, lambda: ctx.dispatch.round(claim.run_id, claim.boundary_seq + 1, claim.route)
        )
    elif isinstance(outcome, Suspend) and not committed.interrupted:
        resumes = ctx.store.resume_if_ready(claim.run_id)
        if resumes:
            send_or_defer(ctx.store, claim.run_id, lambda: ctx.dispatch.resume(resumes, claim.route))
    # The run's end handed its Root's turn on, or its end or suspension gave back a slot
    # of its owner's cap: those runs start.
    send_next_runs(ctx.store, ctx.dispatch, committed.next_runs, claim.owner)
    failpoints.hit("after_enqueue", owner=claim.owner)
    return RoundDisposition.COMMITTED


def _attempts_exhausted(claim: Claim, max_attempts: int) -> str | None:
    """Why the round must not be tried again, or None. The budget is spent only by
    executions that started and failed because of the round; a holder that died before
    the execution started counts only toward a backstop three times as large, and one that
    died while workers that never held the round died too counts toward neither."""
    where = f"round {claim.boundary_seq}"
    if claim.attempt > max_attempts:
        return (
            f"{where} started executing {claim.attempt - 1} times without completing (its worker died or it "
            f"raised); the limit is {max_attempts} (AIDAWORK_MAX_ROUND_ATTEMPTS)"
        )
    if claim.claims > UNSTARTED_CLAIMS_FACTOR * max_attempts:
        return (
            f"{where} lost {claim.claims} holders without completing (its workers died holding it, "
            f"while no other worker died); the limit is "
            f"{UNSTARTED_CLAIMS_FACTOR} x {max_attempts} (AIDAWORK_MAX_ROUND_ATTEMPTS)"
        )
    return None


def _state_after_claim(ctx: WorkerContext, cached: RunState | None, claim: Claim) -> RunState:
    """The run's state under the claim: the cached context extended with the messages
    committed since, or (cold) built from the stored config and the whole history. The
    messages enter in context form, under this run's policy, and the context's chain
    digest is extended over them."""
    cp = claim.checkpoint
    new_messages = claim.new_messages
    if cached is not None and (cached.context_start, cached.summary) != (cp.context_start, cp.summary):
        # Another worker rebuilt the context since this process cached it: start over.
        new_messages = ctx.store.load_messages(claim.root_id, cp.context_start)
        cached = _empty_state(claim, cached.input, _deps(cached))
    if cached is None:
        assert claim.input is not None and claim.config is not None
        cached = _empty_state(claim, claim.input, prepare_turn(ctx.runtime, claim.config, claim.owner).deps)
    state = cached.under(claim)
    if new_messages:
        max_bytes = _deps(state).policy.max_tool_output_bytes
        loaded, chain = loaded_context(new_messages, max_bytes, state.history_digest)
        state = state.extended(loaded, new_messages[-1].position, chain)
    return state


def _empty_state(claim: Claim, text: str, deps: OrchestratorDeps) -> RunState:
    cp = claim.checkpoint
    history, history_digest = checkpoint_history(cp.summary)
    return RunState(
        input=text,
        run_id=claim.run_id,
        history=history,
        last_position=cp.context_start - 1,
        history_digest=history_digest,
        context_start=cp.context_start,
        summary=cp.summary,
        last_build_id=cp.last_build_id,
        chain_anchor=cp.chain_anchor,
        deps=deps,
    )


def _fail_run(
    ctx: WorkerContext, claim: Claim, code: str, message: str, observation: RoundObservation
) -> RoundDisposition:
    observation.ended(RUN_FAILED, error=code)
    next_runs = ctx.store.fail_claimed_run(claim.run_id, claim.fence, code, message)
    ctx.runtime.contexts.discard(claim.run_id)
    log.warning("run_failed", error_code=code, error_message=message)
    send_next_runs(ctx.store, ctx.dispatch, next_runs, claim.owner)
    return RoundDisposition.RUN_FAILED


def record_of(ctx: WorkerContext, claim: Claim, result: RoundResult) -> RoundRecord:
    """The round as the store takes it. Only results issued by this process's driver are
    stored: their projections must be in the proof authority's registry."""
    proofs = ctx.runtime.base.proofs
    if result.projection is not None:
        proofs.require_issued(result.projection)
    for invocation in result.tool_invocations:
        if invocation.projection is not None:
            proofs.require_issued(invocation.projection)
    return round_record(claim, result)
