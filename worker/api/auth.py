"""Who is asking: ``Authorization: Bearer <token>``, and AIDAWORK_API_TOKENS maps each
token to an owner. A missing or unknown token is a 401 with ``WWW-Authenticate: Bearer``
(``worker.api.errors``); a token sees only its owner's runs and Roots (``worker.api.deps``
gives each route its caller's owner)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Annotated

from fastapi import Depends
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from schema.wire.errors import ErrorCode
from worker.api.errors import ApiError


def token_digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


class TokenTable:
    """Tokens are kept only as SHA-256 digests: looking one up compares digests, not the
    secret, so lookup time says nothing useful about a guessed token."""

    def __init__(self, owners: Mapping[str, str]) -> None:
        self._owners = {token_digest(token): owner for token, owner in owners.items()}

    def owner_of(self, token: str) -> str | None:
        return self._owners.get(token_digest(token))

    def __len__(self) -> int:
        return len(self._owners)


bearer = HTTPBearer(auto_error=False, description="a token from AIDAWORK_API_TOKENS")
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]


def authenticate(tokens: TokenTable, credentials: HTTPAuthorizationCredentials | None) -> str:
    """The owner of the request's bearer token, or a 401 ``ApiError``."""
    if credentials is None:
        raise ApiError(401, ErrorCode.UNAUTHENTICATED, "send Authorization: Bearer <token>", "Authorization")
    owner = tokens.owner_of(credentials.credentials)
    if owner is None:
        raise ApiError(401, ErrorCode.UNAUTHENTICATED, "the bearer token is not valid", "Authorization")
    return owner
