"""Plugins: loading them (AIDAWORK_PLUGINS and the ``aidawork.plugins`` entry points),
what a bad one does (a PluginError naming it, before the process starts), and a plugin's
model provider validated and run like a built-in one."""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import pytest
import structlog.testing
from pydantic import BaseModel

from runtime.deps import build_runtime
from runtime.errors import RequestInvalid
from runtime.loop import Finish
from runtime.plugins import PluginError, Plugins, load_plugins, process_plugins
from runtime.prepare import prepare_execution, resolve_and_run
from runtime.tools import Tool, tool
from tests.support.requests import scripted_request
from worker.cli import main as cli
from worker.client.context import runtime_for
from worker.ops.settings import Settings, get_settings

TEST_PLUGINS = Path(__file__).resolve().parent.parent / "support" / "plugins"
EXAMPLE_TOOLS = ["append_line", "append_line_checked", "lookup_order"]


def _module(monkeypatch: pytest.MonkeyPatch, name: str, register: Callable[[Plugins], Any] | None) -> str:
    """An importable plugin module ``name`` (in ``sys.modules`` for this test only)."""
    module = types.ModuleType(name)
    if register is not None:
        module.register = register  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, name, module)
    return name


@tool(effect="read_only")
def shout(text: str) -> dict[str, str]:
    """Upper-case a text."""
    return {"text": text.upper()}


class OtherConfig(BaseModel):
    provider: Literal["other"]


# --- loading ---------------------------------------------------------------------------------


def test_a_module_that_does_not_exist_is_a_plugin_error_naming_it() -> None:
    with pytest.raises(PluginError) as info:
        load_plugins(["no_such_plugin"], discover=False)

    assert info.value.plugin == "no_such_plugin"
    assert info.value.code == "PLUGIN_INVALID"
    assert str(info.value) == (
        "plugin 'no_such_plugin': cannot be imported: ModuleNotFoundError: No module named 'no_such_plugin'"
    )



REFUSED = ("PLUGIN_INVALID: plugin 'no_such_plugin': cannot be imported: ModuleNotFoundError: "
           "No module named 'no_such_plugin' (AIDAWORK_PLUGINS or an aidawork.plugins entry point)")


@pytest.mark.parametrize(
    "argv",
    [["api"], ["worker"], ["submit", "request.json"], ["status", "00000000-0000-4000-8000-000000000001"]],
    ids=lambda argv: argv[0],
)
def test_a_plugin_that_cannot_load_stops_every_command_before_it_starts_naming_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    """The API, the worker and the CLI's client commands load the plugins first: one that
    cannot load is an exit 2 naming it (a process's start_refused line, a client command's
    one stderr line), before the command starts (tests/e2e/test_plugins.py runs a real
    worker)."""
    for name in list(os.environ):
        if name.startswith("AIDAWORK_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AIDAWORK_PLUGINS", "no_such_plugin")
    monkeypatch.setenv("AIDAWORK_DEV", "1")  # so that only the plugin can stop the processes
    # In process, the CLI's logging set-up would stay for the tests after this one.
    monkeypatch.setattr(cli, "configure_logging", lambda *_, **__: None)
    started: list[str] = []
    for command in ("cmd_api", "cmd_submit", "cmd_status", "cmd_worker"):  # what would start the command
        monkeypatch.setattr(cli, command, lambda args, command=command: started.append(command) or 0)
    get_settings.cache_clear()
    try:
        with structlog.testing.capture_logs() as logged:
            code = cli.main(argv)
    finally:
        get_settings.cache_clear()

    out, err = capsys.readouterr()
    assert (code, started, out) == (2, [], "")
    if argv[0] in cli.PROCESS_COMMANDS:
        refusals = [e for e in logged if e["event"] == "start_refused"]
        assert [(e["command"], e["error"], e["exit_code"]) for e in refusals] == [(argv[0], REFUSED, 2)]
    else:
        assert err == f"aidawork: error: {REFUSED}\n"


def test_a_client_context_with_a_plugin_that_cannot_load_is_not_built() -> None:
    # What the Python client and the API build their validation from.
    with pytest.raises(PluginError) as info:
        runtime_for(Settings(plugins="no_such_plugin"))
    assert info.value.plugin == "no_such_plugin"


