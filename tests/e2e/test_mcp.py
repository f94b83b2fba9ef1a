"""MCP servers with a real worker: a run calls the time server (stdio) and the test's
streamable-HTTP server through the worker's sessions; the HTTP server killed between two
rounds gives the model a failed result and the run completes; a worker that exits stops
its stdio server; a worker that could not reach a server at start lists it when a run needs
it. A client process that cannot reach a server refuses runs that enable its tools, for now."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from runtime.deps import build_runtime
from runtime.toolsets.mcp_config import parse_mcp_servers
from runtime.toolsets.mcp_sessions import McpToolset
from tests.support.api import free_port
from tests.support.cluster import Cluster, wait_events, wait_exit, wait_ready
from tests.support.db import rows, wait_suspended, wait_terminal
from tests.support.env import BROKER_URL, REPO, process_environ
from tests.support.mcp import TIME_SERVER, HttpMcpServer, stdio_processes
from tests.support.requests import scripted_request
from worker import client

TOKEN = "e2e-token-0123456789"
KILLED = "web-server-killed"
SCRIPT = [
    {"tool_calls": [{"name": "mcp__time__get_current_time", "args": {"timezone": "UTC"}}]},
    {"tool_calls": [{"name": "mcp__web__stamp", "args": {"text": "first"}}]},
    # The run suspends here until the test, having killed the HTTP server, resolves it.
    {"tool_calls": [{"name": "await_prerequisite", "args": {"key": KILLED}}]},
    {"tool_calls": [{"name": "mcp__web__stamp", "args": {"text": "second"}}]},
    {"content": "done"},
]
TOOLS = ["mcp__time__get_current_time", "mcp__web__stamp", "await_prerequisite"]


def servers(web_url: str, marker: str) -> dict[str, Any]:
    return {
        "time": {**TIME_SERVER, "env": {"AIDAWORK_TEST_MCP_MARK": marker}},
        "web": {"url": web_url, "headers": {"X-Test-Token": TOKEN}},
    }


@pytest.fixture
def web(tmp_path: Path) -> Iterator[HttpMcpServer]:
    server = HttpMcpServer(tmp_path / "mcp-http.log", token=TOKEN).wait_ready()
    yield server
    server.kill()


def test_a_run_calls_mcp_tools_through_the_worker_and_survives_a_server_killed_mid_run(
    cluster: Cluster, ctx: Any, web: HttpMcpServer
) -> None:
    marker = uuid.uuid4().hex
    cluster.start_worker("w1", concurrency=2, env={"AIDAWORK_MCP_SERVERS": json.dumps(servers(web.url, marker))})
    # The submitting side lists the same servers (its own sessions), so the request is
    # checked against the tools it will run with.
    submitter = McpToolset.start(parse_mcp_servers(servers(web.url, uuid.uuid4().hex)))
    try:
        client_ctx = replace(ctx, runtime=build_runtime(toolsets=submitter.tools))
        wait_ready(cluster, "w1")
        listed = wait_events(cluster, "w1", "mcp_server_listed", count=2)
        assert {(e["server"], e["transport"]) for e in listed} == {("time", "stdio"), ("web", "http")}

        run_id = client.submit(scripted_request(SCRIPT, tools=TOOLS), ctx=client_ctx).run_id
        wait_suspended(ctx.engine, run_id, boundary_seq=2)
        web.kill()
        client.resolve(run_id, KILLED, True, ctx=client_ctx)
        run = wait_terminal(ctx.engine, run_id)
    finally:
        submitter.close()

    assert (run["status"], run["output"]) == ("completed", "done"), run
    calls = rows(ctx.engine, "SELECT tool_call_id, tool_name, tool_domain, status, result FROM tool_invocations "
                 "WHERE run_id = :id ORDER BY boundary_seq, tool_call_id", id=run_id)
    assert [(c["tool_call_id"], c["tool_name"], c["status"]) for c in calls] == [
        ("call_0_0", "mcp__time__get_current_time", "completed"),
        ("call_1_0", "mcp__web__stamp", "completed"),
        ("call_2_0", "await_prerequisite", "completed"),
        ("call_3_0", "mcp__web__stamp", "failed"),
    ]
    assert calls[0]["tool_domain"] == calls[1]["tool_domain"] == "plugin"
    assert calls[0]["result"]["timezone"] == "UTC" and "datetime" in calls[0]["result"]
    assert calls[1]["result"] == {"stamped": "first"}
    error = calls[3]["result"]["error"]
    assert error["code"] == "MCP_SERVER_UNAVAILABLE" and "MCP server 'web'" in error["message"]
    # What the model was given next: the failed result, in its tool message.
    (message,) = rows(ctx.engine, "SELECT body FROM messages WHERE run_id = :id AND role = 'tool' "
                      "AND body->>'tool_call_id' = 'call_3_0'", id=run_id)
    assert message["body"].get("is_error") is True, message
    (warned,) = wait_events(cluster, "w1", "mcp_server_unavailable", count=1, server="web")
    assert (warned["level"], warned["run_id"], warned["tool"]) == ("warning", str(run_id), "stamp")

    # A worker that exits normally stops its stdio server.
    assert len(stdio_processes(marker)) == 1
    cluster.signal("w1", signal.SIGTERM)
    wait_exit(cluster, "w1")
    assert stdio_processes(marker) == []


def test_a_client_that_cannot_reach_a_server_refuses_runs_enabling_its_tools_for_now(
    db_url: str, tmp_path: Path
) -> None:
    request = tmp_path / "request.json"
    request.write_text(json.dumps(scripted_request([{"content": "hi"}], tools=["mcp__web__stamp"])))
    env = process_environ()
    env.update({"AIDAWORK_DATABASE_URL": db_url, "AIDAWORK_BROKER_URL": BROKER_URL,
                "AIDAWORK_MCP_SERVERS": json.dumps({"web": {"url": f"http://127.0.0.1:{free_port()}/mcp"}})})

    done = subprocess.run([sys.executable, "-m", "worker.cli", "submit", str(request)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)

    # Not "unknown tool": the tool's server is configured but down, which may pass (exit 1,
    # an error of the service, not of the request).
    assert done.returncode == 1, done.stderr
    lines = done.stderr.splitlines()
    warning = json.loads(next(line for line in lines if "mcp_server_unavailable" in line))
    assert (warning["server"], warning["phase"]) == ("web", "start")
    assert lines[-1].startswith("aidawork: error: TOOLSET_UNAVAILABLE: tool 'mcp__web__stamp': MCP server 'web'")
    assert rows_count(db_url) == 0


def rows_count(db_url: str) -> int:
    from schema.store.tx import make_engine

    engine = make_engine(db_url, pool_size=1)
    try:
        return int(rows(engine, "SELECT count(*) AS n FROM runs")[0]["n"])
    finally:
        engine.dispose()


def test_a_worker_that_could_not_reach_a_server_at_start_runs_its_tools_once_it_is_up(
    cluster: Cluster, ctx: Any, tmp_path: Path
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    web_only = {"web": {"url": url, "headers": {"X-Test-Token": TOKEN}}}
    cluster.start_worker("w1", concurrency=2, env={"AIDAWORK_MCP_SERVERS": json.dumps(web_only)})
    wait_ready(cluster, "w1")
    assert wait_events(cluster, "w1", "mcp_server_unavailable", count=1, server="web")[0]["phase"] == "start"

    server = HttpMcpServer(tmp_path / "web-1.log", token=TOKEN, port=port).wait_ready()
    submitter = McpToolset.start(parse_mcp_servers(web_only))
    try:
        client_ctx = replace(ctx, runtime=build_runtime(toolsets=submitter.tools))
        server.kill()  # down again when the worker claims the run: the round waits, the run does not fail
        script = [{"tool_calls": [{"name": "mcp__web__stamp", "args": {"text": "late"}}]}, {"content": "done"}]
        run_id = client.submit(scripted_request(script, tools=["mcp__web__stamp"]), ctx=client_ctx).run_id
        wait_events(cluster, "w1", "mcp_server_unavailable", count=2, server="web")
        server = HttpMcpServer(tmp_path / "web-2.log", token=TOKEN, port=port).wait_ready()
        run = wait_terminal(ctx.engine, run_id)
    finally:
        submitter.close()
        server.kill()

    assert (run["status"], run["output"]) == ("completed", "done"), run
    (stamp,) = rows(ctx.engine, "SELECT status, result FROM tool_invocations WHERE run_id = :id", id=run_id)
    assert (stamp["status"], stamp["result"]) == ("completed", {"stamped": "late"})
    late = wait_events(cluster, "w1", "mcp_server_listed", count=1, server="web")
    assert [e["phase"] for e in late] == ["late"]
