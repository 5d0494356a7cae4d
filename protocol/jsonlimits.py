"""Cheap checks of raw JSON text before it is trusted (PROTOCOL.md section 10).

Both run at the edge on every client frame, so the common case costs a few
C-speed scans of the text and no Python loop:

- nesting depth: a frame with at most `limit` opening brackets cannot nest
  deeper than `limit`, so only frames with more brackets are scanned, by a
  regular expression that skips string literals; the walk is a loop over the
  matches (never recursion) and stops at the first level over the limit.
- integers: JSON has no integer size limit but the server's encoder and its
  peers do (signed 64-bit). orjson turns an integer beyond 64 bits into a
  float, silently; any integer outside the signed 64-bit range has at least
  19 digits, so only text with a run of 19 digits is parsed again with the
  standard library, whose `parse_int` hook sees integer tokens only (digits
  inside strings do not count). The run is found by mapping every byte to
  "0" (a digit) or " " (anything else) and searching for 19 zeros: two C
  passes over the bytes, where a regular expression tried a match at every
  digit (a call token is full of them; 5x the time on a `tool.result`).
"""

import json
import re

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
ORJSON_MAX_DEPTH = 1024  # orjson.loads refuses deeper input by itself

_TOKENS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]', re.DOTALL)
_DIGIT_OR_NOT = bytes(0x30 if 0x30 <= byte <= 0x39 else 0x20 for byte in range(256))
_LONG_RUN = b"0" * 19


def nesting_over(text: str | bytes, limit: int) -> bool:
    """True when objects and arrays in `text` nest deeper than `limit` levels
    (`{}` is one level). `limit` <= 0 means no limit of our own."""
    if limit <= 0:
        return False
    if isinstance(text, bytes):
        if text.count(b"[") + text.count(b"{") <= limit:
            return False
        text = text.decode("utf-8", "replace")
    elif text.count("[") + text.count("{") <= limit:
        return False
    depth = 0
    for match in _TOKENS.finditer(text):
        char = match.group()[0]
        if char == "[" or char == "{":
            depth += 1
            if depth > limit:
                return True
        elif char != '"':
            depth -= 1
    return False


class _OutOfRange(Exception):
    pass


def _checked_int(token: str) -> int:
    value = int(token)
    if not INT64_MIN <= value <= INT64_MAX:
        raise _OutOfRange
    return value


def has_out_of_range_int(text: str | bytes) -> bool:
    """True when `text` (already known to be valid JSON) holds an integer token
    outside the signed 64-bit range."""
    data = text.encode() if isinstance(text, str) else text  # non-ASCII: bytes >= 0x80
    if _LONG_RUN not in data.translate(_DIGIT_OR_NOT):
        return False
    try:
        json.loads(text, parse_int=_checked_int)
    except _OutOfRange:
        return True
    except RecursionError:
        return True  # too deep for the stdlib to check: refuse rather than guess
    except ValueError:
        return False  # not JSON after all: the caller reports that
    return False
