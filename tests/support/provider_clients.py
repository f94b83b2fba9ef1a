"""The SDK adapters built for tests against a loopback provider (``tests.support.providers``),
with a fixed key and fast retries, and one model request builder."""

from __future__ import annotations

from typing import Any

from pydantic import SecretStr

from runtime.config import AnthropicModelConfig, OpenAIModelConfig
from runtime.context import context_chain
from runtime.messages import Message, ToolCall, tool_message, user_message
from runtime.models.anthropic import AnthropicModel, AnthropicProvider
from runtime.models.base import ModelRequest
from runtime.models.keys import ModelKeys
from runtime.models.openai_compat import OpenAICompatModel, OpenAIProvider
from runtime.tools import builtin_registry
from schema.wire.retry import RetryPolicy

ANTHROPIC_KEY = "sk-ant-test-key"
OPENAI_KEY = "sk-test-openai-key"
FAST_RETRY = RetryPolicy(max_attempts=4, base_s=0.01, cap_s=0.05)


def anthropic_client(base_url: str, *, key_ref: str | None = "default", **config: Any) -> AnthropicModel:
    keys = ModelKeys(anthropic=SecretStr(ANTHROPIC_KEY), base_urls=(base_url,))
    cfg = AnthropicModelConfig.model_validate(
        {"provider": "anthropic", "name": "claude-test", "base_url": base_url, "api_key_ref": key_ref, **config}
    )
    return AnthropicProvider(keys, retry=FAST_RETRY)(cfg, "team-a")


def openai_client(
    base_url: str, *, key_ref: str | None = "default", retry: RetryPolicy = FAST_RETRY, **config: Any
) -> OpenAICompatModel:
    keys = ModelKeys(openai=SecretStr(OPENAI_KEY), base_urls=(base_url,))
    cfg = OpenAIModelConfig.model_validate(
        {"provider": "openai", "name": "gpt-test", "base_url": base_url, "api_key_ref": key_ref, **config}
    )
    return OpenAIProvider(keys, retry=retry)(cfg, "team-a")


def model_request(
    messages: tuple[Message, ...] = (user_message("hi"),),
    *,
    system: str = "You add.",
    tools: tuple[dict[str, Any], ...] = (),
    timeout_s: float = 10.0,
    round_index: int = 0,
) -> ModelRequest:
    return ModelRequest(
        system=system,
        messages=messages,
        tools=tools,
        messages_digest=context_chain(messages),
        round_index=round_index,
        timeout_s=timeout_s,
    )


ADD_SPEC = builtin_registry().get("add").spec()  # type: ignore[union-attr]
ECHO_SPEC = builtin_registry().get("echo").spec()  # type: ignore[union-attr]

# A conversation with a parallel tool round: two calls, two results (one slimmed).
OPENAI_PARALLEL = (
    user_message("Add 2 and 3, and echo x."),
    Message(
        role="assistant",
        content="Doing both.",
        tool_calls=(
            ToolCall("call_a", "add", {"a": 2, "b": 3}),
            ToolCall("call_b", "echo", {"x": "é", "n": [1, 2]}),
        ),
    ),
    tool_message(ToolCall("call_a", "add", {"a": 2, "b": 3}), {"sum": 5}),
    Message(role="tool", tool_call_id="call_b", name="echo", content='{"x":"é"...[output truncated]'),
)
