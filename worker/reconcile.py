"""The periodic repair (run by Celery beat every AIDAWORK_RECONCILE_INTERVAL_S): re-send
the round task of every run that should be executing but has no live task - its lease
expired (a crashed or paused worker) or its last message was never claimed (lost in the
broker, or the sender died between commit and send). A run whose suspended round has
all its inputs gets its resume re-sent instead."""

from __future__ import annotations

import structlog

from schema.store.leases import due_for_dispatch
from schema.store.suspensions import pending_resumes, resume_if_ready, suspended_with_all_inputs
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
    for run_id in suspended_with_all_inputs(ctx.engine):
        resumes = resume_if_ready(ctx.engine, run_id)
        if resumes:
            dispatch_resume(resumes)
            log.info("run_redispatched", run_id=str(run_id), resume=True)
    return len(due)
