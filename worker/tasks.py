"""The Celery tasks. Thin: validate the payload, bind the log context, call
``worker.round``, and map errors to ack / retry / fail in one table."""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum

import structlog
from celery import Task
from kombu.exceptions import OperationalError as BrokerUnavailable
from pydantic import ValidationError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from runtime.errors import ModelUnavailable, RequestInvalid
from runtime.resume import ResumeRefused
from schema.store.errors import FenceLost
from schema.wire import RoundTask
from schema.wire.retry import RetryPolicy, backoff_s
from worker.app import RECONCILE_TASK, RESUME_ROUND_TASK, RUN_ROUND_TASK, app
from worker.bootstrap import get_context
from worker.logging import bind, clear
from worker.reconcile import reconcile
from worker.resume import execute_resume, parse_resumes
from worker.round import execute_round

log = structlog.get_logger("aidawork.tasks")


class OnError(StrEnum):
    DROP = "drop"  # acknowledge: the message can never succeed, or another holder owns the round
    RETRY = "retry"  # transient: send the task again after a backoff (the lease was released)
    # The database or the broker is unavailable (a restart, a blip, connection
    # exhaustion): send the task again within seconds, many times; the store already
    # retried each statement for a while (schema.store.tx).
    RETRY_SOON = "retry_soon"


# The one table mapping errors to what happens to the message. Anything not listed is
# a bug or an unavailable dependency: the task fails (and is acknowledged), the lease was
# released, and the reconciler re-sends the round; the round attempt budget bounds it.
ERROR_DISPOSITION: dict[type[BaseException], OnError] = {
    ValidationError: OnError.DROP,
    FenceLost: OnError.DROP,
    ResumeRefused: OnError.DROP,  # a forged, stale or replayed resume: nothing was written
    ModelUnavailable: OnError.RETRY,
    OperationalError: OnError.RETRY_SOON,
    InterfaceError: OnError.RETRY_SOON,
    PoolTimeout: OnError.RETRY_SOON,
    BrokerUnavailable: OnError.RETRY_SOON,
    RedisConnectionError: OnError.RETRY_SOON,
    RedisTimeoutError: OnError.RETRY_SOON,
}

MAX_TRANSIENT_RETRIES = 5
MAX_UNAVAILABLE_RETRIES = 40  # at most 5 s apart: a few minutes of outage, then the reconciler
MODEL_RETRY_BACKOFF = RetryPolicy(base_s=1.0, cap_s=60.0)
UNAVAILABLE_RETRY_BACKOFF = RetryPolicy(base_s=0.5, cap_s=5.0)


def disposition_of(exc: BaseException) -> OnError | None:
    for kind, disposition in ERROR_DISPOSITION.items():
        if isinstance(exc, kind):
            return disposition
    return None


class RunExecutionWorker(Task):  # type: ignore[misc]
    """One execution = one ReAct round of one run (``run_id`` at ``boundary_seq``)."""

    name = RUN_ROUND_TASK
    max_retries = MAX_UNAVAILABLE_RETRIES  # per disposition below: MAX_TRANSIENT_RETRIES for a model

    def run(self, run_id: str, boundary_seq: int) -> str:
        clear()
        bind(task_id=self.request.id, run_id=run_id, boundary_seq=boundary_seq)
        return self.guarded(
            lambda: (
                execute_round(
                    get_context(), RoundTask.model_validate({"run_id": run_id, "boundary_seq": boundary_seq})
                ).value
            )
        )

    def guarded(self, body: Callable[[], str]) -> str:
        """Run the body, mapping its errors through ERROR_DISPOSITION."""
        try:
            return body()
        except Exception as exc:
            disposition = disposition_of(exc)
            if disposition is OnError.DROP:
                log.warning("round_dropped", error=type(exc).__name__, reason=str(exc))
                return "dropped"
            retries = self.request.retries
            if disposition is OnError.RETRY and retries < MAX_TRANSIENT_RETRIES:
                countdown = 1 + backoff_s(retries + 1, MODEL_RETRY_BACKOFF)
                log.warning("round_retried", error=type(exc).__name__, countdown_s=countdown)
                raise self.retry(exc=exc, countdown=countdown) from exc
            if disposition is OnError.RETRY_SOON and retries < MAX_UNAVAILABLE_RETRIES:
                countdown = round(0.2 + backoff_s(retries + 1, UNAVAILABLE_RETRY_BACKOFF), 3)
                log.warning("round_retried", error=type(exc).__name__, countdown_s=countdown, unavailable=True)
                raise self.retry(exc=exc, countdown=countdown) from exc
            log.exception("round_crashed")
            raise
        finally:
            clear()


app.register_task(RunExecutionWorker())


class ResumeRoundWorker(RunExecutionWorker):
    """Resume a suspended round: re-run its original tool calls (no model call)."""

    name = RESUME_ROUND_TASK

    def run(self, resumes: object) -> str:  # type: ignore[override]
        clear()
        bind(task_id=self.request.id)
        try:
            parsed = parse_resumes(resumes)
        except RequestInvalid as exc:
            # Nothing can make this message valid: acknowledge it, say why, no traceback.
            log.warning("resume_payload_refused", field=exc.field, reason=exc.reason)
            clear()
            return "refused"
        bind(run_id=str(parsed[0].run_id), boundary_seq=parsed[0].boundary_seq)
        return self.guarded(lambda: execute_resume(get_context(), parsed).value)


app.register_task(ResumeRoundWorker())


@app.task(name=RECONCILE_TASK, ignore_result=True)  # type: ignore[untyped-decorator]
def reconcile_task() -> int:
    clear()
    return reconcile(get_context())
