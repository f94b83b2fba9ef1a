"""What one claimed round reports: its metrics always (prometheus counters are cheap),
its spans only when tracing is on. ``worker.engine.round`` builds a ``RoundObservation`` right
after the claim and feeds it from the hooks the core calls (``LedgerHooks``); the core
never sees it.

A model call is a duplicate when an earlier claim of the same round already called the
model at that boundary (the claim counts them: ``Claim.earlier_model_calls``): the call
was paid for twice, as the model-call ledger shows (``tests/e2e/test_kill_spend.py``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer, set_span_in_context
from opentelemetry.util.types import AttributeValue
from prometheus_client import CollectorRegistry

from runtime.config import OpenAIModelConfig
from runtime.deps import Runtime
from runtime.errors import ModelError
from runtime.models.base import ModelResponse
from runtime.outcomes import ToolInvocation
from schema.wire.claim import Claim
from schema.wire.vocab import ToolDomain
from worker.ops.observability.metrics import LabelValues, RoundMetrics
from worker.ops.observability.tracing import Tracing, run_context
from worker.ops.settings import Settings

GIVEN_BACK = "given_back"  # the round raised or its dependency was unavailable: the claim was released
RUN_FAILED = "run_failed"  # the run failed at the claim, without a round (poison, invalid config)
UNKNOWN_TOOL = "unknown"  # the label of a tool the model named that is not enabled: never its name
# gen_ai.tool.type: a tool run on the caller's side is a "function" (the agent only writes
# its arguments); one the worker runs, itself or through a plugin or MCP server, is an
# "extension" of the agent.
TOOL_TYPES = {ToolDomain.LOCAL: "function", ToolDomain.DESKTOP: "function",
              ToolDomain.SDK: "extension", ToolDomain.PLUGIN: "extension"}
_DEFAULT_PORTS = {"https": 443, "http": 80}


def _s(from_ns: int, to_ns: int) -> float:
    return max(0, to_ns - from_ns) / 1e9


def _number(value: object) -> int | float | None:
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def request_attributes(config: object) -> dict[str, AttributeValue]:
    """The GenAI request attributes of a model config, those it sets only (a plugin's
    config may have none of them)."""
    found: dict[str, AttributeValue] = {}
    base_url = getattr(config, "base_url", None)
    if isinstance(base_url, str):
        try:
            url = urlsplit(base_url)
            port = url.port or _DEFAULT_PORTS.get(url.scheme)
        except ValueError:  # a port out of range: the call fails on its own
            url, port = None, None
        if url is not None and url.hostname:
            found["server.address"] = url.hostname
        if port:
            found["server.port"] = port
    max_tokens: int | float | None
    if isinstance(config, OpenAIModelConfig):
        limit = config.output_limit()
        max_tokens = limit[1] if limit else None
    else:
        max_tokens = _number(getattr(config, "max_tokens", None))
    for key, value in (("gen_ai.request.max_tokens", max_tokens),
                       ("gen_ai.request.temperature", _number(getattr(config, "temperature", None))),
                       ("gen_ai.request.top_p", _number(getattr(config, "top_p", None)))):
        if value is not None:
            found[key] = value
    return found


@dataclass(frozen=True)
class Observability:
    """A process's metrics and tracing (``worker.engine.bootstrap`` builds the worker's)."""

    metrics: RoundMetrics
    tracing: Tracing

    @classmethod
    def off(cls) -> Observability:
        """Counting into a registry nobody serves, tracing off (tests, tools)."""
        return cls(RoundMetrics(CollectorRegistry()), Tracing(None))

    @classmethod
    def for_process(cls, settings: Settings, runtime: Runtime, tracing: Tracing) -> Observability:
        """A worker's: labels bounded by what its settings and runtime configure."""
        labels = LabelValues.of(runtime.base.model_providers, settings.metrics_model_names, runtime.base.tools.names())
        return cls(RoundMetrics(CollectorRegistry(), labels), tracing)

    def claim_refused(self, reason: str) -> None:
        self.metrics.claims_refused.labels(reason).inc()

    def claimed(self, claim: Claim, started_ns: int, *, resume: bool) -> RoundObservation:
        """The claim statement began at ``started_ns`` (``time.time_ns()``) and just returned."""
        if not resume and claim.queue_lag_s is not None:
            # A resume waited for an answer, not for a worker: only rounds count as lag.
            self.metrics.queue_lag.observe(max(0.0, claim.queue_lag_s))
        return RoundObservation(self, claim, started_ns, time.time_ns())


