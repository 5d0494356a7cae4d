"""The one base class every wire message derives from.

Inbound messages forbid unknown fields so a typo in a client is an
`invalid_message` with a location, not a silently ignored field. Models are
frozen: once parsed at the edge, a message is a value that nobody mutates.
"""

from typing import Annotated, Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

PROTOCOL_VERSION = 1
SUBPROTOCOL = "cowrite.v1"

DOCUMENT_ID_PATTERN = r"^[A-Za-z0-9._:-]{1,128}$"
TOOL_NAME_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"

MessageId = Annotated[str, StringConstraints(max_length=64)]
Identifier = Annotated[str, StringConstraints(min_length=1, max_length=128)]
THREAD_ID_PATTERN = r"^[A-Za-z0-9._:-]{1,64}$"
ThreadId = Annotated[str, StringConstraints(pattern=THREAD_ID_PATTERN)]
WorkflowName = Annotated[str, StringConstraints(pattern=THREAD_ID_PATTERN)]
DEFAULT_THREAD = "main"
ToolName = Annotated[str, StringConstraints(pattern=TOOL_NAME_PATTERN)]
JsonObject = dict[str, Any]
VERSION_MAX_CHARS = 128
# A document version a client sends: logged with every `document.changed` and every
# `tool.call`, so a string is bounded (a 500 KB one per edit filled a document's log
# with 10,000 of them: gigabytes in memory or Redis).
DocumentVersion = int | Annotated[str, StringConstraints(max_length=VERSION_MAX_CHARS)]
NOTE_MAX_CHARS = 2000
Note = Annotated[str, StringConstraints(max_length=NOTE_MAX_CHARS)]
"""Free text from a client for the model or the logs (a summary, a reason)."""


class WireModel(BaseModel):
    """Base of every wire model.

    A string literal right under a field is that field's description
    (`use_attribute_docstrings`): it lands in schema.json, the generated
    TypeScript declarations and the tables of docs/protocol.md, while the
    field's own line stays a plain annotation.
    """

    model_config = ConfigDict(
        frozen=True, extra="forbid", populate_by_name=True, use_attribute_docstrings=True
    )

    def to_wire(self) -> dict[str, Any]:
        """The JSON object sent on the wire: None fields are omitted.

        `model_dump`'s own work, called without its Python wrapper (a third of
        the cost for a small event, and every logged event is dumped once)."""
        wire: dict[str, Any] = self.__pydantic_serializer__.to_python(
            self, mode="json", exclude_none=True, by_alias=True)
        return wire

    def to_json(self) -> bytes:
        return orjson.dumps(self.to_wire())


NonNegativeInt = Annotated[int, Field(ge=0)]
MAX_OFFSET = 2**53 - 1
"""The largest document offset accepted: the largest integer a JavaScript number holds
exactly (`server.agent.scope.MAX_OFFSET`). Each offset of a scope or a change is
bounded; their sums are the scope arithmetic's concern."""
Offset = Annotated[int, Field(ge=0, le=MAX_OFFSET)]
