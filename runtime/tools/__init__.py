"""Tools: what a run may call. Write your own with ``@tool`` (``runtime.tools.define``);
the registry is built once per process from the built-ins and the plugins, and a run
enables a subset (plus its own client-side tools)."""

from runtime.tools.base import (
    NO_RETRY,
    TOOL_ARGS_INVALID,
    TOOL_ERROR,
    TOOL_TIMEOUT,
    Tool,
    ToolArgsInvalid,
    ToolEffect,
    ToolRegistry,
    ToolRetry,
    ToolsetUnavailable,
    ToolTimedOut,
    check_parameters_schema,
)
from runtime.tools.builtin import BUILTIN_TOOLS, builtin_registry, durable_local_read_placeholder
from runtime.tools.calls import (
    NO_INPUTS,
    LocalFile,
    NeedsInput,
    PriorExecution,
    ToolAnswer,
    ToolContext,
    ToolInputs,
    ToolOutcome,
    ToolOutput,
    ToolSuspension,
)
from runtime.tools.define import tool

__all__ = [
    "BUILTIN_TOOLS",
    "NO_INPUTS",
    "NO_RETRY",
    "TOOL_ARGS_INVALID",
    "TOOL_ERROR",
    "TOOL_TIMEOUT",
    "LocalFile",
    "NeedsInput",
    "PriorExecution",
    "Tool",
    "ToolAnswer",
    "ToolArgsInvalid",
    "ToolContext",
    "ToolEffect",
    "ToolInputs",
    "ToolOutcome",
    "ToolOutput",
    "ToolRegistry",
    "ToolRetry",
    "ToolSuspension",
    "ToolTimedOut",
    "ToolsetUnavailable",
    "builtin_registry",
    "check_parameters_schema",
    "durable_local_read_placeholder",
    "tool",
]
