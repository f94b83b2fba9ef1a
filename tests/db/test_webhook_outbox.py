"""The webhook outbox against a real PostgreSQL: the trigger writes one row per ending or
suspension event of a run with a webhook, in the event's own transaction; claims by
several deliverers never overlap; an attempt's end is fenced by its count."""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any
from uuid import UUID

import pytest
from pydantic import SecretStr
from sqlalchemy import Engine, text

from runtime.prepare import prepare_execution
from schema.store import runs as run_store
from schema.store import webhooks as outbox
from schema.store.runs import Submitted
from schema.store.store import Store
from schema.wire import WEBHOOK_EVENTS, EventKind
from schema.wire.vocab import WebhookStatus
from tests.support.db import rows
from tests.support.requests import scripted_request
from tests.support.store import RUNTIME, claim, record, submit
from worker import client
from worker.ops.webhooks.policy import WebhookRefused

URL = "http://127.0.0.1:9/hook?token=secret-in-query"


def submit_with_webhook(engine: Engine, url: str = URL) -> Submitted:
    request, prepared = prepare_execution(RUNTIME, scripted_request([{"content": "done"}], webhook_url=url))
    return run_store.submit_run(engine, request, prepared.turn_config.model_dump(mode="json"))


def outbox_rows(engine: Engine, run_id: UUID | None = None) -> list[dict[str, Any]]:
    where = "" if run_id is None else "WHERE run_id = :id"
    return rows(engine, f"SELECT * FROM webhook_deliveries {where} ORDER BY id", id=run_id)


def add_event(conn: Any, run_id: UUID, kind: str) -> int:
    seq = conn.execute(
        text("UPDATE runs SET event_seq = event_seq + 1 WHERE id = :id RETURNING event_seq"), {"id": run_id}
    ).scalar_one()
    conn.execute(
        text("INSERT INTO run_events (run_id, seq, kind, data) VALUES (:id, :seq, :kind, '{}')"),
        {"id": run_id, "seq": seq, "kind": kind},
    )
    return int(seq)


def test_one_outbox_row_per_ending_or_suspension_event_of_a_run_with_a_webhook(engine: Engine) -> None:
    hooked, plain = submit_with_webhook(engine), submit(engine)
    with engine.begin() as conn:
        seqs = {kind: add_event(conn, hooked.run_id, kind.value) for kind in EventKind}
        for kind in EventKind:
            add_event(conn, plain.run_id, kind.value)

    assert outbox_rows(engine, plain.run_id) == []
    found = outbox_rows(engine, hooked.run_id)
    assert sorted((r["event_kind"], r["event_seq"]) for r in found) == sorted(
        (k.value, seqs[k]) for k in WEBHOOK_EVENTS
    )
    assert {(r["status"], r["attempts"]) for r in found} == {("pending", 0)}


def test_the_round_commit_and_a_cancel_write_their_outbox_rows(engine: Engine) -> None:
    finished, cancelled = submit_with_webhook(engine), submit_with_webhook(engine)
    c = claim(engine, finished.run_id)
    assert c is not None
    Store(engine).commit_round(record(c))
    assert run_store.cancel_run(engine, cancelled.run_id)[0]

    assert [(r["event_kind"], r["event_seq"]) for r in outbox_rows(engine, finished.run_id)] == [("run_completed", 2)]
    assert [r["event_kind"] for r in outbox_rows(engine, cancelled.run_id)] == ["run_cancelled"]


def test_a_rolled_back_event_leaves_no_outbox_row(engine: Engine) -> None:
    run = submit_with_webhook(engine)
    with pytest.raises(RuntimeError), engine.begin() as conn:
        add_event(conn, run.run_id, "run_failed")
        inside = conn.execute(text("SELECT count(*) FROM webhook_deliveries")).scalar_one()
        assert inside == 1  # written by the event's own transaction ...
        raise RuntimeError("roll back")
    assert outbox_rows(engine) == []  # ... and gone with it


def test_a_row_locked_by_one_deliverer_is_skipped_by_another(engine: Engine) -> None:
    runs = [submit_with_webhook(engine) for _ in range(3)]
    with engine.begin() as conn:
        for run in runs:
            add_event(conn, run.run_id, "run_completed")
    first = outbox_rows(engine)[0]["id"]
    with engine.connect() as holder:
        holder.begin()  # a deliverer in the middle of its claim statement holds this lock
        holder.execute(text("SELECT id FROM webhook_deliveries WHERE id = :id FOR UPDATE"), {"id": first})
        claimed = outbox.claim_due(engine, limit=10, lease_s=30)  # does not wait for the lock
        holder.rollback()
    assert sorted(d.id for d in claimed) == sorted(r["id"] for r in outbox_rows(engine) if r["id"] != first)


