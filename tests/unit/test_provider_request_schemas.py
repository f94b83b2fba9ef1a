"""The request bodies the adapters send, validated against the published schemas: OpenAI's
``CreateChatCompletionRequest`` from its official OpenAPI document (vendored under
tests/support/schemas/, see its README) and the ``anthropic`` SDK's typed request params."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from anthropic.types.message_create_params import MessageCreateParamsNonStreaming
from pydantic import TypeAdapter, ValidationError

from runtime.config import AnthropicModelConfig, OpenAIModelConfig
from runtime.models.anthropic import SAMPLING, messages_request_body
from runtime.models.openai_compat import chat_request_body
from tests.support.provider_clients import ADD_SPEC, ECHO_SPEC
from tests.support.provider_clients import OPENAI_PARALLEL as PARALLEL
from tests.support.provider_clients import model_request as request

SCHEMA_FILE = Path(__file__).parents[1] / "support/schemas/openai_create_chat_completion_request.json"
SCHEMA = json.loads(SCHEMA_FILE.read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)


def declared_properties(name: str) -> set[str]:
    """Every property ``name`` declares, through its allOf parts."""
    schema = SCHEMA["components"]["schemas"][name]
    out = set(schema.get("properties", {}))
    for part in schema.get("allOf", []):
        if "$ref" in part:
            out |= declared_properties(part["$ref"].split("/")[-1])
        out |= set(part.get("properties", {}))
    return out


def openai_body(**config: Any) -> dict[str, Any]:
    cfg = OpenAIModelConfig.model_validate({"provider": "openai", "name": "gpt-4o-mini", **config})
    return chat_request_body(cfg, request(PARALLEL, tools=(ADD_SPEC, ECHO_SPEC)))


@pytest.mark.parametrize(
    "config",
    [{}, {"max_completion_tokens": 256, "temperature": 0.5}, {"max_tokens": 64, "legacy_max_tokens": True}],
    ids=["plain", "limits", "legacy"],
)
def test_openai_request_bodies_validate_against_create_chat_completion_request(config: dict[str, Any]) -> None:
    body = openai_body(**config)
    errors = [e.message for e in VALIDATOR.iter_errors(body)]
    assert errors == []
    assert set(body) <= declared_properties("CreateChatCompletionRequest")
    assert {m["role"] for m in body["messages"]} == {"system", "user", "assistant", "tool"}


def test_the_vendored_schema_refuses_a_wrong_body() -> None:
    body = openai_body()
    body["messages"].append({"role": "tool", "content": "no tool_call_id"})
    assert list(VALIDATOR.iter_errors(body))
    assert "max_output_tokens" not in declared_properties("CreateChatCompletionRequest")


ANTHROPIC_PARAMS = TypeAdapter(MessageCreateParamsNonStreaming)


def consume(value: Any) -> None:
    """Walk a validated value, draining pydantic's lazy iterable validators (raising
    their errors)."""
    if isinstance(value, dict):
        for item in value.values():
            consume(item)
    elif isinstance(value, (list, tuple)) or hasattr(value, "__next__"):
        for item in value:
            consume(item)


def anthropic_valid(body: dict[str, Any]) -> None:
    """Validate against the SDK's TypedDict (its iterables are validated lazily: consumed
    here), and refuse keys it does not declare."""
    typed = {k: v for k, v in body.items() if k not in SAMPLING}
    consume(ANTHROPIC_PARAMS.validate_python(typed))
    assert set(typed) <= set(MessageCreateParamsNonStreaming.__annotations__) | {"stream"}


def test_anthropic_request_bodies_validate_against_the_sdk_params() -> None:
    cfg = AnthropicModelConfig(provider="anthropic", name="claude-test", max_tokens=512, temperature=0.3)
    body = messages_request_body(cfg, request(PARALLEL, tools=(ADD_SPEC, ECHO_SPEC)))
    anthropic_valid(body)
    assert body["temperature"] == 0.3  # sent outside the typed params (runtime.models.anthropic)


def test_the_sdk_params_refuse_a_wrong_body() -> None:
    cfg = AnthropicModelConfig(provider="anthropic", name="claude-test")
    body = messages_request_body(cfg, request(PARALLEL))
    body["messages"][0]["content"] = [{"type": "tool_result"}]  # no tool_use_id
    with pytest.raises(ValidationError):
        anthropic_valid(body)
