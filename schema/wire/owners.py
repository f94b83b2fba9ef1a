"""An owner's (tenant's) limits as stored (``OwnerLimits``), the change an operator asks
for (``OwnerLimitsChange``), and the error a change that cannot be stored raises.

A change names only what it changes: a field left out keeps its stored value, a field
given as ``None`` clears the limit (``max_running``; ``token_budget`` clears its
``budget_window`` with it). The table's CHECKs (migration 0013) are the last word; these
checks exist so a refusal names the field instead of a constraint."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from schema.wire.errors import AidaworkError, ErrorCode

# The owner name rules of a run request (schema.wire), repeated here: this module is
# imported by schema.wire's package, so it cannot import it back.
OWNER_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:@-]*$"
MAX_OWNER_CHARS = 128

BudgetWindow = Literal["1h", "1d", "30d"]
OnBudget = Literal["fail", "wait"]
BUDGET_WINDOWS: tuple[str, ...] = ("1h", "1d", "30d")
ON_BUDGET: tuple[str, ...] = ("fail", "wait")
MAX_WEIGHT = 1000
DEFAULT_WEIGHT = 1


class OwnerLimitsInvalid(AidaworkError):
    """A limits change that cannot be stored; ``field`` names it (``max_running``,
    ``weight``, ``token_budget``, ``budget_window``, ``on_budget``, ``owner``). Nothing
    was stored."""

    code = ErrorCode.OWNER_LIMITS_INVALID

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.reason = message


def check_owner_name(owner: str) -> str:
    """``owner`` as a run request would take it, or ``OwnerLimitsInvalid`` (field owner)."""
    if not isinstance(owner, str) or len(owner) > MAX_OWNER_CHARS or not re.match(OWNER_PATTERN, owner):
        raise OwnerLimitsInvalid("owner", "not an owner name (letters, digits and ._:@-, at most 128)")
    return owner


class OwnerLimits(BaseModel):
    """One owner's limits and the slots its runs hold now (``running``). An owner that
    was never given limits shows the defaults: no cap, weight 1, no budget."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    owner: str
    max_running: int | None = None
    weight: int = DEFAULT_WEIGHT
    token_budget: int | None = None
    budget_window: BudgetWindow | None = None
    on_budget: OnBudget = "fail"
    running: int = 0
    stored: bool = False  # False: no row; the owner runs without limits
    created_at: datetime | None = None
    updated_at: datetime | None = None


class OwnerLimitsChange(BaseModel):
    """What ``set`` changes: only the fields given (``model_fields_set``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_running: int | None = Field(default=None, ge=1)
    weight: int = Field(default=DEFAULT_WEIGHT, ge=1, le=MAX_WEIGHT)
    token_budget: int | None = Field(default=None, ge=1)
    budget_window: BudgetWindow | None = None
    on_budget: OnBudget = "fail"

    @classmethod
    def of(cls, **given: object) -> OwnerLimitsChange:
        """Validate ``given`` (only the fields to change), or raise ``OwnerLimitsInvalid``
        naming the first bad field."""
        try:
            change = cls.model_validate(given)
        except ValidationError as exc:
            err = exc.errors()[0]
            field = str(err["loc"][0]) if err["loc"] else "limits"
            raise OwnerLimitsInvalid(field, err["msg"]) from None
        change.check()
        return change

    def given(self) -> dict[str, object]:
        return {name: getattr(self, name) for name in sorted(self.model_fields_set)}

    def check(self) -> None:
        """The rules that need no stored row: a budget and its window go together (a
        cleared budget clears its window; a window alone cannot be cleared)."""
        fields = self.model_fields_set
        if "budget_window" in fields and self.budget_window is None and "token_budget" not in fields:
            raise OwnerLimitsInvalid("budget_window", "cannot be cleared alone: clear token_budget (its window goes)")
        if "token_budget" in fields and self.token_budget is None and self.budget_window is not None:
            raise OwnerLimitsInvalid("budget_window", "a cleared token_budget takes no window")
        # A budget given without a window needs a stored one: checked against the row
        # (schema.store.limits).
