"""AIDAWORK_MCP_SERVERS parsing, the effect an MCP tool gets, and what its results become:
the pure half of the MCP toolsets (no server; tests/e2e/test_mcp_toolset.py has real ones)."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from mcp.types import CallToolResult, ImageContent, TextContent, ToolAnnotations
from mcp.types import Tool as McpTool

from runtime.deps import build_runtime
from runtime.errors import RequestInvalid
from runtime.prepare import prepare_turn
from runtime.tools import ToolArgsInvalid, ToolEffect
from runtime.toolsets.mcp import MCP_TOOL_ERROR, McpToolError, effect_for, result_json, tool_of
from runtime.toolsets.mcp_config import HttpServer, StdioServer, parse_mcp_servers
from schema.wire.vocab import ToolDomain
from worker.cli import main as cli
from worker.ops.settings import SettingsError, get_settings, load_settings

VAR = "AIDAWORK_MCP_SERVERS"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("AIDAWORK_"):
            monkeypatch.delenv(name)


def settings_error(monkeypatch: pytest.MonkeyPatch, value: Any) -> str:
    monkeypatch.setenv(VAR, value if isinstance(value, str) else json.dumps(value))
    with pytest.raises(SettingsError) as info:
        load_settings()
    message = str(info.value)
    assert VAR in message
    return message


# --- parsing -----------------------------------------------------------------------------


def test_no_servers_by_default() -> None:
    assert load_settings().mcp_servers == {}


def test_a_stdio_server_is_parsed_with_its_args_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(VAR, json.dumps({"time": {"command": "uvx", "args": ["mcp-server-time"],
                                                 "env": {"TZ_TOKEN": "s3cret-value"}}}))
    server = load_settings().mcp_servers["time"]

    assert isinstance(server, StdioServer)
    assert (server.kind, server.command, server.args) == ("stdio", "uvx", ["mcp-server-time"])
    assert server.env["TZ_TOKEN"].get_secret_value() == "s3cret-value"
    assert server.timeout_s == 60.0 and server.effects == {}
    assert "s3cret-value" not in repr(load_settings())  # env values are secrets


def test_an_http_server_is_parsed_with_its_headers_and_effects(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(VAR, json.dumps({"docs-1": {"url": "https://mcp.example.com/mcp",
                                                   "headers": {"Authorization": "Bearer tok-123"},
                                                   "effects": {"search": "read_only", "write": "at_most_once"},
                                                   "timeout_s": 5}}))
    server = load_settings().mcp_servers["docs-1"]

    assert isinstance(server, HttpServer)
    assert (server.kind, server.url, server.timeout_s) == ("http", "https://mcp.example.com/mcp", 5.0)
    assert server.headers["Authorization"].get_secret_value() == "Bearer tok-123"
    assert server.effects == {"search": "read_only", "write": "at_most_once"}
    assert "tok-123" not in repr(load_settings())


def test_invalid_json_is_a_settings_error_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    assert "not valid JSON" in settings_error(monkeypatch, '{"time": {"command": ')


@pytest.mark.parametrize("value", [[], '"a string"', 3])
def test_anything_but_an_object_is_refused(monkeypatch: pytest.MonkeyPatch, value: Any) -> None:
    assert "expected a JSON object" in settings_error(monkeypatch, value)


@pytest.mark.parametrize("name", ["has space", "dots.not.allowed", "", "x" * 33, "ünï"])
def test_a_bad_server_name_is_refused(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    message = settings_error(monkeypatch, {name: {"command": "x"}})
    assert "server names match ^[A-Za-z0-9_-]{1,32}$" in message


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("ftp://host/mcp", "url must be an http:// or https:// URL with a host"),
        ("http://user:pw-secret@host/mcp", "url must not contain user info"),
        ("https://host/mcp?api_key=pw-secret", "no query string"),
        ("not a url", "url must not contain whitespace"),
    ],
)
def test_a_bad_url_is_refused_like_a_model_base_url(monkeypatch: pytest.MonkeyPatch, url: str, reason: str) -> None:
    message = settings_error(monkeypatch, {"web": {"url": url}})
    assert "server 'web'" in message and reason in message
    assert "pw-secret" not in message


@pytest.mark.parametrize(
    ("server", "reason"),
    [
        ({}, "give exactly one of 'command' (stdio) or 'url' (streamable HTTP)"),
        ({"command": "x", "url": "http://h/mcp"}, "give exactly one of"),
        ("uvx mcp-server-time", "expected an object with 'command'"),
        ({"command": ""}, "command: String should have at least 1 character"),
        ({"command": "x", "args": ["ok", 2]}, "args[1]: Input should be a valid string"),
        ({"command": "x", "env": {"K": 12345}}, "env.K: Input should be a valid string"),
        ({"command": "x", "effects": {"t": "sometimes"}}, "effects.t: Input should be 'read_only'"),
        ({"command": "x", "timeout_s": 0}, "timeout_s: Input should be greater than 0"),
        ({"url": "http://h/mcp", "headers": {"H": None}}, "headers.H: Input should be a valid string"),
        ({"command": "x", "cwd": "/tmp"}, "cwd: Extra inputs are not permitted"),
    ],
)
def test_a_bad_shape_names_the_server_and_the_field(monkeypatch: pytest.MonkeyPatch, server: Any, reason: str) -> None:
    message = settings_error(monkeypatch, {"srv": server})
    assert "server 'srv'" in message and reason in message
    assert "12345" not in message  # values are not echoed


def test_a_bad_setting_exits_2_from_the_cli_with_one_line(monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(VAR, '{"time": {"url": "ftp://x"}}')
    # In process, the CLI's logging set-up (WARNING for a client command) would stay for
    # the tests after this one: structlog caches each logger, level included, at first use.
    monkeypatch.setattr(cli, "configure_logging", lambda *_, **__: None)
    get_settings.cache_clear()
    try:
        code = cli.main(["status", "00000000-0000-4000-8000-000000000001"])
    finally:
        get_settings.cache_clear()
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("aidawork: error: invalid configuration: AIDAWORK_MCP_SERVERS:")
    assert "Traceback" not in err and err.count("\n") == 1


# --- effects -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("annotations", "effect"),
    [
        (None, ToolEffect.AT_MOST_ONCE),
        (ToolAnnotations(), ToolEffect.AT_MOST_ONCE),
        (ToolAnnotations(read_only_hint=False, idempotent_hint=False), ToolEffect.AT_MOST_ONCE),
        (ToolAnnotations(destructive_hint=False), ToolEffect.AT_MOST_ONCE),
        (ToolAnnotations(read_only_hint=True), ToolEffect.READ_ONLY),
        (ToolAnnotations(read_only_hint=True, idempotent_hint=True), ToolEffect.READ_ONLY),
        (ToolAnnotations(idempotent_hint=True), ToolEffect.IDEMPOTENT),
    ],
)
def test_the_effect_follows_the_servers_annotations(annotations: ToolAnnotations | None, effect: ToolEffect) -> None:
    assert effect_for(annotations) == effect


@pytest.mark.parametrize("configured", ["read_only", "idempotent", "at_most_once"])
def test_the_operators_effect_overrides_the_annotations(configured: str) -> None:
    assert effect_for(ToolAnnotations(read_only_hint=True), configured) == ToolEffect(configured)
    assert effect_for(None, configured) == ToolEffect(configured)


SCHEMA = {"type": "object", "properties": {"q": {"type": "string"}, "n": {"type": "integer"}}, "required": ["q"]}


def spec(name: str = "search", schema: dict[str, Any] | None = None, **annotations: Any) -> McpTool:
    return McpTool(name=name, description="Search the docs.", input_schema=schema or SCHEMA,
                   annotations=ToolAnnotations(**annotations) if annotations else None)


def never_called(args: Any, ctx: Any) -> Any:
    raise AssertionError("no call in these tests")


def test_a_server_tool_becomes_a_plugin_tool_with_the_servers_schema() -> None:
    config = parse_mcp_servers({"docs": {"url": "http://127.0.0.1:9/mcp", "effects": {"write": "idempotent"},
                                         "timeout_s": 7}})["docs"]
    search = tool_of("docs", config, spec(read_only_hint=True), never_called)
    write = tool_of("docs", config, spec("write"), never_called)
    other = tool_of("docs", config, spec("other"), never_called)

    assert not isinstance(search, str) and not isinstance(write, str) and not isinstance(other, str)
    assert (search.name, search.domain, search.effect) == ("mcp__docs__search", ToolDomain.PLUGIN, ToolEffect.READ_ONLY)
    assert search.parameters == SCHEMA and search.args_model is None
    assert search.description == "Search the docs." and search.timeout_s == 7.0
    assert write.effect == ToolEffect.IDEMPOTENT  # configured
    assert other.effect == ToolEffect.AT_MOST_ONCE  # neither hinted nor configured
    assert search.parse_args({"q": "x", "n": 2}) == {"q": "x", "n": 2}
    with pytest.raises(ToolArgsInvalid) as info:
        search.parse_args({"q": "x", "n": "two"})
    assert info.value.path == "n"


@pytest.mark.parametrize(
    ("tool", "reason"),
    [
        (spec("x" * 60), "does not match"),
        (spec("has.dot"), "does not match"),
        (spec("ok", {"type": "array"}), "must describe an object"),
        (spec("ok", {"type": "object", "properties": {"a": {"type": "nonsense"}}}), "is not a valid JSON Schema"),
    ],
)
def test_a_tool_that_cannot_be_offered_is_left_out_with_the_reason(tool: McpTool, reason: str) -> None:
    config = parse_mcp_servers({"docs": {"command": "x"}})["docs"]
    made = tool_of("docs", config, tool, never_called)
    assert isinstance(made, str) and reason in made


def test_a_run_enables_mcp_tools_by_name_and_a_script_is_checked_against_their_schema() -> None:
    config = parse_mcp_servers({"docs": {"command": "x"}})["docs"]
    made = tool_of("docs", config, spec(), never_called)
    assert not isinstance(made, str)
    runtime = build_runtime(toolsets=[made])

    def turn_config(args: dict[str, Any], tools: list[str]) -> dict[str, Any]:
        return {"model": {"provider": "scripted", "turns": [{"tool_calls": [{"name": "mcp__docs__search",
                                                                                "args": args}]}]}, "tools": tools}

    prepared = prepare_turn(runtime, turn_config({"q": "x"}, ["mcp__docs__search", "add"]), "team-a")
    assert set(prepared.deps.tools) == {"mcp__docs__search", "add"}
    with pytest.raises(RequestInvalid) as info:
        prepare_turn(runtime, turn_config({"q": 3}, ["mcp__docs__search"]), "team-a")
    assert info.value.field == "config.model.turns[0].tool_calls[0].args.q"
    with pytest.raises(RequestInvalid) as info:
        prepare_turn(build_runtime(), turn_config({"q": "x"}, ["mcp__docs__search"]), "team-a")
    assert info.value.field == "config.tools[0]"


# --- results -----------------------------------------------------------------------------


def test_structured_content_is_the_result() -> None:
    result = CallToolResult(content=[TextContent(text='{"a": 1}')], structured_content={"a": 1})
    assert result_json("s", result) == {"a": 1}


def test_without_structured_content_the_texts_are_joined_and_other_content_named() -> None:
    result = CallToolResult(content=[TextContent(text="one"), ImageContent(data="AAAA", mime_type="image/png"),
                                     TextContent(text="two")])
    assert result_json("s", result) == "one\n[image content image/png omitted]\ntwo"


def test_an_error_result_is_a_tool_error_the_model_sees() -> None:
    with pytest.raises(McpToolError) as info:
        result_json("docs", CallToolResult(content=[TextContent(text="no such page")], is_error=True))
    assert info.value.code == MCP_TOOL_ERROR
    assert info.value.message == "MCP server 'docs': no such page"
