"""Webhooks: runs.webhook_url and the webhook_deliveries outbox, filled by a trigger on
run_events (so an outbox row is written in the same transaction as its event, by every
path that writes one, without a round trip on the round's commit).

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import UUID

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

# Frozen copies of the values in schema.tables / schema.wire at this revision.
_KINDS = "'run_completed', 'run_failed', 'run_cancelled', 'run_suspended'"
_STATUSES = "'pending', 'delivered', 'failed'"


def upgrade() -> None:
    op.add_column("runs", sa.Column("webhook_url", sa.Text(), nullable=True))
    op.create_table(
        "webhook_deliveries",
        sa.Column("id", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column("run_id", UUID(as_uuid=True), nullable=False),
        sa.Column("event_seq", sa.Integer(), nullable=False),
        sa.Column("event_kind", sa.Text(), nullable=False),
        sa.Column("status", sa.Text(), server_default=sa.text("'pending'"), nullable=False),
        sa.Column("attempts", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=True),
        sa.Column("last_status_code", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("delivered_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint(f"status IN ({_STATUSES})", name=op.f("ck_webhook_deliveries_status")),
        sa.CheckConstraint(
            "(status = 'pending') = (next_attempt_at IS NOT NULL)", name=op.f("ck_webhook_deliveries_next_attempt")
        ),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_webhook_deliveries_run_id"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_webhook_deliveries")),
        sa.UniqueConstraint("run_id", "event_seq", name=op.f("uq_webhook_deliveries_run_id")),
    )
    op.create_index(
        "ix_webhook_deliveries_due",
        "webhook_deliveries",
        ["next_attempt_at"],
        postgresql_where=sa.text("status = 'pending'"),
    )
    op.execute(
        """
        CREATE FUNCTION aidawork_webhook_outbox() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
          INSERT INTO webhook_deliveries (run_id, event_seq, event_kind)
          SELECT NEW.run_id, NEW.seq, NEW.kind FROM runs WHERE id = NEW.run_id AND webhook_url IS NOT NULL;
          IF FOUND THEN
            PERFORM pg_notify('aidawork_webhooks', '');
          END IF;
          RETURN NULL;
        END $$
        """
    )
    op.execute(
        "CREATE TRIGGER run_events_webhook_outbox AFTER INSERT ON run_events FOR EACH ROW "
        f"WHEN (NEW.kind IN ({_KINDS})) EXECUTE FUNCTION aidawork_webhook_outbox()"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER run_events_webhook_outbox ON run_events")
    op.execute("DROP FUNCTION aidawork_webhook_outbox()")
    op.drop_index("ix_webhook_deliveries_due", table_name="webhook_deliveries")
    op.drop_table("webhook_deliveries")
    op.drop_column("runs", "webhook_url")
