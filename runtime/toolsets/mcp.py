"""MCP servers as toolsets: each configured server's tools become tools of this process,
named ``mcp__<server>__<tool>``, with the server's own JSON schemas, in the ``plugin``
domain.

Three modules: ``mcp_config`` (the shapes of ``AIDAWORK_MCP_SERVERS``; light, the
settings import it), this one (the pure part: a tool's name and effect, what a call's
result becomes) and ``mcp_sessions`` (the sessions, on a background event loop). Only
``mcp_sessions`` imports the SDK at run time: importing it costs about a second, which a
process without MCP servers should not pay.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from runtime.errors import ToolFailed
from runtime.tools.base import MAX_ERROR_MESSAGE, Handler, Tool, ToolEffect, check_parameters_schema
from runtime.toolsets.mcp_config import McpServerConfig
from schema.wire.errors import ErrorCode
from schema.wire.json import JsonValue
from schema.wire.vocab import ToolDomain

if TYPE_CHECKING:
    from mcp.types import CallToolResult, ToolAnnotations
    from mcp.types import Tool as McpTool

# What the model providers accept as a function name; a server tool whose full name does
# not fit is left out (with a warning) rather than renamed, so a name always means one tool.
TOOL_NAME_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"
TOOL_PREFIX = "mcp__"
MCP_SERVER_UNAVAILABLE = ErrorCode.MCP_SERVER_UNAVAILABLE
MCP_TOOL_ERROR = ErrorCode.MCP_TOOL_ERROR


class McpServerUnavailable(ToolFailed):
    """Raised by an MCP tool's handler when its server cannot be reached (not started,
    gone, or its session broke during the call); the model sees a failed result."""

    code = MCP_SERVER_UNAVAILABLE
    retryable = True


class McpToolError(ToolFailed):
    """Raised by an MCP tool's handler when the server answered the call with an error
    (a result with ``isError``, or a protocol error such as invalid params)."""

    code = MCP_TOOL_ERROR


# --- a server's tools as tools of this process -----------------------------------------


def tool_name(server: str, tool: str) -> str:
    return f"{TOOL_PREFIX}{server}__{tool}"


def effect_for(annotations: ToolAnnotations | None, configured: str | None = None) -> ToolEffect:
    """The operator's ``effects`` entry if there is one; else the server's hints
    (``readOnlyHint`` -> read_only, ``idempotentHint`` -> idempotent); else the safe
    ``at_most_once``. Hints are the server's claims: configure an effect for a server you
    do not trust."""
    if configured is not None:
        return ToolEffect(configured)
    if annotations is not None and annotations.read_only_hint:
        return ToolEffect.READ_ONLY
    if annotations is not None and annotations.idempotent_hint:
        return ToolEffect.IDEMPOTENT
    return ToolEffect.AT_MOST_ONCE


def tool_of(server: str, config: McpServerConfig, spec: McpTool, handler: Handler) -> Tool | str:
    """The tool ``spec`` of ``server`` as a ``Tool`` calling ``handler``, or why it cannot
    be one (its name is too long or not a valid function name, or its schema is unusable)."""
    name = tool_name(server, spec.name)
    if not re.fullmatch(TOOL_NAME_PATTERN, name):
        return f"its name {name[:80]!r} does not match {TOOL_NAME_PATTERN}"
    problem = check_parameters_schema(spec.input_schema)
    if problem is not None:
        return f"its input schema {problem}"
    return Tool(
        name=name,
        description=spec.description or (spec.annotations.title if spec.annotations else None) or spec.title or "",
        parameters=dict(spec.input_schema),
        domain=ToolDomain.PLUGIN,
        handler=handler,
        effect=effect_for(spec.annotations, config.effects.get(spec.name)),
        timeout_s=config.timeout_s,
    )


def result_json(server: str, result: CallToolResult) -> JsonValue:
    """What a call returned, as the tool's result: its ``structuredContent`` if it has
    one, else its text contents joined (a JSON string; other content is named, not
    inlined). A result with ``isError`` is an ``McpToolError`` with that text."""
    if result.is_error:
        text = _text(result) or "the tool reported an error and gave no text"
        raise McpToolError(f"MCP server {server!r}: {text}"[:MAX_ERROR_MESSAGE])
    if result.structured_content is not None:
        structured: JsonValue = result.structured_content
        return structured
    return _text(result)


def _text(result: CallToolResult) -> str:
    parts: list[str] = []
    for block in result.content:
        text: object = getattr(block, "text", None)
        if block.type == "text" and isinstance(text, str):
            parts.append(text)
        else:
            mime = getattr(block, "mime_type", None)
            parts.append(f"[{block.type} content{' ' + mime if isinstance(mime, str) else ''} omitted]")
    return "\n".join(parts)
