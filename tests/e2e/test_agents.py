"""Saved agents over the HTTP API and the ``aidawork agent`` commands, against a real API
process, PostgreSQL and worker: versions, a run that names an agent and completes with
the version recorded, another tenant's agent not found, and refusals that store nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.support.api import A, ApiServer, B
from tests.support.cluster import Cluster, cli, wait_ready
from tests.support.db import rows
from tests.support.requests import scripted_request
from tests.support.wait import wait_until


def config(prompt: str = "be brief") -> dict[str, Any]:
    return scripted_request([{"content": "hello"}], system_prompt=prompt)["config"]


def count(api_ctx: Any, sql: str) -> int:
    return int(rows(api_ctx.engine, sql)[0]["n"])


def test_agents_over_http_are_versioned_scoped_to_their_owner_and_run(api: ApiServer, cluster: Cluster, ctx) -> None:
    body = {"name": "greeter", "description": "says hello", "config": config("one"), "overridable": ["system_prompt"]}
    created = api.http.post("/v1/agents", json=body, headers=A)
    assert created.status_code == 201 and created.json()["version"] == 1
    assert api.http.post("/v1/agents", json=body, headers=A).json()["error"]["code"] == "AGENT_EXISTS"
    updated = api.http.patch("/v1/agents/greeter", json={"config": config("two")}, headers=A)
    assert updated.status_code == 200 and updated.json()["version"] == 2
    assert api.http.get("/v1/agents/greeter@1", headers=A).json()["config"]["system_prompt"] == "one"
    assert [a["version"] for a in api.http.get("/v1/agents", headers=A).json()["agents"]] == [2]
    # Another tenant sees nothing of it: not listed, not found, not runnable.
    assert api.http.get("/v1/agents", headers=B).json() == {"agents": []}
    assert api.http.get("/v1/agents/greeter", headers=B).status_code == 404
    refused = api.http.post("/v1/runs", json={"agent": "greeter", "input": "hi"}, headers=B)
    assert (refused.status_code, refused.json()["error"]["code"]) == (422, "AGENT_NOT_FOUND")

    cluster.start_worker("w1")
    wait_ready(cluster, "w1")
    run = api.http.post(
        "/v1/runs", json={"agent": "greeter@1", "input": "hi", "overrides": {"system_prompt": "three"}}, headers=A
    ).json()

    def ended() -> dict[str, Any] | None:
        view = api.http.get(f"/v1/runs/{run['run_id']}", headers=A).json()
        return view if view["status"] == "completed" else None

    view = wait_until(ended, what="the agent's run to complete")
    assert (view["agent"], view["output"]) == ("greeter@1", "hello")
    assert rows(ctx.engine, "SELECT config->>'system_prompt' AS p FROM runs")[0]["p"] == "three"
    assert api.http.delete("/v1/agents/greeter", headers=A).json() == {"name": "greeter", "deleted_versions": 2}
    assert api.http.get("/v1/agents/greeter@1", headers=A).status_code == 404


def test_bad_agent_requests_are_refused_naming_the_field_and_store_nothing(api: ApiServer, ctx) -> None:
    api.http.post("/v1/agents", json={"name": "greeter", "config": config()}, headers=A)
    cases = [
        ("/v1/agents", {"name": "bad name", "config": config()}, 422, "name"),
        ("/v1/agents", {"name": "other", "config": {**config(), "tools": ["nope"]}}, 422, "config.tools[0]"),
        ("/v1/agents", {"name": "other", "config": config(), "overridable": ["colour"]}, 422, "overridable[0]"),
        ("/v1/runs", {"agent": "greeter", "input": "hi", "overrides": {"system_prompt": "x"}}, 422,
         "overrides.system_prompt"),
        ("/v1/runs", {"agent": "greeter", "input": "hi", "config": config()}, 422, "agent"),
        ("/v1/runs", {"agent": "nobody", "input": "hi"}, 422, "agent"),
    ]
    for path, body, status, field in cases:
        answer = api.http.post(path, json=body, headers=A)
        assert (answer.status_code, answer.json()["error"]["field"]) == (status, field), (path, body, answer.text)
    patched = api.http.patch("/v1/agents/greeter", json={}, headers=A)
    assert (patched.status_code, patched.json()["error"]["field"]) == (422, "change")
    assert api.http.patch("/v1/agents/nobody", json={"description": "x"}, headers=A).status_code == 404
    assert count(ctx, "SELECT count(*) AS n FROM runs") == 0
    assert count(ctx, "SELECT count(*) AS n FROM agents") == 1


def test_the_agent_commands_create_update_show_list_and_delete(db_url: str, tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config("one")))
    made = cli(db_url, "agent", "create", "greeter", "--owner", "team-a", "--config", str(path),
               "--description", "says hello", "--overridable", "system_prompt")
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["version"] == 1
    updated = cli(db_url, "agent", "update", "greeter", "--owner", "team-a", "--config", "-",
                  stdin=json.dumps(config("two")))
    assert json.loads(updated.stdout)["version"] == 2, updated.stderr
    shown = cli(db_url, "agent", "show", "greeter@1", "--owner", "team-a")
    assert json.loads(shown.stdout)["config"]["system_prompt"] == "one"
    assert cli(db_url, "agent", "list", "--owner", "team-a").stdout.split() == ["greeter@2", "says", "hello"]
    again = cli(db_url, "agent", "create", "greeter", "--owner", "team-a", "--config", str(path))
    assert again.returncode == 2 and "AGENT_EXISTS" in again.stderr
    other = cli(db_url, "agent", "show", "greeter", "--owner", "team-b")
    assert other.returncode == 2 and "no saved agent 'greeter'" in other.stderr
    bad = cli(db_url, "agent", "create", "x", "--owner", "team-a", "--config", "-", stdin="{")
    assert bad.returncode == 2 and "--config is not valid JSON" in bad.stderr
    deleted = cli(db_url, "agent", "delete", "greeter", "--owner", "team-a")
    assert json.loads(deleted.stdout) == {"name": "greeter", "deleted_versions": 2}
