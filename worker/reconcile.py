"""The periodic repair (run by Celery beat every AIDAWORK_RECONCILE_INTERVAL_S): re-send
the round task of every run that should be executing but has no live task - its lease
expired (a crashed or paused worker) or its last message was never claimed (lost in the
broker, or the sender died between commit and send). A run whose suspended round has
all its inputs gets its resume re-sent instead."""

from __future__ import annotations

import structlog

from schema.store.runs import due_for_dispatch
from schema.store.suspensions import pending_resumes
from worker.app import dispatch_resume, dispatch_round
from worker.bootstrap import WorkerContext

log = structlog.get_logger("aidawork.reconcile")


def reconcile(ctx: WorkerContext) -> int:
    due = due_for_dispatch(ctx.engine, grace_s=ctx.settings.dispatch_grace_s)
    for run_id, boundary_seq, resume in due:
        resumes = pending_resumes(ctx.engine, run_id) if resume else []
        if resumes:
            dispatch_resume(resumes)
        else:
            dispatch_round(run_id, boundary_seq)
        log.info("run_redispatched", run_id=str(run_id), boundary_seq=boundary_seq, resume=resume)
    return len(due)
