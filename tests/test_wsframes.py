"""Client frames read without websockets' parser (`server.wsframes`) give the app
exactly what websockets would have: the same messages, pongs and failures, in
the same order, however the stream is cut into reads.

The property test runs a random stream of frames (text, fragments, pings,
binary, invalid UTF-8, unmasked or reserved-bit frames, oversized payloads,
a close) through websockets' own parser alone and through the split reader
that `LeanSansIOProtocol.data_received` is (whole text messages read
directly where the cursor says the parser waits at a boundary, everything
else fed to websockets), cut at random places. The socket tests drive a real
server with frames cut across writes and packed into one."""

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from websockets.frames import Frame, Opcode
from websockets.protocol import OPEN, Protocol, Side

from server.wsframes import FrameCursor, apply_mask, text_messages
from tests.harness import RawClient, running_server, token

MAX_SIZE = 1_000


def raw_frame(opcode: int, payload: bytes, *, fin: bool = True, masked: bool = True,
              rsv: int = 0) -> bytes:
    """A frame as a client may send it, or a broken one (unmasked, reserved bits)."""
    head = bytearray([(0x80 if fin else 0) | rsv << 4 | opcode])
    length = len(payload)
    flag = 0x80 if masked else 0
    if length < 126:
        head.append(flag | length)
    elif length < 65536:
        head += bytes([flag | 126]) + length.to_bytes(2, "big")
    else:
        head += bytes([flag | 127]) + length.to_bytes(8, "big")
    if not masked:
        return bytes(head) + payload
    key = os.urandom(4)
    return bytes(head) + key + apply_mask(payload, key)


class Recorder:
    """What the app would see from one websockets parser: text messages, pings,
    binary messages, then the failure or close that ends the stream."""

    def __init__(self) -> None:
        self.parser = Protocol(Side.SERVER, state=OPEN, max_size=MAX_SIZE)
        self.seen: list[Any] = []
        self.ended = False
        self._fragments: list[bytes] = []

    def feed(self, chunk: bytes) -> None:
        if self.ended:
            return
        self.parser.receive_data(chunk)
        for event in self.parser.events_received():
            assert isinstance(event, Frame)
            self._frame(event)
            if self.ended:
                return
        if self.parser.parser_exc is not None:
            self.seen.append(("failed", type(self.parser.parser_exc).__name__,
                              self.parser.close_sent.code if self.parser.close_sent else None))
            self.ended = True

    def text(self, message: str) -> None:
        self.seen.append(("text", message))

    def _frame(self, frame: Frame) -> None:
        if frame.opcode in (Opcode.TEXT, Opcode.BINARY, Opcode.CONT):
            self._fragments.append(bytes(frame.data))
            if frame.opcode is not Opcode.CONT:
                self._kind = frame.opcode
            if frame.fin:
                data, self._fragments = b"".join(self._fragments), []
                if self._kind is Opcode.BINARY:
                    self.seen.append(("bytes", data))
                    return
                try:
                    self.text(data.decode())
                except UnicodeDecodeError:
                    self.seen.append(("invalid utf-8",))  # uvicorn closes 1007
                    self.ended = True
        elif frame.opcode is Opcode.PING:
            self.seen.append(("ping", bytes(frame.data)))
        elif frame.opcode is Opcode.CLOSE:
            self.seen.append(("close",))
            self.ended = True


class SplitReader(Recorder):
    """`LeanSansIOProtocol.data_received`'s choice, on a websockets parser."""

    def __init__(self) -> None:
        super().__init__()
        self.cursor = FrameCursor()
        self.direct_reads = 0

    def feed(self, chunk: bytes) -> None:
        if self.ended:
            return
        parser = self.parser
        if self.cursor.at_boundary() and parser.state is OPEN and parser.current_size is None \
                and not parser.reader.buffer:
            messages = text_messages(chunk, parser.max_message_size)
            if messages is not None:
                self.direct_reads += 1
                for message in messages:
                    self.text(message)
                return
        self.cursor.advance(chunk)
        super().feed(chunk)


