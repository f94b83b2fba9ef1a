"""The Celery tasks. Thin: validate the payload, bind the log context, call
``worker.engine.round``, and map errors to ack / retry / fail in one place (``disposition_of``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

import structlog
from celery import Task
from celery.utils.time import get_exponential_backoff_interval
from kombu.exceptions import OperationalError as BrokerUnavailable
from pydantic import ValidationError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from runtime.errors import AidaworkError, RequestInvalid
from runtime.resume import ResumeRefused
from schema.store.errors import FenceLost
from schema.wire import RoundTask
from worker.engine.bootstrap import get_context
from worker.engine.resume import execute_resume, parse_resumes
from worker.engine.round import execute_round
from worker.ops.celery_app import RESUME_ROUND_TASK, RUN_ROUND_TASK, app, send_or_defer
from worker.ops.logging import bind, clear
from worker.ops.rate_limits import RoundRateLimited

log = structlog.get_logger("aidawork.tasks")


class OnError(StrEnum):
    DROP = "drop"  # acknowledge: the message can never succeed, or another holder owns the round
    RETRY = "retry"  # the error says a retry can help (a model provider is unavailable): send it again later
    # The database or the broker is unavailable (a restart, a blip, connection
    # exhaustion): send the task again within seconds, many times; the store already
    # retried each statement for a while (schema.store.tx).
    RETRY_SOON = "retry_soon"
    # The round waits for its provider rate limit longer than a thread sleeps: it was given
    # back (no attempt spent) and is re-sent now with a countdown of the wait, as a new
    # message (so waiting spends none of the task's retries); this one is acknowledged.
    WAIT = "wait"


# Our errors say themselves whether a retry can help (``AidaworkError.retryable``). Of the
# rest, these mean the message is spent: another claim holds the round, or the resume is
# not the suspension that is stored. Nothing was written; the message is acknowledged.
SPENT_MESSAGE: tuple[type[AidaworkError], ...] = (FenceLost, ResumeRefused)

# Foreign exceptions carry no ``retryable``: what each means for the message. Anything not
# here (nor retryable, nor a spent message) is a bug or an unavailable dependency: the
# task fails (and is acknowledged), the lease was released, and the reconciler re-sends
# the round; the round attempt budget bounds it.
FOREIGN_DISPOSITION: dict[type[BaseException], OnError] = {
    ValidationError: OnError.DROP,
    OperationalError: OnError.RETRY_SOON,
    InterfaceError: OnError.RETRY_SOON,
    PoolTimeout: OnError.RETRY_SOON,
    BrokerUnavailable: OnError.RETRY_SOON,
    RedisConnectionError: OnError.RETRY_SOON,
    RedisTimeoutError: OnError.RETRY_SOON,
}


def disposition_of(exc: BaseException) -> OnError | None:
    """What happens to the message whose task raised ``exc`` (``None``: the task fails)."""
    if isinstance(exc, RoundRateLimited):
        return OnError.WAIT
    if isinstance(exc, AidaworkError):
        if exc.retryable:
            return OnError.RETRY
        return OnError.DROP if isinstance(exc, SPENT_MESSAGE) else None
    return next((then for kind, then in FOREIGN_DISPOSITION.items() if isinstance(exc, kind)), None)


@dataclass(frozen=True)
class TaskRetry:
    """A task retry policy in the terms of Celery's own task options, applied with Celery's
    own backoff (``get_exponential_backoff_interval``, what ``retry_backoff`` uses): the
    countdown before retry n+1 is drawn from [0, min(retry_backoff_max, retry_backoff * 2**n)]
    (full jitter), so rounds that failed together do not come back together.

    Not the options themselves (``autoretry_for`` / ``retry_backoff`` / ``retry_backoff_max``
    / ``max_retries`` on the task): Celery holds one such policy per task, and a round
    task needs two, chosen by the error's disposition (``TASK_RETRIES``)."""

    max_retries: int
    retry_backoff: int  # s: the first countdown's ceiling, doubled at every retry
    retry_backoff_max: int  # s: the ceiling's cap
    retry_jitter: bool = True

    def countdown_s(self, retries: int) -> int:
        """The countdown after ``retries`` earlier retries of the task."""
        countdown = get_exponential_backoff_interval(
            factor=self.retry_backoff, retries=retries, maximum=self.retry_backoff_max, full_jitter=self.retry_jitter
        )
        return int(countdown)


TASK_RETRIES: dict[OnError, TaskRetry] = {
    # A few tries, about 1 s apart at first (a ceiling of 2 s, fully jittered), backing off
    # to a minute: the provider adapter already retried the call itself.
    OnError.RETRY: TaskRetry(max_retries=5, retry_backoff=2, retry_backoff_max=60),
    # At most 5 s apart, so a run moves within seconds of the database or broker coming
    # back: a few minutes of outage, then the reconciler.
    OnError.RETRY_SOON: TaskRetry(max_retries=40, retry_backoff=1, retry_backoff_max=5),
}


class RunExecutionWorker(Task):  # type: ignore[misc]
    """One execution = one ReAct round of one run (``run_id`` at ``boundary_seq``)."""

    name = RUN_ROUND_TASK
    # Celery's own budget: the largest of TASK_RETRIES (each retry passes its policy's own).
    max_retries = max(policy.max_retries for policy in TASK_RETRIES.values())

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
            if disposition is OnError.WAIT and isinstance(exc, RoundRateLimited):
                return self.wait_turn(exc)
            policy = TASK_RETRIES.get(disposition) if disposition is not None else None
            retries = self.request.retries
            if policy is not None and retries < policy.max_retries:
                countdown = policy.countdown_s(retries)
                log.warning(
                    "round_retried",
                    error=type(exc).__name__,
                    countdown_s=countdown,
                    unavailable=disposition is OnError.RETRY_SOON,
                )
                raise self.retry(exc=exc, countdown=countdown, max_retries=policy.max_retries) from exc
            log.exception("round_crashed")
            raise
        finally:
            clear()

    def wait_turn(self, exc: RoundRateLimited) -> str:
        ctx = get_context()
        log.info("round_rate_limited", bucket=exc.bucket, wait_s=round(exc.wait_s, 3),
                 countdown_s=round(exc.countdown_s, 3))
        def send() -> None:
            ctx.dispatch.round(exc.run_id, exc.boundary_seq, exc.route, countdown_s=exc.countdown_s)

        send_or_defer(ctx.store, exc.run_id, send)
        return "waiting"


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
