"""The conversation as the model sees it: messages and tool calls.

Plain frozen dataclasses rather than pydantic models: a warm round appends a handful of
these and a cold one loads hundreds, so they stay cheap. ``to_json`` / ``from_json`` are
the stored form (the ``messages.body`` column).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from runtime.canonical import canonical_json, object_of, objects_at, str_at
from schema.wire.json import JsonMapping, JsonObject, JsonValue
from schema.wire.vocab import MessageRole

Role = MessageRole


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    args: JsonObject

    def to_json(self) -> JsonObject:
        return {"id": self.id, "name": self.name, "args": self.args}


@dataclass(frozen=True)
class Message:
    role: Role
    content: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None
    # Set on tool messages: the structured result as the tool returned it, and whether the
    # call failed (so a provider that has the notion is told: Anthropic's ``is_error``).
    result: JsonValue = None
    is_error: bool = False

    def to_json(self) -> JsonObject:
        body: JsonObject = {"role": self.role}
        if self.content is not None:
            body["content"] = self.content
        if self.tool_calls:
            body["tool_calls"] = [c.to_json() for c in self.tool_calls]
        if self.tool_call_id is not None:
            body["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            body["name"] = self.name
        if self.result is not None:
            body["result"] = self.result
        if self.is_error:
            body["is_error"] = True
        return body

    @classmethod
    def from_json(cls, body: JsonMapping) -> Message:
        return cls(
            role=MessageRole(str(body["role"])),
            content=str_at(body, "content"),
            tool_calls=tool_calls_of(body),
            tool_call_id=str_at(body, "tool_call_id"),
            name=str_at(body, "name"),
            result=body.get("result"),
            is_error=body.get("is_error") is True,
        )

    @cached_property
    def token_count(self) -> int:
        """Deterministic token estimate: one token per 4 characters of the canonical body,
        rounded up. Documented so that scripted context limits are reproducible."""
        return (len(canonical_json(self.to_json())) + 3) // 4


def tool_calls_of(body: JsonMapping) -> tuple[ToolCall, ...]:
    """The ``tool_calls`` a ``to_json`` body holds (``ToolCall.to_json`` each)."""
    calls = objects_at(body, "tool_calls")
    return tuple(ToolCall(id=str(c["id"]), name=str(c["name"]), args=object_of(c["args"])) for c in calls)


def user_message(text: str) -> Message:
    return Message(role=MessageRole.USER, content=text)


def tool_message(call: ToolCall, result: JsonValue, *, is_error: bool = False) -> Message:
    # The result is stored once, structured; adapters render it for their provider.
    return Message(role=MessageRole.TOOL, tool_call_id=call.id, name=call.name, result=result, is_error=is_error)
