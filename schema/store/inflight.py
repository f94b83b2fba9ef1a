"""What the deploy gate reads (``aidawork deploy-check``): every run that has not ended, with
the suspended calls of its current round, and the saved agent versions that exist. One
read-only transaction, one snapshot: it writes nothing, and every run is seen as of the
same moment."""

from __future__ import annotations

from uuid import UUID

from sqlalchemy import Connection, Engine, text

from schema.store.tx import run_transaction
from schema.wire import RunStatus
from schema.wire.deploy import PendingCall, UnendedRun

_ACTIVE = "('queued', 'running', 'suspended')"

_RUNS_SQL = text(f"SELECT id, owner, status, agent, config FROM runs WHERE status IN {_ACTIVE} ORDER BY created_at, id")

# The suspended calls of each run's current round (as ``schema.store.suspensions`` reads
# them), with the args they will run with: as a person approved them, maybe edited.
_PENDING_SQL = text(
    f"""
SELECT ti.run_id, ti.tool_call_id, ti.tool_name, ti.suspension->>'kind' AS kind,
       CASE WHEN ti.approval->>'decision' = 'approve' AND ti.approval->'args' IS NOT NULL
            THEN ti.approval->'args' ELSE ti.args END AS args
FROM runs AS r
JOIN rounds AS rd ON rd.run_id = r.id AND rd.boundary_seq = r.boundary_seq AND rd.outcome = 'suspend'
JOIN tool_invocations AS ti ON ti.run_id = r.id AND ti.boundary_seq = r.boundary_seq AND ti.status = 'suspended'
WHERE r.status IN {_ACTIVE}
ORDER BY ti.id
"""
)

_AGENTS_SQL = text("SELECT owner, name, version FROM agents WHERE deleted_at IS NULL")

# (owner, name, version) of each saved agent version a run may name.
AgentVersion = tuple[str, str, int]


def _read_txn(conn: Connection) -> tuple[list[UnendedRun], set[AgentVersion]]:
    conn.execute(text("SET TRANSACTION READ ONLY"))
    pending: dict[UUID, list[PendingCall]] = {}
    for row in conn.execute(_PENDING_SQL):
        args = row.args if isinstance(row.args, dict) else {}
        pending.setdefault(row.run_id, []).append(
            PendingCall(tool_call_id=row.tool_call_id, tool_name=row.tool_name, kind=row.kind or "", args=args)
        )
    runs = [
        UnendedRun(
            run_id=row.id,
            owner=row.owner,
            status=RunStatus(row.status),
            agent=row.agent,
            config=row.config,
            pending_calls=pending.get(row.id, []),
        )
        for row in conn.execute(_RUNS_SQL)
    ]
    agents = {(row.owner, row.name, row.version) for row in conn.execute(_AGENTS_SQL)}
    return runs, agents


def read_unended(engine: Engine) -> tuple[list[UnendedRun], set[AgentVersion]]:
    """The runs not ended, oldest first, and the saved agent versions not deleted."""
    return run_transaction(engine, _read_txn, isolation_level="REPEATABLE READ", name="read_unended")
