"""Provider rate limits across the fleet (``AIDAWORK_MODEL_RATE_LIMITS``): a token bucket
per (provider, key, model) in the broker's Redis, taken from right before each model call.

- One Lua script takes a request and the call's token estimate at once, or takes nothing
  and tells how long until both would fit (take-or-tell-wait: atomic, so any number of
  workers share one bucket without a race). Time is Redis's own clock (``TIME``), so the
  workers' clocks do not matter. A call larger than the whole token bucket goes when the
  bucket is full and leaves it in debt, so the long-run rate still holds.
- A round told to wait sleeps in its thread while its waits add up to at most
  ``AIDAWORK_MODEL_RATE_LIMIT_MAX_SLEEP_S``; a longer wait gives the round back
  (``RoundRateLimited``: no attempt spent, no ledger row written) and ``worker.engine.tasks``
  re-sends it with a countdown of the wait.
- A 429 that still happens (a limit set higher than the provider's, another client on the
  same key) narrows the bucket for the whole fleet: nothing is granted until its
  ``Retry-After`` has passed, and the bucket starts empty then, refilling at its rate.
- Without the setting there is no limiter at all: no Redis call on the round's path.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from uuid import UUID

import redis
import structlog

from runtime.errors import ModelUnavailable
from runtime.models.limits import CallLimitKey, listening_for_rate_limits
from schema.wire.errors import ErrorCode
from schema.wire.route import Route
from worker.ops.rate_limit_rules import Bucket, RateLimitRules
from worker.ops.redis_clients import redis_target, sync_client
from worker.ops.settings import Settings

log = structlog.get_logger("aidawork.rate_limits")

KEY_PREFIX = "aidawork:rate:"
# A re-sent round's countdown is capped: a countdown message is held unacknowledged, in
# memory, by the worker that got it until its eta (worker.ops.celery_app), and RabbitMQ closes a
# channel that holds one past its consumer timeout (30 min by default).
MAX_COUNTDOWN_S = 300.0
# A 429 without a Retry-After blocks the bucket this long.
DEFAULT_BLOCK_S = 1.0
MAX_BLOCK_S = 3600.0
# Rounds given back together come back spread over up to this share of their wait more,
# so they do not all ask again at the same instant.
COUNTDOWN_JITTER = 0.25
# The bucket's Redis calls: a broker that does not answer within this fails the round's
# turn (retried later) rather than holding its thread.
REDIS_TIMEOUT_S = 2.0

# KEYS[1]: the bucket. ARGV: request rate (/s), request capacity, token rate (/s), token
# capacity, the call's tokens. A capacity of 0: that dimension is not limited. Returns 0
# (taken) or the wait in ms. Nothing is written when nothing is taken: the levels are
# recomputed from the stored time on the next call.
TAKE_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local s = redis.call('HMGET', KEYS[1], 'req', 'tok', 'at')
local rr, rc, tr, tc = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local cost = tonumber(ARGV[5])
local at = tonumber(s[3]) or now
local dt = math.max(0, now - at)
local req = math.min(rc, (tonumber(s[1]) or rc) + dt * rr)
local tok = math.min(tc, (tonumber(s[2]) or tc) + dt * tr)
local wait = math.max(0, at - now)
if rc > 0 and req < 1 then wait = math.max(wait, (1 - req) / rr) end
local need = math.min(cost, tc)
if tc > 0 and tok < need then wait = math.max(wait, (need - tok) / tr) end
if wait > 0 then return math.max(1, math.ceil(wait * 1000)) end
if rc > 0 then req = req - 1 end
if tc > 0 then tok = tok - cost end
redis.call('HSET', KEYS[1], 'req', req, 'tok', tok, 'at', math.max(now, at))
local refill = 0
if rc > 0 then refill = math.max(refill, (rc - req) / rr) end
if tc > 0 then refill = math.max(refill, (tc - tok) / tr) end
redis.call('PEXPIRE', KEYS[1], math.ceil(refill * 1000) + 1000)
return 0
"""

