"""``aidawork export`` and ``aidawork replay`` (``worker.client.replay``): a run as a
self-contained case on stdout, and a case replayed against this code, config and tools.

Exit codes: export 0, or 2 for an unknown run (or another owner's, with ``--owner``) or a
run that cannot be exported; replay 0 when every round is the same (with a live model: when
no call drifted), 1 when a round differs or a call drifted (the replay failed closed), 2
for a case that cannot be read or does not verify (tampered: the error names the round),
or a config that does not validate; nothing is written either way."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated

import typer

from worker.cli.commands import RunId
from worker.cli.inputs import InputError, read_json
from worker.ops.settings import Settings, get_settings

if TYPE_CHECKING:
    from runtime.cases.replay import Mode

EXIT_OK, EXIT_DIFFERS = 0, 1


class ReplayMode(StrEnum):
    RECORDED = "recorded"
    LIVE = "live"


def cmd_export(
    run_id: RunId,
    owner: Annotated[
        str | None, typer.Option(help="only a run of this owner (another owner's run is not found)")
    ] = None,
) -> int:
    from worker.client.context import engine_for, runtime_for
    from worker.client.replay.export import export_case
    from worker.client.replay.session import deployment_proofs

    settings = get_settings()
    engine = engine_for(settings, threads=1)
    try:
        case = export_case(engine, runtime_for(settings), run_id, owner=owner, proofs=deployment_proofs(settings))
    finally:
        engine.dispose()
    sys.stdout.write(case.model_dump_json(indent=1) + "\n")
    # The digest to publish, for readers without the deployment's key (replay --chain).
    print(f"aidawork: chain digest {case.chain_digest} ({len(case.rounds)} rounds)", file=sys.stderr)
    return EXIT_OK


def cmd_replay(
    file: Annotated[str, typer.Argument(metavar="CASE", show_default=False)],
    config: Annotated[
        str | None, typer.Option(metavar="FILE", help="replay with this run config (JSON) instead of the run's own")
    ] = None,
    agent: Annotated[
        str | None, typer.Option(metavar="NAME@VERSION", help="replay with the run owner's saved agent's config")
    ] = None,
    model: Annotated[
        ReplayMode, typer.Option(help="recorded: the model's answers come from the case; live: the config's provider")
    ] = ReplayMode.RECORDED,
    tools: Annotated[
        ReplayMode | None,
        typer.Option(help="live: tool calls run for real; recorded: served from the case when the tool and args "
                          "match (default: live with the recorded model, recorded with a live one)"),
    ] = None,
    chain: Annotated[
        str | None, typer.Option(metavar="DIGEST", help="refuse the case unless its digest chain ends at DIGEST")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="the report as JSON")] = False,
) -> int:
    from worker.client.context import runtime_for
    from worker.client.replay.session import load_verified, replay_verified

    if config is not None and agent is not None:
        raise InputError("give --config or --agent, not both")
    settings = get_settings()
    case, verified = load_verified(file, settings, published=chain)
    new_config: Mapping[str, object] | None = None
    if config is not None:
        given = read_json(config, "--config")
        if not isinstance(given, dict):
            raise InputError("--config: a run config must be a JSON object")
        new_config = given
    elif agent is not None:
        new_config = _agent_config(settings, case.run.owner, agent)
    tools_mode = tools or (ReplayMode.LIVE if model == ReplayMode.RECORDED else ReplayMode.RECORDED)
    report = replay_verified(case, verified, runtime_for(settings), config=new_config,
                             model=_mode(model), tools=_mode(tools_mode))
    print(json.dumps(report.to_json(), indent=2) if as_json else report.text())
    return EXIT_OK if report.ok else EXIT_DIFFERS


def _mode(mode: ReplayMode) -> Mode:
    return "live" if mode == ReplayMode.LIVE else "recorded"


def _agent_config(settings: Settings, owner: str, ref: str) -> dict[str, object]:
    from runtime.agents import apply_overrides
    from schema.store import agents as agent_store
    from worker.client.context import engine_for

    engine = engine_for(settings, threads=1)
    try:
        found = agent_store.get_agent(engine, owner, ref)  # AgentNotFound: exit 2
    finally:
        engine.dispose()
    return dict(apply_overrides(found, None))
