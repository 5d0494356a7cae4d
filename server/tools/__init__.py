"""Server tool sources: built-ins, Python tools by import string, MCP servers.

Tool authors import `ToolContext` and `ToolError` from here; this module stays
light (no MCP SDK import) so tool modules load fast. The run engine uses
`server.tools.catalog.ToolCatalog`, built by `server.tools.factory.build_catalog`.
"""

from server.tools.context import ToolContext, ToolError

__all__ = ["ToolContext", "ToolError"]
