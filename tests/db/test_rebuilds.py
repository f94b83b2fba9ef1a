"""Context rebuild against a real PostgreSQL: chain slots, candidate verification and the
REPEATABLE READ admission, with real concurrent transactions (no mocked errors)."""

from __future__ import annotations

import threading
from typing import Any
from uuid import UUID

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError, IntegrityError

from runtime.rebuild import (
    RebuildCandidate,
    RebuildExhausted,
    RebuildPredecessorMismatch,
    RebuildSourceChanged,
    deterministic_summary,
    plan_reservation,
    prepare_model_rebuild_candidate,
    verify_prepared_prefix,
)
from schema.store.errors import FenceLost
from schema.store.store import Store
from schema.store.tx import RETRYABLE_SQLSTATES, sqlstate_of
from schema.wire import RoundTask
from schema.wire.claim import Claim
from tests.support.db import rows
from tests.support.requests import scripted_request
from tests.support.store import HOLDER
from worker import client
from worker.engine.round import execute_round

ROUNDS = 6


def held_run(ctx: Any, rounds: int = ROUNDS) -> Claim:
    """A run with ``rounds`` committed tool rounds, claimed for its next round."""
    turns = [{"tool_calls": [{"name": "echo", "args": {"n": i, "pad": "x" * 40}}]} for i in range(rounds)]
    run_id = client.submit(scripted_request([*turns, {"content": "done"}]), ctx=ctx).run_id
    for boundary in range(rounds):
        execute_round(ctx, RoundTask(run_id=run_id, boundary_seq=boundary))
    claim = Store(ctx.engine).claim_round(run_id, rounds, lease_s=60, after_position=-1, cold=True, holder=HOLDER)
    assert claim is not None
    return claim


def anchor(ctx: Any, claim: Claim) -> int:
    return rows(ctx.engine, "SELECT max(position) AS p FROM messages WHERE root_id = :r", r=claim.root_id)[0]["p"]


def reserve(ctx: Any, claim: Claim, predecessor: UUID | None = None, fence: int | None = None) -> Any:
    return Store(ctx.engine).reserve_model_rebuild(
        run_id=claim.run_id,
        fence=claim.fence if fence is None else fence,
        boundary_seq=claim.boundary_seq,
        chain_anchor=anchor(ctx, claim),
        predecessor_build_id=predecessor,
        plan_reservation=plan_reservation,
    )


def candidate(ctx: Any, claim: Claim, ordinal: int = 1, calls: list[int] | None = None) -> RebuildCandidate:
    def summarizer(source: Any) -> str:
        if calls is not None:
            calls.append(1)
        return deterministic_summary(source)

    sources = Store(ctx.engine).load_context_sources(claim.root_id, 0)
    return prepare_model_rebuild_candidate(sources, summarizer, ordinal)


def admit(ctx: Any, claim: Claim, build_id: UUID, cand: RebuildCandidate, **kwargs: Any) -> None:
    Store(ctx.engine).admit_model_rebuild_request(
        build_id=build_id,
        run_id=claim.run_id,
        fence=kwargs.pop("fence", claim.fence),
        boundary_seq=claim.boundary_seq,
        chain_anchor=anchor(ctx, claim),
        context_start=0,
        candidate=cand,
        authorize=kwargs.pop("authorize", lambda fence: None),
        verify_prefix=verify_prepared_prefix,
        **kwargs,
    )


def counts(ctx: Any) -> dict[str, int]:
    return {
        "builds": rows(ctx.engine, "SELECT count(*) AS n FROM runtime_work_model_rebuilds")[0]["n"],
        "consumptions": rows(ctx.engine, "SELECT count(*) AS n FROM runtime_work_model_rebuild_consumptions")[0]["n"],
        "rebuilds": rows(ctx.engine, "SELECT coalesce(sum(rebuilds), 0) AS n FROM run_checkpoints")[0]["n"],
    }


