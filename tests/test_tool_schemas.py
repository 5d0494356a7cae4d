"""Tool schemas from clients and MCP servers never make cowrite fetch anything, and an
unusable one is that tool's problem, not the run's or the catalog's."""

import asyncio
import contextlib
import socket
from collections.abc import Iterator
from typing import Any

from server.tools.config import McpServerConfig
from server.tools.mcp_results import convert_listing
from server.tools.schemas import argument_check
from tests.harness import Server, joined
from tests.runs import call, of_run, script, start


@contextlib.contextmanager
def listening() -> Iterator[socket.socket]:
    """A port that records whether anything connected to it."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        sock.setblocking(False)
        yield sock


def _connected(sock: socket.socket) -> bool:
    try:
        sock.accept()[0].close()
    except BlockingIOError:
        return False
    return True


def test_checks_answer_for_schemas_jsonschema_cannot_use() -> None:
    assert argument_check("t", {"$id": 5, "type": "object"}) == \
        "its input schema cannot be used"
    recursive = argument_check("t", {"type": "object", "additionalProperties": {"$ref": "#"}})
    assert callable(recursive)
    deep: dict[str, Any] = {}
    for _ in range(2000):
        deep = {"a": deep}
    assert recursive(deep) == "arguments of t are nested too deeply"
    missing = argument_check("t", {"type": "object", "properties": {
        "a": {"$ref": "#/$defs/nowhere"}}})
    assert callable(missing)
    assert missing({"a": 1}) == "the input schema of t refers to a schema it does not contain"
    plain = argument_check("t", {"type": "object", "required": ["a"]})
    assert callable(plain) and plain({}) == "invalid arguments for t at (arguments): " \
        "'a' is a required property" and plain({"a": 1}) is None


def test_a_remote_ref_is_not_fetched() -> None:
    with listening() as sock:
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/schema.json"
        check = argument_check("t", {"type": "object", "properties": {"a": {"$ref": url}}})
        assert callable(check)
        assert check({"a": 1}) == "the input schema of t refers to a schema it does not contain"
        assert not _connected(sock)


def test_an_mcp_tool_with_an_unusable_schema_is_listed_unavailable_alone() -> None:
    from mcp import types

    deep: dict[str, Any] = {"type": "object"}
    for _ in range(3000):
        deep = {"type": "object", "properties": {"a": deep}}
    listing = [types.Tool(name="fine", inputSchema={"type": "object"}),
               types.Tool(name="deep", inputSchema=deep)]
    config = McpServerConfig(name="srv", command=["unused"])
    tools = {t.name: t for t in convert_listing(config, listing)}
    assert tools["srv__fine"].problem is None
    assert tools["srv__deep"].problem == "its input schema is nested too deeply"


async def test_a_client_tool_schema_pointing_elsewhere_is_not_fetched(server: Server) -> None:
    with listening() as sock:
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/schema.json"
        tool = {"name": "lookup", "description": "Look up.", "parameters": {
            "type": "object", "properties": {"q": {"$ref": url}}}}
        async with joined(server) as (client, _):
            ack = await start(client, script({"tool_calls": [call("lookup", q="x")]},
                                             {"say": "Done."}), tools=[tool])
            finished = await client.recv_until("run.finished")
            await asyncio.sleep(0.05)
        assert finished["status"] == "completed"
        assert of_run(client.events, ack["run_id"], "tool.call") == []  # the model was told
        assert not _connected(sock)