def test_a_module_without_register_is_a_plugin_error() -> None:
    # ``json`` imports fine and has no register().
    with pytest.raises(PluginError) as info:
        load_plugins(["json"], discover=False)

    assert info.value.plugin == "json"
    assert "has no register(plugins) function" in str(info.value)


def test_a_register_that_raises_is_a_plugin_error_naming_the_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(TEST_PLUGINS))
    with pytest.raises(PluginError) as info:
        load_plugins(["raising_plugin"], discover=False)

    assert info.value.plugin == "raising_plugin"
    assert "register() raised RuntimeError: the plugin's backend is not configured" in str(info.value)
    assert isinstance(info.value.__cause__, RuntimeError)


def test_a_plugin_error_stops_the_load_at_the_first_bad_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    good = _module(monkeypatch, "good_plugin", lambda p: p.tool(shout))

    with pytest.raises(PluginError) as info:
        load_plugins([good, "no_such_plugin"], discover=False)
    assert info.value.plugin == "no_such_plugin"


def test_tool_takes_only_tool_objects(monkeypatch: pytest.MonkeyPatch) -> None:
    name = _module(monkeypatch, "plain_function_plugin", lambda p: p.tool(lambda text: text))

    with pytest.raises(PluginError) as info:
        load_plugins([name], discover=False)
    assert info.value.plugin == name
    assert "takes Tool objects (made with @tool)" in str(info.value)


def test_a_hand_made_tool_with_a_name_no_provider_accepts_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    bad = Tool("two words", "", {"type": "object"}, shout.domain, shout.handler)
    name = _module(monkeypatch, "bad_name_plugin", lambda p: p.tool(bad))

    with pytest.raises(PluginError, match="tool name 'two words' must match"):
        load_plugins([name], discover=False)


# --- providers -------------------------------------------------------------------------------


class NoTagConfig(BaseModel):
    prefix: str = ""


class StrTagConfig(BaseModel):
    provider: str


class WrongTagConfig(BaseModel):
    provider: Literal["another"]


@pytest.mark.parametrize("config_model", [NoTagConfig, StrTagConfig, WrongTagConfig])
def test_a_provider_config_model_without_its_provider_literal_is_refused(
    monkeypatch: pytest.MonkeyPatch, config_model: type[BaseModel]
) -> None:
    name = _module(monkeypatch, "untagged_plugin", lambda p: p.provider("mine", config_model, lambda c, o: None))

    with pytest.raises(PluginError) as info:
        load_plugins([name], discover=False)
    assert info.value.plugin == name
    assert "the config model of provider 'mine' needs provider: Literal['mine']" in str(info.value)


@pytest.mark.parametrize("provider", ["scripted", "openai", "anthropic"])
def test_a_provider_named_like_a_built_in_is_refused(monkeypatch: pytest.MonkeyPatch, provider: str) -> None:
    config = types.new_class("C", (BaseModel,), exec_body=lambda ns: ns.update(
        {"__annotations__": {"provider": Literal[provider]}}))  # type: ignore[valid-type]
    name = _module(monkeypatch, "shadowing_plugin", lambda p: p.provider(provider, config, lambda c, o: None))

    with pytest.raises(PluginError) as info:
        load_plugins([name], discover=False)
    assert f"model provider {provider!r} is already registered" in str(info.value)


def test_a_provider_registered_by_two_plugins_is_refused_naming_the_second(monkeypatch: pytest.MonkeyPatch) -> None:
    first = _module(monkeypatch, "first_plugin", lambda p: p.provider("other", OtherConfig, lambda c, o: None))
    second = _module(monkeypatch, "second_plugin", lambda p: p.provider("other", OtherConfig, lambda c, o: None))

    with pytest.raises(PluginError) as info:
        load_plugins([first, second], discover=False)
    assert info.value.plugin == second
    assert "model provider 'other' is already registered" in str(info.value)


