"""The model interface every provider implements.

Synchronous on purpose: a worker runs rounds on Celery's threads pool, so a provider
call blocks its own thread only, and many rounds wait on I/O at once in one process.
Adapters raise the typed errors of ``runtime.errors`` (``ModelUnavailable`` is
retryable, ``ModelInputRejection`` means the context is too long).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from runtime.canonical import digest, str_at
from runtime.messages import Message, ToolCall, tool_calls_of
from schema.wire.json import JsonMapping, JsonObject
from schema.wire.vocab import MessageRole


@dataclass(frozen=True)
class ModelRequest:
    system: str
    messages: tuple[Message, ...]
    tools: tuple[JsonObject, ...]
    # Chain digest of ``messages``, maintained incrementally by the caller.
    messages_digest: str
    # Which round of the run this call serves (0-based); the same on a re-executed round.
    round_index: int
    timeout_s: float = 120.0
    # Where a streaming model hands each piece of its text as it arrives (live only, never
    # stored; not part of any digest or proof). None: the caller wants the response only.
    on_delta: Callable[[str], None] | None = None
    # Summed ``Message.token_count`` of ``messages`` when the caller keeps it (a run's
    # state does); None: counted from the messages.
    known_message_tokens: int | None = None

    def message_tokens(self) -> int:
        if self.known_message_tokens is not None:
            return self.known_message_tokens
        return sum(m.token_count for m in self.messages)


@dataclass(frozen=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0


@dataclass(frozen=True)
class ModelResponse:
    content: str | None
    tool_calls: tuple[ToolCall, ...] = ()
    usage: Usage = field(default_factory=Usage)
    # How the provider said the answer ended (its own word: ``stop``, ``length``,
    # ``end_turn``, ``max_tokens``, ``pause_turn``...); None when it did not say (the
    # scripted model). Part of ``to_json`` (and so of the digest) only when set.
    finish_reason: str | None = None
    # The provider's id of the response and the model that answered (which may differ
    # from the one asked for: an alias, a dated version); reported on traces only, so
    # neither is part of ``to_json``, the digest or equality (a streamed answer may lack them).
    response_id: str | None = field(default=None, compare=False)
    response_model: str | None = field(default=None, compare=False)

    def to_json(self) -> JsonObject:
        body: JsonObject = {"content": self.content, "tool_calls": [c.to_json() for c in self.tool_calls]}
        if self.finish_reason is not None:
            body["finish_reason"] = self.finish_reason
        return body

    @classmethod
    def from_json(cls, body: JsonMapping) -> ModelResponse:
        """The response ``to_json`` stored (the model-call ledger keeps it), with the same
        digest; usage is not part of it (the call's usage is on its ledger row)."""
        return cls(
            content=str_at(body, "content"),
            tool_calls=tool_calls_of(body),
            finish_reason=str_at(body, "finish_reason"),
        )

    def digest(self) -> str:
        return digest(self.to_json())

    def as_message(self) -> Message:
        return Message(role=MessageRole.ASSISTANT, content=self.content, tool_calls=self.tool_calls)


def reported_str(value: object) -> str | None:
    """A provider's id or model name as reported, when it is a non-empty string (bounded:
    a trace attribute, not a place for whatever a broken server sends)."""
    return value[:256] if isinstance(value, str) and value else None


class ModelClient(Protocol):
    """One call, one response. Implementations must be safe to call from many threads."""

    def complete(self, request: ModelRequest) -> ModelResponse: ...


# Builds one run's model client from its model config and the run's owner (whose keys the
# client may use). The config is the provider's own model (``ScriptedModelConfig``, a
# plugin's): a factory takes that one, so the parameter cannot be narrower than ``Any``.
ModelFactory = Callable[[Any, str], ModelClient]
