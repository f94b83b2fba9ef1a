"""The hooks a claimed round runs under (``LedgerHooks``): the model-call ledger written
before and after each call, at-most-once tool executions recorded, token deltas
published, the round's observation fed, and the rate limit's turn waited for."""

from __future__ import annotations

from collections.abc import Callable

import structlog

from runtime.budget import estimate_input_tokens
from runtime.canonical import MAX_RESULT_DEPTH, json_problem
from runtime.errors import ModelError
from runtime.messages import ToolCall
from runtime.models.base import ModelRequest, ModelResponse
from runtime.outcomes import ToolInvocation
from runtime.tools import PriorExecution, ToolContext, ToolOutcome
from schema.store.budgets import BudgetRefused
from schema.wire.claim import Claim
from schema.wire.json import JsonObject
from schema.wire.vocab import ToolStatus
from worker.engine import failpoints
from worker.engine.bootstrap import WorkerContext
from worker.engine.budget import refusal_error
from worker.ops.deltas import FLUSH_S, MODEL_STREAM_RESTARTED, RunDelta
from worker.ops.observability.rounds import RoundObservation
from worker.ops.rate_limits import CallGate

log = structlog.get_logger("aidawork.round")


class PrestartedCall:
    """The ledger row a warm claim wrote for the round's first model call
    (``Claim.started_call_id``): the first call takes it; a row no call took (the round
    ended or was given back before calling) is dropped at the round's end, so the ledger
    holds only calls that may have been made. A holder that dies leaves the row: whether
    its call was made is unknown, and it is counted as made."""

    def __init__(self, claim: Claim) -> None:
        self._claim = claim
        self._call_id = claim.started_call_id

    def take(self) -> int | None:
        call_id, self._call_id = self._call_id, None
        return call_id

    def drop_if_unused(self, ctx: WorkerContext) -> None:
        call_id = self.take()
        if call_id is None:
            return
        try:
            ctx.store.drop_unused_model_call(call_id, self._claim.run_id, self._claim.fence)
        except Exception as exc:  # the round's own outcome matters more; the row stays
            log.warning("unused_model_call_kept", error=type(exc).__name__)


