"""Saved agents through ``worker.client`` on a real PostgreSQL: versions are immutable and
numbered once, a run resolves NAME or NAME@VERSION (with the overrides the agent allows)
and records the version, and every bad request is refused naming the field, storing
nothing."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from runtime.errors import RequestInvalid
from schema.store.errors import AgentExists, AgentNotFound
from tests.support.db import rows
from tests.support.requests import scripted_request
from worker import client

OWNER = "team-test"


def spec(prompt: str = "be brief", **extra: Any) -> dict[str, Any]:
    config = scripted_request([{"content": "done"}], system_prompt=prompt)["config"]
    return {"description": "a helper", "config": config, **extra}


def stored(ctx: Any) -> list[tuple[Any, ...]]:
    return [tuple(r.values()) for r in rows(ctx.engine, "SELECT owner, name, version FROM agents ORDER BY 1, 2, 3")]


def test_every_update_makes_a_new_immutable_version(ctx) -> None:
    v1 = client.create_agent(OWNER, "helper", spec("one"), ctx=ctx)
    v2 = client.update_agent(OWNER, "helper", {"config": spec("two")["config"]}, ctx=ctx)
    v3 = client.update_agent(OWNER, "helper", {"description": "now terser"}, ctx=ctx)
    assert (v1.version, v2.version, v3.version) == (1, 2, 3)
    assert client.get_agent(OWNER, "helper@1", ctx=ctx).config["system_prompt"] == "one"
    assert client.get_agent(OWNER, "helper", ctx=ctx) == v3
    assert v3.config["system_prompt"] == "two" and v3.description == "now terser"
    assert [a.ref for a in client.list_agents(OWNER, ctx=ctx)] == ["helper@3"]


def test_a_run_names_an_agent_and_records_the_exact_version(ctx) -> None:
    client.create_agent(OWNER, "helper", spec("one", overridable=["system_prompt"]), ctx=ctx)
    client.update_agent(OWNER, "helper", {"config": spec("two")["config"]}, ctx=ctx)
    latest = client.submit({"owner": OWNER, "agent": "helper", "input": "hi"}, ctx=ctx)
    pinned = client.submit(
        {"owner": OWNER, "agent": "helper@1", "input": "hi", "overrides": {"system_prompt": "three"}}, ctx=ctx
    )
    assert client.status(latest.run_id, ctx=ctx).agent == "helper@2"
    assert client.status(pinned.run_id, ctx=ctx).agent == "helper@1"
    prompts = rows(ctx.engine, "SELECT id, config->>'system_prompt' AS prompt FROM runs")
    assert {r["id"]: r["prompt"] for r in prompts} == {latest.run_id: "two", pinned.run_id: "three"}


@pytest.mark.parametrize(
    ("request_fields", "error", "field"),
    [
        ({"agent": "nobody"}, AgentNotFound, None),
        ({"agent": "helper@9"}, AgentNotFound, None),
        ({"agent": "helper", "overrides": {"model": {"turns": []}}}, RequestInvalid, "overrides.model.turns"),
        ({"agent": "helper", "overrides": {"system_prompt": 5}}, RequestInvalid, "overrides.system_prompt"),
        ({"agent": "bad name"}, RequestInvalid, "agent"),
        ({"agent": "helper", "config": {"model": {"provider": "scripted"}}}, RequestInvalid, "agent"),
        ({"overrides": {"system_prompt": "x"}, "config": spec()["config"]}, RequestInvalid, "overrides"),
        ({}, RequestInvalid, "config"),
    ],
)
def test_a_bad_agent_run_is_refused_naming_the_field_and_stores_nothing(
    ctx, request_fields: dict[str, Any], error: type[Exception], field: str | None
) -> None:
    client.create_agent(OWNER, "helper", spec(overridable=["system_prompt"]), ctx=ctx)
    with pytest.raises(error) as caught:
        client.submit({"owner": OWNER, "input": "hi", **request_fields}, ctx=ctx)
    if field is not None:
        assert caught.value.field == field  # type: ignore[attr-defined]
    assert rows(ctx.engine, "SELECT count(*) AS n FROM runs")[0]["n"] == 0


def test_another_owners_agent_is_not_found_like_a_missing_one(ctx) -> None:
    client.create_agent("team-other", "helper", spec(), ctx=ctx)
    with pytest.raises(AgentNotFound):
        client.get_agent(OWNER, "helper", ctx=ctx)
    with pytest.raises(AgentNotFound):
        client.submit({"owner": OWNER, "agent": "helper", "input": "hi"}, ctx=ctx)
    with pytest.raises(AgentNotFound):
        client.update_agent(OWNER, "helper", {"description": "mine now"}, ctx=ctx)
    with pytest.raises(AgentNotFound):
        client.delete_agent(OWNER, "helper", ctx=ctx)
    assert client.list_agents(OWNER, ctx=ctx) == []
    assert stored(ctx) == [("team-other", "helper", 1)]


@pytest.mark.parametrize(
    ("name", "body", "field"),
    [
        ("bad name", spec(), "name"),
        ("helper", {"config": {"model": {"provider": "nope"}}}, "config.model.provider"),
        ("helper", spec(overridable=["model..x"]), "overridable[0]"),
        ("helper", spec(overridable=["colour"]), "overridable[0]"),
        ("helper", {**spec(), "tools": []}, "tools"),
        ("helper", {**spec(), "config": {**spec()["config"], "tools": ["no_such_tool"]}}, "config.tools[0]"),
    ],
)
def test_a_bad_agent_spec_is_refused_naming_the_field(ctx, name: str, body: dict[str, Any], field: str) -> None:
    with pytest.raises(RequestInvalid) as caught:
        client.create_agent(OWNER, name, body, ctx=ctx)
    assert caught.value.field == field
    assert stored(ctx) == []


def test_a_name_is_created_once_and_a_deleted_agents_numbers_are_never_reused(ctx) -> None:
    client.create_agent(OWNER, "helper", spec(), ctx=ctx)
    with pytest.raises(AgentExists):
        client.create_agent(OWNER, "helper", spec(), ctx=ctx)
    client.update_agent(OWNER, "helper", {"description": "v2"}, ctx=ctx)
    assert client.delete_agent(OWNER, "helper", ctx=ctx) == 2
    with pytest.raises(AgentNotFound):
        client.submit({"owner": OWNER, "agent": "helper@1", "input": "hi"}, ctx=ctx)
    again = client.create_agent(OWNER, "helper", spec(), ctx=ctx)
    assert again.version == 3


def test_concurrent_updates_each_get_their_own_version(ctx) -> None:
    client.create_agent(OWNER, "helper", spec(), ctx=ctx)
    made: list[int] = []
    errors: list[BaseException] = []

    def update(i: int) -> None:
        try:
            made.append(client.update_agent(OWNER, "helper", {"description": f"d{i}"}, ctx=ctx).version)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=update, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and sorted(made) == [2, 3, 4, 5]
