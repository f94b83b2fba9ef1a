"""``aidawork deploy-check``: run before a deploy, with the new release installed, against the
live database. It loads this code's tool registry, providers and settings (the plugins of
``--plugins`` if given, else ``AIDAWORK_PLUGINS``, and those of installed entry points) and
checks every run that has not ended against them (``runtime.compatibility``). Exit 0: every
run is compatible; 1: some run is affected (each named, with why); 2: bad input (an
``--agents`` directory that does not exist, a file in it that does not parse, a plugin that
does not load). Read-only: one read-only transaction, nothing written.

``--agents DIR``: the saved agents as they will be after the deploy, for a deployment that
keeps its agents as files. ``DIR/NAME@VERSION.json`` says that version will exist;
``DIR/NAME.json`` says the agent is kept, with every version the database holds now. Each
file holds the run config ``aidawork agent create --config`` takes (a JSON object). A run
made from NAME@VERSION is affected when neither says the version will exist. Without
``--agents``, the versions that exist are the database's (not deleted).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import typer

from runtime.compatibility import check_deploy
from runtime.plugins import process_plugins
from schema.wire.agents import AGENT_NAME_PATTERN, AGENT_REF_PATTERN
from schema.wire.deploy import DeployReport
from worker.cli.inputs import InputError, read_json
from worker.ops.settings import get_settings

EXIT_COMPATIBLE, EXIT_AFFECTED = 0, 1
_FILE_NAME = re.compile(AGENT_REF_PATTERN)  # NAME or NAME@VERSION


@dataclass(frozen=True)
class AgentCatalogue:
    """The saved agent versions that exist after the deploy."""

    live: set[tuple[str, str, int]]  # (owner, name, version) in the database, not deleted
    files: Path | None = None  # --agents
    kept_names: set[str] = field(default_factory=set)  # DIR/NAME.json
    kept_versions: set[str] = field(default_factory=set)  # DIR/NAME@VERSION.json

    def exists(self, owner: str, ref: str) -> bool:
        name, _, version = ref.partition("@")
        in_database = version.isdigit() and (owner, name, int(version)) in self.live
        if self.files is None:
            return in_database
        return ref in self.kept_versions or (name in self.kept_names and in_database)


def read_agents_dir(path: Path) -> tuple[set[str], set[str]]:
    """(names kept, NAME@VERSION refs kept) of an ``--agents`` directory; ``InputError`` (exit 2)
    for a directory that does not exist, a file name that is no agent's, a file that is not
    a JSON object."""
    if not path.is_dir():
        raise InputError(f"--agents: {path} is not a directory")
    names: set[str] = set()
    versions: set[str] = set()
    for file in sorted(path.glob("*.json")):
        ref = file.name.removesuffix(".json")
        if not _FILE_NAME.fullmatch(ref):
            raise InputError(f"--agents: {file}: name it NAME.json or NAME@VERSION.json (NAME: {AGENT_NAME_PATTERN})")
        config = read_json(str(file), f"--agents: {file}")
        if not isinstance(config, dict):
            raise InputError(f"--agents: {file}: must hold a run config (a JSON object), as `agent create --config`")
        (versions if "@" in ref else names).add(ref)
    return names, versions


def describe(report: DeployReport) -> list[str]:
    """The human lines: one per problem, naming the run, then the verdict."""
    lines = []
    for run in report.runs:
        for problem in run.problems:
            lines.append(f"run {run.run_id} ({run.status}, owner {run.owner}): {problem.kind}: {problem.message}")
    if report.compatible:
        lines.append(f"{report.checked} run(s) not ended; all compatible with this code")
    else:
        lines.append(f"{report.checked} run(s) not ended; {report.affected} affected: this code would break them")
    return lines


def cmd_deploy_check(
    agents: Annotated[
        Path | None,
        typer.Option(
            "--agents", metavar="DIR", help="the saved agents after the deploy: NAME.json / NAME@VERSION.json files"
        ),
    ] = None,
    plugins: Annotated[
        str | None,
        typer.Option("--plugins", metavar="NAMES", help="the plugins to check with, comma-separated (default "
                     "AIDAWORK_PLUGINS; \"\" for none but the installed entry points)"),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the report as JSON (for CI)")] = False,
) -> int:
    from schema.store.inflight import read_unended
    from worker.client.context import engine_for, runtime_for

    settings = get_settings()
    if plugins is not None:
        settings = settings.model_copy(update={"plugins": plugins})
    kept_names, kept_versions = read_agents_dir(agents) if agents is not None else (set(), set())
    runtime = runtime_for(settings)  # a plugin that does not load: PluginError, exit 2
    engine = engine_for(settings, threads=1)
    try:
        runs, live = read_unended(engine)
    finally:
        engine.dispose()
    catalogue = AgentCatalogue(live, agents, kept_names, kept_versions)
    report = check_deploy(
        runtime,
        runs,
        catalogue.exists,
        plugins=process_plugins(settings.plugin_names).loaded,
        agents_dir=None if agents is None else str(agents),
    )
    print(json.dumps(report.model_dump(mode="json"), indent=2) if as_json else "\n".join(describe(report)))
    return EXIT_COMPATIBLE if report.compatible else EXIT_AFFECTED
