"""The deploy gate's pure check (``runtime.compatibility``): each kind of incompatibility a run
can have with a new release's registry, named with its field and pending call; nothing for a
run the release can carry on."""

from __future__ import annotations

from typing import Any
from uuid import uuid4

from pydantic import SecretStr

from runtime.compatibility import check_deploy, check_run
from runtime.deps import Runtime, build_runtime
from runtime.models.keys import ModelKeys
from runtime.tools import Tool, tool
from schema.wire import RunStatus
from schema.wire.deploy import IncompatibilityKind, PendingCall, UnendedRun


@tool(effect="read_only")
def stamp(text: str) -> dict[str, Any]:
    """Version 1: a text."""
    return {"text": text}


@tool(effect="read_only", name="stamp")
def stamp_v2(text: str, count: int) -> dict[str, Any]:
    """Version 2: a text and a required count (what version 1's calls never sent)."""
    return {"text": text * count}


def runtime_with(*tools: Tool) -> Runtime:
    return build_runtime(toolsets=list(tools))


def config(tools: list[str], **extra: Any) -> dict[str, Any]:
    return {"model": {"provider": "scripted", "turns": [{"content": "done"}]}, "tools": tools, **extra}


def unended(cfg: dict[str, Any], *calls: PendingCall, agent: str | None = None) -> UnendedRun:
    return UnendedRun(run_id=uuid4(), owner="team-a", status=RunStatus.SUSPENDED, agent=agent, config=cfg,
                      pending_calls=list(calls))


def waiting(name: str, args: dict[str, Any], call_id: str = "call_0_0") -> PendingCall:
    return PendingCall(tool_call_id=call_id, tool_name=name, kind="approval", args=args)


def always(_owner: str, _ref: str) -> bool:
    return True


def kinds(problems: list[Any]) -> list[tuple[str, str, str | None]]:
    return [(p.kind, p.field, p.tool_call_id) for p in problems]


def test_a_run_the_new_registry_can_carry_on_has_no_problem() -> None:
    run = unended(config(["stamp", "echo"]), waiting("stamp", {"text": "hi"}))
    assert check_run(runtime_with(stamp), run, always) == []


def test_a_pending_call_on_a_removed_tool_is_named_with_the_config_entry() -> None:
    run = unended(config(["echo", "stamp"]), waiting("stamp", {"text": "hi"}))
    problems = check_run(runtime_with(), run, always)
    assert kinds(problems) == [
        (IncompatibilityKind.TOOL_MISSING, "config.tools[1]", None),
        (IncompatibilityKind.TOOL_MISSING, "pending_calls[call_0_0]", "call_0_0"),
    ]
    assert "'stamp'" in problems[1].message and "approval" in problems[1].message


def test_pending_args_the_new_schema_refuses_are_named_down_to_the_field() -> None:
    run = unended(config(["stamp"]), waiting("stamp", {"text": "hi"}))
    problems = check_run(runtime_with(stamp_v2), run, always)
    assert kinds(problems) == [
        (IncompatibilityKind.TOOL_ARGS_REJECTED, "pending_calls[call_0_0].args.count", "call_0_0")
    ]


def test_a_client_tool_call_is_answered_from_outside_so_never_missing() -> None:
    cfg = config([], client_tools=[{"name": "ask_user", "parameters": {"type": "object"}}])
    assert check_run(runtime_with(), unended(cfg, waiting("ask_user", {"q": "?"})), always) == []


def test_a_provider_the_release_does_not_configure_is_model_unavailable() -> None:
    run = unended({"model": {"provider": "acme", "name": "m"}, "tools": ["ghost"]})
    problems = check_run(runtime_with(), run, always)
    assert kinds(problems) == [
        (IncompatibilityKind.TOOL_MISSING, "config.tools[0]", None),
        (IncompatibilityKind.MODEL_UNAVAILABLE, "config.model.provider", None),
    ]


def test_a_default_key_the_release_does_not_configure_is_model_unavailable() -> None:
    cfg = {"model": {"provider": "openai", "name": "gpt-4o-mini"}, "tools": []}
    problems = check_run(build_runtime(model_keys=ModelKeys()), unended(cfg), always)
    assert kinds(problems) == [(IncompatibilityKind.MODEL_UNAVAILABLE, "config.model.api_key_ref", None)]
    assert "OPENAI" in problems[0].message
    keyed = build_runtime(model_keys=ModelKeys(openai=SecretStr("sk-test")))
    assert check_run(keyed, unended(cfg), always) == []


def test_a_config_that_no_longer_validates_is_config_invalid_naming_the_field() -> None:
    run = unended(config(["stamp"], policy={"max_rounds": 0}))
    problems = check_run(runtime_with(stamp), run, always)
    assert [(p.kind, p.field) for p in problems] == [(IncompatibilityKind.CONFIG_INVALID, "config.policy.max_rounds")]


def test_a_saved_agent_version_gone_after_the_deploy() -> None:
    asked: list[tuple[str, str]] = []

    def gone(owner: str, ref: str) -> bool:
        asked.append((owner, ref))
        return False

    problems = check_run(runtime_with(), unended(config([]), agent="triage@2"), gone)
    assert kinds(problems) == [(IncompatibilityKind.AGENT_VERSION_GONE, "agent", None)]
    assert asked == [("team-a", "triage@2")]


def test_the_report_lists_only_affected_runs_and_counts_all() -> None:
    fine, broken = unended(config(["stamp"])), unended(config(["ghost"]))
    report = check_deploy(runtime_with(stamp), [fine, broken], always, plugins=["p"])
    assert (report.compatible, report.checked, report.affected) == (False, 2, 1)
    assert [r.run_id for r in report.runs] == [broken.run_id]
    assert check_deploy(runtime_with(stamp), [fine], always).compatible
