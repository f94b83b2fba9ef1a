"""Metric label values come from what the deployment configures, never from a submitter:
a model outside AIDAWORK_METRICS_MODELS, a provider nobody registered and a client tool's
name are all ``other``, so runs with random names add no series (issue 35, points 2, 11).
Read as Prometheus parses the worker's exposition."""

from __future__ import annotations

import secrets

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from schema.wire import RoundTask
from tests.support.observed import observed_shell, submit_openai
from tests.support.shell import Shell
from worker.engine.round import execute_round
from worker.ops.observability.metrics import OTHER
from worker.ops.settings import Settings

Series = set[tuple[str, tuple[tuple[str, str], ...]]]


def run_client_tool(s: Shell, name: str) -> None:
    """A run whose model calls a client tool named ``name`` (a submitter's choice)."""
    turns = [{"tool_calls": [{"name": name, "args": {}}]}, {"content": "done"}]
    run_id = s.submit(turns, tools=["add"], client_tools=[{"name": name}])
    execute_round(s.ctx, RoundTask(run_id=run_id, boundary_seq=0))


def series(s: Shell) -> Series:
    text = generate_latest(s.ctx.observe.metrics.registry).decode()
    return {(x.name, tuple(sorted(x.labels.items()))) for f in text_string_to_metric_families(text) for x in f.samples}


def labels_of(got: Series, name: str) -> list[dict[str, str]]:
    return [dict(labels) for n, labels in got if n == name]


def test_models_providers_and_tools_outside_the_deployments_configuration_are_labelled_other() -> None:
    s = observed_shell(metrics_models="gpt-4o-mini")
    submit_openai(s, {"name": "gpt-4o-mini"})
    submit_openai(s, {"name": "a-name-a-tenant-made-up"})
    s.deliver_sent()
    run_client_tool(s, "pick_colour")
    s.deliver_sent()
    got = series(s)
    calls = {(x["provider"], x["model"]) for x in labels_of(got, "aidawork_model_calls_total")}
    assert calls == {("openai", "gpt-4o-mini"), ("openai", OTHER), ("scripted", "scripted")}
    tools = {(x["tool"], x["domain"]) for x in labels_of(got, "aidawork_tool_calls_total")}
    assert tools == {(OTHER, "local")}  # a client tool: its name is the submitter's
    assert not any("a-name-a-tenant-made-up" in str(labels) or "pick_colour" in str(labels) for _, labels in got)


def test_a_registered_tool_keeps_its_name_as_its_label() -> None:
    s = observed_shell()
    run_id = s.submit([{"tool_calls": [{"name": "add", "args": {"a": 1, "b": 2}}]}, {"content": "3"}])
    execute_round(s.ctx, RoundTask(run_id=run_id, boundary_seq=0))
    s.deliver_sent()
    assert {(x["tool"], x["domain"]) for x in labels_of(series(s), "aidawork_tool_calls_total")} == {("add", "sdk")}


def test_runs_with_random_model_and_client_tool_names_add_no_series() -> None:
    s = observed_shell(metrics_models="gpt-4o-mini")

    def some_runs(n: int) -> None:
        for _ in range(n):
            submit_openai(s, {"name": f"m-{secrets.token_hex(6)}"})
            run_client_tool(s, f"t_{secrets.token_hex(6)}")
        s.deliver_sent(max_tasks=10 * n)

    some_runs(2)
    before = series(s)
    some_runs(40)
    assert series(s) == before


def test_the_metrics_models_setting_is_a_comma_separated_list(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIDAWORK_METRICS_MODELS", " gpt-4o-mini, claude-sonnet-4-5 ,,")
    assert Settings(dev=True).metrics_model_names == frozenset({"gpt-4o-mini", "claude-sonnet-4-5"})
    monkeypatch.delenv("AIDAWORK_METRICS_MODELS")
    assert Settings(dev=True).metrics_model_names == frozenset()
