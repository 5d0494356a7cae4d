"""Example Python server tools (see `examples/cowrite.toml`).

A server tool is an async function. Its docstring is the description the
model reads; its parameters' type hints become the JSON Schema (add
descriptions and limits with `Annotated[..., Field(...)]`); a parameter
annotated `ToolContext` is not shown to the model and tells the tool who is
calling. Raise `ToolError("...")` to give the model a message; any other
exception is logged and the model only sees "tool failed (ref ...)".
"""

from typing import Annotated, Literal

from pydantic import BaseModel, Field

from server.tools import ToolContext, ToolError

_GLOSSARY = {
    "websocket": "A full-duplex connection over one TCP socket, opened by an HTTP upgrade.",
    "mcp": "Model Context Protocol: a standard way to offer tools to a model.",
}


class Definition(BaseModel):
    term: str
    definition: str


async def define(
    term: Annotated[str, Field(description="The word to look up.", min_length=1, max_length=64)],
    ctx: ToolContext,
) -> Definition:
    """Look a term up in the team glossary. Use it before explaining a technical term."""
    definition = _GLOSSARY.get(term.strip().lower())
    if definition is None:
        raise ToolError(f"{term!r} is not in the glossary; known terms: {', '.join(_GLOSSARY)}")
    ctx.logger.info("glossary lookup %s for %s", term, ctx.user_id)
    return Definition(term=term, definition=definition)


async def convert_case(
    text: str,
    case: Literal["upper", "lower", "title"] = "title",
) -> str:
    """Change the letter case of a text."""
    return {"upper": text.upper(), "lower": text.lower(), "title": text.title()}[case]
