"""Provider rate limits across the fleet, with the real Redis: the bucket's script (take or
tell the wait, shared by every process; a 429 narrows it), then 20 runs on two worker
processes against a loopback OpenAI-compatible provider that refuses (429) every request
beyond N in its window."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import pytest
import redis

from tests.support.cluster import Cluster, events, wait_ready
from tests.support.env import BROKER_URL, WAIT_S
from tests.support.providers import FakeProvider, Recorded, Reply, openai_error, openai_reply
from worker import client
from worker.engine.bootstrap import WorkerContext, build_context
from worker.ops.rate_limit_rules import Bucket, RateLimit, RateLimitRules
from worker.ops.rate_limits import RateLimiter
from worker.ops.settings import Settings

KEY = "sk-canary-rate-XYZ"


def limiter() -> RateLimiter:
    """One process's limiter; two of them are two workers sharing the fleet's buckets."""
    return RateLimiter(redis.Redis.from_url(BROKER_URL), RateLimitRules({}), max_sleep_s=1.0)


def bucket(name: str, **limit: int) -> Bucket:
    return Bucket(name, "*/*", RateLimit(**limit), 0)


def test_the_bucket_takes_or_tells_the_wait_fleet_wide(redis_clean: None) -> None:
    one, other = limiter(), limiter()
    requests = bucket("openai/default/m", requests_per_minute=60, request_burst=2)  # 1/s, 2 at once
    assert one.take(requests, 0) == 0.0
    assert other.take(requests, 0) == 0.0  # the other worker takes from the same bucket
    # Waits only shrink as Redis's clock moves on, so the upper bounds are exact and the
    # lower ones leave a loaded machine a second between two calls.
    wait_s = one.take(requests, 0)
    assert 0 < wait_s <= 1.0
    assert 0 < other.take(requests, 0) <= wait_s  # nothing was taken by the refused call (else ~2 s)

    tokens = bucket("openai/default/t", tokens_per_minute=600, token_burst=100)  # 10 tokens/s
    assert one.take(tokens, 60) == 0.0
    assert 1.0 < other.take(tokens, 60) <= 2.0  # 40 left: 20 more tokens take 2 s
    big = bucket("openai/default/big", tokens_per_minute=600, token_burst=100)
    assert one.take(big, 1000) == 0.0  # larger than the bucket: goes when it is full, leaving it in debt
    assert 89.0 < one.take(big, 1) <= 90.1  # 900 tokens of debt plus the one asked for, at 10/s


def test_a_429_with_retry_after_narrows_the_bucket_for_every_worker(redis_clean: None) -> None:
    one, other = limiter(), limiter()
    requests = bucket("openai/default/n", requests_per_minute=6000, request_burst=100)
    assert one.take(requests, 0) == 0.0
    assert one.narrow(requests, 5.0) == 5.0
    wait_s = other.take(requests, 0)
    # Nothing until Retry-After has passed, and the bucket starts empty then: one request
    # more at 100/s.
    assert 4.0 < wait_s <= 5.01
    one.narrow(requests, 1.0)  # a shorter Retry-After later never shortens the block
    assert 4.0 < other.take(requests, 0) <= 5.01
    assert one.narrow(bucket("openai/default/x", requests_per_minute=60), None) == 1.0  # no Retry-After: 1 s


# --- 20 runs, two workers, one provider limited to N requests per window ----------------------

N = 6  # requests the provider answers per window; the rest get 429
WINDOW_S = 2.0


class WindowedProvider:
    """Answers at most N requests per fixed window of WINDOW_S, 429 (Retry-After: the rest
    of the window) beyond, and counts what it refused."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.windows: dict[int, int] = {}
        self.refused = 0

    def __call__(self, recorded: Recorded) -> Reply:
        now = time.monotonic()
        window = int(now // WINDOW_S)
        with self.lock:
            self.windows[window] = self.windows.get(window, 0) + 1
            if self.windows[window] > N:
                self.refused += 1
                rest = (window + 1) * WINDOW_S - now
                return openai_error(429, "Rate limit reached", kind="requests", code="rate_limit_exceeded",
                                    headers={"retry-after-ms": str(int(rest * 1000) + 1)})
        return openai_reply("done")


@pytest.fixture
def windowed() -> Iterator[tuple[FakeProvider, WindowedProvider]]:
    provider = WindowedProvider()
    server = FakeProvider(provider)
    yield server, provider
    server.close()


@pytest.fixture
def submitter(
    db_url: str, redis_clean: None, windowed: tuple[FakeProvider, WindowedProvider]
) -> Iterator[WorkerContext]:
    fake, _ = windowed
    context = build_context(Settings(database_url=db_url, broker_url=BROKER_URL, openai_api_key=KEY,
                                     model_base_urls=[f"{fake.url}/v1"]))
    yield context
    context.engine.dispose()


def test_twenty_runs_under_a_fleet_limit_see_no_429_storm_and_all_complete(
    cluster: Cluster, submitter: WorkerContext, windowed: tuple[FakeProvider, WindowedProvider]
) -> None:
    fake, provider = windowed
    # 2 requests/s, one at once: at most 1 + 2 x 2 = 5 grants fall in any two-second span,
    # so a request reaches the provider's window of N = 6 beyond its share only when it
    # arrives more than 0.5 s after its grant (a starved process on a loaded machine).
    env = {
        "AIDAWORK_OPENAI_API_KEY": KEY,
        "AIDAWORK_MODEL_BASE_URLS": json.dumps([f"{fake.url}/v1"]),
        "AIDAWORK_MODEL_RATE_LIMITS": json.dumps({"default/*": {"requests_per_minute": 120, "request_burst": 1}}),
    }
    for name in ("w1", "w2"):
        cluster.start_worker(name, concurrency=4, env=env)
    wait_ready(cluster, "w1", "w2")
    model = {"provider": "openai", "name": "fake-gpt", "base_url": f"{fake.url}/v1"}
    runs = [
        client.submit({"owner": "team-test", "root_id": None, "input": f"Say done ({i}).",
                       "config": {"model": model, "system_prompt": "Answer briefly."}}, ctx=submitter).run_id
        for i in range(20)
    ]
    views = [client.wait(run_id, ctx=submitter, timeout_s=WAIT_S) for run_id in runs]

    assert [v.status for v in views] == ["completed"] * 20
    # Without the limit, eight threads send the 20 calls within a few seconds: ten or more
    # 429s. With it: none, but for a rare late arrival.
    assert provider.refused <= 2, provider.windows
    assert len(fake.requests) == 20 + provider.refused
    waited = [e for w in ("w1", "w2") for e in events(cluster, w) if e["event"] in ("rate_limit_waited",
                                                                                   "round_rate_limited")]
    assert waited  # the limit did hold rounds back: 20 calls cannot go at 2/s without waiting
