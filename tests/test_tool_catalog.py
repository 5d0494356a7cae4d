"""Python server tools, the built-in, the config file and workflows (no MCP here)."""

import asyncio
import gc
import logging
import tomllib
from pathlib import Path
from typing import Any

import orjson
import pytest

from server.tools.config import ConfigError, load_config, parse_config
from tests import tool_fixtures
from tests.tool_support import catalog, tool_context

FIXTURES = """
[[tools]]
import = "tests.tool_fixtures:greet"
[[tools]]
import = "tests.tool_fixtures:refuse"
requires_approval = true
idempotent = true
[[tools]]
import = "tests.tool_fixtures:explode"
[[tools]]
import = "tests.tool_fixtures:sleepy"
timeout_s = 0.3
"""


def by_name(entries: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {entry["name"]: entry for entry in entries}


def test_schema_comes_from_type_hints_and_context_is_hidden() -> None:
    tools = catalog(FIXTURES)
    spec = {s.name: s for s in tools.specs()}["greet"]
    assert spec.source == "python" and spec.description == "Greet someone by name."
    assert spec.parameters["required"] == ["name"]
    assert set(spec.parameters["properties"]) == {"name", "times", "shout"}  # no ctx
    assert spec.parameters["properties"]["name"]["description"] == "Who to greet."
    assert spec.parameters["properties"]["times"] == {"default": 1, "title": "Times",
                                                      "type": "integer"}
    assert spec.parameters["additionalProperties"] is False
    assert not spec.requires_approval and spec.timeout_s == 5.0 and not spec.idempotent
    refuse = {s.name: s for s in tools.specs()}["refuse"]
    assert refuse.requires_approval and refuse.idempotent


def test_check_validates_arguments_against_the_hints() -> None:
    tools = catalog(FIXTURES)
    assert tools.check("greet", {"name": "Ann", "times": 2}) == {"name": "Ann", "times": 2}
    assert tools.check("greet", {"name": ""}) == (
        "invalid arguments for greet at name: String should have at least 1 character")
    assert "at times" in str(tools.check("greet", {"name": "A", "times": "many"}))
    assert "at ctx" in str(tools.check("greet", {"name": "A", "ctx": {}}))  # not injectable
    assert tools.check("nope", {}) == "unknown server tool 'nope'"


async def test_call_gets_context_and_returns_json() -> None:
    result = await catalog(FIXTURES).invoke("greet", {"name": "Ann", "shout": True},
                                            tool_context())
    assert result.status == "ok"
    assert result.output == {"text": "HELLO ANN FROM ALICE ON DOC-1", "shout": True}


async def test_invalid_arguments_are_a_tool_error_and_nothing_runs() -> None:
    result = await catalog(FIXTURES).invoke("greet", {"times": 1}, tool_context())
    assert result.status == "error" and result.error is not None
    assert result.error == {"message": "invalid arguments for greet at name: Field required",
                            "code": "invalid_arguments"}


async def test_tool_error_message_reaches_the_model() -> None:
    result = await catalog(FIXTURES).invoke("refuse", {"reason": "no"}, tool_context())
    assert result.status == "error"
    assert result.error == {"message": "refused: no", "code": "tool_error"}


async def test_failing_tool_leaks_nothing_and_logs_the_ref(caplog: pytest.LogCaptureFixture
                                                            ) -> None:
    with caplog.at_level(logging.ERROR, logger="cowrite.tools.test"):
        result = await catalog(FIXTURES).invoke("explode", {}, tool_context())
    assert result.status == "error" and result.error is not None
    message = result.error["message"]
    assert message.startswith("tool failed (ref ") and "hunter2" not in message
    ref = message.removeprefix("tool failed (ref ").removesuffix(")")
    logged = [r for r in caplog.records if ref in r.getMessage()]
    assert logged and logged[0].exc_info is not None
    assert "hunter2" in str(logged[0].exc_info[1])


async def test_an_output_over_the_size_limit_or_beyond_json_is_the_tools_failure(
        caplog: pytest.LogCaptureFixture) -> None:
    tools = catalog(FIXTURES + '[[tools]]\nimport = "tests.tool_fixtures:beyond_json"\n',
                    max_output_bytes=2048)
    fits = await tools.invoke("greet", {"name": "Ann", "times": 50}, tool_context())
    assert fits.status == "ok" and len(fits.output["text"]) > 1000
    big = await tools.invoke("greet", {"name": "Ann", "times": 100}, tool_context())
    assert big.status == "error" and big.output is None
    size = len(orjson.dumps({"text": " ".join(["hello Ann from alice on doc-1"] * 100),
                             "shout": False}))
    assert big.error == {"message": f"greet returned {size} bytes of output; the limit is 2048",
                         "code": "too_large"}
    with caplog.at_level(logging.ERROR, logger="cowrite.tools.test"):
        odd = await tools.invoke("beyond_json", {}, tool_context())
    assert odd.status == "error" and odd.error is not None and odd.output is None
    assert odd.error["code"] == "internal"
    ref = odd.error["message"].removeprefix("tool failed (ref ").removesuffix(")")
    assert any(ref in record.getMessage() for record in caplog.records)


async def test_timeout_ends_the_call_and_cancels_the_tool() -> None:
    events: asyncio.Queue[str] = asyncio.Queue()
    tool_fixtures.OBSERVERS["t"] = events
    result = await catalog(FIXTURES).invoke("sleepy", {"key": "t", "seconds": 30},
                                            tool_context())
    assert result.status == "timeout"
    assert result.error == {"message": "sleepy took longer than 0.3 s", "code": "timeout"}
    assert [events.get_nowait(), events.get_nowait()] == ["started", "cancelled"]


async def test_cancelling_the_caller_reaches_the_running_tool() -> None:
    events: asyncio.Queue[str] = asyncio.Queue()
    tool_fixtures.OBSERVERS["c"] = events
    tools = catalog(FIXTURES.replace("timeout_s = 0.3", "timeout_s = 60"))
    call = asyncio.create_task(tools.invoke("sleepy", {"key": "c", "seconds": 30},
                                            tool_context()))
    assert await asyncio.wait_for(events.get(), 5) == "started"
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert events.get_nowait() == "cancelled"


MISBEHAVING = """
[[tools]]
import = "tests.tool_fixtures:exits"
[[tools]]
import = "tests.tool_fixtures:aborts"
[[tools]]
import = "tests.tool_fixtures:nested"
[[tools]]
import = "tests.tool_fixtures:inner_cancelled"
[[tools]]
import = "tests.tool_fixtures:wraps"
[[tools]]
import = "tests.tool_fixtures:stubborn"
timeout_s = 0.3
"""


async def test_a_tool_calling_sys_exit_or_cancelled_inside_is_its_own_failure(
        caplog: pytest.LogCaptureFixture) -> None:
    """SystemExit from a tool stopped the event loop (the whole server); a CancelledError
    of an operation inside the tool left the run waiting for a call that had ended."""
    tools = catalog(MISBEHAVING)
    with caplog.at_level(logging.ERROR, logger="cowrite.tools.test"):
        exited = await tools.invoke("exits", {}, tool_context())
        # a library's own BaseException failed the whole run (its driver's task group)
        aborted = await tools.invoke("aborts", {}, tool_context())
        cancelled = await asyncio.wait_for(tools.invoke("inner_cancelled", {}, tool_context()),
                                           5)
    assert "secret detail" not in str(aborted.error)
    for result in (exited, aborted, cancelled):
        assert result.status == "error" and result.error is not None
        assert result.error["code"] == "internal"
        assert result.error["message"].startswith("tool failed (ref ")
    assert asyncio.get_running_loop().is_running()


async def test_a_tool_errors_message_is_text_and_bounded() -> None:
    """`ToolError(exc)`, the usual wrap of a library error, failed the whole run (its
    message was not text); a 3 MB message went whole to every client."""
    tools = catalog(MISBEHAVING)
    short = await tools.invoke("wraps", {"reason": "cannot reach the API"}, tool_context())
    assert short.error == {"message": "cannot reach the API", "code": "tool_error"}
    long = await tools.invoke("wraps", {"reason": "x" * 100_000}, tool_context())
    assert long.error is not None and long.error["code"] == "tool_error"
    assert long.error["message"] == "x" * 4096 + f" [... {100_000 - 4096} more bytes cut]"
    # bytes, not characters: 4096 emoji made 16 KB for every client
    wide = await tools.invoke("wraps", {"reason": "\N{GRINNING FACE}" * 4096}, tool_context())
    assert wide.error is not None
    assert wide.error["message"] == "\N{GRINNING FACE}" * 1024 + " [... 12288 more bytes cut]"


async def test_an_output_nested_deeper_than_a_clients_result_may_be_is_the_tools_failure(
        ) -> None:
    """Output 253 levels deep passed the catalog, then could not be logged: the run
    failed `internal`. Past the depth a client's result may have it is the tool's."""
    tools = catalog(MISBEHAVING)
    fine = await tools.invoke("nested", {"depth": 63}, tool_context())
    assert fine.status == "ok"
    for depth in (65, 253):
        deep = await tools.invoke("nested", {"depth": depth}, tool_context())
        assert deep.status == "error" and deep.error == {
            "message": "nested returned output nested deeper than 64 levels",
            "code": "too_large"}


async def test_a_tool_ignoring_its_cancellation_is_left_behind() -> None:
    """Neither the timeout nor the caller's cancel waits for a tool that ignores being
    cancelled: it gets a second to stop, then finishes alone (its end is logged)."""
    events: asyncio.Queue[str] = asyncio.Queue()
    tool_fixtures.OBSERVERS["stubborn"] = events
    tools = catalog(MISBEHAVING)
    result = await tools.invoke("stubborn", {"key": "stubborn", "seconds": 3}, tool_context())
    assert result.status == "timeout"
    assert events.get_nowait() == "ignored a cancel" and events.empty()  # still running
    call = asyncio.create_task(tools.invoke("stubborn", {"key": "stubborn", "seconds": 3},
                                            tool_context()))
    await asyncio.sleep(0.1)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert await asyncio.wait_for(events.get(), 5) == "ignored a cancel"
    assert await asyncio.wait_for(events.get(), 5) == "ended"  # the first, left behind
    assert await asyncio.wait_for(events.get(), 5) == "ended"


async def test_a_second_cancel_during_the_stop_grace_loses_no_bookkeeping(
        caplog: pytest.LogCaptureFixture) -> None:
    """The caller cancelled again while the tool had its second to stop: the tool's end
    went unlogged and its exception "was never retrieved"."""
    loop = asyncio.get_running_loop()
    unretrieved: list[dict[str, Any]] = []
    before = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: unretrieved.append(context))
    events: asyncio.Queue[str] = asyncio.Queue()
    tool_fixtures.OBSERVERS["twice"] = events
    tools = catalog('[[tools]]\nimport = "tests.tool_fixtures:stubborn_then_fails"\n'
                    "timeout_s = 60\n")
    try:
        with caplog.at_level(logging.WARNING, logger="cowrite.tools.test"):
            call = asyncio.create_task(tools.invoke(
                "stubborn_then_fails", {"key": "twice", "seconds": 1.5}, tool_context()))
            await asyncio.sleep(0.1)
            call.cancel()
            await asyncio.wait_for(events.get(), 5)  # it ignored the first cancel
            call.cancel()  # within the grace
            with pytest.raises(asyncio.CancelledError):
                await call
            assert await asyncio.wait_for(events.get(), 5) == "ended"
            await asyncio.sleep(0.05)
            gc.collect()
            await asyncio.sleep(0.05)
    finally:
        loop.set_exception_handler(before)
    assert unretrieved == []
    assert any("ignored its cancellation" in r.getMessage() for r in caplog.records)


