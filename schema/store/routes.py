"""A run's route (``schema.wire.route``): its owner, the owner's weight and its priority.

The statements that hand a run to a sender return these columns themselves (the claim,
submit, the reconciler's pass), so routing costs the round no read of its own;
``route_of_txn`` is for the cold paths (a delivery's resume, a Root's next run after a
cancel or a run's end), one small read per event, never per round."""

from __future__ import annotations

from uuid import UUID

from sqlalchemy import Connection, text

from schema.wire.route import DEFAULT_WEIGHT, Route

_WEIGHT = "coalesce((SELECT o.weight FROM owners AS o WHERE o.owner = {alias}.owner), {default})"


def weight_sql(alias: str) -> str:
    """The weight of the owner of run row ``alias``: its ``owners`` row's, or the default
    for an owner without one."""
    return _WEIGHT.format(alias=alias, default=DEFAULT_WEIGHT)


_ROUTE_SQL = text(f"SELECT r.owner, r.priority, {weight_sql('r')} AS weight FROM runs AS r WHERE r.id = :run_id")


def route_of_txn(conn: Connection, run_id: UUID, owner: str | None = None) -> Route:
    """The run's route now. A run that is gone (deleted since) routes by ``owner`` with
    the defaults (its claim drops the message); without ``owner``, by an empty one."""
    row = conn.execute(_ROUTE_SQL, {"run_id": run_id}).one_or_none()
    if row is None:
        return Route(owner or "")
    return Route(row.owner, row.weight, row.priority)
