"""The preparation boundary shared by execution and by durable admission.

``prepare_execution`` validates a run request completely (shape, config, provider,
tools, and a scripted model's tool calls against the tools' args models) and composes
the run's deps. It never calls the model. The submit path calls it, so a request that
cannot run is refused before anything is stored or queued.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from uuid import UUID

from pydantic import ValidationError

from runtime.agents import apply_overrides, blamed_on_overrides
from runtime.canonical import join_path, require_json
from runtime.config import ScriptedModelConfig, TurnConfig
from runtime.deps import OrchestratorDeps, Runtime, client_tool, compose_deps
from runtime.errors import RequestInvalid
from runtime.loop import InProcessRun, orchestrate
from runtime.state import RunState
from runtime.tools import ToolArgsInvalid
from schema.wire import RunRequest
from schema.wire.agents import AgentView
from schema.wire.json import JsonMapping

# Finds ``owner``'s saved agent by reference (``NAME`` or ``NAME@VERSION``), or raises
# (the store's ``AgentNotFound``): the submit path passes the store's lookup.
AgentLookup = Callable[[str, str], AgentView]


@dataclass(frozen=True)
class PreparedExecution:
    turn_config: TurnConfig
    deps: OrchestratorDeps
    # The saved agent's NAME@VERSION when the request named one.
    agent: str | None = None


def format_loc(loc: Sequence[int | str], prefix: str = "") -> str:
    out = prefix
    for part in loc:
        out = join_path(out, part)
    return out


def invalid_from(exc: ValidationError, prefix: str = "") -> RequestInvalid:
    """The first error of a pydantic ``ValidationError`` as a ``RequestInvalid``."""
    err = exc.errors()[0]
    loc = list(err["loc"])
    if err["type"] in ("union_tag_invalid", "union_tag_not_found"):
        loc.append("provider")
    # A discriminated union puts the tag in the path (model.scripted.turns); drop it (a
    # plugin's provider tag too: the segment after ``model`` is never a field name).
    tag_error = err["type"] in ("union_tag_invalid", "union_tag_not_found")
    if len(loc) >= 2 and loc[0] == "model" and isinstance(loc[1], str) and not tag_error:
        del loc[1]
    return RequestInvalid(format_loc(loc, prefix), err["msg"])


# Floats in this range are exact integers; beyond it a float is kept as sent.
_EXACT_FLOAT_INTS = 2**53


def integral_numbers(value: object) -> object:
    """``value`` with each float that is a whole number (``496.0``) as an int: JSON has one
    number type and JSON Schema calls 496.0 an integer, so a config field of type integer
    takes it (the models are strict: they refuse a string or a boolean for an int)."""
    if isinstance(value, float) and value.is_integer() and abs(value) <= _EXACT_FLOAT_INTS:
        return int(value)
    if isinstance(value, Mapping):
        return {k: integral_numbers(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [integral_numbers(v) for v in value]
    return value


def parse_turn_config(config: JsonMapping, model: type[TurnConfig] = TurnConfig) -> TurnConfig:
    try:
        return model.model_validate(integral_numbers(dict(config)))
    except ValidationError as exc:
        raise invalid_from(exc, "config") from None


def prepare_turn(runtime: Runtime, config: JsonMapping, owner: str) -> PreparedExecution:
    """The run's config checked against what this process has (providers, tools, and the
    keys and base URLs ``owner`` may use), and its deps composed."""
    turn_config = parse_turn_config(config, runtime.base.turn_config)
    registry = runtime.base.tools
    if turn_config.model.provider not in runtime.base.model_providers:
        raise RequestInvalid("config.model.provider", f"unknown model provider {turn_config.model.provider!r}")
    seen: set[str] = set()
    for i, name in enumerate(turn_config.tools):
        if registry.get(name) is None:
            known = ", ".join(registry.names())
            raise RequestInvalid(f"config.tools[{i}]", f"unknown tool {name!r} (known: {known})")
        if name in seen:
            raise RequestInvalid(f"config.tools[{i}]", f"tool {name!r} is listed twice")
        seen.add(name)
    for i, spec in enumerate(turn_config.client_tools):
        if registry.get(spec.name) is not None:
            raise RequestInvalid(
                f"config.client_tools[{i}].name", f"{spec.name!r} is the name of a server tool; pick another"
            )
    if isinstance(turn_config.model, ScriptedModelConfig):
        _check_script(runtime, turn_config)
    return PreparedExecution(turn_config=turn_config, deps=compose_deps(runtime, turn_config, owner))


def _check_script(runtime: Runtime, turn_config: TurnConfig) -> None:
    assert isinstance(turn_config.model, ScriptedModelConfig)
    enabled = set(turn_config.tools) | {t.name for t in turn_config.client_tools}
    tools = {**{n: runtime.base.tools.get(n) for n in turn_config.tools},
             **{t.name: client_tool(t) for t in turn_config.client_tools}}
    for t, turn in enumerate(turn_config.model.turns):
        for c, call in enumerate(turn.tool_calls or ()):
            where = f"config.model.turns[{t}].tool_calls[{c}]"
            if call.name not in enabled:
                raise RequestInvalid(f"{where}.name", f"tool {call.name!r} is not enabled in config.tools")
            tool = tools.get(call.name)
            assert tool is not None
            try:
                tool.parse_args(call.args, strict=True)
            except ToolArgsInvalid as exc:
                raise RequestInvalid(format_loc(exc.loc, f"{where}.args"), exc.message) from None


def parse_request(raw: object) -> RunRequest:
    """The run request, or ``RequestInvalid`` naming the field: anything ``json_problem``
    refuses (NaN, Infinity, NUL, unpaired surrogates, too deep, too many digits) is refused
    here, before pydantic (whose serializer stops at 255 levels) or a store sees it."""
    if isinstance(raw, RunRequest):
        # Its fields, not model_dump(): dumping a config nested too deep is what fails.
        require_json({"owner": raw.owner, "input": raw.input, "config": raw.config, "overrides": raw.overrides}, "")
        return raw
    if not isinstance(raw, Mapping):
        raise RequestInvalid("request", f"must be a JSON object, not {_json_type(raw)}")
    fields = dict(raw)
    _check_config_or_agent(fields)
    if isinstance(fields.get("root_id"), UUID):  # a Python caller may pass the id itself
        fields["root_id"] = str(fields["root_id"])
    require_json(fields, "")
    try:
        return RunRequest.model_validate(fields)
    except ValidationError as exc:
        raise invalid_from(exc) from None


def _check_config_or_agent(fields: Mapping[str, object]) -> None:
    """The rule of ``RunRequest._config_or_agent``, with the field to name."""
    config, agent = fields.get("config"), fields.get("agent")
    if config is None and agent is None:
        raise RequestInvalid("config", "required: send config, or agent (the name of a saved agent)")
    if config is not None and agent is not None:
        raise RequestInvalid("agent", "send config or agent, not both")
    if fields.get("overrides") is not None and agent is None:
        raise RequestInvalid("overrides", "only with agent (a run with its own config sends the whole config)")


def _json_type(value: object) -> str:
    names = {type(None): "null", bool: "a boolean", str: "a string", list: "an array", tuple: "an array"}
    if isinstance(value, int | float) and not isinstance(value, bool):
        return "a number"
    return names.get(type(value), f"a {type(value).__name__}")


def prepare_execution(
    runtime: Runtime, raw: Mapping[str, object] | RunRequest, agents: AgentLookup | None = None
) -> tuple[RunRequest, PreparedExecution]:
    """Validate a whole run request; returns it parsed, with the run's composed deps. A
    request naming a saved agent is resolved through ``agents`` to the agent's config with
    the request's overrides, then validated exactly like a config sent whole."""
    request = parse_request(raw)
    if request.agent is None:
        assert request.config is not None, "parse_request: config or agent"
        return request, prepare_turn(runtime, request.config, request.owner)
    if agents is None:
        raise RequestInvalid("agent", "saved agents need the run store: submit through worker.client or the API")
    agent = agents(request.owner, request.agent)
    try:
        prepared = prepare_turn(runtime, apply_overrides(agent, request.overrides), request.owner)
    except RequestInvalid as exc:
        raise blamed_on_overrides(exc, request.overrides) from None
    return request, PreparedExecution(prepared.turn_config, prepared.deps, agent=agent.ref)


def resolve_and_run(runtime: Runtime, raw: Mapping[str, object] | RunRequest) -> InProcessRun:
    """Prepare, then ``orchestrate`` every round in this process with no persistence."""
    request, prepared = prepare_execution(runtime, raw)
    return orchestrate(prepared.deps, RunState.start(request.input))
