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
from collections.abc import Callable
from typing import Any, get_type_hints, overload

from pydantic import BaseModel, ConfigDict, create_model

from runtime.tools.base import NO_RETRY, Tool, ToolContext, ToolEffect, ToolRetry
from schema.wire.vocab import ToolDomain

NAME_PATTERN = r"^[A-Za-z][A-Za-z0-9_-]{0,63}$"


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


@overload
def tool(fn: Callable[..., Any], /) -> Tool: ...


@overload
def tool(
    *,
    name: str | None = None,
    effect: str = ToolEffect.AT_MOST_ONCE,
    domain: str = ToolDomain.SDK,
    timeout_s: float | None = None,
    retry: ToolRetry = NO_RETRY,
    verify: Callable[..., Any] | None = None,
    description: str | None = None,
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    effect: str = ToolEffect.AT_MOST_ONCE,
    domain: str = ToolDomain.SDK,
    timeout_s: float | None = None,
    retry: ToolRetry = NO_RETRY,
    verify: Callable[..., Any] | None = None,
    description: str | None = None,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Make ``fn`` a ``Tool``. ``effect`` says what running it twice does and defaults to
    the safe ``at_most_once``; declare ``read_only`` or ``idempotent`` when true.
    ``verify`` (same parameters as the tool) tells, after a crash, what an execution of an
    ``at_most_once`` call did: its result, or ``None`` if it cannot tell."""

    def make(fn: Callable[..., Any]) -> Tool:
        args_model, ctx_param = _signature_model(fn)

        def call(target: Callable[..., Any]) -> Callable[[Any, ToolContext], Any]:
            def handler(args: BaseModel, ctx: ToolContext) -> Any:
                kwargs = {field: getattr(args, field) for field in type(args).model_fields}
                if ctx_param is not None:
                    kwargs[ctx_param] = ctx
                return target(**kwargs)

            return handler

        return Tool.of_model(
            name or fn.__name__,
            description or inspect.getdoc(fn) or "",
            args_model,
            ToolDomain(domain),
            call(fn),
            effect=ToolEffect(effect),
            timeout_s=timeout_s,
            retry=retry,
            verify=call(verify) if verify is not None else None,
        )

    return make(fn) if fn is not None else make


def _signature_model(fn: Callable[..., Any]) -> tuple[type[BaseModel], str | None]:
    """A pydantic model of ``fn``'s parameters (less the ``ToolContext`` one, whose name is
    returned)."""
    hints = get_type_hints(fn)
    fields: dict[str, Any] = {}
    ctx_param = None
    for param in inspect.signature(fn).parameters.values():
        annotation = hints.get(param.name, Any)
        if annotation is ToolContext:
            ctx_param = param.name
            continue
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(f"tool {fn.__name__}: *args and **kwargs cannot be described to a model")
        default = ... if param.default is param.empty else param.default
        fields[param.name] = (annotation, default)
    model = create_model(f"{fn.__name__}_args", __base__=_Args, **fields)
    return model, ctx_param
