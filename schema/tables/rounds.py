"""What a run's rounds store: rounds, messages, tool invocations and what they wait for
(local reads, prerequisites, answers), at-most-once executions, the event log, the
model-call ledger and the webhook outbox."""

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
    Table,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB, UUID

from schema.tables.base import created_at_column, metadata, one_of
from schema.wire.vocab import MessageRole, RoundOutcomeKind, ToolAnswerKind, ToolDomain, ToolStatus, WebhookStatus

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
    created_at_column(),
    CheckConstraint(one_of("outcome", ROUND_OUTCOMES), name="outcome"),
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
    created_at_column(),
    CheckConstraint(one_of("role", MESSAGE_ROLES), name="role"),
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
    created_at_column(),
    CheckConstraint(one_of("status", TOOL_STATUSES), name="status"),
    CheckConstraint(f"tool_domain IS NULL OR {one_of('tool_domain', TOOL_DOMAINS)}", name="tool_domain"),
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
    created_at_column(),
    CheckConstraint(one_of("kind", [k.value for k in ToolAnswerKind]), name="kind"),
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
    CheckConstraint(f"status IS NULL OR {one_of('status', TOOL_EXECUTION_STATUSES)}", name="status"),
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
    created_at_column(),
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
    CheckConstraint(one_of("status", MODEL_CALL_STATUSES), name="status"),
    Index("ix_model_calls_run_boundary", "run_id", "boundary_seq"),
    Index("ix_model_calls_open_reservations", "run_id", postgresql_where=text("reservation_open")),
)

# The webhook outbox: one row per event of a run with a webhook_url whose kind is in
# schema.wire.WEBHOOK_EVENTS, inserted by the trigger ``run_events_webhook_outbox``
# (migration 0012; AFTER INSERT ON run_events) in the event's own transaction, which also
# NOTIFYs ``aidawork_webhooks``. The deliverer (worker.ops.webhooks) claims due rows with
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
    created_at_column(),
    CheckConstraint(one_of("status", [s.value for s in WebhookStatus]), name="status"),
    CheckConstraint("(status = 'pending') = (next_attempt_at IS NOT NULL)", name="next_attempt"),
    UniqueConstraint("run_id", "event_seq"),
    Index("ix_webhook_deliveries_due", "next_attempt_at", postgresql_where=text("status = 'pending'")),
)
