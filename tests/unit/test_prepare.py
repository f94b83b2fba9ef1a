"""prepare_execution refuses what cannot run, with a precise field; resolve_and_run runs
what can, in memory."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest

from runtime.config import ScriptedModelConfig
from runtime.deps import BaseDeps, Runtime
from runtime.errors import RequestInvalid
from runtime.loop import Finish
from runtime.messages import Message, ToolCall, tool_message, user_message
from runtime.models.scripted import ScriptedModel
from runtime.prepare import prepare_execution, resolve_and_run
from runtime.tools import builtin_registry
from schema.wire import RunRequest
from tests.support.fakes import RecordingFactory
from tests.support.requests import PICK_COLOR, example_request

Mutation = Callable[[dict[str, Any]], None]


def _recording_runtime(providers: tuple[str, ...] = ("scripted",)) -> tuple[Runtime, RecordingFactory]:
    factory = RecordingFactory(ScriptedModel)
    runtime = Runtime(base=BaseDeps(model_providers=dict.fromkeys(providers, factory), tools=builtin_registry()))
    return runtime, factory


def _refusal(mutate: Mutation, runtime: Runtime | None = None) -> tuple[RequestInvalid, RecordingFactory]:
    rt, factory = _recording_runtime()
    raw = example_request()
    mutate(raw)
    with pytest.raises(RequestInvalid) as info:
        prepare_execution(runtime or rt, raw)
    return info.value, factory


def _call0(raw: dict[str, Any]) -> dict[str, Any]:
    return raw["config"]["model"]["turns"][0]["tool_calls"][0]


# --- the happy path ----------------------------------------------------------------------


def test_example_request_is_prepared_without_calling_the_model() -> None:
    runtime, factory = _recording_runtime()
    request, prepared = prepare_execution(runtime, example_request())

    assert isinstance(request, RunRequest)
    assert request.owner == "team-a" and request.root_id is None and request.input == "Add 2 and 3."
    assert prepared.turn_config.policy.max_rounds == 20
    assert list(prepared.deps.tools) == ["add", "echo"]
    assert [s["name"] for s in prepared.deps.tool_specs] == ["add", "echo"]
    assert prepared.deps.system_prompt == "You add numbers."
    # The client is built once from the run's model config, and never called.
    assert len(factory.configs) == 1 and isinstance(factory.configs[0], ScriptedModelConfig)
    assert factory.requests == []


def test_prepare_accepts_an_already_parsed_request() -> None:
    runtime, factory = _recording_runtime()
    parsed = RunRequest.model_validate(example_request())
    request, _ = prepare_execution(runtime, parsed)

    assert request is parsed
    assert factory.requests == []


def test_prepare_accepts_a_root_id() -> None:
    root = uuid.uuid4()
    raw = example_request()
    raw["root_id"] = str(root)
    runtime, _ = _recording_runtime()
    request, _ = prepare_execution(runtime, raw)
    assert request.root_id == root


# --- refusals, each naming the field ----------------------------------------------------------


def _set(path: list[Any], value: Any) -> Mutation:
    def mutate(raw: dict[str, Any]) -> None:
        target = raw
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return mutate


def _drop(path: list[Any]) -> Mutation:
    def mutate(raw: dict[str, Any]) -> None:
        target = raw
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]

    return mutate


REFUSALS: list[tuple[str, Mutation, str, str]] = [
    ("unknown_tool", _set(["config", "tools"], ["nope", "add"]), "config.tools[0]", "unknown tool 'nope'"),
    ("tool_listed_twice", _set(["config", "tools"], ["add", "echo", "add"]), "config.tools[2]", "listed twice"),
    (
        "scripted_call_to_tool_not_enabled",
        _set(["config", "tools"], ["echo"]),
        "config.model.turns[0].tool_calls[0].name",
        "not enabled",
    ),
    (
        "add_arg_of_wrong_type",
        lambda r: _call0(r).update(args={"a": "2", "b": 3}),
        "config.model.turns[0].tool_calls[0].args.a",
        "valid number",
    ),
    (
        "add_bool_arg_is_not_a_number",
        lambda r: _call0(r).update(args={"a": True, "b": 3}),
        "config.model.turns[0].tool_calls[0].args.a",
        "valid number",
    ),
    (
        "add_missing_arg",
        lambda r: _call0(r).update(args={"a": 2}),
        "config.model.turns[0].tool_calls[0].args.b",
        "required",
    ),
    (
        "add_extra_arg",
        lambda r: _call0(r).update(args={"a": 2, "b": 3, "c": 4}),
        "config.model.turns[0].tool_calls[0].args.c",
        "Extra inputs",
    ),
    ("unknown_provider", _set(["config", "model", "provider"], "gpt-magic"), "config.model.provider", "gpt-magic"),
    (
        "turn_with_content_and_tool_calls",
        _set(["config", "model", "turns", 1, "tool_calls"], [{"name": "add", "args": {"a": 1, "b": 1}}]),
        "config.model.turns[1]",
        "exactly one",
    ),
    (
        "turn_with_neither",
        _set(["config", "model", "turns", 1], {"latency_ms": 5}),
        "config.model.turns[1]",
        "exactly one",
    ),
    ("no_turns", _set(["config", "model", "turns"], []), "config.model.turns", "at least 1"),
    (
        "max_rounds_as_string",
        _set(["config", "policy", "max_rounds"], "20"),
        "config.policy.max_rounds",
        "valid integer",
    ),
    (
        "max_rounds_with_a_fraction",
        _set(["config", "policy", "max_rounds"], 20.5),
        "config.policy.max_rounds",
        "valid integer",
    ),
    ("max_rounds_zero", _set(["config", "policy", "max_rounds"], 0), "config.policy.max_rounds", "greater than"),
    (
        "latency_as_string",
        _set(["config", "model", "turns", 1, "latency_ms"], "50"),
        "config.model.turns[1].latency_ms",
        "valid integer",
    ),
    ("extra_top_level_key", _set(["urgency"], 1), "urgency", "Extra inputs"),
    ("priority_above_range", _set(["priority"], 10), "priority", "less than or equal to 9"),
    ("priority_below_range", _set(["priority"], -1), "priority", "greater than or equal to 0"),
    ("extra_config_key", _set(["config", "temperature"], 0.2), "config.temperature", "Extra inputs"),
    (
        "extra_turn_key",
        _set(["config", "model", "turns", 0, "note"], "x"),
        "config.model.turns[0].note",
        "Extra inputs",
    ),
    ("missing_input", _drop(["input"]), "input", "required"),
    ("empty_input", _set(["input"], ""), "input", "at least 1"),
    ("empty_owner", _set(["owner"], ""), "owner", "at least 1"),
    ("owner_with_spaces", _set(["owner"], "team a"), "owner", "pattern"),
    ("missing_config", _drop(["config"]), "config", "required"),
    ("bad_root_id", _set(["root_id"], "not-a-uuid"), "root_id", "UUID"),
    ("tools_not_a_list", _set(["config", "tools"], "add"), "config.tools", "valid list"),
    (
        "sleep_out_of_range",
        lambda r: (r["config"]["tools"].append("sleep"), _call0(r).update(name="sleep", args={"seconds": 7200})),
        "config.model.turns[0].tool_calls[0].args.seconds",
        "less than or equal",
    ),
]


@pytest.mark.parametrize(("mutate", "field", "fragment"), [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS])
def test_invalid_request_is_refused_naming_the_field(mutate: Mutation, field: str, fragment: str) -> None:
    error, factory = _refusal(mutate)

    assert error.field == field
    assert fragment in error.reason
    assert error.code == "REQUEST_INVALID"
    assert str(error).startswith(f"{field}: ")
    # Refused before a model client is even built, let alone called.
    assert factory.configs == []
    assert factory.requests == []


def test_a_whole_number_sent_as_a_float_is_an_integer() -> None:
    # JSON Schema (and so the OpenAPI document) calls 20.0 an integer; a fraction is refused above.
    raw = example_request()
    raw["config"]["policy"]["max_rounds"] = 20.0
    raw["config"]["model"]["turns"][0]["latency_ms"] = 5.0

    _, prepared = prepare_execution(_recording_runtime()[0], raw)

    assert prepared.turn_config.policy.max_rounds == 20 and isinstance(prepared.turn_config.policy.max_rounds, int)
    assert prepared.turn_config.model.turns[0].latency_ms == 5  # type: ignore[union-attr]


def test_unknown_tool_is_refused_naming_the_field_and_the_known_tools() -> None:
    error, _ = _refusal(_set(["config", "tools"], ["add", "web_search"]))

    assert error.field == "config.tools[1]"
    assert "known: add, await_prerequisite, count_words, echo, local_echo, read_files, sleep, text_blob" in error.reason


def test_provider_not_registered_in_the_runtime_is_refused_naming_the_field() -> None:
    runtime, factory = _recording_runtime(providers=("other",))
    error, _ = _refusal(lambda r: None, runtime=runtime)

    assert error.field == "config.model.provider"
    assert "unknown model provider 'scripted'" in error.reason
    assert factory.configs == [] and factory.requests == []


def test_missing_provider_is_refused_naming_the_provider_field() -> None:
    # Every other missing required value is reported at its own path (``input``,
    # ``...args.b``); the missing discriminator is reported as ``config.model``.
    error, _ = _refusal(_drop(["config", "model", "provider"]))

    assert error.field == "config.model.provider"


@pytest.mark.parametrize(
    "bad_value",
    [float("nan"), float("inf"), "\ud800"],
    ids=["nan", "infinity", "lone_surrogate"],
)
def test_scripted_args_that_cannot_be_canonicalized_are_refused(bad_value: Any) -> None:
    # json.loads accepts NaN / Infinity / "\ud800"; echo takes any args. A request that
    # passes preparation must be runnable, but these crash drive_react_loop (canonical_json
    # raises) on the first digest of the assistant message.
    error, _ = _refusal(lambda r: _call0(r).update(name="echo", args={"x": bad_value}))

    assert error.field.startswith("config.model.turns[0].tool_calls[0].args")


# --- client tools: checked at submit time ------------------------------------------------------


def _with_client_tools(*specs: dict[str, Any]) -> Mutation:
    return _set(["config", "client_tools"], [dict(s) for s in specs])


def _calling_pick_color(args: dict[str, Any]) -> Mutation:
    def mutate(raw: dict[str, Any]) -> None:
        raw["config"]["client_tools"] = [dict(PICK_COLOR)]
        _call0(raw).update(name="pick_color", args=args)

    return mutate


CLIENT_TOOL_REFUSALS: list[tuple[str, Mutation, str, str]] = [
    (
        "schema_not_valid",
        _with_client_tools({**PICK_COLOR, "parameters": {"type": "object", "properties": {"hint": {"type": "strin"}}}}),
        "config.client_tools[0].parameters",
        "is not a valid JSON Schema",
    ),
    (
        "schema_not_an_object",
        _with_client_tools({**PICK_COLOR, "parameters": {"type": "string"}}),
        "config.client_tools[0].parameters",
        "must describe an object",
    ),
    (
        "names_not_unique",
        _with_client_tools(PICK_COLOR, {**PICK_COLOR, "description": "again"}),
        "config.client_tools",
        "client tool names must be unique: pick_color given twice",
    ),
    (
        "name_of_a_server_tool",
        _with_client_tools({**PICK_COLOR, "name": "add"}),
        "config.client_tools[0].name",
        "'add' is the name of a server tool",
    ),
    (
        "name_no_provider_accepts",
        _with_client_tools({**PICK_COLOR, "name": "pick color"}),
        "config.client_tools[0].name",
        "pattern",
    ),
    (
        "unknown_key",
        _with_client_tools({**PICK_COLOR, "returns": {"type": "string"}}),
        "config.client_tools[0].returns",
        "Extra inputs",
    ),
    (
        "scripted_call_against_its_schema",
        _calling_pick_color({"hint": 3}),
        "config.model.turns[0].tool_calls[0].args.hint",
        "is not of type 'string'",
    ),
]


@pytest.mark.parametrize(
    ("mutate", "field", "fragment"), [r[1:] for r in CLIENT_TOOL_REFUSALS], ids=[r[0] for r in CLIENT_TOOL_REFUSALS]
)
def test_a_client_tool_that_cannot_run_is_refused_at_submit_naming_the_field(
    mutate: Mutation, field: str, fragment: str
) -> None:
    error, factory = _refusal(mutate)

    assert (error.code, error.field) == ("REQUEST_INVALID", field)
    assert fragment in error.reason, error.reason
    assert factory.configs == [] and factory.requests == []


def test_a_client_tool_is_offered_to_the_model_like_any_tool_with_its_own_schema() -> None:
    raw = example_request()
    _calling_pick_color({"hint": "warm"})(raw)

    _, prepared = prepare_execution(_recording_runtime()[0], raw)

    assert [s["name"] for s in prepared.deps.tool_specs] == ["add", "echo", "pick_color"]
    spec = prepared.deps.tool_specs[-1]
    assert (spec["description"], spec["parameters"]) == (PICK_COLOR["description"], PICK_COLOR["parameters"])
    assert spec["domain"] == "local"  # it runs on the client's side: never counted by the breaker


# --- resolve_and_run ---------------------------------------------------------------------------


def test_example_request_finishes_with_output_5_in_2_rounds() -> None:
    runtime, factory = _recording_runtime()
    run = resolve_and_run(runtime, example_request())

    assert run.outcome == Finish(output="5")
    assert run.rounds == 2
    assert [r.round_index for r in factory.requests] == [0, 1]


def test_example_request_transcript_matches() -> None:
    runtime, _ = _recording_runtime()
    run = resolve_and_run(runtime, example_request())

    call = ToolCall("call_0_0", "add", {"a": 2, "b": 3})
    assert run.messages == (
        user_message("Add 2 and 3."),
        Message(role="assistant", tool_calls=(call,)),
        tool_message(call, {"sum": 5.0}),
        Message(role="assistant", content="5"),
    )
    assert [m.to_json() for m in run.messages] == [
        {"role": "user", "content": "Add 2 and 3."},
        {"role": "assistant", "tool_calls": [{"id": "call_0_0", "name": "add", "args": {"a": 2, "b": 3}}]},
        {"role": "tool", "tool_call_id": "call_0_0", "name": "add", "result": {"sum": 5.0}},
        {"role": "assistant", "content": "5"},
    ]


def test_resolve_and_run_refuses_before_running() -> None:
    runtime, factory = _recording_runtime()
    raw = example_request()
    raw["config"]["tools"] = ["echo"]

    with pytest.raises(RequestInvalid):
        resolve_and_run(runtime, raw)
    assert factory.requests == []


def test_resolve_and_run_stops_at_max_rounds() -> None:
    runtime, factory = _recording_runtime()
    raw = example_request()
    tool_turns = [{"tool_calls": [{"name": "echo", "args": {"n": n}}]} for n in range(5)]
    raw["config"]["model"]["turns"] = [*tool_turns, {"content": "never"}]
    raw["config"]["policy"]["max_rounds"] = 3
    run = resolve_and_run(runtime, raw)

    assert run.outcome.kind == "fail"
    assert run.outcome.error_code == "MAX_ROUNDS_EXCEEDED"  # type: ignore[union-attr]
    assert run.rounds == 3
    assert len(factory.requests) == 3
