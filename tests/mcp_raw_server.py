"""A stdio MCP server written by hand (JSON-RPC lines, protocol 2025-06-18, as most
deployed servers speak), for what the SDK's server never does: answers of any size,
bytes that are not UTF-8, a crash before the handshake.

Run as `python -m tests.mcp_raw_server`. Environment: RAW_LOG (a file it notes
`initialize`, `list` and calls in), RAW_EXTRA_TOOL (one more tool, as JSON),
RAW_TOOLS_N (that many more tools, each with its own schema), RAW_NOTIFY_S (announce
`tools/list_changed` that often), RAW_FAIL_START=1 (write a traceback to stderr and
exit with code 1 before reading anything), RAW_HELPER (a file: start a `sleep` in
its own process group, as a server starting a browser or a language server does,
and write the helper's pid there), RAW_HELPER_STDOUT=1 (that helper inherits stdout, as a
child started without redirection does).
"""

import json
import os
import subprocess
import sys
import threading
import time
from typing import Any

_lock = threading.Lock()


def _note(line: str) -> None:
    if log := os.environ.get("RAW_LOG"):
        with open(log, "a") as file:
            file.write(line + "\n")


def _write(data: bytes) -> None:
    with _lock:
        sys.stdout.buffer.write(data + b"\n")
        sys.stdout.buffer.flush()


def _send(message: dict[str, Any]) -> None:
    _write(json.dumps(message).encode())


def _text(mid: Any, text: str) -> None:
    _send({"jsonrpc": "2.0", "id": mid, "result": {"content": [{"type": "text", "text": text}]}})


def _tools() -> list[dict[str, Any]]:
    tools: list[dict[str, Any]] = [
        {"name": "echo", "inputSchema": {"type": "object",
                                         "properties": {"text": {"type": "string"}}}},
        {"name": "huge", "inputSchema": {"type": "object",
                                         "properties": {"mb": {"type": "number"}}}},
        {"name": "badutf8", "inputSchema": {"type": "object"}},
        {"name": "pid", "inputSchema": {"type": "object"}},
        {"name": "stall", "inputSchema": {"type": "object"}},
    ]
    if extra := os.environ.get("RAW_EXTRA_TOOL"):
        tools.append(json.loads(extra))
    for i in range(int(os.environ.get("RAW_TOOLS_N", "0"))):
        tools.append({"name": f"t{i}", "inputSchema": {"type": "object", "properties": {
            f"p{i}": {"type": "string", "maxLength": i + 1}}}})
    return tools


def _call(mid: Any, name: str, arguments: dict[str, Any]) -> None:
    _note(f"call {name}")
    if name == "echo":
        _text(mid, str(arguments.get("text", "")))
    elif name == "huge":
        _text(mid, "a" * int(float(arguments.get("mb", 30)) * 1024 * 1024))
    elif name == "badutf8":  # a latin-1 print, or a child process sharing stdout
        _write(b"\xff\xfe caf\xe9 is not UTF-8")
        _text(mid, "after the bad bytes")
    elif name == "pid":
        _text(mid, str(os.getpid()))
    elif name == "stall":  # answers after 5 minutes: a call in flight when it is killed
        time.sleep(300)
        _text(mid, "late")


def _announce(every_s: float) -> None:
    while True:
        time.sleep(every_s)
        _send({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})


def main() -> None:
    if os.environ.get("RAW_FAIL_START"):
        print("Traceback (most recent call last):\n  File \"server.py\", line 1, in <module>\n"
              "ModuleNotFoundError: No module named 'notes_backend'", file=sys.stderr)
        sys.exit(1)
    if helper_file := os.environ.get("RAW_HELPER"):
        shares = bool(os.environ.get("RAW_HELPER_STDOUT"))
        helper = subprocess.Popen(["sleep", "300"], stdin=subprocess.DEVNULL,
                                  stdout=None if shares else subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        with open(helper_file, "w") as file:
            file.write(str(helper.pid))
    if every := float(os.environ.get("RAW_NOTIFY_S", "0")):
        threading.Thread(target=_announce, args=(every,), daemon=True).start()
    for line in sys.stdin:
        if not line.strip():
            continue
        message = json.loads(line)
        method, mid = message.get("method"), message.get("id")
        if method == "initialize":
            _note("initialize")
            _send({"jsonrpc": "2.0", "id": mid, "result": {
                "protocolVersion": "2025-06-18", "capabilities": {"tools": {"listChanged": True}},
                "serverInfo": {"name": "raw", "version": "1"}}})
        elif method == "tools/list":
            _note("list")
            _send({"jsonrpc": "2.0", "id": mid, "result": {"tools": _tools()}})
        elif method == "tools/call":
            params = message["params"]
            _call(mid, params["name"], params.get("arguments") or {})
        elif method == "ping":
            _send({"jsonrpc": "2.0", "id": mid, "result": {}})
        elif mid is not None:
            _send({"jsonrpc": "2.0", "id": mid, "error": {"code": -32601, "message": "no"}})


if __name__ == "__main__":
    main()
