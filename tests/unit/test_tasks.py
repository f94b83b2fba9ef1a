"""The one error-disposition table of the Celery task (imports Celery; connects to nothing)."""

from __future__ import annotations

import uuid


def test_disposition_of_maps_fence_lost_to_drop_model_unavailable_to_retry_and_others_to_none() -> None:
    from runtime.errors import ModelInputRejection, ModelUnavailable
    from schema.store.errors import FenceLost
    from worker.engine.tasks import OnError, disposition_of

    assert disposition_of(FenceLost(uuid.uuid4(), 3)) is OnError.DROP
    assert disposition_of(ModelUnavailable("timeout")) is OnError.RETRY
    assert disposition_of(RuntimeError("bug")) is None
    # A non-retryable model error is not retried by the task (the loop already failed the run).
    assert disposition_of(ModelInputRejection("too long")) is None


def test_a_retry_is_decided_by_the_errors_own_retryable_not_by_its_type() -> None:
    from schema.wire.errors import AidaworkError
    from worker.engine.tasks import OnError, disposition_of

    class SomeDependencyDown(AidaworkError):  # in no table of the task
        code = "SOME_DEPENDENCY_DOWN"
        retryable = True

    class SomeRefusal(AidaworkError):
        code = "SOME_REFUSAL"

    assert disposition_of(SomeDependencyDown("down")) is OnError.RETRY
    assert disposition_of(SomeRefusal("no")) is None


def test_a_task_retry_countdown_is_celerys_full_jitter_backoff_under_its_cap() -> None:
    from worker.engine.tasks import TaskRetry

    policy = TaskRetry(max_retries=5, retry_backoff=2, retry_backoff_max=60)
    assert {policy.countdown_s(0) for _ in range(200)} <= {0, 1, 2}
    assert max(policy.countdown_s(10) for _ in range(200)) <= 60
    assert TaskRetry(max_retries=1, retry_backoff=2, retry_backoff_max=60, retry_jitter=False).countdown_s(3) == 16
