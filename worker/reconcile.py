"""The periodic repair (run by Celery beat every AIDAWORK_RECONCILE_INTERVAL_S): re-send
the round task of every run that should be executing but has no live task - its lease
expired (a crashed or paused worker) or its last message was never claimed (lost in the
broker, or the sender died between commit and send)."""

from __future__ import annotations

import structlog

from schema.store.runs import due_for_dispatch
from worker.app import dispatch_round
from worker.bootstrap import WorkerContext

log = structlog.get_logger("aidawork.reconcile")


def reconcile(ctx: WorkerContext) -> int:
    due = due_for_dispatch(ctx.engine, grace_s=ctx.settings.dispatch_grace_s)
    for run_id, boundary_seq in due:
        dispatch_round(run_id, boundary_seq)
        log.info("run_redispatched", run_id=str(run_id), boundary_seq=boundary_seq)
    return len(due)
