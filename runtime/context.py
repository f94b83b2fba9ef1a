"""Building the model's context from stored messages.

``slim_tool_results_for_next_round`` gives the *context form* of a message: a tool
output longer than the policy's limit is cut, in the model's context only, to a prefix
that ends on a whole UTF-8 character, followed by an explicit marker. The stored
message, the tool invocation row and the event stream keep the full output. Outputs of
``read_files`` and image results are never cut. Deterministic: the same message and
limit always give the same context form (and so the same context digest).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from runtime.canonical import canonical_json, chain_digest, objects_at
from runtime.messages import Message
from schema.wire.claim import LoadedMessage
from schema.wire.json import JsonObject, JsonValue
from schema.wire.vocab import MessageRole

SLIM_EXEMPT_TOOLS = frozenset({"read_files"})


def is_image_result(result: JsonValue) -> bool:
    if isinstance(result, dict):
        kind = result.get("type")
        mime = result.get("mime_type")
        return kind == "image" or (isinstance(mime, str) and mime.startswith("image/"))
    if isinstance(result, list) and result:
        return all(is_image_result(item) for item in result)
    return False


def truncate_utf8(text: str, max_bytes: int) -> tuple[str, int]:
    """The longest prefix of ``text`` whose UTF-8 encoding fits ``max_bytes`` (never
    ending inside a character), and the number of bytes cut."""
    encoded = text.encode()
    if len(encoded) <= max_bytes:
        return text, 0
    prefix = encoded[:max_bytes].decode("utf-8", errors="ignore")
    return prefix, len(encoded) - len(prefix.encode())


def slim_tool_results_for_next_round(message: Message, max_output_bytes: int) -> Message:
    if message.role != "tool" or message.name in SLIM_EXEMPT_TOOLS or is_image_result(message.result):
        return message
    text = message.result if isinstance(message.result, str) else canonical_json(message.result)
    kept, cut = truncate_utf8(text, max_output_bytes)
    if not cut:
        return message
    total = len(text.encode())
    marker = (
        f"\n[output truncated for the model context: showing the first {total - cut} of {total} bytes, "
        f"{cut} bytes cut. The full output is stored with tool_call_id {message.tool_call_id} "
        f"(tool_invocations, and the run's tool_completed event).]"
    )
    return Message(role=MessageRole.TOOL, tool_call_id=message.tool_call_id, name=message.name, content=kept + marker,
                   is_error=message.is_error)


def durable_local_read_context(placeholder: JsonValue, contents: Mapping[str, str]) -> JsonObject:
    """The model's view of a durable local read: the stored placeholder (path, status,
    digest) joined with the delivered bodies from the durable store."""
    files = objects_at(placeholder, "files") if isinstance(placeholder, dict) else []
    return {"files": [_file_context(f, contents) for f in files]}


def _file_context(file: JsonObject, contents: Mapping[str, str]) -> JsonObject:
    path = file["path"]
    return {"path": path, "digest": file["digest"], "content": contents.get(path) if isinstance(path, str) else None}


def context_form(message: Message, max_output_bytes: int, durable_reads: Mapping[str, str] | None = None) -> Message:
    """A stored message as the model's context shows it."""
    if durable_reads is not None and message.role == "tool":
        message = Message(
            role=MessageRole.TOOL,
            tool_call_id=message.tool_call_id,
            name=message.name,
            result=durable_local_read_context(message.result, durable_reads),
            is_error=message.is_error,
        )
    return slim_tool_results_for_next_round(message, max_output_bytes)


def context_chain(messages: Iterable[Message], start: str = "") -> str:
    """The chain digest of a context (as the model sees it), from ``start``."""
    current = start
    for message in messages:
        current = chain_digest(current, message.to_json())
    return current


def loaded_context(
    stored: Iterable[LoadedMessage], max_output_bytes: int, start: str = ""
) -> tuple[tuple[Message, ...], str]:
    """Stored messages (``messages.body`` with their durable reads) in context form, and
    the context's chain digest extended over them from ``start``: what a round's
    ``messages_digest`` is. The worker builds each round's context with this, and the
    inspector rebuilds a past round's context with it to check the stored digest, so the
    two can never drift apart."""
    loaded = tuple(context_form(Message.from_json(m.body), max_output_bytes, m.reads) for m in stored)
    return loaded, context_chain(loaded, start)
