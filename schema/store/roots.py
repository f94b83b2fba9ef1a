"""A Root's order: the runs of one Root execute one at a time, in ``root_seq`` order.
These are the two named SQL fragments every statement that keeps that order uses (the
claim, the reconciler, the end of a run and a round's commit)."""

from __future__ import annotations

_EARLIER_ACTIVE = """
    EXISTS (SELECT 1 FROM runs AS earlier
            WHERE earlier.root_id = {alias}.root_id AND earlier.root_seq < {alias}.root_seq
              AND earlier.status IN ('queued', 'running', 'suspended'))
"""

_NEXT_IN_ROOT = """
    (SELECT n.id FROM runs AS n
     WHERE n.root_id = {alias}.root_id AND n.root_seq > {alias}.root_seq AND n.status = 'queued'
     ORDER BY n.root_seq LIMIT 1)
"""


def earlier_active_sql(alias: str) -> str:
    """True while an earlier run of the Root of run row ``alias`` holds the Root's turn
    (it has not ended): that run waits until it does."""
    return _EARLIER_ACTIVE.format(alias=alias)


def next_in_root_sql(alias: str) -> str:
    """The id of the queued run of the Root of run row ``alias`` that comes next (or NULL):
    the one to enqueue when that run ends."""
    return _NEXT_IN_ROOT.format(alias=alias)
