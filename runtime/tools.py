"""Tools: a name, a pydantic args model (its JSON schema is what the model sees), a
domain, and a handler. The registry is built once per process; a run enables a subset."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from runtime.canonical import JSON
from runtime.context import durable_local_read_context
from runtime.errors import ToolFailed
from schema.wire.vocab import ToolDomain, ToolStatus

# --- suspension: a tool that needs input the worker does not have ------------------------


@dataclass(frozen=True)
class ToolSuspension:
    """What a suspended tool call waits for: files from the end user's machine
    (``local_read`` with ``paths``) or a prerequisite resolved by the client (``key``)."""

    kind: Literal["local_read", "prerequisite"]
    paths: tuple[str, ...] = ()
    key: str | None = None

    def to_json(self) -> dict[str, Any]:
        if self.kind == "local_read":
            return {"kind": self.kind, "paths": list(self.paths)}
        return {"kind": self.kind, "key": self.key}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ToolSuspension:
        return cls(kind=data["kind"], paths=tuple(data.get("paths", ())), key=data.get("key"))


class NeedsInput(Exception):
    """Raised inside a handler by ``ToolInputs`` when the input is not there yet."""

    def __init__(self, suspension: ToolSuspension) -> None:
        super().__init__(suspension.kind)
        self.suspension = suspension


@dataclass(frozen=True)
class LocalFile:
    path: str
    content: str
    digest: str
    size_bytes: int


@dataclass(frozen=True)
class ToolInputs:
    """Inputs delivered for one tool call (durable local reads) and for its run
    (resolved prerequisites). Empty on a call's first execution."""

    files: Mapping[str, LocalFile] = field(default_factory=dict)
    prerequisites: Mapping[str, JSON] = field(default_factory=dict)

    def read(self, paths: Sequence[str]) -> list[LocalFile]:
        """The delivered files, or suspend the call until they are delivered."""
        if not paths or any(p not in self.files for p in paths):
            raise NeedsInput(ToolSuspension("local_read", paths=tuple(paths)))
        return [self.files[p] for p in paths]

    def prerequisite(self, key: str) -> JSON:
        if key not in self.prerequisites:
            raise NeedsInput(ToolSuspension("prerequisite", key=key))
        return self.prerequisites[key]


NO_INPUTS = ToolInputs()


@dataclass(frozen=True)
class ToolOutput:
    """A result whose model-context form differs from what is stored: a durable local
    read stores a placeholder, and the model sees the file bodies."""

    result: JSON
    context: JSON


@dataclass(frozen=True)
class ToolOutcome:
    status: ToolStatus
    result: JSON  # what is stored (None while suspended)
    context: JSON  # what the model's context shows
    suspension: ToolSuspension | None = None


ToolHandler = Callable[[Any, ToolInputs], JSON | ToolOutput]


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

    def run(self, args: Mapping[str, Any], inputs: ToolInputs = NO_INPUTS) -> ToolOutcome:
        """Run the tool. A failure the model should see (bad args, a ``ToolFailed``) is a
        ``failed`` outcome, not an exception; missing input is a ``suspended`` one."""
        try:
            parsed = self.parse_args(args)
        except ValidationError as exc:
            return _failed("TOOL_ARGS_INVALID", _first_error(exc))
        try:
            output = self.handler(parsed, inputs)
        except ToolFailed as exc:
            return _failed(exc.code, exc.message)
        except NeedsInput as need:
            return ToolOutcome(ToolStatus.SUSPENDED, None, None, need.suspension)
        if isinstance(output, ToolOutput):
            return ToolOutcome(ToolStatus.COMPLETED, output.result, output.context)
        return ToolOutcome(ToolStatus.COMPLETED, output, output)


def _failed(code: str, message: str) -> ToolOutcome:
    result = {"error": {"code": code, "message": message}}
    return ToolOutcome(ToolStatus.FAILED, result, result)


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


