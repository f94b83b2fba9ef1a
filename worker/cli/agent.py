"""``aidawork agent create|update|show|list|delete``: an owner's saved agents
(``worker.client``). ``create`` and ``update`` read the run config from a file (``-``:
standard input), the same JSON as a run request's ``config``; each update saves a new
version. A refusal names the field and exits 2, with nothing stored."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from schema.wire.agents import AgentView
from worker.cli.commands import command, commands
from worker.cli.inputs import read_json
from worker.cli.owner import check_owner

app = commands("an owner's saved agents: named, versioned run configs a run can name")
OwnerOption = Annotated[str, typer.Option("--owner", metavar="OWNER", help="the agent's owner", show_default=False)]
Name = Annotated[str, typer.Argument(metavar="NAME", show_default=False)]
JsonFlag = Annotated[bool, typer.Option("--json")]
ConfigFile = Annotated[
    str | None, typer.Option("--config", metavar="FILE", help="the run config as JSON (- for standard input)")
]
Description = Annotated[str | None, typer.Option("--description", metavar="TEXT", help="what the agent does")]
Overridable = Annotated[
    list[str] | None,
    typer.Option("--overridable", metavar="PATH", help="a config path a run may override (repeat it)"),
]


def _print(agent: AgentView, as_json: bool = True) -> None:
    if as_json:
        print(json.dumps(agent.model_dump(mode="json"), indent=2))
    else:
        print(f"{agent.ref}  {agent.description}".rstrip())


@command(app, "create", "save version 1 of a new agent")
def cmd_agent_create(
    name: Name,
    owner: OwnerOption,
    config: Annotated[
        str, typer.Option("--config", metavar="FILE", help="the run config as JSON (- for standard input)",
                          show_default=False)
    ],
    description: Description = None,
    overridable: Overridable = None,
) -> int:
    from worker import client

    spec = {"config": read_json(config, "--config"), "description": description or "",
            "overridable": overridable or []}
    _print(client.create_agent(check_owner(owner), name, spec))
    return 0


@command(app, "update", "save the agent's next version: the latest with the flags given")
def cmd_agent_update(
    name: Name, owner: OwnerOption, config: ConfigFile = None, description: Description = None,
    overridable: Overridable = None,
) -> int:
    from worker import client

    change: dict[str, object] = {}
    if config is not None:
        change["config"] = read_json(config, "--config")
    if description is not None:
        change["description"] = description
    if overridable is not None:
        change["overridable"] = overridable
    _print(client.update_agent(check_owner(owner), name, change))
    return 0


@command(app, "show", "an agent: NAME (its latest version) or NAME@VERSION")
def cmd_agent_show(
    ref: Annotated[str, typer.Argument(metavar="NAME[@VERSION]", show_default=False)], owner: OwnerOption
) -> int:
    from worker import client

    _print(client.get_agent(check_owner(owner), ref))
    return 0


@command(app, "list", "the owner's agents, the latest version of each")
def cmd_agent_list(owner: OwnerOption, as_json: JsonFlag = False) -> int:
    from worker import client

    found = client.list_agents(check_owner(owner))
    if as_json:
        print(json.dumps([a.model_dump(mode="json") for a in found], indent=2))
    else:
        for agent in found:
            _print(agent, as_json=False)
    return 0


@command(app, "delete", "delete every version of an agent (runs made from it keep their record)")
def cmd_agent_delete(name: Name, owner: OwnerOption) -> int:
    from worker import client

    deleted = client.delete_agent(check_owner(owner), name)
    print(json.dumps({"name": name, "deleted_versions": deleted}))
    return 0
