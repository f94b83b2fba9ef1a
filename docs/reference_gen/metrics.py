"""Reference of the Prometheus metrics, read from the metric objects themselves: the
worker's families (``worker.ops.observability.metrics.RoundMetrics``) and the API's registry
(``worker.api.observe.install_metrics``), each with its name, type, help and labels."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from unittest import mock

from reference_gen import cell, code, header, table

# What a family of each type is exposed as, besides its name.
SERIES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "gauge": ("",),
    "summary": ("", "_count", "_sum", "_created"),
}


def worker_families() -> Iterator[tuple[str, str, str, tuple[str, ...]]]:
    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics import MetricWrapperBase

    from worker.ops.observability.metrics import RoundMetrics

    metrics = RoundMetrics(CollectorRegistry())
    for value in vars(metrics).values():
        if isinstance(value, MetricWrapperBase):
            # prometheus_client has no public accessor for a metric's label names: the
            # registry's collect() gives name, type and help, but the labels only of the
            # series observed so far (none, here). ``_name``, ``_type``,
            # ``_documentation`` and ``_labelnames`` are what the constructor was given.
            yield str(value._name), str(value._type), str(value._documentation), tuple(value._labelnames)


def api_families() -> Iterator[tuple[str, str, str, tuple[str, ...]]]:
    from fastapi import FastAPI

    from schema.store import telemetry
    from worker.api.observe import install_metrics

    # Everything the API registers, collected as a scrape would, with the database query
    # of ``aidawork_runs`` answered by nothing (no database at build time): each status
    # is still a series (zero), so its labels are seen.
    registry = install_metrics(FastAPI(), lambda: SimpleNamespace(engine=None))  # type: ignore[arg-type,return-value]
    with mock.patch.object(telemetry, "count_runs_by_status", lambda engine: {}):
        families = list(registry.collect())
    for family in families:
        labels: dict[str, None] = {}
        for sample in family.samples:
            labels.update(dict.fromkeys(k for k in sample.labels if k != "le"))
        yield family.name, family.type, family.documentation, tuple(labels)


def _rows(families: Iterator[tuple[str, str, str, tuple[str, ...]]]) -> list[list[str]]:
    rows = []
    for name, kind, documentation, labels in sorted(families):
        series = ", ".join(code(name + suffix) for suffix in SERIES.get(kind, ("",)))
        shown = ", ".join(code(label) for label in labels)
        if kind == "histogram":
            shown = ", ".join(filter(None, [shown, code("le") + " (bucket)"]))
        rows.append([code(name), kind, shown, series, cell(documentation)])
    return rows


HEADERS = ["family", "type", "labels", "series exposed", "meaning"]


def page() -> str:
    import worker.ops.observability.metrics as source

    intro = " ".join((source.__doc__ or "").split("\n\n")[0].split()).replace("``", "`")
    text = header(
        "Metrics",
        "the metric families of `worker.ops.observability.metrics` and `worker.api.observe`",
        intro,
    )
    text += "## Worker\n\nServed by each worker process on `AIDAWORK_METRICS_PORT` (see [settings](settings.md)).\n\n"
    text += table(HEADERS, _rows(worker_families())) + "\n"
    text += "## API\n\nServed by the API on `GET /metrics` (no token: aggregate counts only).\n\n"
    return text + table(HEADERS, _rows(api_families()))


