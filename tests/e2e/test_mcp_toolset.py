"""MCP toolsets against real servers, in this process (no worker, database or broker):
the ``mcp-server-time`` reference server over stdio and the tiny streamable-HTTP server of
``tests.support.mcp_http_server``, called through the ``Tool``s the toolset makes."""

from __future__ import annotations

import os
import signal
import threading
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from runtime.deps import build_runtime
from runtime.tools import Tool, ToolArgsInvalid, ToolEffect, ToolOutcome, ToolsetUnavailable, ToolTimedOut
from runtime.toolsets.mcp import MCP_SERVER_UNAVAILABLE, MCP_TOOL_ERROR
from runtime.toolsets.mcp_config import parse_mcp_servers
from runtime.toolsets.mcp_sessions import McpToolset
from schema.wire.vocab import ToolDomain, ToolStatus
from tests.support.api import free_port
from tests.support.mcp import TIME_SERVER, HttpMcpServer, stdio_processes
from tests.support.tools import tool_context
from tests.support.wait import wait_until

TOKEN = "test-token-0123456789"


@pytest.fixture
def http_server(tmp_path: Path) -> Iterator[HttpMcpServer]:
    server = HttpMcpServer(tmp_path / "mcp-http.log", token=TOKEN).wait_ready()
    yield server
    server.kill()


def start(servers: dict[str, Any], **kw: Any) -> McpToolset:
    return McpToolset.start(parse_mcp_servers(servers), **kw)


def call(tools: dict[str, Tool], name: str, args: dict[str, Any]) -> ToolOutcome:
    tool = tools[name]
    return tool.run(tool.parse_args(args), tool_context())


def error_code(outcome: ToolOutcome) -> str:
    assert outcome.status == ToolStatus.FAILED, outcome
    assert isinstance(outcome.result, dict)
    return str(outcome.result["error"]["code"])


@pytest.fixture
def toolsets() -> Iterator[list[McpToolset]]:
    """Toolsets a test started, closed after it even when it fails."""
    started: list[McpToolset] = []
    yield started
    for toolset in started:
        toolset.close()


def test_the_time_servers_tools_are_listed_and_called_over_stdio(toolsets: list[McpToolset]) -> None:
    toolsets.append(toolset := start({"time": TIME_SERVER}))
    tools = {t.name: t for t in toolset.tools}

    assert sorted(tools) == ["mcp__time__convert_time", "mcp__time__get_current_time"]
    now = tools["mcp__time__get_current_time"]
    # The server's own schema, its read-only annotation, the plugin domain.
    assert now.parameters["required"] == ["timezone"] and now.args_model is None
    assert (now.domain, now.effect) == (ToolDomain.PLUGIN, ToolEffect.READ_ONLY)

    outcome = call(tools, "mcp__time__get_current_time", {"timezone": "UTC"})
    assert outcome.status == ToolStatus.COMPLETED, outcome
    assert isinstance(outcome.result, dict)
    assert outcome.result["timezone"] == "UTC"
    assert datetime.fromisoformat(str(outcome.result["datetime"])).utcoffset() is not None
    assert set(outcome.result) == {"timezone", "datetime", "day_of_week", "is_dst"}


def test_a_bad_argument_to_the_time_server_is_a_failed_result(toolsets: list[McpToolset]) -> None:
    toolsets.append(toolset := start({"time": TIME_SERVER}))
    tools = {t.name: t for t in toolset.tools}

    # The server's schema is checked before any call ...
    with pytest.raises(ToolArgsInvalid) as info:
        tools["mcp__time__get_current_time"].parse_args({"timezone": 5})
    assert info.value.path == "timezone"
    # ... and what only the server knows is wrong comes back as a failed result.
    outcome = call(tools, "mcp__time__get_current_time", {"timezone": "Nowhere/Bogus"})
    assert error_code(outcome) == MCP_TOOL_ERROR
    assert isinstance(outcome.result, dict) and "Nowhere/Bogus" in outcome.result["error"]["message"]
    # The session is still good.
    assert call(tools, "mcp__time__get_current_time", {"timezone": "Europe/Paris"}).status == ToolStatus.COMPLETED


