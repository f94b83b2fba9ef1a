"""What the routes are given (FastAPI dependencies): the app's state, and the owner of
the caller's token."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Annotated

from fastapi import Depends, Request

from runtime.deps import DEV_SECRET
from schema.store import owners as owner_store
from worker.api.auth import Credentials, TokenTable, authenticate
from worker.api.deltas import DeltaHub
from worker.api.stream_tokens import StreamTokens
from worker.api.streams import EventHub, StreamSlots
from worker.client.context import ClientContext
from worker.ops.redis_clients import redis_target
from worker.ops.settings import Settings


@dataclass
class ApiState:
    settings: Settings
    tokens: TokenTable
    context: Callable[[], ClientContext]
    hub: EventHub = dataclass_field(init=False)
    slots: StreamSlots = dataclass_field(init=False)
    deltas: DeltaHub = dataclass_field(init=False)
    stream_tokens: StreamTokens = dataclass_field(init=False)

    def __post_init__(self) -> None:
        # The hub's reads go through the owner-scoped store query, in a worker thread.
        self.hub = EventHub(
            lambda keys: owner_store.read_event_tails(self.context().engine, keys),
            poll_s=self.settings.api_events_poll_s,
        )
        self.slots = StreamSlots(self.settings.api_max_streams_per_token)
        # Live deltas come through the broker's Redis (pub/sub), not PostgreSQL.
        self.deltas = DeltaHub(redis_target(self.settings))
        secret = self.settings.secret_key
        self.stream_tokens = StreamTokens(
            DEV_SECRET if secret is None else secret.get_secret_value().encode(), self.settings.api_stream_token_ttl_s
        )


async def _state(request: Request) -> ApiState:
    state: ApiState = request.app.state.aidawork
    return state


# Endpoints take the context from the state only after their own checks, so a refused
# request never touches the database.
State = Annotated[ApiState, Depends(_state)]


async def _owner(state: State, credentials: Credentials) -> str:
    return authenticate(state.tokens, credentials)


Owner = Annotated[str, Depends(_owner)]
