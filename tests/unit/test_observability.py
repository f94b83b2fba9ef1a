"""Metrics and spans of the worker shell's rounds (``worker.ops.observability``), on the
in-memory store: the metric families as Prometheus parses them, and the spans as the
SDK's in-memory exporter receives them (names, attributes, parents, one trace per run)."""

from __future__ import annotations

import dataclasses
from typing import Any
from uuid import UUID

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from schema.wire import RoundTask
from tests.support.shell import Shell, shell
from worker.engine.round import RoundDisposition, execute_round
from worker.ops.observability import Observability, Tracing
from worker.ops.observability.metrics import RunsCollector
from worker.ops.observability.tracing import run_context, traceparent
from worker.ops.settings import Settings

ADD = [{"tool_calls": [{"name": "add", "args": {"a": 2, "b": 3}}]}, {"content": "5"}]


@dataclasses.dataclass
class Observed:
    shell: Shell
    registry: CollectorRegistry
    spans: InMemorySpanExporter
    tracing: Tracing


def observed(*, traced: bool = True) -> Observed:
    s, exporter = shell(), InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing = Tracing(provider.get_tracer("test") if traced else None)
    observe = Observability.for_process(s.ctx.settings, s.ctx.runtime, tracing)
    ctx = dataclasses.replace(s.ctx, observe=observe)
    return Observed(dataclasses.replace(s, ctx=ctx), observe.metrics.registry, exporter, tracing)


def samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the registry as Prometheus parses its exposition."""
    found = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def run_to_end(o: Observed, run_id: UUID) -> None:
    assert execute_round(o.shell.ctx, RoundTask(run_id=run_id, boundary_seq=0)) is RoundDisposition.COMMITTED
    o.shell.deliver_sent()
    assert o.shell.store.run(run_id).status == "completed"


def test_a_runs_rounds_are_counted_by_outcome_phase_model_and_tool() -> None:
    o = observed(traced=False)
    run_to_end(o, o.shell.submit(ADD))
    got = samples(o.registry)
    assert got[("aidawork_rounds_total", (("outcome", "continue"),))] == 1
    assert got[("aidawork_rounds_total", (("outcome", "finish"),))] == 1
    calls = ("aidawork_model_calls_total", (("model", "scripted"), ("provider", "scripted"), ("status", "succeeded")))
    assert got[calls] == 2
    tokens = {d: got[("aidawork_model_tokens_total", (("direction", d), ("model", "scripted"),
                                                       ("provider", "scripted")))] for d in ("input", "output")}
    ledger = o.shell.store.model_calls
    assert tokens == {d: sum(c[f"{d}_tokens"] for c in ledger) for d in ("input", "output")}
    assert tokens["input"] > 0
    assert got[("aidawork_tool_calls_total", (("domain", "sdk"), ("status", "completed"), ("tool", "add")))] == 1
    phases = {p: got[("aidawork_round_duration_seconds_count", (("phase", p),))] for p in
              ("claim", "model", "tools", "commit")}
    assert phases == {"claim": 2, "model": 2, "tools": 1, "commit": 2}
    assert got[("aidawork_round_queue_lag_seconds_count", ())] == 1  # round 1 after round 0's commit
    assert got[("aidawork_duplicate_model_calls_total", ())] == 0
    assert not any("run_id" in dict(labels) for _, labels in got)


def test_a_refused_claim_is_counted_by_its_reason() -> None:
    o = observed(traced=False)
    run_id = o.shell.submit(ADD)
    execute_round(o.shell.ctx, RoundTask(run_id=run_id, boundary_seq=0))
    assert execute_round(o.shell.ctx, RoundTask(run_id=run_id, boundary_seq=0)) is RoundDisposition.DROPPED
    got = samples(o.registry)
    assert got[("aidawork_claims_refused_total", (("reason", "run_at_another_boundary"),))] == 1


def test_a_call_after_an_earlier_claims_call_is_a_duplicate_and_its_span_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    o = observed()
    run_id = o.shell.submit(ADD, trace_context=traceparent(o.tracing.start_submit()))
    real_claim = o.shell.store.claim_round

    def claim_after_a_death(*args: Any, **kwargs: Any) -> Any:
        # As the database reports a claim after a holder died in its model call.
        claim = real_claim(*args, **kwargs)
        return None if claim is None else dataclasses.replace(claim, earlier_model_calls=1, attempt=2)

    monkeypatch.setattr(o.shell.store, "claim_round", claim_after_a_death)
    execute_round(o.shell.ctx, RoundTask(run_id=run_id, boundary_seq=0))
    assert samples(o.registry)[("aidawork_duplicate_model_calls_total", ())] == 1
    (chat,) = [s for s in o.spans.get_finished_spans() if s.name == "chat scripted"]
    assert chat.attributes is not None
    assert (chat.attributes["aidawork.duplicate"], chat.attributes["attempt"]) == (True, 2)


def by_name(spans: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


def test_a_runs_rounds_are_spans_of_one_trace_under_its_submit_span() -> None:
    o = observed()
    submit = o.tracing.start_submit()
    assert submit is not None
    run_id = o.shell.submit(ADD, trace_context=traceparent(submit))
    submit.end()
    run_to_end(o, run_id)
    spans = o.spans.get_finished_spans()
    assert {s.context.trace_id for s in spans} == {submit.get_span_context().trace_id}

    rounds = sorted(by_name(spans, "invoke_agent"), key=lambda s: (s.attributes or {})["boundary_seq"])
    assert [dict(r.attributes or {}) for r in rounds] == [
        {"run_id": str(run_id), "boundary_seq": b, "claim_fence": b + 1, "attempt": 1, "outcome": outcome,
         "gen_ai.operation.name": "invoke_agent", "gen_ai.conversation.id": str(run_id),
         "gen_ai.provider.name": "scripted", "gen_ai.request.model": "scripted"}
        for b, outcome in ((0, "continue"), (1, "finish"))
    ]
    assert all(r.parent is not None and r.parent.span_id == submit.get_span_context().span_id for r in rounds)
    children = {r.context.span_id: sorted(s.name for s in spans if s.parent and s.parent.span_id == r.context.span_id)
                for r in rounds}
    assert list(children.values()) == [
        ["aidawork.claim", "aidawork.commit", "chat scripted", "execute_tool add"],
        ["aidawork.claim", "aidawork.commit", "chat scripted"],
    ]
    chat = by_name(spans, "chat scripted")[0].attributes or {}
    ledger = o.shell.store.model_calls[0]
    assert {k: chat[k] for k in ("gen_ai.operation.name", "gen_ai.request.model", "gen_ai.provider.name",
                                 "gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens", "attempt")} == {
        "gen_ai.operation.name": "chat", "gen_ai.request.model": "scripted", "gen_ai.provider.name": "scripted",
        "gen_ai.usage.input_tokens": ledger["input_tokens"], "gen_ai.usage.output_tokens": ledger["output_tokens"],
        "attempt": 1,
    }
    assert chat["aidawork.duplicate"] is False
    tool = by_name(spans, "execute_tool add")[0].attributes or {}
    assert (tool["gen_ai.tool.name"], tool["gen_ai.operation.name"], tool["aidawork.tool.status"]) == (
        "add", "execute_tool", "completed"
    )


def test_with_tracing_off_a_round_builds_no_span() -> None:
    o = observed(traced=False)
    assert o.tracing.start_submit() is None and traceparent(None) is None
    run_to_end(o, o.shell.submit(ADD))
    assert o.spans.get_finished_spans() == ()


def test_an_invalid_traceparent_leaves_the_round_a_root_span() -> None:
    assert run_context("00-zz-not-a-trace") is None
    o = observed()
    run_to_end(o, o.shell.submit(ADD, trace_context="garbage"))
    assert all(s.parent is None for s in by_name(o.spans.get_finished_spans(), "invoke_agent"))


def test_the_runs_gauge_reads_the_database_at_most_once_per_cache_period() -> None:
    reads: list[int] = []

    def count() -> dict[str, int]:
        reads.append(1)
        return {"running": 2, "completed": 5}

    registry = CollectorRegistry()
    registry.register(RunsCollector(count, cache_s=3600))
    first, second = samples(registry), samples(registry)
    assert first == second and len(reads) == 1
    assert first[("aidawork_runs", (("status", "running"),))] == 2
    assert first[("aidawork_runs", (("status", "suspended"),))] == 0  # every status, zeros too


@pytest.mark.parametrize(
    ("env", "enabled"),
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, True),
        ({"OTEL_TRACES_EXPORTER": "console"}, True),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, False),
    ],
)
def test_tracing_is_on_only_when_the_otel_variables_ask_for_it(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], enabled: bool
) -> None:
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_TRACES_EXPORTER"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert Settings(dev=True).tracing_enabled is enabled
