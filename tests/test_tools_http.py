"""GET /v1/tools and /v1/workflows over a real server, the startup error, and the examples."""

import asyncio
import os
import sys
import tomllib
from pathlib import Path
from typing import Any

import httpx

from server.tools.catalog import ToolCatalog
from server.tools.config import parse_config
from tests.harness import SECRET, free_port, running_server, token
from tests.tool_support import FAST, tool_context

ROOT = Path(__file__).resolve().parent.parent
CONFIG = """
[[tools]]
import = "tests.tool_fixtures:greet"
requires_approval = true
[[tools]]
import = "tests.tool_fixtures:no_such_tool"

[[workflows]]
name = "proofread"
title = "Proofread"
description = "Fix spelling and grammar, nothing else."
category = "editing"
system_prompt = "You proofread."
tools = ["read_document", "greet"]
approval = ["greet"]
max_steps = 8
"""


async def test_tools_and_workflows_routes(tmp_path: Path) -> None:
    config = tmp_path / "cowrite.toml"
    config.write_text(CONFIG)
    async with running_server(config=config) as srv, httpx.AsyncClient(base_url=srv.http) as http:
        for route in ("/v1/tools", "/v1/workflows"):
            assert (await http.get(route)).status_code == 401
            bad = await http.get(route, headers={"Authorization": "Bearer nope"})
            assert bad.status_code == 401
        auth = {"Authorization": f"Bearer {token(docs=['some-doc'])}"}
        tools = (await http.get("/v1/tools", headers=auth)).json()["tools"]
        by_name: dict[str, dict[str, Any]] = {t["name"]: t for t in tools}
        assert set(by_name) == {"text_stats", "greet", "no_such_tool"}
        assert by_name["greet"] == {
            "name": "greet", "description": "Greet someone by name.",
            "parameters": by_name["greet"]["parameters"], "source": "python",
            "requires_approval": True, "available": True}
        assert by_name["greet"]["parameters"]["required"] == ["name"]
        assert by_name["text_stats"]["source"] == "builtin"
        assert by_name["no_such_tool"]["available"] is False
        assert by_name["no_such_tool"]["problem"] == (
            "tests.tool_fixtures has no attribute no_such_tool")
        workflows = (await http.get("/v1/workflows", headers=auth)).json()
        assert workflows == {"workflows": [{
            "name": "proofread", "title": "Proofread",
            "description": "Fix spelling and grammar, nothing else.", "category": "editing",
            "mode": "agent", "tools": ["read_document", "greet"]}]}
        assert (await http.get("/readyz")).status_code == 200  # an unavailable tool is fine
        assert isinstance(srv.app.state.tools, ToolCatalog)


async def test_without_a_config_file_only_the_builtin_is_there() -> None:
    async with running_server() as srv, httpx.AsyncClient(base_url=srv.http) as http:
        auth = {"Authorization": f"Bearer {token()}"}
        tools = (await http.get("/v1/tools", headers=auth)).json()["tools"]
        assert [t["name"] for t in tools] == ["text_stats"]
        assert (await http.get("/v1/workflows", headers=auth)).json() == {"workflows": []}


async def test_invalid_config_stops_startup_with_one_line(tmp_path: Path) -> None:
    config = tmp_path / "cowrite.toml"
    config.write_text('[[tools]]\nimport = "tests.tool_fixtures:greet"\nrequires_aproval = true\n')
    env = {**os.environ, "COWRITE_CONFIG": str(config), "COWRITE_JWT_SECRET": SECRET,
           "COWRITE_PORT": str(free_port())}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "server", cwd=ROOT, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    _, stderr = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 2
    assert stderr.decode().splitlines() == [
        f"cowrite: COWRITE_CONFIG {config}: unknown key tools[0].requires_aproval"]


async def test_the_example_config_works() -> None:
    data = tomllib.loads((ROOT / "examples" / "cowrite.toml").read_text())
    data["mcp"][0]["command"][0] = sys.executable  # "python" may not be the venv's
    data["mcp"][0]["cwd"] = str(ROOT)
    tools = ToolCatalog(parse_config(data), mcp_timings=FAST)
    await tools.start()
    try:
        specs = {s.name: s for s in tools.specs()}
        assert set(specs) == {"text_stats", "define", "convert_case", "notes__read_note",
                              "notes__list_notes", "word_count"}
        assert specs["convert_case"].requires_approval
        assert not specs["notes__read_note"].requires_approval
        ctx = tool_context()
        defined = await tools.invoke("define", {"term": "MCP"}, ctx)
        assert defined.output["definition"].startswith("Model Context Protocol")
        unknown = await tools.invoke("define", {"term": "zebra"}, ctx)
        assert unknown.error is not None and unknown.error["code"] == "tool_error"
        note = await tools.invoke("notes__read_note", {"name": "style"}, ctx)
        assert note.output == {"result": "Prefer short sentences. Use the active voice."}
        counted = await tools.invoke("word_count", {"text": "internationalization is long"},
                                     ctx)
        assert counted.output == {"words": 3, "long_words": 1}
        assert [w.name for w in tools.workflows()] == ["proofread", "ask"]
    finally:
        await tools.close()
