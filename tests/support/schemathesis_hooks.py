"""Schemathesis hooks for ``tests/e2e/test_openapi_fuzz.py`` (loaded by the ``st`` run
through SCHEMATHESIS_HOOKS).

A run request has rules that tie one field to another or to the caller, which no JSON
Schema can state (the document says them in words, ``worker.api.openapi``). A body
generated from the schema alone breaks them by chance, and the API refuses it (422) as
it should; so, for positive cases only, this makes a generated run request keep them,
changing nothing the schema says:

- each scripted tool call names an enabled tool: a server tool it calls is added to
  ``config.tools``, any other name to ``config.client_tools`` (args ``{}``, which every
  client tool schema the document describes accepts);
- client tool names are distinct (a later duplicate is dropped);
- ``owner`` is the token's own (``team-a``): another is a documented 403, which the checks
  accept, but the case would then never reach the run's own rules; ``root_id`` is left
  out (a generated UUID names no Root of this owner);
- the ``Idempotency-Key`` header and the body's ``idempotency_key``, when both are sent,
  are equal (the body's key is set to the header's);
- a run that names a saved agent names one that exists (``FUZZ_AGENT``, which the test
  saves first), without overrides (the agent allows none);
- a saved agent's config keeps the tool rules above, as a run's does;
- a fork forks at round 0, editing no tool result and overriding nothing (``keep_fork_rules``).

Negative cases are sent as generated (the API must refuse each), but for one thing: a
client tool's ``parameters``, of which the document describes only the common subset
(the API takes any valid JSON Schema there, ``true`` as a property's schema included), is
dropped from every generated client tool, so that no case depends on what lies outside
that subset. The unit tests of ``check_parameters_schema`` cover what it accepts.
"""

from __future__ import annotations

from typing import Any

import schemathesis
from schemathesis import Case, HookContext

TOKEN_OWNER = "team-a"  # tests.support.api: TOKEN_A's owner
FUZZ_AGENT = "fuzz-agent"  # saved for TOKEN_OWNER by tests/e2e/test_openapi_fuzz.py


@schemathesis.hook
def before_call(context: HookContext, case: Case, kwargs: dict[str, Any]) -> None:
    meta = case.meta
    if not isinstance(case.body, dict):
        return
    drop_client_tool_parameters(case.body)
    if meta is None or not meta.generation.mode.is_positive:
        return
    if any(component.mode.is_negative for component in meta.components.values()):
        return
    if (case.method.upper(), case.path) in (("POST", "/v1/agents"), ("PATCH", "/v1/agents/{name}")):
        if isinstance(case.body.get("config"), dict):
            keep_tool_rules(case.body["config"], server_tools=server_tool_names(case))
        return
    if (case.method.upper(), case.path) == ("POST", "/v1/runs/{run_id}/fork"):
        keep_fork_rules(case.body)
        return
    if (case.method.upper(), case.path) != ("POST", "/v1/runs"):
        return
    body = case.body
    if "agent" in body:
        body["agent"] = FUZZ_AGENT
        body.pop("overrides", None)
    body.pop("root_id", None)
    header_key = (case.headers or {}).get("Idempotency-Key")
    if header_key is not None and body.get("idempotency_key") is not None:
        body["idempotency_key"] = header_key
    if "owner" in body:
        body["owner"] = TOKEN_OWNER
    config = body.get("config")
    if isinstance(config, dict):
        keep_tool_rules(config, server_tools=server_tool_names(case))


def keep_fork_rules(body: dict[str, Any]) -> None:
    """A fork names a round the run committed, a call of that round, and overrides the
    run's config validates with: the fuzzed runs commit none, so a positive case forks at
    round 0, with no tool result to edit and the run's own config."""
    body["at_round"] = 0
    body.pop("edit_tool_result", None)
    body.pop("config_overrides", None)


def drop_client_tool_parameters(body: dict[str, Any]) -> None:
    config = body.get("config")
    tools = config.get("client_tools") if isinstance(config, dict) else None
    for spec in tools if isinstance(tools, list) else []:
        if isinstance(spec, dict):
            spec.pop("parameters", None)


def server_tool_names(case: Case) -> set[str]:
    schema = case.operation.schema.raw_schema["components"]["schemas"]["TurnConfig"]
    return set(schema["properties"]["tools"]["items"].get("enum", ()))


def keep_tool_rules(config: dict[str, Any], *, server_tools: set[str]) -> None:
    client_tools: list[dict[str, Any]] = []
    for spec in config.get("client_tools", []):
        if spec["name"] not in {t["name"] for t in client_tools}:
            client_tools.append(spec)
    tools: list[str] = list(config.get("tools", []))
    model = config.get("model", {})
    for turn in model.get("turns", []) if model.get("provider") == "scripted" else []:
        for call in turn.get("tool_calls") or []:
            name = call["name"]
            if name in server_tools:
                if name not in tools:
                    tools.append(name)
                continue
            if name not in {t["name"] for t in client_tools}:
                client_tools.append({"name": name})
            call["args"] = {}
    config["tools"], config["client_tools"] = tools, client_tools
