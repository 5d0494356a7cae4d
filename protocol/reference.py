"""`python -m protocol.reference` regenerates the message tables in docs/protocol.md.

The prose of docs/protocol.md is written by people; the tables of fields are
not, because a hand-kept table drifts from the models the day a field is
added. Each table sits between two marker comments:

    <!-- BEGIN GENERATED: run.start -->
    ... replaced on every run ...
    <!-- END GENERATED -->

A block is named by a message's wire `type` (`hello`, `tool.call`) or by a
nested object's model name (`ToolSpec`). Everything is computed from
`build_schema()`, the same JSON Schema that schema.json and the TypeScript
declarations come from, so the three cannot disagree. Pure functions; only
`main` reads and writes.
"""

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from protocol.schema import STAMPED_FIELDS, build_schema

DOCS_PATH = Path(__file__).resolve().parent.parent / "docs" / "protocol.md"
BLOCK = re.compile(
    r"(<!-- BEGIN GENERATED: (?P<name>\S+) -->\n)(?P<body>.*?)(<!-- END GENERATED -->)",
    re.DOTALL,
)
FIX_COMMAND = "make docs"


@dataclass(frozen=True)
class Shape:
    """One table to render: a message/event or a nested object."""

    block: str  # marker name
    definition: str  # name in $defs
    direction: str  # "client", "server"


def shapes(schema: dict[str, Any]) -> list[Shape]:
    """Every message, event and nested object, in a stable reading order."""
    defs: dict[str, Any] = schema["$defs"]
    found: list[Shape] = []
    seen: set[str] = set()

    def visit(name: str, direction: str, block: str) -> None:
        if name in seen or not _is_object(defs[name]):
            return  # enums and aliases are written inline where they are used
        seen.add(name)
        found.append(Shape(block, name, direction))
        for ref in _refs(defs[name]):
            visit(ref, direction, ref)

    for direction, key in (("client", "client_message"), ("server", "server_event")):
        union = schema["properties"][key]
        for wire_type, ref in union["discriminator"]["mapping"].items():
            visit(_ref_name(ref), direction, wire_type)
    return found


def _is_object(definition: dict[str, Any]) -> bool:
    return "properties" in definition


def _ref_name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def _refs(node: Any) -> list[str]:
    """Names of the $defs a schema refers to, depth first, in order."""
    if isinstance(node, dict):
        names = [_ref_name(node["$ref"])] if "$ref" in node else []
        for value in node.values():
            names.extend(_refs(value))
        return names
    if isinstance(node, list):
        return [name for item in node for name in _refs(item)]
    return []


def anchor(heading: str) -> str:
    """GitHub's anchor for a `### heading` (lower case, punctuation dropped)."""
    slug = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return slug.replace(" ", "-")


INLINE_ENUM_MAX = 6


def render_type(node: dict[str, Any], defs: dict[str, Any] | None = None) -> str:
    """A property's JSON Schema as a short human-readable type.

    A reference to an object links to that object's table; a reference to an
    enum is written inline, or by name when it has too many values to read.
    """
    if "$ref" in node:
        name = _ref_name(node["$ref"])
        target = (defs or {}).get(name, {"properties": {}})
        if _is_object(target):
            return f"[{name}](#{anchor(name)})"
        if len(target.get("enum", [])) > INLINE_ENUM_MAX:
            return f"{target.get('type', 'string')} (`{name}`, see the description)"
        return render_type(target, defs)
    if "const" in node:
        return f"`{json.dumps(node['const'])}`"
    if "enum" in node:
        return " or ".join(f"`{json.dumps(value)}`" for value in node["enum"])
    for key in ("anyOf", "oneOf"):
        if key in node:
            parts = [render_type(part, defs) for part in node[key]
                     if part.get("type") != "null"]
            return " or ".join(parts)
    kind = str(node.get("type"))
    if kind == "string":
        return "string" + _string_limits(node)
    if kind == "integer" or kind == "number":
        limits = [f"≥ {node['minimum']}"] if "minimum" in node else []
        limits += [f"≤ {node['maximum']}"] if "maximum" in node else []
        return kind + (" " + ", ".join(limits) if limits else "")
    if kind == "boolean":
        return "boolean"
    if kind == "array":
        items = render_type(node.get("items", {}), defs)
        most = f" (at most {node['maxItems']})" if "maxItems" in node else ""
        return f"array of {items}{most}"
    if kind == "object":
        return "object"
    return "any JSON"


