"""The audit (``aidawork audit``): every run's boundaries, fences, messages, events and
model-call ledger checked against each other, in one read-only REPEATABLE READ snapshot.

Each check is one set-based query over all the runs in scope (every run, an owner's, or
one), named by a stable code, and returns one row per inconsistency: the run, the boundary
and a message. What each check holds is what the store's own statements guarantee at every
commit (``schema.store.rounds``, ``claims``, ``runs``, ``forks``, ``doubletext``, ``budgets``), so
a live system audits clean at any instant, and so does a replica promoted after a failover
(its WAL is a prefix of the old primary's: a state the old primary passed through). The
ledger's rows alone commit asynchronously: what a crash can lose of them is a warning.
docs/operations/audit.md says what a finding means and what to do about it.

Boundaries below a fork's ``forked_at_round`` hold rounds copied from its parent (fence 0,
no ledger, no tool rows): the checks treat them as such.
"""

from __future__ import annotations

from dataclasses import dataclass
from uuid import UUID

from sqlalchemy import Connection, Engine, TextClause, text

from schema.store.errors import RunNotFound
from schema.store.tx import run_transaction
from schema.wire import TERMINAL_STATUSES
from schema.wire.audit import AuditProblem, AuditReport, Severity

_TERMINAL = "({})".format(", ".join(f"'{s.value}'" for s in sorted(TERMINAL_STATUSES)))

# The runs audited: all, an owner's, or one (the parameters are NULL when not given), and
# the rounds they committed themselves (not those a fork copied from its parent).
_SCOPE = """scope AS (
  SELECT * FROM runs
  WHERE (CAST(:run_id AS uuid) IS NULL OR id = CAST(:run_id AS uuid))
    AND (CAST(:owner AS text) IS NULL OR owner = CAST(:owner AS text))
), own_rounds AS (
  SELECT r.* FROM rounds AS r JOIN scope AS s ON s.id = r.run_id
  WHERE r.boundary_seq >= coalesce(s.forked_at_round, 0)
)"""


def _spans(missing: str) -> str:
    """Consecutive numbers of the CTE ``missing`` (key, n, ...) as spans (key, first, last,
    span): gaps and islands, so a gap of a thousand is one finding."""
    return f"""spans AS (
  SELECT key, min(n) AS first, max(n) AS last,
    CASE WHEN min(n) = max(n) THEN min(n)::text ELSE min(n) || ' to ' || max(n) END AS span
  FROM (SELECT key, n, n - row_number() OVER (PARTITION BY key ORDER BY n) AS island FROM {missing}) AS m
  GROUP BY key, island
)"""


@dataclass(frozen=True)
class Check:
    code: str
    severity: Severity
    verifies: str  # one line: what the check holds
    select: str  # a query (after the scope CTE and ``ctes``) of run_id, boundary_seq, message
    ctes: str = ""

    @property
    def statement(self) -> TextClause:
        ctes = f", {self.ctes}" if self.ctes else ""
        return text(
            f"WITH {_SCOPE}{ctes}\nSELECT run_id, boundary_seq, message FROM ({self.select}) AS found\n"
            "ORDER BY run_id NULLS FIRST, boundary_seq NULLS FIRST, message"
        )


ERROR, WARNING = Severity.ERROR, Severity.WARNING

# --- boundaries --------------------------------------------------------------------------

ROUNDS_MISSING = Check(
    "rounds_missing", ERROR, "a run's committed rounds are exactly boundaries 0 to boundary_seq - 1",
    ctes=f"""short AS (
  SELECT s.id, s.boundary_seq FROM scope AS s
  WHERE s.boundary_seq > (SELECT count(*) FROM rounds AS r
                          WHERE r.run_id = s.id AND r.boundary_seq BETWEEN 0 AND s.boundary_seq - 1)
), missing AS (
  SELECT short.id AS key, g.n FROM short CROSS JOIN LATERAL generate_series(0, short.boundary_seq - 1) AS g(n)
  WHERE NOT EXISTS (SELECT 1 FROM rounds AS r WHERE r.run_id = short.id AND r.boundary_seq = g.n)
), {_spans("missing")}""",
    select="""
  SELECT spans.key AS run_id, spans.first AS boundary_seq,
    format('no round row at boundary %s, though the run has committed %s rounds (runs.boundary_seq)',
           spans.span, short.boundary_seq) AS message
  FROM spans JOIN short ON short.id = spans.key""",
)

