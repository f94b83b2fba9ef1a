"""TurnConfig: what one run asks for (model, system prompt, tools, policy), parsed
strictly from the run request's ``config`` object."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Annotated, Any, Literal, Union
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, create_model, field_validator, model_validator

from runtime.tools.base import check_parameters_schema
from schema.wire.json import JsonObject, JsonObjectField, JsonValue

MAX_SCRIPT_TURNS = 10_000


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


REPEATED_TOOL_CALL_LIMIT = 3
MAX_TOOL_OUTPUT_BYTES = 16_384


class Policy(_Frozen):
    """Per-run limits.

    - ``max_rounds``: model calls in the run; a run still calling tools after that fails
      with ``MAX_ROUNDS_EXCEEDED``.
    - ``repeated_tool_call_limit``: that many consecutive, fully identical tool rounds
      (same tools, args and results) end the run with ``REPEATED_IDENTICAL_TOOL_CALL``.
    - ``max_tool_output_bytes``: a tool output longer than this (UTF-8 bytes of its JSON)
      is truncated in the model's context only; storage and events keep all of it.
    - ``context_summarizer``: how a context rebuild summarizes the older messages.
    - ``on_truncation``: an answer cut off by the output token limit fails the run with
      ``MODEL_OUTPUT_TRUNCATED`` (``"fail"``), or the model is asked to continue it, in
      the same round, at most ``MAX_CONTINUATIONS`` times (``"continue"``).
    """

    max_rounds: int = Field(default=20, ge=1, le=10_000)
    repeated_tool_call_limit: int = Field(default=REPEATED_TOOL_CALL_LIMIT, ge=2, le=1_000)
    max_tool_output_bytes: int = Field(default=MAX_TOOL_OUTPUT_BYTES, ge=256, le=10_000_000)
    # Who writes the summary of a context rebuild: the deterministic summarizer, or the
    # run's model with a summarization prompt (recorded in the ledger like any call).
    context_summarizer: Literal["deterministic", "model"] = "deterministic"
    # A model call's time budget, retries included (real providers; the scripted model
    # ignores it).
    model_timeout_s: float = Field(default=120.0, gt=0, le=3600)
    # Tool names (or ``["*"]``) whose calls wait for a person's approval before they run.
    require_approval: list[str] = Field(default_factory=list, max_length=256)
    on_truncation: Literal["fail", "continue"] = "fail"


class ScriptedToolCall(_Frozen):
    name: str = Field(min_length=1)
    args: JsonObjectField = Field(default_factory=dict)


class ScriptedTurn(_Frozen):
    """One model response: either tool calls or final content, optionally delayed by
    ``latency_ms`` to reproduce a real provider's I/O wait."""

    # The JSON schema states ``_exactly_one`` too, so a generated client (or schemathesis)
    # builds only turns this validator accepts: a null counts as absent.
    model_config = ConfigDict(
        json_schema_extra={
            "oneOf": [
                {"required": ["tool_calls"], "properties": {"tool_calls": {"type": "array"}}},
                {"required": ["content"], "properties": {"content": {"type": "string"}}},
            ]
        }
    )

    tool_calls: list[ScriptedToolCall] | None = Field(default=None, min_length=1)
    content: str | None = None
    latency_ms: int = Field(default=0, ge=0, le=600_000)

    @model_validator(mode="after")
    def _exactly_one(self) -> ScriptedTurn:
        if (self.tool_calls is None) == (self.content is None):
            raise ValueError("a turn has exactly one of 'tool_calls' or 'content'")
        return self


class ScriptedModelConfig(_Frozen):
    """The deterministic model. With ``context_limit_tokens`` it rejects (like a real
    provider whose context window is exceeded) any input whose token count, by
    ``Message.token_count`` summed over the messages, is above the limit."""

    provider: Literal["scripted"]
    turns: list[ScriptedTurn] = Field(min_length=1, max_length=MAX_SCRIPT_TURNS)
    context_limit_tokens: int | None = Field(default=None, ge=1, le=10_000_000)


# --- real providers (HTTP): OpenAI-compatible Chat Completions and Anthropic Messages -----
# The request names which configured key to use (``api_key_ref``), never the key itself:
# the run config is stored, shown in events and visible to whoever submits runs.

DEFAULT_KEY_REF = "default"
KEY_REF_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"


def check_base_url(value: str, field: str = "base_url") -> str:
    """An http(s) URL with a host and nothing that could carry a credential (user info,
    a query string), be ignored silently (a fragment) or make two spellings of one URL
    differ (whitespace, control characters): ``?``, ``#``, ``@`` and whitespace are refused
    anywhere, even with nothing after them, so the allowlist compares exactly what is
    called. The value is never echoed; ``field`` is what the messages call it."""
    if any(c.isspace() or not c.isprintable() for c in value) or any(c in value for c in "?#"):
        raise ValueError(
            f"{field} must not contain whitespace, control characters, '?' or '#' (no query string or fragment)"
        )
    try:
        parts = urlsplit(value)
        port_ok = parts.port is None or parts.port > 0
    except ValueError:
        raise ValueError(f"{field} is not a valid URL") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or not port_ok:
        raise ValueError(f"{field} must be an http:// or https:// URL with a host")
    if "@" in parts.netloc or parts.username is not None or parts.password is not None:
        raise ValueError(f"{field} must not contain user info (keys are never sent in a URL)")
    return value


