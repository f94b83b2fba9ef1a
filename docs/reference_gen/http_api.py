"""Reference of the HTTP API, rendered from the OpenAPI document the API serves
(``worker.api.openapi.document``), built from an app whose store is never reached, with
default settings: no database or broker is needed at build time."""

from __future__ import annotations

import json
from typing import Any

from reference_gen import cell, code, header, table

METHODS = ("get", "post", "put", "patch", "delete")


def document() -> dict[str, Any]:
    """The document ``/openapi.json`` serves, for a deployment with default settings (the
    environment of the build is ignored) and the plugins installed where the site is built."""
    from worker.api import create_app
    from worker.ops.settings import Settings

    class Defaults(Settings):
        @classmethod
        def settings_customise_sources(  # type: ignore[override]
            cls, settings_cls: Any, init_settings: Any, **sources: Any
        ) -> Any:
            return (init_settings,)  # the defaults and nothing else: not this machine's environment

    def no_store() -> Any:
        raise RuntimeError("building the OpenAPI document reached the store")

    return create_app(Defaults(), no_store).openapi()


def _ref_name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def _link(name: str) -> str:
    return f"[`{name}`](#{name.lower()})"


def schema_type(schema: dict[str, Any]) -> str:
    """A JSON schema as a short type: a component's name (linked), ``array of X``, unions."""
    if "$ref" in schema:
        return _link(_ref_name(schema["$ref"]))
    for union in ("anyOf", "oneOf"):
        if union in schema:
            return " \\| ".join(schema_type(s) for s in schema[union])
    if "const" in schema:
        return code(json.dumps(schema["const"]))
    if "enum" in schema:
        return "one of " + ", ".join(code(json.dumps(v)) for v in schema["enum"])
    kind = schema.get("type")
    if kind == "array":
        return f"array of {schema_type(schema.get('items', {}))}"
    if isinstance(kind, list):
        return " \\| ".join(kind)
    if kind == "object" and "additionalProperties" in schema and isinstance(schema["additionalProperties"], dict):
        return f"object of {schema_type(schema['additionalProperties'])}"
    return kind or "any"


def _body_schema(content: dict[str, Any]) -> str:
    found = []
    for media, value in content.items():
        schema = value.get("schema", {})
        found.append(f"{schema_type(schema) if schema else 'any'} ({code(media)})")
    return ", ".join(found)


def _operation(path: str, method: str, op: dict[str, Any]) -> str:
    text = f"### {method.upper()} `{path}`\n\n"
    if op.get("summary"):
        text += f"{op['summary']}.\n\n"
    if op.get("description"):
        text += f"{op['description'].strip()}\n\n"
    params = op.get("parameters", [])
    if params:
        text += "Parameters:\n\n" + table(
            ["name", "in", "required", "type", "meaning"],
            [[code(p["name"]), p["in"], "yes" if p.get("required") else "no", schema_type(p.get("schema", {})),
              cell(p.get("description", ""))] for p in params],
        ) + "\n"
    body = op.get("requestBody")
    if body:
        required = "required" if body.get("required") else "optional"
        text += f"Request body ({required}): {_body_schema(body.get('content', {}))}\n\n"
    responses = sorted(op.get("responses", {}).items())
    text += "Responses:\n\n" + table(
        ["status", "meaning", "body"],
        [[code(status), cell(answer.get("description", "")), _body_schema(answer.get("content", {}))]
         for status, answer in responses],
    ) + "\n"
    return text


def _schema(name: str, schema: dict[str, Any]) -> str:
    text = f"### {name}\n\n"
    if schema.get("description"):
        text += cell(schema["description"]) + "\n\n"
    properties = schema.get("properties")
    if properties:
        required = set(schema.get("required", []))
        text += table(
            ["field", "type", "required", "meaning"],
            [[code(field), schema_type(value), "yes" if field in required else "no",
              cell(value.get("description", ""))] for field, value in properties.items()],
        ) + "\n"
    elif "properties" not in schema:
        text += f"{schema_type(schema)}\n\n"
    return text


def page(doc: dict[str, Any]) -> str:
    info = doc.get("info", {})
    text = header(
        "HTTP API",
        "the API's OpenAPI document (`worker.api.openapi.document`)",
        f"{info.get('title', '')} {info.get('version', '')}: {info.get('summary', '')} The raw document is "
        "[openapi.json](openapi.json): what `/openapi.json` serves for a deployment with default settings and the "
        "plugins installed where this site was built (the tools, providers and base URLs it allows depend on them). "
        "Every `/v1` request sends `Authorization: Bearer <token>`; every error answer has the body "
        f"{_link('ErrorBody')} (see [error codes](errors.md)).",
    )
    text += "## Operations\n\n"
    for path, item in doc.get("paths", {}).items():
        for method in METHODS:
            if method in item:
                text += _operation(path, method, item[method])
    text += "## Schemas\n\n"
    for name, schema in sorted(doc.get("components", {}).get("schemas", {}).items()):
        text += _schema(name, schema)
    return text