ROUND_MISPLACED = Check(
    "round_misplaced", ERROR,
    "a round row at the run's boundary is its suspended round, and none is 'suspend' below it or beyond it",
    select="""
  SELECT r.run_id, r.boundary_seq, CASE
    WHEN r.boundary_seq < 0 THEN 'a round row at a negative boundary'
    WHEN r.boundary_seq > s.boundary_seq THEN
      format('a round row beyond the run''s boundary %s: a round the run has not reached', s.boundary_seq)
    WHEN r.boundary_seq = s.boundary_seq THEN
      format('a round row with outcome %L at the run''s current boundary: only a suspended round is stored '
             'there before its resume completes it', r.outcome)
    ELSE format('the round is still ''suspend'', but the run has moved on to boundary %s: its resume never '
                'completed it', s.boundary_seq) END AS message
  FROM rounds AS r JOIN scope AS s ON s.id = r.run_id
  WHERE r.boundary_seq < 0 OR r.boundary_seq > s.boundary_seq
     OR (r.boundary_seq = s.boundary_seq) <> (r.outcome = 'suspend')""",
)

SUSPENDED_WITHOUT_WAIT = Check(
    "suspended_without_wait", ERROR,
    "a suspended run waits for something: a suspended round at its boundary, or its owner's budget",
    select="""
  SELECT s.id AS run_id, s.boundary_seq,
    'the run is suspended with neither a suspended round at its boundary nor a budget wait: nothing can '
    'resume it' AS message
  FROM scope AS s
  WHERE s.status = 'suspended' AND s.budget_wait IS NULL
    AND NOT EXISTS (SELECT 1 FROM rounds AS r
                    WHERE r.run_id = s.id AND r.boundary_seq = s.boundary_seq AND r.outcome = 'suspend')""",
)

# --- fences ------------------------------------------------------------------------------

FENCE_AHEAD = Check(
    "fence_ahead", ERROR,
    "no row carries a fence above the run's claim_fence (rounds, tool calls, ledger, executions, execution_fence)",
    select="""
  SELECT s.id AS run_id, CAST(NULL AS integer) AS boundary_seq,
    format('runs.execution_fence %s is above the run''s claim fence %s', s.execution_fence, s.claim_fence) AS message
  FROM scope AS s WHERE s.execution_fence > s.claim_fence
  UNION ALL
  SELECT r.run_id, r.boundary_seq,
    format('the round was committed under fence %s%s, above the run''s claim fence %s: no claim of the run '
           'issued it', r.claim_fence, coalesce(' and resumed under ' || r.resume_fence, ''), s.claim_fence)
  FROM rounds AS r JOIN scope AS s ON s.id = r.run_id WHERE greatest(r.claim_fence, r.resume_fence) > s.claim_fence
  UNION ALL
  SELECT ti.run_id, ti.boundary_seq,
    format('tool call %s carries fence %s, above the run''s claim fence %s', ti.tool_call_id, ti.claim_fence,
           s.claim_fence)
  FROM tool_invocations AS ti JOIN scope AS s ON s.id = ti.run_id WHERE ti.claim_fence > s.claim_fence
  UNION ALL
  SELECT mc.run_id, mc.boundary_seq,
    format('model call %s (ledger id) was made under fence %s, above the run''s claim fence %s', mc.id,
           mc.claim_fence, s.claim_fence)
  FROM model_calls AS mc JOIN scope AS s ON s.id = mc.run_id WHERE mc.claim_fence > s.claim_fence
  UNION ALL
  SELECT te.run_id, te.boundary_seq,
    format('the execution of tool call %s started under fence %s, above the run''s claim fence %s',
           te.tool_call_id, te.claim_fence, s.claim_fence)
  FROM tool_executions AS te JOIN scope AS s ON s.id = te.run_id WHERE te.claim_fence > s.claim_fence""",
)

