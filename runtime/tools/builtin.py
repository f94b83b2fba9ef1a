"""The built-in tools, for demos and tests."""

from __future__ import annotations

import time

from pydantic import BaseModel, ConfigDict, Field, field_validator

from runtime.context import durable_local_read_context
from runtime.tools.base import Handler, Tool, ToolEffect, ToolRegistry
from runtime.tools.calls import LocalFile, ToolContext, ToolOutput
from schema.wire.json import JsonObject
from schema.wire.vocab import ToolDomain

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


def _text_blob(args: TextBlobArgs, ctx: ToolContext) -> JsonObject:
    """Text of about ``size_bytes`` UTF-8 bytes (whole characters; ``char`` may be multi-byte)."""
    return {"text": args.char * (args.size_bytes // len(args.char.encode()))}


def _echo(args: EchoArgs, ctx: ToolContext) -> JsonObject:
    return args.model_dump()


def _add(args: AddArgs, ctx: ToolContext) -> JsonObject:
    return {"sum": args.a + args.b}


def _sleep(args: SleepArgs, ctx: ToolContext) -> JsonObject:
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


def _read_files(args: ReadFilesArgs, ctx: ToolContext) -> ToolOutput:
    """A durable local read: the first execution suspends until the client delivers the
    files. The stored result is only a proof placeholder per file; the model's context
    shows the bodies, joined in from the durable store."""
    files = ctx.read(args.paths)
    placeholder: JsonObject = {"files": [durable_local_read_placeholder(f) for f in files]}
    return ToolOutput(
        result=placeholder, context=durable_local_read_context(placeholder, {f.path: f.content for f in files})
    )


def durable_local_read_placeholder(file: LocalFile) -> JsonObject:
    return {"path": file.path, "status": "received", "digest": file.digest, "size_bytes": file.size_bytes}


class PathArgs(_Strict):
    path: str = Field(min_length=1)


def _count_words(args: PathArgs, ctx: ToolContext) -> JsonObject:
    """A server-side (SDK) tool whose input is a file on the user's machine: it suspends
    on a local-read prerequisite, and is re-run once the file is delivered."""
    (file,) = ctx.read([args.path])
    return {
        "path": file.path,
        "lines": len(file.content.splitlines()),
        "words": len(file.content.split()),
        "bytes": file.size_bytes,
    }


class KeyArgs(_Strict):
    key: str = Field(min_length=1, max_length=200)


def _await_prerequisite(args: KeyArgs, ctx: ToolContext) -> JsonObject:
    """Waits until the client resolves ``key`` (e.g. a human approval), then returns it."""
    return {"key": args.key, "value": ctx.prerequisite(args.key)}


def _pure(name: str, description: str, args: type[BaseModel], domain: ToolDomain, handler: Handler) -> Tool:
    """Every built-in tool changes nothing anywhere: re-running one is harmless."""
    return Tool.of_model(name, description, args, domain, handler, effect=ToolEffect.READ_ONLY)


BUILTIN_TOOLS = (
    _pure("echo", "Return the arguments unchanged.", EchoArgs, ToolDomain.SDK, _echo),
    _pure("add", "Add two numbers a and b.", AddArgs, ToolDomain.SDK, _add),
    _pure("sleep", "Sleep for `seconds` seconds, then return.", SleepArgs, ToolDomain.SDK, _sleep),
    _pure("text_blob", "Return a text of `size_bytes` bytes made of `char`.", TextBlobArgs, ToolDomain.SDK, _text_blob),
    # Stands for a tool that runs on the end user's machine (domain `local`) and answers
    # at once; such tools have their own failure budget and never trip the breaker.
    _pure("local_echo", "Return the arguments, from the user's machine.", EchoArgs, ToolDomain.LOCAL, _echo),
    _pure("read_files", "Read files from the user's machine.", ReadFilesArgs, ToolDomain.LOCAL, _read_files),
    _pure("count_words", "Count lines and words of a file on the user's machine.", PathArgs, ToolDomain.SDK,
          _count_words),
    _pure("await_prerequisite", "Wait until `key` is resolved, then return its value.", KeyArgs, ToolDomain.SDK,
          _await_prerequisite),
)


def builtin_registry() -> ToolRegistry:
    return ToolRegistry(BUILTIN_TOOLS)