# KEYS[1]: the bucket. ARGV: the block (s), the longest refill (s). The bucket is emptied
# and its refill starts only when the block ends ('at' in the future: the take script
# waits until then); a later 429 can only lengthen the block.
NARROW_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local at = math.max(tonumber(redis.call('HGET', KEYS[1], 'at')) or now, now + tonumber(ARGV[1]))
local tok = math.min(0, tonumber(redis.call('HGET', KEYS[1], 'tok')) or 0)
redis.call('HSET', KEYS[1], 'req', 0, 'tok', tok, 'at', at)
redis.call('PEXPIRE', KEYS[1], math.ceil((at - now + tonumber(ARGV[2])) * 1000) + 1000)
return 0
"""


class RoundRateLimited(ModelUnavailable):
    """The round's model call must wait longer for its rate limit than a thread sleeps:
    the round is given back (costing no attempt) and re-sent after ``countdown_s``."""

    code = ErrorCode.MODEL_RATE_LIMITED

    def __init__(
        self, run_id: UUID, boundary_seq: int, route: Route, bucket: str, wait_s: float, countdown_s: float
    ) -> None:
        super().__init__(f"{bucket}: rate limited for {wait_s:.3g}s; the round is re-sent in {countdown_s:.3g}s")
        self.run_id = run_id
        self.boundary_seq = boundary_seq
        self.route = route  # where the round is re-sent: its owner's share, at its priority
        self.bucket = bucket
        self.wait_s = wait_s
        self.countdown_s = countdown_s


@dataclass(frozen=True)
class Sleep:
    seconds: float


@dataclass(frozen=True)
class GiveBack:
    countdown_s: float


def next_step(wait_s: float, slept_s: float, max_sleep_s: float, jitter: float) -> Sleep | GiveBack | None:
    """What a round told to wait ``wait_s`` does, having slept ``slept_s`` for this call
    already: call now (None), sleep, or give the round back with a countdown (``jitter``
    in [0, 1): which share of the spread it takes). The countdown is never shorter than
    the wait, so a re-sent round does not come back before its turn."""
    if wait_s <= 0:
        return None
    if slept_s + wait_s <= max_sleep_s:
        return Sleep(wait_s)
    capped = min(wait_s, MAX_COUNTDOWN_S)
    return GiveBack(capped * (1 + COUNTDOWN_JITTER * jitter))


class RateLimiter:
    """The fleet's buckets (one Redis client per process, shared by its threads)."""

    def __init__(self, client: redis.Redis, rules: RateLimitRules, max_sleep_s: float) -> None:
        self._redis = client
        self._rules = rules
        self.max_sleep_s = max_sleep_s
        self._take = client.register_script(TAKE_LUA)
        self._narrow = client.register_script(NARROW_LUA)

    def gate_for(self, key: CallLimitKey | None) -> CallGate | None:
        bucket = self._rules.bucket_for(key)
        return None if bucket is None else CallGate(self, bucket)

    def take(self, bucket: Bucket, tokens: int) -> float:
        """Take one request and ``tokens`` from the bucket: 0.0, or the wait (s) until both
        would fit (nothing taken)."""
        limit = bucket.limit
        args: list[float] = [
            (limit.requests_per_minute or 0) / 60,
            limit.request_capacity,
            (limit.tokens_per_minute or 0) / 60,
            limit.token_capacity,
            tokens,
        ]
        waited_ms = int(self._take(keys=[KEY_PREFIX + bucket.name], args=args))
        return waited_ms / 1000

    def narrow(self, bucket: Bucket, retry_after_s: float | None) -> float:
        """A 429 for this bucket: nothing is granted for ``retry_after_s`` (or a second),
        fleet-wide; the block applied (s)."""
        block_s = min(MAX_BLOCK_S, retry_after_s if retry_after_s is not None else DEFAULT_BLOCK_S)
        limit = bucket.limit
        refill_s = max(60 * limit.request_capacity / (limit.requests_per_minute or math.inf),
                       60 * limit.token_capacity / (limit.tokens_per_minute or math.inf))
        self._narrow(keys=[KEY_PREFIX + bucket.name], args=[block_s, refill_s])
        return block_s


class CallGate:
    """One run's model calls and their bucket: waits its turn before a call, and narrows
    the bucket when the provider answers 429."""

    def __init__(self, limiter: RateLimiter, bucket: Bucket) -> None:
        self._limiter = limiter
        self.bucket = bucket

    def wait_turn(self, input_tokens: int, run_id: UUID, boundary_seq: int, route: Route) -> None:
        """Return when the call may go; raise ``RoundRateLimited`` when the wait is long,
        ``ModelUnavailable`` when Redis does not answer."""
        tokens = input_tokens + self.bucket.max_output_tokens  # the call's estimate (runtime.budget)
        slept_s = 0.0
        while True:
            try:
                wait_s = self._limiter.take(self.bucket, tokens)
            except redis.RedisError as exc:
                raise ModelUnavailable(f"rate limits: Redis did not answer ({type(exc).__name__})") from None
            step = next_step(wait_s, slept_s, self._limiter.max_sleep_s, random.random())
            if step is None:
                if slept_s:
                    log.info("rate_limit_waited", bucket=self.bucket.name, slept_s=round(slept_s, 3), tokens=tokens)
                return
            if isinstance(step, GiveBack):
                raise RoundRateLimited(run_id, boundary_seq, route, self.bucket.name, wait_s, step.countdown_s)
            time.sleep(step.seconds)
            slept_s += step.seconds

    def rate_limited(self, retry_after_s: float | None) -> None:
        """The provider answered 429 (called from inside the SDK's call): never raises, so
        the call itself goes on as the SDK decides."""
        try:
            block_s = self._limiter.narrow(self.bucket, retry_after_s)
        except redis.RedisError as exc:
            log.warning("rate_limit_narrow_failed", bucket=self.bucket.name, error=type(exc).__name__)
            return
        log.warning("rate_limit_narrowed", bucket=self.bucket.name, retry_after_s=retry_after_s, block_s=block_s)


@contextmanager
def listening(gate: CallGate | None) -> Iterator[None]:
    """The round's 429s narrow its gate's bucket (nothing when it has no limit)."""
    with listening_for_rate_limits(gate.rate_limited) if gate is not None else nullcontext():
        yield


def limiter_for(settings: Settings) -> RateLimiter | None:
    """The process's limiter, or None without ``AIDAWORK_MODEL_RATE_LIMITS``."""
    rules = RateLimitRules(settings.model_rate_limits)
    if not rules:
        return None
    target = redis_target(settings)
    if target is None:  # the settings refuse rate limits without a Redis broker
        raise ValueError("AIDAWORK_MODEL_RATE_LIMITS needs a Redis broker")
    client = sync_client(target, socket_timeout=REDIS_TIMEOUT_S, socket_connect_timeout=REDIS_TIMEOUT_S)
    return RateLimiter(client, rules, settings.model_rate_limit_max_sleep_s)
