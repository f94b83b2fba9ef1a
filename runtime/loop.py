"""orchestrate / drive_react_loop: exactly one ReAct round in, one RoundResult out.

A round is: (on the run's first round) the user's input, one model call, then every tool
call the model asked for. The result says what to persist (new messages with their
Root positions and chain digests, tool invocations, events, the round's digests) and
what comes next (``Continue``, ``Finish`` or ``Fail``). Nothing here stores anything;
the caller persists the result in one transaction.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol
from uuid import UUID

from runtime.breaker import REPEATED_IDENTICAL_TOOL_CALL, CountedCall, RepeatedToolCallBreaker
from runtime.canonical import JSON, chain_digest, digest
from runtime.context import slim_tool_results_for_next_round
from runtime.deps import OrchestratorDeps
from runtime.errors import ModelError
from runtime.messages import Message, ToolCall, tool_message, user_message
from runtime.models.base import ModelRequest, ModelResponse
from runtime.tools import ToolDomain

# --- outcomes ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Continue:
    kind: Literal["continue"] = "continue"


@dataclass(frozen=True)
class Finish:
    output: str
    kind: Literal["finish"] = "finish"


@dataclass(frozen=True)
class Fail:
    error_code: str
    message: str
    kind: Literal["fail"] = "fail"


RoundOutcome = Continue | Finish | Fail

MAX_ROUNDS_EXCEEDED = "MAX_ROUNDS_EXCEEDED"
MODEL_RESPONSE_INVALID = "MODEL_RESPONSE_INVALID"


# --- what a round produces --------------------------------------------------------------


@dataclass(frozen=True)
class StoredMessage:
    """A new message: ``message`` is stored in full; ``context`` is its context form
    (what later model calls see); ``chain_digest`` chains the context forms."""

    position: int
    message: Message
    context: Message
    chain_digest: str


@dataclass(frozen=True)
class ToolInvocation:
    call: ToolCall
    domain: ToolDomain | None  # None: the model named a tool that is not enabled
    status: str  # completed | failed
    result: JSON
    args_digest: str
    result_digest: str


@dataclass(frozen=True)
class RoundEvent:
    kind: str
    data: dict[str, Any]


@dataclass(frozen=True)
class RoundDigests:
    system: str
    messages: str
    tools: str
    accepted_response: str | None


@dataclass(frozen=True)
class RoundResult:
    boundary_seq: int
    outcome: RoundOutcome
    new_messages: tuple[StoredMessage, ...]
    tool_invocations: tuple[ToolInvocation, ...]
    events: tuple[RoundEvent, ...]
    digests: RoundDigests
    # The repeated-call breaker's state after this round (stored with the round).
    tool_fingerprint: str | None = None
    repeat_count: int = 0


@dataclass(frozen=True)
class RunState:
    """What a round needs to know about its run: the Root's history so far in context
    form (as loaded or cached), and where this run stands."""

    input: str
    boundary_seq: int = 0
    history: tuple[Message, ...] = ()
    history_digest: str = ""
    last_position: int = -1
    run_id: UUID | None = None
    # The previous round's breaker state, from the stored rounds.
    previous_fingerprint: str | None = None
    previous_repeat_count: int = 0

    @classmethod
    def start(cls, text: str) -> RunState:
        return cls(input=text)

    def after(self, result: RoundResult) -> RunState:
        """The state of the next round, as if ``result`` had been committed."""
        new = result.new_messages
        return RunState(
            input=self.input,
            boundary_seq=self.boundary_seq + 1,
            history=self.history + tuple(m.context for m in new),
            history_digest=new[-1].chain_digest if new else self.history_digest,
            last_position=new[-1].position if new else self.last_position,
            run_id=self.run_id,
            previous_fingerprint=result.tool_fingerprint,
            previous_repeat_count=result.repeat_count,
        )


class RoundHooks(Protocol):
    """Called around the model call, so the caller can record the call in its ledger
    before and after (and inject faults in tests)."""

    def model_call_started(self, request: ModelRequest, request_digest: str) -> None: ...

    def model_call_finished(self, response: ModelResponse | None, error: ModelError | None) -> None: ...


class NoHooks:
    def model_call_started(self, request: ModelRequest, request_digest: str) -> None:
        return None

    def model_call_finished(self, response: ModelResponse | None, error: ModelError | None) -> None:
        return None


@dataclass
class _Appender:
    """New messages of this round, each with its Root position, context form and chain
    digest."""

    position: int
    digest: str
    max_output_bytes: int
    stored: list[StoredMessage] = field(default_factory=list)

    def append(self, message: Message) -> None:
        context = slim_tool_results_for_next_round(message, self.max_output_bytes)
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
    """
    hooks = hooks or NoHooks()
    new = _Appender(state.last_position, state.history_digest, deps.policy.max_tool_output_bytes)
    if state.boundary_seq == 0:
        new.append(user_message(state.input))
    messages_digest = new.digest
    request = ModelRequest(
        system=deps.system_prompt,
        messages=state.history + new.context(),
        tools=deps.tool_specs,
        messages_digest=messages_digest,
        round_index=state.boundary_seq,
    )
    hooks.model_call_started(request, request_digest(deps, messages_digest))
    try:
        response = deps.model.complete(request)
    except ModelError as exc:
        hooks.model_call_finished(None, exc)
        if exc.retryable:
            raise
        return _result(deps, state, new, Fail(exc.code, exc.message), (), [], messages_digest, None)
    hooks.model_call_finished(response, None)
    try:
        response_digest = response.digest()
    except ValueError as exc:
        fail = Fail(MODEL_RESPONSE_INVALID, f"the model's response has a value with no JSON form: {exc}")
        return _result(deps, state, new, fail, (), [], messages_digest, None)

    new.append(response.as_message())
    events = [RoundEvent("model_responded", {"boundary_seq": state.boundary_seq, **response.to_json()})]
    if not response.tool_calls:
        finish = Finish(output=response.content or "")
        return _result(deps, state, new, finish, (), events, messages_digest, response_digest)

    invocations = []
    for call in response.tool_calls:
        invocation = _run_tool(deps, call)
        invocations.append(invocation)
        new.append(tool_message(call, invocation.result))
        events.append(
            RoundEvent(
                "tool_completed",
                {"tool_call_id": call.id, "name": call.name, "status": invocation.status, "result": invocation.result},
            )
        )
    verdict = RepeatedToolCallBreaker(deps.policy.repeated_tool_call_limit).judge(
        [CountedCall(i.call.name, i.call.args, i.result, i.domain, i.status) for i in invocations],
        state.previous_fingerprint,
        state.previous_repeat_count,
    )
    outcome: RoundOutcome = Continue()
    if verdict.tripped:
        assert verdict.message is not None
        names = sorted({i.call.name for i in invocations})
        events.append(RoundEvent("breaker_tripped", {"tools": names, "repeat_count": verdict.repeat_count}))
        outcome = Fail(REPEATED_IDENTICAL_TOOL_CALL, verdict.message)
    elif state.boundary_seq + 1 >= deps.policy.max_rounds:
        outcome = Fail(
            MAX_ROUNDS_EXCEEDED,
            f"the run reached its limit of {deps.policy.max_rounds} rounds without a final answer",
        )
    result = _result(deps, state, new, outcome, tuple(invocations), events, messages_digest, response_digest)
    return replace(result, tool_fingerprint=verdict.fingerprint, repeat_count=verdict.repeat_count)


