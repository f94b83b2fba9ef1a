"""A tool's output is stored once, in its ``tool_invocations`` row. The tool message of
the conversation and the ``tool_completed`` event are stored without it and get it back
here, in SQL, when they are read: the context a claim returns, a rebuild's sources, and
the event log (so ``aidawork status``, ``watch`` and the SSE stream still show the full
raw output)."""

from __future__ import annotations

from schema.wire.json import JsonMapping, JsonObject

# The stored row's ``result`` joined back into a JSON object (``{}`` when there is none).
_RESULT_OF = """coalesce((SELECT jsonb_build_object('result', ti.result) FROM tool_invocations AS ti
     WHERE ti.run_id = {alias}.run_id AND ti.tool_call_id = {alias}.{data}->>'tool_call_id'
       AND ti.result IS NOT NULL AND jsonb_typeof(ti.result) <> 'null'), CAST('{{}}' AS jsonb))"""


def message_body_sql(alias: str = "m") -> str:
    """A ``messages`` row's body as the conversation has it."""
    result = _RESULT_OF.format(alias=alias, data="body")
    return f"(CASE WHEN {alias}.role = 'tool' THEN {alias}.body || {result} ELSE {alias}.body END)"


def event_data_sql(alias: str = "e") -> str:
    """A ``run_events`` row's data as it was emitted."""
    result = _RESULT_OF.format(alias=alias, data="data")
    return f"(CASE WHEN {alias}.kind = 'tool_completed' THEN {alias}.data || {result} ELSE {alias}.data END)"


def without_result(body: JsonMapping) -> JsonObject:
    """A tool message body or ``tool_completed`` event data, as stored."""
    return {k: v for k, v in body.items() if k != "result"}
