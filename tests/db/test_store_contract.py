"""The store contract: the same tests against both implementations of ``StorePort``, the
PostgreSQL store (``schema.store.store.Store``, on a fresh test database) and the
in-memory double the shell's unit tests run on (``tests.support.memory_store``), so the
double cannot drift from the real store silently. mypy checks their signatures against
the port; these check what the operations do: claims and why one was refused, the
model-call ledger, committing a round, suspensions and resumes, rebuild reservations,
budget parking, dispatch (``send_or_defer``, ``due_of``).

The second half drives whole sequences (and the real worker shell) against both stores
and compares everything observed step by step."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Any
from uuid import UUID, uuid4

import pytest
from sqlalchemy import Engine

from runtime.prepare import prepare_execution
from schema.store import budgets as budget_store
from schema.store import runs as run_store
from schema.store import suspensions as suspension_store
from schema.store.budgets import BudgetRefused
from schema.store.errors import FenceLost, ToolCallIdReused
from schema.store.port import StorePort
from schema.store.runs import Submitted
from schema.store.store import Store
from schema.store.suspensions import Receipt
from schema.wire import RoundTask, RunRequest
from schema.wire.claim import Claim
from schema.wire.rebuild import ChainBuild, RebuildCandidate, ReservationPlan
from schema.wire.record import RoundRecord, ToolInvocationRecord
from schema.wire.route import Route
from schema.wire.vocab import ToolDomain, ToolStatus
from tests.support.db import rows, run_row
from tests.support.memory_store import InMemoryStore
from tests.support.requests import scripted_request
from tests.support.store import HOLDER, RUNTIME, expire_lease, record
from worker.ops.celery_app import send_or_defer

RUN_FIELDS = ("status", "boundary_seq", "claim_fence", "round_attempts", "round_claims", "execution_fence")


@dataclasses.dataclass
class Side:
    """One store, and what a test needs besides the port: setting a scene and observing it."""

    name: str
    store: StorePort
    submit: Callable[[RunRequest, dict[str, Any]], Submitted]
    row: Callable[[UUID], dict[str, Any]]
    expire: Callable[[UUID], None]
    set_budget: Callable[[str, int, str], None]
    spend: Callable[[str], tuple[int, int]]
    resolve: Callable[[UUID, str, Any], Receipt]
    deliver: Callable[[UUID, str, dict[str, str]], Receipt]
    dispatched_failed: Callable[[UUID], bool]


def real(engine: Engine) -> Side:
    def row(run_id: UUID) -> dict[str, Any]:
        r = run_row(engine, run_id)
        return {**{k: r[k] for k in RUN_FIELDS}, "leased": r["lease_expires_at"] is not None}

    def spend(owner: str) -> tuple[int, int]:
        found = rows(engine, "SELECT used, reserved FROM owner_spend WHERE owner = :o", o=owner)
        return (found[0]["used"], found[0]["reserved"]) if found else (0, 0)

    def dispatched_failed(run_id: UUID) -> bool:
        return bool(rows(engine, "SELECT dispatched_at = '-infinity' AS f FROM runs WHERE id = :id", id=run_id)[0]["f"])

    return Side(
        "postgresql",
        Store(engine),
        lambda request, config: run_store.submit_run(engine, request, config),
        row,
        lambda run_id: expire_lease(engine, run_id),
        lambda owner, budget, on: budget_store.set_owner_budget(engine, owner, budget, "1h", on) and None,
        spend,
        lambda run_id, key, value: suspension_store.resolve_prerequisite(engine, run_id, key, value),
        lambda run_id, call, files: suspension_store.deliver_local_read(
            engine, run_id, call, files, max_file_bytes=1 << 20
        ),
        dispatched_failed,
    )


def memory() -> Side:
    store = InMemoryStore()

    def row(run_id: UUID) -> dict[str, Any]:
        r = vars(store.run(run_id))
        return {**{k: r[k] for k in RUN_FIELDS}, "leased": r["lease_expires_at"] is not None}

    def spend(owner: str) -> tuple[int, int]:
        budget = store.budgets.get(owner, {})
        return budget.get("used", 0), budget.get("reserved", 0)

    return Side(
        "memory",
        store,
        store.submit_run,
        row,
        store.expire_lease,
        lambda owner, budget, on: store.set_budget(owner, budget, on),
        spend,
        store.resolve_prerequisite,
        store.deliver_local_read,
        lambda run_id: store.runs[run_id].dispatched_at == float("-inf"),
    )


@pytest.fixture(params=["memory", "postgresql"])
def side(request: pytest.FixtureRequest) -> Iterator[Side]:
    if request.param == "memory":
        yield memory()
    else:
        yield real(request.getfixturevalue("engine"))


def _submit(side: Side, root_id: UUID | None = None, owner: str = "team-a") -> Submitted:
    request, prepared = prepare_execution(RUNTIME, scripted_request([{"content": "done"}], owner=owner))
    if root_id is not None:
        request = request.model_copy(update={"root_id": root_id})
    return side.submit(request, prepared.turn_config.model_dump(mode="json"))


def _claim(side: Side, run_id: UUID, boundary: int = 0, **kw: Any) -> Claim | None:
    kw.setdefault("after_position", -1)
    kw.setdefault("cold", kw["after_position"] < 0)
    return side.store.claim_round(run_id, boundary, lease_s=30, holder=HOLDER, **kw)


def _claimed(side: Side, run_id: UUID, boundary: int = 0, **kw: Any) -> Claim:
    c = _claim(side, run_id, boundary, **kw)
    assert c is not None
    return c


def _fenced(write: Callable[[], Any]) -> str:
    try:
        return f"returned {write()!r}"
    except FenceLost:
        return "FenceLost"


# --- claims ------------------------------------------------------------------------------------


def test_a_claim_takes_the_run_once_and_a_refusal_says_why(side: Side) -> None:
    run = _submit(side)
    c = _claimed(side, run.run_id)
    assert (c.fence, c.attempt, c.claims, c.boundary_seq, c.owner) == (1, 1, 0, 0, "team-a")
    assert c.input is not None and c.config is not None  # a cold claim carries the request
    assert c.recorded_response is None and c.previous_round is None
    assert side.row(run.run_id) == {"status": "running", "boundary_seq": 0, "claim_fence": 1, "round_attempts": 0,
                                    "round_claims": 0, "execution_fence": None, "leased": True}
    assert _claim(side, run.run_id) is None
    refusal = side.store.explain_refused_claim(run.run_id, 0, resume=False)
    assert (refusal.finished, refusal.reason) == (False, "leased_by_live_holder")
    assert refusal.run is not None and refusal.run["claim_fence"] == 1
    assert side.store.explain_refused_claim(run.run_id, 3, resume=False).reason == "run_at_another_boundary"
    assert side.store.explain_refused_claim(run.run_id, 0, resume=True).reason == "leased_by_live_holder"
    gone = side.store.explain_refused_claim(uuid4(), 0, resume=False)
    assert (gone.finished, gone.reason, gone.run) == (False, "run_not_found", None)
    assert _claim(side, uuid4()) is None


def test_a_later_run_of_a_root_waits_for_the_earlier_one(side: Side) -> None:
    first = _submit(side)
    later = _submit(side, root_id=first.root_id)
    assert (first.root_seq, later.root_seq) == (0, 1)
    assert _claim(side, later.run_id) is None
    assert side.store.explain_refused_claim(later.run_id, 0, resume=False).reason == "earlier_run_of_root_active"
    c = _claimed(side, first.run_id)
    committed = side.store.commit_round(record(c))
    assert committed.next_runs == (later.run_id,) and not committed.interrupted
    ended = side.store.explain_refused_claim(first.run_id, 1, resume=False)
    assert (ended.finished, ended.reason) == (True, "run_ended")
    assert _claim(side, first.run_id, 1) is None
    assert _claim(side, later.run_id) is not None


def test_an_expired_lease_is_taken_over_and_a_held_claim_taken_back(side: Side) -> None:
    run = _submit(side)
    first = _claimed(side, run.run_id)
    # The holder's own claim, still leased, is taken back with the fence it holds.
    back = _claimed(side, run.run_id, held_fence=first.fence)
    assert (back.fence, back.claims) == (2, 0)
    side.store.record_model_call_started(run.run_id, 0, back.attempt, back.fence, "req")
    side.expire(run.run_id)  # its holder died executing
    over = _claimed(side, run.run_id)
    assert (over.fence, over.attempt, over.claims, over.earlier_model_calls) == (3, 2, 1, 1)
    assert side.row(run.run_id)["round_attempts"] == 1


# --- the model-call ledger -------------------------------------------------------------------


def test_the_ledger_is_fenced_and_a_stale_call_is_recorded_for_the_next_claim(side: Side) -> None:
    run = _submit(side)
    c1 = _claimed(side, run.run_id)
    call = side.store.record_model_call_started(run.run_id, 0, c1.attempt, c1.fence, "req-1")
    assert isinstance(call, int)
    assert side.row(run.run_id)["execution_fence"] == c1.fence
    side.expire(run.run_id)
    c2 = _claimed(side, run.run_id)
    assert _fenced(lambda: side.store.record_model_call_started(run.run_id, 0, c1.attempt, c1.fence, "x")) == (
        "FenceLost"
    )
    response = {"content": "r", "tool_calls": [{"id": "c", "name": "echo", "args": {"x": 1.5}}]}
    # The old holder's call was paid for: recorded, marked stale, and the holder stops.
    assert _fenced(lambda: side.store.record_model_call_finished(
        call, run.run_id, c1.fence, response_digest="d", input_tokens=3, output_tokens=4, error_code=None,
        response=response,
    )) == "FenceLost"
    # Not a started call of this holder: nothing written.
    assert _fenced(lambda: side.store.record_model_call_finished(
        call, run.run_id, c2.fence, response_digest="d", input_tokens=3, output_tokens=4, error_code=None,
    )) == "FenceLost"
    mine = side.store.record_model_call_started(run.run_id, 0, c2.attempt, c2.fence, "req-2")
    side.store.record_model_call_finished(
        mine, run.run_id, c2.fence, response_digest="e", input_tokens=1, output_tokens=1, error_code="X",
    )
    assert side.store.release_lease(run.run_id, c2.fence, round_at_fault=True)
    c3 = _claimed(side, run.run_id, after_position=-1)
    assert c3.recorded_response is not None  # the stale holder's succeeded call, handed back
    assert (c3.recorded_response.request_digest, c3.recorded_response.response) == ("req-1", response)


# --- committing a round ----------------------------------------------------------------------


def test_a_commit_is_fenced_and_moves_the_boundary(side: Side) -> None:
    run = _submit(side)
    c1 = _claimed(side, run.run_id)
    side.store.record_model_call_started(run.run_id, 0, c1.attempt, c1.fence, "req")
    assert side.store.commit_round(record(c1, outcome="continue", status="running")).next_runs == ()
    assert side.row(run.run_id) == {"status": "running", "boundary_seq": 1, "claim_fence": 1, "round_attempts": 0,
                                    "round_claims": 0, "execution_fence": None, "leased": False}
    loaded = side.store.load_messages(run.root_id, 0)
    assert [(m.position, m.body) for m in loaded] == [(0, {"role": "user", "content": "go"}),
                                                      (1, {"role": "assistant", "content": "done"})]
    assert [m.position for m in side.store.load_messages(run.root_id, 1)] == [1]
    c2 = _claimed(side, run.run_id, 1, after_position=0)
    assert [m.position for m in c2.new_messages] == [1]
    assert c2.previous_round is not None and c2.previous_round.claim_fence == c1.fence
    with pytest.raises(FenceLost):
        side.store.commit_round(record(c1, outcome="continue", status="running"))
    with pytest.raises(FenceLost):
        side.store.commit_round(dataclasses.replace(record(c2), fence=c1.fence))
    assert side.row(run.run_id)["boundary_seq"] == 1
    assert _fenced(lambda: side.store.release_lease(run.run_id, c1.fence, round_at_fault=True)) == "returned False"
    assert _fenced(lambda: side.store.fail_claimed_run(run.run_id, c1.fence, "X", "x")) == "FenceLost"
    committed = side.store.commit_round(dataclasses.replace(record(c2), messages=()))
    assert committed.next_runs == () and side.row(run.run_id)["status"] == "completed"


def test_a_tool_call_id_is_stored_once_per_run(side: Side) -> None:
    run = _submit(side)
    c = _claimed(side, run.run_id)
    tool = _tool("call_0_0", ToolStatus.COMPLETED, result={"ok": True})
    base = record(c, outcome="continue", status="running")
    with pytest.raises(ToolCallIdReused):
        side.store.commit_round(dataclasses.replace(base, tools=(tool, tool)))
    assert side.row(run.run_id)["boundary_seq"] == 0  # nothing written
    side.store.commit_round(dataclasses.replace(base, tools=(tool,)))


def test_a_failed_run_hands_on_its_roots_turn(side: Side) -> None:
    first = _submit(side)
    later = _submit(side, root_id=first.root_id)
    c = _claimed(side, first.run_id)
    assert side.store.fail_claimed_run(first.run_id, c.fence, "X", "boom") == (later.run_id,)
    assert side.row(first.run_id)["status"] == "failed"
    assert _fenced(lambda: side.store.fail_claimed_run(first.run_id, c.fence, "X", "boom")) == "FenceLost"
    # No interrupt is pending: nothing to end.
    c2 = _claimed(side, later.run_id)
    assert side.store.end_interrupted_run(later.run_id, c2.fence) == (False, ())


def test_a_release_gives_the_claim_back(side: Side) -> None:
    run = _submit(side)
    c1 = _claimed(side, run.run_id)
    side.store.record_model_call_started(run.run_id, 0, c1.attempt, c1.fence, "req")
    assert side.store.release_lease(run.run_id, c1.fence, round_at_fault=False)
    assert side.row(run.run_id)["leased"] is False and side.row(run.run_id)["execution_fence"] is None
    c2 = _claimed(side, run.run_id)
    assert (c2.attempt, c2.claims) == (1, 0)  # given back: no attempt, no death
    side.store.record_model_call_started(run.run_id, 0, c2.attempt, c2.fence, "req")
    assert side.store.release_lease(run.run_id, c2.fence, round_at_fault=True, dispatch_after_s=5)
    assert _claimed(side, run.run_id).attempt == 2  # at fault: the attempt counts


# --- at-most-once tool executions ------------------------------------------------------------


def test_a_tool_execution_is_started_once(side: Side) -> None:
    run = _submit(side)
    c1 = _claimed(side, run.run_id)
    assert side.store.start_tool_execution(run.run_id, 0, "call_0_0", c1.fence, retry_of=None) is None
    side.expire(run.run_id)
    c2 = _claimed(side, run.run_id)
    assert _fenced(lambda: side.store.start_tool_execution(run.run_id, 0, "call_0_1", c1.fence, retry_of=None)) == (
        "FenceLost"
    )
    found = side.store.start_tool_execution(run.run_id, 0, "call_0_0", c2.fence, retry_of=None)
    assert found is not None and (found.status, found.result, found.executions) == (None, None, 1)
    side.store.finish_tool_execution(run.run_id, "call_0_0", c1.fence, "completed", {"sent": 1})
    again = side.store.start_tool_execution(run.run_id, 0, "call_0_0", c2.fence, retry_of=None)
    assert again is not None and (again.status, again.result) == ("completed", {"sent": 1})
    assert side.store.start_tool_execution(run.run_id, 0, "call_0_2", c2.fence, retry_of="inv-1") is None
    side.store.finish_tool_execution(run.run_id, "call_0_2", c2.fence, None, None)  # suspended: start cleared
    assert side.store.start_tool_execution(run.run_id, 0, "call_0_2", c2.fence, retry_of=None) is None


# --- suspensions and resumes ------------------------------------------------------------------


def _tool(call_id: str, status: ToolStatus, *, result: Any = None, suspension: dict[str, Any] | None = None,
          invocation_id: str | None = None, resumes: str | None = None) -> ToolInvocationRecord:
    return ToolInvocationRecord(
        tool_call_id=call_id, tool_name="await_prerequisite", tool_domain=ToolDomain.SDK,
        args={"key": "k"}, args_digest="a", status=status, result=result,
        result_digest=None if result is None else "r", suspension=suspension, invocation_id=invocation_id,
        work_owner=None if invocation_id is None else "worker",
        proof=None if invocation_id is None else f"proof-{invocation_id}",
        resumes_invocation_id=resumes,
    )


def _suspend(side: Side, c: Claim, key: str, invocation_id: str) -> RoundRecord:
    tool = _tool("call_0_0", ToolStatus.SUSPENDED, suspension={"kind": "prerequisite", "key": key},
                 invocation_id=invocation_id)
    suspended = dataclasses.replace(
        record(c, outcome="suspend", status="suspended"), tools=(tool,), events=(), messages=record(c).messages[:1]
    )
    side.store.commit_round(suspended)
    return suspended


def test_a_suspended_round_resumes_once_its_input_arrives(side: Side) -> None:
    run = _submit(side)
    c = _claimed(side, run.run_id)
    _suspend(side, c, "approval", "inv-1")
    assert side.row(run.run_id)["status"] == "suspended"
    assert side.store.resume_if_ready(run.run_id) == []  # nothing delivered yet
    [pending] = side.store.pending_resumes(run.run_id)
    assert (pending.invocation_id, pending.tool_call_id, pending.boundary_seq) == ("inv-1", "call_0_0", 0)
    due = side.store.due_of(run.run_id)
    assert (due.run_id, due.boundary_seq, due.resume, due.route.owner) == (run.run_id, 0, True, "team-a")
    assert _claim(side, run.run_id) is None
    assert side.store.explain_refused_claim(run.run_id, 0, resume=True).reason == "run_suspended"
    material = side.store.load_suspension("inv-1")
    assert material is not None
    assert (material.run_id, material.boundary_seq, [x.tool_call_id for x in material.calls]) == (
        run.run_id, 0, ["call_0_0"])
    assert (material.prerequisites, material.answers, material.files) == ({}, {}, {})
    assert material.round.claim_fence == c.fence
    assert side.store.load_suspension("inv-unknown") is None

    receipt = side.resolve(run.run_id, "approval", "yes")
    assert receipt.stored and [r.invocation_id for r in receipt.resumes] == ["inv-1"]
    assert side.store.resume_if_ready(run.run_id) == []  # already running: made ready once
    assert side.store.explain_refused_claim(run.run_id, 0, resume=False).reason == "round_awaits_resume"
    assert _claim(side, run.run_id) is None  # a round's claim: the suspended round awaits its resume
    assert _claim(side, run.run_id, resume_of=["inv-other"]) is None
    material = side.store.load_suspension("inv-1")
    assert material is not None and material.prerequisites == {"approval": "yes"}
    resumed = _claimed(side, run.run_id, resume_of=["inv-1"], after_position=0, cold=True)
    assert side.row(run.run_id)["execution_fence"] == resumed.fence  # a resume executes at once
    done = _tool("call_0_0", ToolStatus.COMPLETED, result="yes", invocation_id="inv-2", resumes="inv-1")
    side.store.commit_round(dataclasses.replace(record(resumed), resumed=True, tools=(done,),
                                                messages=record(c).messages[1:]))
    assert side.row(run.run_id)["status"] == "completed"
    assert side.store.pending_resumes(run.run_id) == []


def test_a_round_suspended_on_an_input_already_there_is_ready_at_once(side: Side) -> None:
    run = _submit(side)
    c = _claimed(side, run.run_id)
    _suspend(side, c, "approval", "inv-1")
    side.resolve(run.run_id, "approval", "yes")
    resumed = _claimed(side, run.run_id, resume_of=["inv-1"])
    done = _tool("call_0_0", ToolStatus.COMPLETED, result="yes", invocation_id="inv-2", resumes="inv-1")
    side.store.commit_round(dataclasses.replace(record(resumed, outcome="continue", status="running"), resumed=True,
                                                tools=(done,), messages=record(c).messages[1:]))
    c1 = _claimed(side, run.run_id, 1, after_position=1)
    again = dataclasses.replace(_tool("call_1_0", ToolStatus.SUSPENDED, invocation_id="inv-3",
                                      suspension={"kind": "prerequisite", "key": "approval"}))
    side.store.commit_round(dataclasses.replace(record(c1, outcome="suspend", status="suspended"), tools=(again,),
                                                events=(), messages=()))
    assert [r.invocation_id for r in side.store.resume_if_ready(run.run_id)] == ["inv-3"]
    assert side.row(run.run_id)["status"] == "running"
    assert side.store.resume_if_ready(run.run_id) == []


# --- context rebuilds ------------------------------------------------------------------------


def _next_ordinal(chain: Sequence[ChainBuild], predecessor: str | None) -> ReservationPlan:
    return ReservationPlan(None, len(chain) + 1, chain[-1].build_id if chain else predecessor)


def test_a_rebuild_is_reserved_and_its_candidate_recorded_under_the_fence(side: Side) -> None:
    run = _submit(side)
    c = _claimed(side, run.run_id)
    side.store.commit_round(record(c, outcome="continue", status="running"))
    c1 = _claimed(side, run.run_id, 1, after_position=1)
    sources = side.store.load_context_sources(run.root_id, 0)
    assert [(s.position, s.run_id, s.body["role"]) for s in sources] == [(0, str(run.run_id), "user"),
                                                                        (1, str(run.run_id), "assistant")]
    assert [s.position for s in side.store.load_context_sources(run.root_id, 1)] == [1]

    def reserve(fence: int) -> Any:
        return side.store.reserve_model_rebuild(run_id=run.run_id, fence=fence, boundary_seq=1, chain_anchor=0,
                                                predecessor_build_id=None, plan_reservation=_next_ordinal)

    assert _fenced(lambda: reserve(c.fence)) == "FenceLost"
    first = reserve(c1.fence)
    assert (first.ordinal, first.predecessor_build_id) == (1, None)
    second = reserve(c1.fence)
    assert (second.ordinal, second.predecessor_build_id) == (2, first.build_id)
    candidate = RebuildCandidate(1, (sources[0].message_id,), 0, "digest", "summary", False)
    assert _fenced(lambda: side.store.record_candidate(first.build_id, run.run_id, c.fence, candidate)) == "FenceLost"
    side.store.record_candidate(first.build_id, run.run_id, c1.fence, candidate)


# --- budgets ---------------------------------------------------------------------------------


def test_a_run_parks_for_its_owners_budget_under_its_fence(side: Side) -> None:
    side.set_budget("team-budget", 1000, "wait")
    run = _submit(side, owner="team-budget")
    c = _claimed(side, run.run_id)
    with pytest.raises(BudgetRefused) as refused:
        side.store.record_model_call_started(run.run_id, 0, c.attempt, c.fence, "req", 1500)
    assert {k: refused.value.shortfall[k] for k in ("on_budget", "token_budget", "used", "reserved", "estimate")} == {
        "on_budget": "wait", "token_budget": 1000, "used": 0, "reserved": 0, "estimate": 1500}
    assert side.spend("team-budget") == (0, 0)
    assert side.spend("team-budget") == (0, 0) and side.row(run.run_id)["execution_fence"] == c.fence
    assert side.store.park_for_budget(run.run_id, c.fence, 0, {"estimate": 1500}) == ()
    assert side.row(run.run_id) == {"status": "suspended", "boundary_seq": 0, "claim_fence": c.fence,
                                    "round_attempts": 0, "round_claims": 0, "execution_fence": None, "leased": False}
    assert _fenced(lambda: side.store.park_for_budget(run.run_id, c.fence, 0, {})) == "FenceLost"


# --- dispatch --------------------------------------------------------------------------------


def test_send_or_defer_makes_a_run_due_when_the_broker_is_down(side: Side) -> None:
    run = _submit(side)
    assert side.store.route_of(run.run_id) == Route("team-a", run.route.weight, run.route.priority)
    assert side.store.route_of(uuid4(), "someone") == Route("someone")
    sent: list[UUID] = []
    assert send_or_defer(side.store, run.run_id, lambda: sent.append(run.run_id))
    assert sent == [run.run_id] and not side.dispatched_failed(run.run_id)

    def down() -> None:
        raise ConnectionError("broker down")

    assert not send_or_defer(side.store, run.run_id, down)
    assert side.dispatched_failed(run.run_id)
    due = side.store.due_of(run.run_id, "team-a")
    assert (due.run_id, due.boundary_seq, due.resume, due.route.owner) == (run.run_id, 0, False, "team-a")
    gone = uuid4()
    assert side.store.due_of(gone, "someone") == type(due)(gone, 0, False, Route("someone"))
    side.store.dispatch_failed(gone)  # a run that is gone: nothing to do


# --- whole sequences, compared between the two stores ---------------------------------------------


def claim_view(c: Claim | None) -> Any:
    """A claim without the ids each store chose."""
    if c is None:
        return None
    view = dataclasses.asdict(c)
    for key in ("run_id", "root_id"):
        view.pop(key)
    # A duration read from each store's own clock (the memory store keeps no commit time).
    view.pop("queue_lag_s")
    return view


def drive(side: Side) -> list[Any]:
    """The sequence, returning what each step observed."""
    s, seen = side.store, []
    request, prepared = prepare_execution(RUNTIME, scripted_request([{"content": "done"}]))
    config = prepared.turn_config.model_dump(mode="json")
    run = side.submit(request, config)
    later = side.submit(request.model_copy(update={"root_id": run.root_id}), config)
    seen.append(("submitted", run.root_seq, later.root_seq, side.row(run.run_id)))

    def claim(boundary: int, after: int = -1, **kw: Any) -> Claim | None:
        return s.claim_round(
            run.run_id, boundary, lease_s=30, after_position=after, cold=after < 0, holder=HOLDER, **kw
        )

    c1 = claim(0)
    assert c1 is not None
    seen.append(("claimed", claim_view(c1), side.row(run.run_id)))
    seen.append(("stale claim", claim_view(claim(0)), s.explain_refused_claim(run.run_id, 0, resume=False).reason))
    seen.append(("later run waits", s.claim_round(later.run_id, 0, lease_s=30, after_position=-1, cold=True,
                                                  holder=HOLDER)))
    s.record_model_call_started(c1.run_id, 0, c1.attempt, c1.fence, "req")
    seen.append(("executing", side.row(run.run_id)))
    seen.append(("committed", s.commit_round(record(c1, outcome="continue", status="running")), side.row(run.run_id)))

    c2 = claim(1, after=0)
    assert c2 is not None
    seen.append(("claimed next", claim_view(c2), side.row(run.run_id)))
    seen.append(("old boundary", claim_view(claim(0)), s.explain_refused_claim(run.run_id, 0, resume=False).reason))
    seen.append(
        (
            "old fence",
            _fenced(lambda: s.commit_round(record(c1, outcome="continue", status="running"))),
            _fenced(lambda: s.record_model_call_started(c1.run_id, 1, c1.attempt, c1.fence, "req")),
            _fenced(lambda: s.release_lease(c1.run_id, c1.fence, round_at_fault=True)),
            _fenced(lambda: s.fail_claimed_run(c1.run_id, c1.fence, "X", "x")),
            side.row(run.run_id),
        )
    )
    call = s.record_model_call_started(c2.run_id, 1, c2.attempt, c2.fence, "req")
    # It starts an at_most_once call (the new holder below finds it, with no end).
    seen.append(("tool started", _fenced(lambda: s.start_tool_execution(c2.run_id, 1, "call_1_0", c2.fence,
                                                                         retry_of=None))))
    side.expire(run.run_id)  # its holder died executing: taken over
    c3 = claim(1, after=0, held_fence=None)
    assert c3 is not None
    seen.append(("taken over", claim_view(c3), side.row(run.run_id)))
    seen.append(
        (
            "tool executions",
            _fenced(lambda: s.start_tool_execution(c3.run_id, 1, "call_1_1", c2.fence, retry_of=None)),
            _fenced(lambda: s.start_tool_execution(c3.run_id, 1, "call_1_1", c3.fence, retry_of=None)),
            _fenced(lambda: s.start_tool_execution(c3.run_id, 1, "call_1_1", c3.fence, retry_of="wait-1")),
            _fenced(lambda: s.start_tool_execution(c3.run_id, 1, "call_1_1", c3.fence, retry_of="wait-1")),
            _fenced(lambda: s.finish_tool_execution(c3.run_id, "call_1_1", c3.fence, "completed", {"ok": 1})),
            _fenced(lambda: s.start_tool_execution(c3.run_id, 1, "call_1_1", c3.fence, retry_of=None)),
            _fenced(lambda: s.start_tool_execution(c3.run_id, 1, "call_1_0", c3.fence, retry_of=None)),
        )
    )
    seen.append(
        (
            "stale ledger",
            _fenced(lambda: s.record_model_call_finished(
                call, c2.run_id, c2.fence, response_digest="r", input_tokens=1, output_tokens=1, error_code=None,
                response={"content": "r", "tool_calls": [{"id": "c", "name": "echo", "args": {"x": 1.5}}]},
            )),
        )
    )
    s.record_model_call_started(c3.run_id, 1, c3.attempt, c3.fence, "req")
    seen.append(("released", s.release_lease(c3.run_id, c3.fence, round_at_fault=True), side.row(run.run_id)))
    c4 = claim(1, after=1)
    assert c4 is not None and c4.recorded_response is not None  # the stale holder's call, paid for
    seen.append(("after a fault", claim_view(c4), side.row(run.run_id)))
    finished = s.commit_round(dataclasses.replace(record(c4), messages=()))
    seen.append(("finished", finished.next_runs == (later.run_id,), side.row(run.run_id)))
    seen.append(("ended", claim_view(claim(2, after=1)), s.explain_refused_claim(run.run_id, 2, resume=False).reason))
    s.dispatch_failed(later.run_id)
    return seen


def test_the_double_observes_what_the_real_store_does(engine: Engine) -> None:
    expected, got = drive(real(engine)), drive(memory())
    for want, have in zip(expected, got, strict=True):
        assert have == want, f"step {want[0]!r}"


def drive_budget(side: Side) -> list[Any]:
    """Reservations against an owner's budget: taken, refused (nothing written), settled,
    and a run parked for it under its fence."""
    s, seen = side.store, []
    request, prepared = prepare_execution(RUNTIME, scripted_request([{"content": "done"}], owner="team-budget"))
    config = prepared.turn_config.model_dump(mode="json")
    side.set_budget("team-budget", 1000, "wait")
    first, second = side.submit(request, config), side.submit(request, config)
    c1, c2 = (s.claim_round(r.run_id, 0, lease_s=30, after_position=-1, cold=True, holder=HOLDER)
              for r in (first, second))
    assert c1 is not None and c2 is not None

    def start(c: Claim, estimate: int) -> Any:
        try:
            s.record_model_call_started(c.run_id, 0, c.attempt, c.fence, "req", estimate)
            return "reserved"
        except BudgetRefused as refused:
            return {k: refused.shortfall[k] for k in ("on_budget", "token_budget", "used", "reserved", "estimate")}

    def spend() -> tuple[int, int]:
        return side.spend("team-budget")

    call = s.record_model_call_started(c1.run_id, 0, c1.attempt, c1.fence, "req", 600)
    seen.append(("reserved", spend(), side.row(c1.run_id)))
    seen.append(("refused", start(c2, 500), spend(), side.row(c2.run_id)))
    s.record_model_call_finished(call, c1.run_id, c1.fence, response_digest="r", input_tokens=120, output_tokens=30,
                                 error_code=None)
    seen.append(("settled", spend()))
    seen.append(("refused again", start(c2, 900), spend()))
    s.park_for_budget(c2.run_id, c2.fence, 0, {"estimate": 900})
    seen.append(("parked", side.row(c2.run_id), _fenced(lambda: s.park_for_budget(c2.run_id, c2.fence, 0, {}))))
    seen.append(("within", start(c1, 850), spend()))
    return seen


def test_the_double_reserves_and_settles_budgets_as_postgresql_does(engine: Engine) -> None:
    expected, got = drive_budget(real(engine)), drive_budget(memory())
    for want, have in zip(expected, got, strict=True):
        assert have == want, f"step {want[0]!r}"


READ_ONE = [{"tool_calls": [{"name": "read_files", "args": {"paths": ["notes/a.txt"]}}]}, {"content": "read"}]
AWAIT = {"tool_calls": [{"name": "await_prerequisite", "args": {"key": "approval"}}]}
TURNS = [*READ_ONE[:1], AWAIT, AWAIT, {"content": "done"}]


def shell_flow(
    ctx: Any, submit: Callable[[], UUID], deliver: Callable[..., Any], resolve: Callable[..., Any],
    observe: Callable[[UUID], Any],
) -> list[Any]:
    """The worker shell (real round and resume code) through a suspension on a file, one on
    a prerequisite and one whose input is already there; what is stored after each step."""
    from worker.engine.resume import execute_resume
    from worker.engine.round import execute_round

    run_id, seen = submit(), []

    def step(name: str, disposition: Any) -> None:
        seen.append((name, getattr(disposition, "value", disposition), observe(run_id)))

    step("round 0 suspends", execute_round(ctx, RoundTask(run_id=run_id, boundary_seq=0)))
    receipt = deliver(run_id, "call_0_0", {"notes/a.txt": "alpha"})
    step("file delivered", len(receipt.resumes))
    step("resumed", execute_resume(ctx, receipt.resumes))
    step("round 1 suspends", execute_round(ctx, RoundTask(run_id=run_id, boundary_seq=1)))
    receipt = resolve(run_id, "approval", "yes")
    step("resolved", execute_resume(ctx, receipt.resumes))
    step("round 2 suspends, ready at once", execute_round(ctx, RoundTask(run_id=run_id, boundary_seq=2)))
    step("resumed again", execute_resume(ctx, ctx.store.pending_resumes(run_id)))
    step("finished", execute_round(ctx, RoundTask(run_id=run_id, boundary_seq=3)))
    return seen


def test_the_shell_stores_the_same_on_the_double_as_on_postgresql(ctx: Any) -> None:
    from tests.support.shell import shell
    from worker import client

    def observe_real(run_id: UUID) -> Any:
        r = run_row(ctx.engine, run_id)
        q = "SELECT {} FROM {} WHERE run_id = :id ORDER BY {}"
        return (
            {k: r[k] for k in (*RUN_FIELDS, "output")},
            [(t["tool_call_id"], t["status"], t["result"]) for t in rows(
                ctx.engine, q.format("tool_call_id, status, result", "tool_invocations", "id"), id=run_id)],
            [(x["boundary_seq"], x["outcome"]) for x in rows(
                ctx.engine, q.format("boundary_seq, outcome", "rounds", "boundary_seq"), id=run_id)],
            [(e["seq"], e["kind"]) for e in rows(ctx.engine, q.format("seq, kind", "run_events", "seq"), id=run_id)],
            [(c["boundary_seq"], c["attempt"], c["claim_fence"], c["status"]) for c in rows(
                ctx.engine, q.format("boundary_seq, attempt, claim_fence, status", "model_calls", "id"), id=run_id)],
        )

    s = shell()

    def observe_memory(run_id: UUID) -> Any:
        r = vars(s.store.run(run_id))
        return (
            {k: r[k] for k in (*RUN_FIELDS, "output")},
            [(t["tool_call_id"], t["status"], t["result"]) for t in s.store.tool_invocations],
            sorted((b, x["outcome"]) for (_, b), x in s.store.rounds.items()),
            [(e["seq"], e["kind"]) for e in s.store.events],
            [(c["boundary_seq"], c["attempt"], c["claim_fence"], c["status"]) for c in s.store.model_calls],
        )

    tools = ["read_files", "await_prerequisite"]
    expected = shell_flow(
        ctx,
        lambda: client.submit(scripted_request(TURNS, tools=tools), ctx=ctx).run_id,
        lambda *a: client.deliver(*a, ctx=ctx),
        lambda *a: client.resolve(*a, ctx=ctx),
        observe_real,
    )
    got = shell_flow(s.ctx, lambda: s.submit(TURNS, tools=tools), s.store.deliver_local_read,
                     s.store.resolve_prerequisite, observe_memory)
    for want, have in zip(expected, got, strict=True):
        assert have == want, f"step {want[0]!r}"

