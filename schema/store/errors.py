"""Errors raised by the store. Each carries the identifiers it is about."""

from __future__ import annotations

from uuid import UUID

from runtime.errors import AidaworkError


class FenceLost(AidaworkError):
    """A fenced write matched no row: another claim has superseded ``fence`` (or the run
    moved past the boundary). Nothing was written; retrying the same write cannot help."""

    code = "FENCE_LOST"

    def __init__(self, run_id: UUID, fence: int) -> None:
        super().__init__(f"run {run_id}: claim fence {fence} is no longer held")
        self.run_id = run_id
        self.fence = fence


class RunNotFound(AidaworkError):
    code = "RUN_NOT_FOUND"

    def __init__(self, run_id: UUID | str) -> None:
        super().__init__(f"no run {run_id}")
        self.run_id = run_id


class RootNotFound(AidaworkError):
    """A run request named a ``root_id`` that does not exist for its owner."""

    code = "ROOT_NOT_FOUND"

    def __init__(self, root_id: UUID, owner: str) -> None:
        super().__init__(f"root_id: no Root {root_id} for owner {owner!r}")
        self.root_id = root_id
        self.owner = owner