def test_broken_entries_are_reported_not_fatal() -> None:
    tools = catalog("""
[[tools]]
import = "tests.no_such_module:tool"
[[tools]]
import = "tests.tool_fixtures:missing"
[[tools]]
import = "tests.tool_fixtures:not_async"
[[tools]]
import = "tests.tool_fixtures:no_hints"
[[tools]]
import = "tests.tool_fixtures:unschemable"
[[tools]]
import = "tests.tool_fixtures:greet"
""")
    described = by_name(tools.describe())
    problems = {name: entry.get("problem") for name, entry in described.items()
                if not entry["available"]}
    assert problems == {
        "tool": "cannot import tests.no_such_module (ModuleNotFoundError)",
        "missing": "tests.tool_fixtures has no attribute missing",
        "not_async": "not an async function (define it with `async def`)",
        "no_hints": "parameter text has no type hint",
        "unschemable": "its type hints have no JSON Schema (PydanticSchemaGenerationError)",
    }
    assert described["greet"]["available"] is True
    assert {s.name for s in tools.specs()} == {"text_stats", "greet"}



def test_a_missing_tool_module_is_one_log_line_a_failing_import_has_its_traceback(
        caplog: pytest.LogCaptureFixture) -> None:
    """A configured module that is not there (a typo, the path not set) says all in one
    line; a module that exists but fails while importing keeps its traceback, which
    names what it could not import."""
    with caplog.at_level(logging.WARNING, logger="cowrite"):
        tools = catalog('[[tools]]\nimport = "tests.no_such_module:tool"\nname = "gone"\n'
                        '[[tools]]\nimport = "tests.imports_missing_dependency:tool"\n'
                        'name = "failing"\n')
    problems = {name: entry.get("problem") for name, entry in by_name(tools.describe()).items()
                if not entry["available"]}
    assert problems == {
        "gone": "cannot import tests.no_such_module (ModuleNotFoundError)",
        "failing": "cannot import tests.imports_missing_dependency (ModuleNotFoundError)"}
    records = {record.getMessage().split(":")[0]: record for record in caplog.records
               if "is unavailable" in record.getMessage()}
    missing = records["tool tests.no_such_module"]
    assert missing.exc_info is None or missing.exc_info[0] is None
    failing = records["tool tests.imports_missing_dependency"]
    assert failing.exc_info is not None and failing.exc_info[1] is not None
    assert "cowrite_no_such_dependency" in str(failing.exc_info[1])