def _run_tool(deps: OrchestratorDeps, call: ToolCall) -> ToolInvocation:
    tool = deps.tools.get(call.name)
    if tool is None:
        status: str = "failed"
        result: JSON = {"error": {"code": "TOOL_UNKNOWN", "message": f"tool {call.name!r} is not enabled"}}
        domain = None
    else:
        status, result = tool.run(call.args)
        domain = tool.domain
    try:
        result_digest = digest(result)
    except ValueError as exc:  # NaN, Infinity, an unpaired surrogate, or not JSON at all
        status = "failed"
        result = {"error": {"code": "TOOL_RESULT_INVALID", "message": f"the tool's result has no JSON form: {exc}"}}
        result_digest = digest(result)
    return ToolInvocation(
        call=call,
        domain=domain,
        status=status,
        result=result,
        args_digest=digest(call.args),
        result_digest=result_digest,
    )


def _result(
    deps: OrchestratorDeps,
    state: RunState,
    new: _Appender,
    outcome: RoundOutcome,
    invocations: tuple[ToolInvocation, ...],
    events: list[RoundEvent],
    messages_digest: str,
    response_digest: str | None,
) -> RoundResult:
    if isinstance(outcome, Finish):
        events.append(RoundEvent("run_completed", {"output": outcome.output}))
    elif isinstance(outcome, Fail):
        events.append(RoundEvent("run_failed", {"error_code": outcome.error_code, "message": outcome.message}))
    return RoundResult(
        boundary_seq=state.boundary_seq,
        outcome=outcome,
        new_messages=tuple(new.stored),
        tool_invocations=invocations,
        events=tuple(events),
        digests=RoundDigests(deps.system_digest, messages_digest, deps.tools_digest, response_digest),
    )
