"""The claim: a worker takes a run for one round (or for resuming a suspended round),
and why a claim was refused.

The claim is one statement: it takes the run (the next fence, ``next_fence_sql``, and a
fresh lease) only if the run is at the expected boundary, not terminal or suspended, not
leased by a live holder, and first in its Root's queue; in the same round trip it returns the messages the
caller's cache does not have yet and, for a round, the latest model response an earlier
holder of that round was given (the model-call ledger, ``schema.store.rounds``), which
the core reuses for the same request instead of calling the model again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict, cast
from uuid import UUID

from sqlalchemy import Connection, TextClause, text

from schema.store.bodies import message_body_sql
from schema.store.limits import at_capacity_sql, waits_for_slot_sql
from schema.store.roots import earlier_active_sql
from schema.store.routes import weight_sql
from schema.store.workers import DEATH_ELSEWHERE
from schema.wire import RunStatus
from schema.wire.claim import Checkpoint, Claim, LoadedMessage, RecordedResponse, StoredRound

# The server's current timeline (1 until a standby is promoted, then one more at every
# promotion), read from the name of the WAL file being written: no I/O, allowed to any role.
TIMELINE_SQL = "CAST(CAST('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8) AS bit(32)) AS bigint)"


def next_fence_sql(fence: str = "claim_fence", timeline: str = TIMELINE_SQL) -> str:
    """The fence a claim issues after ``fence``: unique across timelines.

    Under asynchronous replication a claim the old primary acknowledged may never reach
    the standby promoted in its place; counting on from the standby's older value, the new
    primary would hand the SAME fence to another worker, and both holders' fenced writes
    (``... AND claim_fence = :fence``) would pass: an at-most-once tool effect could run
    twice. So every fence issued on timeline T is at least (T - 1) << 40, above anything
    timeline T - 1 can have issued (2^40 claims of one run), and a lost claim's holder can
    never match again. On timeline 1 the floor is 0: nothing changes.

    Every statement that moves a fence on uses this, so that the claim's ``execution_fence``
    (the same new value) and a fence bumped to end a run stay consistent with it."""
    return f"greatest({fence} + 1, (CAST({timeline} AS bigint) - 1) << 40)"


def _claim_sql(guard: str, execution_fence: str, recorded: str) -> TextClause:
    """The claim statement, with the condition that distinguishes a round from a resume,
    whether the claim itself starts the round's execution (a resume's does), and which
    accepted response it hands back (``recorded``: a query of at most one row)."""
    return text(
        f"""