def test_parameters_pydantic_would_drop_are_refused_at_load_time() -> None:
    """They were silently left out of the schema, the tool listed available, and every
    call failed `tool failed (ref ...)`."""
    tools = catalog('[[tools]]\nimport = "tests.tool_fixtures:underscored"\n'
                    '[[tools]]\nimport = "tests.tool_fixtures:configured"\n')
    described = by_name(tools.describe())
    assert described["underscored"]["problem"] == (
        "parameter '_trace' cannot be used: pydantic ignores names that start with an "
        "underscore; rename it")
    assert described["configured"]["problem"] == (
        "parameter 'model_config' cannot be used: pydantic reserves it for its models; "
        "rename it")
    assert {s.name for s in tools.specs()} == {"text_stats"}


async def test_parameters_named_like_model_methods_work() -> None:
    tools = catalog('[[tools]]\nimport = "tests.tool_fixtures:shadowing"\n')
    result = await tools.invoke("shadowing", {"json": 1, "copy": "x"}, tool_context())
    assert result.output == "1 x"


@pytest.mark.parametrize("function", ["maybe_context", "maybe_context_old_style"])
async def test_an_optional_context_parameter_is_the_context(function: str) -> None:
    tools = catalog(f'[[tools]]\nimport = "tests.tool_fixtures:{function}"\n')
    spec = tools.spec(function)
    assert spec is not None and set(spec.parameters["properties"]) == {"text"}
    result = await tools.invoke(function, {"text": "hi"}, tool_context())
    assert result.output == "hi for alice"


