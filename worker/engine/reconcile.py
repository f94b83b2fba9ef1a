"""The periodic repair (run inside ``aidawork beat`` every AIDAWORK_RECONCILE_INTERVAL_S): re-send
the round task of every run that should be executing but has no live task - its lease
expired (a crashed or paused worker) or its last message was never claimed (lost in the
broker, or the sender died between commit and send). A run whose suspended round has
all its inputs gets its resume re-sent instead. A run parked for its owner's token budget
whose window rolled over (or whose budget now takes its next call) is queued and sent its
round again; a dead holder's open budget reservation is released (``schema.store.budgets``).

A broker that may have lost messages is noticed on the next pass, from the epoch key this
module keeps in the broker's Redis: its value is the identity of the Redis server that
holds it (INFO's ``run_id``, new at every start, and ``master_replid``, new when a replica
is promoted). The key gone (Redis restarted without persistence, flushed) or naming
another server (restarted from its snapshot, or Sentinel promoted a replica, which had the
key by replication but maybe not the last messages written to the old master, nor the
messages workers had taken: a worker drops those when its connection breaks) both mean
the same: that pass re-sends every ready run at once instead of after the dispatch grace
(a duplicate of a message that did survive is dropped at its claim).

Each pass also recounts an owner's running-runs counter (its concurrency cap) that has
drifted from its running runs (``schema.store.limits``), and forgets the registry rows of
workers silent for a day (``schema.store.workers``).

The passes run in the beat process itself, on its timer, not as Celery tasks: a tick is
no task message, so Flower's task list shows rounds only, and a pass never waits for a
free worker thread. A pass that fails (database or broker unreachable) is logged and the
next one runs on time: beat outlives the outage it exists to repair. Run one beat per
deployment; a second one would only send duplicates, which their claims drop.

Between passes, every AIDAWORK_WORKER_HEARTBEAT_S, beat looks for dead workers (silent past
AIDAWORK_WORKER_DEAD_AFTER_S, ``schema.store.leases.take_over_dead_holders``) and sends the
rounds they held to other workers at once, instead of a lease later. Silence is only
evidence while the database could hear it: after beat starts, or after a statement of its
own failed (the database was down or failing over, and no worker could heartbeat either),
beat trusts it again only once it has reached the database for AIDAWORK_WORKER_DEAD_AFTER_S
itself. Were it wrong all the same, the fence keeps a worker that was only slow harmless:
its commit is refused, and the cost is a redone round."""

from __future__ import annotations

import threading
import time
from functools import cache, partial

import redis
import structlog

from schema.store.budgets import release_dead_reservations, wake_budget_waits
from schema.store.leases import due_for_dispatch, take_over_dead_holders
from schema.store.limits import repair_running_counters
from schema.store.suspensions import suspended_with_all_inputs
from schema.store.workers import forget_old_workers
from worker.client.context import ClientContext, send_woken
from worker.ops.celery_app import send_due, send_or_defer
from worker.ops.redis_clients import RedisTarget, redis_target, sync_client

log = structlog.get_logger("aidawork.reconcile")
BROKER_EPOCH_KEY = "aidawork:broker-epoch"
EPOCH_TIMEOUT_S = 2.0


@cache
def _broker(where: RedisTarget) -> redis.Redis:
    # Timeouts: a pass must not hang on a master that died without closing its sockets.
    return sync_client(where, socket_timeout=EPOCH_TIMEOUT_S, socket_connect_timeout=EPOCH_TIMEOUT_S)


def broker_identity(client: redis.Redis) -> str:
    """Which Redis server this is, and since when: its process (``run_id``) and its
    replication history as a master (``master_replid``, new at a promotion)."""
    try:
        server, replication = client.info("server"), client.info("replication")
    except redis.ResponseError:  # INFO refused (an ACL): only an emptied broker is noticed
        return "unknown"
    return f"{server.get('run_id', '')}:{replication.get('master_replid', '')}"


