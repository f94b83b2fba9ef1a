"""Tools: a name, a pydantic args model (its JSON schema is what the model sees), a
domain, and a handler. The registry is built once per process; a run enables a subset."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from runtime.canonical import JSON
from runtime.errors import ToolFailed


class ToolDomain(StrEnum):
    SDK = "sdk"
    LOCAL = "local"
    DESKTOP = "desktop"
    PLUGIN = "plugin"


ToolHandler = Callable[[Any], JSON]


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    args_model: type[BaseModel]
    domain: ToolDomain
    handler: ToolHandler

    def spec(self) -> dict[str, Any]:
        """What the model is shown: name, description and the JSON schema of the args."""
        return {
            "name": self.name,
            "description": self.description,
            "parameters": self.args_model.model_json_schema(),
            "domain": str(self.domain),
        }

    def parse_args(self, args: Mapping[str, Any], *, strict: bool = False) -> BaseModel:
        return self.args_model.model_validate(dict(args), strict=strict)

    def run(self, args: Mapping[str, Any]) -> tuple[str, JSON]:
        """Run the tool; returns ``(status, result)``. A failure the model should see
        (bad args, a ``ToolFailed``) is a ``failed`` result, not an exception."""
        try:
            parsed = self.parse_args(args)
        except ValidationError as exc:
            return "failed", {"error": {"code": "TOOL_ARGS_INVALID", "message": _first_error(exc)}}
        try:
            return "completed", self.handler(parsed)
        except ToolFailed as exc:
            return "failed", {"error": {"code": exc.code, "message": exc.message}}


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "args"
    return f"{where}: {err['msg']}"


class ToolRegistry:
    """Every tool this process can run, by name."""

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for tool in tools:
            self.register(tool)

    def register(self, tool: Tool) -> None:
        if tool.name in self._tools:
            raise ValueError(f"tool {tool.name!r} is registered twice")
        self._tools[tool.name] = tool

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def names(self) -> list[str]:
        return sorted(self._tools)


# --- built-in tools for demos and tests ------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EchoArgs(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)


class AddArgs(_Strict):
    a: float
    b: float


class SleepArgs(_Strict):
    seconds: float = Field(ge=0, le=3600)


class TextBlobArgs(_Strict):
    size_bytes: int = Field(ge=0, le=8_000_000)
    char: str = Field(default="x", min_length=1, max_length=1)


def _text_blob(args: TextBlobArgs) -> JSON:
    """Text of about ``size_bytes`` UTF-8 bytes (whole characters; ``char`` may be multi-byte)."""
    return {"text": args.char * (args.size_bytes // len(args.char.encode()))}


def _echo(args: EchoArgs) -> JSON:
    return args.model_dump()


def _add(args: AddArgs) -> JSON:
    return {"sum": args.a + args.b}


def _sleep(args: SleepArgs) -> JSON:
    time.sleep(args.seconds)
    return {"slept_s": args.seconds}


BUILTIN_TOOLS = (
    Tool("echo", "Return the arguments unchanged.", EchoArgs, ToolDomain.SDK, _echo),
    Tool("add", "Add two numbers a and b.", AddArgs, ToolDomain.SDK, _add),
    Tool("sleep", "Sleep for `seconds` seconds, then return.", SleepArgs, ToolDomain.SDK, _sleep),
    Tool("text_blob", "Return a text of `size_bytes` bytes made of `char`.", TextBlobArgs, ToolDomain.SDK, _text_blob),
    # Stands for a tool that runs on the end user's machine (domain `local`) and answers
    # at once; such tools have their own failure budget and never trip the breaker.
    Tool("local_echo", "Return the arguments, from the user's machine.", EchoArgs, ToolDomain.LOCAL, _echo),
)


def builtin_registry() -> ToolRegistry:
    return ToolRegistry(BUILTIN_TOOLS)
