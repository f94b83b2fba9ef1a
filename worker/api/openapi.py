"""The OpenAPI document of the HTTP API (``/openapi.json``), so that it states what the
server enforces and nothing else: a client generated from it, or schemathesis, builds
requests the API accepts, and the API refuses what it calls invalid.

- ``config`` of a run request is ``TurnConfig`` (``runtime.config``): ``model`` is a
  union tagged by ``provider``, closed over the providers this process validates: the
  built-ins and those of the plugins it loaded (``AIDAWORK_PLUGINS`` and entry points,
  ``runtime.plugins``). A provider the API process has not loaded is refused at submit,
  so the document does not allow it either.
- What depends on the deployment is stated from this process's settings: the tool names
  (built-in and plugin tools; with ``AIDAWORK_MCP_SERVERS`` any name matching the tool
  name pattern, as MCP tools are listed at run time), each tool's args in a scripted
  turn, the base URLs a provider may call (the official one and
  ``AIDAWORK_MODEL_BASE_URLS``) and the key references every owner may use (``default``
  and the ``AIDAWORK_MODEL_KEYS`` names bound to ``"*"``; a key bound to owners is not
  named in this unauthenticated document, though its owners may use it).
- Every error answer of each operation, as it occurs (``ANSWERS``), with the error body
  of ``worker.api.errors``; FastAPI's own validation-error schemas are dropped, since
  the API never sends them.

- No string of a request body, object key or value, nested or not, holds a NUL
  character (``runtime.canonical`` refuses it everywhere, since PostgreSQL cannot store
  it): every string of a body's schema has a pattern that says so, and an arbitrary JSON
  value is ``JsonValue``, which says it at every level.
- ``owner``, when sent, is the token's own: another is refused with a documented 403
  (OWNER_MISMATCH), an answer to a well-formed request, not a 422.

Rules no JSON Schema can tie together are in the descriptions: a scripted tool call names
a tool enabled in ``tools`` or ``client_tools``; client tool names are distinct;
``root_id`` is a Root of the token's owner; the ``Idempotency-Key`` header and the body's
``idempotency_key``, both sent, are equal.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Mapping
from importlib.metadata import version
from urllib.parse import urlsplit

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from runtime.canonical import MAX_JSON_DEPTH
from runtime.config import DEFAULT_KEY_REF, TOOL_NAME_PATTERN, turn_config_with
from runtime.models.keys import ANY_OWNER, OFFICIAL_BASE_URLS
from runtime.plugins import process_plugins
from runtime.tools import BUILTIN_TOOLS, Tool
from schema.wire.json import JsonObject, JsonValue
from worker.api.errors import ErrorBody
from worker.ops.settings import Settings

REF = "#/components/schemas/{model}"

# Which error answers an operation can give, and why. The first four can answer any
# /v1 request (the token is checked first; the body limit is a middleware; a crash or an
# unreachable database can happen anywhere); the rest by what the operation has.
ANSWERS_OF_EVERY_OPERATION: Mapping[int, str] = {
    401: "missing or invalid bearer token (UNAUTHENTICATED, with WWW-Authenticate: Bearer)",
    413: "the body is larger than AIDAWORK_API_MAX_BODY_BYTES (BODY_TOO_LARGE)",
    500: "an internal error (INTERNAL_ERROR, logged as request_crashed)",
    503: "a dependency is unavailable (DATABASE_UNAVAILABLE, TOOLSET_UNAVAILABLE, ...); retry later. Beyond "
    "AIDAWORK_API_MAX_CONNECTIONS, uvicorn answers 503 in plain text and closes the connection",
}
ANSWERS_OF_A_BODY: Mapping[int, str] = {
    400: "the body is not UTF-8 JSON (BODY_INVALID)",
    408: "the body arrived too slowly (BODY_TIMEOUT; the connection is closed)",
}
ANSWER_OF_A_PARAMETER = (422, "an invalid field or parameter, named in error.field (REQUEST_INVALID, ...)")
ANSWER_OF_A_PATH_ID = (404, "no such run or Root for this token's owner (RUN_NOT_FOUND, ROOT_NOT_FOUND)")


def install(app: FastAPI, settings: Settings) -> None:
    """Serve ``document(app, settings)`` as the app's OpenAPI document (built once)."""
    built: JsonObject = {}

    def openapi() -> JsonObject:
        if not built:
            built.update(document(app, settings))
        return built

    app.openapi = openapi  # type: ignore[method-assign]


