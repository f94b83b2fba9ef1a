"""The in-memory store double (``tests.support.memory_store``) follows the real store: the
same sequence of operations (submit, claim, a stale claim, the ledger, commit, the next
claim, writes under an old fence, a release, a Root's order) is driven against
PostgreSQL (``schema.store.store.Store``) and against the double, and every observable
result is compared, so the double the shell's unit tests run on cannot drift silently."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any
from uuid import UUID

from sqlalchemy import Engine

from runtime.prepare import prepare_execution
from schema.store import runs as run_store
from schema.store.errors import FenceLost
from schema.store.runs import Submitted
from schema.store.store import Store
from schema.wire import RoundTask, RunRequest
from schema.wire.claim import Claim
from tests.support.db import run_row
from tests.support.memory_store import InMemoryStore
from tests.support.requests import scripted_request
from tests.support.store import HOLDER, RUNTIME, expire_lease, record

RUN_FIELDS = ("status", "boundary_seq", "claim_fence", "round_attempts", "round_claims", "execution_fence")


@dataclasses.dataclass
class Side:
    """One store and how to observe it."""

    store: Any  # Store or InMemoryStore
    submit: Callable[[RunRequest, dict[str, Any]], Submitted]
    row: Callable[[UUID], dict[str, Any]]
    expire: Callable[[UUID], None]


def real(engine: Engine) -> Side:
    def row(run_id: UUID) -> dict[str, Any]:
        r = run_row(engine, run_id)
        return {**{k: r[k] for k in RUN_FIELDS}, "leased": r["lease_expires_at"] is not None}

    return Side(
        Store(engine),
        lambda request, config: run_store.submit_run(engine, request, config),
        row,
        lambda run_id: expire_lease(engine, run_id),
    )


def memory() -> Side:
    store = InMemoryStore()

    def row(run_id: UUID) -> dict[str, Any]:
        r = vars(store.run(run_id))
        return {**{k: r[k] for k in RUN_FIELDS}, "leased": r["lease_expires_at"] is not None}

    return Side(store, store.submit_run, row, store.expire_lease)


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


def fenced(write: Callable[[], Any]) -> str:
    try:
        return f"returned {write()!r}"
    except FenceLost:
        return "FenceLost"


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
            fenced(lambda: s.commit_round(record(c1, outcome="continue", status="running"))),
            fenced(lambda: s.record_model_call_started(c1.run_id, 1, c1.attempt, c1.fence, "req")),
            fenced(lambda: s.release_lease(c1.run_id, c1.fence, round_at_fault=True)),
            fenced(lambda: s.fail_claimed_run(c1.run_id, c1.fence, "X", "x")),
            side.row(run.run_id),
        )
    )
    call = s.record_model_call_started(c2.run_id, 1, c2.attempt, c2.fence, "req")
    # It starts an at_most_once call (the new holder below finds it, with no end).
    seen.append(("tool started", fenced(lambda: s.start_tool_execution(c2.run_id, 1, "call_1_0", c2.fence,
                                                                        retry_of=None))))
    side.expire(run.run_id)  # its holder died executing: taken over
    c3 = claim(1, after=0, held_fence=None)
    assert c3 is not None
    seen.append(("taken over", claim_view(c3), side.row(run.run_id)))
    seen.append(
        (
            "tool executions",
            fenced(lambda: s.start_tool_execution(c3.run_id, 1, "call_1_1", c2.fence, retry_of=None)),
            fenced(lambda: s.start_tool_execution(c3.run_id, 1, "call_1_1", c3.fence, retry_of=None)),
            fenced(lambda: s.start_tool_execution(c3.run_id, 1, "call_1_1", c3.fence, retry_of="wait-1")),
            fenced(lambda: s.start_tool_execution(c3.run_id, 1, "call_1_1", c3.fence, retry_of="wait-1")),
            fenced(lambda: s.finish_tool_execution(c3.run_id, "call_1_1", c3.fence, "completed", {"ok": 1})),
            fenced(lambda: s.start_tool_execution(c3.run_id, 1, "call_1_1", c3.fence, retry_of=None)),
            fenced(lambda: s.start_tool_execution(c3.run_id, 1, "call_1_0", c3.fence, retry_of=None)),
        )
    )
    seen.append(
        (
            "stale ledger",
            fenced(lambda: s.record_model_call_finished(
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


def test_the_double_has_every_method_of_the_store_with_its_signature() -> None:
    for name, method in inspect.getmembers(Store, inspect.isfunction):
        if name.startswith("_"):
            continue
        double = getattr(InMemoryStore, name, None)
        assert double is not None, f"InMemoryStore lacks Store.{name}"
        assert inspect.signature(double) == inspect.signature(method), name


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
    step("resumed again", execute_resume(ctx, _pending(ctx, run_id)))
    step("finished", execute_round(ctx, RoundTask(run_id=run_id, boundary_seq=3)))
    return seen


def _pending(ctx: Any, run_id: UUID) -> Any:
    store = ctx.store
    if isinstance(store, InMemoryStore):
        return store.pending_resumes(run_id)
    from schema.store.suspensions import pending_resumes

    return pending_resumes(ctx.engine, run_id)


def test_the_shell_stores_the_same_on_the_double_as_on_postgresql(ctx: Any) -> None:
    from tests.support.db import rows
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


def drive_budget(side: Side, set_budget: Callable[[int, str], None], spend: Callable[[], tuple[int, int]]) -> list[Any]:
    """Reservations against an owner's budget: taken, refused (nothing written), settled,
    and a run parked for it under its fence."""
    from schema.store.budgets import BudgetRefused

    s, seen = side.store, []
    request, prepared = prepare_execution(RUNTIME, scripted_request([{"content": "done"}], owner="team-budget"))
    config = prepared.turn_config.model_dump(mode="json")
    set_budget(1000, "wait")
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

    call = s.record_model_call_started(c1.run_id, 0, c1.attempt, c1.fence, "req", 600)
    seen.append(("reserved", spend(), side.row(c1.run_id)))
    seen.append(("refused", start(c2, 500), spend(), side.row(c2.run_id)))
    s.record_model_call_finished(call, c1.run_id, c1.fence, response_digest="r", input_tokens=120, output_tokens=30,
                                 error_code=None)
    seen.append(("settled", spend()))
    seen.append(("refused again", start(c2, 900), spend()))
    s.park_for_budget(c2.run_id, c2.fence, 0, {"estimate": 900})
    seen.append(("parked", side.row(c2.run_id), fenced(lambda: s.park_for_budget(c2.run_id, c2.fence, 0, {}))))
    seen.append(("within", start(c1, 850), spend()))
    return seen


def test_the_double_reserves_and_settles_budgets_as_postgresql_does(engine: Engine) -> None:
    from schema.store.budgets import set_owner_budget
    from tests.support.db import rows

    def real_spend() -> tuple[int, int]:
        found = rows(engine, "SELECT used, reserved FROM owner_spend WHERE owner = 'team-budget'")
        return (found[0]["used"], found[0]["reserved"]) if found else (0, 0)

    expected = drive_budget(
        real(engine), lambda budget, on: set_owner_budget(engine, "team-budget", budget, "1h", on) and None, real_spend
    )
    side = memory()
    store = side.store

    def memory_spend() -> tuple[int, int]:
        budget = store.budgets.get("team-budget", {})
        return budget.get("used", 0), budget.get("reserved", 0)

    got = drive_budget(side, lambda budget, on: store.set_budget("team-budget", budget, on), memory_spend)
    for want, have in zip(expected, got, strict=True):
        assert have == want, f"step {want[0]!r}"
