"""Retention on the worker side: beat's periodic pass (``AIDAWORK_RETENTION_DAYS``) and
``aidawork prune``. What goes, and why that is safe for live runs, is decided in
``schema.store.retention``; this module only paces the batches and logs them.

Beat runs the passes in a thread of its own, beside the reconciler's, so a long first
pass over years of history never delays the repair of a crashed round."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from datetime import datetime
from typing import cast

import structlog
from sqlalchemy import Engine

from schema.store.retention import SPEND_TABLE, Cursor, Pruned, database_cutoff, plan_prune, prune_batch, prune_spend

log = structlog.get_logger("aidawork.retention")
SECONDS_PER_DAY = 86_400


@dataclass(frozen=True)
class PruneReport:
    """A pass's outcome: the cutoff it used and what it deleted (or, for a dry run, what
    it would delete)."""

    cutoff: datetime
    older_than_days: float
    dry_run: bool
    pruned: Pruned
    batches: int

    def to_json(self) -> dict[str, object]:
        return {
            "dry_run": self.dry_run,
            "older_than_days": self.older_than_days,
            "cutoff": self.cutoff.isoformat(),
            "roots": self.pruned.roots,
            "runs": self.pruned.runs,
            "rows": self.pruned.rows,
            "batches": self.batches,
        }


def older_than_days_arg(raw: str) -> float:
    """``aidawork prune --older-than-days N``: a positive number of days (fractions too)."""
    try:
        days = float(raw)
    except ValueError:
        days = float("nan")
    if not 0 < days <= 36_500:  # NaN fails too
        raise ValueError(f"--older-than-days must be a number of days in (0, 36500], not {raw!r}")
    return days


def describe(report: PruneReport) -> list[str]:
    """``aidawork prune``'s text output: a headline, then the rows per table."""
    verb = "would prune" if report.dry_run else "pruned"
    lines = [
        f"{verb} {report.pruned.runs} runs of {report.pruned.roots} Roots whose runs all ended before "
        f"{report.cutoff.isoformat()} (older than {report.older_than_days:g} days)"
    ]
    lines += [f"  {table:<42}{count:>10}" for table, count in report.pruned.rows.items()]
    return lines


def prune(engine: Engine, *, older_than_days: float, batch_runs: int, dry_run: bool = False,
          source: str = "cli", stop: threading.Event | None = None) -> PruneReport:
    """One pass: delete every Root expired ``older_than_days`` ago, a batch (one
    transaction) at a time, logging ``runs_pruned`` per batch that deleted anything. With
    ``dry_run``, count what would go instead, changing nothing."""
    cutoff = database_cutoff(engine, older_than_days * SECONDS_PER_DAY)
    if dry_run:
        return PruneReport(cutoff, older_than_days, True, plan_prune(engine, cutoff=cutoff), 0)
    total, batches, cursor = Pruned(), 0, cast(Cursor | None, None)
    while True:
        batch = prune_batch(engine, cutoff=cutoff, limit=batch_runs, after=cursor)
        batches += 1
        if batch.pruned.roots:
            total += batch.pruned
            log.info("runs_pruned", source=source, runs=batch.pruned.runs, roots=batch.pruned.roots,
                     rows={t: n for t, n in batch.pruned.rows.items() if n}, cutoff=cutoff.isoformat())
        if batch.scanned < batch_runs:
            spend = prune_spend(engine, cutoff=cutoff)
            if spend.rows[SPEND_TABLE]:
                log.info("spend_windows_pruned", source=source, rows=spend.rows[SPEND_TABLE], cutoff=cutoff.isoformat())
            return PruneReport(cutoff, older_than_days, False, total + spend, batches)
        if stop is not None and stop.is_set():  # beat is stopping: the rest waits for its next start
            return PruneReport(cutoff, older_than_days, False, total, batches)
        # A full batch scanned runs after the cursor, so this moves it on.
        cursor = batch.cursor


def prune_periodically(engine: Engine, *, older_than_days: float, batch_runs: int, interval_s: float,
                       stop: threading.Event) -> int:
    """A pass every ``interval_s`` (start to start) until ``stop``; how many passes ran.
    A pass that fails (database unreachable) is logged and the next runs on time."""
    passes = 0
    while not stop.is_set():
        started = time.monotonic()
        try:
            prune(engine, older_than_days=older_than_days, batch_runs=batch_runs, source="beat", stop=stop)
        except Exception as exc:
            log.warning("prune_failed", error=type(exc).__name__, detail=str(getattr(exc, "orig", exc))[:300])
        passes += 1
        stop.wait(max(0.0, interval_s - (time.monotonic() - started)))
    return passes
