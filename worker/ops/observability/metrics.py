"""The Prometheus metric families. Label values are bounded: outcomes, phases, statuses,
tool domains and refusal reasons are fixed sets in the code; providers, models and tools
are what the deployment configures (``LabelValues``), anything else is ``other``. A run's
model name and its client tools' names come from whoever submits it: were they labels,
one tenant could add series without end, and Prometheus keeps every series it has seen.
No run id is ever a label.

A worker process counts into one registry shared by its threads and serves it on
AIDAWORK_METRICS_PORT (``serve``); the API serves its own registry on ``/metrics``,
where ``aidawork_runs{status}`` is read from the database on scrape (cached briefly, so
several scrapers cost one query per ``RUNS_CACHE_S``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from schema.wire import RunStatus

PHASES = ("claim", "model", "tools", "commit")
# A round's phases run from milliseconds (a claim) to minutes (a slow model or tool).
DURATION_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
# Queue lag: from a round's commit to the next claim; seconds at worst when healthy,
# a lease length and more after a crash.
LAG_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
RUNS_CACHE_S = 5.0
OTHER = "other"  # the label of a value the deployment did not configure


@dataclass(frozen=True)
class LabelValues:
    """What the deployment configures, the only values its labels take (one frozenset
    lookup each, on the hot path): the providers registered (built-in and plugins'),
    the models of AIDAWORK_METRICS_MODELS, the tools registered at start (built-in,
    plugins', MCP servers'). A client tool is never one: prepare refuses a client tool
    named like a registered one."""

    providers: frozenset[str] = frozenset()
    models: frozenset[str] = frozenset()
    tools: frozenset[str] = frozenset()

    @classmethod
    def of(cls, providers: Iterable[str], models: Iterable[str], tools: Iterable[str]) -> LabelValues:
        return cls(frozenset(providers), frozenset(models), frozenset(tools))

    def model(self, provider: str, model: str) -> tuple[str, str]:
        """The (provider, model) labels. A provider without model names (the scripted
        one) reports its own name as the model: as bounded as the provider."""
        if provider not in self.providers:
            return OTHER, OTHER
        return provider, model if model in self.models or model == provider else OTHER

    def tool(self, name: str) -> str:
        return name if name in self.tools else OTHER


class RoundMetrics:
    """The worker's families, in ``registry``. Counters are children bound once where the
    label set is fixed, so the hot path does no label lookup for them."""

    def __init__(self, registry: CollectorRegistry, labels: LabelValues | None = None) -> None:
        self.registry = registry
        self.labels = labels or LabelValues()
        self.rounds = Counter(
            "aidawork_rounds", "Rounds that ended, by outcome (continue, suspend, finish, fail, "
            "run_failed: the run failed without a round, given_back: the claim was released)",
            ["outcome"], registry=registry,
        )
        self.round_duration = Histogram(
            "aidawork_round_duration_seconds", "Time a round spent in each phase (claim, model, tools, commit)",
            ["phase"], registry=registry, buckets=DURATION_BUCKETS_S,
        )
        self.phase = {p: self.round_duration.labels(p) for p in PHASES}
        self.model_calls = Counter(
            "aidawork_model_calls", "Model calls made (status: succeeded, failed)",
            ["provider", "model", "status"], registry=registry,
        )
        self.model_tokens = Counter(
            "aidawork_model_tokens", "Tokens the provider reported (direction: input, output)",
            ["provider", "model", "direction"], registry=registry,
        )
        self.duplicate_model_calls = Counter(
            "aidawork_duplicate_model_calls",
            "Model calls at a boundary where an earlier claim had already called the model (duplicate spend)",
            registry=registry,
        )
        self.claims_refused = Counter(
            "aidawork_claims_refused", "Claims that matched no run, by reason", ["reason"], registry=registry
        )
        self.lease_lost = Counter(
            "aidawork_lease_lost", "Rounds that lost their claim (fence) before they could commit", registry=registry
        )
        self.tool_calls = Counter(
            "aidawork_tool_calls", "Tool calls that ended, by tool, domain and status",
            ["tool", "domain", "status"], registry=registry,
        )
        self.queue_lag = Histogram(
            "aidawork_round_queue_lag_seconds", "From the commit of a round to the claim of the next",
            registry=registry, buckets=LAG_BUCKETS_S,
        )


def serve(registry: CollectorRegistry, port: int, host: str) -> None:
    """Serve ``registry`` on http://host:port/metrics from a daemon thread."""
    start_http_server(port, addr=host, registry=registry)


class RunsCollector(Collector):
    """``aidawork_runs{status}``: runs in each status, from the database. ``count`` is
    the store's query (``schema.store``); it runs at most once per ``cache_s``, on scrape."""

    def __init__(self, count: Callable[[], Mapping[str, int]], cache_s: float = RUNS_CACHE_S) -> None:
        self._count = count
        self._cache_s = cache_s
        self._lock = threading.Lock()
        self._read_at = float("-inf")
        self._counts: Mapping[str, int] = {}

    def collect(self) -> Iterable[GaugeMetricFamily]:
        with self._lock:
            if time.monotonic() - self._read_at >= self._cache_s:
                self._counts = self._count()
                self._read_at = time.monotonic()
            counts = self._counts
        family = GaugeMetricFamily("aidawork_runs", "Runs in each status (from the database)", labels=["status"])
        for status in RunStatus:  # every status, zeros included, so a series never vanishes
            family.add_metric([status.value], counts.get(status.value, 0))
        yield family
