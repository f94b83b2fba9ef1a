"""A tool: a name, the JSON schema of its args (what the model sees), a domain, an effect
and a handler (what a handler is given, ``ToolContext``, and may return are in
``runtime.tools.calls``); the registry of a process's tools.

A tool's args are validated either by a pydantic model (built-in tools and ``@tool``
functions) or by a JSON schema (MCP tools, client tools). A handler gets the validated
args and a ``ToolContext``; it may be sync or ``async``. A tool's exception becomes a
``failed`` result the model sees, never a crashed round.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, TypedDict, Unpack

from jsonschema import Draft202012Validator
from jsonschema import SchemaError as InvalidSchema
from jsonschema import ValidationError as SchemaError
from pydantic import BaseModel, ValidationError

from runtime.errors import AidaworkError, ToolFailed
from runtime.tools.calls import (
    NeedsInput,
    ToolContext,
    ToolOutcome,
)
from schema.wire.errors import ErrorCode
from schema.wire.json import JsonMapping, JsonObject
from schema.wire.retry import RetryPolicy, backoff_s
from schema.wire.vocab import ToolDomain


class ToolEffect(StrEnum):
    """What running a tool twice does. ``read_only`` and ``idempotent`` calls are simply
    re-run after a crash; an ``at_most_once`` call is never started twice without an
    operator's say (its start is recorded before the handler runs)."""

    READ_ONLY = "read_only"
    IDEMPOTENT = "idempotent"
    AT_MOST_ONCE = "at_most_once"


TOOL_BACKOFF = RetryPolicy(base_s=0.2, cap_s=5.0)


@dataclass(frozen=True)
class ToolRetry:
    """A handler's retries as data: ``attempts`` counts the first try; only exceptions of
    the ``retry_on`` types are retried, after the system's one backoff."""

    attempts: int = 1
    retry_on: tuple[type[BaseException], ...] = ()
    backoff: RetryPolicy = field(default_factory=lambda: TOOL_BACKOFF)


NO_RETRY = ToolRetry()
TOOL_ARGS_INVALID = ErrorCode.TOOL_ARGS_INVALID
TOOL_ERROR = ErrorCode.TOOL_ERROR
TOOL_TIMEOUT = ErrorCode.TOOL_TIMEOUT
MAX_ERROR_MESSAGE = 2000
# Handlers with a timeout run here, so the round can stop waiting for one (a thread cannot
# be stopped: it finishes in the background and its result is dropped).
_TIMED = concurrent.futures.ThreadPoolExecutor(max_workers=64, thread_name_prefix="aidawork-tool")


class ToolArgsInvalid(Exception):
    """Args that do not match the tool's schema; ``loc`` is where (keys and indexes)."""

    def __init__(self, loc: Sequence[str | int], message: str) -> None:
        self.loc = tuple(loc)
        self.path = ".".join(str(p) for p in self.loc)
        self.message = message
        super().__init__(f"{self.path}: {message}")


class ToolTimedOut(Exception):
    """The call did not end in time, or its end was lost: it may have run (the message
    says why, when it is not the tool's timeout)."""


# A handler takes the args as its tool parses them (``Tool.parse_args``: an instance of its
# ``args_model``, whichever model that is, or a dict) and returns the result: a JSON value
# or a ``ToolOutput``, or an awaitable of one. ``run_tool`` checks what it returns.
Handler = Callable[[Any, ToolContext], object]
Verify = Handler
ToolArgs = BaseModel | JsonObject


class ToolOptions(TypedDict, total=False):
    """The optional fields of a ``Tool``, as ``Tool.of_model`` takes them."""

    effect: ToolEffect
    timeout_s: float | None
    retry: ToolRetry
    verify: Verify | None