def test_a_tool_is_called_over_streamable_http_with_the_configured_headers(
    http_server: HttpMcpServer, toolsets: list[McpToolset]
) -> None:
    toolsets.append(toolset := start({"web": {"url": http_server.url, "headers": {"X-Test-Token": TOKEN},
                                              "effects": {"fail": "read_only"}}}))
    tools = {t.name: t for t in toolset.tools}

    assert sorted(tools) == [
        "mcp__web__fail", "mcp__web__meta_key", "mcp__web__shout", "mcp__web__stamp", "mcp__web__wait"
    ]
    assert tools["mcp__web__stamp"].effect == ToolEffect.IDEMPOTENT  # annotated
    assert tools["mcp__web__shout"].effect == ToolEffect.AT_MOST_ONCE  # nothing said
    assert tools["mcp__web__fail"].effect == ToolEffect.READ_ONLY  # the operator said
    stamped = call(tools, "mcp__web__stamp", {"text": "hello"})
    assert (stamped.status, stamped.result) == (ToolStatus.COMPLETED, {"stamped": "hello"})
    shouted = call(tools, "mcp__web__shout", {"text": "hello"})  # text content only
    assert (shouted.status, shouted.result) == (ToolStatus.COMPLETED, "HELLO")
    failed = call(tools, "mcp__web__fail", {"reason": "because"})
    assert error_code(failed) == MCP_TOOL_ERROR
    assert isinstance(failed.result, dict) and "failed on purpose: because" in failed.result["error"]["message"]


def test_a_server_unreachable_at_start_is_logged_and_contributes_no_tools(
    http_server: HttpMcpServer, toolsets: list[McpToolset]
) -> None:
    closed_port = free_port()
    with capture_logs() as logs:
        toolsets.append(toolset := start({
            "time": TIME_SERVER,
            "gone": {"url": f"http://127.0.0.1:{closed_port}/mcp"},
            "nokey": {"url": http_server.url},  # up, but refuses requests without the header
        }))

    assert toolset.listed == ("time",)
    assert set(toolset.unavailable) == {"gone", "nokey"}
    assert {t.name for t in toolset.tools} == {"mcp__time__convert_time", "mcp__time__get_current_time"}
    down = [e for e in logs if e["event"] == "mcp_server_unavailable"]
    assert {e["server"] for e in down} == {"gone", "nokey"}
    assert all(e["log_level"] == "warning" and e["phase"] == "start" for e in down)


def test_a_server_killed_gives_unavailable_and_the_next_call_after_its_restart_reconnects(
    tmp_path: Path, http_server: HttpMcpServer, toolsets: list[McpToolset]
) -> None:
    toolsets.append(toolset := start({"web": {"url": http_server.url, "headers": {"X-Test-Token": TOKEN}}}))
    tools = {t.name: t for t in toolset.tools}
    assert call(tools, "mcp__web__stamp", {"text": "1"}).status == ToolStatus.COMPLETED

    http_server.kill()
    with capture_logs() as logs:
        gone = call(tools, "mcp__web__stamp", {"text": "2"})
        again = call(tools, "mcp__web__stamp", {"text": "3"})  # the reconnect fails too
    assert error_code(gone) == error_code(again) == MCP_SERVER_UNAVAILABLE
    assert isinstance(gone.result, dict) and "MCP server 'web' is unavailable" in gone.result["error"]["message"]
    warned = [e for e in logs if e["event"] == "mcp_server_unavailable"]
    assert [(e["server"], e["tool"]) for e in warned] == [("web", "stamp"), ("web", "stamp")]

    restarted = HttpMcpServer(tmp_path / "mcp-http-2.log", token=TOKEN, port=http_server.port).wait_ready()
    try:
        back = call(tools, "mcp__web__stamp", {"text": "4"})
        assert (back.status, back.result) == (ToolStatus.COMPLETED, {"stamped": "4"})
    finally:
        restarted.kill()


def test_a_stdio_server_that_died_is_started_again_by_the_next_call(toolsets: list[McpToolset]) -> None:
    marker = uuid.uuid4().hex
    toolsets.append(toolset := start({"time": {**TIME_SERVER, "env": {"AIDAWORK_TEST_MCP_MARK": marker}}}))
    tools = {t.name: t for t in toolset.tools}
    (first,) = stdio_processes(marker)

    os.kill(first, signal.SIGKILL)
    wait_until(lambda: first not in stdio_processes(marker), what="the stdio server to die")
    # The session noticed (its stdout closed) or the call finds out: either way one call
    # may fail, and a later one runs on a new process.
    outcomes = [call(tools, "mcp__time__get_current_time", {"timezone": "UTC"}) for _ in range(2)]
    assert outcomes[-1].status == ToolStatus.COMPLETED, outcomes
    assert all(o.status == ToolStatus.COMPLETED or error_code(o) == MCP_SERVER_UNAVAILABLE for o in outcomes)
    (second,) = stdio_processes(marker)
    assert second != first


def test_closing_the_toolset_stops_its_stdio_server(toolsets: list[McpToolset]) -> None:
    marker = uuid.uuid4().hex
    toolset = start({"time": {**TIME_SERVER, "env": {"AIDAWORK_TEST_MCP_MARK": marker}}})
    toolsets.append(toolset)
    assert len(stdio_processes(marker)) == 1

    toolset.close()

    assert stdio_processes(marker) == []
    outcome = call({t.name: t for t in toolset.tools}, "mcp__time__get_current_time", {"timezone": "UTC"})
    assert error_code(outcome) == MCP_SERVER_UNAVAILABLE


