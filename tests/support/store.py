"""Driving the store directly, without a worker: submit, claim, expire a lease, record a round."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from sqlalchemy import Engine, text

from runtime.deps import build_runtime
from runtime.prepare import prepare_execution
from schema.store import runs as run_store
from schema.store.runs import Submitted
from schema.store.store import Store
from schema.wire import RunStatus
from schema.wire.claim import Claim
from schema.wire.record import EventRecord, MessageRecord, RoundRecord
from schema.wire.vocab import RoundOutcomeKind
from tests.support.requests import scripted_request

RUNTIME = build_runtime()


HOLDER = UUID(int=1)  # the worker process the tests' claims name: registered nowhere, alive or dead


def submit(engine: Engine, **kwargs: Any) -> Submitted:
    request, prepared = prepare_execution(RUNTIME, scripted_request([{"content": "done"}], **kwargs))
    return run_store.submit_run(engine, request, prepared.turn_config.model_dump(mode="json"))


def claim(
    engine: Engine, run_id: UUID, boundary_seq: int = 0, lease_s: float = 30, holder: UUID = HOLDER
) -> Claim | None:
    return Store(engine).claim_round(run_id, boundary_seq, lease_s=lease_s, after_position=-1, cold=True, holder=holder)


def expire_lease(engine: Engine, run_id: UUID) -> None:
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE runs SET lease_expires_at = now() - interval '1 second' WHERE id = :id"), {"id": run_id}
        )


def record(c: Claim, *, outcome: str = "finish", status: str = "completed") -> RoundRecord:
    return RoundRecord(
        run_id=c.run_id, boundary_seq=c.boundary_seq, fence=c.fence, outcome=RoundOutcomeKind(outcome),
        status=RunStatus(status), output="done" if status == "completed" else None,
        error_code=None, error_message=None, system_digest="s", messages_digest="m", tools_digest="t",
        accepted_response_digest="r", tool_fingerprint=None, repeat_count=0, proof="p", resumed=False,
        messages=(
            MessageRecord(0, {"role": "user", "content": "go"}, "d0"),
            MessageRecord(1, {"role": "assistant", "content": "done"}, "d1"),
        ),
        tools=(), events=(EventRecord("run_completed", {"output": "done"}),),
    )


def start_execution(engine: Engine, c: Claim) -> int:
    return Store(engine).record_model_call_started(c.run_id, c.boundary_seq, c.attempt, c.fence, "req")