def test_a_module_calling_sys_exit_at_import_is_a_problem_not_an_exit() -> None:
    tools = catalog('[[tools]]\nimport = "tests.exits_on_import:tool"\n')
    entry = by_name(tools.describe())["tool"]
    assert entry["available"] is False
    assert entry["problem"] == "cannot import tests.exits_on_import (SystemExit)"


async def test_unavailable_tool_invocation_is_an_error() -> None:
    tools = catalog('[[tools]]\nimport = "tests.tool_fixtures:not_async"\n')
    result = await tools.invoke("not_async", {"text": "x"}, tool_context())
    assert result.status == "error" and result.error is not None
    assert result.error["code"] == "unavailable"
    assert "not an async function" in result.error["message"]


async def test_builtin_text_stats_is_on_by_default_and_can_be_disabled() -> None:
    tools = catalog()
    [entry] = tools.describe()
    assert entry["name"] == "text_stats" and entry["source"] == "builtin"
    assert entry["parameters"]["required"] == ["text"]
    result = await tools.invoke("text_stats", {"text": "One two. Three!\n\nFour"},
                                tool_context())
    assert result.output == {"characters": 21, "words": 4, "sentences": 2, "lines": 3,
                             "paragraphs": 2, "reading_time_s": 1}
    off = catalog('[[tools]]\nimport = "server.tools.builtin:text_stats"\nenabled = false\n')
    assert off.describe() == [] and off.specs() == []
    tuned = catalog('[[tools]]\nimport = "server.tools.builtin:text_stats"\n'
                    'requires_approval = true\n')
    [spec] = tuned.specs()
    assert spec.source == "builtin" and spec.requires_approval


