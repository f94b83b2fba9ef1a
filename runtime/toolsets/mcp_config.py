"""The shapes of ``AIDAWORK_MCP_SERVERS``: a JSON object of named servers, each either a
subprocess spoken to over stdio (``{"command", "args", "env"}``) or a streamable-HTTP
endpoint (``{"url", "headers"}``), with optional per-tool ``effects`` and a call
``timeout_s``. Pure and light (no MCP SDK): ``worker.ops.settings`` parses with it."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator

from runtime.config import check_base_url

SERVER_NAME_PATTERN = r"^[A-Za-z0-9_-]{1,32}$"
DEFAULT_TIMEOUT_S = 60.0

EffectName = Literal["read_only", "idempotent", "at_most_once"]


class _ServerConfig(BaseModel):
    # hide_input_in_errors: env values and headers are credentials; never echo them.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, hide_input_in_errors=True)

    # The operator's word on what running a tool twice does, by the server's tool name;
    # it overrides the server's annotations.
    effects: dict[str, EffectName] = Field(default_factory=dict)
    # A call's time budget: the tool's timeout (and so its deadline, ``ctx.remaining_s()``).
    timeout_s: float = Field(default=DEFAULT_TIMEOUT_S, gt=0, le=3600)


class StdioServer(_ServerConfig):
    """A server run as this process's subprocess, spoken to over its stdin and stdout.
    ``env`` is added to a minimal inherited environment (``PATH``, ``HOME``, ...)."""

    command: str = Field(min_length=1, max_length=4096)
    args: list[str] = Field(default_factory=list, max_length=256)
    env: dict[str, SecretStr] = Field(default_factory=dict)

    @property
    def kind(self) -> Literal["stdio"]:
        return "stdio"


class HttpServer(_ServerConfig):
    """A streamable-HTTP server. ``headers`` (say ``Authorization``) go with every request;
    the URL is checked like a model base URL, so a credential never rides in it."""

    url: str = Field(max_length=2048)
    headers: dict[str, SecretStr] = Field(default_factory=dict)

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        return check_base_url(value, "url")

    @property
    def kind(self) -> Literal["http"]:
        return "http"


McpServerConfig = StdioServer | HttpServer


def parse_mcp_servers(data: object) -> dict[str, McpServerConfig]:
    """``{name: server}`` from the parsed JSON of ``AIDAWORK_MCP_SERVERS``, or a
    ``ValueError`` naming the server and the field (never a value)."""
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ValueError('expected a JSON object {"name": {"command": ...} or {"url": ...}}')
    servers: dict[str, McpServerConfig] = {}
    for name, raw in data.items():
        if not isinstance(name, str) or not re.fullmatch(SERVER_NAME_PATTERN, name):
            raise ValueError(f"server names match {SERVER_NAME_PATTERN} (got {str(name)[:40]!r})")
        servers[name] = _parse_server(name, raw)
    return servers


def _parse_server(name: str, raw: object) -> McpServerConfig:
    if isinstance(raw, StdioServer | HttpServer):
        return raw
    if not isinstance(raw, Mapping):
        raise ValueError(f"server {name!r}: expected an object with 'command' (stdio) or 'url' (streamable HTTP)")
    if ("command" in raw) == ("url" in raw):
        raise ValueError(f"server {name!r}: give exactly one of 'command' (stdio) or 'url' (streamable HTTP)")
    model: type[StdioServer | HttpServer] = StdioServer if "command" in raw else HttpServer
    try:
        return model.model_validate(dict(raw))
    except ValidationError as exc:
        err = exc.errors()[0]
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err["loc"]).lstrip(".")
        message = str(err["msg"]).removeprefix("Value error, ")
        if where and not message.startswith(where):
            message = f"{where}: {message}"
        raise ValueError(f"server {name!r}: {message}") from None


def secret_values(values: Mapping[str, SecretStr]) -> dict[str, str]:
    return {k: v.get_secret_value() for k, v in values.items()}
