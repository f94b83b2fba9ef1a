"""Retention against a real PostgreSQL: exactly the Roots whose runs all ended before the
cutoff go, with every row they own; nothing a queued, running or suspended run needs;
bounded batches; a dry run changes nothing; a submit racing a prune is safe."""

from __future__ import annotations

import threading
from datetime import datetime
from typing import Any
from uuid import UUID

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError

from schema.store import retention
from schema.store.errors import RootNotFound
from schema.store.runs import Submitted, submit_run_txn
from schema.store.store import Store
from tests.support.db import all_rows_as_text, rows, run_row
from tests.support.retention import (
    age,
    cancelled,
    completed,
    failed,
    fill_every_table,
    finish,
    root_rows,
    running,
    suspended,
    table_rows,
)
from tests.support.store import RUNTIME, submit
from tests.support.wait import wait_until

DAYS = 30


def cutoff(engine: Engine) -> datetime:
    return retention.database_cutoff(engine, DAYS * 86_400)


def prune_all(engine: Engine, *, limit: int = 500) -> list[retention.Batch]:
    """A pass: batches until one scans fewer than ``limit`` runs."""
    at, batches, cursor = cutoff(engine), [], None
    while True:
        batch = retention.prune_batch(engine, cutoff=at, limit=limit, after=cursor)
        batches.append(batch)
        if batch.scanned < limit:
            return batches
        cursor = batch.cursor


def test_prune_deletes_exactly_the_roots_whose_runs_all_ended_before_the_cutoff(engine: Engine) -> None:
    old_completed = completed(engine)
    old_failed = failed(engine)
    old_cancelled = cancelled(engine, root_id=old_failed.root_id)  # a Root of two ended runs
    fresh = completed(engine)
    queued = submit(engine)
    live, live_claim = running(engine)
    waiting = suspended(engine)
    # A Root whose first run ended long ago and whose second is running: it reads the
    # first run's messages, so the Root stays whole.
    shared_first = completed(engine)
    shared_live, shared_claim = running(engine, root_id=shared_first.root_id)
    webhook_first = completed(engine)  # its webhook is still being delivered
    everyone = [old_completed, old_failed, old_cancelled, fresh, queued, live, waiting, shared_first,
                shared_live, webhook_first]
    for run in everyone:
        fill_every_table(engine, run.run_id, webhook="pending" if run is webhook_first else "delivered")
    for run in (old_completed, old_failed, old_cancelled, shared_first, webhook_first):
        age(engine, run.run_id, DAYS + 10)
    age(engine, fresh.run_id, DAYS - 1)
    expired = {old_completed.root_id, old_failed.root_id}
    kept = {run.root_id for run in everyone} - expired
    before = {root: root_rows(engine, root) for root in expired | kept}
    totals = table_rows(engine)
    assert all(n > 0 for n in before[old_completed.root_id].values()), before[old_completed.root_id]

    [batch] = prune_all(engine)

    assert batch.pruned.roots == 2 and batch.pruned.runs == 3
    gone = {t: sum(before[root][t] for root in expired) for t in retention.TABLES}
    assert batch.pruned.rows == {**gone, retention.SPEND_TABLE: 0}  # a batch deletes Roots only
    assert table_rows(engine) == {t: totals[t] - gone[t] for t in retention.TABLES}
    for root in expired:
        assert set(root_rows(engine, root).values()) == {0}
    for root in kept:
        assert root_rows(engine, root) == before[root]
    # The live run of the shared Root still sees the first run's messages, and completes.
    assert [m.position for m in Store(engine).load_messages(shared_first.root_id, 0)][:2] == [0, 1]
    next_position = root_rows(engine, shared_first.root_id)["messages"]
    finish(engine, shared_claim, first_position=next_position)
    assert run_row(engine, shared_live.run_id)["status"] == "completed"
    finish(engine, live_claim, first_position=root_rows(engine, live.root_id)["messages"])
    assert run_row(engine, live.run_id)["status"] == "completed"


def test_a_batch_limit_of_two_takes_several_batches_each_bounded(engine: Engine) -> None:
    # The oldest expired run belongs to a Root that must stay: the cursor moves past it.
    shared_first = completed(engine)
    running(engine, root_id=shared_first.root_id)
    age(engine, shared_first.run_id, DAYS + 20)
    expired = [completed(engine) for _ in range(5)]
    for i, run in enumerate(expired):
        age(engine, run.run_id, DAYS + 10 - i)

    batches = prune_all(engine, limit=2)

    assert [b.pruned.runs for b in batches] == [1, 2, 2, 0]
    assert [b.scanned for b in batches] == [2, 2, 2, 0]
    assert all(b.pruned.roots <= 2 for b in batches)
    left = {r["root_id"] for r in rows(engine, "SELECT root_id FROM runs")}
    assert left == {shared_first.root_id}
    assert prune_all(engine, limit=2)[0].pruned.roots == 0  # a second pass finds nothing


def test_a_dry_run_counts_what_the_prune_then_deletes_and_changes_nothing(engine: Engine, ctx: Any) -> None:
    first = completed(engine)
    second = failed(engine, root_id=first.root_id)
    other = completed(engine)
    submit(engine)  # queued: stays
    for run in (first, second, other):
        fill_every_table(engine, run.run_id)
        age(engine, run.run_id, DAYS + 1)
    snapshot = all_rows_as_text(ctx)

    plan = retention.plan_prune(engine, cutoff=cutoff(engine))

    assert all_rows_as_text(ctx) == snapshot
    assert (plan.roots, plan.runs) == (2, 3)
    [batch] = prune_all(engine)
    assert batch.pruned == plan