def _string_limits(node: dict[str, Any]) -> str:
    if "pattern" in node:
        return f" matching `{node['pattern']}`"
    low, high = node.get("minLength"), node.get("maxLength")
    if low is not None and high is not None:
        return f", {low}-{high} chars"
    if high is not None:
        return f", at most {high} chars"
    if low is not None:
        return f", at least {low} chars"
    return ""


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _ordered_fields(definition: dict[str, Any]) -> list[str]:
    """`type` first, the log's stamps (`seq`, `ts`) last, the rest as declared."""
    names = list(definition.get("properties", {}))
    stamps = [name for name in STAMPED_FIELDS if name in names]
    middle = [name for name in names if name != "type" and name not in stamps]
    return (["type"] if "type" in names else []) + middle + stamps


def render_table(definition: dict[str, Any], direction: str,
                 defs: dict[str, Any] | None = None) -> str:
    """The field table of one model: field, type, required, description."""
    properties: dict[str, Any] = definition.get("properties", {})
    required = set(definition.get("required", []))
    header = "always sent" if direction == "server" else "required"
    rows = [f"| field | type | {header} | description |", "|---|---|---|---|"]
    for name in _ordered_fields(definition):
        node = properties[name]
        if name in required:
            needed = "yes"
        elif direction == "client" and node.get("default") is not None:
            needed = f"no (default `{json.dumps(node['default'])}`)"
        else:
            needed = "no"
        description = node.get("description", "")
        if name == "type" and not description:
            description = "The message type."
        rows.append(
            f"| `{name}` | {_cell(render_type(node, defs))} | {needed} | {_cell(description)} |"
        )
    return "\n".join(rows) + "\n"


def render_blocks(schema: dict[str, Any]) -> dict[str, str]:
    """Block name -> generated Markdown, for every shape of the protocol."""
    defs = schema["$defs"]
    return {
        shape.block: render_table(defs[shape.definition], shape.direction, defs)
        for shape in shapes(schema)
    }


def block_names(text: str) -> list[str]:
    return [match.group("name") for match in BLOCK.finditer(text)]


def problems(text: str, blocks: dict[str, str]) -> list[str]:
    """What is wrong with the markers of `text`: missing, unknown or repeated blocks."""
    names = block_names(text)
    found: list[str] = []
    for name in sorted(set(blocks) - set(names)):
        found.append(f"no generated block for {name!r}: add "
                     f"'<!-- BEGIN GENERATED: {name} -->' / '<!-- END GENERATED -->'")
    for name in sorted(set(names) - set(blocks)):
        found.append(f"generated block {name!r} matches no message or object")
    for name in sorted({name for name in names if names.count(name) > 1}):
        found.append(f"generated block {name!r} appears more than once")
    return found


def splice(text: str, blocks: dict[str, str]) -> str:
    """`text` with every known block's body replaced; unknown blocks are left alone."""

    def replace(match: re.Match[str]) -> str:
        name = match.group("name")
        if name not in blocks:
            return match.group(0)
        return f"{match.group(1)}\n{blocks[name]}\n{match.group(4)}"

    return BLOCK.sub(replace, text)


def main(argv: list[str] | None = None) -> int:
    path = Path(argv[0]) if argv else DOCS_PATH
    blocks = render_blocks(build_schema())
    text = path.read_text(encoding="utf-8")
    found = problems(text, blocks)
    for problem in found:
        print(f"{path}: {problem}", file=sys.stderr)
    updated = splice(text, blocks)
    if updated != text:
        path.write_text(updated, encoding="utf-8")
        print(f"wrote {path}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
