"""Tool calls inside a round (``drive_react_loop``, and the resume that re-runs a
suspended call): the at-most-once record through the hooks, the verify hook, the approval
gate, answers to suspended calls, and the idempotency key a handler is given."""

from __future__ import annotations

import dataclasses
import threading
import uuid
from typing import Any

import pytest

from runtime.deps import build_runtime
from runtime.loop import Suspend, drive_react_loop
from runtime.messages import ToolCall
from runtime.models.base import ModelRequest, ModelResponse
from runtime.outcomes import RoundResult, ToolInvocation
from runtime.prepare import prepare_execution
from runtime.resume import StoredSuspension, resume_original_tool_round
from runtime.run_deps import OrchestratorDeps
from runtime.state import RunState
from runtime.tool_calls import TOOL_REJECTED, UNKNOWN_AFTER_CRASH, idempotency_key
from runtime.tools import PriorExecution, Tool, ToolAnswer, ToolContext, ToolInputs, ToolOutcome, tool
from schema.wire import OriginalToolRoundResume
from schema.wire.vocab import ToolStatus
from tests.support.requests import RESUME, scripted_request

RUN_ID = uuid.UUID("00000000-0000-4000-8000-0000000000aa")


@dataclasses.dataclass
class EffectHooks:
    """A RoundHooks standing in for the worker's tool_executions record: ``prior`` is what
    an earlier start recorded (None: this is the first start). Records what it is told."""

    prior: PriorExecution | None = None
    starting: list[tuple[str, str, str | None]] = dataclasses.field(default_factory=list)
    finished: list[tuple[str, ToolStatus]] = dataclasses.field(default_factory=list)

    def model_call_started(self, request: ModelRequest, request_digest: str) -> None:
        return None

    def model_call_finished(self, response: ModelResponse | None, error: Any) -> None:
        return None

    def tool_call_starting(self, call: ToolCall, ctx: ToolContext, *, retry_of: str | None) -> PriorExecution | None:
        self.starting.append((call.id, ctx.idempotency_key, retry_of))
        return self.prior

    def tool_call_finished(self, call: ToolCall, outcome: ToolOutcome) -> None:
        self.finished.append((call.id, outcome.status))

    def tool_call_done(self, invocation: ToolInvocation, started_ns: int) -> None:
        return None

    def model_delta_sink(self) -> None:
        return None


@dataclasses.dataclass
class Charges:
    """An at-most-once ``charge`` tool whose handler records every start."""

    calls: list[tuple[int, ToolContext]] = dataclasses.field(default_factory=list)
    verified: dict[str, Any] | None = None

    def tool(self, **options: Any) -> Tool:
        def charge(cents: int, ctx: ToolContext) -> dict[str, Any]:
            """Charge the customer."""
            self.calls.append((cents, ctx))
            return {"charged": cents}

        def was_charged(cents: int, ctx: ToolContext) -> dict[str, Any] | None:
            return self.verified

        return tool(verify=was_charged, **options)(charge)


CHARGE_5 = [{"tool_calls": [{"name": "charge", "args": {"cents": 5}}]}, {"content": "charged"}]


def _deps(t: Tool, *, require_approval: list[str] | None = None) -> OrchestratorDeps:
    raw = scripted_request(CHARGE_5, tools=[t.name])
    if require_approval is not None:
        raw["config"]["policy"]["require_approval"] = require_approval
    _, prepared = prepare_execution(build_runtime(toolsets=[t]), raw)
    return prepared.deps


def _state(**fields: Any) -> RunState:
    return dataclasses.replace(RunState.start("go"), run_id=RUN_ID, work_owner="team-test", **fields)


def _one_call(result: RoundResult) -> Any:
    (invocation,) = result.tool_invocations
    return invocation


# --- the at-most-once record --------------------------------------------------------------------


def test_a_first_start_is_recorded_then_the_handler_runs_and_its_end_is_recorded() -> None:
    charges = Charges()
    hooks = EffectHooks()
    result = drive_react_loop(_deps(charges.tool()), _state(), hooks)

    assert _one_call(result).status == ToolStatus.COMPLETED
    assert _one_call(result).result == {"charged": 5}
    key = charges.calls[0][1].idempotency_key
    assert hooks.starting == [("call_0_0", key, None)]
    assert hooks.finished == [("call_0_0", ToolStatus.COMPLETED)]
    assert [c for c, _ in charges.calls] == [5]


