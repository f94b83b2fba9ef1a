"""The vocabularies shared by the core and the tables: one ``StrEnum`` each, and the
tables' CHECK constraints are built from them (``schema.tables``)."""

from __future__ import annotations

from enum import StrEnum


class RoundOutcomeKind(StrEnum):
    """What a committed round led to (``rounds.outcome``)."""

    CONTINUE = "continue"
    FINISH = "finish"
    FAIL = "fail"
    SUSPEND = "suspend"


class MessageRole(StrEnum):
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


class ToolStatus(StrEnum):
    COMPLETED = "completed"
    FAILED = "failed"
    SUSPENDED = "suspended"


class ToolDomain(StrEnum):
    """Where a tool runs: on the server (``sdk``) or on the user's side (the others)."""

    SDK = "sdk"
    LOCAL = "local"
    DESKTOP = "desktop"
    PLUGIN = "plugin"


# The waits someone answers about the call itself (a client tool's result, a person's
# approval, an operator's word on an unknown outcome): whoever answers is shown the call's
# args. The core's events and the store's view of a run's waits both show them.
ANSWERED_WAITS = frozenset({"client_tool", "approval", "outcome_unknown"})


class ToolAnswerKind(StrEnum):
    """What someone outside said about a suspended call (``tool_answers.kind``)."""

    RESULT = "result"  # what the call returned (a client tool; an operator on an unknown outcome)
    APPROVE = "approve"
    REJECT = "reject"
    RETRY = "retry"  # run an at_most_once call whose outcome is unknown again, knowingly


class WebhookStatus(StrEnum):
    """Where one webhook delivery stands (``webhook_deliveries.status``)."""

    PENDING = "pending"  # not yet answered with a 2xx; retried until the retry window ends
    DELIVERED = "delivered"
    FAILED = "failed"  # the retry window ended without a 2xx
