"""Fork and diff on the real stack (PostgreSQL, Redis, worker and API processes): a fork
at round 3 of a 6-round run makes no model call and no tool execution for rounds 1-3
(the ledger and the tool rows say so), the at-most-once effect of round 2 happens once in
all, the forks complete, ``aidawork diff`` shows the copied rounds the same and the
edited ones differing; the HTTP route and the CLI both fork, and refuse with nothing stored."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

from tests.support.api import A, ApiServer, B, error_of
from tests.support.cluster import Cluster, cli, wait_ready
from tests.support.db import calls_per_boundary, rows, wait_terminal
from tests.support.requests import scripted_request
from tests.support.suspensions import assert_unchanged, drive, snapshot
from worker import client

TOOLS = ["add", "echo", "append_line"]
DEV = {"AIDAWORK_DEV": "1"}  # the fork signs its copied rounds with the workers' (development) secret


def six_rounds(effect: Path, last: str = "done") -> list[dict[str, Any]]:
    """Five tool rounds (round 2: an at_most_once effect), then the answer."""
    calls = [("add", {"a": 1, "b": 2}), ("append_line", {"path": str(effect), "text": "effect"}),
             ("echo", {"x": 3}), ("add", {"a": 4, "b": 5}), ("echo", {"x": 6})]
    return [{"tool_calls": [{"name": name, "args": args}]} for name, args in calls] + [{"content": last}]


def submitted(ctx: Any, effect: Path) -> UUID:
    return client.submit(scripted_request(six_rounds(effect), tools=TOOLS, owner="team-a"), ctx=ctx).run_id


def boundaries(ctx: Any, table: str, run_id: UUID) -> list[int]:
    return [r["b"] for r in rows(ctx.engine, f"SELECT boundary_seq AS b FROM {table} WHERE run_id = :id "
                                 "ORDER BY boundary_seq", id=run_id)]


def effect_lines(effect: Path) -> list[str]:
    return effect.read_text().splitlines()


def test_a_fork_at_round_3_reruns_nothing_before_it_and_completes(
    cluster: Cluster, api: ApiServer, ctx, db_url: str, tmp_path: Path
) -> None:
    cluster.start_worker("w1")
    wait_ready(cluster, "w1")
    effect = tmp_path / "effect.txt"
    parent = submitted(ctx, effect)
    assert wait_terminal(ctx.engine, parent)["status"] == "completed"
    assert calls_per_boundary(ctx.engine, parent) == {b: 1 for b in range(6)}

    # The CLI: fork at round 3, a user message added after it, the script's answer changed.
    turns = f"model.turns={json.dumps(six_rounds(effect, last='done again'))}"
    made = cli(db_url, "fork", str(parent), "--at-round", "3", "--edit-input", "once more",
               "--config-override", turns, env=DEV)
    assert made.returncode == 0, made.stderr
    fork = UUID(made.stdout.strip())
    run = wait_terminal(ctx.engine, fork)
    assert (run["status"], run["output"], run["forked_from"], run["forked_at_round"]) == (
        "completed", "done again", parent, 3)
    # From the ledger and the tool rows: rounds 1-3 (boundaries 0-2) made no model call and
    # ran no tool in the fork; rounds 4-6 did.
    assert calls_per_boundary(ctx.engine, fork) == {3: 1, 4: 1, 5: 1}
    assert boundaries(ctx, "tool_invocations", fork) == [3, 4]
    assert boundaries(ctx, "rounds", fork) == [0, 1, 2, 3, 4, 5]
    # The at-most-once effect of round 2 executed exactly once in all.
    assert rows(ctx.engine, "SELECT run_id, boundary_seq, executions FROM tool_executions") == [
        {"run_id": parent, "boundary_seq": 1, "executions": 1}]
    assert [line.split("\t")[0] for line in effect_lines(effect)] == ["effect"]
    shown = cli(db_url, "status", str(fork))
    assert f"forked from: run {parent} at round 3" in shown.stdout, shown

    diffed = cli(db_url, "diff", str(parent), str(fork))
    assert diffed.returncode == 0, diffed.stderr
    verdicts = [line for line in diffed.stdout.splitlines() if line.startswith("round ")]
    assert verdicts == ["round 1: same", "round 2: same", "round 3: same", "round 4: differs: messages_digest",
                        "round 5: differs: messages_digest", "round 6: differs: messages_digest, response"]
    as_json = json.loads(cli(db_url, "diff", str(parent), str(fork), "--json").stdout)
    assert as_json["rounds"][5]["b"]["response"]["content"] == "done again"

    # HTTP: fork at round 2, the effect's recorded result replaced; the effect is not run.
    edit = {"tool_call_id": "call_1_0", "result": {"appended": "as if"}}
    answer = api.http.post(f"/v1/runs/{parent}/fork", json={"at_round": 2, "edit_tool_result": edit}, headers=A)
    assert answer.status_code == 201, answer.text
    body = answer.json()
    assert (body["forked_from"], body["forked_at_round"]) == (str(parent), 2)
    assert answer.headers["Location"] == f"/v1/runs/{body['run_id']}"
    edited = UUID(body["run_id"])
    assert wait_terminal(ctx.engine, edited)["status"] == "completed"
    assert min(calls_per_boundary(ctx.engine, edited)) == 2 and boundaries(ctx, "tool_executions", edited) == []
    assert len(effect_lines(effect)) == 1
    diff = client.diff(parent, edited, ctx=ctx)
    assert [(r.verdict, r.differs) for r in diff.rounds[:3]] == [
        ("same", []), ("differs", ["tool_results"]), ("differs", ["messages_digest"])]
    view = api.http.get(f"/v1/runs/{edited}", headers=A).json()
    assert (view["forked_from"], view["forked_at_round"], view["status"]) == (str(parent), 2, "completed")


def test_forks_refused_over_http_and_the_cli_store_nothing(api: ApiServer, ctx, db_url: str, tmp_path: Path) -> None:
    parent = submitted(ctx, tmp_path / "effect.txt")
    assert drive(ctx, parent)["status"] == "completed"  # in-process: no worker needed
    before = snapshot(ctx)

    refusals = [
        (uuid4(), {"at_round": 1}, A, 404, "RUN_NOT_FOUND", "run_id"),
        (parent, {"at_round": 1}, B, 404, "RUN_NOT_FOUND", "run_id"),  # another owner's run
        (parent, {"at_round": 7}, A, 422, "REQUEST_INVALID", "at_round"),
        (parent, {"at_round": 2, "edit_tool_result": {"tool_call_id": "call_9_0", "result": 1}}, A, 422,
         "REQUEST_INVALID", "edit_tool_result.tool_call_id"),
        (parent, {"at_round": 2, "config_overrides": {"policy.max_rounds": "many"}}, A, 422, "REQUEST_INVALID",
         "config_overrides.policy.max_rounds"),
        (parent, {"at_round": 2, "edit_input": "a", "edit_tool_result": {"tool_call_id": "call_1_0", "result": 1}},
         A, 422, "REQUEST_INVALID", "edit_tool_result"),
    ]
    for run_id, body, token, status, code, field in refusals:
        answer = api.http.post(f"/v1/runs/{run_id}/fork", json=body, headers=token)
        error = error_of(answer)
        assert (answer.status_code, error["code"], error["field"]) == (status, code, field), answer.text
    assert "from 0 to 6" in error_of(api.http.post(f"/v1/runs/{parent}/fork", json={"at_round": 7}, headers=A))[
        "message"]

    for args, env, says in [
        (["--at-round", "7"], DEV, "REQUEST_INVALID: at_round: run"),
        (["--at-round", "2", "--edit-tool-result", "call_9_0=1"], DEV, "edit_tool_result.tool_call_id"),
        (["--at-round", "2", "--edit-tool-result", "call_1_0=not json"], DEV, "--edit-tool-result call_1_0 is not"),
        (["--at-round", "2", "--config-override", "policy.max_rounds"], DEV, "give PATH=JSON"),
        (["--at-round", "2"], {}, "AIDAWORK_SECRET_KEY is not set"),
    ]:
        refused = cli(db_url, "fork", str(parent), *args, env=env)
        assert refused.returncode == 2 and says in refused.stderr and refused.stdout == "", (args, refused)
    unknown = cli(db_url, "fork", str(uuid4()), "--at-round", "1", env=DEV)
    assert unknown.returncode == 2 and "no run" in unknown.stderr
    assert cli(db_url, "diff", str(parent), str(uuid4())).returncode == 2
    assert_unchanged(ctx, before, "refused forks")