def test_duplicate_names_are_reported_not_shadowed() -> None:
    tools = catalog('[[tools]]\nimport = "tests.tool_fixtures:greet"\nname = "text_stats"\n')
    entries = tools.describe()
    assert [(e["name"], e["source"], e["available"]) for e in entries] == [
        ("text_stats", "builtin", True), ("text_stats", "python", False)]
    assert entries[1]["problem"] == "duplicate name: also defined by builtin"
    assert [s.source for s in tools.specs()] == ["builtin"]



@pytest.mark.parametrize("broken_first", [True, False])
async def test_a_tool_that_cannot_load_never_takes_the_name_of_one_that_works(
        broken_first: bool) -> None:
    """A broken entry listed first claimed the name: both were unavailable, the working
    one reported as a duplicate of the broken one."""
    broken = '[[tools]]\nimport = "tests.no_such_module:greet"\n'
    working = '[[tools]]\nimport = "tests.tool_fixtures:greet"\n'
    tools = catalog(broken + working if broken_first else working + broken)
    entries = [e for e in tools.describe() if e["name"] == "greet"]
    problems = {e["available"]: e.get("problem") for e in entries}
    assert problems == {True: None,
                        False: "cannot import tests.no_such_module (ModuleNotFoundError)"}
    assert "greet" in {s.name for s in tools.specs()}
    result = await tools.invoke("greet", {"name": "Ann"}, tool_context())
    assert result.status == "ok"


def test_two_broken_entries_of_one_name_each_report_their_own_problem() -> None:
    tools = catalog('[[tools]]\nimport = "tests.no_such_module:greet"\n'
                    '[[tools]]\nimport = "tests.exits_on_import:greet"\n')
    assert [e.get("problem") for e in tools.describe() if e["name"] == "greet"] == [
        "cannot import tests.no_such_module (ModuleNotFoundError)",
        "cannot import tests.exits_on_import (SystemExit)"]


def test_disabled_python_tool_is_not_offered() -> None:
    tools = catalog('[[tools]]\nimport = "tests.tool_fixtures:greet"\nenabled = false\n')
    assert [s.name for s in tools.specs()] == ["text_stats"]


