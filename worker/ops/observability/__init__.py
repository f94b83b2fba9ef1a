"""Metrics and traces, set up once per process (``worker.engine.bootstrap`` for a worker,
``worker.api.app`` for the API, ``worker.client`` for a submitting process).

- ``metrics``: the Prometheus families, one registry per process, served on
  AIDAWORK_METRICS_PORT by a worker and on ``/metrics`` by the API (``runs``: the gauge
  from the database, read on scrape).
- ``tracing``: OpenTelemetry traces over OTLP/HTTP when the OTEL_* variables ask for them;
  otherwise every call is a no-op and no span is ever built.
- ``rounds``: what one claimed round reports, fed by ``worker.engine.round`` through the hooks
  the core already calls (the core imports none of this).
"""

from worker.ops.observability.metrics import RoundMetrics
from worker.ops.observability.rounds import Observability, RoundObservation
from worker.ops.observability.tracing import Tracing

__all__ = ["Observability", "RoundMetrics", "RoundObservation", "Tracing"]
