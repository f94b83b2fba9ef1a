"""Fair share and priorities through real workers and Redis: one owner's backlog queued
first does not hold another owner's few runs behind it, an owner's urgent runs start
before its less urgent ones, and the reconciler's re-send of a lost message routes like
the first send and reaches a worker. Order properties only, never timing."""

from __future__ import annotations

from uuid import UUID

import redis
from sqlalchemy import text

from runtime.shares import owner_queues, queue_index
from tests.support.cluster import Cluster, events, wait_events
from tests.support.db import rows, wait_terminal
from tests.support.env import BROKER_URL
from tests.support.queues import queued_rounds
from tests.support.requests import scripted_request
from worker import client
from worker.ops.celery_app import round_queue

ONE_ROUND = [{"content": "done"}]


def submit_many(ctx, owner: str, n: int, **kwargs) -> list[UUID]:
    return [client.submit(scripted_request(ONE_ROUND, owner=owner, **kwargs), ctx=ctx).run_id for _ in range(n)]


def finished_order(ctx, column: str = "finished_at") -> list[tuple[str, int]]:
    found = rows(ctx.engine, f"SELECT owner, priority FROM runs ORDER BY {column}")
    return [(r["owner"], r["priority"]) for r in found]


def test_a_backlog_queued_first_does_not_hold_another_owners_runs_behind_it(cluster: Cluster, ctx) -> None:
    queues = ctx.settings.round_queues
    assert set(owner_queues("fair-a", 1, queues)).isdisjoint(owner_queues("fair-b", 1, queues))
    backlog = submit_many(ctx, "fair-a", 60)
    few = submit_many(ctx, "fair-b", 4)  # queued behind all of A's: FIFO would run them last

    cluster.start_worker("w1", concurrency=2)
    for run_id in [*few, backlog[-1]]:
        assert wait_terminal(ctx.engine, run_id)["status"] == "completed"
    order = [owner for owner, _ in finished_order(ctx)]
    # The broker alternates between the two owners' queues: B's runs finish among A's
    # first few, not after A's sixty.
    a_before_last_b = order[: max(i for i, o in enumerate(order) if o == "fair-b")].count("fair-a")
    assert a_before_last_b < 20, order


def test_an_owners_urgent_runs_start_before_its_less_urgent_ones(cluster: Cluster, ctx) -> None:
    low = submit_many(ctx, "prio-owner", 5, priority=1)
    high = submit_many(ctx, "prio-owner", 5, priority=9)  # submitted after, on the same queue
    cluster.start_worker("w1", concurrency=1)
    for run_id in [*low, *high]:
        assert wait_terminal(ctx.engine, run_id)["status"] == "completed"
    assert [p for _, p in finished_order(ctx, "started_at")] == [9] * 5 + [1] * 5


def test_the_reconcilers_resend_of_a_lost_message_routes_as_the_first_and_reaches_a_worker(
    cluster: Cluster, ctx
) -> None:
    with ctx.engine.begin() as conn:
        conn.execute(text("INSERT INTO owners (owner, weight) VALUES ('heavy-owner', 3)"))
    broker = redis.Redis.from_url(BROKER_URL)
    submitted = client.submit(scripted_request(ONE_ROUND, owner="heavy-owner", priority=8), ctx=ctx)
    assert queued_rounds(broker) == 1
    broker.flushdb()  # the message is lost

    cluster.start_worker("w1")
    cluster.start_beat()
    assert wait_terminal(ctx.engine, submitted.run_id)["status"] == "completed"
    (resent,) = events(cluster, "beat", "round_enqueued", next_run_id=submitted.run_id)
    assert resent["queue"] == round_queue(queue_index(submitted.route, submitted.run_id, 0, ctx.settings.round_queues))
    wait_events(cluster, "w1", "round_claimed", count=1, run_id=submitted.run_id)