def frames() -> st.SearchStrategy[bytes]:
    text = st.text(max_size=60).map(lambda s: s.encode())
    long_text = st.integers(126, 600).map(lambda n: ("é" * n).encode())
    return st.one_of(
        text.map(lambda p: raw_frame(0x1, p)),
        long_text.map(lambda p: raw_frame(0x1, p)),  # 16-bit lengths, some over MAX_SIZE
        st.binary(max_size=20).map(lambda p: raw_frame(0x9, p)),  # ping
        st.binary(max_size=20).map(lambda p: raw_frame(0x2, p)),
        st.tuples(text, text).map(lambda parts: raw_frame(0x1, parts[0], fin=False)
                                  + raw_frame(0x0, parts[1])),  # a fragmented message
        st.just(raw_frame(0x1, b"\xff\xfe")),  # invalid UTF-8
        st.just(raw_frame(0x1, b"{}", masked=False)),  # a client must mask
        st.just(raw_frame(0x1, b"{}", rsv=4)),  # reserved bit with no extension
        st.just(raw_frame(0x1, b"x" * 70_000)),  # 64-bit length, over the limit
        st.just(raw_frame(0x8, (1000).to_bytes(2, "big"))),  # close
    )


@settings(max_examples=300, deadline=None)
@given(stream=st.lists(frames(), max_size=12), cuts=st.lists(st.integers(0, 100), max_size=12),
       whole=st.booleans())
