"""Two bare Celery task hops, to put the per-round cost next to what Celery alone costs
on this machine, in the same run:

- ``plain_app``: the cheapest delivery we would accept: acks_late (+ reject on worker
  lost), prefetch 1, JSON, no task events and no sent events;
- ``aidawork_app``: ``worker.ops.celery_app.create_app(settings)``'s configuration unchanged (task
  events off until a monitor enables them, no sent events, no ack emulation in Redis), run
  without ``--task-events`` as ``aidawork worker`` runs.

A hop is a task that sends the next one the way a round does (``app.send_task`` after
its work is done); the last one stores its wall-clock time in Redis under ``key``.
Start a worker with ``celery -A bench.hop_app:plain_app`` (or ``:aidawork_app``).
"""

from __future__ import annotations

import time
from typing import Any

import redis
from celery import Celery

from worker.ops.celery_app import create_app
from worker.ops.settings import get_settings

PLAIN_QUEUE = "aidawork.bench.plain"
# kombu's ack emulation with a long visibility timeout, as acks_late on Redis is usually run.
VISIBILITY_TIMEOUT_S = 3600
AIDAWORK_QUEUE = "aidawork.bench.aidawork"


def create_plain_app() -> Celery:
    app = Celery("bench_plain", set_as_current=False)
    app.conf.update(
        broker_url=get_settings().broker_url,
        broker_connection_retry_on_startup=True,
        broker_transport_options={"visibility_timeout": VISIBILITY_TIMEOUT_S},
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        worker_send_task_events=False,
        task_send_sent_event=False,
        task_serializer="json",
        accept_content=["json"],
        task_ignore_result=True,
        result_backend=None,
        worker_hijack_root_logger=False,
        worker_redirect_stdouts=False,
    )
    return app


def _register_hop(app: Celery, name: str, queue: str) -> Any:
    # Not shared: a shared task (Celery's default) is registered with every app by its
    # name, and one app's hop would run, and send on, as the other's.
    @app.task(name=name, ignore_result=True, shared=False)  # type: ignore[misc]
    def hop(remaining: int, key: str) -> None:
        if remaining > 0:
            app.send_task(name, args=[remaining - 1, key], queue=queue)
        else:
            redis.Redis.from_url(app.conf.broker_url).set(key, time.time())

    return hop


plain_app = create_plain_app()
aidawork_app = create_app(get_settings())
HOPS = {
    "plain": (plain_app, "bench.hop_plain", PLAIN_QUEUE),
    "aidawork": (aidawork_app, "bench.hop_aidawork", AIDAWORK_QUEUE),
}
for _app, _name, _queue in HOPS.values():
    _register_hop(_app, _name, _queue)


def send_hops(kind: str, hops: int, key: str) -> None:
    app, name, queue = HOPS[kind]
    app.send_task(name, args=[hops, key], queue=queue)
