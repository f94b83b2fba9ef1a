"""Retry policy as data, and the one backoff every retry loop of the system uses (a
transaction in ``schema.store.tx``, a provider call in ``runtime.models``, a tool's own
retries in ``runtime.tools``, a webhook delivery in ``worker.ops.webhooks``). Task retries
use Celery's own backoff (``worker.engine.tasks``)."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class RetryPolicy:
    """``max_attempts`` counts the first try; the wait after failed attempt n is drawn
    from the upper half of ``base_s * 2**(n-1)``, capped at ``cap_s``, so that many
    callers failing at once do not come back in step. Where the other side asks for a
    wait (``Retry-After``), a wait longer than ``max_wait_s`` ends the retries at once."""

    max_attempts: int = 4
    base_s: float = 0.5
    cap_s: float = 8.0
    max_wait_s: float = 60.0


def backoff_s(attempt: int, policy: RetryPolicy, rand: Callable[[], float] = random.random) -> float:
    """The wait after failed attempt ``attempt`` (1-based), with jitter."""
    # The exponent stops growing long after the cap is reached: 2.0 ** 1024 overflows.
    ceiling: float = min(policy.cap_s, policy.base_s * 2.0 ** min(max(attempt, 1) - 1, 62))
    return ceiling * (0.5 + rand() / 2)
