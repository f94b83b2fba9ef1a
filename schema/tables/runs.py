"""Roots, runs, the worker registry, run checkpoints and context rebuilds."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Column,
    DateTime,
    Double,
    ForeignKey,
    Identity,
    Index,
    Integer,
    SmallInteger,
    Table,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID

from schema.tables.base import created_at_column, metadata, one_of
from schema.wire import RootPolicy, RunStatus

roots = Table(
    "roots",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True),
    Column("owner", Text, nullable=False),
    # The next run's position in the Root: runs of a Root execute in this order.
    Column("next_run_seq", Integer, nullable=False, server_default=text("0")),
    created_at_column(),
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
    created_at_column(),
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
    # The saved agent the run was made from, NAME@VERSION (NULL: the run sent its config).
    Column("agent", Text),
    # A fork (schema.store.forks): the run it was forked from and how many of that run's
    # rounds it copied (its execution started at that boundary). No foreign key: a fork
    # keeps its parent's id after retention deletes the parent.
    Column("forked_from", UUID(as_uuid=True)),
    Column("forked_at_round", Integer),
    CheckConstraint(one_of("status", [s.value for s in RunStatus]), name="status"),
    CheckConstraint(
        "(forked_from IS NULL) = (forked_at_round IS NULL) AND coalesce(forked_at_round, 0) >= 0", name="fork"
    ),
    CheckConstraint("priority BETWEEN 0 AND 9", name="priority"),
    CheckConstraint(one_of("root_policy", [p.value for p in RootPolicy]), name="root_policy"),
    UniqueConstraint("root_id", "root_seq"),
    Index(
        "ix_runs_owner_idempotency_key",
        "owner",
        "idempotency_key",
        unique=True,
        postgresql_where=text("idempotency_key IS NOT NULL"),
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
    # Room on each page for a row's next version: a round's updates of its run (the claim,
    # the commit) change no indexed column, so they are HOT (no index entries, less WAL).
    postgresql_with={"fillfactor": 80},
)

# Every worker process, registered when it starts, with the time of its last heartbeat
# (every AIDAWORK_WORKER_HEARTBEAT_S, holding rounds or not). One whose heartbeat is older
# than AIDAWORK_WORKER_DEAD_AFTER_S (beat marks it: dead_at) or than a lease, and that never
# said it stopped, has died: its runs are handed on at once, and its death is the evidence
# that workers are being lost for reasons that have nothing to do with a given round.
workers = Table(
    "workers",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True),
    Column("name", Text, nullable=False),  # aidawork-<pid>@<host>, for people
    Column("started_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    Column("heartbeat_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    Column("stopped_at", DateTime(timezone=True)),
    # When beat found it silent past AIDAWORK_WORKER_DEAD_AFTER_S; it holds only while no
    # heartbeat came since (a paused worker that resumes is alive again). schema.store.workers.
    Column("dead_at", DateTime(timezone=True)),
    # How often the worker said it would heartbeat (AIDAWORK_WORKER_HEARTBEAT_S): beat takes
    # its silence for a death only when the dead limit spans two of its heartbeats. NULL:
    # code older than migration 0023 (a heartbeat every lease_s / 3), judged by its lease only.
    Column("heartbeat_s", Double),
    # The compatibility level of the worker's code (schema.store.compat); NULL: registered by
    # code older than migration 0021, which checks nothing.
    Column("code_level", Integer),
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
    created_at_column(),
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