def test_a_start_found_with_no_end_suspends_outcome_unknown_without_running_the_handler() -> None:
    charges = Charges()
    hooks = EffectHooks(prior=PriorExecution(None))
    result = drive_react_loop(_deps(charges.tool()), _state(attempt=2, claim_fence=2), hooks)

    invocation = _one_call(result)
    assert invocation.status == ToolStatus.SUSPENDED
    assert invocation.suspension.kind == "outcome_unknown"
    assert invocation.suspension.reason == UNKNOWN_AFTER_CRASH
    assert isinstance(result.outcome, Suspend)
    assert charges.calls == []
    assert hooks.finished == []  # the start stays recorded: it may have happened
    suspended = [e.data for e in result.events if e.kind == "tool_suspended"]
    assert suspended == [{"tool_call_id": "call_0_0", "name": "charge", "kind": "outcome_unknown",
                          "reason": UNKNOWN_AFTER_CRASH, "args": {"cents": 5}}]


@pytest.mark.parametrize("status", [ToolStatus.COMPLETED, ToolStatus.FAILED])
def test_a_start_found_with_its_end_gives_that_result_without_running_the_handler(status: ToolStatus) -> None:
    charges = Charges()
    recorded = {"charged": 5, "receipt": "r-1"} if status == ToolStatus.COMPLETED else {"error": {"code": "X"}}
    hooks = EffectHooks(prior=PriorExecution(status, recorded))
    result = drive_react_loop(_deps(charges.tool()), _state(attempt=2), hooks)

    invocation = _one_call(result)
    assert (invocation.status, invocation.result) == (status, recorded)
    assert charges.calls == []
    assert hooks.finished == []
    assert result.new_messages[-1].message.result == recorded


def test_a_verify_hook_that_can_tell_resolves_an_unknown_outcome() -> None:
    charges = Charges(verified={"charged": 5, "verified": True})
    hooks = EffectHooks(prior=PriorExecution(None))
    result = drive_react_loop(_deps(charges.tool()), _state(attempt=2), hooks)

    invocation = _one_call(result)
    assert (invocation.status, invocation.result) == (ToolStatus.COMPLETED, {"charged": 5, "verified": True})
    assert charges.calls == []
    assert not isinstance(result.outcome, Suspend)


def test_a_verify_hook_that_cannot_tell_leaves_the_outcome_unknown() -> None:
    charges = Charges(verified=None)
    result = drive_react_loop(_deps(charges.tool()), _state(attempt=2), EffectHooks(prior=PriorExecution(None)))

    assert _one_call(result).suspension.kind == "outcome_unknown"
    assert charges.calls == []


def test_an_at_most_once_handler_past_its_timeout_is_an_unknown_outcome_whose_start_stays_recorded() -> None:
    # The handler may still be running (a thread cannot be stopped) and may yet charge:
    # clearing its start would let a re-executed round charge again.
    release = threading.Event()

    def stuck(cents: int) -> dict[str, int]:
        release.wait(30)
        return {"charged": cents}

    slow = tool(name="charge", timeout_s=0.05)(stuck)
    hooks = EffectHooks()
    try:
        result = drive_react_loop(_deps(slow), _state(), hooks)
    finally:
        release.set()

    invocation = _one_call(result)
    assert invocation.status == ToolStatus.SUSPENDED
    assert invocation.suspension.kind == "outcome_unknown"
    assert "timeout of 0.05 s" in invocation.suspension.reason
    assert [c for c, _, _ in hooks.starting] == ["call_0_0"]
    assert hooks.finished == []


def test_a_rerunnable_tool_never_touches_the_record() -> None:
    charges = Charges()
    hooks = EffectHooks(prior=PriorExecution(None))
    result = drive_react_loop(_deps(charges.tool(effect="idempotent")), _state(attempt=2), hooks)

    assert _one_call(result).result == {"charged": 5}
    assert hooks.starting == [] and hooks.finished == []
    assert len(charges.calls) == 1


