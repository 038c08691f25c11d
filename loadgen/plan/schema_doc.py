"""The scenario's JSON Schema (for editors: ``scenarios/scenario.schema.json``) and the scenario reference
(``docs/scenario.md``) generated from it, both written by ``loadgen schema``.

Pure functions of the schema dict: ``schema_json`` is its stable text, ``schema_markdown`` the reference, one
section per model (the root first, then each model in the order it is first referenced) with a table of field,
type, default and description.
"""

from __future__ import annotations

import json
from typing import Any

from loadgen.plan.scenario import Scenario

SCHEMA_PATH = "scenarios/scenario.schema.json"
REFERENCE_PATH = "docs/scenario.md"
REGENERATE = (f"loadgen schema --out {SCHEMA_PATH} && loadgen schema --markdown --out {REFERENCE_PATH}")

_BOUNDS = (("exclusiveMinimum", ">"), ("minimum", "≥"), ("exclusiveMaximum", "<"), ("maximum", "≤"),
           ("minItems", "items ≥"), ("maxItems", "items ≤"), ("minLength", "length ≥"),
           ("maxLength", "length ≤"))


def scenario_schema() -> dict[str, Any]:
    """The scenario file's JSON Schema, as pydantic derives it from the models (validation mode)."""
    return Scenario.model_json_schema()


def schema_json(schema: dict[str, Any]) -> str:
    """The schema as stable text: keys sorted, indent 2, one trailing newline."""
    return json.dumps(schema, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def schema_markdown(schema: dict[str, Any]) -> str:
    """The scenario reference: one section per model, each a table of its fields."""
    defs: dict[str, Any] = schema.get("$defs", {})
    root = str(schema.get("title", "Scenario"))
    lines = ["# Scenario reference", "",
             f"<!-- Generated from the scenario's JSON Schema by `{REGENERATE}`; do not edit by hand. -->", "",
             "Every field a scenario file may hold, model by model, from the schema editors read "
             f"(`{SCHEMA_PATH}`; a scenario's first line `# yaml-language-server: $schema=./scenario.schema.json` "
             "points YAML editors at it). A field marked *required* has no default; unknown fields are errors; "
             "numbers must be finite. Units are in the field names (`_s` seconds, `_ms` milliseconds, "
             "`_per_s` per second) and lengths are in tokens.", ""]
    for name in _model_order(schema):
        lines += _section(name, schema if name == root else defs[name])
    return "\n".join(lines).rstrip("\n") + "\n"


def _model_order(schema: dict[str, Any]) -> list[str]:
    """The root model, then every model in $defs in the order it is first referenced (breadth first), then any
    model nothing references."""
    defs: dict[str, Any] = schema.get("$defs", {})
    order = [str(schema.get("title", "Scenario"))]
    queue: list[Any] = [schema.get("properties", {})]
    while queue:
        for ref in _refs(queue.pop(0)):
            if ref not in order and ref in defs:
                order.append(ref)
                queue.append(defs[ref].get("properties", {}))
    return order + sorted(set(defs) - set(order))


def _refs(node: Any) -> list[str]:
    """Model names referenced anywhere inside ``node``, in document order."""
    if isinstance(node, dict):
        found = [node["$ref"].rsplit("/", 1)[-1]] if isinstance(node.get("$ref"), str) else []
        for key, value in node.items():
            if key != "discriminator":
                found += _refs(value)
        return found
    if isinstance(node, list):
        return [ref for item in node for ref in _refs(item)]
    return []


def _section(name: str, model: dict[str, Any]) -> list[str]:
    out = [f"## {name}", ""]
    if model.get("description"):
        out += [_one_line(str(model["description"])), ""]
    required = set(model.get("required", []))
    out += ["| field | type | default | description |", "| --- | --- | --- | --- |"]
    for field, spec in model.get("properties", {}).items():
        out.append(f"| `{field}` | {_cell(_type(spec))} | {_cell(_default(spec, field in required))} | "
                   f"{_cell(_one_line(str(spec.get('description', ''))))} |")
    return out + [""]


def _type(spec: dict[str, Any]) -> str:
    """A field's type in words, with links to models and its bounds."""
    if "$ref" in spec:
        name = spec["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{name.lower()})"
    if "const" in spec:
        return f"`{json.dumps(spec['const'])}`"
    if "enum" in spec:
        return " or ".join(f"`{json.dumps(v)}`" for v in spec["enum"])
    if "anyOf" in spec or "oneOf" in spec:
        options = [_type(option) for option in spec.get("anyOf", spec.get("oneOf", []))]
        return " or ".join(options) + _bounds(spec)
    kind = spec.get("type")
    if kind == "array":
        if "prefixItems" in spec:
            return "[" + ", ".join(_type(item) for item in spec["prefixItems"]) + "]"
        return f"list of {_type(spec.get('items', {}))}" + _bounds(spec)
    if kind == "object":
        values = spec.get("additionalProperties")
        return f"map of string to {_type(values)}" if isinstance(values, dict) else "map"
    if kind == "string" and spec.get("format") == "path":
        return "path" + _bounds(spec)
    if kind is None:
        return "any"
    pattern = f", matching `{spec['pattern']}`" if "pattern" in spec else ""
    return str(kind) + _bounds(spec) + pattern


def _bounds(spec: dict[str, Any]) -> str:
    found = [f"{sign} {_number(spec[key])}" for key, sign in _BOUNDS if key in spec]
    return f" ({', '.join(found)})" if found else ""


def _number(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else json.dumps(value)


def _default(spec: dict[str, Any], required: bool) -> str:
    if required:
        return "*required*"
    if "default" not in spec:
        return "see its section" if "$ref" in spec else "empty"
    return f"`{json.dumps(spec['default'], ensure_ascii=False)}`"


def _one_line(text: str) -> str:
    """Prose on one line, ``<`` and ``>`` outside code spans escaped (``reports/<time>`` is not an HTML tag)."""
    parts = " ".join(text.split()).split("`")
    return "`".join(part if i % 2 else part.replace("<", "&lt;").replace(">", "&gt;")
                    for i, part in enumerate(parts))


def _cell(text: str) -> str:
    """Text safe inside a markdown table cell (a ``|`` would end the cell)."""
    return text.replace("|", "\\|")