WITH recorded AS ({recorded}
), target AS (
  -- A queued run is about to take a slot of its owner's cap: lock it (run rows before
  -- owner rows, the order every statement takes), so the status read here is the one
  -- the UPDATE below changes. A run already running holds its slot: no lock, no slot.
  SELECT id, owner FROM runs WHERE id = :run_id AND status = 'queued' FOR UPDATE
), slot AS (
  -- The owner row's lock serialises every change of its counter; an owner without a row
  -- has no cap and matches nothing here (and nothing is written for it).
  SELECT o.owner, (o.max_running IS NULL OR o.running < o.max_running) AS free
  FROM owners AS o JOIN target ON o.owner = target.owner FOR UPDATE OF o
), claimed AS (
  UPDATE runs SET
    claim_fence = {next_fence_sql()},
    lease_expires_at = now() + make_interval(secs => :lease_s),
    status = 'running',
    -- The previous holder's execution started and never finished (it died, or the round
    -- raised): that is an attempt of the round. A claim alone is not, and neither is a
    -- death while a worker that never held the round died too: that is the cluster losing
    -- workers, not the round killing them (its lease ran out; a release is never excused).
    -- Nor is this worker taking back a claim it still holds, which it gave up for an
    -- unavailable database and could not release (held_fence).
    round_attempts = round_attempts + CASE WHEN execution_fence = claim_fence AND claim_fence <> :held_fence THEN
        CASE WHEN lease_expires_at IS NOT NULL AND {DEATH_ELSEWHERE} THEN 0 ELSE 1 END
      ELSE 0 END,
    execution_fence = {execution_fence},
    -- The backstop counts the same deaths, whether or not the execution was marked: a
    -- lease that ran out, not excused by deaths elsewhere. A first claim, a claim after a
    -- give-back (an unavailable dependency) and a taken-back claim of this worker cost nothing.
    round_claims = round_claims + CASE WHEN lease_expires_at IS NOT NULL AND claim_fence <> :held_fence
        AND NOT {DEATH_ELSEWHERE} THEN 1 ELSE 0 END,
    round_holders = array_append(round_holders, CAST(:holder AS uuid)),
    dispatched_at = now(),
    started_at = coalesce(started_at, now()),
    updated_at = now()
  WHERE id = :run_id AND boundary_seq = :boundary_seq
    AND status IN ('queued', 'running')
    AND (lease_expires_at IS NULL OR lease_expires_at < now() OR claim_fence = :held_fence)
    AND NOT {earlier_active_sql("runs")}
    -- An interrupt is pending: the run ends at this boundary instead (the worker whose
    -- claim this refuses ends it, ``schema.store.runs.end_interrupted_run``).
    AND interrupted_by IS NULL
    AND coalesce((SELECT free FROM slot), true)
    -- Submission order: a queued run of a capped owner starts only while it is among the
    -- oldest as many startable queued runs as there are free slots (read in one snapshot,
    -- the counter and the queue agree); the room itself is the locked check above.
    AND NOT {waits_for_slot_sql("runs")}
    AND {guard}
  RETURNING id, root_id, owner, claim_fence, execution_fence, round_attempts + 1 AS attempt, round_claims,
    trace_context,
    priority, {weight_sql("runs")} AS weight,
    CASE WHEN :cold THEN input END AS input,
    CASE WHEN :cold THEN config END AS config
), took AS (
  -- The slot is taken in the same statement as the claim: both happen or neither.
  UPDATE owners SET running = owners.running + 1 FROM claimed, slot WHERE owners.owner = slot.owner
), started_call AS (
  -- A warm claim starts the round's model call in the same statement (STARTS_CALL_SQL):
  -- the ledger's before-call row, under the new fence, with the request the caller's
  -- cached context expects (the row's "after" statement writes the request really sent).
  INSERT INTO model_calls (run_id, boundary_seq, attempt, claim_fence, status, request_digest)
  SELECT claimed.id, :boundary_seq, claimed.attempt, claimed.claim_fence, 'started', :start_call_digest
  FROM claimed
  WHERE CAST(:start_call_digest AS text) IS NOT NULL AND claimed.execution_fence = claimed.claim_fence
    AND NOT EXISTS (SELECT 1 FROM recorded)
  RETURNING id
)
SELECT claimed.*,
  (SELECT coalesce(jsonb_agg(jsonb_build_array(m.position, {message_body_sql()}, {DURABLE_READS_SQL})
                            ORDER BY m.position),
                   CAST('[]' AS jsonb))
   FROM messages AS m
   WHERE m.root_id = claimed.root_id
     AND m.position > greatest(:after_position, cp.context_start_position - 1)) AS new_messages,
  cp.context_start_position, cp.summary, cp.last_build_id, cp.chain_anchor,
  previous.tool_fingerprint AS previous_fingerprint,
  coalesce(previous.repeat_count, 0) AS previous_repeat_count,
  CASE WHEN previous.run_id IS NOT NULL THEN jsonb_build_object(
    'claim_fence', previous.claim_fence, 'system_digest', previous.system_digest,
    'messages_digest', previous.messages_digest, 'tools_digest', previous.tools_digest,
    'accepted_response_digest', previous.accepted_response_digest, 'proof', previous.proof) END AS previous_round,
  recorded.request_digest AS recorded_request_digest, recorded.response AS recorded_response,
  -- For the metrics, in the same round trip: how long the round waited since its
  -- predecessor committed, and the calls earlier claims made at this boundary (a call
  -- under this claim is then a duplicate).
  extract(epoch FROM clock_timestamp() - coalesce(previous.resumed_at, previous.created_at)) AS queue_lag_s,
  (SELECT count(*) FROM model_calls AS mc WHERE mc.run_id = claimed.id AND mc.boundary_seq = :boundary_seq
     AND mc.claim_fence < claimed.claim_fence) AS earlier_model_calls,
  (SELECT id FROM started_call) AS started_call_id
FROM claimed
JOIN run_checkpoints AS cp ON cp.run_id = claimed.id
LEFT JOIN rounds AS previous ON previous.run_id = claimed.id AND previous.boundary_seq = :boundary_seq - 1
LEFT JOIN recorded ON true
"""
    )


# The bodies of a read_files result are joined in from the durable store, never stored
# in the message itself.
DURABLE_READS_SQL = """CASE WHEN m.role = 'tool' AND m.body->>'name' = 'read_files' THEN
      (SELECT jsonb_object_agg(lr.path, lr.content) FROM local_reads AS lr
       WHERE lr.run_id = m.run_id AND lr.tool_call_id = m.body->>'tool_call_id') END"""

# The latest call at the boundary that succeeded: its holder died (or lost its claim)
# before the round committed, since a committed round is never claimed again.
_RECORDED_SQL = """
  SELECT mc.request_digest, mc.response FROM model_calls AS mc
  WHERE mc.run_id = :run_id AND mc.boundary_seq = :boundary_seq AND mc.status = 'succeeded'
    AND mc.response IS NOT NULL
  ORDER BY mc.id DESC LIMIT 1"""

# A round stored at the claimed boundary is a suspended one: only its resume may go on.
# A round's execution starts with its first ledger row (schema.store.rounds) - or at its
# claim, when an earlier holder's accepted response is there to go on from: the round
# then goes straight to its tools, so a round whose tools kill their worker spends its
# attempts (as a resume does) even though it never calls the model again.
#
# A warm claim (the caller has the run's context cached and passes the request it expects
# to send, ``start_call_digest``) also writes the round's first ledger row, so the round's
# execution starts at the claim: one statement where a cold claim takes two. Not for an
# owner with a token budget: its before-call row reserves the call's estimate, which only
# the request itself gives (``schema.store.budgets``); nor when an accepted response is
# there to go on from (no call). The caller leaves it out, too, when the call first waits
# for a rate limit's turn: a round given back to wait never paid.
STARTS_CALL_SQL = """CAST(:start_call_digest AS text) IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM owners AS o WHERE o.owner = runs.owner AND o.token_budget IS NOT NULL)"""
CLAIM_ROUND_SQL = _claim_sql(
    "NOT EXISTS (SELECT 1 FROM rounds AS r WHERE r.run_id = runs.id AND r.boundary_seq = runs.boundary_seq)",
    execution_fence=f"CASE WHEN EXISTS (SELECT 1 FROM recorded) OR ({STARTS_CALL_SQL}) THEN {next_fence_sql()} END",
    recorded=_RECORDED_SQL,
)
# A resume claims only the very suspension it was checked against: the suspended round is
# there, and its suspended calls are exactly those (their ids change with every claim).
CLAIM_RESUME_SQL = _claim_sql(
    """EXISTS (SELECT 1 FROM rounds AS r WHERE r.run_id = runs.id AND r.boundary_seq = runs.boundary_seq
                 AND r.outcome = 'suspend')
    AND (SELECT array_agg(ti.invocation_id ORDER BY ti.invocation_id) FROM tool_invocations AS ti
         WHERE ti.run_id = runs.id AND ti.boundary_seq = runs.boundary_seq AND ti.status = 'suspended')
        = CAST(:invocation_ids AS text[])""",
    # A resume calls no model: it runs the suspended tool calls right after its claim.
    execution_fence=next_fence_sql(),
    recorded="SELECT CAST(NULL AS text) AS request_digest, CAST(NULL AS jsonb) AS response WHERE false",
)


def claim_round_txn(
    conn: Connection,
    run_id: UUID,
    boundary_seq: int,
    *,
    lease_s: float,
    after_position: int,
    cold: bool,
    holder: UUID,
    resume_of: list[str] | None = None,
    held_fence: int | None = None,
    start_call_digest: str | None = None,
) -> Claim | None:
    """Claim the run for round ``boundary_seq`` (or, with ``resume_of``, for resuming the
    suspended calls with those invocation ids) for the worker process ``holder``
    (``schema.store.workers``); ``None`` when it is not claimable (already done, leased by
    another holder, not its Root's turn, or gone). With ``start_call_digest`` (a round's
    warm claim) the claim also writes the ledger row of the round's model call when it can
    (``STARTS_CALL_SQL``): ``Claim.started_call_id``."""
    params = {
        "run_id": run_id,
        "boundary_seq": boundary_seq,
        "lease_s": lease_s,
        "holder": holder,
        # A fence is never negative: -1 matches no run.
        "held_fence": -1 if held_fence is None else held_fence,
        "after_position": after_position,
        "cold": cold,
        "start_call_digest": start_call_digest if resume_of is None else None,
    }
    statement = CLAIM_ROUND_SQL
    if resume_of is not None:
        statement, params["invocation_ids"] = CLAIM_RESUME_SQL, sorted(resume_of)
    row = conn.execute(statement, params).one_or_none()
    if row is None:
        return None
    return Claim(
        run_id=row.id,
        root_id=row.root_id,
        owner=row.owner,
        fence=row.claim_fence,
        boundary_seq=boundary_seq,
        attempt=row.attempt,
        claims=row.round_claims,
        input=row.input,
        config=row.config,
        new_messages=tuple(LoadedMessage(p, b, reads) for p, b, reads in row.new_messages),
        previous_fingerprint=row.previous_fingerprint,
        previous_repeat_count=row.previous_repeat_count,
        previous_round=None if row.previous_round is None else StoredRound(**row.previous_round),
        checkpoint=Checkpoint(row.context_start_position, row.summary, row.last_build_id, row.chain_anchor),
        recorded_response=None
        if row.recorded_response is None
        else RecordedResponse(row.recorded_request_digest, row.recorded_response),
        trace_context=row.trace_context,
        earlier_model_calls=row.earlier_model_calls,
        started_call_id=row.started_call_id,
        queue_lag_s=None if row.queue_lag_s is None else float(row.queue_lag_s),
        weight=row.weight,
        priority=row.priority,
    )


def load_messages_txn(conn: Connection, root_id: UUID, from_position: int) -> tuple[LoadedMessage, ...]:
    """The Root's messages from a position, as the claim returns them (a worker whose
    cached context predates a rebuild made elsewhere reloads with this)."""
    rows = conn.execute(
        text(
            f"SELECT m.position, {message_body_sql()} AS body, {DURABLE_READS_SQL} AS reads FROM messages AS m "
            "WHERE m.root_id = :root AND m.position >= :start ORDER BY m.position"
        ),
        {"root": root_id, "start": from_position},
    )
    return tuple(LoadedMessage(r.position, r.body, r.reads) for r in rows)


_DESCRIBE_SQL = text(
    f"""