FENCE_ORDER = Check(
    "fence_order", ERROR,
    "each round was committed under a fence above its predecessor's, and resumed under one above its own",
    ctes="""ordered AS (
  SELECT r.run_id, r.boundary_seq, r.claim_fence, r.resume_fence, coalesce(s.forked_at_round, 0) AS copied,
    lag(r.boundary_seq) OVER w AS prev_boundary, lag(coalesce(r.resume_fence, r.claim_fence)) OVER w AS prev_fence
  FROM rounds AS r JOIN scope AS s ON s.id = r.run_id
  WINDOW w AS (PARTITION BY r.run_id ORDER BY r.boundary_seq)
)""",
    select="""
  SELECT run_id, boundary_seq, CASE
    WHEN boundary_seq < copied THEN
      format('a round the fork copied from its parent carries fence %s%s: a copied round carries 0, as no '
             'claim of the fork wrote it', claim_fence, coalesce(' and resume fence ' || resume_fence, ''))
    WHEN claim_fence < 1 THEN format('committed under fence %s, which no claim issues (the first claim makes 1)',
                                     claim_fence)
    WHEN claim_fence <= prev_fence THEN
      format('committed under fence %s, not above the fence %s of boundary %s before it: each round needs a '
             'claim of its own, and each claim raises the fence', claim_fence, prev_fence, prev_boundary)
    ELSE format('resumed under fence %s, not above the fence %s it was committed under', resume_fence,
                claim_fence) END AS message
  FROM ordered
  WHERE (boundary_seq < copied AND (claim_fence <> 0 OR resume_fence IS NOT NULL))
     OR (boundary_seq >= copied AND (claim_fence < 1 OR claim_fence <= coalesce(prev_fence, 0)
                                     OR resume_fence <= claim_fence))""",
)

# --- what a commit writes with its round ---------------------------------------------------

MESSAGE_GAP = Check(
    "message_gap", ERROR, "a Root's message positions run from 0 without a gap",
    ctes=f"""counted AS (
  SELECT m.root_id, count(*) AS n, max(m.position) AS hi FROM messages AS m
  WHERE m.position >= 0 AND m.root_id IN (SELECT root_id FROM scope) GROUP BY m.root_id
), missing AS (
  SELECT c.root_id AS key, g.n FROM counted AS c CROSS JOIN LATERAL generate_series(0, c.hi) AS g(n)
  WHERE c.n <> c.hi + 1 AND NOT EXISTS (SELECT 1 FROM messages AS m WHERE m.root_id = c.root_id AND m.position = g.n)
), {_spans("missing")}""",
    select="""
  SELECT after_gap.run_id, after_gap.boundary_seq,
    format('Root %s has no message at position %s: the next message (position %s) is this run''s, at this '
           'boundary', spans.key, spans.span, after_gap.position) AS message
  FROM spans CROSS JOIN LATERAL (
    SELECT m.run_id, m.boundary_seq, m.position FROM messages AS m
    WHERE m.root_id = spans.key AND m.position > spans.last ORDER BY m.position LIMIT 1) AS after_gap""",
)

MESSAGE_ORPHAN = Check(
    "message_orphan", ERROR,
    "each message was written by a round of its run (or is a fork's copied history), in its run's Root",
    select="""
  SELECT m.run_id, m.boundary_seq,
    format('%s message(s) (position %s) %s', count(*), string_agg(m.position::text, ', ' ORDER BY m.position),
           CASE WHEN m.boundary_seq >= 0
             THEN 'at a boundary with no round row: a message is written only by its round''s commit'
             ELSE 'at a negative boundary: only a fork''s history from before its first round sits there (-1)'
           END) AS message
  FROM messages AS m JOIN scope AS s ON s.id = m.run_id
  WHERE CASE WHEN m.boundary_seq >= 0
    THEN NOT EXISTS (SELECT 1 FROM rounds AS r WHERE r.run_id = m.run_id AND r.boundary_seq = m.boundary_seq)
    ELSE NOT (m.boundary_seq = -1 AND s.forked_from IS NOT NULL) END
  GROUP BY m.run_id, m.boundary_seq
  UNION ALL
  SELECT m.run_id, m.boundary_seq,
    format('the message at position %s is in Root %s, not in its run''s Root %s', m.position, m.root_id, s.root_id)
  FROM messages AS m JOIN scope AS s ON s.id = m.run_id WHERE m.root_id <> s.root_id
  UNION ALL
  SELECT m.run_id, m.boundary_seq, format('a message at negative position %s', m.position)
  FROM messages AS m JOIN scope AS s ON s.id = m.run_id WHERE m.position < 0""",
)

