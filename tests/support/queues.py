"""The round queues as a test reads them in Redis: every ``aidawork.rounds.<i>`` queue at
every priority step (kombu keeps one list per step, ``worker.ops.celery_app``)."""

from __future__ import annotations

import redis

from worker.ops.celery_app import ROUNDS_QUEUE


def queued_rounds(broker: redis.Redis) -> int:
    """Messages waiting in all round queues, at all priorities."""
    return sum(int(broker.llen(key)) for key in broker.scan_iter(match=f"{ROUNDS_QUEUE}.*"))
