"""The worker shell of a round (``worker.engine.round``) on the in-memory store, the fake lease
keeper and the fake dispatcher: no PostgreSQL, no broker, the real runtime core (the
scripted model). The db tier proves the same behaviours against the real store
(tests/db/test_store.py, test_attempts.py, test_round_proofs.py); the double is kept
honest by tests/db/test_memory_store_parity.py."""

from __future__ import annotations

import dataclasses
import threading
from typing import Any
from uuid import UUID

import pytest
from sqlalchemy.exc import OperationalError

import worker.engine.round as round_module
from runtime.models.base import ModelRequest, ModelResponse
from runtime.proofs import ROUND_PROOF_INVALID
from runtime.tools.base import ToolsetUnavailable
from schema.store.errors import FenceLost
from schema.wire import RoundTask
from tests.support.shell import Sent, Shell, shell
from worker.engine.round import CONFIG_INVALID, ROUND_ATTEMPTS_EXHAUSTED, UNSTARTED_CLAIMS_FACTOR, RoundDisposition
from worker.ops.deltas import RunDelta

ADD = [{"tool_calls": [{"name": "add", "args": {"a": 2, "b": 3}}]}, {"content": "5"}]
OTHER_HOLDER = UUID(int=7)


def execute(s: Shell, run_id: UUID, boundary_seq: int) -> RoundDisposition:
    return round_module.execute_round(s.ctx, RoundTask(run_id=run_id, boundary_seq=boundary_seq))


class Raising:
    def __init__(self, error: BaseException) -> None:
        self.error = error

    def complete(self, request: ModelRequest) -> ModelResponse:
        raise self.error


def model_raises(monkeypatch: pytest.MonkeyPatch, error: BaseException) -> None:
    """Every round's model call raises ``error`` (after its ledger row is written)."""
    real = round_module.drive_react_loop

    def step(deps: Any, state: Any, hooks: Any) -> Any:
        return real(dataclasses.replace(deps, model=Raising(error)), state, hooks)

    monkeypatch.setattr(round_module, "drive_react_loop", step)


def test_a_round_commits_and_dispatches_the_next_one() -> None:
    s = shell()
    run_id = s.submit(ADD)
    assert execute(s, run_id, 0) is RoundDisposition.COMMITTED
    run = s.store.run(run_id)
    assert (run.status, run.boundary_seq, run.lease_expires_at, run.claim_fence) == ("running", 1, None, 1)
    assert s.dispatch.sent == [Sent("round", run_id, 1)]
    # Held while its state was built and while the round ran, let go before the commit.
    assert s.leases.holdings == [(run_id, 1), (run_id, 1)] and s.leases.held == {}
    assert [m["position"] for m in s.store.messages] == [0, 1, 2]
    (tool,) = s.store.tool_invocations
    assert (tool["tool_name"], tool["status"], tool["result"]) == ("add", "completed", {"sum": 5.0})
    (call,) = s.store.model_calls
    assert (call["status"], call["attempt"], call["claim_fence"], call["stale"]) == ("succeeded", 1, 1, False)

    assert execute(s, run_id, 1) is RoundDisposition.COMMITTED
    run = s.store.run(run_id)
    assert (run.status, run.output, run.boundary_seq) == ("completed", "5", 2)
    assert s.dispatch.sent == [Sent("round", run_id, 1)]  # nothing after the end of a lone run


