"""``aidawork deploy-check`` on the real stack: a run suspended on a plugin tool's approval is
flagged (run, kind, field, pending call; exit 1, the ``--json`` shape) when the release to
deploy lacks that plugin, and passes (exit 0) when it has it; a run made from a saved agent
version that the ``--agents`` directory drops is flagged; bad input exits 2; and no check
writes a row."""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

from tests.support.cluster import Cluster, cli, wait_exit, wait_ready
from tests.support.db import all_rows_as_text, wait_suspended
from tests.support.env import BROKER_URL
from tests.support.requests import scripted_request
from worker import client
from worker.client.context import ClientContext, build_client_context
from worker.ops.settings import Settings

EXTRA = "aidawork_example.extra"  # word_count: a plugin no entry point advertises
WITH_EXTRA = {"AIDAWORK_PLUGINS": EXTRA}
REPORT_KEYS = {"compatible", "checked", "affected", "plugins", "agents_dir", "runs"}
RUN_KEYS = {"run_id", "owner", "status", "agent", "problems"}
PROBLEM_KEYS = {"kind", "field", "message", "tool_call_id"}


@pytest.fixture
def plugged(db_url: str, redis_clean: None) -> Iterator[ClientContext]:
    """A client context (this test process) that loaded the same plugin as the workers."""
    context = build_client_context(Settings(database_url=db_url, broker_url=BROKER_URL, plugins=EXTRA))
    yield context
    context.engine.dispose()


