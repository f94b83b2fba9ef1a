"""At-most-once tool calls across a worker's death, with real workers: a worker dies inside
``append_line`` after its handler wrote its line and before the end was recorded
(failpoint ``in_tool_call``). The round re-executed on another worker does not run the
handler again: the call's outcome is unknown and the run waits for an operator, who says
what it returned (``aidawork tool-result``) or has it run once more (``aidawork
retry-tool``, same idempotency key). ``append_line_checked`` tells by itself, through its
verify hook, that the interrupted call wrote its line: no operator is needed.

Every line a tool writes ends with its call's idempotency key: a key found again after
the crash is the same key, and another call's line has another."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

from schema.store.bodies import event_data_sql
from tests.support.cluster import Cluster, cli, events, wait_exit, wait_ready
from tests.support.db import calls_per_boundary, rows, run_row, wait_suspended, wait_terminal
from tests.support.env import BROKER_URL, REPO
from tests.support.requests import scripted_request
from tests.support.wait import wait_until
from worker import client
from worker.client.context import build_client_context
from worker.engine.failpoints import EXIT_CODE
from worker.ops.settings import Settings

CRASHING = ("a1", "a2", "a3")


def call(tool: str, path: Path, text: str) -> dict[str, Any]:
    return {"name": tool, "args": {"path": str(path), "text": text}}


def submit(ctx: Any, *calls: dict[str, Any]) -> UUID:
    turns = [{"tool_calls": list(calls)}, {"content": "written"}]
    return client.submit(scripted_request(turns, tools=["append_line", "append_line_checked"]), ctx=ctx).run_id


def lines(path: Path) -> list[tuple[str, str]]:
    """(text, idempotency key) of each line."""
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        text, key = line.split("\t")
        out.append((text, key))
    return out


def test_a_call_interrupted_after_its_effect_is_never_run_again_without_an_operators_word(
    cluster: Cluster, ctx, db_url: str, tmp_path: Path
) -> None:
    # Three workers, each dying inside the first at-most-once call it runs: one run each.
    for name in CRASHING:
        cluster.start_worker(name, concurrency=1, env={"AIDAWORK_FAILPOINTS": "in_tool_call"})
    wait_ready(cluster, *CRASHING)
    told, retried = tmp_path / "told.txt", tmp_path / "retried.txt"
    checked, second = tmp_path / "checked.txt", tmp_path / "second.txt"
    by_result = submit(ctx, call("append_line", told, "x"))
    by_retry = submit(ctx, call("append_line", retried, "y"))
    # Two calls in one round: the worker dies after the first; the second never started.
    by_itself = submit(ctx, call("append_line_checked", checked, "c1"), call("append_line_checked", second, "c2"))
    for name in CRASHING:
        assert wait_exit(cluster, name) == EXIT_CODE
        assert [e["failpoint"] for e in events(cluster, name, "failpoint_hit")] == ["in_tool_call"]
    # Each handler wrote its line before its worker died; nothing recorded its end.
    (told_line,), (retried_line,), (checked_line,) = lines(told), lines(retried), lines(checked)
    assert (told_line[0], retried_line[0], checked_line[0], lines(second)) == ("x", "y", "c1", [])
    unfinished = rows(ctx.engine, "SELECT run_id, status FROM tool_executions WHERE tool_call_id = 'call_0_0'")
    assert sorted((r["run_id"], r["status"]) for r in unfinished) == sorted(
        (run_id, None) for run_id in (by_result, by_retry, by_itself))

    cluster.start_worker("b", concurrency=4)
    cluster.start_beat()  # the reconciler re-sends the rounds whose leases expired
    for run_id in (by_result, by_retry):
        wait_suspended(ctx.engine, run_id)
        (wait,) = client.status(run_id, ctx=ctx).waiting_for
        assert (wait.tool_call_id, wait.tool_name, wait.kind) == ("call_0_0", "append_line", "outcome_unknown")
        assert wait.reason is not None and "never recorded its end" in wait.reason
        (suspended,) = rows(ctx.engine, f"SELECT {event_data_sql()} AS data FROM run_events AS e "
                            "WHERE run_id = :id AND kind = 'tool_suspended'", id=run_id)
        assert suspended["data"]["kind"] == "outcome_unknown" and suspended["data"]["args"] == wait.args
        shown = cli(db_url, "status", str(run_id), "--json")
        assert shown.returncode == 0, shown.stderr
        (listed,) = json.loads(shown.stdout)["waiting_for"]
        assert (listed["tool_call_id"], listed["kind"], listed["args"]) == ("call_0_0", "outcome_unknown", wait.args)
    # The re-executed rounds did not run the handlers again.
    assert (lines(told), lines(retried)) == ([told_line], [retried_line])

    # The checked tool's verify hook found its line by its idempotency key: the key of the
    # re-executed call is the key the dead worker's call wrote. The second call ran once,
    # under a key of its own.
    run = wait_terminal(ctx.engine, by_itself)
    assert (run["status"], run["output"]) == ("completed", "written"), run
    results = rows(ctx.engine, "SELECT tool_call_id, status, result FROM tool_invocations WHERE run_id = :id "
                   "ORDER BY tool_call_id", id=by_itself)
    assert results == [
        {"tool_call_id": "call_0_0", "status": "completed", "result": {"appended": "c1", "verified": True}},
        {"tool_call_id": "call_0_1", "status": "completed", "result": {"appended": "c2"}},
    ]
    assert lines(checked) == [checked_line]
    (second_line,) = lines(second)
    assert second_line[0] == "c2" and second_line[1] != checked_line[1]
    assert len({told_line[1], retried_line[1], checked_line[1], second_line[1]}) == 4

    calls_before = {run_id: calls_per_boundary(ctx.engine, run_id) for run_id in (by_result, by_retry)}
    told_so = cli(db_url, "tool-result", str(by_result), "call_0_0", "--json", '{"appended": "x"}')
    assert (told_so.returncode, told_so.stdout) == (0, "call_0_0: result stored; the run resumes\n"), told_so
    again = cli(db_url, "retry-tool", str(by_retry), "call_0_0")
    assert (again.returncode, again.stdout) == (0, "call_0_0: it will run again; the run resumes\n"), again

    for run_id in (by_result, by_retry):
        run = wait_terminal(ctx.engine, run_id)
        assert (run["status"], run["output"]) == ("completed", "written"), run
        # The answer resumed the suspended round: no model call for it.
        per_boundary = calls_per_boundary(ctx.engine, run_id)
        assert per_boundary[0] == calls_before[run_id][0] and per_boundary[1] == 1, per_boundary
    # The operator's result is the call's result; the file still has the one line.
    (told_row,) = rows(ctx.engine, "SELECT status, result FROM tool_invocations WHERE run_id = :id", id=by_result)
    assert told_row == {"status": "completed", "result": {"appended": "x"}}
    assert lines(told) == [told_line]
    # The retry ran the handler exactly once more, with the same idempotency key.
    assert lines(retried) == [retried_line, retried_line]
    (execution,) = rows(ctx.engine, "SELECT executions, status FROM tool_executions WHERE run_id = :id", id=by_retry)
    assert execution == {"executions": 2, "status": "completed"}

    for run_id in (by_result, by_retry, by_itself):
        # The re-executed round 0 went on from the recorded response: one model call per
        # boundary, the crash included.
        assert calls_per_boundary(ctx.engine, run_id) == {0: 1, 1: 1}


SLOW = "slow_effect_plugin"  # tests/support/plugins: append_then_wait
TEST_PLUGINS = REPO / "tests" / "support" / "plugins"


def test_a_worker_sigkilled_inside_an_at_most_once_handler_leaves_one_effect_and_an_unknown_outcome(
    cluster: Cluster, db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A real SIGKILL while the handler runs (its line written, its return still to come),
    # not a failpoint: the same outcome as above.
    monkeypatch.syspath_prepend(str(TEST_PLUGINS))
    plugged = build_client_context(Settings(database_url=db_url, broker_url=BROKER_URL, plugins=SLOW))
    env = {"AIDAWORK_PLUGINS": SLOW, "PYTHONPATH": f"{TEST_PLUGINS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    try:
        cluster.start_worker("a", concurrency=1, env=env)
        cluster.start_beat()
        wait_ready(cluster, "a")
        out = tmp_path / "out.txt"
        args = {"path": str(out), "text": "once", "wait_s": 3600}
        turns = [{"tool_calls": [{"name": "append_then_wait", "args": args}]}, {"content": "written"}]
        run_id = client.submit(scripted_request(turns, tools=["append_then_wait"]), ctx=plugged).run_id

        (line,) = wait_until(lambda: lines(out), what="the handler's line")
        cluster.kill("a")
        assert cluster.procs["a"].returncode == -signal.SIGKILL
        assert run_row(plugged.engine, run_id)["status"] == "running"  # round 0 never committed

        cluster.start_worker("b", concurrency=1, env=env)
        wait_suspended(plugged.engine, run_id)
        (wait,) = client.status(run_id, ctx=plugged).waiting_for
        assert (wait.tool_call_id, wait.tool_name, wait.kind, wait.args) == (
            "call_0_0", "append_then_wait", "outcome_unknown", args)
        # The re-executed round did not run the handler again, nor call the model again.
        assert lines(out) == [line]
        assert calls_per_boundary(plugged.engine, run_id) == {0: 1}
        assert [e["claim_fence"] for e in events(cluster, "b", "round_claimed", run_id=run_id)] == [2]

        client.tool_result(run_id, "call_0_0", {"appended": "once"}, ctx=plugged)
        run = wait_terminal(plugged.engine, run_id)
        assert (run["status"], run["output"]) == ("completed", "written"), run
        assert lines(out) == [line]
        assert calls_per_boundary(plugged.engine, run_id) == {0: 1, 1: 1}
        # The handler was started once, by the worker that was killed.
        assert rows(plugged.engine, "SELECT executions FROM tool_executions WHERE run_id = :id", id=run_id) == [
            {"executions": 1}]
    finally:
        plugged.engine.dispose()
