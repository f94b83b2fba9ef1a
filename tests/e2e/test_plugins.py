"""Plugins in real processes: tools of a plugin named in AIDAWORK_PLUGINS and of one found
through its entry point run on two workers; a plugin that cannot load stops ``aidawork
worker`` at start (exit 2, naming it) before any task is consumed; the CLI and the HTTP
API validate a submission against the plugins' tools; a plugin's model provider runs a
run end to end, its call in the ledger."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
import redis

from tests.support.api import JSON_HEADERS, A, ApiServer
from tests.support.cluster import Cluster, events, wait_ready
from tests.support.db import model_calls, round_rows, rows, run_row, wait_terminal
from tests.support.env import BROKER_URL, REPO, WAIT_S
from tests.support.queues import queued_rounds
from tests.support.requests import scripted_request, without_owner
from tests.support.wait import wait_until
from worker import client
from worker.client.context import ClientContext, build_client_context
from worker.ops.settings import Settings

EXTRA = "aidawork_example.extra"  # word_count; not advertised by an entry point
TEST_PLUGINS = REPO / "tests" / "support" / "plugins"  # raising_plugin, clashing_plugin
WITH_EXTRA = {"AIDAWORK_PLUGINS": EXTRA}

SCRIPT = [
    {"tool_calls": [{"name": "word_count", "args": {"text": "the quick brown fox"}}]},
    {"tool_calls": [{"name": "lookup_order", "args": {"order_id": "A-1"}}]},
    {"tool_calls": [{"name": "word_count", "args": {"text": "one two"}},
                    {"name": "lookup_order", "args": {"order_id": "Z-9"}}]},
    {"content": "four words; A-1 shipped"},
]
RESULTS = [
    ("call_0_0", "word_count", {"words": 4}),
    ("call_1_0", "lookup_order", {"order_id": "A-1", "found": True, "status": "shipped", "total_cents": 1250}),
    ("call_2_0", "word_count", {"words": 2}),
    ("call_2_1", "lookup_order", {"order_id": "Z-9", "found": False}),
]


@pytest.fixture
def plugged(db_url: str, redis_clean: None) -> Iterator[ClientContext]:
    """A client context (this test process) that loaded the same plugins as the workers."""
    context = build_client_context(Settings(database_url=db_url, broker_url=BROKER_URL, plugins=EXTRA))
    yield context
    context.engine.dispose()


def test_plugin_tools_run_in_a_multi_round_run_on_two_workers(cluster: Cluster, plugged: ClientContext) -> None:
    # One thread each, so the next round's task goes to the other worker (as in
    # test_round_per_task): both must have loaded both plugins.
    cluster.start_worker("w1", concurrency=1, env=WITH_EXTRA)
    cluster.start_worker("w2", concurrency=1, env=WITH_EXTRA)
    wait_ready(cluster, "w1", "w2")

    submitted = client.submit(scripted_request(SCRIPT, tools=["word_count", "lookup_order"]), ctx=plugged)
    run = wait_terminal(plugged.engine, submitted.run_id)

    assert (run["status"], run["output"], run["error_code"]) == ("completed", "four words; A-1 shipped", None)
    invocations = rows(
        plugged.engine,
        "SELECT tool_call_id, tool_name, tool_domain, status, result FROM tool_invocations "
        "WHERE run_id = :id ORDER BY boundary_seq, tool_call_id",
        id=submitted.run_id,
    )
    assert [(i["tool_call_id"], i["tool_name"], i["result"]) for i in invocations] == RESULTS
    assert {(i["status"], i["tool_domain"]) for i in invocations} == {("completed", "sdk")}
    assert [r["outcome"] for r in round_rows(plugged.engine, submitted.run_id)] == ["continue"] * 3 + ["finish"]

    loaded = ["aidawork_example.extra", "example (aidawork_example)"]
    for name in ("w1", "w2"):
        (line,) = events(cluster, name, "plugins_loaded")
        assert line["plugins"] == loaded
    def logged() -> dict[str, list[dict[str, Any]]]:
        return {name: events(cluster, name, "round_committed", run_id=submitted.run_id) for name in ("w1", "w2")}

    # (A commit's line is written just after the commit the run's status showed.)
    commits = wait_until(lambda: sum(map(len, (c := logged()).values())) >= 4 and c, what="4 commits logged")
    assert sorted(c["boundary_seq"] for found in commits.values() for c in found) == [0, 1, 2, 3]
    assert commits["w1"] and commits["w2"], f"one worker did every round: {commits}"


def _worker(cluster: Cluster, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "worker.cli", "worker", "--concurrency", "1"],
        cwd=REPO, env=cluster.env(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )


def test_a_plugin_that_cannot_load_stops_the_worker_with_exit_2_before_any_task_is_consumed(
    cluster: Cluster, plugged: ClientContext
) -> None:
    queued = client.submit(scripted_request([{"content": "waits"}]), ctx=plugged)
    broker = redis.Redis.from_url(BROKER_URL)
    assert queued_rounds(broker) == 1

    path = f"{TEST_PLUGINS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    bad = {
        "no_such_plugin": ({"AIDAWORK_PLUGINS": "no_such_plugin"},
                           "plugin 'no_such_plugin': cannot be imported: ModuleNotFoundError"),
        "raising_plugin": ({"AIDAWORK_PLUGINS": "raising_plugin", "PYTHONPATH": path},
                           "plugin 'raising_plugin': register() raised RuntimeError: "
                           "the plugin's backend is not configured"),
        "clashing_plugin": ({"AIDAWORK_PLUGINS": f"{EXTRA},clashing_plugin", "PYTHONPATH": path},
                            "plugin 'clashing_plugin': tool 'add' is the name of a built-in tool"),
    }
    procs = {name: _worker(cluster, env) for name, (env, _) in bad.items()}  # at once: each is an interpreter
    for name, proc in procs.items():
        try:
            out, err = proc.communicate(timeout=WAIT_S)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
        lines = err.strip().splitlines()
        assert proc.returncode == 2, f"{name}: exit {proc.returncode}, stderr {err!r}"
        assert len(lines) == 1, f"{name}: {err!r}"
        refused = json.loads(lines[0])  # a worker writes JSON lines only, a refusal too
        assert (refused["event"], refused["level"], refused["command"]) == ("start_refused", "error", "worker")
        assert refused["error"].startswith("PLUGIN_INVALID: "), refused
        assert bad[name][1] in refused["error"], refused
        assert "AIDAWORK_PLUGINS" in refused["error"]
        assert "Traceback" not in out + err

    # Nothing was consumed: the doorbell is still in the queue, the run never claimed.
    assert queued_rounds(broker) == 1
    run = run_row(plugged.engine, queued.run_id)
    assert (run["status"], run["claim_fence"]) == ("queued", 0)
    assert rows(plugged.engine, "SELECT count(*) AS n FROM workers")[0]["n"] == 0


def _cli_submit(body: dict[str, Any], db_url: str, tmp_path: Path, name: str,
                env: dict[str, str]) -> subprocess.Popen[str]:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(body))
    full = {k: v for k, v in os.environ.items() if not k.startswith("AIDAWORK_")}
    full.update({"AIDAWORK_DATABASE_URL": db_url, "AIDAWORK_BROKER_URL": BROKER_URL, **env})
    return subprocess.Popen([sys.executable, "-m", "worker.cli", "submit", str(path)], cwd=REPO, env=full,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


WORD_COUNT = [{"tool_calls": [{"name": "word_count", "args": {"text": "a b"}}]}, {"content": "2"}]


def test_the_cli_validates_a_submission_against_the_plugins_it_loaded(
    engine: Any, db_url: str, redis_clean: None, tmp_path: Path
) -> None:
    body = scripted_request(WORD_COUNT, tools=["word_count"])
    bad_args = scripted_request([{"tool_calls": [{"name": "lookup_order", "args": {"order_id": 7}}]}],
                                tools=["lookup_order"])
    procs = {
        "with": _cli_submit(body, db_url, tmp_path, "with", WITH_EXTRA),
        "without": _cli_submit(body, db_url, tmp_path, "without", {}),
        "bad_args": _cli_submit(bad_args, db_url, tmp_path, "bad_args", {}),  # an entry-point plugin's tool
    }
    results = {name: (proc.wait(timeout=WAIT_S), *proc.communicate()) for name, proc in procs.items()}

    code, out, err = results["with"]
    assert code == 0, err
    run_id = UUID(out.strip())
    code, out, err = results["without"]
    assert (code, out) == (2, ""), err
    assert err.startswith("aidawork: error: invalid request: config.tools[0]: unknown tool 'word_count'"), err
    assert "lookup_order" in err  # the known tools, the entry point's among them
    code, out, err = results["bad_args"]
    assert (code, out) == (2, ""), err
    assert "config.model.turns[0].tool_calls[0].args.order_id: Input should be a valid string" in err, err

    stored = rows(engine, "SELECT id, status, config -> 'tools' AS tools FROM runs")
    assert stored == [{"id": run_id, "status": "queued", "tools": ["word_count"]}]


@pytest.fixture
def plugged_api(db_url: str, redis_clean: None, tmp_path: Path) -> Iterator[ApiServer]:
    server = ApiServer(db_url, tmp_path / "api.log", extra_env=WITH_EXTRA)
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def test_the_api_validates_a_submission_against_the_plugins_it_loaded(plugged_api: ApiServer, engine: Any) -> None:
    accepted = plugged_api.http.post("/v1/runs", json=without_owner(scripted_request(WORD_COUNT, tools=["word_count"])),
                                     headers=A)
    assert accepted.status_code == 201, accepted.text
    run_id = accepted.json()["run_id"]

    bad = without_owner(scripted_request([{"tool_calls": [{"name": "word_count", "args": {"text": ["a", "b"]}}]}],
                                         tools=["word_count"]))
    refused = plugged_api.http.post("/v1/runs", content=json.dumps(bad), headers={**A, **JSON_HEADERS})
    assert refused.status_code == 422, refused.text
    error = refused.json()["error"]
    assert (error["code"], error["field"]) == ("REQUEST_INVALID", "config.model.turns[0].tool_calls[0].args.text")
    assert "valid string" in error["message"]

    unknown = without_owner(scripted_request(WORD_COUNT, tools=["word_counter"]))
    refused = plugged_api.http.post("/v1/runs", json=unknown, headers=A)
    assert (refused.status_code, refused.json()["error"]["field"]) == (422, "config.tools[0]")

    assert [str(r["id"]) for r in rows(engine, "SELECT id FROM runs")] == [run_id]


def test_a_plugin_provider_runs_a_run_end_to_end_with_its_call_in_the_ledger(
    cluster: Cluster, plugged: ClientContext
) -> None:
    cluster.start_worker("w1")  # the echo provider comes with the entry point: no setting needed
    wait_ready(cluster, "w1")
    request = scripted_request([{"content": "unused"}], tools=(), text_input="ping from the test")
    request["config"]["model"] = {"provider": "echo", "prefix": "echo: "}

    submitted = client.submit(request, ctx=plugged)
    run = wait_terminal(plugged.engine, submitted.run_id)

    assert (run["status"], run["output"]) == ("completed", "echo: ping from the test"), run
    assert run["config"]["model"] == {"provider": "echo", "prefix": "echo: "}
    (call,) = model_calls(plugged.engine, submitted.run_id)
    assert (call["boundary_seq"], call["status"], call["stale"]) == (0, "succeeded", False)
    assert (call["input_tokens"], call["output_tokens"]) == (len("ping from the test"), 1)
    assert call["response_digest"] == round_rows(plugged.engine, submitted.run_id)[0]["accepted_response_digest"]
    view = client.status(submitted.run_id, ctx=plugged)
    assert (view.model_calls, view.input_tokens, view.output_tokens) == (1, 18, 1)
