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

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from runtime.breaker import REPEATED_IDENTICAL_TOOL_CALL, CountedCall, RepeatedToolCallBreaker
from runtime.canonical import MAX_RESULT_DEPTH, chain_digest, digest, json_problem
from runtime.context import slim_tool_results_for_next_round
from runtime.deps import OrchestratorDeps
from runtime.errors import ModelError, ModelInputRejection
from runtime.hooks import NoHooks, RoundHooks
from runtime.messages import Message, tool_message, user_message
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
from runtime.tool_calls import run_tool, with_call_projection, with_unique_call_ids
from runtime.tools import NO_INPUTS
from schema.wire import EventKind
from schema.wire.errors import ErrorCode
from schema.wire.json import JsonValue
from schema.wire.vocab import ANSWERED_WAITS, ToolStatus

MAX_ROUNDS_EXCEEDED = ErrorCode.MAX_ROUNDS_EXCEEDED
MODEL_RESPONSE_INVALID = ErrorCode.MODEL_RESPONSE_INVALID


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

    A model error ends the run with its code, ``ModelUnavailable`` included: the call
    had its whole budget (``policy.model_timeout_s``, the SDK's retries within it), so
    trying the round again would only keep the run ``running`` for as long again; its
    code says a new run may succeed. A retryable error raised around the call (the fleet's
    rate limit, ``RoundRateLimited``) propagates: the round did not happen and is given back.

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
    calls = LedgeredCalls(deps, state, hooks, asked)
    try:
        response = complete_turn(request, deps.policy.on_truncation, calls)
    except ModelError as exc:
        if exc.retryable and exc is not calls.model_error:
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
        invocation, context = run_tool(deps, state, call, NO_INPUTS, hooks)
        if invocation.status == ToolStatus.SUSPENDED:
            invocation = with_call_projection(deps, state, invocation, round_projection.proof)
        invocations.append((invocation, context))
    closed = close_tool_round(deps, state, new, invocations, events, digests, projection=round_projection)
    return replace(closed, finish_reason=response.finish_reason)


class LedgeredCalls:
    """The round's model calls, each recorded by the hooks (the ledger); the first may be
    the response an earlier holder of this round was given for this very request."""

    def __init__(self, deps: OrchestratorDeps, state: RunState, hooks: RoundHooks, asked: str) -> None:
        self._deps = deps
        self._hooks = hooks
        self._asked = asked
        # What the model itself raised (not the hooks around the call): the loop tells
        # the provider's unavailability from the rate limit's by it.
        self.model_error: ModelError | None = None
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
            self.model_error = exc
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
    path. A worker runs one round per task instead (``worker.engine.round``)."""
    while True:
        result = drive_react_loop(deps, state, hooks)
        state = state.after(result)
        if not isinstance(result.outcome, Continue):
            return InProcessRun(outcome=result.outcome, rounds=state.boundary_seq, messages=state.history)


def close_tool_round(
    deps: OrchestratorDeps,
    state: RunState,
    new: Appender,
    invocations: Sequence[tuple[ToolInvocation, JsonValue]],
    events: list[RoundEvent],
    digests: RoundDigests,
    *,
    projection: OwnedRoundProjection | None = None,
    resumed: bool = False,
) -> RoundResult:
    """Append the tool results, then decide what comes next: suspend if any call waits
    for input, else the breaker and the round limit, else continue."""
    for invocation, context in invocations:
        call = invocation.call
        if invocation.status == ToolStatus.SUSPENDED:
            assert invocation.suspension is not None
            suspended = {"tool_call_id": call.id, "name": call.name, **invocation.suspension.to_json()}
            if invocation.suspension.kind in ANSWERED_WAITS:  # whoever answers sees what was asked
                # ... with the args a person approved, when they edited them (a client tool
                # then runs with those).
                approval = invocation.approval
                edited = approval.value if approval is not None and approval.kind == "approve" else None
                suspended["args"] = call.args if edited is None else edited
            events.append(RoundEvent(EventKind.TOOL_SUSPENDED, suspended))
            continue
        failed = invocation.status == ToolStatus.FAILED
        new.append(tool_message(call, invocation.result, is_error=failed),
                   tool_message(call, context, is_error=failed))
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
                names: list[JsonValue] = [*sorted({i.call.name for i, _ in invocations})]
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
