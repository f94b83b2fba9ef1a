"""A saved agent's A2A agent card: its name, description and version, one skill per
tool (``config.tools`` and ``config.client_tools``), streaming and push notifications,
and the bearer scheme of the API's tokens. Pure: the route gives the agent, the URL of its
JSON-RPC endpoint and the descriptions of this process's tools."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from a2a.types.a2a_pb2 import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    HTTPAuthSecurityScheme,
    SecurityRequirement,
    SecurityScheme,
    StringList,
)
from a2a.utils.constants import PROTOCOL_VERSION_0_3, PROTOCOL_VERSION_1_0, TransportProtocol

from schema.wire.agents import AgentView

BEARER = "bearer"
MODES = ["text/plain", "application/json"]  # text in and out; answers and waits as data parts


def _client_tool_skill(spec: Mapping[str, Any]) -> AgentSkill:
    name = str(spec.get("name"))
    description = str(spec.get("description") or "")
    return AgentSkill(
        id=name, name=name, tags=["client_tool"],
        description=f"{description} (runs on the client: the task waits for its result as input-required)".strip(),
    )


def skills_of(agent: AgentView, describe: Callable[[str], str]) -> list[AgentSkill]:
    """One skill per tool of the agent's config; an agent with none is one skill itself."""
    listed, specs = agent.config.get("tools"), agent.config.get("client_tools")
    tools = [t for t in listed if isinstance(t, str)] if isinstance(listed, list) else []
    client_tools = [t for t in specs if isinstance(t, Mapping)] if isinstance(specs, list) else []
    skills = [AgentSkill(id=name, name=name, description=describe(name) or name, tags=["tool"]) for name in tools]
    skills += [_client_tool_skill(spec) for spec in client_tools]
    return skills or [AgentSkill(id=agent.name, name=agent.name, description=agent.description or agent.name,
                                 tags=["agent"])]


def card_of(agent: AgentView, rpc_url: str, describe: Callable[[str], str]) -> AgentCard:
    """The card; ``rpc_url`` is absolute (the client calls the interface's URL, not the
    one it fetched the card from). The same endpoint also speaks 0.3 (listed second)."""
    scheme = HTTPAuthSecurityScheme(
        scheme="Bearer", description="a token of AIDAWORK_API_TOKENS: Authorization: Bearer <token>"
    )
    jsonrpc = TransportProtocol.JSONRPC.value
    return AgentCard(
        name=agent.name,
        description=agent.description or f"the saved agent {agent.name}",
        version=str(agent.version),
        supported_interfaces=[
            AgentInterface(url=rpc_url, protocol_binding=jsonrpc, protocol_version=PROTOCOL_VERSION_1_0),
            AgentInterface(url=rpc_url, protocol_binding=jsonrpc, protocol_version=PROTOCOL_VERSION_0_3),
        ],
        capabilities=AgentCapabilities(streaming=True, push_notifications=True),
        security_schemes={BEARER: SecurityScheme(http_auth_security_scheme=scheme)},
        security_requirements=[SecurityRequirement(schemes={BEARER: StringList()})],
        default_input_modes=MODES,
        default_output_modes=MODES,
        skills=skills_of(agent, describe),
    )