def broker_reset(where: RedisTarget) -> str | None:
    """Why the broker may have lost messages since the last pass (``empty``: the epoch key
    is gone; ``changed``: another server, or the same one restarted or promoted, holds it),
    or None. Written in one SET ... GET, so two beats see one change once between them."""
    client = _broker(where)
    identity = broker_identity(client)
    was = client.set(BROKER_EPOCH_KEY, identity, get=True)
    if was is None:
        return "empty"
    return None if was == identity.encode() else "changed"


def reconcile(ctx: ClientContext) -> int:
    """One pass; how many runs were due for a re-send."""
    grace_s = ctx.settings.dispatch_grace_s
    target = redis_target(ctx.settings)
    cause = broker_reset(target) if target is not None else None
    if cause is not None:
        log.warning("broker_reset_detected", cause=cause,
                    detail="queued messages may be lost: every ready run is re-sent now")
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


class DeadWorkerWatch:
    """Whether beat may take a worker's silence for its death now: only once its own
    statements have reached the database for ``dead_after_s`` without a failure."""

    def __init__(self, dead_after_s: float) -> None:
        self.dead_after_s = dead_after_s
        self._reached_since: float | None = None

    def limit_s(self) -> float | None:
        """The silence that means death now; None while it means nothing yet."""
        since = self._reached_since
        if since is None or time.monotonic() - since < self.dead_after_s:
            return None
        return self.dead_after_s

    def reached(self) -> None:
        if self._reached_since is None:
            self._reached_since = time.monotonic()

    def failed(self) -> None:
        self._reached_since = None


def take_over_dead_workers(ctx: ClientContext, watch: DeadWorkerWatch) -> int:
    """Send the rounds of dead workers to the others; how many runs were sent."""
    try:
        found = take_over_dead_holders(ctx.engine, dead_after_s=watch.limit_s(), lease_s=ctx.settings.lease_s)
    except Exception:
        watch.failed()
        raise
    watch.reached()
    for worker_id in found.newly_dead:
        log.warning("worker_found_dead", worker_id=str(worker_id), dead_after_s=watch.dead_after_s)
    for due, holder in found.sent:
        send_due(ctx.store, ctx.dispatch, due)
        log.info(
            "run_redispatched", run_id=str(due.run_id), boundary_seq=due.boundary_seq, resume=due.resume,
            cause="dead_holder", holder=str(holder),
        )
    for run_id, holder in found.backing_off:
        log.info("run_lease_expired", run_id=str(run_id), cause="dead_holder", holder=str(holder))
    if found.sent or found.backing_off:
        holders = sorted({str(h) for _, h in found.sent} | {str(h) for _, h in found.backing_off})
        log.warning(
            "dead_worker_runs_redispatched", count=len(found.sent), backing_off=len(found.backing_off),
            worker_ids=holders,
        )
    return len(found.sent)


def _failed(event: str, exc: Exception) -> None:
    # e.g. OperationalError: its text names the server, never the password.
    log.warning(event, error=type(exc).__name__, detail=str(getattr(exc, "orig", exc))[:300])


def reconcile_periodically(ctx: ClientContext, stop: threading.Event) -> int:
    """A pass every ``reconcile_interval_s`` (measured start to start), and a look for dead
    workers every ``worker_heartbeat_s`` (at most as long), until ``stop`` is set; how many
    passes ran."""
    settings = ctx.settings
    tick_s = min(settings.worker_heartbeat_s, settings.reconcile_interval_s)
    watch = DeadWorkerWatch(settings.worker_dead_after_s)
    passes = 0
    next_pass = time.monotonic()
    while not stop.is_set():
        started = time.monotonic()
        try:
            take_over_dead_workers(ctx, watch)
        except Exception as exc:
            _failed("dead_worker_takeover_failed", exc)
        if started >= next_pass:
            next_pass = started + settings.reconcile_interval_s
            try:
                reconcile(ctx)
            except Exception as exc:
                _failed("reconcile_failed", exc)
            passes += 1
        stop.wait(max(0.0, min(started + tick_s, next_pass) - time.monotonic()))
    return passes