SELECT r.status, r.boundary_seq, r.claim_fence, coalesce(r.lease_expires_at > now(), false) AS leased,
  {earlier_active_sql("r")} AS earlier_active, r.interrupted_by IS NOT NULL AS interrupt_pending,
  r.status = 'queued' AND {at_capacity_sql("r")} AS at_capacity, {waits_for_slot_sql("r")} AS waits_for_slot,
  EXISTS (SELECT 1 FROM rounds AS s WHERE s.run_id = r.id AND s.boundary_seq = r.boundary_seq) AS round_stored
FROM runs AS r WHERE r.id = :run_id
"""
)


# A claim refused because every slot of the owner's cap is held: normal, the run waits
# queued and a slot that frees starts it.
OWNER_AT_CAPACITY = "owner_at_capacity"
# A claim refused because an ``interrupt`` submit asked the run to end at its next round
# boundary, and this is one: the refused worker ends it (normal, not a warning).
INTERRUPT_PENDING = "interrupt_pending"
# A claim refused although the run meets every condition when read right after: the
# claim's snapshot predates a change that let it start (a slot freed by a commit that
# could not hand the run its turn, because this very claim held its row). Claimed again.
CHANGED_SINCE_CLAIM = "changed_since_claim"


class RefusedRun(TypedDict):
    """The run as the explanation of a refused claim read it."""

    status: str
    boundary_seq: int
    claim_fence: int
    leased: bool
    earlier_active: bool
    interrupt_pending: bool
    at_capacity: bool
    waits_for_slot: bool
    round_stored: bool


@dataclass(frozen=True)
class ClaimRefusal:
    """Why a claim matched no row, read right after it (outside the hot path)."""

    finished: bool  # the run has ended: a late delivery, nothing is wrong
    reason: str
    run: RefusedRun | None


def explain_refused_claim_txn(conn: Connection, run_id: UUID, boundary_seq: int, *, resume: bool) -> ClaimRefusal:
    """The first condition of the claim that the run fails now. ``changed_since_claim``
    when it meets them all again (it changed between the claim and this read)."""
    row = conn.execute(_DESCRIBE_SQL, {"run_id": run_id}).one_or_none()
    if row is None:
        return ClaimRefusal(False, "run_not_found", None)
    run = cast(RefusedRun, dict(row._mapping))
    if RunStatus(row.status).terminal:
        return ClaimRefusal(True, "run_ended", run)
    checks = [
        (row.interrupt_pending and not row.leased, INTERRUPT_PENDING),
        (row.boundary_seq != boundary_seq, "run_at_another_boundary"),
        (row.status == RunStatus.SUSPENDED, "run_suspended"),
        (row.leased, "leased_by_live_holder"),
        (row.earlier_active, "earlier_run_of_root_active"),
        (row.at_capacity or row.waits_for_slot, OWNER_AT_CAPACITY),
        (row.round_stored and not resume, "round_awaits_resume"),
        (resume and not row.round_stored, "suspended_round_gone"),
    ]
    reason = next((why for failed, why in checks if failed), CHANGED_SINCE_CLAIM)
    return ClaimRefusal(False, reason, run)
