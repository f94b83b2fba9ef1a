"""``aidawork fork`` and ``aidawork diff`` (``worker.client.fork`` / ``diff``): a new run
whose first rounds are another's, copied and never run again, and what differs between
two runs, round by round. A refused fork exits 2, naming the field, with nothing stored."""

from __future__ import annotations

import json
from typing import Annotated
from uuid import UUID

import typer

from schema.wire.forks import RunDiff
from schema.wire.json import JsonValue
from worker.cli.commands import RunId
from worker.cli.inputs import InputError, parse_json

EXIT_OK = 0
RunA = Annotated[UUID, typer.Argument(metavar="RUN_A", show_default=False)]
RunB = Annotated[UUID, typer.Argument(metavar="RUN_B", show_default=False)]


def _assignment(spec: str, flag: str, left: str) -> tuple[str, JsonValue]:
    """``NAME=JSON`` as (NAME, the value)."""
    name, sep, raw = spec.partition("=")
    if not sep or not name:
        raise InputError(f"{flag}: give {left}=JSON, not {spec!r}")
    return name, parse_json(raw, f"{flag} {name}")


def cmd_fork(
    run_id: RunId,
    at_round: Annotated[
        int, typer.Option("--at-round", metavar="N", help="copy the run's rounds 1..N (0: none)", show_default=False)
    ],
    edit_input: Annotated[
        str | None,
        typer.Option("--edit-input", metavar="TEXT", help="at round 0 the input; else a user message after round N"),
    ] = None,
    edit_tool_result: Annotated[
        str | None,
        typer.Option("--edit-tool-result", metavar="CALL_ID=JSON", help="a call of round N, given this result"),
    ] = None,
    config_override: Annotated[
        list[str] | None,
        typer.Option("--config-override", metavar="PATH=JSON", help="set a config path, as JSON (repeat it)"),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the new run's status as JSON")] = False,
) -> int:
    from worker import client

    request: dict[str, object] = {"at_round": at_round}
    if edit_input is not None:
        request["edit_input"] = edit_input
    if edit_tool_result is not None:
        call_id, result = _assignment(edit_tool_result, "--edit-tool-result", "CALL_ID")
        request["edit_tool_result"] = {"tool_call_id": call_id, "result": result}
    overrides = dict(_assignment(spec, "--config-override", "PATH") for spec in config_override or [])
    if overrides:
        request["config_overrides"] = overrides
    forked = client.fork(run_id, request)
    if as_json:
        print(client.status(forked.run_id).model_dump_json(indent=2))
    else:
        print(forked.run_id)  # stdout is the run id alone, as submit prints it
    return EXIT_OK


def _short(value: object, limit: int = 120) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)
    return text if len(text) <= limit else text[:limit] + "..."


def describe(diff: RunDiff) -> list[str]:
    """The diff as lines for a person: one per round, and one per field that differs."""
    lines = [f"A: run {diff.run_a}", f"B: run {diff.run_b}"]
    for r in diff.rounds:
        if r.verdict == "same":
            lines.append(f"round {r.round}: same")
        elif r.verdict in ("only_in_a", "only_in_b"):
            lines.append(f"round {r.round}: only in {'A' if r.verdict == 'only_in_a' else 'B'}")
        else:
            lines.append(f"round {r.round}: differs: {', '.join(r.differs)}")
            for field in r.differs:
                lines.append(f"  {field}: A {_short(r.a[field])}")
                lines.append(f"  {' ' * len(field)}  B {_short(r.b[field])}")
    return lines


def cmd_diff(run_a: RunA, run_b: RunB, as_json: Annotated[bool, typer.Option("--json")] = False) -> int:
    from worker import client

    diff = client.diff(run_a, run_b)
    print(diff.model_dump_json(indent=2) if as_json else "\n".join(describe(diff)))
    return EXIT_OK