def _unset(name: str) -> JsonObject:
    """JSON schema: ``name`` is absent or null."""
    return {"properties": {name: {"type": "null"}}}


# Model names whose provider refuses sampling parameters, matched whole. Not stated in
# the JSON schema (an if/then on the name made generated clients, schemathesis among
# them, build far fewer valid requests); the refusals have their own tests. OpenAI's
# reasoning models (o1, o3-mini, o4-mini-2025-04-16, gpt-5, gpt-5-nano...) refuse a
# temperature other than the default, some refuse the parameter outright.
OPENAI_REASONING_MODEL = r"o\d+(?:-[a-z0-9-]+)?|gpt-5(?:-mini|-nano|-pro)?(?:-\d{4}-\d{2}-\d{2})?"
# Anthropic's models from Claude Opus 4.7 on (a version 4.7 or higher, or 5 and up, in a
# claude-<family>-<major>[-<minor>] name) refuse temperature and top_p ("deprecated for
# this model"). Older names (claude-3-5-sonnet-..., claude-sonnet-4-5, claude-opus-4-6),
# and names that are not Anthropic's, take them.
ANTHROPIC_NO_SAMPLING_MODEL = r"claude-[a-z]+-(?:4-[7-9]|[5-9](?:-\d)?|[1-9]\d+(?:-\d)?)(?:-[a-z0-9-]*)?"


def _refused_for_models(value: float | None, info: ValidationInfo, models: str, why: str) -> float | None:
    """A sampling field's value, refused (naming the model and the field) when set for a
    model whose name matches ``models``, which the provider would refuse it for."""
    name = info.data.get("name")
    if value is not None and isinstance(name, str) and re.fullmatch(models, name):
        raise ValueError(f"{name} takes no {info.field_name}: {why}")
    return value


class _HttpModelConfig(_Frozen):
    """Shared by the HTTP providers.

    - ``name``: the provider's model name (``gpt-4o-mini``, ``claude-sonnet-4-5``, ``llama3.1``).
    - ``base_url``: where the API lives; http(s) only.
    - ``api_key_ref``: which configured key to send: ``"default"`` (the provider's own,
      ``AIDAWORK_OPENAI_API_KEY`` / ``AIDAWORK_ANTHROPIC_API_KEY``), a name from
      ``AIDAWORK_MODEL_KEYS``, or ``null`` to send no key (a local server). Never a key.
    """

    name: str = Field(min_length=1, max_length=256)
    base_url: str = Field(max_length=2048)
    api_key_ref: str | None = Field(default=DEFAULT_KEY_REF, pattern=KEY_REF_PATTERN)

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        return check_base_url(value)

    @field_validator("api_key_ref")
    @classmethod
    def _a_name_not_a_key(cls, value: str | None) -> str | None:
        if value is not None and value.lower().startswith("sk-"):
            raise ValueError(
                "api_key_ref names a configured key ('default' or a name from AIDAWORK_MODEL_KEYS); "
                "it must never be the key itself"
            )
        return value


class OpenAIModelConfig(_HttpModelConfig):
    """Any OpenAI-compatible Chat Completions API: OpenAI, vLLM, Ollama, LM Studio.

    The output limit is sent as ``max_completion_tokens`` (what o-series and newer models
    require; ``max_tokens`` is deprecated there). ``max_tokens`` is still accepted as the
    same limit; it is sent under its own name only with ``legacy_max_tokens: true``, for
    an OpenAI-compatible server that knows no ``max_completion_tokens``. Set one of the
    two. ``temperature`` is sent only when set, and refused for OpenAI's reasoning models
    (``OPENAI_REASONING_MODEL``: the o-series, ``gpt-5``, ``gpt-5-mini``, ``gpt-5-nano``, ``gpt-5-pro``),
    which refuse any temperature but the default."""

    # ``_one_limit`` as JSON schema: at most one of the two limits is set (not null).
    model_config = ConfigDict(json_schema_extra={"anyOf": [_unset("max_tokens"), _unset("max_completion_tokens")]})

    provider: Literal["openai"]
    base_url: str = Field(default="https://api.openai.com/v1", max_length=2048)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=1_000_000)
    max_tokens: int | None = Field(default=None, ge=1, le=1_000_000)
    legacy_max_tokens: bool = False
    temperature: float | None = Field(default=None, ge=0, le=2)

    @field_validator("temperature")
    @classmethod
    def _no_sampling_for_reasoning_models(cls, value: float | None, info: ValidationInfo) -> float | None:
        return _refused_for_models(
            value, info, OPENAI_REASONING_MODEL, "OpenAI's reasoning models refuse any but the default (leave it unset)"
        )

    @model_validator(mode="after")
    def _one_limit(self) -> OpenAIModelConfig:
        if self.max_tokens is not None and self.max_completion_tokens is not None:
            raise ValueError("max_tokens: set max_completion_tokens or max_tokens, not both")
        return self

    def output_limit(self) -> tuple[str, int] | None:
        """The output limit's parameter name and value, or None to send none."""
        limit = self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
        if limit is None:
            return None
        return ("max_tokens" if self.legacy_max_tokens else "max_completion_tokens", limit)


