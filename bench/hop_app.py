"""A bare Celery task hop, with the same delivery settings as the real worker, to put
the per-round cost next to what Celery alone costs on this machine."""

from __future__ import annotations

import time

import redis

from worker.app import create_app
from worker.settings import get_settings

HOP_QUEUE = "aidawork.bench"
app = create_app()


@app.task(name="bench.hop")  # type: ignore[misc]
def hop(remaining: int, key: str) -> None:
    if remaining > 0:
        hop.apply_async((remaining - 1, key), queue=HOP_QUEUE)
    else:
        redis.Redis.from_url(get_settings().broker_url).set(key, time.time())
