"""OpenTelemetry traces: one trace per run.

The submitting process (the client library, or the API serving ``POST /v1/runs``) starts
the trace with an ``aidawork.submit`` span and stores its W3C ``traceparent`` with the run
(``runs.trace_context``); every claim hands it back, so each round's ``invoke_agent``
span joins the run's trace from whichever worker runs it. Under a round: ``aidawork.claim``,
``chat <model>`` per model call (GenAI semantic conventions), ``execute_tool <name>`` per
tool call and ``aidawork.commit``; names take the bounded metric labels
(``worker.ops.observability.metrics.LabelValues``), attributes the run's own names.

On only when OTEL_EXPORTER_OTLP_ENDPOINT (or ..._TRACES_ENDPOINT) or OTEL_TRACES_EXPORTER
is set (``Settings.tracing_enabled``); the SDK reads the other OTEL_* variables itself
(service name, headers, sampler, batch delays). Off, ``Tracing.tracer`` is None and no
span, context or attribute dict is ever built.
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Sequence

from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.trace import Link, NonRecordingSpan, Span, SpanKind, Tracer, get_current_span, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from worker.ops.settings import Settings

INSTRUMENTATION = "aidawork"
_PROPAGATOR = TraceContextTextMapPropagator()


class Tracing:
    """A process's tracer, or none (tracing off)."""

    def __init__(self, tracer: Tracer | None) -> None:
        self.tracer = tracer

    def start_submit(self) -> Span | None:
        """The run's first span, child of the current one if any (an API request)."""
        if self.tracer is None:
            return None
        return self.tracer.start_span("aidawork.submit", kind=SpanKind.PRODUCER)

    def link_to(self, trace_context: str | None) -> None:
        """Link the current span (an API request on a run) to the run's trace."""
        if self.tracer is None or not trace_context:
            return
        current, parent = get_current_span(), run_context(trace_context)
        if current.is_recording() and parent is not None:
            current.add_link(get_current_span(parent).get_span_context())


def traceparent(span: Span | None) -> str | None:
    """The W3C traceparent of ``span``, as stored with the run."""
    if span is None:
        return None
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=set_span_in_context(span))
    return carrier.get("traceparent")


def run_context(trace_context: str | None) -> Context | None:
    """The context a run's spans are children of; None when the run was not traced."""
    if not trace_context:
        return None
    ctx = _PROPAGATOR.extract({"traceparent": trace_context})
    span = get_current_span(ctx)
    return ctx if isinstance(span, NonRecordingSpan) and span.get_span_context().is_valid else None


def links_to(trace_context: str | None) -> Sequence[Link]:
    ctx = run_context(trace_context)
    return () if ctx is None else (Link(get_current_span(ctx).get_span_context()),)


def exporter_for(settings: Settings) -> SpanExporter:
    if (settings.otel_traces_exporter or "otlp").strip().lower() == "console":
        return ConsoleSpanExporter()
    # Imported only when used: the exporter pulls in requests and protobuf.
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()  # endpoint, headers, timeout: the OTEL_EXPORTER_OTLP_* variables


_lock = threading.Lock()
_process: Tracing | None = None


def process_tracing(settings: Settings, service_name: str = "aidawork") -> Tracing:
    """This process's tracing, set up on first use (one provider, flushed at exit)."""
    global _process
    if _process is not None:  # every submit asks: no lock once it is built
        return _process
    with _lock:
        if _process is None:
            _process = Tracing(_provider(settings, service_name) if settings.tracing_enabled else None)
        return _process


def _provider(settings: Settings, service_name: str) -> Tracer:
    # OTEL_RESOURCE_ATTRIBUTES are read by the SDK; OTEL_SERVICE_NAME wins over the default.
    provider = TracerProvider(resource=Resource.create({"service.name": settings.otel_service_name or service_name}))
    provider.add_span_processor(BatchSpanProcessor(exporter_for(settings)))
    atexit.register(provider.shutdown)  # a worker's warm shutdown sends what is queued
    return provider.get_tracer(INSTRUMENTATION)