def test_a_claim_refused_on_a_stale_snapshot_is_claimed_once_more(monkeypatch: pytest.MonkeyPatch) -> None:
    """A claim can be refused on a snapshot older than the commit that let its run start
    (a freed slot whose pick skipped this run, its row locked by this very claim): read
    right after, the run meets every condition, so the round claims it once more and
    runs; refused again, the delivery is dropped, with no further try."""
    s = shell()
    run_id = s.submit(ADD)
    real = s.store.claim_round
    calls: list[int] = []

    def stale_first(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return None if len(calls) == 1 else real(*args, **kwargs)

    monkeypatch.setattr(s.store, "claim_round", stale_first)
    assert execute(s, run_id, 0) is RoundDisposition.COMMITTED
    assert len(calls) == 2 and s.store.run(run_id).boundary_seq == 1

    calls.clear()
    monkeypatch.setattr(s.store, "claim_round", lambda *args, **kwargs: calls.append(1))  # refused every time
    assert execute(s, run_id, 1) is RoundDisposition.DROPPED
    assert len(calls) == 2 and s.store.run(run_id).boundary_seq == 1


def test_a_finished_run_dispatches_the_roots_next_run() -> None:
    s = shell()
    first = s.submit([{"content": "one"}])
    root_id = s.store.runs[first].root_id
    second = s.submit([{"content": "two"}], root_id=str(root_id))
    assert execute(s, second, 0) is RoundDisposition.DROPPED  # the Root's earlier run holds its turn
    assert execute(s, first, 0) is RoundDisposition.COMMITTED
    assert s.dispatch.sent == [Sent("round", second, 0)]
    assert execute(s, second, 0) is RoundDisposition.COMMITTED
    assert s.store.run(second).output == "two"


def test_a_refused_claim_is_dropped_and_writes_nothing() -> None:
    s = shell()
    run_id = s.submit(ADD)
    other = s.store.claim_round(run_id, 0, lease_s=30, after_position=-1, cold=True, holder=OTHER_HOLDER)
    assert other is not None
    before = s.store.snapshot()
    for boundary in (0, 1):  # leased by a live holder; at another boundary
        assert execute(s, run_id, boundary) is RoundDisposition.DROPPED
    assert s.store.snapshot() == before
    assert s.dispatch.sent == [] and s.leases.holdings == []


def test_a_stale_fence_at_commit_raises_fence_lost_and_stores_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    s = shell()
    run_id = s.submit(ADD)
    real = round_module.drive_react_loop

    def taken_over_before_commit(deps: Any, state: Any, hooks: Any) -> Any:
        result = real(deps, state, hooks)
        s.store.expire_lease(run_id)  # this holder paused past its lease: another took over
        assert s.store.claim_round(run_id, 0, lease_s=30, after_position=-1, cold=True, holder=OTHER_HOLDER)
        return result

    monkeypatch.setattr(round_module, "drive_react_loop", taken_over_before_commit)
    with pytest.raises(FenceLost):
        execute(s, run_id, 0)
    assert s.store.rounds == {} and s.store.messages == [] and s.store.tool_invocations == []
    run = s.store.run(run_id)
    assert (run.boundary_seq, run.claim_fence, run.lease_expires_at is not None) == (0, 2, True)  # the thief's
    assert s.dispatch.sent == [] and s.leases.unreleased == {}


@pytest.mark.parametrize(
    ("error", "attempt_after"),
    [(RuntimeError("a bug in the round"), 2), (ToolsetUnavailable("an MCP server is down"), 1)],
)
def test_an_error_in_the_round_gives_the_claim_back_and_counts_an_attempt_only_when_at_fault(
    monkeypatch: pytest.MonkeyPatch, error: BaseException, attempt_after: int
) -> None:
    s = shell()
    run_id = s.submit(ADD)
    model_raises(monkeypatch, error)
    with pytest.raises(type(error)):
        execute(s, run_id, 0)
    run = s.store.run(run_id)
    assert (run.lease_expires_at, run.status, run.boundary_seq) == (None, "running", 0)  # given back at once
    assert s.store.calls[-1] == "release_lease" and s.dispatch.sent == []
    again = s.store.claim_round(run_id, 0, lease_s=30, after_position=-1, cold=True, holder=OTHER_HOLDER)
    assert again is not None and again.attempt == attempt_after


def test_a_release_that_fails_while_the_database_is_down_is_taken_back_at_the_next_claim(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    s = shell()
    run_id = s.submit(ADD)
    down = OperationalError("UPDATE runs", {}, Exception("connection refused"))
    model_raises(monkeypatch, down)

    def release(*args: Any, **kwargs: Any) -> bool:
        raise down

    monkeypatch.setattr(s.store, "release_lease", release)
    with pytest.raises(OperationalError):
        execute(s, run_id, 0)
    assert s.leases.unreleased == {run_id: 1}
    assert s.store.run(run_id).lease_expires_at is not None  # still leased: nobody else may claim
    monkeypatch.undo()
    assert execute(s, run_id, 0) is RoundDisposition.COMMITTED  # this process takes it back, for free
    assert [c["attempt"] for c in s.store.model_calls] == [1, 1]
    assert s.leases.unreleased == {}


def test_a_round_that_keeps_raising_fails_the_run_once_its_attempts_are_spent(monkeypatch: pytest.MonkeyPatch) -> None:
    s = shell()
    run_id = s.submit(ADD)
    model_raises(monkeypatch, RuntimeError("poison"))
    for _ in range(s.ctx.settings.max_round_attempts):
        with pytest.raises(RuntimeError):
            execute(s, run_id, 0)
    assert execute(s, run_id, 0) is RoundDisposition.RUN_FAILED
    run = s.store.run(run_id)
    assert (run.status, run.error_code) == ("failed", ROUND_ATTEMPTS_EXHAUSTED)
    assert len(s.store.model_calls) == s.ctx.settings.max_round_attempts  # the last claim called no model
    assert s.store.events[-1]["kind"] == "run_failed"


def test_a_round_whose_holders_keep_dying_before_executing_fails_the_run() -> None:
    s = shell()
    run_id = s.submit(ADD)
    run = s.store.runs[run_id]
    run.round_claims = UNSTARTED_CLAIMS_FACTOR * s.ctx.settings.max_round_attempts
    run.status, run.lease_expires_at = "running", 0.0  # and its last holder died too
    assert execute(s, run_id, 0) is RoundDisposition.RUN_FAILED
    assert s.store.run(run_id).error_code == ROUND_ATTEMPTS_EXHAUSTED
    assert s.store.model_calls == []


def test_a_tampered_previous_round_proof_fails_the_run_before_any_model_call() -> None:
    s = shell()
    run_id = s.submit(ADD)
    assert execute(s, run_id, 0) is RoundDisposition.COMMITTED
    stored = s.store.rounds[(run_id, 0)]["stored"]
    stored["proof"] = stored["proof"][:-1] + ("0" if stored["proof"][-1] != "0" else "1")
    assert execute(s, run_id, 1) is RoundDisposition.RUN_FAILED
    run = s.store.run(run_id)
    assert (run.status, run.error_code) == ("failed", ROUND_PROOF_INVALID)
    assert len(s.store.model_calls) == 1


def test_an_invalid_stored_config_fails_the_run_and_hands_the_root_on() -> None:
    s = shell()
    run_id = s.submit(ADD)
    later = s.submit(ADD, root_id=str(s.store.runs[run_id].root_id))
    s.store.runs[run_id].config["model"] = {"provider": "no-such-provider"}
    assert execute(s, run_id, 0) is RoundDisposition.RUN_FAILED
    run = s.store.run(run_id)
    assert (run.status, run.error_code) == ("failed", CONFIG_INVALID)
    assert s.store.model_calls == [] and s.dispatch.sent == [Sent("round", later, 0)]


def test_a_broker_that_stays_down_defers_to_the_reconciler_and_the_round_stays_committed() -> None:
    s = shell()
    run_id = s.submit(ADD)
    s.dispatch.down = True
    assert execute(s, run_id, 0) is RoundDisposition.COMMITTED
    assert s.dispatch.attempts == 1 and s.dispatch.sent == []
    assert s.store.calls[-1] == "dispatch_failed"
    run = s.store.run(run_id)
    assert (run.boundary_seq, run.dispatched_at) == (1, float("-inf"))  # due at the next pass


def test_a_warm_context_cache_loads_only_the_new_messages() -> None:
    first, second = shell(), shell()
    second = dataclasses.replace(second, store=first.store, ctx=dataclasses.replace(second.ctx, store=first.store))
    turns = [{"tool_calls": [{"name": "echo", "args": {"n": i}}]} for i in range(3)] + [{"content": "done"}]
    run_id = first.submit(turns)
    claims: list[Any] = []
    claim_round = first.store.claim_round

    def recording(*args: Any, **kwargs: Any) -> Any:
        claims.append((kwargs, claim := claim_round(*args, **kwargs)))
        return claim

    first.store.claim_round = recording  # type: ignore[method-assign]
    for boundary, worker in enumerate((first, first, second, first)):
        assert execute(worker, run_id, boundary) is RoundDisposition.COMMITTED
    seen = [(kw["cold"], kw["after_position"], [m.position for m in c.new_messages]) for kw, c in claims]
    assert seen == [
        (True, -1, []),  # nothing committed yet
        (False, 2, []),  # its own round is cached
        (True, -1, [0, 1, 2, 3, 4]),  # the other worker loads the whole history once
        (False, 4, [5, 6]),  # only what the other worker committed
    ]
    assert [c.input for _, c in claims] == ["go", None, "go", None]
    assert first.store.run(run_id).output == "done"


def test_two_deliveries_of_one_round_at_once_commit_it_once() -> None:
    s = shell()
    run_id = s.submit(ADD)
    results: list[RoundDisposition] = []
    threads = [threading.Thread(target=lambda: results.append(execute(s, run_id, 0))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == sorted([RoundDisposition.COMMITTED] + [RoundDisposition.DROPPED] * 3)
    assert len(s.store.rounds) == 1 and len(s.store.model_calls) == 1


class Died(BaseException):
    """The worker died at the failpoint (in a real worker: os._exit, no cleanup)."""


def dies_after_the_model_call(monkeypatch: pytest.MonkeyPatch, times: int = 1_000) -> list[str]:
    """The next ``times`` executions that reach their model response die there; returns
    the log of the points reached."""
    reached: list[str] = []

    def hit(name: str, *, owner: str | None = None) -> None:
        reached.append(name)
        if name == "after_model_call" and reached.count(name) <= times:
            raise Died

    monkeypatch.setattr(round_module.failpoints, "hit", hit)
    return reached


def test_a_round_redone_after_its_holder_died_past_the_model_call_calls_no_model(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    s = shell()
    run_id = s.submit(ADD)
    reached = dies_after_the_model_call(monkeypatch, times=1)
    with pytest.raises(Died):
        execute(s, run_id, 0)
    (paid,) = s.store.model_calls
    assert paid["status"] == "succeeded" and paid["response"] is not None

    assert execute(s, run_id, 0) is RoundDisposition.COMMITTED
    assert s.store.model_calls == [paid]
    assert s.store.calls.count("record_model_call_started") == 1
    assert reached.count("after_model_call") == 2  # the redone round reached the same point
    stored = s.store.rounds[(run_id, 0)]["stored"]
    assert (stored["claim_fence"], stored["accepted_response_digest"]) == (2, paid["response_digest"])
    (tool,) = s.store.tool_invocations
    assert (tool["tool_name"], tool["result"], tool["claim_fence"]) == ("add", {"sum": 5.0}, 2)
    assert execute(s, run_id, 1) is RoundDisposition.COMMITTED  # the next round calls the model
    assert [c["boundary_seq"] for c in s.store.model_calls] == [0, 1]
    assert s.store.run(run_id).output == "5"


def test_a_round_that_kills_its_holder_after_the_model_call_spends_its_attempts_on_one_paid_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    s = shell()
    run_id = s.submit(ADD)
    dies_after_the_model_call(monkeypatch)
    for _ in range(s.ctx.settings.max_round_attempts):
        with pytest.raises(Died):
            execute(s, run_id, 0)
    assert execute(s, run_id, 0) is RoundDisposition.RUN_FAILED
    run = s.store.run(run_id)
    assert (run.status, run.error_code) == ("failed", ROUND_ATTEMPTS_EXHAUSTED)
    assert "started executing 3 times" in (run.error_message or "")
    assert [(c["attempt"], c["claim_fence"]) for c in s.store.model_calls] == [(1, 1)]


def test_a_round_publishes_its_deltas_and_a_redone_round_says_it_restarts(monkeypatch: pytest.MonkeyPatch) -> None:
    s = shell()
    text = "five, as asked"
    run_id = s.submit([{"content": text}])
    model_raises(monkeypatch, RuntimeError("a bug after some text"))
    with pytest.raises(RuntimeError):
        execute(s, run_id, 0)  # the model raised before streaming: nothing published
    monkeypatch.undo()
    assert s.ctx.deltas.published == []  # type: ignore[union-attr]

    assert execute(s, run_id, 0) is RoundDisposition.COMMITTED  # attempt 2
    published = [d for r, d in s.ctx.deltas.published if r == run_id]  # type: ignore[union-attr]
    assert published[0] == RunDelta(0, kind="model_stream_restarted", attempt=2)
    assert [d.kind for d in published[1:]] == ["model_delta"] * 3
    assert "".join(d.delta for d in published[1:]) == text and {d.attempt for d in published} == {2}


def test_a_first_attempt_publishes_deltas_with_no_restart() -> None:
    s = shell()
    run_id = s.submit([{"content": "five"}])
    assert execute(s, run_id, 0) is RoundDisposition.COMMITTED
    assert s.ctx.deltas.published == [(run_id, RunDelta(0, "five", attempt=1))]  # type: ignore[union-attr]
    assert s.ctx.deltas.flushes == 1  # type: ignore[union-attr]  # before the ledger write and the commit
