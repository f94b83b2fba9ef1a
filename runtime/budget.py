"""Spend budgets, the core's part: how many tokens a model call is estimated to cost
before it is made, and the errors a round raises when its owner's budget cannot take it.

The store reserves the estimate against the owner's budget for the current window in the
statement that writes the call's ledger row, and settles the real usage in the statement
that records the call's outcome (``schema.store.budgets``). The estimate is an upper
bound in the common case: the output part is the call's output limit, which the provider
never exceeds; the input part is the deterministic ``Message.token_count`` rule (one
token per 4 characters of the canonical body), plus the system prompt and tool specs by
the same rule. A provider whose tokenizer counts more than that makes the real usage
exceed the estimate; the settlement then records the real figure.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from runtime.canonical import canonical_json
from runtime.errors import AidaworkError, ModelError
from runtime.models.base import ModelRequest
from schema.wire.errors import ErrorCode
from schema.wire.json import JsonObject

OWNER_BUDGET_EXCEEDED = ErrorCode.OWNER_BUDGET_EXCEEDED
# The scripted model has no output limit: its calls are estimated at this many output
# tokens (its answers are short; the real usage is settled after the call either way).
SCRIPTED_OUTPUT_ESTIMATE_TOKENS = 256
# A provider config that sets no output limit (OpenAI-compatible without max_tokens):
# the model may write up to its own maximum, which we do not know; this is the estimate.
UNLIMITED_OUTPUT_ESTIMATE_TOKENS = 4096


def _chars_to_tokens(chars: int) -> int:
    return (chars + 3) // 4


def estimate_input_tokens(request: ModelRequest) -> int:
    """The request's input by ``Message.token_count``, plus the system prompt and the
    tool specs by the same 4-characters rule (the scripted model counts the first two)."""
    tools = _chars_to_tokens(len(canonical_json(list(request.tools)))) if request.tools else 0
    return request.message_tokens() + _chars_to_tokens(len(request.system)) + tools


def max_output_tokens(model_config: object) -> int:
    """The most a call under this model config can write: its output limit, or a
    documented default for a config without one (the scripted model, an OpenAI-compatible
    config with no ``max_tokens``)."""
    if getattr(model_config, "provider", None) == "scripted":
        return SCRIPTED_OUTPUT_ESTIMATE_TOKENS
    output_limit = getattr(model_config, "output_limit", None)
    if callable(output_limit):
        limit = output_limit()
        return int(limit[1]) if limit is not None else UNLIMITED_OUTPUT_ESTIMATE_TOKENS
    max_tokens = getattr(model_config, "max_tokens", None)
    return int(max_tokens) if isinstance(max_tokens, int) and max_tokens > 0 else UNLIMITED_OUTPUT_ESTIMATE_TOKENS


def estimate_call_tokens(request: ModelRequest, output_tokens: int) -> int:
    """What a call is reserved for: its input estimate plus its output limit."""
    return estimate_input_tokens(request) + output_tokens


@dataclass(frozen=True)
class BudgetShortfall:
    """Why a reservation was refused: the owner's budget for the window that ends at
    ``window_ends_at`` had ``used`` + ``reserved`` tokens taken, too many for ``estimate``."""

    on_budget: str  # 'fail' | 'wait'
    budget_window: str
    window_start: datetime
    window_ends_at: datetime
    token_budget: int
    used: int
    reserved: int
    estimate: int

    def describe(self) -> str:
        return (
            f"the owner's token budget of {self.token_budget} for the {self.budget_window} window ending "
            f"{self.window_ends_at.isoformat()} has {self.used} used and {self.reserved} reserved; "
            f"the next model call is estimated at {self.estimate}"
        )

    def to_json(self) -> JsonObject:
        return {
            "budget_window": self.budget_window,
            "window_start": self.window_start.isoformat(),
            "window_ends_at": self.window_ends_at.isoformat(),
            "token_budget": self.token_budget,
            "used": self.used,
            "reserved": self.reserved,
            "estimate": self.estimate,
        }


class OwnerBudgetExceeded(ModelError):
    """Raised before a model call (the call is not made) when the owner's budget for the
    window cannot take its estimate and the owner's ``on_budget`` is ``fail``: the run
    fails with this code. Retrying the same call in the same window cannot help."""

    code = OWNER_BUDGET_EXCEEDED

    def __init__(self, shortfall: BudgetShortfall) -> None:
        super().__init__(shortfall.describe())
        self.shortfall = shortfall


class BudgetWaitRequired(AidaworkError):
    """Raised before a model call (not made) when the owner's budget cannot take its
    estimate and ``on_budget`` is ``wait``: the round stores nothing and the worker parks
    the run (suspended, waiting for kind ``budget``) until the window rolls over or the
    budget is raised. Not a ``ModelError``: the round did not end, so the loop passes it on."""

    code = ErrorCode.OWNER_BUDGET_WAIT
    retryable = True

    def __init__(self, shortfall: BudgetShortfall) -> None:
        super().__init__(shortfall.describe())
        self.shortfall = shortfall
