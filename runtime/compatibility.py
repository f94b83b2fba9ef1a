"""The deploy gate's check, pure: would this code (its tool registry, providers and settings,
``Runtime``) still run each run that has not ended? (``aidawork deploy-check``)

A run's config is validated by ``prepare_turn``, the check every cold round runs on the
stored config (a failure there fails the run with ``CONFIG_INVALID``), so nothing passes
here that a worker would refuse. The tools the config enables and its provider are looked
up first, one by one, so the report names every missing tool and not only the first.
A suspended call's args are parsed as the resume parses them (``runtime.tool_calls``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from runtime.deps import Runtime
from runtime.errors import RequestInvalid
from runtime.prepare import format_loc, prepare_turn
from runtime.tools import ToolArgsInvalid
from schema.wire.deploy import (
    DeployReport,
    Incompatibility,
    IncompatibilityKind,
    PendingCall,
    RunReport,
    UnendedRun,
)
from schema.wire.json import JsonMapping

# Whether the saved agent ``ref`` (NAME@VERSION) of ``owner`` exists after the deploy.
AgentExists = Callable[[str, str], bool]

Kind = IncompatibilityKind


def check_run(runtime: Runtime, run: UnendedRun, agent_exists: AgentExists) -> list[Incompatibility]:
    """Every reason this code could not carry ``run`` on; empty when it can."""
    problems = _config_problems(runtime, run)
    problems += [p for call in run.pending_calls if (p := _pending_call_problem(runtime, run.config, call))]
    if run.agent is not None and not agent_exists(run.owner, run.agent):
        problems.append(
            Incompatibility(
                kind=Kind.AGENT_VERSION_GONE,
                field="agent",
                message=f"the run was made from saved agent {run.agent}, which will not exist after the deploy",
            )
        )
    return problems


def check_deploy(
    runtime: Runtime,
    runs: Sequence[UnendedRun],
    agent_exists: AgentExists,
    *,
    plugins: Sequence[str] = (),
    agents_dir: str | None = None,
) -> DeployReport:
    reports = []
    for run in runs:
        problems = check_run(runtime, run, agent_exists)
        if problems:
            reports.append(
                RunReport(run_id=run.run_id, owner=run.owner, status=run.status, agent=run.agent, problems=problems)
            )
    return DeployReport(
        compatible=not reports,
        checked=len(runs),
        affected=len(reports),
        plugins=list(plugins),
        agents_dir=agents_dir,
        runs=reports,
    )


def _config_problems(runtime: Runtime, run: UnendedRun) -> list[Incompatibility]:
    # prepare_turn stops at the first problem: the lookups first name every one of theirs.
    return _lookup_problems(runtime, run.config) or _prepare_problems(runtime, run)


def _lookup_problems(runtime: Runtime, config: JsonMapping) -> list[Incompatibility]:
    problems = []
    tools = config.get("tools")
    for i, name in enumerate(tools if isinstance(tools, list) else []):
        if isinstance(name, str) and runtime.base.tools.get(name) is None:
            problems.append(
                Incompatibility(
                    kind=Kind.TOOL_MISSING,
                    field=f"config.tools[{i}]",
                    message=f"the config enables tool {name!r}, which this code does not have",
                )
            )
    model = config.get("model")
    provider = model.get("provider") if isinstance(model, dict) else None
    if isinstance(provider, str) and provider not in runtime.base.model_providers:
        problems.append(
            Incompatibility(
                kind=Kind.MODEL_UNAVAILABLE,
                field="config.model.provider",
                message=f"model provider {provider!r} is not configured in this code (a plugin's, not loaded?)",
            )
        )
    return problems


def _prepare_problems(runtime: Runtime, run: UnendedRun) -> list[Incompatibility]:
    try:
        prepared = prepare_turn(runtime, run.config, run.owner)
    except RequestInvalid as exc:
        return [Incompatibility(kind=_kind_of(exc.field), field=exc.field, message=f"{exc.field}: {exc.reason}")]
    # An HTTP provider's client (runtime.models.http.HttpModel, asked by attribute: importing
    # it imports the providers' SDKs) says why it has no key. prepare_turn lets that through
    # (the call fails, not the submission), but a deploy that drops the key fails every call.
    key_missing = getattr(prepared.deps.model, "key_missing", None)
    if isinstance(key_missing, str):
        field = "config.model.api_key_ref"
        return [Incompatibility(kind=Kind.MODEL_UNAVAILABLE, field=field, message=f"{field}: {key_missing}")]
    return []


def _kind_of(field: str) -> IncompatibilityKind:
    # config.model.*: the provider's settings (its model, key or base URL) for this owner;
    # a scripted model's turns are the run's own content, not the deployment's.
    if field.startswith("config.model") and not field.startswith("config.model.turns"):
        return Kind.MODEL_UNAVAILABLE
    return Kind.CONFIG_INVALID


def _client_tool_names(config: JsonMapping) -> set[str]:
    specs = config.get("client_tools")
    names = set()
    for spec in specs if isinstance(specs, list) else []:
        name = spec.get("name") if isinstance(spec, dict) else None
        if isinstance(name, str):
            names.add(name)
    return names


def _pending_call_problem(runtime: Runtime, config: JsonMapping, call: PendingCall) -> Incompatibility | None:
    where = f"pending_calls[{call.tool_call_id}]"
    tool = runtime.base.tools.get(call.tool_name)
    if tool is None:
        if call.tool_name in _client_tool_names(config):
            return None  # answered from outside; its spec is part of the run's own config
        return Incompatibility(
            kind=Kind.TOOL_MISSING,
            field=where,
            tool_call_id=call.tool_call_id,
            message=f"tool call {call.tool_call_id} waits ({call.kind}) to run tool {call.tool_name!r}, "
            "which this code does not have",
        )
    try:
        tool.parse_args(call.args)
    except ToolArgsInvalid as exc:
        field = format_loc(exc.loc, f"{where}.args")
        return Incompatibility(
            kind=Kind.TOOL_ARGS_REJECTED,
            field=field,
            tool_call_id=call.tool_call_id,
            message=f"tool call {call.tool_call_id} waits ({call.kind}) to run tool {call.tool_name!r} with args "
            f"its schema no longer accepts: {field}: {exc.message}",
        )
    return None