@dataclass(frozen=True)
class Tool:
    """``handler(args, ctx)`` gets the args validated by ``args_model`` (a model instance)
    or by ``parameters`` (a dict) when there is no model. ``verify(args, ctx)``, for an
    ``at_most_once`` tool, tells what an execution whose end was not recorded did: its
    result, or ``None`` when it cannot tell."""

    name: str
    description: str
    parameters: JsonObject
    domain: ToolDomain
    handler: Handler
    effect: ToolEffect = ToolEffect.IDEMPOTENT
    args_model: type[BaseModel] | None = None
    timeout_s: float | None = None
    retry: ToolRetry = NO_RETRY
    verify: Verify | None = None

    @classmethod
    def of_model(
        cls,
        name: str,
        description: str,
        args_model: type[BaseModel],
        domain: ToolDomain,
        handler: Handler,
        **kw: Unpack[ToolOptions],
    ) -> Tool:
        return cls(name, description, args_model.model_json_schema(), domain, handler, args_model=args_model, **kw)

    def spec(self) -> JsonObject:
        """What the model is shown: name, description and the JSON schema of the args."""
        return {"name": self.name, "description": self.description, "parameters": self.parameters,
                "domain": str(self.domain)}

    def parse_args(self, args: JsonMapping, *, strict: bool = False) -> ToolArgs:
        """The args as the handler takes them, or ``ToolArgsInvalid`` naming the field."""
        if self.args_model is not None:
            try:
                return self.args_model.model_validate(dict(args), strict=strict)
            except ValidationError as exc:
                err = exc.errors()[0]
                raise ToolArgsInvalid(err["loc"], err["msg"]) from None
        error = next(iter(Draft202012Validator(self.parameters).iter_errors(dict(args))), None)
        if error is not None:
            raise ToolArgsInvalid(list(error.absolute_path), _schema_message(error))
        return dict(args)

    def run(self, args: ToolArgs, ctx: ToolContext) -> ToolOutcome:
        """Run the handler on parsed ``args``, with the tool's timeout and retries. A
        failure the model should see (a ``ToolFailed``, any other exception, a timeout) is a
        ``failed`` outcome; missing input is a ``suspended`` one. A timeout raises
        ``ToolTimedOut`` for an ``at_most_once`` tool: whether it happened is unknown."""
        attempt = 1
        while True:
            try:
                return ToolOutcome.completed(self._call(self.handler, args, ctx))
            except NeedsInput as need:
                return ToolOutcome.suspended(need.suspension)
            except ToolFailed as exc:
                return ToolOutcome.failed(exc.code, exc.message)
            except ToolTimedOut:
                if self.effect == ToolEffect.AT_MOST_ONCE:
                    raise
                return ToolOutcome.failed(TOOL_TIMEOUT, f"the tool did not finish within {self.timeout_s} s")
            except Exception as exc:
                if attempt < self.retry.attempts and isinstance(exc, self.retry.retry_on):
                    time.sleep(min(backoff_s(attempt, self.retry.backoff), ctx.remaining_s()))
                    attempt += 1
                    ctx = _with_attempt(ctx, ctx.attempt + 1)
                    continue
                return ToolOutcome.failed(TOOL_ERROR, f"{type(exc).__name__}: {exc}"[:MAX_ERROR_MESSAGE])

    def check(self, args: ToolArgs, ctx: ToolContext) -> object:
        """The ``verify`` hook's answer (None: it cannot tell, or there is no hook)."""
        if self.verify is None:
            return None
        try:
            return self._call(self.verify, args, ctx)
        except Exception:
            return None

    def _call(self, fn: Handler, args: ToolArgs, ctx: ToolContext) -> object:
        if self.timeout_s is None:
            return _finish(fn(args, ctx))
        future = _TIMED.submit(lambda: _finish(fn(args, ctx)))
        try:
            return future.result(timeout=self.timeout_s)
        except concurrent.futures.TimeoutError:
            raise ToolTimedOut() from None


def _finish(value: object) -> object:
    """An ``async`` handler's coroutine run to its end (the calling thread has no loop)."""
    if inspect.isawaitable(value):
        awaitable = value

        async def wait() -> object:
            return await awaitable

        return asyncio.run(wait())
    return value


def _with_attempt(ctx: ToolContext, attempt: int) -> ToolContext:
    return replace(ctx, attempt=attempt)


def _schema_message(error: SchemaError | InvalidSchema) -> str:
    return str(error.message)[:500]


def check_parameters_schema(schema: object) -> str | None:
    """Why ``schema`` is not a usable JSON schema of a tool's args (an object schema), or None."""
    if not isinstance(schema, dict):
        return "must be a JSON Schema object"
    try:
        Draft202012Validator.check_schema(schema)
    except InvalidSchema as exc:  # what check_schema raises (not a ValidationError)
        return f"is not a valid JSON Schema: {_schema_message(exc)}"
    if schema.get("type", "object") != "object":
        return "must describe an object (\"type\": \"object\")"
    return None


class ToolsetUnavailable(AidaworkError):
    """A tool comes from a source (an MCP server) that could not be reached, so it is not
    known yet. Not the run's fault: its round is tried again later."""

    code = ErrorCode.TOOLSET_UNAVAILABLE
    retryable = True


# Called with a tool name the registry does not have: the tools a source could list now
# (maybe none), or ToolsetUnavailable when the name is a source's whose tools are unknown.
ToolResolver = Callable[[str], Iterable["Tool"]]


class ToolRegistry:
    """Every tool this process can run, by name. A ``resolver`` is asked about names not
    registered (an MCP server unreachable at start may be reachable now)."""

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        self._resolvers: list[ToolResolver] = []
        for tool in tools:
            self.register(tool)

    def add_resolver(self, resolver: ToolResolver) -> None:
        self._resolvers.append(resolver)

    def register(self, tool: Tool) -> None:
        if tool.name in self._tools:
            raise ValueError(f"tool {tool.name!r} is registered twice")
        self._tools[tool.name] = tool

    def get(self, name: str) -> Tool | None:
        tool = self._tools.get(name)
        if tool is None and self._resolvers:
            for resolver in self._resolvers:
                for found in resolver(name):
                    self._tools.setdefault(found.name, found)
            tool = self._tools.get(name)
        return tool

    def names(self) -> list[str]:
        return sorted(self._tools)
