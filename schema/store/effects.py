"""The at-most-once record of a tool call: its start is written, fenced, before the
handler runs, and its end right after. A round re-executed after a crash (another claim)
finds the start and does not run the handler again: it takes the recorded end, or - with
no end recorded - the call's outcome is unknown and waits for an operator.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from uuid import UUID

from sqlalchemy import Connection, text

from schema.store.errors import FenceLost
from schema.wire.json import JsonValue


@dataclass(frozen=True)
class ExecutionRecord:
    """What an earlier start of the call recorded: ``status`` None when no end was."""

    status: str | None
    result: JsonValue
    executions: int


# The run must be held under ``fence``; the start is new, or (``retry_of``: an operator
# asked for it, answering that wait) an earlier start is overwritten - once per answer, so
# a retried call whose worker dies too is unknown again, not run a third time. ``held``
# tells a lost fence from a start that was already there.
_START_SQL = text(
    """
WITH held AS (
  SELECT id FROM runs WHERE id = :run_id AND claim_fence = :fence AND status = 'running'
), ins AS (
  INSERT INTO tool_executions (run_id, tool_call_id, boundary_seq, claim_fence)
  SELECT id, :call, :boundary_seq, :fence FROM held
  ON CONFLICT (run_id, tool_call_id) DO UPDATE
    SET claim_fence = EXCLUDED.claim_fence, executions = tool_executions.executions + 1, retry_of = :retry_of,
        status = NULL, result = NULL, started_at = now(), finished_at = NULL
    WHERE CAST(:retry_of AS text) IS NOT NULL AND tool_executions.retry_of IS DISTINCT FROM :retry_of
  RETURNING executions
)
SELECT (SELECT count(*) FROM held) AS held, (SELECT executions FROM ins) AS started,
       te.status, te.result, te.executions
FROM (SELECT 1) AS one
LEFT JOIN tool_executions AS te ON te.run_id = :run_id AND te.tool_call_id = :call
"""
)


def start_execution_txn(
    conn: Connection, run_id: UUID, boundary_seq: int, tool_call_id: str, fence: int, *, retry_of: str | None
) -> ExecutionRecord | None:
    """Record that the call's handler starts now, under ``fence``; or, when an earlier
    execution already started it (and no new ``retry_of`` answer says to start it again),
    what that one recorded."""
    row = conn.execute(
        _START_SQL,
        {"run_id": run_id, "call": tool_call_id, "boundary_seq": boundary_seq, "fence": fence, "retry_of": retry_of},
    ).one()
    if not row.held:
        raise FenceLost(run_id, fence)
    if row.started is not None:
        return None
    return ExecutionRecord(row.status, row.result, row.executions)


def finish_execution_txn(
    conn: Connection, run_id: UUID, tool_call_id: str, fence: int, status: str | None, result: object
) -> None:
    """Record how the execution started under ``fence`` ended (``status`` None: it
    suspended before doing anything, so its start is cleared)."""
    # Recorded whoever holds the run now: it is what happened. A handler that suspended
    # (it needs input first) did nothing: its start is cleared, so it runs when resumed.
    if status is None:
        conn.execute(
            text(
                "DELETE FROM tool_executions "
                "WHERE run_id = :run_id AND tool_call_id = :call AND claim_fence = :fence"
            ),
            {"run_id": run_id, "call": tool_call_id, "fence": fence},
        )
        return
    conn.execute(
        text(
            "UPDATE tool_executions SET status = :status, result = CAST(:result AS jsonb), finished_at = now() "
            "WHERE run_id = :run_id AND tool_call_id = :call AND claim_fence = :fence"
        ),
        {"run_id": run_id, "call": tool_call_id, "fence": fence, "status": status, "result": json.dumps(result)},
    )
