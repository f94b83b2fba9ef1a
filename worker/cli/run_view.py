"""``aidawork status`` and ``aidawork watch``: a run's view and its events, as lines
for a person (or, with ``--json``, as the API's JSON). What each wait needs and how it is
answered from the command line (README: "Waits and how to answer them")."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Annotated

import typer

from schema.wire import RunEvent
from worker.cli.commands import RunId

EXIT_OK = 0


def cmd_status(run_id: RunId, as_json: Annotated[bool, typer.Option("--json")] = False) -> int:
    from worker import client

    view = client.status(run_id)
    if as_json:
        print(view.model_dump_json(indent=2))
        return EXIT_OK
    print(
        f"run {view.run_id}: {view.status}  rounds: {view.rounds}  model calls: {view.model_calls}"
        + (f" ({view.stale_model_calls} stale)" if view.stale_model_calls else "")
        + f"  tokens: {view.input_tokens} in, {view.output_tokens} out  rebuilds: {view.rebuilds}"
    )
    if view.forked_from is not None:
        print(f"forked from: run {view.forked_from} at round {view.forked_at_round} (its rounds up to it copied)")
    if view.output is not None:
        print(f"output: {view.output}")
    if view.error_code is not None:
        print(f"error: {view.error_code}: {view.error_message}")
    for wait in view.waiting_for:
        if wait.kind == "budget":
            print(f"waiting: the owner's token budget ({wait.used_tokens} used, {wait.reserved_tokens} reserved of "
                  f"{wait.token_budget} per {wait.budget_window}; next call estimated at {wait.estimate_tokens}) "
                  f"until the window ends at {wait.window_ends_at} or the budget is raised")
            continue
        what = describe_wait(wait.kind, wait.tool_name or "", paths=wait.paths, key=wait.key, args=wait.args,
                             reason=wait.reason)
        done = "" if not wait.delivered else " (delivered)" if wait.kind in INPUT_KINDS else " (answered)"
        print(f"waiting: {wait.tool_call_id} ({wait.tool_name}) needs {what}{done}")
        if not wait.delivered and wait.kind in ANSWER_HINTS:
            hint = ANSWER_HINTS[wait.kind].format(run=view.run_id, call=wait.tool_call_id, key=wait.key)
            print(f"  answer with: {hint}")
    for hook in view.webhooks:
        code = "" if hook.last_status_code is None else f", last {hook.last_status_code}"
        error = "" if hook.last_error is None or hook.status == "delivered" else f", {hook.last_error}"
        print(f"webhook: #{hook.event_seq} {hook.event_kind} {hook.status} ({hook.attempts} attempts{code}{error})")
    return EXIT_OK


INPUT_KINDS = frozenset({"local_read", "prerequisite"})  # the others are answered about the call
# How each kind of wait is answered from the command line (README: "Waits and how to answer them").
ANSWER_HINTS = {
    "local_read": "aidawork deliver {run} {call} --file PATH",
    "prerequisite": "aidawork resolve {run} {key} --value JSON",
    "client_tool": "aidawork tool-result {run} {call} --json VALUE [--error]",
    "approval": "aidawork approve {run} {call} [--args JSON]  or  aidawork reject {run} {call} --reason TEXT",
    "outcome_unknown": "aidawork tool-result {run} {call} --json VALUE  or  aidawork retry-tool {run} {call}",
}


def _shown(value: object, limit: int = 200) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[:limit] + "..."


def describe_wait(
    kind: str,
    tool_name: str,
    *,
    paths: Sequence[str] | None = None,
    key: str | None = None,
    args: object = None,
    reason: str | None = None,
) -> str:
    """What a suspended call needs, in a line: for ``status`` and for ``watch``."""
    call = f"{tool_name}({_shown(args or {})})"
    if kind == "local_read":
        return f"files {', '.join(paths or [])}"
    if kind == "prerequisite":
        return f"prerequisite {key!r}"
    if kind == "client_tool":
        return f"the client's result of {call}"
    if kind == "approval":
        return f"approval of {call}"
    if kind == "outcome_unknown":
        return f"an operator's word on {call}: its outcome is unknown ({reason or 'no reason recorded'})"
    return kind


def _describe_input(data: Mapping[str, object]) -> str:
    """An ``input_delivered`` event: files, a prerequisite, or an answer to a call."""
    answer = data.get("answer")
    if answer is None:
        return f"{data.get('tool_call_id') or data.get('key')} delivered"
    call = data["tool_call_id"]
    if answer == "approve":
        edited = f" with edited args {_shown(data['args'])}" if "args" in data else ""
        return f"{call} approved{edited}"
    if answer == "reject":
        return f"{call} rejected: {data.get('reason')}"
    if answer == "retry":
        return f"{call}: run it again"
    return f"{call}: result given"


def _describe_completed(data: Mapping[str, object]) -> str:
    """A ``tool_completed`` event: the result, whether it failed, and a person's decision."""
    failed = " (failed)" if data.get("status") == "failed" else ""
    approval = data.get("approval")
    decided = ""
    if isinstance(approval, dict) and approval["decision"] == "reject":
        decided = " [rejected]"
    elif isinstance(approval, dict):
        decided = " [approved with edited args]" if "args" in approval else " [approved]"
    return f"{data['name']}{decided} -> {json.dumps(data['result'])[:200]}{failed}"


