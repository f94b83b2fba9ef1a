"""``aidawork export`` and ``aidawork replay`` on the real stack: a multi-round run with
tools, run by a real worker, exported from PostgreSQL; its replay with the recorded model
reproduces every round's digests; the same case against a later version of a tool's plugin
(or a config without the tool) fails closed naming the round; an edited case, an unknown
run and another owner's run are refused (exit 2) with nothing written; and the pytest
plugin collects a folder of cases as tests, one passing and one drifted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import pytest

from tests.support.cases import tool_turns
from tests.support.cluster import Cluster, cli, wait_ready
from tests.support.db import round_rows, wait_terminal
from tests.support.env import BROKER_URL, REPO
from tests.support.requests import scripted_request
from tests.support.suspensions import assert_unchanged, snapshot
from worker import client
from worker.client.context import ClientContext, build_client_context
from worker.ops.settings import Settings

PLUGINS_DIR = REPO / "tests" / "support" / "plugins"
V1, V2 = "replay_lookup_v1", "replay_lookup_v2"
LOOKUP_RUN = tool_turns([("add", {"a": 2, "b": 3}), ("lookup", {"q": "word"}), ("echo", {"n": [1, 2.5]})])
PLAIN_RUN = tool_turns([("add", {"a": 1, "b": 1}), ("echo", {"x": "y"})])


def plugin_env(plugin: str) -> dict[str, str]:
    return {"AIDAWORK_PLUGINS": plugin, "AIDAWORK_DEV": "1",
            "PYTHONPATH": f"{PLUGINS_DIR}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


@pytest.fixture
def plugged(cluster: Cluster, db_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[ClientContext]:
    """A worker with version 1 of the lookup plugin, and a client context that has it too."""
    monkeypatch.syspath_prepend(str(PLUGINS_DIR))
    context = build_client_context(Settings(database_url=db_url, broker_url=BROKER_URL, plugins=V1))
    cluster.start_worker("w1", concurrency=2, env=plugin_env(V1))
    wait_ready(cluster, "w1")
    yield context
    context.engine.dispose()


def run_to_end(ctx: ClientContext, turns: list[dict[str, Any]], tools: tuple[str, ...] = ("add", "echo", "lookup"),
               *, owner: str = "team-replay") -> UUID:
    request = scripted_request(turns, tools=tools, owner=owner)
    run_id = client.submit(request, ctx=ctx).run_id
    assert wait_terminal(ctx.engine, run_id)["status"] == "completed"
    return run_id


def export(db_url: str, run_id: UUID, path: Path, *extra: str) -> str:
    done = cli(db_url, "export", str(run_id), *extra, env=plugin_env(V1))
    assert done.returncode == 0, done.stderr
    path.write_text(done.stdout, encoding="utf-8")
    return done.stderr


def replay(db_url: str, path: Path, *extra: str, plugin: str = V1) -> subprocess.CompletedProcess[str]:
    return cli(db_url, "replay", str(path), *extra, env=plugin_env(plugin))


def test_a_replay_with_the_recorded_model_reproduces_every_rounds_digests(
    plugged: ClientContext, db_url: str, tmp_path: Path
) -> None:
    run_id = run_to_end(plugged, LOOKUP_RUN)
    path = tmp_path / "run.case.json"
    said = export(db_url, run_id, path)
    case = json.loads(path.read_text())
    assert case["format"] == "aidawork.case/1"
    assert f"chain digest {case['chain_digest']} (4 rounds)" in said

    stored = round_rows(plugged.engine, run_id)
    exported = [(r["request"]["system_digest"], r["request"]["messages_digest"], r["request"]["tools_digest"],
                 r["response_digest"], r["proof"]) for r in case["rounds"]]
    assert exported == [(r["system_digest"], r["messages_digest"], r["tools_digest"], r["accepted_response_digest"],
                         r["proof"]) for r in stored]

    before = snapshot(plugged)
    done = replay(db_url, path, "--json", "--chain", case["chain_digest"])
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] is True and report["proofs_checked"] is True
    assert [(r["round"], r["status"]) for r in report["rounds"]] == [(1, "same"), (2, "same"), (3, "same"),
                                                                      (4, "same")]
    assert_unchanged(plugged, before, "a replay")

    # The same config saved as the owner's agent: replayed with --agent NAME@VERSION.
    client.create_agent("team-replay", "looker", {"config": case["run"]["config"]}, ctx=plugged)
    by_agent = replay(db_url, path, "--agent", "looker@1")
    assert by_agent.returncode == 0, by_agent.stdout + by_agent.stderr
    assert "FAILED" not in by_agent.stdout and "round 4: same" in by_agent.stdout, by_agent.stdout
    gone = replay(db_url, path, "--agent", "looker@2")
    assert gone.returncode == 2 and "no saved agent 'looker@2'" in gone.stderr, gone.stderr


def test_a_replay_after_a_tools_schema_changed_fails_closed_naming_the_round(
    plugged: ClientContext, db_url: str, tmp_path: Path
) -> None:
    path = tmp_path / "run.case.json"
    export(db_url, run_to_end(plugged, LOOKUP_RUN), path)

    upgraded = replay(db_url, path, plugin=V2)  # lookup(q) became lookup(query)
    assert upgraded.returncode == 1, upgraded.stdout + upgraded.stderr
    # Rounds counted from 1 (as aidawork diff counts): the lookup call is round 2's.
    assert "round 2: differs (tools, schema) - DRIFT: lookup: the call's args no longer validate" in upgraded.stdout
    assert "FAILED CLOSED at round 2" in upgraded.stdout
    assert "round 3: missing" in upgraded.stdout  # nothing ran after the drift

    config = json.loads(path.read_text())["run"]["config"]
    variant = tmp_path / "variant.json"
    variant.write_text(json.dumps({**config, "tools": ["add", "echo"]}))
    dropped = replay(db_url, path, "--config", str(variant), "--json")
    assert dropped.returncode == 1, dropped.stdout + dropped.stderr
    rounds = json.loads(dropped.stdout)["rounds"]
    assert rounds[1]["status"] == "differs" and "tool_name" in rounds[1]["what"]
    assert "lookup: the tool is not enabled" in rounds[1]["drift"]


def test_a_tampered_case_an_unknown_run_and_another_owners_run_are_refused(
    plugged: ClientContext, db_url: str, tmp_path: Path
) -> None:
    run_id = run_to_end(plugged, LOOKUP_RUN)
    path = tmp_path / "run.case.json"
    export(db_url, run_id, path)
    before = snapshot(plugged)

    case = json.loads(path.read_text())
    case["rounds"][1]["tool_calls"][0]["result"] = {"found": "FORGED"}
    tampered = tmp_path / "tampered.case.json"
    tampered.write_text(json.dumps(case))
    refused = replay(db_url, tampered)
    assert refused.returncode == 2 and refused.stdout == ""
    assert "aidawork: error: CASE_TAMPERED: round 2: tool call call_1_0: its result does not match" in refused.stderr

    wrong_chain = replay(db_url, path, "--chain", "0" * 64)
    assert wrong_chain.returncode == 2 and "not at the published" in wrong_chain.stderr

    unknown = cli(db_url, "export", str(uuid4()), env=plugin_env(V1))
    assert (unknown.returncode, unknown.stdout) == (2, "") and "no run" in unknown.stderr
    other = cli(db_url, "export", str(run_id), "--owner", "team-other", env=plugin_env(V1))
    assert (other.returncode, other.stdout) == (2, "") and f"no run {run_id}" in other.stderr
    mine = cli(db_url, "export", str(run_id), "--owner", "team-replay", env=plugin_env(V1))
    assert mine.returncode == 0 and json.loads(mine.stdout)["chain_digest"] == case["chain_digest"]
    assert_unchanged(plugged, before, "the refused commands")


def test_the_pytest_plugin_collects_a_folder_of_cases_one_passing_one_drifted(
    plugged: ClientContext, db_url: str, tmp_path: Path
) -> None:
    cases = tmp_path / "cases"
    cases.mkdir()
    export(db_url, run_to_end(plugged, PLAIN_RUN, ("add", "echo")), cases / "plain.case.json")  # no lookup
    export(db_url, run_to_end(plugged, LOOKUP_RUN), cases / "lookup.case.json")
    (cases / "notes.json").write_text("{}")  # not a case: not collected

    env = {k: v for k, v in os.environ.items() if not k.startswith("AIDAWORK_")}
    env.update(plugin_env(V2))  # the next release: lookup's schema changed
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "worker.client.replay.pytest_plugin", "-p", "no:cacheprovider",
         "-c", os.devnull, "--rootdir", str(cases), "-q", str(cases)],
        cwd=cases, env=env, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 failed, 1 passed" in done.stdout
    assert "FAILED lookup.case.json::lookup" in done.stdout
    assert "FAILED CLOSED at round 2: lookup: the call's args no longer validate" in done.stdout