class AnthropicModelConfig(_HttpModelConfig):
    """The Anthropic Messages API. ``max_tokens`` is required by the API, so it has a
    default that every current model accepts.

    Sampling, refused here when the API would refuse it (a conservative rule): a
    ``temperature`` within 0-1 only, never together with ``top_p`` (newer models refuse
    both at once; set one), and neither for the models that refuse both
    (``ANTHROPIC_NO_SAMPLING_MODEL``: Claude Opus 4.7 and later)."""

    # ``_not_with_top_p`` as JSON schema: at most one of the two is set (not null).
    model_config = ConfigDict(json_schema_extra={"anyOf": [_unset("temperature"), _unset("top_p")]})

    provider: Literal["anthropic"]
    base_url: str = Field(default="https://api.anthropic.com", max_length=2048)
    max_tokens: int = Field(default=4096, ge=1, le=1_000_000)
    top_p: float | None = Field(default=None, ge=0, le=1)
    temperature: float | None = Field(default=None, ge=0, le=1)

    @field_validator("top_p", "temperature")
    @classmethod
    def _sampling_by_model(cls, value: float | None, info: ValidationInfo) -> float | None:
        return _refused_for_models(
            value, info, ANTHROPIC_NO_SAMPLING_MODEL,
            "Anthropic's models from Claude Opus 4.7 on refuse sampling parameters (leave temperature and top_p unset)",
        )

    @field_validator("temperature")
    @classmethod
    def _not_with_top_p(cls, value: float | None, info: ValidationInfo) -> float | None:
        if value is not None and info.data.get("top_p") is not None:
            raise ValueError("set temperature or top_p, not both: Anthropic's newer models refuse the two together")
        return value


ModelConfig = Annotated[ScriptedModelConfig | OpenAIModelConfig | AnthropicModelConfig, Field(discriminator="provider")]


TOOL_NAME_PATTERN = r"^[A-Za-z][A-Za-z0-9_-]{0,63}$"
_JSON_TYPES: list[JsonValue] = ["string", "number", "integer", "boolean", "array", "object", "null"]
_PROPERTY_SHAPE: JsonObject = {
    "type": "object",
    "properties": {"type": {"enum": _JSON_TYPES}, "description": {"type": "string"}},
    "additionalProperties": False,
}
_PARAMETERS_SHAPE: JsonObject = {
    "type": {"const": "object"},
    "properties": {"type": "object", "additionalProperties": _PROPERTY_SHAPE},
    "additionalProperties": {"type": "boolean"},
    "description": {"type": "string"},
}


def _no_parameters() -> JsonObject:
    return {"type": "object", "properties": {}}


class ClientToolSpec(_Frozen):
    """A tool that runs in the upstream service or on the end user's machine: the model
    sees it like any tool, and a call suspends the round until its result is sent back
    (``tool-result``)."""

    name: str = Field(pattern=TOOL_NAME_PATTERN)
    description: str = Field(default="", max_length=10_000)
    parameters: JsonObjectField = Field(
        default_factory=_no_parameters,
        description="a JSON Schema of an object (the call's args); any valid one is accepted, the document "
        "describes the common subset: a type per property",
        json_schema_extra={"properties": _PARAMETERS_SHAPE, "additionalProperties": False},
    )

    @field_validator("parameters")
    @classmethod
    def _a_schema(cls, value: JsonObject) -> JsonObject:
        problem = check_parameters_schema(value)
        if problem is not None:
            raise ValueError(problem)
        return value


class TurnConfig(_Frozen):
    model: ModelConfig
    system_prompt: str = Field(default="", max_length=200_000)
    tools: list[str] = Field(default_factory=list, max_length=128)
    client_tools: list[ClientToolSpec] = Field(default_factory=list, max_length=128)
    policy: Policy = Field(default_factory=Policy)

    @field_validator("client_tools")
    @classmethod
    def _distinct_names(cls, value: list[ClientToolSpec]) -> list[ClientToolSpec]:
        names = [t.name for t in value]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"client tool names must be unique: {', '.join(twice)} given twice")
        return value


def turn_config_with(providers: Sequence[type[BaseModel]]) -> type[TurnConfig]:
    """``TurnConfig`` whose ``model`` may also be one of plugins' provider configs (each
    with its own ``provider: Literal[...]`` tag), validated at submit time like the
    built-ins."""
    if not providers:
        return TurnConfig
    members: tuple[type[BaseModel], ...] = (ScriptedModelConfig, OpenAIModelConfig, AnthropicModelConfig, *providers)
    union: Any = Union.__getitem__(members)  # built at run time: mypy has no type form for it
    return create_model("TurnConfig", __base__=TurnConfig, model=(union, Field(discriminator="provider")))