class LedgerHooks:
    """Writes the model-call ledger around the call: a row before (fenced, so a stale
    holder never pays for a call) and its outcome, usage and accepted response right
    after - recorded even when the fence was lost while the call was in flight (marked
    stale; then FenceLost). A round that goes on from an earlier holder's response writes
    nothing: that call is on the ledger already. With a rate limit (``gate``) the call
    first waits its turn, before its ledger row: a round given back to wait never paid.

    A warm claim may have written the first call's row itself (``PrestartedCall``): that
    call is made under it with no statement before it, and its "after" statement writes
    the request really sent."""

    def __init__(
        self,
        ctx: WorkerContext,
        claim: Claim,
        observation: RoundObservation,
        gate: CallGate | None = None,
        *,
        max_output_tokens: int = 0,
        prestarted: PrestartedCall | None = None,
    ) -> None:
        self._ctx = ctx
        self._claim = claim
        self._observation = observation
        self._gate = gate
        self._max_output_tokens = max_output_tokens
        self._call_id: int | None = None
        self._request_digest: str | None = None
        self._prestarted = prestarted
        # A claim that is not the round's first may follow a holder that streamed part of
        # this round already; so may a second model call under this claim (a rebuild).
        # (An earlier claim's call at this boundary is on the ledger, whether or not its
        # holder's death was charged to the round.)
        self._stream_restarts = claim.earlier_model_calls > 0
        self._streamed = False

    def model_call_started(self, request: ModelRequest, request_digest: str) -> None:
        c = self._claim
        input_tokens = estimate_input_tokens(request)  # once: the rate limit's and the budget's
        if self._gate is not None:
            self._gate.wait_turn(input_tokens, c.run_id, c.boundary_seq, c.route)
        estimate = input_tokens + self._max_output_tokens
        self._request_digest = request_digest
        prestarted = self._prestarted.take() if self._prestarted is not None else None
        if prestarted is not None:
            # The claim wrote this call's row (no rate limit, no budget: nothing to wait for).
            self._call_id = prestarted
        else:
            try:
                self._call_id = self._ctx.store.record_model_call_started(
                    c.run_id, c.boundary_seq, c.attempt, c.fence, request_digest, estimate
                )
            except BudgetRefused as refused:
                raise refusal_error(refused) from None  # the call is not made
        log.debug("model_called", messages=len(request.messages))
        self._observation.model_call_started()
        failpoints.hit("in_model_call", owner=c.owner)

    def model_call_finished(self, response: ModelResponse | None, error: ModelError | None) -> None:
        assert self._call_id is not None
        self._observation.model_call_finished(response, error)
        if self._streamed and self._ctx.deltas is not None:
            self._ctx.deltas.flush(FLUSH_S)  # the deltas go out before the round's events
        self._ctx.store.record_model_call_finished(
            self._call_id,
            self._claim.run_id,
            self._claim.fence,
            response_digest=response.digest() if response else None,
            input_tokens=response.usage.input_tokens if response else None,
            output_tokens=response.usage.output_tokens if response else None,
            error_code=error.code if error else None,
            response=_storable(response),
            request_digest=self._request_digest,
        )
        failpoints.hit("after_model_call", owner=self._claim.owner)

    def tool_call_starting(self, call: ToolCall, ctx: ToolContext, *, retry_of: str | None) -> PriorExecution | None:
        c = self._claim
        prior = self._ctx.store.start_tool_execution(c.run_id, c.boundary_seq, call.id, c.fence, retry_of=retry_of)
        if prior is None:
            log.info("tool_execution_started", tool_call_id=call.id, tool=call.name, retry=retry_of is not None)
            return None
        log.warning("tool_execution_found", tool_call_id=call.id, tool=call.name, ended=prior.status is not None,
                    executions=prior.executions)
        return PriorExecution(ToolStatus(prior.status) if prior.status else None, prior.result)

    def tool_call_finished(self, call: ToolCall, outcome: ToolOutcome) -> None:
        # Between the side effect and its record: what a crash inside the handler leaves.
        failpoints.hit("in_tool_call", owner=self._claim.owner)
        status = None if outcome.status == ToolStatus.SUSPENDED else str(outcome.status)
        self._ctx.store.finish_tool_execution(self._claim.run_id, call.id, self._claim.fence, status, outcome.result)

    def model_response_reused(self, request_digest: str) -> None:
        log.info("model_response_reused", request_digest=request_digest)
        self._observation.model_response_reused()
        # The round is where a call would have left it, response in hand: a round that
        # kills its worker from here on still does (and spends its attempts) when redone.
        failpoints.hit("after_model_call", owner=self._claim.owner)

    def tool_call_done(self, invocation: ToolInvocation, started_ns: int) -> None:
        self._observation.tool_call_done(invocation, started_ns)

    def model_delta_sink(self) -> Callable[[str], None] | None:
        c, publisher = self._claim, self._ctx.deltas
        if publisher is None:
            return None
        started = False

        def publish(text: str) -> None:
            nonlocal started
            if not started:
                started = self._streamed = True
                if self._stream_restarts:
                    restart = RunDelta(c.boundary_seq, kind=MODEL_STREAM_RESTARTED, attempt=c.attempt)
                    publisher.publish(c.run_id, restart)
                self._stream_restarts = True
            publisher.publish(c.run_id, RunDelta(c.boundary_seq, text, attempt=c.attempt))

        return publish


def _storable(response: ModelResponse | None) -> JsonObject | None:
    """The response as the ledger keeps it for a redone round, or None when it holds a
    value no jsonb column can (the round then fails with MODEL_RESPONSE_INVALID, and a
    redone round calls the model again rather than the ledger write failing here)."""
    if response is None:
        return None
    body = response.to_json()
    return body if json_problem(body, "response", max_depth=MAX_RESULT_DEPTH) is None else None
