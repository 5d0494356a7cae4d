"""`x-cowrite-ai-sdk`, the `ai` version a `DefaultChatTransport` frontend says it runs:
from 7 on its live stream may carry `reset-step` (`ai` 5 and 6 fail the chat on it).
Only the major version counts; anything unreadable is taken for `ai` 5 or 6."""

import pytest
from starlette.requests import Request

from server.adapters.ai_sdk import RESETS_HEADER, accepts_resets


def _request(value: str | None) -> Request:
    headers = [] if value is None else [(RESETS_HEADER.encode(), value.encode())]
    return Request({"type": "http", "method": "GET", "path": "/", "headers": headers})


@pytest.mark.parametrize(("value", "accepted"), [
    ("7", True), ("7.0.173", True), ("v7", True), (" 8 ", True), ("12.1", True),
    ("6", False), ("6.0.326", False), ("5", False), (None, False), ("", False),
    ("seven", False), ("x7", False), ("9" * 40, False)])
def test_the_major_version_decides(value: str | None, accepted: bool) -> None:
    assert accepts_resets(_request(value)) is accepted
