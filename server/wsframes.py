"""Client frames read without websockets' general parser, when that is safe.

websockets parses what a client sends with generator-based coroutines: a
header read, a length read, a mask read and a payload read per frame, each a
resumed generator, then a `Frame`, its checks, an event list, and uvicorn's
dispatch on the opcode. For the frame cowrite's clients send nearly always
(one complete, unfragmented, masked text message in one TCP read) that costs
more than the message's own JSON decoding. `text_messages` reads such a read
in a few operations; anything else (a control frame, a fragment, reserved
bits, a payload over the limit, invalid UTF-8, a frame cut across reads)
makes it answer None, and the read goes to websockets as before, which
answers it as it always has (a pong, a close 1002/1007/1009...).

Skipping the general parser is only correct while that parser waits at a
frame boundary with nothing buffered: `FrameCursor` follows the boundaries
of every byte the general parser is given, so the fast read is tried only
there. Both are pure (no I/O); `tests/test_wsframes.py` checks them against
websockets' own parser on random streams cut at random places.
"""

try:  # websockets' C unmasking, as its own parser uses it
    from websockets.speedups import apply_mask as apply_mask
except ImportError:  # pragma: no cover  (a build without the C extension)
    from websockets.utils import apply_mask as apply_mask

_FIN_TEXT = 0x81  # FIN, no reserved bits, opcode 1 (text)


def frame_header(data: bytes, position: int) -> tuple[int, int] | None:
    """The header length and payload length of the frame starting at `position`
    (RFC 6455 5.2: 7-, 16- or 64-bit length, then a 4-byte mask if masked), or
    None while `data` does not yet hold the whole header."""
    end = len(data)
    if end - position < 2:
        return None
    second = data[position + 1]
    length = second & 0x7F
    extra = 2 if length == 126 else 8 if length == 127 else 0
    header = 2 + extra + (4 if second & 0x80 else 0)
    if end - position < header:
        return None
    if extra:
        length = int.from_bytes(data[position + 2:position + 2 + extra], "big")
    return header, length


def text_messages(data: bytes, max_size: int | None) -> list[str] | None:
    """The text messages `data` holds when it is nothing but complete, final,
    masked text frames with no reserved bit set, each payload at most
    `max_size` bytes and valid UTF-8 (a client's frames, RFC 6455); otherwise
    None, having decided nothing. Frames of 64 KiB or more are left to
    websockets too: rare, and no cheaper here."""
    messages: list[str] = []
    position, end = 0, len(data)
    while position < end:
        second = data[position + 1] if end - position > 1 else 0
        if data[position] != _FIN_TEXT or not second & 0x80 or second & 0x7F == 127:
            return None  # not a final text frame, unmasked (a client must mask), or huge
        sizes = frame_header(data, position)
        if sizes is None:
            return None
        header, length = sizes
        start = position + header
        stop = start + length
        if stop > end or (max_size is not None and length > max_size):
            return None
        payload = apply_mask(data[start:stop], data[start - 4:start])
        try:
            messages.append(payload.decode())
        except UnicodeDecodeError:
            return None
        position = stop
    return messages or None


class FrameCursor:
    """Where a client's byte stream stands against its frame boundaries, from the
    headers alone: the start of a header cut across reads (`_head`), or how many
    payload bytes of the current frame are still to come (`_skip`)."""

    __slots__ = ("_head", "_skip")

    def __init__(self) -> None:
        self._head = b""
        self._skip = 0

    def at_boundary(self) -> bool:
        return not self._skip and not self._head

    def advance(self, data: bytes) -> None:
        """Account for `data`, the next bytes of the stream (given to the general parser)."""
        position = min(self._skip, len(data))
        self._skip -= position
        if self._skip:
            return
        stream = self._head + data[position:] if self._head else data
        if self._head:
            position, self._head = 0, b""
        end = len(stream)
        while position < end:
            sizes = frame_header(stream, position)
            if sizes is None:
                self._head = stream[position:]
                return
            frame_end = position + sizes[0] + sizes[1]
            if frame_end > end:
                self._skip = frame_end - end
                return
            position = frame_end
