"""The database schema as SQLAlchemy Core tables (one MetaData).

Alembic migrations create it (``aidawork migrate``); a test proves that
``upgrade head`` equals this file. Status columns carry CHECK constraints that mirror
the ``StrEnum``s in ``schema.wire`` and ``schema.wire.vocab``, and are built from them.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    ForeignKey,
    Identity,
    Index,
    Integer,
    MetaData,
    SmallInteger,
    Table,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID

from schema.wire import RootPolicy, RunStatus
from schema.wire.vocab import MessageRole, RoundOutcomeKind, ToolAnswerKind, ToolDomain, ToolStatus, WebhookStatus

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(column_0_label)s",
        "uq": "uq_%(table_name)s_%(column_0_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s",
        "pk": "pk_%(table_name)s",
    }
)


def _in(column: str, values: list[str]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


def _now() -> Column:  # type: ignore[type-arg]
    return Column("created_at", DateTime(timezone=True), nullable=False, server_default=text("now()"))


ACTIVE_STATUSES = [RunStatus.QUEUED.value, RunStatus.RUNNING.value, RunStatus.SUSPENDED.value]

roots = Table(
    "roots",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True),
    Column("owner", Text, nullable=False),
    # The next run's position in the Root: runs of a Root execute in this order.
    Column("next_run_seq", Integer, nullable=False, server_default=text("0")),
    _now(),
)

runs = Table(
    "runs",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True),
    Column("root_id", UUID(as_uuid=True), ForeignKey("roots.id"), nullable=False),
    Column("root_seq", Integer, nullable=False),
    Column("owner", Text, nullable=False),
    Column("status", Text, nullable=False),
    Column("input", Text, nullable=False),
    Column("config", JSONB, nullable=False),
    # 0-9: orders the owner's rounds within its share of the fleet (schema.store.owners).
    Column("priority", SmallInteger, nullable=False, server_default=text("5")),
    # Number of committed rounds; the next round to execute has this boundary_seq.
    Column("boundary_seq", Integer, nullable=False, server_default=text("0")),
    # Incremented by every claim; every write after a claim is fenced by it.
    Column("claim_fence", BigInteger, nullable=False, server_default=text("0")),
    Column("lease_expires_at", DateTime(timezone=True)),
    # Executions of the current boundary's round that started and did not finish because
    # of the round itself (its worker died executing it, or it raised a bug); bounded, so a
    # poison round cannot loop. A claim alone, or an unavailable dependency, never counts.
    Column("round_attempts", Integer, nullable=False, server_default=text("0")),
    # The fence of the claim whose execution started (its first ledger row; a resume's
    # claim) and has not finished; the next claim counts it as a failed attempt.
    Column("execution_fence", BigInteger),
    # Holders of the current boundary's round that died holding it (their lease ran out)
    # while no worker that never held it died around then, whether or not its execution had
    # been marked: a backstop for a round that kills its worker before its execution is
    # marked (AIDAWORK_MAX_ROUND_ATTEMPTS x 3). Claims after a give-back never count.
    Column("round_claims", Integer, nullable=False, server_default=text("0")),
    # The worker processes (workers.id) that claimed the current boundary's round, in
    # order: the death of its last holder costs no attempt when a worker that never held
    # the round died around the same time (schema.store.workers.DEATH_ELSEWHERE).
    Column("round_holders", ARRAY(UUID(as_uuid=True)), nullable=False, server_default=text("'{}'::uuid[]")),
    # Sequence number of the run's last event.
    Column("event_seq", Integer, nullable=False, server_default=text("0")),
    # When a round task was last sent (or claimed): the reconciler re-sends stale ones.
    Column("dispatched_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    Column("output", Text),
    Column("error_code", Text),
    Column("error_message", Text),
    # The W3C traceparent of the run's trace, started by the submitting process: each
    # round's span joins it from whichever worker runs it. NULL when tracing was off.
    Column("trace_context", Text),
    _now(),
    Column("started_at", DateTime(timezone=True)),
    Column("finished_at", DateTime(timezone=True)),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    # Where the run's webhook events go (checked against AIDAWORK_WEBHOOK_URLS at submit);
    # may hold a token in its userinfo or query, so it is never logged or shown.
    Column("webhook_url", Text),
    # Idempotent submit: the same owner and key return this run while the key is set (it
    # is cleared by a later submit once older than AIDAWORK_IDEMPOTENCY_TTL_S), and
    # ``request_digest`` (of the request without its key) refuses a replay with another body.
    Column("idempotency_key", Text),
    Column("request_digest", Text),
    # Double-texting: what the submit did about the Root's active run, and, on a run an
    # ``interrupt`` / ``rollback`` cancelled, the run that did.
    Column("root_policy", Text, nullable=False, server_default=text("'enqueue'")),
    Column("interrupted_by", UUID(as_uuid=True)),
    # Set while the run is parked in 'suspended' because its owner's token budget could not
    # take the next model call (schema.store.budgets): the window, the amounts, the estimate.
    Column("budget_wait", JSONB),
    CheckConstraint(_in("status", [s.value for s in RunStatus]), name="status"),
    CheckConstraint("priority BETWEEN 0 AND 9", name="priority"),
    CheckConstraint(_in("root_policy", [p.value for p in RootPolicy]), name="root_policy"),
    UniqueConstraint("root_id", "root_seq"),
    Index(
        "ix_runs_owner_idempotency_key",
        "owner",
        "idempotency_key",
        unique=True,
        postgresql_where=text("idempotency_key IS NOT NULL"),
    ),
    Index(
        "ix_runs_dispatch",
        "dispatched_at",
        postgresql_where=text("status IN ('queued', 'running')"),
    ),
    # Retention (schema.store.retention) finds the oldest ended runs through it; partial,
    # so it holds only the history being kept.
    Index(
        "ix_runs_finished_at",
        "finished_at",
        postgresql_where=text("status IN ('completed', 'failed', 'cancelled')"),
    ),
    Index("ix_runs_budget_waits", "owner", postgresql_where=text("budget_wait IS NOT NULL")),
    # An owner's live runs: its cap's queue in submission order, and the counter's recount
    # (schema.store.limits).
    Index(
        "ix_runs_owner_live",
        "owner",
        "status",
        "created_at",
        "id",
        postgresql_where=text("status IN ('queued', 'running')"),
    ),
)

# Every worker process, registered when it starts, with the time of its last heartbeat
# (every lease_s / 3, holding rounds or not). One whose heartbeat is older than a lease and
# that never said it stopped has died: the evidence that workers are being lost for reasons
# that have nothing to do with a given round.
workers = Table(
    "workers",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True),
    Column("name", Text, nullable=False),  # aidawork-<pid>@<host>, for people
    Column("started_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    Column("heartbeat_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    Column("stopped_at", DateTime(timezone=True)),
    Index("ix_workers_heartbeat_at", "heartbeat_at", postgresql_where=text("stopped_at IS NULL")),
)

run_checkpoints = Table(
    "run_checkpoints",
    metadata,
    Column("run_id", UUID(as_uuid=True), ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
    # Where the run's model context stands: advanced by a context rebuild's admission.
    Column("boundary_seq", Integer, nullable=False, server_default=text("0")),
    Column("context_start_position", Integer, nullable=False, server_default=text("0")),
    Column("summary", Text),
    Column("rebuilds", Integer, nullable=False, server_default=text("0")),
    # The consumed rebuild that produced this context, and the chain it belongs to.
    Column("last_build_id", UUID(as_uuid=True)),
    Column("chain_anchor", Integer),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
)

# Context rebuilds. A chain is the span of a Root between two accepted model responses,
# named by the Root's last message position when it opened (chain_anchor). Each chain
# reserves at most two rebuilds (ordinal 1, then 2 bound to the consumed 1): the unique
# constraint and the CHECKs hold that even under write skew.
runtime_work_model_rebuilds = Table(
    "runtime_work_model_rebuilds",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True),
    Column("root_id", UUID(as_uuid=True), ForeignKey("roots.id"), nullable=False),
    Column("chain_anchor", Integer, nullable=False),
    Column("ordinal", Integer, nullable=False),
    Column("predecessor_build_id", UUID(as_uuid=True), ForeignKey("runtime_work_model_rebuilds.id")),
    Column("run_id", UUID(as_uuid=True), ForeignKey("runs.id"), nullable=False),
    Column("boundary_seq", Integer, nullable=False),
    Column("claim_fence", BigInteger, nullable=False),
    Column("source_message_ids", ARRAY(BigInteger)),
    Column("source_digest", Text),
    Column("summary", Text),
    _now(),
    CheckConstraint("ordinal IN (1, 2)", name="ordinal"),
    CheckConstraint("(ordinal = 1) = (predecessor_build_id IS NULL)", name="predecessor"),
    UniqueConstraint("root_id", "chain_anchor", "ordinal"),
)

# Immutable (a trigger refuses UPDATE and DELETE): one row per consumed build.
runtime_work_model_rebuild_consumptions = Table(
    "runtime_work_model_rebuild_consumptions",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("build_id", UUID(as_uuid=True), ForeignKey("runtime_work_model_rebuilds.id"), nullable=False, unique=True),
    Column("run_id", UUID(as_uuid=True), ForeignKey("runs.id"), nullable=False),
    Column("boundary_seq", Integer, nullable=False),
    Column("claim_fence", BigInteger, nullable=False),
    Column("source_digest", Text, nullable=False),
    Column("consumed_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
)

ROUND_OUTCOMES = [k.value for k in RoundOutcomeKind]

rounds = Table(
    "rounds",
    metadata,
    Column("run_id", UUID(as_uuid=True), ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
    Column("boundary_seq", Integer, primary_key=True),
    Column("claim_fence", BigInteger, nullable=False),
    Column("outcome", Text, nullable=False),
    Column("system_digest", Text, nullable=False),
    Column("messages_digest", Text, nullable=False),
    Column("tools_digest", Text, nullable=False),
    Column("accepted_response_digest", Text),
    # How the model's answer ended, the provider's word (stop, length, end_turn, ...).
    Column("finish_reason", Text),
    # The repeated-call breaker's state after this round: the tool round's fingerprint
    # (NULL when the round does not count) and the consecutive identical rounds so far.
    Column("tool_fingerprint", Text),
    Column("repeat_count", Integer, nullable=False, server_default=text("0")),
    # HMAC over run, boundary, claim fence and the four digests (runtime.proofs).
    Column("proof", Text),
    # A suspended round is completed in place by its resume (outcome 'suspend' -> ...).
    Column("resumed_at", DateTime(timezone=True)),
    Column("resume_fence", BigInteger),
    _now(),
    CheckConstraint(_in("outcome", ROUND_OUTCOMES), name="outcome"),
)

MESSAGE_ROLES = [r.value for r in MessageRole]

messages = Table(
    "messages",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("root_id", UUID(as_uuid=True), ForeignKey("roots.id"), nullable=False),
    # Position in the Root's conversation, gapless from 0; only the active run writes.
    Column("position", Integer, nullable=False),
    Column("run_id", UUID(as_uuid=True), ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
    Column("boundary_seq", Integer, nullable=False),
    Column("role", Text, nullable=False),
    Column("body", JSONB, nullable=False),
    # Digest of the Root's history up to and including this message.
    Column("chain_digest", Text, nullable=False),
    _now(),
    CheckConstraint(_in("role", MESSAGE_ROLES), name="role"),
    UniqueConstraint("root_id", "position"),
)

TOOL_STATUSES = [s.value for s in ToolStatus]
TOOL_DOMAINS = [d.value for d in ToolDomain]

tool_invocations = Table(
    "tool_invocations",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("run_id", UUID(as_uuid=True), ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
    Column("boundary_seq", Integer, nullable=False),
    Column("tool_call_id", Text, nullable=False),
    Column("tool_name", Text, nullable=False),
    Column("tool_domain", Text),
    Column("args", JSONB, nullable=False),
    Column("args_digest", Text, nullable=False),
    Column("status", Text, nullable=False),
    # The full raw result, whatever the model's next context is given.
    Column("result", JSONB),
    Column("result_digest", Text),
    Column("claim_fence", BigInteger, nullable=False),
    # Set while (or after) the call was suspended: what it waits for, and the projection
    # a resume must match (runtime.resume.OriginalToolRoundResume).
    Column("suspension", JSONB),
    # A person's decision on the call, when it needed approval: {decision, args?, reason?}.
    Column("approval", JSONB),
    Column("invocation_id", Text, unique=True),
    Column("work_owner", Text),
    Column("proof", Text),
    _now(),
    CheckConstraint(_in("status", TOOL_STATUSES), name="status"),
    CheckConstraint(f"tool_domain IS NULL OR {_in('tool_domain', TOOL_DOMAINS)}", name="tool_domain"),
    UniqueConstraint("run_id", "tool_call_id"),
)

# Durable local reads: file bodies delivered by the client, kept out of the messages
# table (the history holds only a placeholder with the digest).
local_reads = Table(
    "local_reads",
    metadata,
    Column("run_id", UUID(as_uuid=True), ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
    Column("tool_call_id", Text, primary_key=True),
    Column("path", Text, primary_key=True),
    Column("content", Text, nullable=False),
    Column("digest", Text, nullable=False),
    Column("size_bytes", Integer, nullable=False),
    Column("delivered_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
)

prerequisites = Table(
    "prerequisites",
    metadata,
    Column("run_id", UUID(as_uuid=True), ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
    Column("key", Text, primary_key=True),
    Column("value", JSONB, nullable=False),
    Column("resolved_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
)

# Answers to suspended calls: a client tool's result, a person's approval or rejection, an
# operator's word on an at_most_once call whose outcome is unknown. One per suspension
# (its invocation id); an approval holds for every later execution of the call.
tool_answers = Table(
    "tool_answers",
    metadata,
    Column("run_id", UUID(as_uuid=True), ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
    Column("invocation_id", Text, primary_key=True),
    Column("tool_call_id", Text, nullable=False),
    Column("kind", Text, nullable=False),
    Column("value", JSONB),
    Column("is_error", Boolean, nullable=False, server_default=text("false")),
    Column("reason", Text),
    _now(),
    CheckConstraint(_in("kind", [k.value for k in ToolAnswerKind]), name="kind"),
)

# The start (and end) of every execution of an at_most_once tool call, written fenced
# before its handler runs: a round re-executed after a crash finds the start and does not
# run the handler again.
TOOL_EXECUTION_STATUSES = [ToolStatus.COMPLETED.value, ToolStatus.FAILED.value]
tool_executions = Table(
    "tool_executions",
    metadata,
    Column("run_id", UUID(as_uuid=True), ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
    Column("tool_call_id", Text, primary_key=True),
    Column("boundary_seq", Integer, nullable=False),
    Column("claim_fence", BigInteger, nullable=False),
    Column("executions", Integer, nullable=False, server_default=text("1")),
    # The answer (the wait's invocation id) whose retry started the latest execution.
    Column("retry_of", Text),
    Column("status", Text),  # NULL: started, end not recorded
    Column("result", JSONB),
    Column("started_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    Column("finished_at", DateTime(timezone=True)),
    CheckConstraint(f"status IS NULL OR {_in('status', TOOL_EXECUTION_STATUSES)}", name="status"),
)

run_events = Table(
    "run_events",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("run_id", UUID(as_uuid=True), ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
    # Gapless per run from 1: what a watcher resumes from.
    Column("seq", Integer, nullable=False),
    Column("kind", Text, nullable=False),
    Column("data", JSONB, nullable=False),
    _now(),
    UniqueConstraint("run_id", "seq"),
)

MODEL_CALL_STATUSES = ["started", "succeeded", "failed"]

model_calls = Table(
    "model_calls",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("run_id", UUID(as_uuid=True), ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
    Column("boundary_seq", Integer, nullable=False),
    # The attempt at this boundary that made the call (runs.round_attempts + 1).
    Column("attempt", Integer, nullable=False),
    Column("claim_fence", BigInteger, nullable=False),
    Column("status", Text, nullable=False),
    Column("request_digest", Text, nullable=False),
    Column("response_digest", Text),
    # The response of a call that succeeded (``ModelResponse.to_json()``): a round redone
    # after its holder died continues from it when its request is the same (request_digest),
    # instead of paying for the call again. NULL for a failed or unfinished call.
    Column("response", JSONB),
    Column("input_tokens", Integer),
    Column("output_tokens", Integer),
    Column("error_code", Text),
    # The call was paid for by a holder that had lost its claim by the time it returned
    # (paused, partitioned, taken over): its outcome and usage are on record all the same,
    # and its round can never commit.
    Column("stale", Boolean, nullable=False, server_default=text("false")),
    Column("started_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    Column("finished_at", DateTime(timezone=True)),
    # The owner's budget window this call reserved its estimate in, and how much (NULL: the
    # owner had no budget); ``reservation_open`` while the reservation is held, so the
    # settlement or the release of a dead holder's reservation happens once (schema.store.budgets).
    Column("spend_window_start", DateTime(timezone=True)),
    Column("reserved_tokens", BigInteger),
    Column("reservation_open", Boolean, nullable=False, server_default=text("false")),
    CheckConstraint(_in("status", MODEL_CALL_STATUSES), name="status"),
    Index("ix_model_calls_run_boundary", "run_id", "boundary_seq"),
    Index("ix_model_calls_open_reservations", "run_id", postgresql_where=text("reservation_open")),
)

# The webhook outbox: one row per event of a run with a webhook_url whose kind is in
# schema.wire.WEBHOOK_EVENTS, inserted by the trigger ``run_events_webhook_outbox``
# (migration 0012; AFTER INSERT ON run_events) in the event's own transaction, which also
# NOTIFYs ``aidawork_webhooks``. The deliverer (worker.webhooks) claims due rows with
# FOR UPDATE SKIP LOCKED; ``attempts`` fences the end of each attempt. ``next_attempt_at``
# is set exactly while the delivery is pending (while an attempt is in flight it is the
# attempt's lease: a deliverer that died mid-attempt is retried then).
webhook_deliveries = Table(
    "webhook_deliveries",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("run_id", UUID(as_uuid=True), ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
    Column("event_seq", Integer, nullable=False),
    Column("event_kind", Text, nullable=False),
    Column("status", Text, nullable=False, server_default=text("'pending'")),
    Column("attempts", Integer, nullable=False, server_default=text("0")),
    Column("next_attempt_at", DateTime(timezone=True), server_default=text("now()")),
    Column("last_status_code", Integer),
    # What went wrong with the last attempt: the HTTP status's text or the error's type;
    # never the URL (it may hold a token).
    Column("last_error", Text),
    Column("delivered_at", DateTime(timezone=True)),
    _now(),
    CheckConstraint(_in("status", [s.value for s in WebhookStatus]), name="status"),
    CheckConstraint("(status = 'pending') = (next_attempt_at IS NOT NULL)", name="next_attempt"),
    UniqueConstraint("run_id", "event_seq"),
    Index("ix_webhook_deliveries_due", "next_attempt_at", postgresql_where=text("status = 'pending'")),
)


# Each owner's (tenant's) limits; an owner without a row has none (no cap, weight 1, no
# budget). ``running``: the owner's runs holding a slot, a locked counter kept by the claim
# and by every write that ends or suspends a run.
owners = Table(
    "owners",
    metadata,
    Column("owner", Text, primary_key=True),
    Column("max_running", Integer),
    Column("weight", Integer, nullable=False, server_default=text("1")),
    Column("token_budget", BigInteger),
    Column("budget_window", Text),
    Column("on_budget", Text, nullable=False, server_default=text("'fail'")),
    Column("running", Integer, nullable=False, server_default=text("0")),
    _now(),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    CheckConstraint("max_running IS NULL OR max_running >= 1", name="max_running"),
    CheckConstraint("weight BETWEEN 1 AND 1000", name="weight"),
    CheckConstraint("token_budget IS NULL OR token_budget >= 1", name="token_budget"),
    CheckConstraint("budget_window IS NULL OR budget_window IN ('1h', '1d', '30d')", name="budget_window"),
    CheckConstraint("(token_budget IS NULL) = (budget_window IS NULL)", name="budget_has_window"),
    CheckConstraint("on_budget IN ('fail', 'wait')", name="on_budget"),
    CheckConstraint("running >= 0", name="running"),
)

# Each owner's token spend per budget window (fixed windows aligned to the epoch): tokens
# settled by finished calls (``used``) and reserved by calls in flight (``reserved``). The
# reservation is one conditional upsert on this row (schema.store.budgets).
owner_spend = Table(
    "owner_spend",
    metadata,
    Column("owner", Text, primary_key=True),
    Column("window_start", DateTime(timezone=True), primary_key=True),
    Column("used", BigInteger, nullable=False, server_default=text("0")),
    Column("reserved", BigInteger, nullable=False, server_default=text("0")),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    CheckConstraint("used >= 0", name="used"),
    CheckConstraint("reserved >= 0", name="reserved"),
)
