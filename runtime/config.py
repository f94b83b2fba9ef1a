"""TurnConfig: what one run asks for (model, system prompt, tools, policy), parsed
strictly from the run request's ``config`` object."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# The only provider this issue ships; real providers join this union later.
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
    """

    max_rounds: int = Field(default=20, ge=1, le=10_000)
    repeated_tool_call_limit: int = Field(default=REPEATED_TOOL_CALL_LIMIT, ge=2, le=1_000)
    max_tool_output_bytes: int = Field(default=MAX_TOOL_OUTPUT_BYTES, ge=256, le=10_000_000)


class ScriptedToolCall(_Frozen):
    name: str = Field(min_length=1)
    args: dict[str, Any] = Field(default_factory=dict)


class ScriptedTurn(_Frozen):
    """One model response: either tool calls or final content, optionally delayed by
    ``latency_ms`` to reproduce a real provider's I/O wait."""

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


ModelConfig = Annotated[ScriptedModelConfig, Field(discriminator="provider")]


class TurnConfig(_Frozen):
    model: ModelConfig
    system_prompt: str = Field(default="", max_length=200_000)
    tools: list[str] = Field(default_factory=list, max_length=128)
    policy: Policy = Field(default_factory=Policy)