# --- the approval gate --------------------------------------------------------------------------


@pytest.mark.parametrize("names", [["charge"], ["*"], ["other", "charge"]])
def test_a_tool_that_requires_approval_suspends_before_its_handler_runs(names: list[str]) -> None:
    charges = Charges()
    hooks = EffectHooks()
    result = drive_react_loop(_deps(charges.tool(), require_approval=names), _state(), hooks)

    invocation = _one_call(result)
    assert invocation.status == ToolStatus.SUSPENDED
    assert invocation.suspension.kind == "approval"
    assert isinstance(result.outcome, Suspend)
    assert charges.calls == []
    assert hooks.starting == []  # not even recorded as started
    suspended = [e.data for e in result.events if e.kind == "tool_suspended"]
    assert suspended == [{"tool_call_id": "call_0_0", "name": "charge", "kind": "approval", "args": {"cents": 5}}]


def test_a_tool_not_named_in_require_approval_runs_at_once() -> None:
    charges = Charges()
    result = drive_react_loop(_deps(charges.tool(), require_approval=["other"]), _state(), EffectHooks())

    assert _one_call(result).status == ToolStatus.COMPLETED
    assert len(charges.calls) == 1


def _suspended_round(charges: Charges, **options: Any) -> tuple[OrchestratorDeps, RunState, RoundResult]:
    deps = _deps(charges.tool(**options), require_approval=["charge"])
    state = _state()
    first = drive_react_loop(deps, state, EffectHooks())
    assert _one_call(first).suspension.kind == "approval"
    return deps, state.after(first), first


def _resume(deps: OrchestratorDeps, state: RunState, first: RoundResult, inputs: ToolInputs,
            hooks: EffectHooks | None = None) -> RoundResult:
    invocation = _one_call(first)
    resume = OriginalToolRoundResume.model_validate({**RESUME, "run_id": str(RUN_ID)})
    stored = StoredSuspension(call=invocation.call, resume=resume, suspension=invocation.suspension)
    return resume_original_tool_round(deps, state, first.digests, [stored], {invocation.call.id: inputs},
                                      hooks or EffectHooks())


def test_an_approval_with_edited_args_runs_the_handler_with_them_and_the_event_says_so() -> None:
    charges = Charges()
    deps, state, first = _suspended_round(charges)
    approval = ToolAnswer(kind="approve", value={"cents": 3}, reason="capped")
    hooks = EffectHooks()
    resumed = _resume(deps, state, first, ToolInputs(approval=approval), hooks)

    assert [c for c, _ in charges.calls] == [3]
    invocation = _one_call(resumed)
    assert (invocation.status, invocation.result, invocation.approval) == (ToolStatus.COMPLETED, {"charged": 3},
                                                                          approval)
    assert invocation.call.args == {"cents": 5}  # what the model asked for is kept
    (completed,) = [e.data for e in resumed.events if e.kind == "tool_completed"]
    assert completed["approval"] == {"decision": "approve", "args": {"cents": 3}, "reason": "capped"}
    assert completed["result"] == {"charged": 3}
    assert hooks.starting == [("call_0_0", charges.calls[0][1].idempotency_key, None)]


def test_an_approval_without_edits_runs_the_args_the_model_gave() -> None:
    charges = Charges()
    deps, state, first = _suspended_round(charges)
    resumed = _resume(deps, state, first, ToolInputs(approval=ToolAnswer(kind="approve")))

    assert [c for c, _ in charges.calls] == [5]
    (completed,) = [e.data for e in resumed.events if e.kind == "tool_completed"]
    assert completed["approval"] == {"decision": "approve"}


def test_an_approval_with_edited_args_that_do_not_fit_is_a_failed_args_invalid_result() -> None:
    charges = Charges()
    deps, state, first = _suspended_round(charges)
    resumed = _resume(deps, state, first, ToolInputs(approval=ToolAnswer(kind="approve", value={"cents": "lots"})))

    assert charges.calls == []
    assert _one_call(resumed).result["error"]["code"] == "TOOL_ARGS_INVALID"
    assert _one_call(resumed).result["error"]["message"].startswith("cents: ")