def test_a_real_serialization_conflict_retries_only_the_admission(ctx: Any) -> None:
    claim = held_run(ctx)
    build = reserve(ctx, claim)
    summaries: list[int] = []
    cand = candidate(ctx, claim, calls=summaries)
    snapshots: list[int] = []

    def interfere() -> None:
        # Once the admission has read its REPEATABLE READ snapshot, another connection
        # commits a change to the checkpoint row it is about to update: a real 40001.
        snapshots.append(1)
        if len(snapshots) == 1:
            with ctx.engine.begin() as other:
                other.execute(
                    text("UPDATE run_checkpoints SET updated_at = now() WHERE run_id = :id"), {"id": claim.run_id}
                )

    admit(ctx, claim, build.build_id, cand, after_snapshot=interfere)
    assert len(snapshots) == 2, "the transaction ran exactly twice"
    assert summaries == [1], "the summary was generated once, before the transaction"
    assert counts(ctx) == {"builds": 1, "consumptions": 1, "rebuilds": 1}
    cp = rows(ctx.engine, "SELECT * FROM run_checkpoints WHERE run_id = :id", id=claim.run_id)[0]
    assert cp["context_start_position"] == cand.last_source_position + 1
    assert cp["summary"] == cand.summary and cp["last_build_id"] == build.build_id


def test_a_message_appended_between_prepare_and_verify_is_source_changed(ctx: Any) -> None:
    claim = held_run(ctx)
    build = reserve(ctx, claim)
    cand = candidate(ctx, claim, ordinal=2)
    last = anchor(ctx, claim)
    with ctx.engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO messages (root_id, position, run_id, boundary_seq, role, body, chain_digest) "
                "VALUES (:root, :pos, :run, 99, 'user', CAST(:body AS jsonb), 'x')"
            ),
            {"root": claim.root_id, "pos": last + 1, "run": claim.run_id, "body": '{"role": "user", "content": "hi"}'},
        )
    with pytest.raises(RebuildSourceChanged) as refused:
        admit(ctx, claim, build.build_id, cand)
    assert refused.value.code == "RUNTIME_WORK_MODEL_REBUILD_SOURCE_CHANGED"
    assert counts(ctx) == {"builds": 1, "consumptions": 0, "rebuilds": 0}


def test_a_changed_message_body_in_the_prefix_is_source_changed(ctx: Any) -> None:
    claim = held_run(ctx)
    build = reserve(ctx, claim)
    cand = candidate(ctx, claim)
    with ctx.engine.begin() as conn:
        conn.execute(
            text("UPDATE messages SET body = jsonb_set(body, '{content}', '\"edited\"') "
                 "WHERE root_id = :root AND position = 0"),
            {"root": claim.root_id},
        )
    with pytest.raises(RebuildSourceChanged, match="content changed"):
        admit(ctx, claim, build.build_id, cand)
    assert counts(ctx)["consumptions"] == 0


def test_a_candidate_that_would_split_a_published_response_is_refused(ctx: Any) -> None:
    claim = held_run(ctx)
    build = reserve(ctx, claim)
    cand = candidate(ctx, claim)
    split = RebuildCandidate(**{**cand.__dict__, "split": True})
    with pytest.raises(RebuildSourceChanged, match="split"):
        admit(ctx, claim, build.build_id, split)
    assert counts(ctx)["consumptions"] == 0


def test_a_stale_fence_cannot_reserve_or_admit(ctx: Any) -> None:
    claim = held_run(ctx)
    build = reserve(ctx, claim)
    cand = candidate(ctx, claim)
    with ctx.engine.begin() as conn:  # another worker takes the run over
        conn.execute(
            text("UPDATE runs SET claim_fence = claim_fence + 1 WHERE id = :id"), {"id": claim.run_id}
        )
    with pytest.raises(FenceLost):
        admit(ctx, claim, build.build_id, cand)
    with pytest.raises(FenceLost):
        reserve(ctx, claim)
    assert counts(ctx) == {"builds": 1, "consumptions": 0, "rebuilds": 0}


def test_the_driver_authorization_is_rechecked_inside_the_admission(ctx: Any) -> None:
    claim = held_run(ctx)
    build = reserve(ctx, claim)

    def refuse(fence: int) -> None:
        raise PermissionError(f"not authorized under fence {fence}")

    with pytest.raises(PermissionError):
        admit(ctx, claim, build.build_id, candidate(ctx, claim), authorize=refuse)
    assert counts(ctx)["consumptions"] == 0