def _text_blob(args: TextBlobArgs, inputs: ToolInputs) -> JSON:
    """Text of about ``size_bytes`` UTF-8 bytes (whole characters; ``char`` may be multi-byte)."""
    return {"text": args.char * (args.size_bytes // len(args.char.encode()))}


def _echo(args: EchoArgs, inputs: ToolInputs) -> JSON:
    return args.model_dump()


def _add(args: AddArgs, inputs: ToolInputs) -> JSON:
    return {"sum": args.a + args.b}


def _sleep(args: SleepArgs, inputs: ToolInputs) -> JSON:
    time.sleep(args.seconds)
    return {"slept_s": args.seconds}


class ReadFilesArgs(_Strict):
    paths: list[str] = Field(min_length=1, max_length=32)

    @field_validator("paths")
    @classmethod
    def _distinct(cls, paths: list[str]) -> list[str]:
        if len(set(paths)) != len(paths):
            raise ValueError("paths must be distinct")
        return paths


def _read_files(args: ReadFilesArgs, inputs: ToolInputs) -> ToolOutput:
    """A durable local read: the first execution suspends until the client delivers the
    files. The stored result is only a proof placeholder per file; the model's context
    shows the bodies, joined in from the durable store."""
    files = inputs.read(args.paths)
    placeholder = {"files": [durable_local_read_placeholder(f) for f in files]}
    return ToolOutput(
        result=placeholder, context=durable_local_read_context(placeholder, {f.path: f.content for f in files})
    )


def durable_local_read_placeholder(file: LocalFile) -> dict[str, Any]:
    return {"path": file.path, "status": "received", "digest": file.digest, "size_bytes": file.size_bytes}


class PathArgs(_Strict):
    path: str = Field(min_length=1)


def _count_words(args: PathArgs, inputs: ToolInputs) -> JSON:
    """A server-side (SDK) tool whose input is a file on the user's machine: it suspends
    on a local-read prerequisite, and is re-run once the file is delivered."""
    (file,) = inputs.read([args.path])
    return {
        "path": file.path,
        "lines": len(file.content.splitlines()),
        "words": len(file.content.split()),
        "bytes": file.size_bytes,
    }


class KeyArgs(_Strict):
    key: str = Field(min_length=1, max_length=200)


def _await_prerequisite(args: KeyArgs, inputs: ToolInputs) -> JSON:
    """Waits until the client resolves ``key`` (e.g. a human approval), then returns it."""
    return {"key": args.key, "value": inputs.prerequisite(args.key)}


BUILTIN_TOOLS = (
    Tool("echo", "Return the arguments unchanged.", EchoArgs, ToolDomain.SDK, _echo),
    Tool("add", "Add two numbers a and b.", AddArgs, ToolDomain.SDK, _add),
    Tool("sleep", "Sleep for `seconds` seconds, then return.", SleepArgs, ToolDomain.SDK, _sleep),
    Tool("text_blob", "Return a text of `size_bytes` bytes made of `char`.", TextBlobArgs, ToolDomain.SDK, _text_blob),
    # Stands for a tool that runs on the end user's machine (domain `local`) and answers
    # at once; such tools have their own failure budget and never trip the breaker.
    Tool("local_echo", "Return the arguments, from the user's machine.", EchoArgs, ToolDomain.LOCAL, _echo),
    Tool("read_files", "Read files from the user's machine.", ReadFilesArgs, ToolDomain.LOCAL, _read_files),
    Tool(
        "count_words", "Count lines and words of a file on the user's machine.", PathArgs, ToolDomain.SDK, _count_words
    ),
    Tool(
        "await_prerequisite",
        "Wait until `key` is resolved, then return its value.",
        KeyArgs,
        ToolDomain.SDK,
        _await_prerequisite,
    ),
)


def builtin_registry() -> ToolRegistry:
    return ToolRegistry(BUILTIN_TOOLS)
