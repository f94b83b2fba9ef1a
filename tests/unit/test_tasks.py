"""The one error-disposition table of the Celery task (imports Celery; connects to nothing)."""

from __future__ import annotations

import uuid


def test_disposition_of_maps_fence_lost_to_drop_model_unavailable_to_retry_and_others_to_none() -> None:
    from runtime.errors import ModelInputRejection, ModelUnavailable
    from schema.store.errors import FenceLost
    from worker.tasks import OnError, disposition_of

    assert disposition_of(FenceLost(uuid.uuid4(), 3)) is OnError.DROP
    assert disposition_of(ModelUnavailable("timeout")) is OnError.RETRY
    assert disposition_of(RuntimeError("bug")) is None
    # A non-retryable model error is not retried by the task (the loop already failed the run).
    assert disposition_of(ModelInputRejection("too long")) is None
