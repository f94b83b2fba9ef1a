"""``@tool``: a plain function as a Tool (schema from type hints, description from the
docstring, the ToolContext injected), and what ``Tool.run`` makes of its handler
(sync or async, timeouts, retries, exceptions)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from pydantic import BaseModel

from runtime.errors import ToolFailed
from runtime.tools import (
    TOOL_ERROR,
    TOOL_TIMEOUT,
    Tool,
    ToolArgsInvalid,
    ToolContext,
    ToolEffect,
    ToolRetry,
    ToolTimedOut,
    tool,
)
from schema.wire.retry import RetryPolicy
from schema.wire.vocab import ToolDomain, ToolStatus
from tests.support.tools import tool_context

# Retries in these tests wait about a millisecond, not the system's 0.2 s.
TINY_BACKOFF = RetryPolicy(base_s=0.001, cap_s=0.001)


class Line(BaseModel):
    sku: str
    qty: int = 1


class Address(BaseModel):
    city: str
    zip_code: str


@tool(effect="idempotent")
def place_order(customer: str, lines: list[Line], ship_to: Address, tags: list[int], note: str = "",
                rush: bool = False) -> dict[str, Any]:
    """Place an order for a customer.

    Each line is a SKU and a quantity."""
    return {"customer": customer, "skus": [line.sku for line in lines], "city": ship_to.city, "tags": tags,
            "note": note, "rush": rush}


def _run(t: Tool, args: dict[str, Any], ctx: ToolContext | None = None) -> Any:
    return t.run(t.parse_args(args), ctx or tool_context())


# --- the schema and the description --------------------------------------------------------


def test_the_args_schema_comes_from_the_type_hints_with_defaults_optional() -> None:
    schema = place_order.parameters

    assert schema["type"] == "object"
    assert set(schema["properties"]) == {"customer", "lines", "ship_to", "tags", "note", "rush"}
    assert sorted(schema["required"]) == ["customer", "lines", "ship_to", "tags"]
    assert schema["properties"]["customer"]["type"] == "string"
    assert schema["properties"]["tags"] == {"items": {"type": "integer"}, "title": "Tags", "type": "array"}
    assert schema["properties"]["note"]["default"] == ""
    assert schema["properties"]["rush"] == {"default": False, "title": "Rush", "type": "boolean"}
    assert schema["additionalProperties"] is False  # an arg the function does not take is refused


def test_nested_pydantic_models_are_in_the_schema_and_arrive_as_model_instances() -> None:
    schema = place_order.parameters

    assert schema["properties"]["lines"]["items"] == {"$ref": "#/$defs/Line"}
    assert schema["$defs"]["Line"]["required"] == ["sku"]
    assert schema["$defs"]["Address"]["properties"]["zip_code"]["type"] == "string"

    outcome = _run(place_order, {"customer": "c1", "lines": [{"sku": "A"}, {"sku": "B", "qty": 2}],
                                 "ship_to": {"city": "Oslo", "zip_code": "0150"}, "tags": [1, 2]})
    assert outcome.status == ToolStatus.COMPLETED
    assert outcome.result == {"customer": "c1", "skus": ["A", "B"], "city": "Oslo", "tags": [1, 2], "note": "",
                              "rush": False}


def test_the_description_is_the_docstring_and_the_name_the_functions_unless_overridden() -> None:
    @tool(name="word-count", effect="read_only")
    def count(text: str) -> int:
        """Count words."""
        return len(text.split())

    @tool(effect="read_only", description="Given here.")
    def described(x: int) -> int:
        """Not this one."""
        return x

    assert place_order.name == "place_order"
    assert place_order.description == "Place an order for a customer.\n\nEach line is a SKU and a quantity."
    assert (count.name, count.description) == ("word-count", "Count words.")
    assert count.spec() == {"name": "word-count", "description": "Count words.", "parameters": count.parameters,
                            "domain": "sdk"}
    assert described.description == "Given here."


def test_defaults_are_the_safe_at_most_once_effect_in_the_sdk_domain() -> None:
    @tool
    def bare(x: int) -> int:
        return x

    assert (bare.name, bare.description, bare.effect, bare.domain) == ("bare", "", ToolEffect.AT_MOST_ONCE,
                                                                       ToolDomain.SDK)
    assert (bare.timeout_s, bare.retry.attempts, bare.verify) == (None, 1, None)

    @tool(effect="read_only", domain="plugin")
    def other(x: int) -> int:
        return x

    assert (other.effect, other.domain) == (ToolEffect.READ_ONLY, ToolDomain.PLUGIN)


def test_an_unknown_effect_or_a_name_no_provider_accepts_is_refused_at_decoration() -> None:
    with pytest.raises(ValueError, match="at_least_once"):
        @tool(effect="at_least_once")
        def f(x: int) -> int:
            return x

    for bad in ("has space", "1starts_with_digit", "x" * 65, ""):
        with pytest.raises(ValueError, match="name"):
            tool(name=bad, effect="read_only")(lambda x: x)


# --- the ToolContext parameter --------------------------------------------------------------


def test_a_tool_context_parameter_is_injected_and_not_in_the_schema() -> None:
    seen: list[ToolContext] = []

    @tool(effect="read_only")
    def keyed(item: str, context: ToolContext) -> dict[str, Any]:
        seen.append(context)
        return {"item": item, "key": context.idempotency_key, "call": context.tool_call_id}

    assert set(keyed.parameters["properties"]) == {"item"}
    assert keyed.parameters["required"] == ["item"]
    ctx = tool_context("call_3_1")
    outcome = _run(keyed, {"item": "x"}, ctx)

    assert outcome.result == {"item": "x", "key": "key-call_3_1", "call": "call_3_1"}
    assert seen == [ctx]
    # The model cannot pass a context of its own.
    with pytest.raises(ToolArgsInvalid) as info:
        keyed.parse_args({"item": "x", "context": {}})
    assert info.value.path == "context"


# --- sync and async handlers ------------------------------------------------------------------


def test_a_sync_and_an_async_handler_both_give_their_return_value() -> None:
    @tool(effect="read_only")
    def double(n: int) -> dict[str, int]:
        return {"n": n * 2}

    @tool(effect="read_only")
    async def triple(n: int, ctx: ToolContext) -> dict[str, int]:
        await asyncio.sleep(0)
        return {"n": n * 3, "attempt": ctx.attempt}

    assert _run(double, {"n": 4}).result == {"n": 8}
    assert _run(triple, {"n": 4}).result == {"n": 12, "attempt": 1}
    # With a timeout the handler runs on another thread; an async one still completes there.
    timed = Tool.of_model("triple_timed", "", triple.args_model, ToolDomain.SDK, triple.handler,  # type: ignore[arg-type]
                          effect=ToolEffect.READ_ONLY, timeout_s=30)
    assert _run(timed, {"n": 5}).result == {"n": 15, "attempt": 1}


# --- timeouts ---------------------------------------------------------------------------------


@pytest.mark.parametrize("effect", ["read_only", "idempotent"])
def test_a_handler_past_its_timeout_is_a_failed_tool_timeout_for_a_rerunnable_tool(effect: str) -> None:
    release = threading.Event()

    @tool(effect=effect, timeout_s=0.05)
    def stuck(x: int) -> int:
        release.wait(30)
        return x

    try:
        outcome = _run(stuck, {"x": 1})
    finally:
        release.set()  # the handler's thread cannot be stopped: let it end
    assert outcome.status == ToolStatus.FAILED
    assert outcome.result["error"]["code"] == TOOL_TIMEOUT
    assert "0.05 s" in outcome.result["error"]["message"]


def test_a_handler_past_its_timeout_raises_tool_timed_out_for_an_at_most_once_tool() -> None:
    # Whether the side effect happened is unknown: the loop turns this into an
    # outcome_unknown suspension (test_tool_calls_in_the_loop.py), never a failed result.
    release = threading.Event()

    @tool(effect="at_most_once", timeout_s=0.05)
    def charge(cents: int) -> dict[str, int]:
        release.wait(30)
        return {"charged": cents}

    try:
        with pytest.raises(ToolTimedOut):
            _run(charge, {"cents": 100})
    finally:
        release.set()


def test_a_handler_within_its_timeout_completes() -> None:
    @tool(effect="at_most_once", timeout_s=30)
    def quick(x: int) -> int:
        return x + 1

    assert _run(quick, {"x": 1}).result == 2


# --- retries ----------------------------------------------------------------------------------


class Flaky(Exception):
    pass


def test_retry_on_exceptions_are_retried_up_to_attempts_with_the_attempt_growing() -> None:
    attempts: list[int] = []

    @tool(effect="idempotent", retry=ToolRetry(attempts=3, retry_on=(Flaky,), backoff=TINY_BACKOFF))
    def flaky(x: int, ctx: ToolContext) -> dict[str, int]:
        attempts.append(ctx.attempt)
        if len(attempts) < 3:
            raise Flaky("not yet")
        return {"x": x, "attempt": ctx.attempt}

    outcome = _run(flaky, {"x": 7})

    assert attempts == [1, 2, 3]
    assert outcome.result == {"x": 7, "attempt": 3}


def test_retries_stop_at_attempts_and_the_last_error_is_the_result() -> None:
    attempts: list[int] = []

    @tool(effect="idempotent", retry=ToolRetry(attempts=2, retry_on=(Flaky,), backoff=TINY_BACKOFF))
    def always(x: int, ctx: ToolContext) -> int:
        attempts.append(ctx.attempt)
        raise Flaky(f"try {ctx.attempt}")

    outcome = _run(always, {"x": 1})

    assert attempts == [1, 2]
    assert outcome.status == ToolStatus.FAILED
    assert outcome.result == {"error": {"code": TOOL_ERROR, "message": "Flaky: try 2"}}


def test_an_exception_not_in_retry_on_is_not_retried() -> None:
    attempts: list[int] = []

    @tool(effect="idempotent", retry=ToolRetry(attempts=5, retry_on=(Flaky,), backoff=TINY_BACKOFF))
    def broken(x: int, ctx: ToolContext) -> int:
        attempts.append(ctx.attempt)
        raise KeyError("missing")

    outcome = _run(broken, {"x": 1})

    assert attempts == [1]
    assert outcome.result == {"error": {"code": TOOL_ERROR, "message": "KeyError: 'missing'"}}


def test_the_retry_attempt_counts_on_from_the_rounds_execution() -> None:
    # A round re-executed after a crash runs its calls with the claim's attempt (2 here):
    # a retry inside it is the next one.
    attempts: list[int] = []

    @tool(effect="idempotent", retry=ToolRetry(attempts=2, retry_on=(Flaky,), backoff=TINY_BACKOFF))
    def once_flaky(ctx: ToolContext) -> int:
        attempts.append(ctx.attempt)
        if len(attempts) == 1:
            raise Flaky()
        return ctx.attempt

    assert _run(once_flaky, {}, tool_context(attempt=2)).result == 3
    assert attempts == [2, 3]


# --- failures the model sees ----------------------------------------------------------------


class OutOfStock(ToolFailed):
    code = "OUT_OF_STOCK"


def test_an_exception_is_a_failed_tool_error_result_with_its_type_and_message() -> None:
    @tool(effect="read_only")
    def divide(a: int, b: int) -> float:
        return a / b

    outcome = _run(divide, {"a": 1, "b": 0})

    assert outcome.status == ToolStatus.FAILED
    assert outcome.result == {"error": {"code": "TOOL_ERROR", "message": "ZeroDivisionError: division by zero"}}
    assert outcome.context == outcome.result


def test_a_tool_failed_is_a_failed_result_with_its_own_code() -> None:
    @tool(effect="read_only")
    def reserve(sku: str) -> dict[str, Any]:
        raise OutOfStock(f"{sku} is out of stock")

    outcome = _run(reserve, {"sku": "A-1"})

    assert outcome.result == {"error": {"code": "OUT_OF_STOCK", "message": "A-1 is out of stock"}}


def test_a_very_long_error_message_is_cut() -> None:
    @tool(effect="read_only")
    def loud() -> None:
        raise RuntimeError("x" * 10_000)

    message = _run(loud, {}).result["error"]["message"]
    assert message.startswith("RuntimeError: xxx")
    assert len(message) == 2000


# --- what cannot be a tool, and bad args ------------------------------------------------------


def test_var_args_and_var_kwargs_are_refused_at_decoration() -> None:
    def star(*values: int) -> int:
        return sum(values)

    def double_star(**options: str) -> dict[str, str]:
        return options

    for fn in (star, double_star):
        with pytest.raises(TypeError, match=r"\*args and \*\*kwargs"):
            tool(effect="read_only")(fn)


def test_positional_only_parameters_are_refused_at_decoration() -> None:
    # The handler passes args by keyword: a positional-only one would fail every call.
    def positional(x: int, /) -> int:
        return x

    with pytest.raises(TypeError, match="positional-only"):
        tool(effect="read_only")(positional)


@pytest.mark.parametrize(
    ("args", "path", "fragment"),
    [
        ({"lines": [], "ship_to": {"city": "a", "zip_code": "b"}, "tags": []}, "customer", "Field required"),
        ({"customer": "c", "lines": [{"qty": 2}], "ship_to": {"city": "a", "zip_code": "b"}, "tags": []},
         "lines.0.sku", "Field required"),
        ({"customer": "c", "lines": [], "ship_to": {"city": "a"}, "tags": []}, "ship_to.zip_code", "Field required"),
        ({"customer": "c", "lines": [], "ship_to": {"city": "a", "zip_code": "b"}, "tags": [1, "two"]}, "tags.1",
         "valid integer"),
        ({"customer": "c", "lines": [], "ship_to": {"city": "a", "zip_code": "b"}, "tags": [], "extra": 1}, "extra",
         "Extra inputs"),
    ],
    ids=["missing", "nested_in_list", "nested_model", "list_item", "extra"],
)
def test_bad_args_are_tool_args_invalid_naming_the_field(args: dict[str, Any], path: str, fragment: str) -> None:
    with pytest.raises(ToolArgsInvalid) as info:
        place_order.parse_args(args)

    assert info.value.path == path
    assert fragment in info.value.message
    assert str(info.value).startswith(f"{path}: ")


def test_strict_parsing_refuses_what_lax_parsing_coerces() -> None:
    args = {"customer": "c", "lines": [], "ship_to": {"city": "a", "zip_code": "b"}, "tags": ["1"]}

    assert place_order.parse_args(args).tags == [1]
    with pytest.raises(ToolArgsInvalid) as info:
        place_order.parse_args(args, strict=True)
    assert info.value.loc == ("tags", 0)


# --- the verify hook --------------------------------------------------------------------------


def test_a_verify_hook_gets_the_args_it_names_and_its_own_context_parameter() -> None:
    def was_refunded(order_id: str, context: ToolContext) -> dict[str, Any] | None:
        return {"order_id": order_id, "key": context.idempotency_key}

    @tool(verify=was_refunded)
    def refund(order_id: str, cents: int, ctx: ToolContext) -> dict[str, Any]:
        """Refund an order."""
        return {"refunded": cents}

    args = refund.parse_args({"order_id": "A-1", "cents": 5})
    assert refund.check(args, tool_context("call_1_0")) == {"order_id": "A-1", "key": "key-call_1_0"}


def test_a_verify_hook_that_cannot_tell_or_fails_is_none() -> None:
    def unsure(order_id: str) -> None:
        return None

    def broken(order_id: str) -> dict[str, Any]:
        raise OSError("ledger unreachable")

    for hook in (unsure, broken):
        t = tool(verify=hook)(refund_order)
        assert t.check(t.parse_args({"order_id": "A-1"}), tool_context()) is None
    assert tool(refund_order).check(tool(refund_order).parse_args({"order_id": "A-1"}), tool_context()) is None


def refund_order(order_id: str) -> dict[str, Any]:
    return {"refunded": order_id}


def test_a_verify_hook_taking_a_parameter_the_tool_does_not_have_is_refused_at_decoration() -> None:
    def wrong(order: str) -> None:
        return None

    with pytest.raises(TypeError, match="verify takes order"):
        tool(verify=wrong)(refund_order)