def test_a_rejection_is_a_failed_tool_rejected_result_and_the_handler_never_runs() -> None:
    charges = Charges()
    deps, state, first = _suspended_round(charges)
    rejection = ToolAnswer(kind="reject", reason="too expensive")
    resumed = _resume(deps, state, first, ToolInputs(approval=rejection))

    assert charges.calls == []
    invocation = _one_call(resumed)
    assert invocation.status == ToolStatus.FAILED
    assert invocation.result == {"error": {"code": TOOL_REJECTED,
                                           "message": "a person rejected this call: too expensive"}}
    (completed,) = [e.data for e in resumed.events if e.kind == "tool_completed"]
    assert completed["approval"] == {"decision": "reject", "reason": "too expensive"}
    assert resumed.new_messages[-1].message.is_error


# --- answers to a suspended call ----------------------------------------------------------------


@pytest.mark.parametrize(("is_error", "status"), [(False, ToolStatus.COMPLETED), (True, ToolStatus.FAILED)])
def test_an_answer_with_a_result_is_the_calls_result_without_running_the_handler(
    is_error: bool, status: ToolStatus
) -> None:
    charges = Charges()
    deps, state, first = _suspended_round(charges)
    answer = ToolAnswer(kind="result", value={"charged": 5, "by": "operator"}, is_error=is_error)
    hooks = EffectHooks()
    resumed = _resume(deps, state, first, ToolInputs(answer=answer), hooks)

    invocation = _one_call(resumed)
    assert (invocation.status, invocation.result) == (status, {"charged": 5, "by": "operator"})
    assert charges.calls == []
    assert hooks.starting == []


def test_an_answer_retry_runs_an_unknown_outcome_again_knowingly() -> None:
    charges = Charges()
    deps = _deps(charges.tool())
    state = _state(attempt=2)
    first = drive_react_loop(deps, state, EffectHooks(prior=PriorExecution(None)))
    assert _one_call(first).suspension.kind == "outcome_unknown"

    hooks = EffectHooks()  # the record takes the new start (a retry answering a wait overwrites the old once)
    retry = ToolAnswer(kind="retry", wait_id="inv-unknown-1")
    resumed = _resume(deps, state.after(first), first, ToolInputs(answer=retry), hooks)

    assert _one_call(resumed).result == {"charged": 5}
    assert [retry_of for _, _, retry_of in hooks.starting] == ["inv-unknown-1"]
    assert len(charges.calls) == 1


# --- the idempotency key ------------------------------------------------------------------------


def test_the_idempotency_key_is_the_same_for_every_execution_of_a_call_and_differs_otherwise() -> None:
    call = ToolCall("call_0_0", "charge", {"cents": 5})
    base = _state()
    key = idempotency_key(base, call)

    # Another claim of the same round (a re-execution after a crash, a resume) and other args.
    assert idempotency_key(_state(claim_fence=7, attempt=3), ToolCall("call_0_0", "charge", {"cents": 9})) == key
    others = {
        idempotency_key(dataclasses.replace(base, run_id=uuid.uuid4()), call),
        idempotency_key(dataclasses.replace(base, boundary_seq=1), call),
        idempotency_key(base, ToolCall("call_0_1", "charge", {"cents": 5})),
    }
    assert key not in others and len(others) == 3
    assert len(key) == 32


def test_the_handler_gets_the_key_in_its_context_the_same_on_a_re_executed_round() -> None:
    charges = Charges()
    deps = _deps(charges.tool(effect="idempotent"))
    drive_react_loop(deps, _state(), EffectHooks())
    drive_react_loop(deps, _state(claim_fence=2, attempt=2), EffectHooks())

    (_, first), (_, again) = charges.calls
    assert first.idempotency_key == again.idempotency_key == idempotency_key(_state(), ToolCall("call_0_0", "", {}))
    assert (first.run_id, first.boundary_seq, first.tool_call_id, first.owner) == (RUN_ID, 0, "call_0_0",
                                                                                  "team-test")
    assert (first.attempt, again.attempt) == (1, 2)