def test_deliverers_claiming_at_once_never_take_the_same_row(engine: Engine) -> None:
    runs = [submit_with_webhook(engine) for _ in range(12)]
    with engine.begin() as conn:
        for run in runs:
            add_event(conn, run.run_id, "run_completed")
    barrier, claimed = threading.Barrier(6), []

    def deliverer() -> None:
        barrier.wait()
        claimed.extend(d.id for d in outbox.claim_due(engine, limit=3, lease_s=30))

    threads = [threading.Thread(target=deliverer) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(claimed) == len(set(claimed)) == 12
    assert {r["attempts"] for r in outbox_rows(engine)} == {1}


def test_a_claim_carries_the_event_as_the_stream_serves_it_and_the_url(engine: Engine) -> None:
    run = submit_with_webhook(engine)
    assert run_store.cancel_run(engine, run.run_id)[0]
    (due,) = outbox.claim_due(engine, limit=10, lease_s=30)
    assert due.url == URL and due.attempt == 1
    assert (due.event.run_id, due.event.seq, due.event.kind) == (run.run_id, 2, EventKind.RUN_CANCELLED)
    assert due.event.data == {"error_code": "CANCELLED", "message": "cancelled by request"}
    assert outbox.claim_due(engine, limit=10, lease_s=30) == []  # leased


def test_an_attempt_that_outlived_its_lease_changes_nothing(engine: Engine) -> None:
    run = submit_with_webhook(engine)
    run_store.cancel_run(engine, run.run_id)
    (stale,) = outbox.claim_due(engine, limit=1, lease_s=0.001)
    rows(engine, "SELECT pg_sleep(0.01)")
    (current,) = outbox.claim_due(engine, limit=1, lease_s=30)
    assert current.attempt == 2
    assert not outbox.record_delivered(engine, stale, 200)
    assert outbox.record_attempt_failed(engine, stale, status_code=500, error="HTTP 500", retry_in_s=1,
                                        retry_for_s=60) is None
    assert outbox.record_delivered(engine, current, 204)
    (row,) = outbox_rows(engine)
    assert (row["status"], row["attempts"], row["last_status_code"], row["next_attempt_at"]) == ("delivered", 2, 204,
                                                                                                 None)


def test_a_failed_attempt_is_retried_until_the_window_ends_then_failed(engine: Engine) -> None:
    run = submit_with_webhook(engine)
    run_store.cancel_run(engine, run.run_id)
    (first,) = outbox.claim_due(engine, limit=1, lease_s=30)
    status = outbox.record_attempt_failed(engine, first, status_code=500, error="HTTP 500", retry_in_s=0,
                                          retry_for_s=3600)
    assert status is WebhookStatus.PENDING
    (second,) = outbox.claim_due(engine, limit=1, lease_s=30)  # due again at once
    status = outbox.record_attempt_failed(engine, second, status_code=None, error="ConnectError",
                                          retry_in_s=7200, retry_for_s=3600)
    assert status is WebhookStatus.FAILED
    (view,) = run_store.get_run_view(engine, run.run_id).webhooks
    assert (view.status, view.attempts, view.last_status_code, view.last_error, view.next_attempt_at) == (
        WebhookStatus.FAILED, 2, None, "ConnectError", None)
    assert outbox.claim_due(engine, limit=1, lease_s=30) == []


def test_a_webhook_url_outside_the_prefixes_is_refused_and_nothing_stored(ctx: Any) -> None:
    ctx = replace(ctx, settings=ctx.settings.model_copy(
        update={"webhook_urls": "http://127.0.0.1:9/hook", "webhook_secret": SecretStr("x" * 16)}))
    with pytest.raises(WebhookRefused, match=r"webhook.url: is not under any of the allowed prefixes"):
        client.submit(scripted_request([{"content": "x"}], webhook_url="http://127.0.0.2:9/hook"), ctx=ctx)
    assert rows(ctx.engine, "SELECT count(*) AS n FROM runs")[0]["n"] == 0
    submitted = client.submit(scripted_request([{"content": "x"}], webhook_url=URL), ctx=ctx)
    assert rows(ctx.engine, "SELECT webhook_url FROM runs WHERE id = :id", id=submitted.run_id) == [
        {"webhook_url": URL}]
