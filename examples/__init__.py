"""Examples for operators: a tools module, an MCP server and a cowrite.toml using both."""
