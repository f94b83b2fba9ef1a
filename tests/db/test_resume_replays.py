"""Replayed, stale and concurrent resumes: each suspension is resumed exactly once.

A run is suspended by a real round (``worker.engine.round.execute_round``), its input delivered
through ``worker.client`` (helpers in tests/support/suspensions.py). Every refusal is checked
against a snapshot of every table the feature touches: a refusal must change nothing at all.
"""

from __future__ import annotations

import threading
from typing import Any

from schema.store.store import Store
from tests.support.db import rows
from tests.support.store import HOLDER
from tests.support.suspensions import (
    BODY,
    assert_unchanged,
    attempt,
    drive,
    events_of,
    ready_read_and_count,
    ready_read_one,
    resigned,
    snapshot,
)
from worker.engine.resume import execute_resume
from worker.engine.round import RoundDisposition

# --- replayed and stale resumes ----------------------------------------------------------------


def replayed(outcome: str) -> bool:
    """A replayed resume is refused (on any field) or its claim is dropped."""
    return outcome == "dropped" or outcome.startswith("refused:")


def test_a_replayed_resume_is_refused_after_the_resume_and_after_the_run_completed(ctx) -> None:
    run_id, resumes = ready_read_one(ctx)
    assert execute_resume(ctx, resumes) is RoundDisposition.COMMITTED
    # Replayed between the resume and the next round (the run is running at boundary 1).
    before = snapshot(ctx)
    assert replayed(attempt(ctx, resumes))
    assert_unchanged(ctx, before, "a resume replayed before the next round")

    assert drive(ctx, run_id)["status"] == "completed"
    before = snapshot(ctx)
    assert replayed(attempt(ctx, resumes))
    assert replayed(attempt(ctx, [resigned(ctx, resumes[0], boundary_seq=1)]))
    assert_unchanged(ctx, before, "a resume replayed after the run completed")
    assert len(events_of(ctx, run_id, "round_resumed")) == 1


def test_a_stale_resume_whose_suspension_another_claim_resumed_in_between_is_dropped(ctx, monkeypatch) -> None:
    """The resume passes its checks, then, before it claims, another holder resumes the
    same suspension and commits. The late claim must find nothing to claim."""
    run_id, resumes = ready_read_and_count(ctx)
    original_claim = Store.claim_round
    state: dict[str, Any] = {}

    def claim_after_another_resume(store: Store, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("resume_of") is not None and "other" not in state:
            state["other"] = "running"
            state["other"] = execute_resume(ctx, resumes)  # the other holder, to completion
            state["after_other"] = snapshot(ctx)
        return original_claim(store, *args, **kwargs)

    monkeypatch.setattr(Store, "claim_round", claim_after_another_resume)
    assert execute_resume(ctx, resumes) is RoundDisposition.DROPPED
    assert state["other"] is RoundDisposition.COMMITTED
    assert_unchanged(ctx, state["after_other"], "the stale resume")
    assert len(events_of(ctx, run_id, "round_resumed")) == 1
    completed = events_of(ctx, run_id, "tool_completed")
    assert sorted(e["tool_call_id"] for e in completed) == ["call_0_0", "call_0_1"]


def test_concurrent_deliveries_of_one_resume_commit_it_exactly_once(ctx) -> None:
    run_id, resumes = ready_read_and_count(ctx)
    barrier = threading.Barrier(4)
    outcomes: list[str] = []

    def race() -> None:
        barrier.wait()
        outcomes.append(attempt(ctx, resumes))

    threads = [threading.Thread(target=race) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes).count("committed") == 1, outcomes
    assert all(o == "committed" or replayed(o) for o in outcomes), outcomes
    assert len(events_of(ctx, run_id, "round_resumed")) == 1
    tool_messages = rows(
        ctx.engine, f"SELECT {BODY} AS body FROM messages AS m WHERE run_id = :id AND role = 'tool'", id=run_id
    )
    assert sorted(m["body"]["tool_call_id"] for m in tool_messages) == ["call_0_0", "call_0_1"]


def test_the_resume_claim_takes_only_the_very_suspension_it_names(ctx) -> None:
    run_id, resumes = ready_read_and_count(ctx)
    ids = [r.invocation_id for r in resumes]
    before = snapshot(ctx)

    def claim(resume_of: list[str] | None) -> Any:
        return Store(ctx.engine).claim_round(
            run_id, 0, lease_s=30, after_position=-1, cold=True, holder=HOLDER, resume_of=resume_of
        )

    assert claim(None) is None  # a plain round claim never re-runs a suspended round
    assert claim(ids[:1]) is None
    assert claim([*ids, "0" * 32]) is None
    assert claim([ids[0], "f" * 32]) is None
    assert claim([]) is None
    assert_unchanged(ctx, before, "refused resume claims")
    taken = claim(list(reversed(ids)))
    assert taken is not None and taken.fence == resumes[0].claim_fence + 1
