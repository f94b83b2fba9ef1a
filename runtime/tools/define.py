"""``@tool``: a plain (sync or ``async``) function as a tool. Its args schema comes from
its type hints (a pydantic model is built from them), its description from its docstring;
a parameter annotated ``ToolContext`` receives the call's context.

    from runtime.tools import tool, ToolContext

    @tool(effect="at_most_once")          # domain defaults to "sdk"
    def refund(order_id: str, amount_cents: int, ctx: ToolContext) -> dict:
        \"\"\"Refund an order.\"\"\"
        return payments.refund(order_id, amount_cents, idempotency_key=ctx.idempotency_key)
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import Any, get_type_hints, overload

from pydantic import BaseModel, ConfigDict, create_model

from runtime.tools.base import NO_RETRY, Handler, Tool, ToolEffect, ToolRetry
from runtime.tools.calls import ToolContext
from schema.wire.vocab import ToolDomain

NAME_PATTERN = r"^[A-Za-z][A-Za-z0-9_-]{0,63}$"
# A function made a tool (or its verify hook): any parameters its type hints describe, and
# a result ``run_tool`` checks.
ToolFunction = Callable[..., object]


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


@overload
def tool(fn: ToolFunction, /) -> Tool: ...


@overload
def tool(
    *,
    name: str | None = None,
    effect: str = ToolEffect.AT_MOST_ONCE,
    domain: str = ToolDomain.SDK,
    timeout_s: float | None = None,
    retry: ToolRetry = NO_RETRY,
    verify: ToolFunction | None = None,
    description: str | None = None,
) -> Callable[[ToolFunction], Tool]: ...


def tool(
    fn: ToolFunction | None = None,
    /,
    *,
    name: str | None = None,
    effect: str = ToolEffect.AT_MOST_ONCE,
    domain: str = ToolDomain.SDK,
    timeout_s: float | None = None,
    retry: ToolRetry = NO_RETRY,
    verify: ToolFunction | None = None,
    description: str | None = None,
) -> Tool | Callable[[ToolFunction], Tool]:
    """Make ``fn`` a ``Tool``. ``effect`` says what running it twice does and defaults to
    the safe ``at_most_once``; declare ``read_only`` or ``idempotent`` when true.
    ``verify`` (taking the tool's parameters, or some of them) tells, after a crash, what
    an execution of an ``at_most_once`` call did: its result, or ``None`` if it cannot
    tell. ``name`` must be what providers accept as a function name."""

    def make(fn: ToolFunction) -> Tool:
        tool_name = fn.__name__ if name is None else name
        # What the providers accept as a function name (and a run's client tools too).
        if not re.fullmatch(NAME_PATTERN, tool_name):
            raise ValueError(f"tool name {tool_name!r} must match {NAME_PATTERN}")
        args_model, ctx_param = _signature_model(fn)
        check = None
        if verify is not None:
            # A hook that cannot take the call's args would fail every time, and a failing
            # hook reads as "cannot tell": refuse it here instead.
            verify_model, verify_ctx = _signature_model(verify)
            unknown = sorted(set(verify_model.model_fields) - set(args_model.model_fields))
            if unknown:
                raise TypeError(f"tool {tool_name}: verify takes {', '.join(unknown)}, which the tool does not")
            check = _handler(verify, tuple(verify_model.model_fields), verify_ctx)

        return Tool.of_model(
            tool_name,
            description or inspect.getdoc(fn) or "",
            args_model,
            ToolDomain(domain),
            _handler(fn, tuple(args_model.model_fields), ctx_param),
            effect=ToolEffect(effect),
            timeout_s=timeout_s,
            retry=retry,
            verify=check,
        )

    return make(fn) if fn is not None else make


def _handler(target: ToolFunction, fields: tuple[str, ...], ctx_param: str | None) -> Handler:
    """``target`` called with the ``fields`` of the parsed args (and the context as
    ``ctx_param``), as ``Tool`` calls a handler."""

    def handler(args: BaseModel, ctx: ToolContext) -> object:
        kwargs: dict[str, object] = {field: getattr(args, field) for field in fields}
        if ctx_param is not None:
            kwargs[ctx_param] = ctx
        return target(**kwargs)

    return handler


def _signature_model(fn: ToolFunction) -> tuple[type[BaseModel], str | None]:
    """A pydantic model of ``fn``'s parameters (less the ``ToolContext`` one, whose name is
    returned)."""
    hints = get_type_hints(fn)
    fields: dict[str, Any] = {}  # create_model's field definitions: (annotation, default)
    ctx_param = None
    for param in inspect.signature(fn).parameters.values():
        annotation = hints.get(param.name, Any)
        if annotation is ToolContext:
            ctx_param = param.name
            continue
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(f"tool {fn.__name__}: *args and **kwargs cannot be described to a model")
        if param.kind is param.POSITIONAL_ONLY:  # the handler passes every arg by keyword
            raise TypeError(f"tool {fn.__name__}: positional-only parameter {param.name!r}; drop the '/'")
        default = ... if param.default is param.empty else param.default
        fields[param.name] = (annotation, default)
    model = create_model(f"{fn.__name__}_args", __base__=_Args, **fields)
    return model, ctx_param
