"""`build_catalog(settings)`: the tool catalog of one app, from COWRITE_* settings."""

from server.settings import Settings
from server.tools.catalog import ToolCatalog
from server.tools.config import CowriteConfig, load_config
from server.tools.mcp_source import McpTimings


def build_catalog(settings: Settings) -> ToolCatalog:
    """Read COWRITE_CONFIG (raising ConfigError when it is invalid) and load the tools.

    Importing Python tools happens here, at app creation; connecting MCP
    servers happens in `ToolCatalog.start()`, in the app's lifespan.
    """
    config = load_config(settings.config) if settings.config is not None else CowriteConfig()
    timings = McpTimings(
        connect_timeout_s=settings.mcp_connect_timeout_s,
        retry_min_s=settings.mcp_retry_min_s,
        retry_max_s=settings.mcp_retry_max_s,
        poll_s=settings.mcp_poll_s,
    )
    return ToolCatalog(config, default_timeout_s=settings.server_tool_timeout_s,
                       mcp_timings=timings, max_output_bytes=settings.max_message_bytes,
                       max_output_depth=settings.max_json_depth)
