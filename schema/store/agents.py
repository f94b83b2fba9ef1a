"""Saved agents: create, update (a new version), read, list and delete, each one
transaction. Every query names the owner, so another owner's agent is not found, exactly
like one that does not exist. The caller validates the config first (``worker.client``:
``prepare_turn``, the same check a run's config gets), so a refused request stores nothing.

Versions are never changed: an update inserts the next version. Two writers racing for a
name or a version meet on the primary key (owner, name, version): the loser's insert does
nothing, and ``create`` reports ``AgentExists`` while ``update`` reads the winner's version
and goes on from it (bounded)."""

from __future__ import annotations

import json
from collections.abc import Sequence

from sqlalchemy import Connection, Engine, text

from schema.store.errors import AgentExists, AgentNotFound
from schema.store.tx import run_transaction
from schema.wire.agents import AgentView
from schema.wire.json import JsonMapping

_COLUMNS = "owner, name, version, description, config, overridable, created_at"
_LIVE = "owner = :owner AND name = :name AND deleted_at IS NULL"

# The next version follows every version the name ever had (deleted ones included), so a
# NAME@VERSION a run recorded never comes to mean another config.
_INSERT_SQL = text(
    f"""
INSERT INTO agents (owner, name, version, description, config, overridable)
SELECT :owner, :name, coalesce(max(version), 0) + 1, :description, CAST(:config AS jsonb),
       CAST(:overridable AS jsonb)
FROM agents WHERE owner = :owner AND name = :name
ON CONFLICT DO NOTHING
RETURNING {_COLUMNS}
"""
)
_LATEST_SQL = text(f"SELECT {_COLUMNS} FROM agents WHERE {_LIVE} ORDER BY version DESC LIMIT 1")
_VERSION_SQL = text(f"SELECT {_COLUMNS} FROM agents WHERE {_LIVE} AND version = :version")
_LIST_SQL = text(
    f"SELECT DISTINCT ON (name) {_COLUMNS} FROM agents WHERE owner = :owner AND deleted_at IS NULL "
    "ORDER BY name, version DESC"
)
_DELETE_SQL = text(f"UPDATE agents SET deleted_at = now() WHERE {_LIVE} RETURNING version")
_RACE_TRIES = 3


def _view(row: object) -> AgentView:
    return AgentView.model_validate(dict(row._mapping))  # type: ignore[attr-defined]


def split_ref(ref: str) -> tuple[str, int | None]:
    """``NAME`` or ``NAME@VERSION`` as (name, version or None)."""
    name, _, version = ref.partition("@")
    return name, int(version) if version else None


def _insert(conn: Connection, owner: str, name: str, spec: JsonMapping) -> AgentView | None:
    params = {
        "owner": owner,
        "name": name,
        "description": spec.get("description", ""),
        "config": json.dumps(spec["config"]),
        "overridable": json.dumps(spec.get("overridable", [])),
    }
    row = conn.execute(_INSERT_SQL, params).one_or_none()
    return None if row is None else _view(row)


def create_agent_txn(conn: Connection, owner: str, name: str, spec: JsonMapping) -> AgentView:
    """Version 1 of a new name (or the next number after a deleted agent's last);
    ``AgentExists`` when the name has a live version."""
    if conn.execute(_LATEST_SQL, {"owner": owner, "name": name}).one_or_none() is not None:
        raise AgentExists(owner, name)
    made = _insert(conn, owner, name, spec)
    if made is None:  # a concurrent create took the number first
        raise AgentExists(owner, name)
    return made


def get_agent_txn(conn: Connection, owner: str, ref: str) -> AgentView:
    """``NAME`` (its latest version) or ``NAME@VERSION``; ``AgentNotFound`` otherwise."""
    name, version = split_ref(ref)
    if version is None:
        row = conn.execute(_LATEST_SQL, {"owner": owner, "name": name}).one_or_none()
    else:
        row = conn.execute(_VERSION_SQL, {"owner": owner, "name": name, "version": version}).one_or_none()
    if row is None:
        raise AgentNotFound(owner, ref)
    return _view(row)


def list_agents_txn(conn: Connection, owner: str) -> list[AgentView]:
    """The latest version of each of ``owner``'s agents, by name."""
    return [_view(row) for row in conn.execute(_LIST_SQL, {"owner": owner})]


def delete_agent_txn(conn: Connection, owner: str, name: str) -> int:
    """Delete every version of ``name`` (runs that already ran keep their record); returns
    how many versions there were. ``AgentNotFound`` when it has none."""
    deleted: Sequence[object] = conn.execute(_DELETE_SQL, {"owner": owner, "name": name}).all()
    if not deleted:
        raise AgentNotFound(owner, name)
    return len(deleted)


def create_agent(engine: Engine, owner: str, name: str, spec: JsonMapping) -> AgentView:
    return run_transaction(engine, lambda conn: create_agent_txn(conn, owner, name, spec), name="create_agent")


def update_agent(engine: Engine, owner: str, name: str, spec: JsonMapping) -> AgentView:
    """The next version of a live agent, with ``spec`` (whole: the caller merged the
    change into the latest version); ``AgentNotFound`` when it has none."""

    def txn(conn: Connection) -> AgentView:
        get_agent_txn(conn, owner, name)
        for _ in range(_RACE_TRIES):
            made = _insert(conn, owner, name, spec)
            if made is not None:
                return made
        raise RuntimeError(f"agent {name!r}: {_RACE_TRIES} concurrent updates took every version number tried")

    return run_transaction(engine, txn, name="update_agent")


def get_agent(engine: Engine, owner: str, ref: str) -> AgentView:
    with engine.connect() as conn:
        return get_agent_txn(conn, owner, ref)


def list_agents(engine: Engine, owner: str) -> list[AgentView]:
    with engine.connect() as conn:
        return list_agents_txn(conn, owner)


def delete_agent(engine: Engine, owner: str, name: str) -> int:
    return run_transaction(engine, lambda conn: delete_agent_txn(conn, owner, name), name="delete_agent")