def deploy_check(db_url: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return cli(db_url, "deploy-check", *args, env=env)


def report_of(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    report: dict[str, Any] = json.loads(done.stdout)
    assert set(report) == REPORT_KEYS
    for run in report["runs"]:
        assert set(run) == RUN_KEYS
        assert all(set(p) == PROBLEM_KEYS for p in run["problems"])
    return report


def waits_for_approval(ctx: ClientContext, tool: str, args: dict[str, Any]) -> UUID:
    turns = [{"tool_calls": [{"name": tool, "args": args}]}, {"content": "done"}]
    request = scripted_request(turns, tools=["echo", tool] if tool != "echo" else ["echo"], require_approval=[tool])
    return client.submit(request, ctx=ctx).run_id


def test_a_run_waiting_on_a_removed_plugin_tool_is_flagged_and_nothing_is_written(
    cluster: Cluster, plugged: ClientContext, db_url: str
) -> None:
    cluster.start_worker("w1", concurrency=2, env=WITH_EXTRA)
    wait_ready(cluster, "w1")
    on_plugin = waits_for_approval(plugged, "word_count", {"text": "the quick brown fox"})
    on_builtin = waits_for_approval(plugged, "echo", {"x": 1})
    for run_id in (on_plugin, on_builtin):
        wait_suspended(plugged.engine, run_id)
    # No process writes from here on: every row must stay as it is.
    cluster.signal("w1", signal.SIGTERM)
    assert wait_exit(cluster, "w1") == 0
    before = all_rows_as_text(plugged)  # type: ignore[arg-type]

    # The release to deploy has the plugin: both runs carry on.
    same = deploy_check(db_url, "--json", env=WITH_EXTRA)
    assert same.returncode == 0, same.stderr
    report = report_of(same)
    assert (report["compatible"], report["checked"], report["affected"], report["runs"]) == (True, 2, 0, [])
    assert report["plugins"][0] == EXTRA

    # It lacks the plugin (--plugins "" over AIDAWORK_PLUGINS): the run waiting on word_count breaks.
    lacking = deploy_check(db_url, "--json", "--plugins", "", env=WITH_EXTRA)
    assert lacking.returncode == 1, lacking.stderr
    report = report_of(lacking)
    assert (report["compatible"], report["checked"], report["affected"]) == (False, 2, 1)
    assert EXTRA not in report["plugins"]
    (run,) = report["runs"]
    assert (run["run_id"], run["status"], run["owner"], run["agent"]) == (
        str(on_plugin), "suspended", "team-test", None
    )
    assert [(p["kind"], p["field"], p["tool_call_id"]) for p in run["problems"]] == [
        ("tool_missing", "config.tools[1]", None),
        ("tool_missing", "pending_calls[call_0_0]", "call_0_0"),
    ]
    assert "'word_count'" in run["problems"][1]["message"] and "approval" in run["problems"][1]["message"]

    human = deploy_check(db_url, "--plugins", "", env=WITH_EXTRA)
    assert human.returncode == 1, human.stderr
    lines = human.stdout.splitlines()
    assert [line for line in lines if line.startswith("run ")] == [
        f"run {on_plugin} (suspended, owner team-test): tool_missing: {p['message']}" for p in run["problems"]
    ]
    assert lines[-1] == "2 run(s) not ended; 1 affected: this code would break them"
    assert str(on_builtin) not in human.stdout

    assert all_rows_as_text(plugged) == before


def test_a_saved_agent_version_the_deploy_drops_is_flagged_and_bad_input_exits_2(
    ctx: Any, db_url: str, tmp_path: Path
) -> None:
    config = {"model": {"provider": "scripted", "turns": [{"content": "done"}]}, "tools": ["echo"]}
    client.create_agent("team-test", "triage", {"config": config}, ctx=ctx)
    run_id = client.submit({"owner": "team-test", "input": "go", "agent": "triage@1"}, ctx=ctx).run_id  # no worker
    other = client.submit(scripted_request([{"content": "done"}]), ctx=ctx).run_id
    before = all_rows_as_text(ctx)
    agents = tmp_path / "agents"
    agents.mkdir()

    # triage.json: the agent is kept, with the versions the database has.
    (agents / "triage.json").write_text(json.dumps(config))
    kept = deploy_check(db_url, "--agents", str(agents), "--json")
    assert kept.returncode == 0, kept.stderr
    assert report_of(kept)["agents_dir"] == str(agents)

    # Only triage@2 after the deploy: the run made from triage@1 is affected, the other is not.
    (agents / "triage.json").unlink()
    (agents / "triage@2.json").write_text(json.dumps(config))
    dropped = deploy_check(db_url, "--agents", str(agents), "--json")
    assert dropped.returncode == 1, dropped.stderr
    report = report_of(dropped)
    assert (report["checked"], report["affected"]) == (2, 1)
    (run,) = report["runs"]
    assert (run["run_id"], run["status"], run["agent"]) == (str(run_id), "queued", "triage@1")
    assert [(p["kind"], p["field"]) for p in run["problems"]] == [("agent_version_gone", "agent")]
    assert str(other) not in dropped.stdout

    (agents / "triage@1.json").write_text(json.dumps(config))
    assert deploy_check(db_url, "--agents", str(agents)).returncode == 0

    # Bad input: exit 2, one line naming it, nothing checked.
    missing = deploy_check(db_url, "--agents", str(tmp_path / "nowhere"))
    assert (missing.returncode, missing.stdout) == (2, "")
    assert missing.stderr.strip() == f"aidawork: error: --agents: {tmp_path / 'nowhere'} is not a directory"
    (agents / "broken.json").write_text("{not json")
    unparsable = deploy_check(db_url, "--agents", str(agents))
    assert (unparsable.returncode, unparsable.stdout) == (2, "")
    assert unparsable.stderr.startswith(f"aidawork: error: --agents: {agents / 'broken.json'} is not valid JSON")
    (agents / "broken.json").write_text("[]")
    assert deploy_check(db_url, "--agents", str(agents)).returncode == 2
    (agents / "broken.json").unlink()
    (agents / "not an agent.json").write_text("{}")
    assert deploy_check(db_url, "--agents", str(agents)).returncode == 2

    assert all_rows_as_text(ctx) == before

    # Without --agents the versions are the database's: deleting the agent drops triage@1.
    client.delete_agent("team-test", "triage", ctx=ctx)
    gone = deploy_check(db_url)
    assert gone.returncode == 1, gone.stderr
    assert f"run {run_id} (queued, owner team-test): agent_version_gone:" in gone.stdout