TOOL_CALL_ORPHAN = Check(
    "tool_call_orphan", ERROR,
    "each tool call belongs to a round of its run, under that round's fences; a suspended one to a suspended round",
    select="""
  SELECT ti.run_id, ti.boundary_seq, CASE
    WHEN r.run_id IS NULL THEN
      format('tool call %s has no round row at its boundary: a tool call is written only by its round''s '
             'commit', ti.tool_call_id)
    WHEN ti.claim_fence NOT BETWEEN r.claim_fence AND coalesce(r.resume_fence, r.claim_fence) THEN
      format('tool call %s carries fence %s, outside its round''s: committed under %s%s', ti.tool_call_id,
             ti.claim_fence, r.claim_fence, coalesce(', last resumed under ' || r.resume_fence, ''))
    ELSE format('tool call %s is still suspended, but its round was completed (outcome %L): nothing will '
                'ever answer it', ti.tool_call_id, r.outcome) END AS message
  FROM tool_invocations AS ti JOIN scope AS s ON s.id = ti.run_id
  LEFT JOIN rounds AS r ON r.run_id = ti.run_id AND r.boundary_seq = ti.boundary_seq
  WHERE r.run_id IS NULL
     OR ti.claim_fence NOT BETWEEN r.claim_fence AND coalesce(r.resume_fence, r.claim_fence)
     OR (ti.status = 'suspended' AND r.outcome <> 'suspend')""",
)

EVENT_GAP = Check(
    "event_gap", ERROR, "a run's events are numbered 1 to runs.event_seq without a gap",
    ctes=f"""counted AS (
  SELECT s.id, s.event_seq, count(e.seq) AS n, min(e.seq) AS lo, max(e.seq) AS hi
  FROM scope AS s LEFT JOIN run_events AS e ON e.run_id = s.id GROUP BY s.id, s.event_seq
), off AS (
  SELECT * FROM counted WHERE n <> event_seq OR lo <> 1 OR hi <> event_seq
), missing AS (
  SELECT off.id AS key, g.n FROM off CROSS JOIN LATERAL generate_series(1, off.event_seq) AS g(n)
  WHERE NOT EXISTS (SELECT 1 FROM run_events AS e WHERE e.run_id = off.id AND e.seq = g.n)
), {_spans("missing")}""",
    select="""
  SELECT spans.key AS run_id, CAST(NULL AS integer) AS boundary_seq,
    format('no event %s, though runs.event_seq is %s: the run''s event log has a hole', spans.span,
           off.event_seq) AS message
  FROM spans JOIN off ON off.id = spans.key
  UNION ALL
  SELECT e.run_id, NULL, format('event %s (%s) is outside 1 to runs.event_seq (%s)', e.seq, e.kind, off.event_seq)
  FROM off JOIN run_events AS e ON e.run_id = off.id WHERE e.seq < 1 OR e.seq > off.event_seq""",
)

# --- the model-call ledger -----------------------------------------------------------------

CALL_MISPLACED = Check(
    "call_misplaced", ERROR,
    "model calls are only at boundaries the run reached, and never at a round a fork copied",
    select="""
  SELECT mc.run_id, mc.boundary_seq, CASE
    WHEN mc.boundary_seq > s.boundary_seq OR mc.boundary_seq < 0 THEN
      format('model call %s (ledger id) at a boundary the run (at boundary %s) has not reached', mc.id,
             s.boundary_seq)
    ELSE format('model call %s (ledger id) at a round the fork copied from its parent: a fork never calls '
                'the model for a copied round', mc.id) END AS message
  FROM model_calls AS mc JOIN scope AS s ON s.id = mc.run_id
  WHERE mc.boundary_seq > s.boundary_seq OR mc.boundary_seq < coalesce(s.forked_at_round, 0)""",
)