def _hold_submit(engine: Engine, root_id: UUID, holding: threading.Event, release: threading.Event,
                 out: dict[str, Any]) -> None:
    """Submit to ``root_id`` in a transaction held open (the Root row locked) until ``release``."""
    from runtime.prepare import prepare_execution
    from tests.support.requests import scripted_request

    request, prepared = prepare_execution(RUNTIME, scripted_request([{"content": "x"}], root_id=str(root_id)))
    with engine.begin() as conn:
        out["submitted"] = submit_run_txn(conn, request, prepared.turn_config.model_dump(mode="json"))
        holding.set()
        release.wait(30)


def test_a_root_locked_by_a_submit_is_skipped_and_then_kept(engine: Engine) -> None:
    run = completed(engine)
    age(engine, run.run_id, DAYS + 1)
    holding, release = threading.Event(), threading.Event()
    out: dict[str, Any] = {}
    thread = threading.Thread(target=_hold_submit, args=(engine, run.root_id, holding, release, out))
    thread.start()
    try:
        assert holding.wait(30)
        [batch] = prune_all(engine)
        assert (batch.scanned, batch.pruned.roots) == (1, 0)
    finally:
        release.set()
        thread.join(30)
    new: Submitted = out["submitted"]
    assert run_row(engine, new.run_id)["status"] == "queued"
    assert prune_all(engine)[0].pruned.roots == 0  # the Root now has a live run
    assert run_row(engine, run.run_id)["status"] == "completed"


def test_a_submit_to_a_root_the_prune_has_locked_fails_with_root_not_found(engine: Engine) -> None:
    run = completed(engine)
    age(engine, run.run_id, DAYS + 1)
    at = cutoff(engine)
    outcome: dict[str, BaseException | Submitted] = {}

    def submit_now() -> None:
        try:
            outcome["result"] = submit(engine, root_id=str(run.root_id))
        except BaseException as exc:
            outcome["result"] = exc

    with engine.connect() as conn, conn.begin():
        batch = retention.prune_batch_txn(conn, cutoff=at, limit=500)
        assert batch.pruned.roots == 1
        thread = threading.Thread(target=submit_now)
        thread.start()
        wait_until(lambda: _waiting_for_a_lock(engine), what="the submit to wait for the Root's lock")
    thread.join(30)
    assert isinstance(outcome["result"], RootNotFound), outcome
    assert rows(engine, "SELECT count(*) AS n FROM runs")[0]["n"] == 0
    assert set(table_rows(engine).values()) == {0}


def _waiting_for_a_lock(engine: Engine) -> bool:
    sql = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
    with engine.connect() as conn:
        return bool(conn.execute(text(sql)).scalar_one())


def test_a_submit_committed_between_the_scan_and_the_lock_keeps_the_root(engine: Engine) -> None:
    run = completed(engine)
    fill_every_table(engine, run.run_id)
    age(engine, run.run_id, DAYS + 1)
    before = root_rows(engine, run.root_id)
    later: list[Submitted] = []

    def submit_later() -> None:
        later.append(submit(engine, root_id=str(run.root_id)))

    batch = retention.prune_batch(engine, cutoff=cutoff(engine), limit=500, after_scan=submit_later)

    assert (batch.scanned, batch.pruned.roots) == (1, 0)
    after = root_rows(engine, run.root_id)
    assert after["runs"] == before["runs"] + 1
    assert {t: n for t, n in after.items() if t not in ("runs", "run_events", "run_checkpoints")} == {
        t: n for t, n in before.items() if t not in ("runs", "run_events", "run_checkpoints")
    }
    assert run_row(engine, later[0].run_id)["status"] == "queued"


def test_a_consumption_of_a_live_run_stays_immutable_even_to_a_prune(engine: Engine) -> None:
    live, _ = running(engine)
    fill_every_table(engine, live.run_id)
    for declare in (False, True):
        with pytest.raises(DBAPIError, match="immutable"), engine.begin() as conn:
            if declare:
                conn.execute(text("SELECT set_config('aidawork.pruning', 'on', true)"))
            conn.execute(text("DELETE FROM runtime_work_model_rebuild_consumptions"))
    ended = completed(engine)
    fill_every_table(engine, ended.run_id)
    with pytest.raises(DBAPIError, match="immutable"), engine.begin() as conn:  # not declared a prune
        conn.execute(text("DELETE FROM runtime_work_model_rebuild_consumptions WHERE run_id = :id"),
                     {"id": ended.run_id})
    with pytest.raises(DBAPIError, match="immutable"), engine.begin() as conn:  # never an UPDATE
        conn.execute(text("SELECT set_config('aidawork.pruning', 'on', true)"))
        conn.execute(text("UPDATE runtime_work_model_rebuild_consumptions SET source_digest = 'x'"))


def test_spend_windows_go_once_the_longest_window_ended_before_the_cutoff(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO owner_spend (owner, window_start, used, reserved) VALUES "
            "('old', now() - make_interval(days => :d + 31), 10, 0), "  # its window ended before the cutoff
            "('held', now() - make_interval(days => :d + 31), 10, 5), "  # a reservation still open in it
            "('recent', now() - make_interval(days => :d + 29), 10, 0)"  # a 30 d window from then is not over
        ), {"d": DAYS})
    at = cutoff(engine)
    plan = retention.plan_prune(engine, cutoff=at)
    assert plan.rows[retention.SPEND_TABLE] == 1 and (plan.roots, plan.runs) == (0, 0)
    assert retention.prune_spend(engine, cutoff=at).rows[retention.SPEND_TABLE] == 1
    assert [r["owner"] for r in rows(engine, "SELECT owner FROM owner_spend ORDER BY owner")] == ["held", "recent"]
