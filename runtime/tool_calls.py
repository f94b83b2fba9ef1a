"""One tool call of a round, in the core: its answer, rejection, args, approval gate,
at-most-once record and handler, in that order (``run_tool``); the identifiers derived
from the run and the call (idempotency key, invocation id); the projection and proof of
a call that suspends (``with_call_projection``)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from uuid import UUID

from runtime.canonical import MAX_RESULT_DEPTH, digest, fits_json, json_problem
from runtime.deps import OrchestratorDeps
from runtime.hooks import RoundHooks
from runtime.messages import ToolCall
from runtime.models.base import ModelResponse
from runtime.outcomes import ToolInvocation
from runtime.state import RunState
from runtime.tools import (
    TOOL_ARGS_INVALID,
    Tool,
    ToolArgsInvalid,
    ToolContext,
    ToolEffect,
    ToolInputs,
    ToolOutcome,
    ToolSuspension,
    ToolTimedOut,
)
from runtime.tools.calls import failure_result
from schema.wire.errors import ErrorCode
from schema.wire.json import JsonValue
from schema.wire.vocab import ToolStatus


def run_tool(
    deps: OrchestratorDeps, state: RunState, call: ToolCall, inputs: ToolInputs, hooks: RoundHooks
) -> tuple[ToolInvocation, JsonValue]:
    """The call's invocation, and the result as the model's context shows it (None while
    the call is suspended)."""
    started_ns = time.time_ns()
    tool = deps.tools.get(call.name)
    if tool is None:
        outcome = ToolOutcome.failed(ErrorCode.TOOL_UNKNOWN, f"tool {call.name!r} is not enabled")
    else:
        outcome = _tool_outcome(deps, state, tool, call, inputs, hooks)
    result_digest = None
    result: JsonValue = None
    context: JsonValue = None
    if outcome.status != ToolStatus.SUSPENDED:
        try:
            result, context = _checked(outcome)
            result_digest = digest(result)
        except (ValueError, TypeError) as exc:  # ... or not JSON at all
            failure = failure_result(ErrorCode.TOOL_RESULT_INVALID, f"the tool's result cannot be stored: {exc}")
            outcome, result, context = ToolOutcome(ToolStatus.FAILED, failure, failure), failure, failure
            result_digest = digest(result)
    invocation = ToolInvocation(
        call=call,
        domain=tool.domain if tool else None,
        status=outcome.status,
        result=result,
        args_digest=digest(call.args),
        result_digest=result_digest,
        suspension=outcome.suspension,
        approval=inputs.approval,
    )
    hooks.tool_call_done(invocation, started_ns)
    return invocation, context


def _checked(outcome: ToolOutcome) -> tuple[JsonValue, JsonValue]:
    """The outcome's result and context, or ``ValueError`` naming the first thing in them
    that cannot be stored."""
    result, context = outcome.result, outcome.context
    if fits_json(result, max_depth=MAX_RESULT_DEPTH) and fits_json(context, max_depth=MAX_RESULT_DEPTH):
        return result, context
    bad = json_problem(result, "result", max_depth=MAX_RESULT_DEPTH) or json_problem(
        context, "result", max_depth=MAX_RESULT_DEPTH
    )
    raise ValueError(str(bad))


TOOL_REJECTED = ErrorCode.TOOL_REJECTED
# A tool with no timeout of its own still tells its handler when the round wants it done.
DEFAULT_TOOL_DEADLINE_S = 300.0


def _tool_outcome(
    deps: OrchestratorDeps, state: RunState, tool: Tool, call: ToolCall, inputs: ToolInputs, hooks: RoundHooks
) -> ToolOutcome:
    """One call, in order: an answer given for it (its result), a rejection, its args
    (as approved, maybe edited), the approval gate, the at-most-once record, the handler."""
    answer, approval = inputs.answer, inputs.approval
    if answer is not None and answer.kind == "result":
        status = ToolStatus.FAILED if answer.is_error else ToolStatus.COMPLETED
        return ToolOutcome(status, answer.value, answer.value)
    if approval is not None and approval.kind == "reject":
        return ToolOutcome.failed(TOOL_REJECTED, f"a person rejected this call: {approval.reason or 'no reason given'}")
    given = approval.value if approval is not None and approval.value is not None else call.args
    try:
        args = tool.parse_args(given if isinstance(given, dict) else {})
    except ToolArgsInvalid as exc:
        return ToolOutcome.failed(TOOL_ARGS_INVALID, f"{exc.path or 'args'}: {exc.message}")
    if approval is None and needs_approval(deps.policy.require_approval, call.name):
        return ToolOutcome.suspended(ToolSuspension("approval"))
    ctx = ToolContext(
        run_id=state.run_id or UUID(int=0),
        boundary_seq=state.boundary_seq,
        tool_call_id=call.id,
        attempt=state.attempt,
        owner=state.work_owner,
        idempotency_key=idempotency_key(state, call),
        deadline=time.time() + (tool.timeout_s or DEFAULT_TOOL_DEADLINE_S),
        inputs=inputs,
    )
    if tool.effect != ToolEffect.AT_MOST_ONCE:
        return tool.run(args, ctx)
    retry_of = answer.wait_id if answer is not None and answer.kind == "retry" else None
    prior = hooks.tool_call_starting(call, ctx, retry_of=retry_of)
    if prior is not None:
        if prior.status is not None:  # it ran to its end before: that is its result
            return ToolOutcome(prior.status, prior.result, prior.result)
        verified = tool.check(args, ctx)
        if verified is not None:
            return ToolOutcome.completed(verified)
        return ToolOutcome.suspended(ToolSuspension("outcome_unknown", reason=UNKNOWN_AFTER_CRASH))
    try:
        outcome = tool.run(args, ctx)
    except ToolTimedOut as exc:
        # No end is recorded: the handler may still be running (a thread cannot be
        # stopped) and may yet do its effect. Recording this suspension would clear the
        # start, as for a handler that waited for input, and a re-executed round would
        # run the handler again.
        return ToolOutcome.suspended(
            ToolSuspension("outcome_unknown",
                           reason=str(exc) or f"it did not finish within its timeout of {tool.timeout_s} s")
        )
    hooks.tool_call_finished(call, outcome)
    return outcome


UNKNOWN_AFTER_CRASH = "an earlier execution of this call started and never recorded its end"


def needs_approval(require_approval: Sequence[str], name: str) -> bool:
    return "*" in require_approval or name in require_approval


def idempotency_key(state: RunState, call: ToolCall) -> str:
    """The same for every execution of one call of one run, different for any other."""
    return digest({"idempotency": str(state.run_id), "boundary": state.boundary_seq, "call": call.id})[:32]


def with_unique_call_ids(response: ModelResponse, state: RunState) -> ModelResponse:
    """The response with every tool call id unique in the run's context: a provider that
    reuses an id (some local servers number calls per response) would otherwise pair two
    results with one call, and a run's invocations are keyed by id. A reused id becomes
    ``<id>_<round>_<index>`` (deterministic, so a re-executed round names it alike; the
    provider sees the new id in the history from then on). An id reused from before a
    context rebuild is caught by the database and fails the run (MODEL_TOOL_CALL_ID_REUSED)."""
    if not response.tool_calls:
        return response
    earlier = state.tally.call_ids
    used: set[str] = set()
    calls = []
    for i, call in enumerate(response.tool_calls):
        call_id = call.id
        while call_id in earlier or call_id in used:
            call_id = f"{call_id}_{state.boundary_seq}_{i}"
        used.add(call_id)
        calls.append(call if call_id == call.id else ToolCall(call_id, call.name, call.args))
    return replace(response, tool_calls=tuple(calls))


def invocation_id_for(state: RunState, call: ToolCall) -> str:
    """Deterministic per claim: a re-executed round (new fence) gets new ids."""
    return digest(
        {"run": str(state.run_id), "boundary": state.boundary_seq, "call": call.id, "fence": state.claim_fence}
    )[:32]


def with_call_projection(
    deps: OrchestratorDeps, state: RunState, invocation: ToolInvocation, round_proof: str
) -> ToolInvocation:
    projection = deps.proofs.issue_tool_call(
        run_id=str(state.run_id),
        boundary_seq=state.boundary_seq,
        claim_fence=state.claim_fence,
        tool_call_id=invocation.call.id,
        tool_domain=str(invocation.domain),
        args_digest=invocation.args_digest,
        invocation_id=invocation_id_for(state, invocation.call),
        work_owner=state.work_owner,
        round_proof=round_proof,
        suspension_digest=invocation.suspension.proof_digest() if invocation.suspension else None,
    )
    return replace(invocation, projection=projection)
