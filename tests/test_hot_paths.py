"""The hand-made fast paths of a tool round trip give exactly what the general code
gave: an ack's wire form, call-token encoding and MAC, the 64-bit integer check,
and a `tool.call` frame as each connection may see it."""

import base64
import hashlib
import hmac
import itertools
import os

import orjson

from protocol.base import WireModel
from protocol.jsonlimits import has_out_of_range_int
from protocol.server import Ack, ToolCall
from server.auth import Authenticator, CallGrant, _Hmac, b64url_decode, b64url_encode
from server.redaction import frame_for_user, tool_call_view
from server.settings import Settings


def test_ack_wire_is_model_dump_in_field_order() -> None:
    assert list(Ack.model_fields) == ["type", "reply_to", "run_id", "call_id", "duplicate",
                                      "status"]  # a new field needs Ack.to_wire too
    for values in itertools.product([None, "x"], [None, "r"], [None, "c"], [None, True, False],
                                    [None, "accepted"]):
        ack = Ack(**dict(zip(["reply_to", "run_id", "call_id", "duplicate", "status"], values,
                             strict=True)))
        assert list(ack.to_wire().items()) == list(WireModel.to_wire(ack).items())


def test_base64url_and_hmac_match_the_standard_library() -> None:
    for size in range(70):
        data = os.urandom(size)
        encoded = base64.urlsafe_b64encode(data).rstrip(b"=")
        assert b64url_encode(data) == encoded and b64url_decode(encoded) == data
    for bad in (b"a", b"ab$cd", b"====", b"a-b_!"):
        try:
            expected: object = base64.urlsafe_b64decode(bad + b"=" * (-len(bad) % 4))
        except ValueError:
            expected = ValueError
        try:
            got: object = b64url_decode(bad)
        except ValueError:
            got = ValueError
        assert got == expected, bad
    for key_size in (0, 32, 64, 65, 200):
        key, message = os.urandom(key_size), os.urandom(77)
        assert _Hmac(key).digest(message) == hmac.new(key, message, hashlib.sha256).digest()


def test_long_integers_are_found_outside_strings_only() -> None:
    assert has_out_of_range_int('{"n": 99999999999999999999}')
    assert has_out_of_range_int('{"n": -9223372036854775809}')
    assert not has_out_of_range_int('{"n": 9223372036854775807, "s": "12345678901234567890"}')
    assert not has_out_of_range_int(b'{"t": "\xc3\xa91234567890123456789"}')
    assert not has_out_of_range_int('{"n": 123456789012345678}')


def _call_frame(token: str | None, arguments: dict[str, object]) -> str:
    return ToolCall(run_id="r", call_id="c", name="t", arguments=arguments, executor="client",
                    client_id="tab", token=token, expires_at=1).to_json().decode()


def test_a_tool_call_keeps_its_token_for_its_user_only() -> None:
    auth = Authenticator(Settings(jwt_secret="hot-paths-secret-0123456789abcdef"))
    token = auth.issue_call_token(CallGrant("r", "c", "alice", "d", 1))
    forged = auth.issue_call_token(CallGrant("r", "c", "bob", "d", 1))
    cases: tuple[dict[str, object], ...] = ({}, {"token": forged}, {"x": {"token": "a.b"}})
    for arguments in cases:
        frame = _call_frame(token, arguments)
        stripped = orjson.loads(frame)
        del stripped["token"]
        assert frame_for_user(frame, "alice") == frame
        assert orjson.loads(frame_for_user(frame, "bob")) == stripped
        assert frame_for_user(frame, None) == tool_call_view(frame)[1]
    nested_only = _call_frame(None, {"token": forged})  # no call token: nothing to hide
    assert frame_for_user(nested_only, "bob") == frame_for_user(nested_only, "eve") == nested_only
