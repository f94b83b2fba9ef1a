"""Spend budgets without services: the call's token estimate, the window arithmetic, and
the worker shell on the in-memory store refusing a call the owner's budget cannot take
(``fail`` ends the run before the call, ``wait`` parks it with nothing of the round stored)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from uuid import UUID

import pytest

import worker.engine.round as round_module
from runtime.budget import (
    OWNER_BUDGET_EXCEEDED,
    SCRIPTED_OUTPUT_ESTIMATE_TOKENS,
    UNLIMITED_OUTPUT_ESTIMATE_TOKENS,
    estimate_call_tokens,
    estimate_input_tokens,
    max_output_tokens,
)
from runtime.config import AnthropicModelConfig, OpenAIModelConfig, ScriptedModelConfig
from runtime.messages import user_message
from runtime.models.base import ModelRequest
from runtime.models.scripted import ScriptedModel
from schema.store.budgets import BUDGET_WINDOWS_S, window_start
from schema.wire import RoundTask
from tests.support.shell import Shell, shell
from worker.engine.round import RoundDisposition

OWNER = "team-test"  # scripted_request's default owner


def request(
    text: str = "hello there", system: str = "be brief", tools: tuple[dict[str, object], ...] = ()
) -> ModelRequest:
    return ModelRequest(system=system, messages=(user_message(text),), tools=tools, messages_digest="d", round_index=0)


def test_the_input_estimate_counts_messages_system_prompt_and_tool_specs() -> None:
    bare = request()
    assert estimate_input_tokens(bare) == user_message("hello there").token_count + (len("be brief") + 3) // 4
    with_tools = request(tools=({"name": "add", "description": "adds two numbers", "parameters": {}},))
    assert estimate_input_tokens(with_tools) > estimate_input_tokens(bare)


def test_the_scripted_models_real_input_never_exceeds_the_estimate() -> None:
    config = ScriptedModelConfig(provider="scripted", turns=[{"content": "ok"}])
    req = request("x" * 997, system="y" * 101, tools=({"name": "t", "parameters": {}},))
    usage = ScriptedModel(config).complete(req).usage
    estimate = estimate_call_tokens(req, max_output_tokens(config))
    assert usage.input_tokens <= estimate_input_tokens(req)
    assert usage.input_tokens + usage.output_tokens <= estimate


def test_the_output_part_is_the_configs_limit_or_a_documented_default() -> None:
    assert max_output_tokens(ScriptedModelConfig(provider="scripted", turns=[{"content": "ok"}])) == (
        SCRIPTED_OUTPUT_ESTIMATE_TOKENS
    )
    assert max_output_tokens(OpenAIModelConfig(provider="openai", name="m", max_completion_tokens=900)) == 900
    assert max_output_tokens(OpenAIModelConfig(provider="openai", name="m", max_tokens=300)) == 300
    assert max_output_tokens(OpenAIModelConfig(provider="openai", name="m")) == UNLIMITED_OUTPUT_ESTIMATE_TOKENS
    assert max_output_tokens(AnthropicModelConfig(provider="anthropic", name="m", max_tokens=2000)) == 2000
    assert estimate_call_tokens(request(), 900) == estimate_input_tokens(request()) + 900


@pytest.mark.parametrize("window", sorted(BUDGET_WINDOWS_S))
def test_windows_are_fixed_and_aligned_to_the_epoch(window: str) -> None:
    seconds = BUDGET_WINDOWS_S[window]
    at = datetime(2026, 12, 1, 18, 41, 7, tzinfo=UTC)
    start = window_start(window, at)
    assert start <= at < start + timedelta(seconds=seconds)
    assert int(start.timestamp()) % seconds == 0
    assert window_start(window, start) == start  # a window includes its first instant
    assert window_start(window, start - timedelta(microseconds=1)) == start - timedelta(seconds=seconds)
    assert window_start(window, start + timedelta(seconds=seconds)) == start + timedelta(seconds=seconds)


def test_hour_and_day_windows_start_on_the_hour_and_at_midnight_utc() -> None:
    at = datetime(2026, 12, 1, 18, 41, 7, tzinfo=UTC)
    assert window_start("1h", at) == datetime(2026, 12, 1, 18, tzinfo=UTC)
    assert window_start("1d", at) == datetime(2026, 12, 1, tzinfo=UTC)


def execute(s: Shell, run_id: UUID) -> RoundDisposition:
    return round_module.execute_round(s.ctx, RoundTask(run_id=run_id, boundary_seq=0))


def test_fail_ends_the_run_before_the_call_with_no_ledger_row() -> None:
    s = shell()
    s.store.set_budget(OWNER, token_budget=10, on_budget="fail")
    run_id = s.submit([{"content": "done"}])
    assert execute(s, run_id) is RoundDisposition.COMMITTED
    run = s.store.run(run_id)
    assert (run.status, run.error_code) == ("failed", OWNER_BUDGET_EXCEEDED)
    assert "token budget of 10" in (run.error_message or "")
    assert s.store.model_calls == []
    assert s.store.budgets[OWNER]["reserved"] == 0 and s.store.budgets[OWNER]["used"] == 0


def test_wait_parks_the_run_storing_nothing_of_the_round() -> None:
    s = shell()
    s.store.set_budget(OWNER, token_budget=10, on_budget="wait")
    run_id = s.submit([{"content": "done"}])
    assert execute(s, run_id) is RoundDisposition.PARKED
    run = s.store.run(run_id)
    assert (run.status, run.boundary_seq, run.lease_expires_at, run.execution_fence) == ("suspended", 0, None, None)
    assert run.budget_wait is not None and run.budget_wait["token_budget"] == 10
    assert run.budget_wait["estimate"] > 10
    assert s.store.model_calls == [] and s.store.rounds == {} and s.store.messages == []
    assert s.dispatch.sent == []
    assert s.store.events[-1]["kind"] == "run_suspended"


def test_a_call_within_the_budget_reserves_then_settles_its_real_usage() -> None:
    s = shell()
    s.store.set_budget(OWNER, token_budget=100_000, on_budget="fail")
    run_id = s.submit([{"content": "done"}])
    assert execute(s, run_id) is RoundDisposition.COMMITTED
    (call,) = s.store.model_calls
    spend = s.store.budgets[OWNER]
    assert call["reserved_tokens"] > call["input_tokens"] + call["output_tokens"]
    assert (spend["reserved"], spend["used"]) == (0, call["input_tokens"] + call["output_tokens"])
    assert call["reservation_open"] is False


@pytest.mark.parametrize(("on_budget", "ending"), [("fail", "run_failed"), ("wait", "parked")])
def test_a_rebuilds_summary_call_the_budget_refuses_ends_or_parks_the_round(on_budget: str, ending: str) -> None:
    s = shell()
    reports = [{"tool_calls": [{"name": "echo", "args": {"report": f"region {i}: " + "figures and notes " * 6}}]}
               for i in range(5)]
    run_id = s.submit([*reports, {"content": "done"}], tools=["echo"])
    s.store.runs[run_id].config["model"]["context_limit_tokens"] = 330
    s.store.runs[run_id].config["policy"]["context_summarizer"] = "model"
    real_finished = s.store.record_model_call_finished

    def finished(*args: object, **kwargs: object) -> None:
        real_finished(*args, **kwargs)  # type: ignore[arg-type]
        if kwargs.get("error_code") == "MODEL_INPUT_REJECTED":  # the next call is the rebuild's summary
            s.store.set_budget(OWNER, token_budget=1, on_budget=on_budget)

    s.store.record_model_call_finished = finished  # type: ignore[method-assign]
    endings = [execute(s, run_id).value, *s.deliver_sent()]
    assert endings[-1] == ending
    run = s.store.run(run_id)
    if on_budget == "fail":
        assert (run.status, run.error_code) == ("failed", OWNER_BUDGET_EXCEEDED)
    else:
        assert run.status == "suspended" and run.budget_wait is not None
        # Woken (as schema.store.budgets does it) with a budget that suffices: the round
        # starts over, rebuild included, and the run completes.
        s.store.set_budget(OWNER, token_budget=10**9, on_budget=on_budget)
        s.store.record_model_call_finished = real_finished  # type: ignore[method-assign]
        parked = s.store.runs[run_id]
        parked.status, parked.budget_wait = "queued", None
        round_module.execute_round(s.ctx, RoundTask(run_id=run_id, boundary_seq=parked.boundary_seq))
        s.deliver_sent()
        assert (s.store.run(run_id).status, s.store.run(run_id).output) == ("completed", "done")
