"""Provider rate limits without Redis: the setting's entries and which one a call obeys,
a call's token estimate, Retry-After, the sleep-or-give-back decision, the 429 report
from the real transport (against the loopback provider), and the round shell giving a
round back to wait (no attempt, no ledger row, re-sent later). The Redis bucket itself is
tested in tests/e2e/test_rate_limits.py."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from typing import Any
from uuid import UUID, uuid4

import pytest
from pydantic import SecretStr

import worker.engine.round as round_module
from runtime.budget import UNLIMITED_OUTPUT_ESTIMATE_TOKENS, estimate_call_tokens, max_output_tokens
from runtime.config import AnthropicModelConfig, OpenAIModelConfig, ScriptedModelConfig
from runtime.context import context_chain
from runtime.errors import ModelUnavailable
from runtime.messages import user_message
from runtime.models.base import ModelRequest
from runtime.models.keys import ModelKeys
from runtime.models.limits import (
    CallLimitKey,
    call_limit_key,
    listening_for_rate_limits,
    retry_after_s,
)
from runtime.models.openai_compat import OpenAIProvider
from schema.wire import RoundTask
from schema.wire.retry import RetryPolicy
from schema.wire.route import Route
from tests.support.providers import FakeProvider, openai_error, openai_reply
from tests.support.shell import shell
from worker.engine.round import RoundDisposition
from worker.engine.tasks import OnError, disposition_of
from worker.ops.rate_limit_rules import Bucket, RateLimit, RateLimitRules, parse_rate_limits
from worker.ops.rate_limits import MAX_COUNTDOWN_S, CallGate, GiveBack, RoundRateLimited, Sleep, next_step
from worker.ops.settings import SettingsError, load_settings

# --- the setting -----------------------------------------------------------------------------


def test_entries_parse_with_default_bursts_of_one_seconds_worth() -> None:
    limits = parse_rate_limits(
        {"default/gpt-4o-mini": {"requests_per_minute": 600, "tokens_per_minute": 90_000},
         "team-b/*": {"requests_per_minute": 30, "request_burst": 5}}
    )
    mini, team_b = limits["default/gpt-4o-mini"], limits["team-b/*"]
    assert (mini.request_capacity, mini.token_capacity) == (10, 1500)
    assert (team_b.request_capacity, team_b.token_capacity) == (5, 0)  # tokens not limited
    assert RateLimit(requests_per_minute=1).request_capacity == 1  # never below one request


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ('{"gpt-4o": {"requests_per_minute": 5}}', "entry 'gpt-4o': expected API_KEY_REF/MODEL"),
        ('{"sk-x y/m": {"requests_per_minute": 5}}', "entry 'sk-x y/m': the key part"),
        ('{"default/": {"requests_per_minute": 5}}', "entry 'default/': the model part"),
        ('{"default/m": {}}', "entry 'default/m': give requests_per_minute, tokens_per_minute or both"),
        ('{"default/m": {"requests_per_minute": 0}}', "entry 'default/m': requests_per_minute: Input should be"),
        ('{"default/m": {"rpm": 5}}', "entry 'default/m': rpm: Extra inputs are not permitted"),
        ('{"default/m": {"tokens_per_minute": 5, "request_burst": 2}}', "request_burst needs requests_per_minute"),
        ('["default/m"]', "expected a JSON object"),
        ('{"default/m": ', "not valid JSON"),
    ],
)
def test_a_bad_entry_is_refused_naming_the_variable_and_the_entry(
    monkeypatch: pytest.MonkeyPatch, value: str, says: str
) -> None:
    monkeypatch.setenv("AIDAWORK_MODEL_RATE_LIMITS", value)
    with pytest.raises(SettingsError) as info:
        load_settings()
    assert "AIDAWORK_MODEL_RATE_LIMITS" in str(info.value) and says in str(info.value)


def test_limits_need_a_redis_broker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIDAWORK_MODEL_RATE_LIMITS", json.dumps({"*/*": {"requests_per_minute": 5}}))
    monkeypatch.setenv("AIDAWORK_BROKER_URL", "memory://")
    with pytest.raises(SettingsError, match="needs a Redis broker"):
        load_settings()


def key(ref: str | None = "default", model: str = "gpt-4o", provider: str = "openai") -> CallLimitKey:
    return CallLimitKey(provider, ref, model, 100)


def test_the_most_specific_entry_wins_and_each_key_and_model_gets_its_own_bucket() -> None:
    rules = RateLimitRules(parse_rate_limits({
        "default/gpt-4o": {"requests_per_minute": 1},
        "default/*": {"requests_per_minute": 2},
        "*/gpt-4o": {"requests_per_minute": 3},
        "*/*": {"requests_per_minute": 4},
        "-/llama3.1": {"requests_per_minute": 5},
    }))

    def found(k: CallLimitKey) -> tuple[str, str] | None:
        bucket = rules.bucket_for(k)
        return None if bucket is None else (bucket.entry, bucket.name)

    assert found(key()) == ("default/gpt-4o", "openai/default/gpt-4o")
    assert found(key(model="gpt-4.1")) == ("default/*", "openai/default/gpt-4.1")
    assert found(key(ref="team-b")) == ("*/gpt-4o", "openai/team-b/gpt-4o")
    assert found(key(ref="team-b", model="claude", provider="anthropic")) == ("*/*", "anthropic/team-b/claude")
    assert found(key(ref=None, model="llama3.1")) == ("-/llama3.1", "openai/-/llama3.1")
    assert found(key(model="org/model-with/slashes")) == ("default/*", "openai/default/org/model-with/slashes")
    assert rules.bucket_for(None) is None
    only = RateLimitRules(parse_rate_limits({"team-b/*": {"requests_per_minute": 1}}))
    assert only.bucket_for(key()) is None and not RateLimitRules({})


# --- what the core derives ---------------------------------------------------------------------


def test_the_limit_key_comes_from_the_model_config_and_the_scripted_model_has_none() -> None:
    openai = OpenAIModelConfig(provider="openai", name="gpt-4o", max_completion_tokens=256)
    keyless = OpenAIModelConfig(provider="openai", name="llama3.1", base_url="http://127.0.0.1:9/v1", api_key_ref=None)
    claude = AnthropicModelConfig(provider="anthropic", name="claude", api_key_ref="team-b")
    def key(provider: str, config: Any) -> CallLimitKey | None:
        # The output part of the estimate is the budget's reading of the config (one reading).
        return call_limit_key(provider, config, max_output_tokens(config))

    assert key("openai", openai) == CallLimitKey("openai", "default", "gpt-4o", 256)
    assert key("openai", keyless) == CallLimitKey("openai", None, "llama3.1", UNLIMITED_OUTPUT_ESTIMATE_TOKENS)
    assert key("anthropic", claude) == CallLimitKey("anthropic", "team-b", "claude", 4096)
    assert key("scripted", ScriptedModelConfig(provider="scripted", turns=[{"content": "5"}])) is None


def request(text: str, tools: tuple[dict[str, Any], ...] = ()) -> ModelRequest:
    messages = (user_message(text),)
    return ModelRequest(system="You add.", messages=messages, tools=tools, messages_digest=context_chain(messages),
                        round_index=0, timeout_s=5.0)


def test_a_calls_estimate_is_its_input_by_size_plus_the_output_limit() -> None:
    short, long = estimate_call_tokens(request("hi"), 0), estimate_call_tokens(request("x" * 4000), 0)
    assert 0 < short < 20 and 990 <= long - short <= 1010  # 4000 characters: about 1000 tokens
    assert estimate_call_tokens(request("hi"), 500) == short + 500
    tool = {"name": "add", "description": "d" * 400, "parameters": {}}
    assert estimate_call_tokens(request("hi", (tool,)), 0) > short + 100


def test_retry_after_reads_milliseconds_seconds_and_http_dates() -> None:
    assert retry_after_s({"retry-after-ms": "250", "retry-after": "9"}) == 0.25
    assert retry_after_s({"retry-after": "2"}) == 2.0
    assert retry_after_s({"retry-after": "Wed, 21 Oct 2015 07:28:30 GMT"}, now=1445412500.0) == 10.0
    assert retry_after_s({"retry-after": "soon"}) is None
    assert retry_after_s({"retry-after": "-1"}) is None
    assert retry_after_s({}) is None and retry_after_s(None) is None


# --- sleep or give back --------------------------------------------------------------------------


def test_a_short_wait_sleeps_and_a_long_one_gives_the_round_back_no_sooner_than_its_turn() -> None:
    assert next_step(0.0, 0.0, 1.0, 0.5) is None
    assert next_step(0.4, 0.0, 1.0, 0.5) == Sleep(0.4)
    assert next_step(0.4, 0.5, 1.0, 0.5) == Sleep(0.4)  # 0.9 s in all: still a sleep
    assert next_step(0.4, 0.7, 1.0, 0.0) == GiveBack(0.4)  # the sleeps would add up past the cap
    assert next_step(5.0, 0.0, 1.0, 0.0) == GiveBack(5.0)
    jittered = next_step(5.0, 0.0, 1.0, 0.99)
    assert isinstance(jittered, GiveBack) and 5.0 < jittered.countdown_s < 6.25
    assert next_step(0.3, 0.0, 0.0, 0.0) == GiveBack(0.3)  # max sleep 0: every wait gives back
    assert next_step(10_000.0, 0.0, 1.0, 0.0) == GiveBack(MAX_COUNTDOWN_S)  # capped


def test_a_rate_limited_round_is_re_sent_with_a_countdown_not_retried() -> None:
    exc = RoundRateLimited(uuid4(), 3, Route("team-a", 1, 5), "openai/default/gpt-4o", 4.0, 4.5)
    assert disposition_of(exc) is OnError.WAIT
    assert exc.retryable and exc.code == "MODEL_RATE_LIMITED"
    assert round_module.round_at_fault(exc) is False  # giving it back costs no attempt


# --- the transport reports 429s ------------------------------------------------------------------


@pytest.fixture
def fake() -> Iterator[FakeProvider]:
    server = FakeProvider()
    yield server
    server.close()


def openai_client(base_url: str, timeout_policy: RetryPolicy) -> Any:
    keys = ModelKeys(openai=SecretStr("sk-test-openai-key"), base_urls=(base_url,))
    cfg = OpenAIModelConfig(provider="openai", name="gpt-test", base_url=base_url)
    return OpenAIProvider(keys, retry=timeout_policy)(cfg, "team-a")


def test_every_429_is_reported_with_its_retry_after_whether_the_sdk_retries_it_or_not(fake: FakeProvider) -> None:
    seen: list[float | None] = []
    model = openai_client(f"{fake.url}/v1", RetryPolicy(max_attempts=3, base_s=0.01, cap_s=0.05))
    fake.script(openai_error(429, "slow down", headers={"retry-after-ms": "50"}), openai_error(429, "again"),
                openai_reply("done"))
    with listening_for_rate_limits(seen.append):
        assert model.complete(request("hi")).content == "done"
    assert seen == [0.05, None]

    seen.clear()
    fake.script(openai_error(429, "slow down", headers={"retry-after": "30"}))  # beyond the call's budget
    with listening_for_rate_limits(seen.append), pytest.raises(ModelUnavailable):
        model.complete(request("hi"))
    assert seen == [30.0]

    fake.script(openai_error(429, "nobody listens"), openai_reply("fine"))
    assert model.complete(request("hi")).content == "fine"  # no listener: nothing to report to


# --- the round shell -------------------------------------------------------------------------------


class ScriptedBuckets:
    """Stands for the Redis limiter: answers each take with the next scripted wait."""

    def __init__(self, waits: list[float], max_sleep_s: float = 0.05) -> None:
        self.waits = waits
        self.max_sleep_s = max_sleep_s
        self.taken: list[int] = []

    def take(self, bucket: Bucket, tokens: int) -> float:
        self.taken.append(tokens)
        return self.waits.pop(0) if self.waits else 0.0

    def gate_for(self, key: CallLimitKey | None) -> CallGate:
        bucket = Bucket("scripted/default/m", "*/*", RateLimit(requests_per_minute=60), 0)
        return CallGate(self, bucket)  # type: ignore[arg-type]


def limited_shell(buckets: ScriptedBuckets) -> Any:
    s = shell()
    return dataclasses.replace(s, ctx=dataclasses.replace(s.ctx, rate_limits=buckets))


def execute(s: Any, run_id: UUID) -> RoundDisposition:
    return round_module.execute_round(s.ctx, RoundTask(run_id=run_id, boundary_seq=0))


def test_a_short_wait_sleeps_under_the_claim_then_calls() -> None:
    buckets = ScriptedBuckets([0.01, 0.01, 0.0])
    s = limited_shell(buckets)
    run_id = s.submit([{"content": "5"}])
    assert execute(s, run_id) is RoundDisposition.COMMITTED
    assert len(buckets.taken) == 3 and len(s.store.model_calls) == 1


def test_a_long_wait_gives_the_round_back_before_its_ledger_row_costing_no_attempt() -> None:
    buckets = ScriptedBuckets([0.04, 30.0])  # a sleep, then a wait past the cap
    s = limited_shell(buckets)
    run_id = s.submit([{"content": "5"}])
    with pytest.raises(RoundRateLimited) as info:
        execute(s, run_id)
    assert (info.value.run_id, info.value.boundary_seq) == (run_id, 0) and info.value.countdown_s >= 30.0
    run = s.store.run(run_id)
    assert s.store.model_calls == []  # no call was made, none is on the ledger
    assert (run.lease_expires_at, run.execution_fence) == (None, None)  # given back, no attempt spent
    assert run.dispatched_at >= s.store._now() + 29  # the reconciler waits for the countdown
    assert execute(s, run_id) is RoundDisposition.COMMITTED  # its turn: the next claim calls
    assert [c["attempt"] for c in s.store.model_calls] == [1]
