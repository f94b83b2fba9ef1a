"""The request and response bodies of the HTTP API (``schema.wire`` has the views it
shares with the Python client): frozen, and a field nobody declared is refused."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field

from schema.wire import RootRunView


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RunSubmission(_Body):
    """A run request (see ``schema.wire.RunRequest``). ``owner`` is the token's owner: omit
    it, or send the same value; another owner is refused (422, field ``owner``)."""

    owner: str | None = None
    root_id: UUID | None = None
    input: str
    config: dict[str, Any]


class Delivery(_Body):
    tool_call_id: str = Field(min_length=1)
    files: dict[str, str] = Field(description="path -> UTF-8 text, exactly the paths the tool call asked for")


class Prerequisite(_Body):
    key: str = Field(min_length=1)
    value: Any = Field(description="any JSON value")


class SubmittedRun(_Body):
    run_id: UUID
    root_id: UUID
    root_seq: int


class DeliveryReceipt(_Body):
    stored: bool = Field(description="false: this exact input was already there; nothing changed")
    resuming: bool = Field(description="the run had all its inputs and was sent to resume")


class Cancelled(_Body):
    run_id: UUID
    cancelled: bool


class RootRuns(_Body):
    root_id: UUID
    runs: list[RootRunView]