def document(app: FastAPI, settings: Settings) -> JsonObject:
    spec = get_openapi(
        title=app.title,
        version=version("aidawork"),
        summary=app.summary,
        description=app.description,
        routes=app.routes,
    )
    schemas = spec.setdefault("components", {}).setdefault("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    error_body = ErrorBody.model_json_schema(ref_template=REF)
    schemas.update({**error_body.pop("$defs", {}), "ErrorBody": error_body})
    _add_turn_config(schemas, settings)
    _add_webhook(schemas, settings)
    for path, item in spec.get("paths", {}).items():
        for operation in item.values():
            _add_answers(path, operation)
            for parameter in operation.get("parameters", []):
                _not_null(parameter)
    _state_no_nul(spec, schemas)
    return spec


# --- no NUL in any string of a request body ----------------------------------------------------

NO_NUL = r"^[^\x00]*$"
NUL = r"\x00"
LONG_STRING_CHARS = 100_000
JSON_VALUE: JsonObject = {
    "description": f"any JSON value, with no NUL character in a string or an object key, nested at most "
    f"{MAX_JSON_DEPTH} levels deep",
    "anyOf": [
        {"type": "string", "pattern": NO_NUL},
        {"type": ["number", "boolean", "null"]},
        {"type": "array", "items": {"$ref": REF.format(model="JsonValue")}},
        {"type": "object", "propertyNames": {"pattern": NO_NUL},
         "additionalProperties": {"$ref": REF.format(model="JsonValue")}},
    ],
}
# The keywords whose value is a subschema, a list of them or a map of them: only those are
# walked, never data such as a default, an enum or an example.
_SUBSCHEMA = ("additionalProperties", "items", "not", "propertyNames", "contains", "if", "then", "else")
_SUBSCHEMAS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs")
# A schema with nothing but these says nothing of the value: any JSON value.
_ANNOTATIONS = frozenset({"title", "description", "default", "examples"})


def _at(node: JsonObject, *keys: str) -> JsonObject:
    """The object at ``node[keys[0]][keys[1]]...`` of the document (a KeyError when it
    is missing, a TypeError when it is not an object)."""
    for key in keys:
        found = node[key]
        if not isinstance(found, dict):
            raise TypeError(f"{key} is not an object in the OpenAPI document")
        node = found
    return node


def _objects(node: JsonValue) -> list[JsonObject]:
    """The objects among the values of a map of the document (the paths, their
    operations, a body's media types) or the items of a list (the parameters)."""
    members = node.values() if isinstance(node, dict) else node if isinstance(node, list) else []
    return [v for v in members if isinstance(v, dict)]


def _state_no_nul(spec: JsonObject, schemas: JsonObject) -> None:
    """Give every string of the schemas a request body uses the pattern ``NO_NUL``, every
    object schema the same for its keys, and make each arbitrary value ``JsonValue``."""
    schemas["JsonValue"] = copy.deepcopy(JSON_VALUE)
    seen = {"JsonValue"}
    todo: list[JsonValue] = [
        media.get("schema", {})
        for item in _objects(spec.get("paths", {}))
        for operation in _objects(item)
        if "requestBody" in operation
        for media in _objects(_at(operation, "requestBody").get("content", {}))
    ]
    while todo:
        node = todo.pop()
        if isinstance(node, list):
            todo.extend(node)
            continue
        if not isinstance(node, dict):  # additionalProperties: false
            continue
        ref = node.get("$ref", "")
        if isinstance(ref, str) and ref.startswith(REF.format(model="")):
            name = ref.rsplit("/", 1)[1]
            if name not in seen:
                seen.add(name)
                todo.append(schemas[name])
        _no_nul(node)
        todo.extend(node[k] for k in (*_SUBSCHEMA, *_SUBSCHEMAS) if k in node)
        todo.extend(sub for k in _SUBSCHEMA_MAPS for sub in _objects(node.get(k, {})))


def _no_nul(node: JsonObject) -> None:
    if not set(node) - _ANNOTATIONS:
        node["$ref"] = REF.format(model="JsonValue")
        return
    if node.get("additionalProperties") is True:
        node["additionalProperties"] = {"$ref": REF.format(model="JsonValue")}
    kind = node.get("type")
    if kind == "object" and node.get("additionalProperties") is not False:  # keys not all named
        node.setdefault("propertyNames", {"pattern": NO_NUL})
    if kind != "string" or {"enum", "const", "format"} & set(node):
        return
    max_length = node.get("maxLength", 0)
    if isinstance(max_length, int | float) and max_length > LONG_STRING_CHARS:
        # The same rule, in a form schemathesis can still fill to maxLength: a pattern over a
        # string that long defeats its coverage phase, which then sends no body at all.
        node.setdefault("not", {"pattern": NUL})
        return
    pattern = node.get("pattern")
    if "pattern" not in node:
        node["pattern"] = NO_NUL
    elif isinstance(pattern, str) and re.search(pattern, "\x00") is not None:  # one of its own that allows a NUL
        all_of = node.setdefault("allOf", [])
        if isinstance(all_of, list):
            all_of.append({"pattern": NO_NUL})


# --- the run request's webhook -------------------------------------------------------------

# What follows an allowed prefix: no spaces or control characters (worker.ops.webhooks.policy).
_URL_REST = r"[^\s\x00-\x1f\x7f]*"


def _add_webhook(schemas: JsonObject, settings: Settings) -> None:
    """``webhook.url`` starts with one of ``AIDAWORK_WEBHOOK_URLS`` (a prefix without a
    path ends at the host); with none set, a run may carry no webhook."""
    prefixes = settings.webhook_prefixes
    submission = _at(schemas, "RunSubmission", "properties")
    if not prefixes:
        submission["webhook"] = {"type": "null", "description": "webhooks are not enabled here (AIDAWORK_WEBHOOK_URLS)"}
        return
    starts = [re.escape(p) + (_URL_REST if urlsplit(p).path or p.endswith("/") else f"(?:[/?#]{_URL_REST})?")
              for p in prefixes]
    url = _at(schemas, "Webhook", "properties", "url")
    url["pattern"] = "^(?:" + "|".join(starts) + ")$"
    url["description"] = "under one of AIDAWORK_WEBHOOK_URLS (a prefix without a path ends at the host)"


# --- the run request's config --------------------------------------------------------------


def _add_turn_config(schemas: JsonObject, settings: Settings) -> None:
    plugins = process_plugins(settings.plugin_names)
    model = turn_config_with([p.config_model for p in plugins.providers.values()])
    config = model.model_json_schema(ref_template=REF)
    defs = config.pop("$defs", {})
    schemas.update(defs)
    schemas["TurnConfig"] = config
    config["title"] = "TurnConfig"
    _at(schemas, "RunSubmission", "properties")["config"] = {
        "$ref": REF.format(model="TurnConfig"),
        "description": "what the run asks for (runtime.config.TurnConfig); each scripted tool call names a tool "
        "enabled in tools or client_tools, and client tool names are distinct. Send config or agent, not both",
    }
    # config or agent, exactly one; overrides only with agent (runtime.prepare says the same).
    submission = _at(schemas, "RunSubmission")
    submission["oneOf"] = [
        {"required": ["config"], "not": {"anyOf": [{"required": ["agent"]}, {"required": ["overrides"]}]}},
        {"required": ["agent"], "not": {"required": ["config"]}},
    ]
    agent_config: JsonObject = {
        "$ref": REF.format(model="TurnConfig"), "description": "the agent's run config, checked as a run's"
    }
    _at(schemas, "AgentCreation", "properties")["config"] = agent_config
    update, creation = _at(schemas, "AgentUpdate", "properties"), _at(schemas, "AgentCreation", "properties")
    update.update({"config": agent_config, "description": creation["description"],
                   "overridable": creation["overridable"]})
    tools = [*BUILTIN_TOOLS, *plugins.tools]
    open_names = bool(settings.mcp_servers)  # MCP tools are named at run time
    _tool_names(config, schemas, tools, open_names)
    _scripted_calls(schemas, tools, open_names)
    for provider in ("openai", "anthropic"):
        http = _at(schemas, f"{'OpenAI' if provider == 'openai' else 'Anthropic'}ModelConfig", "properties")
        allowed: list[JsonValue] = [
            *dict.fromkeys([*OFFICIAL_BASE_URLS.get(provider, ()), *settings.model_base_urls])
        ]
        _at(http, "base_url")["enum"] = allowed
        _at(http, "base_url")["description"] = "the official endpoint or one of AIDAWORK_MODEL_BASE_URLS"
        shared = [name for name, (_, owners) in settings.named_model_keys.items() if ANY_OWNER in owners]
        http["api_key_ref"] = {
            "anyOf": [{"type": "string", "enum": [DEFAULT_KEY_REF, *shared]}, {"type": "null"}],
            "default": DEFAULT_KEY_REF,
            "description": "which configured key to send: default, a name from AIDAWORK_MODEL_KEYS (keys bound to "
            "owners are not listed here), or null for none; never a key itself",
        }


def _tool_names(config: JsonObject, schemas: JsonObject, tools: Iterable[Tool], open_names: bool) -> None:
    names: list[JsonValue] = [*sorted(t.name for t in tools)]
    listed: JsonObject = {"type": "string", "pattern": TOOL_NAME_PATTERN} if open_names else {"enum": names}
    _at(config, "properties", "tools").update({"items": listed, "uniqueItems": True})
    _at(config, "properties", "tools")["description"] = "server tools to enable, each once"
    # A client tool may not take a server tool's name.
    _at(schemas, "ClientToolSpec", "properties", "name")["not"] = {"enum": names}


def _scripted_calls(schemas: JsonObject, tools: Iterable[Tool], open_names: bool) -> None:
    """A scripted tool call: for a server tool, its args as that tool's parameters say;
    any other name is a client tool's (its args are checked against that tool's schema)."""
    server = sorted(tools, key=lambda t: t.name)
    variants: list[JsonValue] = [
        {
            "type": "object",
            # A copy: the document is changed after (worker.api.openapi._state_no_nul).
            "properties": {"name": {"const": t.name}, "args": copy.deepcopy(t.parameters)},
            # args default to {}, which a tool with required args refuses
            "required": ["name", "args"] if t.parameters.get("required") else ["name"],
            "additionalProperties": False,
        }
        for t in server
    ]
    client_name: JsonObject = {"type": "string", "pattern": TOOL_NAME_PATTERN}
    if not open_names:
        client_name["not"] = {"enum": [t.name for t in server]}
    variants.append(
        {
            "type": "object",
            "properties": {"name": client_name, "args": {"type": "object"}},
            "required": ["name"],
            "additionalProperties": False,
        }
    )
    call = _at(schemas, "ScriptedToolCall")
    call["anyOf"] = variants
    call["description"] = "a call of an enabled tool: its args valid for that tool's parameters"


def _not_null(parameter: JsonObject) -> None:
    """An optional header or query parameter is absent or a string, never null: FastAPI
    writes ``anyOf: [..., {"type": "null"}]`` for ``str | None``, which would have a
    client send the text ``null``."""
    schema = parameter.get("schema", {})
    any_of = schema.get("anyOf", []) if isinstance(schema, dict) else []
    if not isinstance(schema, dict) or not isinstance(any_of, list):
        return
    options = [o for o in any_of if o != {"type": "null"}]
    if len(options) == 1 and len(options) < len(any_of) and isinstance(options[0], dict):
        del schema["anyOf"]
        schema.update(options[0])


# --- the error answers ------------------------------------------------------------------------


def _add_answers(path: str, operation: JsonObject) -> None:
    if not path.startswith("/v1/"):
        return
    responses = operation.setdefault("responses", {})
    if not isinstance(responses, dict):
        raise TypeError(f"{path}: responses is not an object in the OpenAPI document")
    answers = dict(ANSWERS_OF_EVERY_OPERATION)
    if "requestBody" in operation:
        answers.update(ANSWERS_OF_A_BODY)
    if "requestBody" in operation or operation.get("parameters"):
        answers[ANSWER_OF_A_PARAMETER[0]] = ANSWER_OF_A_PARAMETER[1]
    if any(p.get("in") == "path" for p in _objects(operation.get("parameters", []))):
        answers[ANSWER_OF_A_PATH_ID[0]] = ANSWER_OF_A_PATH_ID[1]
    error: JsonObject = {"application/json": {"schema": {"$ref": REF.format(model="ErrorBody")}}}
    for status, why in answers.items():  # replacing FastAPI's 422 (never sent)
        responses[str(status)] = {"description": why, "content": error}