class RoundObservation:
    """One claimed round's metrics and spans, from its claim to its end."""

    def __init__(self, obs: Observability, claim: Claim, started_ns: int, claimed_ns: int) -> None:
        self._metrics = obs.metrics
        self._claim = claim
        self._metrics.phase["claim"].observe(_s(started_ns, claimed_ns))
        self._labels = ("unknown", "unknown")
        self._model_name = "unknown"  # as the run names it: span attributes only, never a label
        self._request: dict[str, AttributeValue] = {}
        self._model_ns = 0
        self._tools_s = 0.0
        self._commit_ns = 0
        self._tracer = obs.tracing.tracer
        self._round: Span | None = None
        self._ctx: Context | None = None
        self._model: Span | None = None
        if self._tracer is not None:
            self._start_round(self._tracer, started_ns, claimed_ns)

    def _start_round(self, tracer: Tracer, started_ns: int, claimed_ns: int) -> None:
        c = self._claim
        attributes: dict[str, AttributeValue] = {
            "run_id": str(c.run_id), "boundary_seq": c.boundary_seq, "claim_fence": c.fence, "attempt": c.attempt
        }
        # A round invokes the agent once (GenAI's invoke_agent, unnamed: runs have no agent
        # name); CONSUMER all the same, as it takes the task its submit span sent.
        self._round = tracer.start_span(
            "invoke_agent", context=run_context(c.trace_context), kind=SpanKind.CONSUMER, start_time=started_ns,
            attributes={**attributes, "gen_ai.operation.name": "invoke_agent", "gen_ai.conversation.id": str(c.run_id)},
        )
        self._ctx = set_span_in_context(self._round)
        tracer.start_span("aidawork.claim", context=self._ctx, start_time=started_ns,
                          attributes=attributes).end(end_time=claimed_ns)

    def using_model(self, provider: str, model: str, config: object = None) -> None:
        self._labels = self._metrics.labels.model(provider, model)
        self._model_name = model
        if self._round is not None:
            self._request = request_attributes(config)
            self._round.set_attributes({"gen_ai.provider.name": provider, "gen_ai.request.model": model})

    # --- the hooks' reports --------------------------------------------------------------

    def model_call_started(self) -> None:
        self._model_ns = time.time_ns()
        duplicate = self._claim.earlier_model_calls > 0
        if duplicate:
            self._metrics.duplicate_model_calls.inc()
        if self._tracer is not None:
            # The name takes the model's label (bounded); the attribute, the run's own name.
            provider, model = self._labels
            self._model = self._tracer.start_span(
                f"chat {model}", context=self._ctx, kind=SpanKind.CLIENT, start_time=self._model_ns,
                attributes={"gen_ai.operation.name": "chat", "gen_ai.request.model": self._model_name,
                            "gen_ai.provider.name": provider, **self._request,
                            "attempt": self._claim.attempt, "claim_fence": self._claim.fence,
                            "aidawork.duplicate": duplicate},
            )

    def model_call_finished(self, response: ModelResponse | None, error: ModelError | None) -> None:
        provider, model = self._labels
        m, ended_ns = self._metrics, time.time_ns()
        m.phase["model"].observe(_s(self._model_ns, ended_ns))
        m.model_calls.labels(provider, model, "failed" if error else "succeeded").inc()
        if response is not None:
            m.model_tokens.labels(provider, model, "input").inc(response.usage.input_tokens)
            m.model_tokens.labels(provider, model, "output").inc(response.usage.output_tokens)
        span, self._model = self._model, None
        if span is not None:
            if response is not None:
                span.set_attribute("gen_ai.usage.input_tokens", response.usage.input_tokens)
                span.set_attribute("gen_ai.usage.output_tokens", response.usage.output_tokens)
                if response.finish_reason:
                    span.set_attribute("gen_ai.response.finish_reasons", [response.finish_reason])
                if response.response_id:
                    span.set_attribute("gen_ai.response.id", response.response_id)
                if response.response_model:
                    span.set_attribute("gen_ai.response.model", response.response_model)
            if error is not None:
                span.set_attribute("error.type", error.code)
                span.set_status(Status(StatusCode.ERROR, error.code))
            span.end(end_time=ended_ns)

    def model_response_reused(self) -> None:
        if self._round is not None:
            self._round.add_event("model_response_reused")

    def tool_call_done(self, invocation: ToolInvocation, started_ns: int) -> None:
        ended_ns = time.time_ns()
        self._tools_s += _s(started_ns, ended_ns)
        domain = UNKNOWN_TOOL if invocation.domain is None else str(invocation.domain)
        name = UNKNOWN_TOOL if invocation.domain is None else invocation.call.name
        label = UNKNOWN_TOOL if invocation.domain is None else self._metrics.labels.tool(name)
        self._metrics.tool_calls.labels(label, domain, str(invocation.status)).inc()
        if self._tracer is not None:
            attributes: dict[str, AttributeValue] = {
                "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name,
                "gen_ai.tool.call.id": invocation.call.id,
                "aidawork.tool.domain": domain, "aidawork.tool.status": str(invocation.status),
            }
            if invocation.domain is not None:
                attributes["gen_ai.tool.type"] = TOOL_TYPES.get(invocation.domain, "extension")
            span = self._tracer.start_span(f"execute_tool {label}", context=self._ctx, kind=SpanKind.INTERNAL,
                                           start_time=started_ns, attributes=attributes)
            span.end(end_time=ended_ns)

    # --- the round's end ------------------------------------------------------------------

    def commit_started(self) -> None:
        self._commit_ns = time.time_ns()
        if self._tools_s:
            self._metrics.phase["tools"].observe(self._tools_s)

    def committed(self, outcome: str) -> None:
        ended_ns = time.time_ns()
        self._metrics.phase["commit"].observe(_s(self._commit_ns, ended_ns))
        if self._tracer is not None:
            self._tracer.start_span("aidawork.commit", context=self._ctx, start_time=self._commit_ns).end(
                end_time=ended_ns
            )
        self.ended(outcome)

    def ended(self, outcome: str, *, lease_lost: bool = False, error: str | None = None) -> None:
        self._metrics.rounds.labels(outcome).inc()
        if lease_lost:
            self._metrics.lease_lost.inc()
        if self._model is not None:  # the call raised past its hook: end its span all the same
            self._model.end()
            self._model = None
        span, self._round = self._round, None
        if span is not None:
            span.set_attribute("outcome", outcome)
            if error is not None:
                span.set_status(Status(StatusCode.ERROR, error))
            span.end()
