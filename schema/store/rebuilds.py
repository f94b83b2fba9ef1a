"""Context rebuilds: the chain slot reservation, the candidate record and the
REPEATABLE READ admission that consumes a build and advances the run's checkpoint.

The admission is one transaction at REPEATABLE READ under the current claim fence. On a
serialization failure (40001) or deadlock (40P01) ``run_transaction`` runs *only this
transaction* again; the candidate (and its summary) was prepared before and is reused.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from uuid import UUID, uuid4

from sqlalchemy import Connection, text

from schema.store.bodies import message_body_sql
from schema.store.errors import FenceLost
from schema.store.rows import StoredRow
from schema.wire.rebuild import ChainBuild, RebuildCandidate, ReservationPlan, SourceMessage

# The core's rules, passed in (``runtime.rebuild.plan_reservation`` and
# ``verify_prepared_prefix``): the store reads and writes, the core decides.
PlanReservation = Callable[[Sequence[ChainBuild], str | None], ReservationPlan]
VerifyPrefix = Callable[[RebuildCandidate, Sequence[SourceMessage], set[str]], None]


@dataclass(frozen=True)
class Reservation:
    build_id: UUID
    ordinal: int
    predecessor_build_id: UUID | None


def _hold_fence(conn: Connection, run_id: UUID, fence: int) -> StoredRow:
    row = conn.execute(
        text("SELECT root_id FROM runs WHERE id = :id AND claim_fence = :fence AND status = 'running'"),
        {"id": run_id, "fence": fence},
    ).one_or_none()
    if row is None:
        raise FenceLost(run_id, fence)
    return row


def reserve_model_rebuild_txn(
    conn: Connection,
    *,
    run_id: UUID,
    fence: int,
    boundary_seq: int,
    chain_anchor: int,
    predecessor_build_id: UUID | None,
    plan_reservation: PlanReservation,
) -> Reservation:
    """Reserve the chain's next rebuild slot (or take over an unconsumed one). The Root
    row is locked first, so concurrent reservations of one chain are serialized; the
    unique (root, chain, ordinal) constraint holds the limit even without the lock."""
    root_id = _hold_fence(conn, run_id, fence).root_id
    conn.execute(text("SELECT 1 FROM roots WHERE id = :id FOR UPDATE"), {"id": root_id})
    chain = [
        ChainBuild(str(r.id), r.ordinal, r.consumed)
        for r in conn.execute(
            text(
                "SELECT b.id, b.ordinal, c.id IS NOT NULL AS consumed FROM runtime_work_model_rebuilds b "
                "LEFT JOIN runtime_work_model_rebuild_consumptions c ON c.build_id = b.id "
                "WHERE b.root_id = :root AND b.chain_anchor = :anchor ORDER BY b.ordinal"
            ),
            {"root": root_id, "anchor": chain_anchor},
        )
    ]
    plan = plan_reservation(chain, str(predecessor_build_id) if predecessor_build_id else None)
    params = {"run": run_id, "fence": fence, "boundary": boundary_seq}
    if plan.take_build_id is not None:
        conn.execute(
            text(
                "UPDATE runtime_work_model_rebuilds SET run_id = :run, claim_fence = :fence, "
                "boundary_seq = :boundary, source_message_ids = NULL, source_digest = NULL, summary = NULL "
                "WHERE id = :id"
            ),
            {**params, "id": plan.take_build_id},
        )
        build_id = UUID(plan.take_build_id)
    else:
        build_id = uuid4()
        conn.execute(
            text(
                "INSERT INTO runtime_work_model_rebuilds (id, root_id, chain_anchor, ordinal, "
                "predecessor_build_id, run_id, boundary_seq, claim_fence) "
                "VALUES (:id, :root, :anchor, :ordinal, :predecessor, :run, :boundary, :fence)"
            ),
            {
                **params,
                "id": build_id,
                "root": root_id,
                "anchor": chain_anchor,
                "ordinal": plan.ordinal,
                "predecessor": plan.predecessor_build_id,
            },
        )
    predecessor = UUID(plan.predecessor_build_id) if plan.predecessor_build_id else None
    return Reservation(build_id, plan.ordinal, predecessor)


def load_context_sources_txn(conn: Connection, root_id: UUID, from_position: int) -> list[SourceMessage]:
    """The Root's stored messages from a position, as a rebuild reads them."""
    rows = conn.execute(
        text(
            f"SELECT m.id, m.position, m.run_id, {message_body_sql()} AS body FROM messages AS m "
            "WHERE m.root_id = :root AND m.position >= :start ORDER BY m.position"
        ),
        {"root": root_id, "start": from_position},
    )
    return [SourceMessage(r.id, r.position, str(r.run_id), r.body) for r in rows]


