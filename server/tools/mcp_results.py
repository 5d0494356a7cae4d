"""How MCP tool listings and results become cowrite tools and outputs (pure, no I/O).

Names: an MCP tool `t` of server `s` is offered as `s__t` unless the config
renames it. MCP allows characters (`.`, `/`) that cowrite tool names do not;
those are replaced by `_`. A name that is still invalid (over 64 characters)
is reported unavailable rather than truncated, because a truncated name could
silently collide with another.

Results: `structuredContent` when the server sends it (the JSON object is the
output as is); otherwise the text blocks joined by newlines (a string);
otherwise, when there are non-text blocks, the list of blocks as JSON, with
the base64 `data` of images and audio, and the `blob` of embedded binary
resources, replaced by its size, since a model cannot use the bytes as text.
`isError` results raise ToolError with the text.
"""

import re
from dataclasses import dataclass
from typing import Any

import jsonschema
import mcp.types as mcp_types

from server.tools.config import TOOL_NAME_RE, McpServerConfig
from server.tools.context import ToolError
from server.tools.schemas import SchemaVerdicts, validator_class

_INVALID = re.compile(r"[^A-Za-z0-9_-]")
VERDICTS_CACHED = 4096  # distinct schemas; canonical JSON -> the problem (None: usable)
_verdicts = SchemaVerdicts(lambda schema: _judge_schema(schema), VERDICTS_CACHED)


def cowrite_name(server: str, tool: str, rename: dict[str, str]) -> str | None:
    """The cowrite name of an MCP tool, or None when no valid name can be made."""
    if tool in rename:
        return rename[tool]
    name = f"{server}__{_INVALID.sub('_', tool)}"
    return name if TOOL_NAME_RE.fullmatch(name) else None


def _block(block: Any) -> Any:
    data: dict[str, Any] = block.model_dump(mode="json", by_alias=True, exclude_none=True)
    if data.get("type") in ("image", "audio") and isinstance(data.get("data"), str):
        data["data"] = f"<{len(data['data']) * 3 // 4} bytes omitted>"
    resource = data.get("resource")
    if data.get("type") == "resource" and isinstance(resource, dict) \
            and isinstance(resource.get("blob"), str):  # an embedded binary resource
        resource["blob"] = f"<{len(resource['blob']) * 3 // 4} bytes omitted>"
    return data


def _text(result: mcp_types.CallToolResult) -> str:
    return "\n".join(b.text for b in result.content if isinstance(b, mcp_types.TextContent))


def tool_output(result: mcp_types.CallToolResult) -> Any:
    """The output the model gets for an MCP result; ToolError for `isError` results."""
    if result.is_error:
        raise ToolError(_text(result) or "the MCP tool reported an error")
    if result.structured_content is not None:
        return result.structured_content
    if all(isinstance(b, mcp_types.TextContent) for b in result.content):
        return _text(result)
    return [_block(b) for b in result.content]


def _judge_schema(schema: dict[str, Any]) -> str | None:
    if schema.get("type", "object") != "object":
        return "its input schema does not describe an object"
    try:
        validator_class(schema).check_schema(schema)
    except jsonschema.SchemaError:
        return "its input schema is not a valid JSON Schema"
    except RecursionError:  # one tool's schema, not the whole listing
        return "its input schema is nested too deeply"
    return None


def _schema_problem(schema: dict[str, Any]) -> str | None:
    """The verdict on one schema, kept per distinct schema: a server's listing is
    checked on every change."""
    return _verdicts(schema)


@dataclass(frozen=True)
class McpTool:
    """One listed MCP tool as cowrite offers it (`problem` set: listed but unavailable)."""

    name: str
    mcp_name: str
    description: str
    parameters: dict[str, Any]
    problem: str | None = None


def convert_listing(config: McpServerConfig, tools: list[mcp_types.Tool]) -> list[McpTool]:
    """The server's listing filtered by the allowlist and named for cowrite."""
    converted = []
    for tool in tools:
        if config.tools is not None and tool.name not in config.tools:
            continue
        name = cowrite_name(config.name, tool.name, config.rename)
        problem = None
        if name is None:
            name = f"{config.name}__{tool.name}"
            problem = "its name cannot be made a valid tool name; rename it in the config"
        schema = dict(tool.input_schema)
        problem = problem or _schema_problem(schema)
        converted.append(McpTool(name, tool.name, tool.description or tool.title or "", schema,
                                 problem))
    return converted


def unknown_names(config: McpServerConfig, tools: list[mcp_types.Tool]) -> list[str]:
    """The `tools` and `rename` entries that name no listed tool (typos, most likely),
    each as `'name' (key)`."""
    listed = {tool.name for tool in tools}
    unknown = [f"{name!r} (tools)" for name in config.tools or [] if name not in listed]
    return unknown + [f"{name!r} (rename)" for name in config.rename if name not in listed]


def placeholder_names(config: McpServerConfig) -> list[str]:
    """Names to report for a server never reached: its allowlist, or `<server>__*`."""
    if config.tools is None:
        return [f"{config.name}__*"]
    return [cowrite_name(config.name, t, config.rename) or f"{config.name}__{t}"
            for t in config.tools]