def test_a_provider_factory_must_be_callable(monkeypatch: pytest.MonkeyPatch) -> None:
    name = _module(monkeypatch, "factoryless_plugin", lambda p: p.provider("other", OtherConfig, None))  # type: ignore[arg-type]

    with pytest.raises(PluginError, match="factory of provider 'other' must be callable"):
        load_plugins([name], discover=False)


# --- tool names that clash -------------------------------------------------------------------


def test_a_plugin_tool_named_like_a_built_in_is_refused_at_load_naming_plugin_and_tool(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    @tool(effect="read_only")
    def add(a: int, b: int) -> int:
        return a - b

    name = _module(monkeypatch, "clashing_plugin", lambda p: p.tool(add))

    with pytest.raises(PluginError) as info:
        load_plugins([name], discover=False)
    assert info.value.plugin == name
    assert str(info.value) == "plugin 'clashing_plugin': tool 'add' is the name of a built-in tool"


def test_a_tool_registered_by_two_plugins_is_refused_naming_both(monkeypatch: pytest.MonkeyPatch) -> None:
    first = _module(monkeypatch, "one_plugin", lambda p: p.tool(shout))
    second = _module(monkeypatch, "two_plugin", lambda p: p.tool(shout))

    with pytest.raises(PluginError) as info:
        load_plugins([first, second], discover=False)
    assert info.value.plugin == second
    assert "tool 'shout' is already registered by plugin 'one_plugin'" in str(info.value)


def test_build_runtime_names_the_plugin_of_a_tool_that_clashes() -> None:
    # A Plugins filled by hand, not by load_plugins: the registry's clash still names the plugin.
    @tool(effect="read_only")
    def echo(text: str) -> str:
        return text

    plugins = Plugins(tools=[echo], tool_plugins={"echo": "handmade"})

    with pytest.raises(PluginError) as info:
        build_runtime(plugins=plugins)
    assert info.value.plugin == "handmade"
    assert "tool 'echo' is already registered" in str(info.value)


# --- discovery and AIDAWORK_PLUGINS ---------------------------------------------------------


def test_the_installed_example_package_is_found_through_its_entry_point() -> None:
    plugins = load_plugins([])

    assert plugins.loaded == ["example (aidawork_example)"]
    assert sorted(t.name for t in plugins.tools) == EXAMPLE_TOOLS
    assert set(plugins.tool_plugins.values()) == {"example (aidawork_example)"}
    assert list(plugins.providers) == ["echo"]
    assert load_plugins([], discover=False).loaded == []


def test_aidawork_plugins_adds_a_module_that_no_entry_point_advertises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIDAWORK_PLUGINS", " aidawork_example.extra , ")
    settings = Settings()

    assert settings.plugin_names == ["aidawork_example.extra"]
    plugins = load_plugins(settings.plugin_names)
    assert plugins.loaded == ["aidawork_example.extra", "example (aidawork_example)"]
    assert sorted(t.name for t in plugins.tools) == sorted([*EXAMPLE_TOOLS, "word_count"])
    assert plugins.tool_plugins["word_count"] == "aidawork_example.extra"

    registry = runtime_for(settings).base.tools
    assert registry.get("word_count") is not None
    assert runtime_for(Settings(plugins="")).base.tools.get("word_count") is None


def test_a_plugin_named_in_aidawork_plugins_and_advertised_too_is_loaded_once() -> None:
    plugins = load_plugins(["aidawork_example"])

    assert plugins.loaded == ["aidawork_example"]
    assert sorted(t.name for t in plugins.tools) == EXAMPLE_TOOLS


def test_an_entry_point_naming_the_register_function_is_the_same_plugin_as_its_module(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def register(p: Plugins) -> None:
        p.tool(shout)

    module = _module(monkeypatch, "fn_plugin", register)

    class FunctionEntryPoint:
        name, value = "fn", "fn_plugin:register"

        def load(self) -> Callable[[Plugins], None]:
            return register

    monkeypatch.setattr("runtime.plugins.entry_points", lambda group: [FunctionEntryPoint()])
    plugins = load_plugins([module])

    assert plugins.loaded == ["fn_plugin"]
    assert [t.name for t in plugins.tools] == ["shout"]


def test_process_plugins_loads_once_per_process_for_the_same_names() -> None:
    assert process_plugins(["aidawork_example.extra"]) is process_plugins(["aidawork_example.extra"])
    assert process_plugins([]) is not process_plugins(["aidawork_example.extra"])


# --- a plugin's model provider -----------------------------------------------------------------


def _echo_request(model: dict[str, Any], text: str = "hello there") -> dict[str, Any]:
    request = scripted_request([{"content": "unused"}], tools=(), text_input=text)
    request["config"]["model"] = model
    return request


@pytest.fixture(scope="module")
def with_example() -> Any:
    return build_runtime(plugins=load_plugins(["aidawork_example.extra"]))


def test_a_plugin_provider_config_is_validated_at_prepare(with_example: Any) -> None:
    from aidawork_example.echo_model import EchoModel, EchoModelConfig

    _, prepared = prepare_execution(with_example, _echo_request({"provider": "echo", "prefix": "hi "}))

    assert prepared.turn_config.model == EchoModelConfig(provider="echo", prefix="hi ")
    assert isinstance(prepared.deps.model, EchoModel)
    _, defaulted = prepare_execution(with_example, _echo_request({"provider": "echo"}))
    assert defaulted.turn_config.model == EchoModelConfig(provider="echo", prefix="you said: ")


@pytest.mark.parametrize(
    ("model", "field", "fragment"),
    [
        ({"provider": "echo", "prefix": 5}, "config.model.prefix", "valid string"),
        ({"provider": "echo", "prefix": "x" * 201}, "config.model.prefix", "at most 200"),
        ({"provider": "echo", "temperature": 0.1}, "config.model.temperature", "Extra inputs"),
    ],
    ids=["wrong_type", "too_long", "unknown_field"],
)
def test_a_bad_plugin_provider_field_is_refused_naming_it(
    with_example: Any, model: dict[str, Any], field: str, fragment: str
) -> None:
    with pytest.raises(RequestInvalid) as info:
        prepare_execution(with_example, _echo_request(model))

    assert info.value.field == field
    assert fragment in info.value.reason


def test_an_unknown_provider_is_refused_as_before_with_plugins_loaded(with_example: Any) -> None:
    request = _echo_request({"provider": "oracle"})
    with pytest.raises(RequestInvalid) as plain:
        prepare_execution(build_runtime(), request)
    with pytest.raises(RequestInvalid) as plugged:
        prepare_execution(with_example, request)

    assert plain.value.field == plugged.value.field == "config.model.provider"
    before = "Input tag 'oracle' found using 'provider' does not match any of the expected tags: "
    assert plain.value.reason == before + "'scripted', 'openai', 'anthropic'"
    assert plugged.value.reason == before + "'scripted', 'openai', 'anthropic', 'echo'"


def test_a_plugin_provider_without_its_plugin_is_an_unknown_provider() -> None:
    with pytest.raises(RequestInvalid) as info:
        prepare_execution(build_runtime(), _echo_request({"provider": "echo"}))

    assert info.value.field == "config.model.provider"
    assert "Input tag 'echo'" in info.value.reason


def test_resolve_and_run_with_the_echo_provider_returns_its_answer(with_example: Any) -> None:
    run = resolve_and_run(with_example, _echo_request({"provider": "echo", "prefix": "hi "}, text="how are you"))

    assert run.outcome == Finish(output="hi how are you")
    assert run.rounds == 1
    assert [m.role for m in run.messages] == ["user", "assistant"]


def test_a_plugin_tool_in_a_scripted_turn_is_checked_against_its_args_at_prepare(with_example: Any) -> None:
    turns = [{"tool_calls": [{"name": "word_count", "args": {"text": 5}}]}, {"content": "done"}]
    with pytest.raises(RequestInvalid) as info:
        prepare_execution(with_example, scripted_request(turns, tools=["word_count"]))
    assert info.value.field == "config.model.turns[0].tool_calls[0].args.text"

    turns[0] = {"tool_calls": [{"name": "word_count", "args": {"text": "one two three"}}]}
    run = resolve_and_run(with_example, scripted_request(turns, tools=["word_count"]))
    assert run.outcome == Finish(output="done")
    assert run.messages[2].result == {"words": 3}