STALE_COMMIT = Check(
    "stale_commit", ERROR,
    "a round's committing claim is the newest that called the model at its boundary, and was never told it lost",
    select="""
  SELECT r.run_id, r.boundary_seq,
    format('committed under fence %s, but a newer claim (fence %s) had called the model at this boundary: an '
           'older claim''s commit won over a newer one', r.claim_fence, newer.fence) AS message
  FROM own_rounds AS r
  CROSS JOIN LATERAL (SELECT max(mc.claim_fence) AS fence FROM model_calls AS mc
                      WHERE mc.run_id = r.run_id AND mc.boundary_seq = r.boundary_seq) AS newer
  WHERE newer.fence > r.claim_fence
  UNION ALL
  SELECT r.run_id, r.boundary_seq,
    format('model call %s (ledger id) under fence %s was recorded stale (its holder had lost the claim), yet '
           'fence %s committed the round', mc.id, mc.claim_fence, r.claim_fence)
  FROM rounds AS r JOIN scope AS s ON s.id = r.run_id
  JOIN model_calls AS mc ON mc.run_id = r.run_id AND mc.boundary_seq = r.boundary_seq
    AND mc.claim_fence = r.claim_fence AND mc.stale""",
)

# A warning: the ledger's rows commit asynchronously (schema.store.rounds), so a PostgreSQL
# crash or a failover can lose a call's rows while its holder goes on to commit the round
# once the database is back (docs/guarantees.md).
ROUND_UNPAID = Check(
    "round_unpaid", WARNING,
    "a round committed with a model response has a succeeded call on the ledger, under its fence or an earlier one",
    select="""
  SELECT r.run_id, r.boundary_seq, format(
    'committed under fence %s with an accepted model response, but the ledger has no succeeded call at this '
    'boundary under that fence or an earlier one: the call''s record was lost (a PostgreSQL crash or failover '
    'loses the ledger''s last rows) or deleted, and its tokens are not on record', r.claim_fence) AS message
  FROM own_rounds AS r WHERE r.accepted_response_digest IS NOT NULL
    AND NOT EXISTS (SELECT 1 FROM model_calls AS mc
                    WHERE mc.run_id = r.run_id AND mc.boundary_seq = r.boundary_seq AND mc.status = 'succeeded'
                      AND mc.claim_fence <= r.claim_fence)""",
)

CALL_UNFINISHED = Check(
    "call_unfinished", WARNING,
    "model calls at a boundary that is over (committed, or the run ended) have an outcome on record",
    select=f"""
  SELECT mc.run_id, mc.boundary_seq,
    format('%s model call(s) under fence %s never recorded an outcome: the holder died (or lost the database) '
           'with the call on the wire, or a PostgreSQL crash lost the outcome''s row; it may have been paid for, '
           'its tokens are unknown', count(*),
           string_agg(DISTINCT mc.claim_fence::text, ', ')) AS message
  FROM model_calls AS mc JOIN scope AS s ON s.id = mc.run_id
  WHERE mc.status = 'started'
    AND (s.status IN {_TERMINAL}
         OR EXISTS (SELECT 1 FROM rounds AS r WHERE r.run_id = mc.run_id AND r.boundary_seq = mc.boundary_seq))
  GROUP BY mc.run_id, mc.boundary_seq""",
)

# --- runs and owners -------------------------------------------------------------------------

