"""Each owner's (tenant's) limits and token spend."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Column,
    DateTime,
    Integer,
    Table,
    Text,
    text,
)

from schema.tables.base import created_at_column, metadata, one_of
from schema.wire.owners import BUDGET_WINDOWS, ON_BUDGET

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
    created_at_column(),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    CheckConstraint("max_running IS NULL OR max_running >= 1", name="max_running"),
    CheckConstraint("weight BETWEEN 1 AND 1000", name="weight"),
    CheckConstraint("token_budget IS NULL OR token_budget >= 1", name="token_budget"),
    CheckConstraint(f"budget_window IS NULL OR {one_of('budget_window', list(BUDGET_WINDOWS))}", name="budget_window"),
    CheckConstraint("(token_budget IS NULL) = (budget_window IS NULL)", name="budget_has_window"),
    CheckConstraint(one_of("on_budget", list(ON_BUDGET)), name="on_budget"),
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