def test_a_call_past_its_timeout_fails_or_has_an_unknown_outcome_by_its_effect(
    http_server: HttpMcpServer, toolsets: list[McpToolset]
) -> None:
    headers = {"X-Test-Token": TOKEN}
    toolsets.append(toolset := start({
        "safe": {"url": http_server.url, "headers": headers, "timeout_s": 0.5, "effects": {"wait": "idempotent"}},
        "once": {"url": http_server.url, "headers": headers, "timeout_s": 0.5},
    }))
    tools = {t.name: t for t in toolset.tools}

    # Re-running an idempotent call is harmless: the model is told it timed out.
    assert error_code(call(tools, "mcp__safe__wait", {"seconds": 30})) == "TOOL_TIMEOUT"
    # An at-most-once call may have happened: the loop suspends it for an operator.
    with pytest.raises(ToolTimedOut):
        call(tools, "mcp__once__wait", {"seconds": 30})
    # A timeout is not a broken session.
    assert call(tools, "mcp__safe__stamp", {"text": "after"}).result == {"stamped": "after"}


def test_a_server_unreachable_at_start_is_listed_when_a_run_names_its_tool_once_it_is_up(
    tmp_path: Path, toolsets: list[McpToolset]
) -> None:
    port = free_port()
    servers = {"web": {"url": f"http://127.0.0.1:{port}/mcp", "headers": {"X-Test-Token": TOKEN}}}
    toolsets.append(toolset := start(servers, connect_timeout_s=2, relist_interval_s=0))
    registry = build_runtime(toolsets=toolset.tools, resolvers=(toolset.resolve,)).base.tools
    assert toolset.unavailable == ("web",)

    # Still down: the name is of a known server, so it is "not yet", never "unknown tool".
    with pytest.raises(ToolsetUnavailable, match="MCP server 'web' cannot be reached yet"):
        registry.get("mcp__web__stamp")
    assert registry.get("mcp__other__stamp") is None  # no such server: simply unknown

    server = HttpMcpServer(tmp_path / "late.log", token=TOKEN, port=port).wait_ready()
    try:
        with capture_logs() as logs:
            tool = registry.get("mcp__web__stamp")
        assert tool is not None and toolset.unavailable == () and "web" in toolset.listed
        assert [(e["server"], e["phase"]) for e in logs if e["event"] == "mcp_server_listed"] == [("web", "late")]
        assert call({tool.name: tool}, tool.name, {"text": "late"}).result == {"stamped": "late"}
    finally:
        server.kill()


def test_a_call_carries_its_idempotency_key_in_the_request_meta(
    http_server: HttpMcpServer, toolsets: list[McpToolset]
) -> None:
    toolsets.append(toolset := start({"web": {"url": http_server.url, "headers": {"X-Test-Token": TOKEN}}}))
    tool = next(t for t in toolset.tools if t.name == "mcp__web__meta_key")
    outcome = tool.run(tool.parse_args({}), tool_context("call_3_1"))
    assert (outcome.status, outcome.result) == (ToolStatus.COMPLETED, {"result": "key-call_3_1"})


def test_an_at_most_once_call_whose_server_went_away_after_it_was_sent_has_an_unknown_outcome(
    tmp_path: Path, http_server: HttpMcpServer, toolsets: list[McpToolset]
) -> None:
    headers = {"X-Test-Token": TOKEN}
    toolsets.append(toolset := start({
        "once": {"url": http_server.url, "headers": headers},
        "safe": {"url": http_server.url, "headers": headers, "effects": {"wait": "idempotent"}},
    }))
    tools = {t.name: t for t in toolset.tools}
    outcomes: dict[str, Any] = {}
    for name in ("mcp__once__wait", "mcp__safe__wait"):
        started = tmp_path / f"{name}.started"
        server = HttpMcpServer(tmp_path / f"{name}.log", token=TOKEN, port=http_server.port)
        if name == "mcp__once__wait":
            http_server.kill()  # the fixture's server makes way for one the test kills mid-call
        server.wait_ready()

        def calling(name: str = name, started: Path = started) -> None:
            try:
                outcomes[name] = call(tools, name, {"seconds": 30, "started": str(started)})
            except ToolTimedOut as exc:
                outcomes[name] = exc

        caller = threading.Thread(target=calling)
        caller.start()
        wait_until(started.exists, what=f"{name} to reach the server")
        server.kill()  # the request was sent: the server may have acted on it
        caller.join(timeout=60)
    # At most once: it may have happened, so it is not a plain failure.
    assert isinstance(outcomes["mcp__once__wait"], ToolTimedOut), outcomes
    assert "went away after the call was sent" in str(outcomes["mcp__once__wait"])
    # Idempotent: running it again is harmless, so the model is told the server is down.
    assert error_code(outcomes["mcp__safe__wait"]) == MCP_SERVER_UNAVAILABLE
