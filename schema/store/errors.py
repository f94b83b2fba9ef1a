"""Errors raised by the store. Each carries the identifiers it is about."""

from __future__ import annotations

from uuid import UUID

from schema.wire.errors import AidaworkError, ErrorCode


class FenceLost(AidaworkError):
    """A fenced write matched no row: another claim has superseded ``fence`` (or the run
    moved past the boundary). Nothing was written; retrying the same write cannot help."""

    code = ErrorCode.FENCE_LOST

    def __init__(self, run_id: UUID, fence: int) -> None:
        super().__init__(f"run {run_id}: claim fence {fence} is no longer held")
        self.run_id = run_id
        self.fence = fence


class ToolCallIdReused(AidaworkError):
    """The round's commit would store a tool call id the run already has (the provider
    reused an id from before a context rebuild). Nothing was written."""

    code = ErrorCode.MODEL_TOOL_CALL_ID_REUSED

    def __init__(self, run_id: UUID) -> None:
        super().__init__(f"run {run_id}: the model reused a tool call id of an earlier round of the run")
        self.run_id = run_id


class RunNotFound(AidaworkError):
    code = ErrorCode.RUN_NOT_FOUND

    def __init__(self, run_id: UUID | str) -> None:
        super().__init__(f"no run {run_id}")
        self.run_id = run_id


class AgentNotFound(AidaworkError):
    """A saved agent that does not exist for the owner: an unknown name or version, a
    deleted agent, or another owner's (reported alike, so its existence does not leak)."""

    code = ErrorCode.AGENT_NOT_FOUND

    def __init__(self, owner: str, ref: str) -> None:
        super().__init__(f"agent: no saved agent {ref!r} for owner {owner!r}")
        self.owner = owner
        self.ref = ref


class AgentExists(AidaworkError):
    code = ErrorCode.AGENT_EXISTS

    def __init__(self, owner: str, name: str) -> None:
        super().__init__(f"name: owner {owner!r} already has an agent {name!r}; update it to make a new version")
        self.owner = owner
        self.name = name


class RootNotFound(AidaworkError):
    """A run request named a ``root_id`` that does not exist for its owner."""

    code = ErrorCode.ROOT_NOT_FOUND

    def __init__(self, root_id: UUID, owner: str) -> None:
        super().__init__(f"root_id: no Root {root_id} for owner {owner!r}")
        self.root_id = root_id
        self.owner = owner


class IdempotencyKeyReused(AidaworkError):
    """A submit named an idempotency key its owner already used, within the key's time to
    live, for a different request. Nothing was stored."""

    code = ErrorCode.IDEMPOTENCY_KEY_REUSED

    def __init__(self, owner: str, run_id: UUID) -> None:
        super().__init__(
            f"idempotency_key: owner {owner!r} already used this key for run {run_id}, with a different request"
        )
        self.owner = owner
        self.run_id = run_id


class RootBusy(AidaworkError):
    """A submit with ``root_policy: reject`` found an active run in its Root. Nothing was
    stored."""

    code = ErrorCode.ROOT_BUSY

    def __init__(self, root_id: UUID, run_id: UUID) -> None:
        super().__init__(f"root_id: Root {root_id} has an active run {run_id} (root_policy: reject)")
        self.root_id = root_id
        self.run_id = run_id


class ForkRefused(AidaworkError):
    """A fork that cannot be made as asked (``schema.store.forks``): a round out of the
    parent's committed range, or an edit that names no call of the fork point's round.
    ``field`` names what was refused; nothing was stored."""

    code = ErrorCode.REQUEST_INVALID

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.reason = message
