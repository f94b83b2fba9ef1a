"""``StorePort``: the store operations the worker shell uses (``worker.engine.round``,
``worker.engine.resume``, ``worker.engine.rebuild``, ``worker.engine.reconcile`` and
``worker.ops.celery_app.send_or_defer``; and ``worker.api.a2a``, for a run's webhook),
as one ``typing.Protocol``.

Two implementations: ``schema.store.store.Store`` (PostgreSQL, each operation a ``_txn``
helper run in a transaction) and ``tests.support.memory_store.InMemoryStore`` (the unit
tests' double). mypy checks both against this port (``make typecheck``); the contract
tests (``tests/db/test_store_contract.py``) run the same tests against both.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol
from uuid import UUID

from schema.store.claims import ClaimRefusal
from schema.store.effects import ExecutionRecord
from schema.store.leases import Due
from schema.store.rebuilds import PlanReservation, Reservation, VerifyPrefix
from schema.store.resumes import SuspensionMaterial
from schema.wire import OriginalToolRoundResume
from schema.wire.claim import Claim, LoadedMessage
from schema.wire.json import JsonMapping
from schema.wire.rebuild import RebuildCandidate, SourceMessage
from schema.wire.record import Committed, RoundRecord
from schema.wire.route import Route


class StorePort(Protocol):
    # --- claims (schema.store.claims) -------------------------------------------------------

    def claim_round(
        self, run_id: UUID, boundary_seq: int, *, lease_s: float, after_position: int, cold: bool, holder: UUID,
        resume_of: list[str] | None = None, held_fence: int | None = None, start_call_digest: str | None = None,
    ) -> Claim | None:
        """Claim the run for round ``boundary_seq`` (with ``resume_of``: for resuming those
        suspended calls); ``None`` when it is not claimable. With ``start_call_digest`` (a
        warm claim) it may also write the round's before-call ledger row (``Claim.started_call_id``)."""

    def explain_refused_claim(self, run_id: UUID, boundary_seq: int, *, resume: bool) -> ClaimRefusal:
        """Why a claim matched nothing: the first of its conditions the run fails now."""

    def load_messages(self, root_id: UUID, from_position: int) -> tuple[LoadedMessage, ...]:
        """The Root's messages from a position, as a claim returns them."""

    # --- rounds and the model-call ledger (schema.store.rounds, budgets) ------------------------

    def record_model_call_started(
        self, run_id: UUID, boundary_seq: int, attempt: int, fence: int, request_digest: str, estimate_tokens: int = 0
    ) -> int:
        """The ledger row before a model call (fenced; ``BudgetRefused``): its id."""

    def record_model_call_finished(
        self, call_id: int, run_id: UUID, fence: int, *, response_digest: str | None, input_tokens: int | None,
        output_tokens: int | None, error_code: str | None, response: JsonMapping | None = None,
        request_digest: str | None = None,
    ) -> None:
        """The call's outcome and usage; ``FenceLost`` (after recording it) when the fence is gone."""

    def drop_unused_model_call(self, call_id: int, run_id: UUID, fence: int) -> None:
        """Delete the before-call row a warm claim wrote for a call never made."""

    def park_for_budget(self, run_id: UUID, fence: int, boundary_seq: int, wait: JsonMapping) -> tuple[UUID, ...]:
        """Suspend the claimed run waiting for its owner's budget (fenced): the runs to send."""

    def commit_round(self, record: RoundRecord) -> Committed:
        """Commit a round under the held fence, or raise ``FenceLost`` having written nothing."""

    # --- at-most-once tool calls (schema.store.effects) ------------------------------------------

    def start_tool_execution(
        self, run_id: UUID, boundary_seq: int, tool_call_id: str, fence: int, *, retry_of: str | None
    ) -> ExecutionRecord | None:
        """Start an at-most-once call (fenced); what an earlier start recorded, if any."""

    def finish_tool_execution(
        self, run_id: UUID, tool_call_id: str, fence: int, status: str | None, result: object
    ) -> None:
        """How the execution started under ``fence`` ended (``status`` None: its start is cleared)."""

    # --- giving a claim back, ending a run, dispatch (schema.store.leases, runs, routes) ---------

    def release_lease(
        self, run_id: UUID, fence: int, *, round_at_fault: bool, dispatch_after_s: float | None = None
    ) -> bool:
        """Give the claim back; False when the fence is no longer held."""

    def fail_claimed_run(self, run_id: UUID, fence: int, error_code: str, message: str) -> tuple[UUID, ...]:
        """Fail a run the caller holds (fenced): the runs to send."""

    def end_interrupted_run(self, run_id: UUID, fence: int) -> tuple[bool, tuple[UUID, ...]]:
        """End, cancelled, a run whose interrupt is pending: (ended, the runs to send)."""

    def route_of(self, run_id: UUID, owner: str | None = None) -> Route:
        """The run's route now (a run that is gone: by ``owner``)."""

    def due_of(self, run_id: UUID, owner: str | None = None) -> Due:
        """What to send a run named as the next to start."""

    def pending_resumes(self, run_id: UUID) -> list[OriginalToolRoundResume]:
        """The resumes of a run that is ready to resume."""

    def dispatch_failed(self, run_id: UUID) -> None:
        """Its task could not be sent: make the run due for the reconciler at once."""

    # --- suspensions (schema.store.suspensions, resumes) -----------------------------------------

    def resume_if_ready(self, run_id: UUID) -> list[OriginalToolRoundResume]:
        """Make a suspended run whose inputs are all there ready: its resumes (none: not ready)."""

    def load_suspension(self, invocation_id: str) -> SuspensionMaterial | None:
        """The suspended round holding the suspended call ``invocation_id``."""

    # --- a run's webhook (schema.store.webhooks) -----------------------------------------------

    def set_webhook(self, run_id: UUID, owner: str, url: str | None) -> bool:
        """Set (None: clear) the webhook URL of ``owner``'s run; False when it is not
        theirs or (setting) has ended."""

    def read_webhook_url(self, run_id: UUID, owner: str) -> str | None:
        """The webhook URL of ``owner``'s run, if it has one."""

    # --- context rebuilds (schema.store.rebuilds) --------------------------------------------------

    def reserve_model_rebuild(
        self, *, run_id: UUID, fence: int, boundary_seq: int, chain_anchor: int, predecessor_build_id: UUID | None,
        plan_reservation: PlanReservation,
    ) -> Reservation:
        """Reserve the next build of the chain (fenced)."""

    def load_context_sources(self, root_id: UUID, from_position: int) -> list[SourceMessage]:
        """The Root's stored messages from a position, as a rebuild reads them."""

    def record_candidate(self, build_id: UUID, run_id: UUID, fence: int, candidate: RebuildCandidate) -> None:
        """Record the prepared candidate on its build (fenced)."""

    def admit_model_rebuild_request(
        self, *, build_id: UUID, run_id: UUID, fence: int, boundary_seq: int, chain_anchor: int, context_start: int,
        candidate: RebuildCandidate, authorize: Callable[[int], None], verify_prefix: VerifyPrefix,
        after_snapshot: Callable[[], None] | None = None,
    ) -> None:
        """Admit the candidate: the checkpoint moves past its sources (fenced, verified)."""