RUN_STATE = Check(
    "run_state", ERROR,
    "a run has finished_at exactly when it has ended, and a lease only while running",
    select=f"""
  SELECT s.id AS run_id, CAST(NULL AS integer) AS boundary_seq, CASE
    WHEN s.status IN {_TERMINAL} AND s.finished_at IS NULL THEN format('the run is %s but has no finished_at', s.status)
    WHEN s.status NOT IN {_TERMINAL} AND s.finished_at IS NOT NULL THEN
      format('the run is %s but has a finished_at (%s)', s.status, s.finished_at)
    ELSE format('the run is %s but holds a lease (until %s): only a running run''s claim holds one', s.status,
                s.lease_expires_at) END AS message
  FROM scope AS s
  WHERE (s.status IN {_TERMINAL}) = (s.finished_at IS NULL)
     OR (s.lease_expires_at IS NOT NULL AND s.status <> 'running')""",
)

CHECKPOINT_MISSING = Check(
    "checkpoint_missing", ERROR, "every run has its context checkpoint (run_checkpoints)",
    select="""
  SELECT s.id AS run_id, CAST(NULL AS integer) AS boundary_seq,
    'the run has no run_checkpoints row: no claim can take it (the claim reads it)' AS message
  FROM scope AS s WHERE NOT EXISTS (SELECT 1 FROM run_checkpoints AS cp WHERE cp.run_id = s.id)""",
)

# Not about runs: every owner in scope (not with --run). Every statement moves a run and its
# owner's counter together (schema.store.limits), so one snapshot shows them equal.
OWNER_RUNNING = Check(
    "owner_running", ERROR, "owners.running equals the owner's runs that are running",
    select="""
  SELECT CAST(NULL AS uuid) AS run_id, CAST(NULL AS integer) AS boundary_seq,
    format('owner %s counts %s running run(s) (owners.running), but %s of its runs are running: its cap admits '
           'the wrong number (the reconciler recounts it within a pass)', o.owner, o.running, live.n) AS message
  FROM owners AS o
  CROSS JOIN LATERAL (SELECT count(*) AS n FROM runs AS r WHERE r.owner = o.owner AND r.status = 'running') AS live
  WHERE CAST(:run_id AS uuid) IS NULL AND (CAST(:owner AS text) IS NULL OR o.owner = CAST(:owner AS text))
    AND o.running <> live.n""",
)

CHECKS: tuple[Check, ...] = (
    ROUNDS_MISSING,
    ROUND_MISPLACED,
    SUSPENDED_WITHOUT_WAIT,
    FENCE_AHEAD,
    FENCE_ORDER,
    MESSAGE_GAP,
    MESSAGE_ORPHAN,
    TOOL_CALL_ORPHAN,
    EVENT_GAP,
    CALL_MISPLACED,
    STALE_COMMIT,
    ROUND_UNPAID,
    CALL_UNFINISHED,
    RUN_STATE,
    CHECKPOINT_MISSING,
    OWNER_RUNNING,
)

_RUNS_SQL = text(f"WITH {_SCOPE} SELECT count(*) FROM scope")


def audit_txn(conn: Connection, *, run_id: UUID | None = None, owner: str | None = None) -> AuditReport:
    """``audit`` on ``conn`` (which the caller has made REPEATABLE READ, for one snapshot)."""
    conn.execute(text("SET TRANSACTION READ ONLY"))
    params = {"run_id": run_id, "owner": owner}
    runs_checked = int(conn.execute(_RUNS_SQL, params).scalar_one())
    if run_id is not None and runs_checked == 0:
        raise RunNotFound(run_id)
    problems = [
        AuditProblem(check=check.code, severity=check.severity, run_id=row.run_id, boundary_seq=row.boundary_seq,
                     message=row.message)
        for check in CHECKS
        for row in conn.execute(check.statement, params)
    ]
    clean = not any(p.severity is Severity.ERROR for p in problems)
    return AuditReport(clean=clean, runs_checked=runs_checked, problems=problems)


def audit(engine: Engine, *, run_id: UUID | None = None, owner: str | None = None) -> AuditReport:
    """Run every check (``CHECKS``) over every run, ``owner``'s runs, or run ``run_id``
    (``RunNotFound`` when there is no such run, or it is another owner's), in one read-only
    REPEATABLE READ transaction: it writes nothing, and sees every run as of one moment."""
    return run_transaction(
        engine, lambda conn: audit_txn(conn, run_id=run_id, owner=owner), isolation_level="REPEATABLE READ",
        name="audit",
    )