def record_candidate_txn(
    conn: Connection, build_id: UUID, run_id: UUID, fence: int, candidate: RebuildCandidate
) -> None:
    """Record the prepared candidate on its build (fenced)."""
    result = conn.execute(
        text(
            "UPDATE runtime_work_model_rebuilds SET source_message_ids = :ids, source_digest = :digest, "
            "summary = :summary WHERE id = :id AND run_id = :run AND claim_fence = :fence"
        ),
        {
            "ids": list(candidate.source_message_ids),
            "digest": candidate.source_digest,
            "summary": candidate.summary,
            "id": build_id,
            "run": run_id,
            "fence": fence,
        },
    )
    if result.rowcount != 1:
        raise FenceLost(run_id, fence)


def admit_model_rebuild_request_txn(
    conn: Connection,
    *,
    build_id: UUID,
    run_id: UUID,
    fence: int,
    boundary_seq: int,
    chain_anchor: int,
    context_start: int,
    candidate: RebuildCandidate,
    authorize: Callable[[int], None],
    verify_prefix: VerifyPrefix,
    after_snapshot: Callable[[], None] | None = None,
) -> None:
    """Consume the build: at REPEATABLE READ, under the held fence, re-check the driver's
    authorization (``authorize(fence)`` verifies its proof) and the source prefix
    (``verify_prefix``, which raises if it changed), write
    the immutable consumption row, and advance the run's checkpoint. ``after_snapshot``
    is a test seam, called once the transaction has read its snapshot."""
    root_id = _hold_fence(conn, run_id, fence).root_id
    authorize(fence)
    context = load_context_sources_txn(conn, root_id, context_start)
    eligible = {
        str(r.id)
        for r in conn.execute(
            text("SELECT id FROM runs WHERE root_id = :root AND (status = 'completed' OR id = :run)"),
            {"root": root_id, "run": run_id},
        )
    }
    verify_prefix(candidate, context, eligible)
    if after_snapshot is not None:
        after_snapshot()
    conn.execute(
        text(
            "INSERT INTO runtime_work_model_rebuild_consumptions (build_id, run_id, boundary_seq, claim_fence, "
            "source_digest) VALUES (:build, :run, :boundary, :fence, :digest)"
        ),
        {
            "build": build_id,
            "run": run_id,
            "boundary": boundary_seq,
            "fence": fence,
            "digest": candidate.source_digest,
        },
    )
    conn.execute(
        text(
            "UPDATE run_checkpoints SET boundary_seq = :boundary, context_start_position = :start, "
            "summary = :summary, rebuilds = rebuilds + 1, last_build_id = :build, chain_anchor = :anchor, "
            "updated_at = now() WHERE run_id = :run"
        ),
        {
            "boundary": boundary_seq,
            "start": candidate.last_source_position + 1,
            "summary": candidate.summary,
            "build": build_id,
            "anchor": chain_anchor,
            "run": run_id,
        },
    )
    event = {
        "build_id": str(build_id),
        "boundary_seq": boundary_seq,
        "source_messages": len(candidate.source_message_ids),
        "context_start": candidate.last_source_position + 1,
    }
    written = conn.execute(
        text(
            "WITH upd AS (UPDATE runs SET event_seq = event_seq + 1, updated_at = now() "
            "  WHERE id = :run AND claim_fence = :fence RETURNING event_seq) "
            "INSERT INTO run_events (run_id, seq, kind, data) "
            "SELECT :run, event_seq, 'context_rebuilt', CAST(:data AS jsonb) FROM upd RETURNING seq"
        ),
        {"run": run_id, "fence": fence, "data": json.dumps(event)},
    ).one_or_none()
    if written is None:
        raise FenceLost(run_id, fence)
