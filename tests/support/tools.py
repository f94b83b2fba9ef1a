"""Calling a tool directly in a test: a ``ToolContext`` of a made-up call."""

from __future__ import annotations

import time
from typing import Any
from uuid import UUID

from runtime.tools import NO_INPUTS, ToolContext, ToolInputs

RUN_ID = UUID("00000000-0000-4000-8000-000000000001")


def tool_context(call_id: str = "call_0_0", *, inputs: ToolInputs = NO_INPUTS, **fields: Any) -> ToolContext:
    values: dict[str, Any] = {
        "run_id": RUN_ID,
        "boundary_seq": 0,
        "tool_call_id": call_id,
        "attempt": 1,
        "owner": "team-a",
        "idempotency_key": f"key-{call_id}",
        "deadline": time.time() + 60,
        "inputs": inputs,
    }
    return ToolContext(**{**values, **fields})
