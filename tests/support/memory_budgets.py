"""The in-memory store's spend budgets (``schema.store.budgets``): one window per owner
(no clock: a test rolls a window over with ``roll_budget_window``), the reservation under
the store's lock as the SQL does it in one statement, the settlement, and parking a run."""

from __future__ import annotations

import copy
import threading
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from schema.store.budgets import BudgetRefused
from schema.store.errors import FenceLost
from schema.wire.json import JsonMapping
from tests.support.memory_state import RunRow

WINDOW_START = datetime(2026, 1, 1, tzinfo=UTC)


class BudgetOps:
    runs: dict[UUID, RunRow]
    calls: list[str]
    budgets: dict[str, dict[str, Any]]
    _lock: threading.RLock

    def _event(self, run_id: UUID, seq: int, kind: str, data: dict[str, Any]) -> None: ...

    def set_budget(self, owner: str, token_budget: int, on_budget: str = "fail", budget_window: str = "1h") -> None:
        spend = self.budgets.get(owner, {"used": 0, "reserved": 0})
        self.budgets[owner] = {**spend, "token_budget": token_budget, "on_budget": on_budget,
                               "budget_window": budget_window}

    def _reserve(self, run_id: UUID, owner: str, estimate: int) -> bool:
        """Whether a reservation was taken (False: the owner has no budget); raises
        ``BudgetRefused`` when the budget cannot take ``estimate``."""
        budget = self.budgets.get(owner)
        if budget is None:
            return False
        if budget["used"] + budget["reserved"] + estimate > budget["token_budget"]:
            raise BudgetRefused(run_id, {
                "on_budget": budget["on_budget"], "budget_window": budget["budget_window"],
                "window_start": WINDOW_START, "window_ends_at": WINDOW_START + timedelta(hours=1),
                "token_budget": budget["token_budget"], "used": budget["used"], "reserved": budget["reserved"],
                "estimate": estimate,
            })
        budget["reserved"] += estimate
        return True

    def _settle(self, owner: str, call: dict[str, Any], used: int) -> None:
        budget = self.budgets.get(owner)
        if budget is None or call.get("reserved_tokens") is None:
            return
        if call.get("reservation_open"):
            budget["reserved"] -= call["reserved_tokens"]
        call["reservation_open"] = False
        budget["used"] += used

    def park_for_budget(self, run_id: UUID, fence: int, boundary_seq: int, wait: JsonMapping) -> tuple[UUID, ...]:
        with self._lock:
            self.calls.append("park_for_budget")
            run = self.runs.get(run_id)
            if run is None or (run.claim_fence, run.boundary_seq, run.status) != (fence, boundary_seq, "running"):
                raise FenceLost(run_id, fence)
            run.status, run.lease_expires_at, run.execution_fence = "suspended", None, None
            run.round_attempts, run.round_claims, run.round_holders = 0, 0, []
            run.budget_wait = copy.deepcopy(dict(wait))
            run.event_seq += 1
            self._event(run_id, run.event_seq, "run_suspended", {"waiting_for": [], "budget": dict(run.budget_wait)})
            return ()  # this store models no owner cap and no root_policy
