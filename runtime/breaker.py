"""RepeatedToolCallBreaker: stop a run whose model keeps making the same tool round.

The fingerprint of a tool round is the digest of, for each call in order, the tool name,
its arguments and its result, in canonical JSON (``runtime.canonical``: keys sorted,
no insignificant whitespace, integral floats as integers), so it is the same in every
process and Python version. The count of consecutive identical rounds is stored with
each round, so it survives the run moving between workers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from runtime.canonical import digest
from schema.wire.errors import ErrorCode
from schema.wire.json import JsonValue
from schema.wire.vocab import ToolDomain, ToolStatus

REPEATED_IDENTICAL_TOOL_CALL = ErrorCode.REPEATED_IDENTICAL_TOOL_CALL

# These domains run on the user's side and have failure budgets of their own.
EXEMPT_DOMAINS = frozenset({ToolDomain.LOCAL, ToolDomain.DESKTOP, ToolDomain.PLUGIN})


def fingerprint(name: str, args: JsonValue, result: JsonValue) -> str:
    """The fingerprint of one tool call: name + normalized args + normalized result."""
    return digest({"name": name, "args": args, "result": result})


@dataclass(frozen=True)
class CountedCall:
    name: str
    args: JsonValue
    result: JsonValue
    domain: ToolDomain | None
    status: ToolStatus  # suspended rounds never count


@dataclass(frozen=True)
class BreakerVerdict:
    fingerprint: str | None  # None: the round does not count (and breaks any streak)
    repeat_count: int
    tripped: bool
    message: str | None = None


class RepeatedToolCallBreaker:
    def __init__(self, limit: int) -> None:
        self.limit = limit

    @staticmethod
    def round_fingerprint(calls: Sequence[CountedCall]) -> str | None:
        """The round's fingerprint, or None when it must not count: no calls, a call
        that is pending or suspended, or a tool of an exempt domain."""
        if not calls:
            return None
        for call in calls:
            if call.status == ToolStatus.SUSPENDED or call.domain in EXEMPT_DOMAINS:
                return None
        return digest([fingerprint(c.name, c.args, c.result) for c in calls])

    def judge(
        self, calls: Sequence[CountedCall], previous_fingerprint: str | None, previous_count: int
    ) -> BreakerVerdict:
        current = self.round_fingerprint(calls)
        if current is None:
            return BreakerVerdict(None, 0, False)
        count = previous_count + 1 if current == previous_fingerprint else 1
        if count < self.limit:
            return BreakerVerdict(current, count, False)
        names = ", ".join(sorted({c.name for c in calls}))
        message = (
            f"the model made the same tool round ({names}, identical arguments and results) {count} times "
            f"in a row; the limit is {self.limit} (policy.repeated_tool_call_limit)"
        )
        return BreakerVerdict(current, count, True, message)