def format_event(event: RunEvent) -> str:
    data = event.data
    if event.kind == "model_responded":
        calls = ", ".join(f"{c['name']}({json.dumps(c['args'])})" for c in data.get("tool_calls", []))
        detail = f"round {data['boundary_seq']}: " + (f"calls {calls}" if calls else f"says {data.get('content')!r}")
    elif event.kind == "tool_completed":
        detail = _describe_completed(data)
    elif event.kind == "run_completed":
        detail = f"output: {data['output']!r}"
    elif event.kind == "tool_suspended":
        needs = describe_wait(data["kind"], data["name"], paths=data.get("paths"), key=data.get("key"),
                              args=data.get("args"), reason=data.get("reason"))
        detail = f"{data['name']} ({data['tool_call_id']}) waits for {needs}"
    elif event.kind == "input_delivered":
        detail = _describe_input(data) + ("; resuming" if data.get("resumable") else "")
    elif event.kind == "resume_ready":
        detail = f"{', '.join(data.get('tool_call_ids', []))}: inputs already there; resuming"
    elif event.kind == "round_resumed":
        detail = f"round {data['boundary_seq']}: re-running {', '.join(data['tool_calls'])} (no model call)"
    elif event.kind == "context_rebuilt":
        detail = (
            f"round {data['boundary_seq']}: {data['source_messages']} older messages summarized; "
            f"the context now starts at message {data['context_start']}"
        )
    elif event.kind == "breaker_tripped":
        detail = f"{', '.join(data['tools'])}: identical round {data['repeat_count']} times in a row"
    elif event.kind in ("run_failed", "run_cancelled"):
        detail = f"{data['error_code']}: {data['message']}"
    else:
        detail = json.dumps(data)
    return f"#{event.seq} {event.kind}  {detail}"


def cmd_watch(
    run_id: RunId,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object per line")] = False,
    no_deltas: Annotated[
        bool, typer.Option("--no-deltas", help="durable events only, not the model's text as it streams")
    ] = False,
) -> int:
    from worker import client
    from worker.ops.deltas import RunDelta

    streaming = None  # the round whose streamed text is on the current line
    for item in client.events(run_id, deltas=not no_deltas):
        if isinstance(item, RunDelta):
            if as_json:
                print(json.dumps({"kind": item.kind, **item.sse_data()}), flush=True)
                continue
            if item.restarted or streaming != item.round:
                if streaming is not None:
                    print(flush=True)
                prefix = f"  round {item.round} restarted after a crash: " if item.restarted else ""
                print(prefix or f"  round {item.round} streams: ", end="", flush=True)
                streaming = item.round
            print(item.delta, end="", flush=True)
            continue
        if streaming is not None:  # the round's durable events end its streamed line
            print(flush=True)
            streaming = None
        print(item.model_dump_json() if as_json else format_event(item), flush=True)
    return EXIT_OK
