"""Metrics and traces from real processes: a worker's ``/metrics`` (AIDAWORK_METRICS_PORT)
and the API's, counted against the rows in the database, a duplicate model call included;
and one trace per run over OTLP/HTTP, with spans from the two workers its rounds ran on."""

from __future__ import annotations

import signal
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.support.api import A, ApiServer, free_port
from tests.support.cluster import Cluster, wait_exit, wait_ready
from tests.support.db import rows, wait_suspended, wait_terminal
from tests.support.otlp import OtlpReceiver
from tests.support.requests import PICK_COLOR, scripted_request
from tests.support.wait import wait_until
from worker import client
from worker.engine.failpoints import EXIT_CODE

SCRIPT = [
    {"tool_calls": [{"name": "add", "args": {"a": 2, "b": 3}}]},
    {"content": "done"},
]
ASK = [{"tool_calls": [{"name": "pick_color", "args": {"hint": "warm"}}]}, {"content": "picked"}]


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def total(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return sum(v for (n, ls), v in samples.items() if n == name and labels.items() <= dict(ls).items())


def test_worker_and_api_metrics_match_the_database_a_duplicate_call_included(
    cluster: Cluster, api: ApiServer, ctx: Any
) -> None:
    port_a, port_b = free_port(), free_port()
    # A dies with its first model call on the wire (on the ledger, 'started'): B, taking the
    # round over after A's lease runs out, calls the model again - a duplicate call.
    cluster.start_worker("a", concurrency=1, env={"AIDAWORK_FAILPOINTS": "in_model_call",
                                                  "AIDAWORK_METRICS_PORT": str(port_a)})
    cluster.start_beat()
    first = client.submit(scripted_request(SCRIPT), ctx=ctx).run_id
    assert wait_exit(cluster, "a") == EXIT_CODE
    cluster.start_worker("b", concurrency=2, env={"AIDAWORK_METRICS_PORT": str(port_b)})
    wait_ready(cluster, "b")
    run_ids = [first, *(client.submit(scripted_request(SCRIPT), ctx=ctx).run_id for _ in range(2))]
    for run_id in run_ids:
        assert wait_terminal(ctx.engine, run_id)["status"] == "completed"

    db = rows(ctx.engine, "SELECT (SELECT count(*) FROM rounds) AS rounds, "
              "(SELECT count(*) FROM model_calls WHERE status = 'succeeded') AS calls, "
              "(SELECT count(*) FROM model_calls WHERE status = 'started') AS in_flight, "
              "(SELECT sum(input_tokens) FROM model_calls) AS input, "
              "(SELECT sum(output_tokens) FROM model_calls) AS output")[0]
    assert (db["rounds"], db["calls"], db["in_flight"]) == (6, 6, 1)  # A's call never came back
    # B's counters are read once the last commit is counted (it counts right after commit).
    wait_until(lambda: total(scrape(port_b), "aidawork_rounds_total") == db["rounds"], timeout_s=10,
               interval_s=0.1, what="B to count every committed round")
    got = scrape(port_b)
    assert total(got, "aidawork_rounds_total", outcome="continue") == 3
    assert total(got, "aidawork_rounds_total", outcome="finish") == 3
    assert total(got, "aidawork_model_calls_total", provider="scripted", status="succeeded") == db["calls"]
    assert total(got, "aidawork_model_tokens_total", direction="input") == db["input"]
    assert total(got, "aidawork_model_tokens_total", direction="output") == db["output"]
    assert total(got, "aidawork_duplicate_model_calls_total") == 1
    assert total(got, "aidawork_tool_calls_total", tool="add", status="completed") == 3
    assert total(got, "aidawork_round_duration_seconds_count", phase="commit") == db["rounds"]
    assert total(got, "aidawork_round_queue_lag_seconds_count") == 3  # each run's round 1
    assert not any("run_id" in dict(labels) for _, labels in got)

    statuses = Counter(r["status"] for r in rows(ctx.engine, "SELECT status FROM runs"))
    from_api = scrape(api.port)
    assert {s: total(from_api, "aidawork_runs", status=s) for s in statuses} == dict(statuses)
    assert total(from_api, "aidawork_runs", status="suspended") == 0


def test_one_trace_per_run_with_spans_from_both_workers_over_otlp(
    cluster: Cluster, db_url: str, redis_clean: None, tmp_path: Path, ctx: Any
) -> None:
    receiver = OtlpReceiver()
    otel = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100"}
    api = ApiServer(db_url, tmp_path / "api.log", {**otel, "OTEL_RESOURCE_ATTRIBUTES": "service.instance.id=api"})
    try:
        api.wait_ready()
        # Round 0 runs on A and suspends (a client tool); A stops; B runs the rest.
        cluster.start_worker("a", env={**otel, "OTEL_RESOURCE_ATTRIBUTES": "service.instance.id=a"})
        wait_ready(cluster, "a")
        body = scripted_request(ASK, owner="team-a", tools=[], client_tools=[PICK_COLOR])
        created = api.http.post("/v1/runs", json=body, headers=A)
        assert created.status_code == 201, created.text
        run_id = created.json()["run_id"]
        wait_suspended(ctx.engine, run_id)
        cluster.signal("a", signal.SIGTERM)  # a warm shutdown sends its queued spans
        assert wait_exit(cluster, "a") == 0
        cluster.start_worker("b", env={**otel, "OTEL_RESOURCE_ATTRIBUTES": "service.instance.id=b"})
        wait_ready(cluster, "b")
        answered = api.http.post(f"/v1/runs/{run_id}/tool-results", headers=A,
                                 json={"tool_call_id": "call_0_0", "result": "red"})
        assert answered.status_code == 200, answered.text
        assert wait_terminal(ctx.engine, run_id)["status"] == "completed"
        wait_until(lambda: len([s for s in receiver.named("invoke_agent") if s.attributes["run_id"] == run_id]) == 3,
                   timeout_s=20, interval_s=0.1, what="the run's three round spans (0, its resume, 1)")
        wait_until(lambda: receiver.named("POST /v1/runs/{run_id}/tool-results"), timeout_s=20, interval_s=0.1,
                   what="the answering request's span")
    finally:
        api.stop()
        receiver.close()

    (submit,) = receiver.named("aidawork.submit")
    (request,) = receiver.named("POST /v1/runs")
    assert submit.attributes["run_id"] == run_id and submit.parent_span_id == request.span_id
    trace_id = submit.trace_id
    rounds = receiver.named("invoke_agent")
    assert {s.trace_id for s in rounds} == {trace_id}, "one trace per run"
    assert {s.resource["service.instance.id"] for s in rounds} == {"a", "b"}
    assert all(s.parent_span_id == submit.span_id for s in rounds)
    by_round = sorted((s.attributes["boundary_seq"], s.attributes["claim_fence"], s.resource["service.instance.id"],
                       s.attributes["outcome"]) for s in rounds)
    assert by_round == [(0, 1, "a", "suspend"), (0, 2, "b", "continue"), (1, 3, "b", "finish")]
    run_spans = [s for s in receiver.spans if s.trace_id == trace_id]
    children = Counter(s.name for s in run_spans if s.parent_span_id in {r.span_id for r in rounds})
    assert children == {"aidawork.claim": 3, "aidawork.commit": 3, "chat scripted": 2, "execute_tool other": 2}
    chat = [s for s in run_spans if s.name == "chat scripted"]
    assert all(s.attributes["gen_ai.operation.name"] == "chat" and s.attributes["gen_ai.usage.input_tokens"] > 0
               for s in chat)
    (answer,) = receiver.named("POST /v1/runs/{run_id}/tool-results")
    assert answer.trace_id != trace_id and answer.links == (trace_id,)