def test_a_chain_allows_two_rebuilds_bound_in_order_and_no_third(ctx: Any) -> None:
    claim = held_run(ctx)
    first = reserve(ctx, claim)
    assert (first.ordinal, first.predecessor_build_id) == (1, None)
    with pytest.raises(RebuildPredecessorMismatch):
        reserve(ctx, claim, predecessor=first.build_id)  # ordinal 1 is not consumed yet
    admit(ctx, claim, first.build_id, candidate(ctx, claim, ordinal=1))
    with pytest.raises(RebuildPredecessorMismatch):
        reserve(ctx, claim)  # a second rebuild must bind the consumed first one
    with pytest.raises(RebuildPredecessorMismatch):
        reserve(ctx, claim, predecessor=UUID(int=7))
    second = reserve(ctx, claim, predecessor=first.build_id)
    assert (second.ordinal, second.predecessor_build_id) == (2, first.build_id)
    admit(ctx, claim, second.build_id, candidate(ctx, claim, ordinal=2))
    with pytest.raises(RebuildExhausted):
        reserve(ctx, claim, predecessor=first.build_id)
    assert counts(ctx) == {"builds": 2, "consumptions": 2, "rebuilds": 2}


def test_the_database_itself_holds_the_limit_even_without_the_root_lock(ctx: Any) -> None:
    claim = held_run(ctx)
    build = reserve(ctx, claim)
    insert = text(
        "INSERT INTO runtime_work_model_rebuilds (id, root_id, chain_anchor, ordinal, predecessor_build_id, run_id, "
        "boundary_seq, claim_fence) VALUES (gen_random_uuid(), :root, :anchor, :ordinal, :pred, :run, 0, 1)"
    )
    params = {"root": claim.root_id, "anchor": anchor(ctx, claim), "run": claim.run_id}
    for ordinal, pred in ((1, None), (3, build.build_id), (2, None)):
        with pytest.raises(IntegrityError), ctx.engine.begin() as conn:
            conn.execute(insert, {**params, "ordinal": ordinal, "pred": pred})
    with pytest.raises(IntegrityError), ctx.engine.begin() as conn:  # consumptions: one per build
        for _ in range(2):
            conn.execute(
                text("INSERT INTO runtime_work_model_rebuild_consumptions (build_id, run_id, boundary_seq, "
                     "claim_fence, source_digest) VALUES (:b, :r, 0, 1, 'd')"),
                {"b": build.build_id, "r": claim.run_id},
            )
    with pytest.raises(DBAPIError, match="immutable"), ctx.engine.begin() as conn:
        conn.execute(
            text("INSERT INTO runtime_work_model_rebuild_consumptions (build_id, run_id, boundary_seq, claim_fence, "
                 "source_digest) VALUES (:b, :r, 0, 1, 'd')"),
            {"b": build.build_id, "r": claim.run_id},
        )
        conn.execute(text("UPDATE runtime_work_model_rebuild_consumptions SET source_digest = 'forged'"))


def test_many_concurrent_reservations_and_admissions_never_exceed_the_chain_limit(ctx: Any) -> None:
    claim = held_run(ctx)
    errors: list[str] = []
    barrier = threading.Barrier(8)

    def contend() -> None:
        barrier.wait()
        for _ in range(3):
            consumed = rows(
                ctx.engine,
                "SELECT b.id FROM runtime_work_model_rebuilds b JOIN runtime_work_model_rebuild_consumptions c "
                "ON c.build_id = b.id WHERE b.ordinal = 1",
            )
            try:
                build = reserve(ctx, claim, predecessor=consumed[0]["id"] if consumed else None)
                admit(ctx, claim, build.build_id, candidate(ctx, claim, ordinal=build.ordinal))
            except (RebuildExhausted, RebuildPredecessorMismatch, RebuildSourceChanged) as exc:
                errors.append(type(exc).__name__)
            except DBAPIError as exc:  # the unique constraint refusing a second consumption
                if sqlstate_of(exc) not in {"23505", *RETRYABLE_SQLSTATES}:
                    raise
                errors.append(sqlstate_of(exc) or "")

    threads = [threading.Thread(target=contend) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    builds = rows(ctx.engine, "SELECT ordinal FROM runtime_work_model_rebuilds ORDER BY ordinal")
    assert [b["ordinal"] for b in builds] in ([1], [1, 2])
    per_build = rows(
        ctx.engine, "SELECT build_id, count(*) AS n FROM runtime_work_model_rebuild_consumptions GROUP BY build_id"
    )
    assert all(r["n"] == 1 for r in per_build)
    assert len(per_build) <= 2
    assert counts(ctx)["rebuilds"] == len(per_build)
    assert errors, "contention must have refused someone"
