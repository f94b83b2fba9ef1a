"""What ``aidawork audit`` reports (``schema.store.audit``): each inconsistency between a run's
boundaries, fences, messages, events and model-call ledger that a check found. ``AuditReport``
is the ``--json`` output, a stable shape for scripts (docs/operations/audit.md): fields are
only ever added."""

from __future__ import annotations

from enum import StrEnum
from uuid import UUID

from pydantic import BaseModel, ConfigDict


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Severity(StrEnum):
    # The stored rows contradict what the system guarantees: something lost or wrote a row
    # it must not have (the command exits 1).
    ERROR = "error"
    # Allowed by the guarantees, but worth knowing after an incident (a holder that died
    # with a model call on the wire); the report stays clean.
    WARNING = "warning"


class AuditProblem(_Wire):
    check: str  # the check's stable code (schema.store.audit.CHECKS)
    severity: Severity
    run_id: UUID | None  # None: not about one run (an owner's counter)
    boundary_seq: int | None  # the boundary it is about (round N is boundary N - 1); None: the run as a whole
    message: str


class AuditReport(_Wire):
    """``clean`` when no check found an error (warnings allowed): the command exits 0, else 1."""

    clean: bool
    runs_checked: int
    problems: list[AuditProblem]  # by check, then run, then boundary

    @property
    def errors(self) -> int:
        return sum(p.severity is Severity.ERROR for p in self.problems)

    @property
    def warnings(self) -> int:
        return sum(p.severity is Severity.WARNING for p in self.problems)
