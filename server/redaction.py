"""Call tokens hidden from other users: a `tool.call` as one connection may see it.

A client tool call's frame carries the single-use token of the call; only
connections of the token's user (the run's user) may see it, every other
connection gets the frame without `token`. The stripped frame is cached per
frame text, so N connections cost one re-encoding. The token's own user,
the common case, is recognised without parsing the frame at all.
"""

from collections import OrderedDict

import orjson

from server.auth import call_token_user

REDACTED_CACHE = 256
# frame text -> (token's user, frame without the token); shared by every writer
_redacted: OrderedDict[str, tuple[str | None, str]] = OrderedDict()


def tool_call_view(frame: str) -> tuple[str | None, str]:
    """The user a `tool.call` frame's token belongs to, and the frame without it."""
    cached = _redacted.get(frame)
    if cached is not None:
        return cached
    data = orjson.loads(frame)
    token = data.pop("token", None)
    view = (None, frame) if not isinstance(token, str) else (
        call_token_user(token), orjson.dumps(data).decode())
    _redacted[frame] = view
    if len(_redacted) > REDACTED_CACHE:
        _redacted.popitem(last=False)
    return view


def frame_for_user(frame: str, user_id: str | None) -> str:
    """A `tool.call` frame as a connection of `user_id` may see it. The token's own
    user is settled from the last `"token":"` (the top-level token follows the
    arguments, where a nested one could hide; the fields after it are numbers or
    strings, in which a quote is escaped); any doubt takes the full parse."""
    if '"token"' not in frame:
        return frame
    start = frame.rfind('"token":"')
    if start >= 0:
        start += 9
        if call_token_user(frame[start:frame.find('"', start)]) == user_id:
            return frame
    owner, stripped = tool_call_view(frame)
    return frame if owner == user_id else stripped
