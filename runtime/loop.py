"""drive_react_loop: exactly one ReAct round in, one RoundResult out; ``orchestrate``
drives a run's rounds one after another in this process (no persistence).

A round is: (on the run's first round) the user's input, one model call, then every tool
call the model asked for. Tool calls that need input the worker does not have suspend;
the others run. The result says what to persist (new messages with their Root
positions, context forms and chain digests, tool invocations, events, the round's
digests and proof) and what comes next (``Continue``, ``Finish``, ``Fail`` or
``Suspend``). Nothing here stores anything; the caller persists the result in one
transaction.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol
from uuid import UUID

from runtime.breaker import REPEATED_IDENTICAL_TOOL_CALL, CountedCall, RepeatedToolCallBreaker
from runtime.canonical import MAX_RESULT_DEPTH, chain_digest, digest, json_problem
from runtime.context import slim_tool_results_for_next_round
from runtime.deps import OrchestratorDeps
from runtime.errors import ModelError, ModelInputRejection
from runtime.messages import Message, ToolCall, tool_message, user_message
from runtime.models.base import ModelRequest, ModelResponse
from runtime.models.endings import complete_turn
from runtime.outcomes import (
    Continue,
    Fail,
    Finish,
    RebuildRequired,
    RoundDigests,
    RoundEvent,
    RoundOutcome,
    RoundResult,
    StoredMessage,
    Suspend,
    ToolInvocation,
)
from runtime.proofs import OwnedRoundProjection
from runtime.state import RunState
from runtime.tools import (
    NO_INPUTS,
    TOOL_ARGS_INVALID,
    PriorExecution,
    Tool,
    ToolArgsInvalid,
    ToolContext,
    ToolEffect,
    ToolInputs,
    ToolOutcome,
    ToolSuspension,
    ToolTimedOut,
)
from schema.wire import EventKind
from schema.wire.vocab import ToolStatus

MAX_ROUNDS_EXCEEDED = "MAX_ROUNDS_EXCEEDED"
MODEL_RESPONSE_INVALID = "MODEL_RESPONSE_INVALID"


class RoundHooks(Protocol):
    """Called around the model call, so the caller can record the call in its ledger
    before and after (and inject faults in tests); or, instead of both, once when the
    round goes on from a response an earlier holder was given (nothing to record)."""

    def model_call_started(self, request: ModelRequest, request_digest: str) -> None: ...

    def model_call_finished(self, response: ModelResponse | None, error: ModelError | None) -> None: ...

    def tool_call_starting(self, call: ToolCall, ctx: ToolContext, *, retry_of: str | None) -> PriorExecution | None:
        """Record that an ``at_most_once`` call's handler is about to start (fenced), or
        return what an earlier start recorded. ``retry_of``: an operator asked to run it
        again, answering the wait with this id; one answer restarts the call once."""
        ...

    def tool_call_finished(self, call: ToolCall, outcome: ToolOutcome) -> None:
        """Record how an ``at_most_once`` call ended (a suspension clears its start)."""
        ...

    def model_response_reused(self, request_digest: str) -> None: ...

    def tool_call_done(self, invocation: ToolInvocation, started_ns: int) -> None:
        """Any tool call has its outcome (``started_ns``: ``time.time_ns()`` when it
        began): for metrics and spans only, it records nothing durable."""
        ...

    def model_delta_sink(self) -> Callable[[str], None] | None:
        """Where the text of the model call about to start goes as it streams (asked once
        per call), or None: the round wants the response only."""
        ...


class NoHooks:
    def model_call_started(self, request: ModelRequest, request_digest: str) -> None:
        return None

    def model_call_finished(self, response: ModelResponse | None, error: ModelError | None) -> None:
        return None

    def tool_call_starting(self, call: ToolCall, ctx: ToolContext, *, retry_of: str | None) -> PriorExecution | None:
        return None

    def tool_call_finished(self, call: ToolCall, outcome: ToolOutcome) -> None:
        return None

    def model_response_reused(self, request_digest: str) -> None:
        return None

    def tool_call_done(self, invocation: ToolInvocation, started_ns: int) -> None:
        return None

    def model_delta_sink(self) -> Callable[[str], None] | None:
        return None


@dataclass
class Appender:
    """New messages of a round, each with its Root position, context form and chain
    digest."""

    position: int
    digest: str
    max_output_bytes: int
    stored: list[StoredMessage] = field(default_factory=list)

    @classmethod
    def after(cls, state: RunState, deps: OrchestratorDeps) -> Appender:
        return cls(state.last_position, state.history_digest, deps.policy.max_tool_output_bytes)

    def append(self, message: Message, context: Message | None = None) -> None:
        context = slim_tool_results_for_next_round(context or message, self.max_output_bytes)
        self.position += 1
        self.digest = chain_digest(self.digest, context.to_json())
        self.stored.append(StoredMessage(self.position, message, context, self.digest))

    def context(self) -> tuple[Message, ...]:
        return tuple(s.context for s in self.stored)


def request_digest(deps: OrchestratorDeps, messages_digest: str) -> str:
    return digest({"system": deps.system_digest, "messages": messages_digest, "tools": deps.tools_digest})


def drive_react_loop(deps: OrchestratorDeps, state: RunState, hooks: RoundHooks | None = None) -> RoundResult:
    """Do exactly one round of the run described by ``state``.

    A retryable model error (``ModelUnavailable``) propagates: the round did not happen
    and may be tried again. Every other model error ends the run with its code.

    When ``state`` carries the response an earlier holder of this round was given for
    this very request (same request digest: same system prompt, context and tools), the
    round goes on from it - the same tool calls, the same digests - and the model is not
    called again; a changed context (a rebuild, say) calls the model as usual.
    """
    hooks = hooks or NoHooks()
    new = Appender.after(state, deps)
    if state.boundary_seq == 0:
        new.append(user_message(state.input))
    messages_digest = new.digest
    asked = request_digest(deps, messages_digest)
    fresh = new.context()
    request = ModelRequest(
        system=deps.system_prompt,
        messages=state.history + fresh,
        tools=deps.tool_specs,
        messages_digest=messages_digest,
        round_index=state.boundary_seq,
        timeout_s=deps.policy.model_timeout_s,
        on_delta=hooks.model_delta_sink(),
        known_message_tokens=state.tally.tokens + sum(m.token_count for m in fresh),
    )
    try:
        response = complete_turn(request, deps.policy.on_truncation, LedgeredCalls(deps, state, hooks, asked))
    except ModelError as exc:
        if exc.retryable:
            raise
        outcome: RoundOutcome = Fail(exc.code, exc.message)
        if isinstance(exc, ModelInputRejection):
            outcome = RebuildRequired(exc.message)
        return _result(deps, state, new, outcome, [], _digests(deps, messages_digest, None))
    response = with_unique_call_ids(response, state)
    try:
        bad = json_problem(response.to_json(), "response", max_depth=MAX_RESULT_DEPTH)
        if bad is not None:
            raise ValueError(str(bad))
        response_digest = response.digest()
    except ValueError as exc:
        fail = Fail(MODEL_RESPONSE_INVALID, f"the model's response has a value with no JSON form: {exc}")
        return _result(deps, state, new, fail, [], _digests(deps, messages_digest, None))

    digests = _digests(deps, messages_digest, response_digest)
    new.append(response.as_message())
    events = [RoundEvent(EventKind.MODEL_RESPONDED, {"boundary_seq": state.boundary_seq, **response.to_json()})]
    if not response.tool_calls:
        finished = _result(deps, state, new, Finish(output=response.content or ""), events, digests)
        return replace(finished, finish_reason=response.finish_reason)
    round_projection = _issue_round(deps, state, digests)
    invocations = []
    for call in response.tool_calls:
        invocation, output = run_tool(deps, state, call, NO_INPUTS, hooks)
        if invocation.status == ToolStatus.SUSPENDED:
            invocation = with_call_projection(deps, state, invocation, round_projection.proof)
        invocations.append((invocation, output))
    closed = close_tool_round(deps, state, new, invocations, events, digests, projection=round_projection)
    return replace(closed, finish_reason=response.finish_reason)


class LedgeredCalls:
    """The round's model calls, each recorded by the hooks (the ledger); the first may be
    the response an earlier holder of this round was given for this very request."""

    def __init__(self, deps: OrchestratorDeps, state: RunState, hooks: RoundHooks, asked: str) -> None:
        self._deps = deps
        self._hooks = hooks
        self._asked = asked
        recorded = state.recorded_response
        self._reusable = (
            ModelResponse.from_json(recorded.response)
            if recorded is not None and recorded.request_digest == asked
            else None
        )

    def __call__(self, request: ModelRequest) -> ModelResponse:
        if self._reusable is not None:
            response, self._reusable = self._reusable, None
            self._hooks.model_response_reused(self._asked)
            return response
        self._hooks.model_call_started(request, request_digest(self._deps, request.messages_digest))
        try:
            response = self._deps.model.complete(request)
        except ModelError as exc:
            self._hooks.model_call_finished(None, exc)
            raise
        self._hooks.model_call_finished(response, None)
        return response


@dataclass(frozen=True)
class InProcessRun:
    outcome: RoundOutcome
    rounds: int
    messages: tuple[Message, ...]


def orchestrate(deps: OrchestratorDeps, state: RunState, hooks: RoundHooks | None = None) -> InProcessRun:
    """Every round of a run, in this process, until it stops continuing (finishes,
    fails, suspends or needs a rebuild): for tools, tests and the plain single-completion
    path. A worker runs one round per task instead (``worker.round``)."""
    while True:
        result = drive_react_loop(deps, state, hooks)
        state = state.after(result)
        if not isinstance(result.outcome, Continue):
            return InProcessRun(outcome=result.outcome, rounds=state.boundary_seq, messages=state.history)


def run_tool(
    deps: OrchestratorDeps, state: RunState, call: ToolCall, inputs: ToolInputs, hooks: RoundHooks
) -> tuple[ToolInvocation, ToolOutcome]:
    started_ns = time.time_ns()
    tool = deps.tools.get(call.name)
    if tool is None:
        outcome = ToolOutcome.failed("TOOL_UNKNOWN", f"tool {call.name!r} is not enabled")
    else:
        outcome = _tool_outcome(deps, state, tool, call, inputs, hooks)
    result_digest = None
    if outcome.status != ToolStatus.SUSPENDED:
        try:
            bad = json_problem(outcome.result, "result", max_depth=MAX_RESULT_DEPTH) or json_problem(
                outcome.context, "result", max_depth=MAX_RESULT_DEPTH
            )
            if bad is not None:
                raise ValueError(str(bad))
            result_digest = digest(outcome.result)
        except (ValueError, TypeError) as exc:  # ... or not JSON at all
            outcome = ToolOutcome.failed("TOOL_RESULT_INVALID", f"the tool's result cannot be stored: {exc}")
            result_digest = digest(outcome.result)
    invocation = ToolInvocation(
        call=call,
        domain=tool.domain if tool else None,
        status=outcome.status,
        result=outcome.result,
        args_digest=digest(call.args),
        result_digest=result_digest,
        suspension=outcome.suspension,
        approval=inputs.approval,
    )
    hooks.tool_call_done(invocation, started_ns)
    return invocation, outcome


TOOL_REJECTED = "TOOL_REJECTED"
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


# The waits someone answers about the call itself (its args are shown to them).
ANSWERED_KINDS = frozenset({"client_tool", "approval", "outcome_unknown"})


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


def close_tool_round(
    deps: OrchestratorDeps,
    state: RunState,
    new: Appender,
    invocations: Sequence[tuple[ToolInvocation, ToolOutcome]],
    events: list[RoundEvent],
    digests: RoundDigests,
    *,
    projection: OwnedRoundProjection | None = None,
    resumed: bool = False,
) -> RoundResult:
    """Append the tool results, then decide what comes next: suspend if any call waits
    for input, else the breaker and the round limit, else continue."""
    for invocation, output in invocations:
        call = invocation.call
        if invocation.status == ToolStatus.SUSPENDED:
            assert invocation.suspension is not None
            suspended = {"tool_call_id": call.id, "name": call.name, **invocation.suspension.to_json()}
            if invocation.suspension.kind in ANSWERED_KINDS:  # whoever answers sees what was asked
                # ... with the args a person approved, when they edited them (a client tool
                # then runs with those).
                approval = invocation.approval
                edited = approval.value if approval is not None and approval.kind == "approve" else None
                suspended["args"] = call.args if edited is None else edited
            events.append(RoundEvent(EventKind.TOOL_SUSPENDED, suspended))
            continue
        failed = invocation.status == ToolStatus.FAILED
        new.append(tool_message(call, invocation.result, is_error=failed),
                   tool_message(call, output.context, is_error=failed))
        completed = {"tool_call_id": call.id, "name": call.name, "status": invocation.status,
                     "result": invocation.result}
        if invocation.approval is not None:
            completed["approval"] = invocation.approval.decision_json()
        events.append(RoundEvent(EventKind.TOOL_COMPLETED, completed))
    waiting = tuple(i.call for i, _ in invocations if i.status == ToolStatus.SUSPENDED)
    fingerprint, repeat_count = None, 0
    outcome: RoundOutcome = Continue()
    if waiting:
        outcome = Suspend(waiting=waiting)
        events.append(RoundEvent(EventKind.RUN_SUSPENDED, {"waiting_for": [c.id for c in waiting]}))
    else:
        if not resumed:  # a round that suspended never counts for the breaker
            verdict = RepeatedToolCallBreaker(deps.policy.repeated_tool_call_limit).judge(
                [CountedCall(i.call.name, i.call.args, i.result, i.domain, i.status) for i, _ in invocations],
                state.previous_fingerprint,
                state.previous_repeat_count,
            )
            fingerprint, repeat_count = verdict.fingerprint, verdict.repeat_count
            if verdict.tripped:
                assert verdict.message is not None
                names = sorted({i.call.name for i, _ in invocations})
                events.append(RoundEvent(EventKind.BREAKER_TRIPPED, {"tools": names, "repeat_count": repeat_count}))
                outcome = Fail(REPEATED_IDENTICAL_TOOL_CALL, verdict.message)
        if isinstance(outcome, Continue) and state.boundary_seq + 1 >= deps.policy.max_rounds:
            outcome = Fail(
                MAX_ROUNDS_EXCEEDED,
                f"the run reached its limit of {deps.policy.max_rounds} rounds without a final answer",
            )
    result = _result(
        deps, state, new, outcome, events, digests, [i for i, _ in invocations], projection=projection, resumed=resumed
    )
    return replace(result, tool_fingerprint=fingerprint, repeat_count=repeat_count)


def _digests(deps: OrchestratorDeps, messages_digest: str, response_digest: str | None) -> RoundDigests:
    return RoundDigests(deps.system_digest, messages_digest, deps.tools_digest, response_digest)


def _issue_round(deps: OrchestratorDeps, state: RunState, digests: RoundDigests) -> OwnedRoundProjection:
    return deps.proofs.issue_round(
        run_id=str(state.run_id),
        boundary_seq=state.boundary_seq,
        claim_fence=state.claim_fence,
        system_digest=digests.system,
        messages_digest=digests.messages,
        tools_digest=digests.tools,
        accepted_response_digest=digests.accepted_response,
    )


def _result(
    deps: OrchestratorDeps,
    state: RunState,
    new: Appender,
    outcome: RoundOutcome,
    events: list[RoundEvent],
    digests: RoundDigests,
    invocations: Sequence[ToolInvocation] = (),
    *,
    projection: OwnedRoundProjection | None = None,
    resumed: bool = False,
) -> RoundResult:
    if isinstance(outcome, Finish):
        events.append(RoundEvent(EventKind.RUN_COMPLETED, {"output": outcome.output}))
    elif isinstance(outcome, Fail):
        events.append(RoundEvent(EventKind.RUN_FAILED, {"error_code": outcome.error_code, "message": outcome.message}))
    return RoundResult(
        boundary_seq=state.boundary_seq,
        outcome=outcome,
        new_messages=tuple(new.stored),
        tool_invocations=tuple(invocations),
        events=tuple(events),
        digests=digests,
        # A resume completes a round that already has its projection and proof.
        projection=None if resumed else projection or _issue_round(deps, state, digests),
        resumed=resumed,
    )
