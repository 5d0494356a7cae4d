"""Example MCP server written with the official `mcp` SDK (see `examples/cowrite.toml`).

Over stdio (cowrite starts it): `python -m examples.mcp_server`.
Over streamable HTTP (you start it): `python -m examples.mcp_server --http 9000`,
then point `url = "http://127.0.0.1:9000/mcp"` at it.
"""

import argparse
import re

from mcp.server.mcpserver import MCPServer

mcp = MCPServer("notes")

_NOTES: dict[str, str] = {"style": "Prefer short sentences. Use the active voice."}


@mcp.tool()
async def read_note(name: str) -> str:
    """Read a shared note by name (e.g. "style")."""
    return _NOTES.get(name, f"no note named {name!r}")


@mcp.tool()
async def list_notes() -> list[str]:
    """The names of the shared notes."""
    return sorted(_NOTES)


@mcp.tool()
async def count_words(text: str) -> dict[str, int]:
    """Count the words of a text, and how many are longer than 12 letters."""
    words = re.findall(r"[\w'-]+", text)
    return {"words": len(words), "long_words": sum(len(w) > 12 for w in words)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--http", type=int, metavar="PORT", help="serve streamable HTTP")
    args = parser.parse_args()
    if args.http is None:
        mcp.run("stdio")
        return
    import uvicorn

    uvicorn.run(mcp.streamable_http_app(), host="127.0.0.1", port=args.http)


if __name__ == "__main__":
    main()
