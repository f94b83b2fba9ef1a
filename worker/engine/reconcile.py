"""The periodic repair (run inside ``aidawork beat`` every AIDAWORK_RECONCILE_INTERVAL_S): re-send
the round task of every run that should be executing but has no live task - its lease
expired (a crashed or paused worker) or its last message was never claimed (lost in the
broker, or the sender died between commit and send). A run whose suspended round has
all its inputs gets its resume re-sent instead. A run parked for its owner's token budget
whose window rolled over (or whose budget now takes its next call) is queued and sent its
round again; a dead holder's open budget reservation is released (``schema.store.budgets``).

A broker that lost its messages (Redis restarted without persistence, flushed, failed
over to an empty replica) is noticed on the next pass: the epoch key this module keeps in
the broker's Redis is gone. That pass re-sends every ready run at once instead of after
the dispatch grace (a duplicate of a message that did survive is dropped at its claim).

Each pass also recounts an owner's running-runs counter (its concurrency cap) that has
drifted from its running runs (``schema.store.limits``), and forgets the registry rows of
workers silent for a day (``schema.store.workers``).

The passes run in the beat process itself, on its timer, not as Celery tasks: a tick is
no task message, so Flower's task list shows rounds only, and a pass never waits for a
free worker thread. A pass that fails (database or broker unreachable) is logged and the
next one runs on time: beat outlives the outage it exists to repair. Run one beat per
deployment; a second one would only send duplicates, which their claims drop."""

from __future__ import annotations

import threading
import time
from functools import cache, partial
from uuid import uuid4

import redis
import structlog

from schema.store.budgets import release_dead_reservations, wake_budget_waits
from schema.store.leases import due_for_dispatch
from schema.store.limits import repair_running_counters
from schema.store.suspensions import suspended_with_all_inputs
from schema.store.workers import forget_old_workers
from worker.client.context import ClientContext, send_woken
from worker.ops.celery_app import send_due, send_or_defer

log = structlog.get_logger("aidawork.reconcile")
BROKER_EPOCH_KEY = "aidawork:broker-epoch"


@cache
def _broker(url: str) -> redis.Redis:
    return redis.Redis.from_url(url)


def broker_was_reset(broker_url: str) -> bool:
    """True on the first pass since the broker's Redis started empty."""
    return bool(_broker(broker_url).set(BROKER_EPOCH_KEY, uuid4().hex, nx=True))


def reconcile(ctx: ClientContext) -> int:
    """One pass; how many runs were due for a re-send."""
    grace_s = ctx.settings.dispatch_grace_s
    if broker_was_reset(ctx.settings.broker_url):
        log.warning("broker_reset_detected", detail="queued messages may be lost: every ready run is re-sent now")
        grace_s = 0.0
    due = due_for_dispatch(ctx.engine, grace_s=grace_s)
    for one in due:
        send_due(ctx.store, ctx.dispatch, one)
        log.info("run_redispatched", run_id=str(one.run_id), boundary_seq=one.boundary_seq, resume=one.resume)
    for run_id in suspended_with_all_inputs(ctx.engine):
        resumes = ctx.store.resume_if_ready(run_id)
        if resumes:
            send_or_defer(ctx.store, run_id, partial(ctx.dispatch.resume, resumes, ctx.store.route_of(run_id)))
            log.info("run_redispatched", run_id=str(run_id), resume=True)
    _budget_pass(ctx)
    for owner, (was, now) in repair_running_counters(ctx.engine).items():
        log.warning("owner_counter_repaired", owner=owner, running_was=was, running=now)
    forget_old_workers(ctx.engine)
    return len(due)


def _budget_pass(ctx: ClientContext) -> None:
    """Free the reservations of holders that died with a model call in flight, then wake
    the runs parked for their owner's budget that may go on now (the window rolled over,
    or the budget takes their next call): each is sent its round again, from its start."""
    released = release_dead_reservations(ctx.engine)
    if released:
        log.info("budget_reservations_released", calls=released)
    send_woken(ctx, wake_budget_waits(ctx.engine))


def reconcile_periodically(ctx: ClientContext, stop: threading.Event) -> int:
    """A pass every ``reconcile_interval_s`` (measured start to start) until ``stop`` is
    set; how many passes ran."""
    interval_s = ctx.settings.reconcile_interval_s
    passes = 0
    while not stop.is_set():
        started = time.monotonic()
        try:
            reconcile(ctx)
        except Exception as exc:
            # e.g. OperationalError: its text names the server, never the password.
            log.warning("reconcile_failed", error=type(exc).__name__, detail=str(getattr(exc, "orig", exc))[:300])
        passes += 1
        stop.wait(max(0.0, interval_s - (time.monotonic() - started)))
    return passes
