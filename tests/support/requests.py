"""The one run-request builder of the tests (scripted model), and the example request."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any
from uuid import uuid4

# The example run request of the brief: one tool round, then the answer.
EXAMPLE_REQUEST: dict[str, Any] = {
    "owner": "team-a",
    "root_id": None,
    "input": "Add 2 and 3.",
    "config": {
        "model": {
            "provider": "scripted",
            "turns": [
                {"tool_calls": [{"name": "add", "args": {"a": 2, "b": 3}}]},
                {"content": "5", "latency_ms": 50},
            ],
        },
        "system_prompt": "You add numbers.",
        "tools": ["add", "echo"],
        "policy": {"max_rounds": 20},
    },
}



def example_request() -> dict[str, Any]:
    return copy.deepcopy(EXAMPLE_REQUEST)


def echo_rounds_request(i: int, rounds: int, *, latency_ms: int, answer_latency_ms: int = 0) -> dict[str, Any]:
    """Run ``i`` of a load: ``rounds - 1`` echo rounds (distinct args, so the repeated-call
    breaker stays quiet) of ``latency_ms`` each, then the answer ``done {i}``."""
    turns: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "echo", "args": {"run": i, "round": k}}], "latency_ms": latency_ms}
        for k in range(rounds - 1)
    ]
    turns.append({"content": f"done {i}", "latency_ms": answer_latency_ms})
    return scripted_request(turns, tools=["echo"], max_rounds=rounds)


def scripted_request(
    turns: list[dict[str, Any]],
    *,
    tools: Sequence[str] = ("add", "echo", "sleep"),
    owner: str = "team-test",
    root_id: str | None = None,
    max_rounds: int = 50,
    text_input: str = "go",
    system_prompt: str = "test",
    require_approval: Sequence[str] = (),
    client_tools: Sequence[dict[str, Any]] = (),
    webhook_url: str | None = None,
    priority: int | None = None,
) -> dict[str, Any]:
    """A run request for the scripted model, which plays ``turns`` one per round;
    ``require_approval`` and ``client_tools`` go into the config when given, and
    ``webhook_url`` into the request's ``webhook``, ``priority`` into its ``priority``."""
    config: dict[str, Any] = {
        "model": {"provider": "scripted", "turns": turns},
        "system_prompt": system_prompt,
        "tools": list(tools),
        "policy": {"max_rounds": max_rounds},
    }
    if require_approval:
        config["policy"]["require_approval"] = list(require_approval)
    if client_tools:
        config["client_tools"] = [dict(t) for t in client_tools]
    request = {"owner": owner, "root_id": root_id, "input": text_input, "config": config}
    if webhook_url is not None:
        request["webhook"] = {"url": webhook_url}
    if priority is not None:
        request["priority"] = priority
    return request


# A client-side tool (runs in the upstream service): every call waits for its result.
PICK_COLOR: dict[str, Any] = {
    "name": "pick_color",
    "description": "Ask the user to pick a color.",
    "parameters": {"type": "object", "properties": {"hint": {"type": "string"}}, "required": ["hint"],
                   "additionalProperties": False},
}


def without_owner(request: dict[str, Any]) -> dict[str, Any]:
    """The request as the HTTP API takes it: the owner comes from the token."""
    return {k: v for k, v in request.items() if k != "owner"}


RESUME = {
    "run_id": str(uuid4()),
    "invocation_id": "inv",
    "boundary_seq": 0,
    "tool_call_id": "call_0_0",
    "tool_domain": "local",
    "args_digest": "d",
    "work_owner": "team-a",
    "claim_fence": 1,
    "round_proof": "p",
    "proof": "q",
}
