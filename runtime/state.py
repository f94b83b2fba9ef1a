"""RunState: the one type for where a run stands - its model context (as loaded, cached
or rebuilt), the claim a round runs under, and the previous round's breaker state.

The worker builds it once per claim (``under``), the core reads it, the per-process
cache (``runtime.memory.ContextCache``) keeps it between rounds, and an in-process run
advances it with ``after``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from uuid import UUID

from runtime.messages import Message
from runtime.outcomes import RoundResult, Suspend
from runtime.run_deps import OrchestratorDeps
from schema.wire.claim import Claim, RecordedResponse


@dataclass(frozen=True)
class HistoryTally:
    """What a round needs of its whole history, kept with it so that a long run's round
    makes no pass over the history: the tool call ids in it and its summed
    ``Message.token_count``, and the history (the very tuple) they were counted of."""

    call_ids: frozenset[str] = frozenset()
    tokens: int = 0
    of: tuple[Message, ...] = field(default=(), repr=False, compare=False)

    @classmethod
    def counted(cls, history: tuple[Message, ...]) -> HistoryTally:
        return cls().plus(history, history)

    def plus(self, messages: tuple[Message, ...], history: tuple[Message, ...]) -> HistoryTally:
        """The tally of ``history``, this one's history followed by ``messages``."""
        return HistoryTally(
            self.call_ids.union(c.id for m in messages for c in m.tool_calls),
            self.tokens + sum(m.token_count for m in messages),
            history,
        )


@dataclass(frozen=True)
class RunState:
    input: str
    boundary_seq: int = 0
    # The model's context: the rebuild summary (if any), then the Root's messages from
    # ``context_start`` on, in context form.
    history: tuple[Message, ...] = ()
    # Chain digest of ``history`` ("" for an empty history).
    history_digest: str = ""
    # Position of the last message in ``history`` within its Root (-1: none yet).
    last_position: int = -1
    run_id: UUID | None = None
    claim_fence: int = 0
    # Which execution of this round the claim is (1 first; a re-execution after a crash more).
    attempt: int = 1
    work_owner: str = ""
    # The previous round's breaker state, from the stored rounds.
    previous_fingerprint: str | None = None
    previous_repeat_count: int = 0
    # The run's checkpoint this context was built from (advanced by context rebuilds).
    context_start: int = 0
    summary: str | None = None
    last_build_id: UUID | None = None
    chain_anchor: int | None = None
    # The run's composed deps, kept with its context so a warm round need not prepare again.
    deps: OrchestratorDeps | None = None
    # The model response an earlier holder of this round accepted (the claim's): the round
    # goes on from it, without calling the model, if its request is the same.
    recorded_response: RecordedResponse | None = None
    # The tally of ``history``: carried by ``replace`` and advanced by ``extended``; counted
    # afresh at construction when it was not counted of this very history (a state built
    # with a history, or a replace that gave it another one, as a context rebuild does).
    tally: HistoryTally = field(default=HistoryTally(), repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.tally.of is not self.history:
            object.__setattr__(self, "tally", HistoryTally.counted(self.history))

    @classmethod
    def start(cls, text: str) -> RunState:
        return cls(input=text)

    def under(self, claim: Claim) -> RunState:
        """This context, for the round ``claim`` claimed."""
        return replace(
            self,
            boundary_seq=claim.boundary_seq,
            run_id=claim.run_id,
            claim_fence=claim.fence,
            attempt=claim.attempt,
            work_owner=claim.owner,
            previous_fingerprint=claim.previous_fingerprint,
            previous_repeat_count=claim.previous_repeat_count,
            recorded_response=claim.recorded_response,
        )

    def extended(self, messages: tuple[Message, ...], last_position: int, history_digest: str) -> RunState:
        if not messages:
            return self
        history = self.history + messages
        return replace(
            self,
            history=history,
            last_position=last_position,
            history_digest=history_digest,
            tally=self.tally.plus(messages, history),
        )

    def positional(self) -> tuple[Message, ...]:
        """The Root's messages in the context (without the summary): the i-th has
        position ``context_start + i``."""
        return self.history[1:] if self.summary is not None else self.history

    def after(self, result: RoundResult) -> RunState:
        """The state after ``result`` is committed (the next round's, unless suspended)."""
        new = result.new_messages
        advances = not isinstance(result.outcome, Suspend)
        return replace(
            self.extended(
                tuple(m.context for m in new),
                new[-1].position if new else self.last_position,
                new[-1].chain_digest if new else self.history_digest,
            ),
            boundary_seq=self.boundary_seq + (1 if advances else 0),
            previous_fingerprint=result.tool_fingerprint,
            previous_repeat_count=result.repeat_count,
            recorded_response=None,
        )
