"""The cowrite wire contract (PROTOCOL.md, version 1) as pydantic models.

No I/O lives here, so any Python client (tests, the load generator, a third
party) can import it without pulling in the server.
"""

from protocol.base import PROTOCOL_VERSION, SUBPROTOCOL
from protocol.codes import CloseCode, ErrorCode

__all__ = ["PROTOCOL_VERSION", "SUBPROTOCOL", "CloseCode", "ErrorCode"]
