"""What a server tool gets from cowrite, and how it tells the model that it failed.

These two names are the whole API a tool module needs to import; they carry
no I/O and no dependency on the run engine, so tool modules stay importable
(and testable) on their own.
"""

import logging
from dataclasses import dataclass


@dataclass(frozen=True)
class ToolContext:
    """Who is calling: injected into a tool parameter annotated `ToolContext`.

    It is never part of the tool's JSON Schema, so the model can neither see
    nor forge it. `logger` already carries the run, document and user ids.
    """

    run_id: str
    document_id: str
    user_id: str
    logger: logging.LoggerAdapter[logging.Logger]


class ToolError(Exception):
    """Raise it with a message meant for the model.

    The message is given to the model (and shown in `tool.done.error`)
    verbatim; any other exception is hidden behind "tool failed (ref ...)".
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ToolUnavailable(Exception):
    """The tool's source cannot run it right now (e.g. its MCP server is down).

    Raised by sources, not by tool authors; the message is safe for the model.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