@pytest.mark.parametrize(("toml", "message"), [
    ('[[tools]]\nimport = "a:b"\nrequires_aproval = true\n',
     "unknown key tools[0].requires_aproval"),
    ("[[mcp]]\nname = \"x\"\ncommand = [\"y\"]\nurl = \"http://h/mcp\"\n",
     "mcp[0]: give exactly one of `command` (stdio) or `url` (streamable HTTP)"),
    ("[[mcp]]\nname = \"a__b\"\ncommand = [\"y\"]\n", "cannot contain `__`"),
    ("[server]\nport = 1\n", "unknown key server"),
    ('[[workflows]]\nname = "bad name"\n', "workflows[0].name: String should match pattern"),
    ('[[workflows]]\nname = "w"\n[[workflows]]\nname = "w"\n',
     ": duplicate workflow name 'w' ([[workflows]] name)"),
    ('[[tools]]\nimport = "m:f"\n[[tools]]\nimport = "m:f"\nname = "g"\n',
     ": duplicate tool import 'm:f' ([[tools]] import: each function once)"),
    ('[[workflows]]\nname = "w"\nmax_steps = 0\n', "workflows[0].max_steps"),
    ('[[workflows]]\nname = "w"\ntools = ["a"]\napproval = ["b"]\n',
     "`approval` names tools missing from `tools`: b"),
    ('[[workflows]]\nname = "w"\nmode = "chat"\ntools = ["a"]\n', "a chat workflow uses no tools"),
    ('[[tools]]\nimport = "not an import string"\n', "tools[0].import"),
    # values of the wrong TOML type are errors, not converted (they were taken)
    ('[[tools]]\nimport = "x:y"\ntimeout_s = "5"\n', "tools[0].timeout_s"),
    ('[[mcp]]\nname = "a"\ncommand = ["x"]\nrequires_approval = "no"\n',
     "mcp[0].requires_approval"),
    ('[[workflows]]\nname = "w"\nmax_steps = "8"\n', "workflows[0].max_steps"),
])
def test_invalid_config_is_one_clear_line(toml: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(tomllib.loads(toml), "COWRITE_CONFIG f.toml")
    text = str(info.value)
    assert text.startswith("COWRITE_CONFIG f.toml: ") and message in text and "\n" not in text


def test_unreadable_or_missing_or_invalid_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^COWRITE_CONFIG .*nope.toml: no such file$"):
        load_config(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[[tools]\n")
    with pytest.raises(ConfigError, match=r"bad.toml: not valid TOML"):
        load_config(bad)
    latin = tmp_path / "latin.toml"  # was a UnicodeDecodeError traceback at startup
    latin.write_bytes(b'[[workflows]]\nname = "caf\xe9"\n')
    with pytest.raises(ConfigError, match=r"latin.toml: not valid TOML \(not UTF-8\)$"):
        load_config(latin)
    good = tmp_path / "good.toml"
    good.write_text('[[tools]]\nimport = "tests.tool_fixtures:greet"\ntypo = 1\n')
    with pytest.raises(ConfigError, match=r"good.toml: unknown key tools\[0\].typo$"):
        load_config(good)


def test_workflows_are_parsed_with_defaults() -> None:
    tools = catalog("""
[[workflows]]
name = "proofread"
title = "Proofread"
description = "Fix spelling and grammar, nothing else."
category = "editing"
system_prompt = "You proofread."
tools = ["read_document", "replace_text", "files__read_file"]
approval = ["replace_text"]
max_steps = 8
[[workflows]]
name = "chat:quick"
mode = "chat"
""")
    proofread = tools.workflow("proofread")
    assert proofread is not None and proofread.max_steps == 8
    assert proofread.approval == ["replace_text"] and proofread.system_prompt == "You proofread."
    assert [w.public() for w in tools.workflows()] == [
        {"name": "proofread", "title": "Proofread",
         "description": "Fix spelling and grammar, nothing else.", "category": "editing",
         "mode": "agent", "tools": ["read_document", "replace_text", "files__read_file"]},
        {"name": "chat:quick", "title": "chat:quick", "description": "", "category": "general",
         "mode": "chat"},  # no allowlist: `tools` absent, not null
    ]
    assert tools.workflow("nope") is None


def test_mcp_names_and_result_mapping() -> None:
    import mcp.types as mcp_types

    from server.tools.context import ToolError
    from server.tools.mcp_results import cowrite_name, tool_output

    assert cowrite_name("files", "read.file/v2", {}) == "files__read_file_v2"
    assert cowrite_name("files", "read", {"read": "cat"}) == "cat"
    assert cowrite_name("files", "x" * 60, {}) is None  # too long: reported, not truncated
    image = mcp_types.ImageContent(type="image", data="aGVsbG8h", mime_type="image/png")
    text = mcp_types.TextContent(type="text", text="a picture")
    mixed = mcp_types.CallToolResult(content=[text, image])
    assert tool_output(mixed) == [
        {"type": "text", "text": "a picture"},
        {"type": "image", "data": "<6 bytes omitted>", "mimeType": "image/png"}]
    blob = mcp_types.EmbeddedResource(type="resource", resource=mcp_types.BlobResourceContents(
        uri="file:///a.pdf", mime_type="application/pdf", blob="aGVsbG8h"))
    assert tool_output(mcp_types.CallToolResult(content=[text, blob]))[1] == {
        "type": "resource", "resource": {"uri": "file:///a.pdf", "mimeType": "application/pdf",
                                         "blob": "<6 bytes omitted>"}}
    two_texts = mcp_types.CallToolResult(content=[text, text])
    assert tool_output(two_texts) == "a picture\na picture"
    structured = mcp_types.CallToolResult(content=[text], structured_content={"n": 1})
    assert tool_output(structured) == {"n": 1}
    failed = mcp_types.CallToolResult(content=[], is_error=True)
    with pytest.raises(ToolError, match="the MCP tool reported an error"):
        tool_output(failed)