def test_the_split_reader_sees_what_websockets_sees(stream: list[bytes], cuts: list[int],
                                                  whole: bool) -> None:
    data = b"".join(stream)
    if whole:  # one read per frame, as clients write them: the direct path's usual case
        chunks = list(stream)
    else:
        points = sorted({min(cut * max(len(data), 1) // 100, len(data)) for cut in cuts})
        chunks = [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)
                  if b > a]
    reference, split = Recorder(), SplitReader()
    for chunk in chunks:
        reference.feed(chunk)
        split.feed(chunk)
    assert split.seen == reference.seen


def test_the_split_reader_reads_whole_messages_directly_and_resyncs_after_a_cut() -> None:
    frames_ = [raw_frame(0x1, f'{{"n":{n}}}'.encode()) for n in range(4)]
    split, reference = SplitReader(), Recorder()
    for chunk in (frames_[0], frames_[1][:3], frames_[1][3:], frames_[2] + frames_[3]):
        split.feed(chunk)
        reference.feed(chunk)
    assert split.seen == reference.seen == [("text", f'{{"n":{n}}}') for n in range(4)]
    assert split.direct_reads == 2  # the first and the last read; the cut one went to websockets


def test_whole_text_frames_are_read_directly_and_anything_else_is_not() -> None:
    one, two = raw_frame(0x1, b'{"a":1}'), raw_frame(0x1, "é".encode() * 200)
    assert text_messages(one, None) == ['{"a":1}']
    assert text_messages(one + two, None) == ['{"a":1}', "é" * 200]
    assert text_messages(one + two, 100) is None  # the second is over the limit
    assert text_messages(one[:-1], None) is None  # cut short
    assert text_messages(one + raw_frame(0x9, b""), None) is None  # a ping: websockets answers
    assert text_messages(raw_frame(0x1, b"x", fin=False), None) is None
    assert text_messages(b"", None) is None


def test_the_cursor_follows_frames_cut_anywhere() -> None:
    stream = raw_frame(0x1, b"a" * 300) + raw_frame(0x9, b"p") + raw_frame(0x1, b"x" * 70_000)
    for cut in range(0, len(stream), 97):
        cursor = FrameCursor()
        cursor.advance(stream[:cut])
        assert cursor.at_boundary() == (cut in (0, 308, 315))
        cursor.advance(stream[cut:])
        assert cursor.at_boundary()


async def _ping_pongs(client: RawClient, count: int) -> list[int]:
    stamps: list[int] = []
    while len(stamps) < count:
        opcode, payload = await asyncio.wait_for(client.read_frame(), 10)
        if opcode == 0x1:
            event = orjson.loads(payload)
            assert event["type"] == "pong", event
            stamps.append(event["ts"])
        else:
            assert opcode == 0xA, opcode  # the websocket pong to our ping frame
            stamps.append(-1)
    return stamps


def _message(payload: dict[str, Any]) -> bytes:
    return raw_frame(0x1, orjson.dumps(payload))


@contextlib.asynccontextmanager
async def _welcomed() -> AsyncIterator[RawClient]:
    """A real server and a raw client past its welcome (the request in one write: the
    direct path is open)."""
    async with running_server() as srv:
        client = await RawClient.connect(srv.settings.port, "/v1/documents/doc-1/ws")
        try:
            client.writer.write(_message({"type": "hello", "protocol": 1, "client_id": "t",
                                          "token": token("alice")}))
            assert orjson.loads((await client.read_frame())[1])["type"] == "welcome"
            yield client
        finally:
            client.close()


async def test_frames_cut_across_writes_or_packed_together_all_arrive_in_order() -> None:
    async with _welcomed() as client:
        pings = [_message({"type": "ping", "ts": n}) for n in range(6)]
        # packed: three messages in one write; then one cut inside its header, one
        # inside its payload, a websocket ping frame in between, and a last one whole
        client.writer.write(pings[0] + pings[1] + pings[2])
        await client.writer.drain()
        assert await _ping_pongs(client, 3) == [0, 1, 2]
        for part in (pings[3][:1], pings[3][1:], pings[4][:9],
                     pings[4][9:] + raw_frame(0x9, b"hi"), pings[5]):
            client.writer.write(part)
            await client.writer.drain()
            await asyncio.sleep(0.02)  # separate reads on the server
        got = await _ping_pongs(client, 4)  # websockets answers a ping frame as it
        assert [n for n in got if n >= 0] == [3, 4, 5] and -1 in got  # parses it


@pytest.mark.parametrize(("frame", "code"), [
    (raw_frame(0x1, b"\xff\xfe"), 1007),
    (raw_frame(0x1, b"{}", masked=False), 1002),
])
async def test_a_bad_frame_still_closes_the_connection_as_before(frame: bytes, code: int) -> None:
    async with _welcomed() as client:
        client.writer.write(frame)
        _, closed = await asyncio.wait_for(client.read_until_close(), 10)
        assert closed == code


async def test_a_request_cut_across_writes_leaves_the_connection_on_websockets_path() -> None:
    """The direct path needs the frame boundaries from the first read on; a request sent
    in two writes (so two reads) gives no such certainty: websockets reads every frame,
    and the messages still arrive, whole frames and cut ones alike."""
    import base64

    async with running_server() as srv:
        reader, writer = await asyncio.open_connection("127.0.0.1", srv.settings.port)
        key = base64.b64encode(os.urandom(16)).decode()
        request = (f"GET /v1/documents/doc-1/ws HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                   f"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                   "Sec-WebSocket-Version: 13\r\n\r\n").encode()
        for part in (request[:20], request[20:]):
            writer.write(part)
            await writer.drain()
            await asyncio.sleep(0.02)
        assert b" 101 " in await reader.readline()
        while (await reader.readline()) not in (b"\r\n", b""):
            pass
        client = RawClient(reader, writer)
        try:
            writer.write(_message({"type": "hello", "protocol": 1, "client_id": "t",
                                   "token": token("alice")}))
            assert orjson.loads((await client.read_frame())[1])["type"] == "welcome"
            second = _message({"type": "ping", "ts": 1})
            for part in (_message({"type": "ping", "ts": 0}), second[:3], second[3:]):
                writer.write(part)
                await writer.drain()
                await asyncio.sleep(0.02)
            assert await _ping_pongs(client, 2) == [0, 1]
        finally:
            client.close()
