"""`pattern` and `patternProperties` of a client's tools run on RE2, in linear time: an
argument crafted against a backtracking pattern (`^(a+)+$`, the reviewer's attack) is
answered "does not match" at once instead of freezing the instance, whether the model
sent it or the user's approval edited it in; a pattern RE2 cannot run (lookaround,
backreference) is refused at run.start, through the adapters too."""

import asyncio
from typing import Any

import httpx
import orjson
import pytest

from bench.common import server_process
from server.agent.tools import ToolBox, check_tool_schemas
from server.tools.schemas import PATTERN_TEXT_MAX, argument_check
from tests.adapter_support import sse, user_message
from tests.cluster_support import join
from tests.harness import SECRET, Server, joined, token
from tests.runs import answer, call, of_run, script, start

EVIL = "a" * 40 + "!"  # ~2^40 steps for a backtracking engine
BOUND_S = 30  # how long a test waits for a server that froze (the bug): it fails, not hangs
LOOKUP = {"name": "lookup", "description": "Look something up.",
          "parameters": {"type": "object", "required": ["x"],
                         "properties": {"x": {"type": "string", "pattern": "^(a+)+$"}}}}
GUARDED = {**LOOKUP, "name": "guarded", "requires_approval": True}


def _tool(name: str, parameters: dict[str, Any]) -> Any:
    from protocol.client import ToolSpec

    return ToolSpec(name=name, description="", parameters=parameters)


async def _history(http: httpx.AsyncClient, base: str) -> list[dict[str, Any]]:
    response = await http.get(f"{base}/v1/documents/doc-1/history",
                              headers={"Authorization": f"Bearer {token()}"})
    assert response.status_code == 200, response.text
    messages: list[dict[str, Any]] = response.json()["messages"]
    return messages


def _tool_messages(messages: list[dict[str, Any]], run_id: str) -> list[Any]:
    """What the model was told of each call: the output, or the error's message."""
    told = [orjson.loads(m["content"]) for m in messages
            if m["role"] == "tool" and m["run_id"] == run_id]
    return [t["error"]["message"] if isinstance(t, dict) and "error" in t else t for t in told]


# -- the reviewer's attack, against a `python -m server` (a frozen one fails the wait) --------

@pytest.mark.timeout(120)
async def test_an_evil_argument_from_the_model_is_refused_without_freezing() -> None:
    async with server_process("cowrite", COWRITE_JWT_SECRET=SECRET) as proc, \
            join(proc) as (client, _), httpx.AsyncClient() as http:
        base = proc.url("", "http")

        async def attack() -> None:
            ack = await start(client, script({"tool_calls": [call("lookup", x=EVIL)]},
                                             {"say": "Done."}), tools=[LOOKUP])
            finished = await client.recv_until(
                lambda e: e.get("type") == "run.finished" and e["run_id"] == ack["run_id"])
            assert finished["status"] == "completed"
            assert of_run(client.events, ack["run_id"], "tool.call") == []
            assert (await http.get(f"{base}/healthz")).status_code == 200
            told = _tool_messages(await _history(http, base), ack["run_id"])
            assert told == [f"invalid arguments for lookup at x: {EVIL!r} does not match "
                            "'^(a+)+$'"], told

        await asyncio.wait_for(attack(), BOUND_S)


@pytest.mark.timeout(120)
async def test_an_evil_argument_edited_into_an_approval_is_refused_without_freezing() -> None:
    async with server_process("cowrite", COWRITE_JWT_SECRET=SECRET) as proc, \
            join(proc) as (client, _), httpx.AsyncClient() as http:
        base = proc.url("", "http")

        async def attack() -> None:
            ack = await start(client, script({"tool_calls": [call("guarded", x="aaa")]},
                                             {"say": "Done."}), tools=[GUARDED])
            asked = await client.recv_until("approval.requested")
            approval = {"type": "approval", "run_id": ack["run_id"],
                        "call_id": asked["call_id"], "decision": "approve"}
            await client.send({**approval, "id": "evil", "arguments": {"x": EVIL}})
            refused = await client.recv_until(lambda e: e.get("reply_to") == "evil")
            assert (refused["type"], refused["code"]) == ("error", "invalid_message"), refused
            assert "does not match" in refused["message"], refused
            assert (await http.get(f"{base}/healthz")).status_code == 200
            # the call still waits for its approval: a valid edit goes through
            await client.send({**approval, "id": "fine", "arguments": {"x": "aaaa"}})
            tool_call = await client.recv_until("tool.call")
            assert tool_call["arguments"] == {"x": "aaaa"}
            await answer(client, tool_call, "found")
            finished = await client.recv_until("run.finished")
            assert finished["status"] == "completed"

        await asyncio.wait_for(attack(), BOUND_S)


# -- the semantics kept: unanchored ECMA-262 search, patternProperties ------------------------

CODES = {"name": "codes", "description": "Codes.", "parameters": {
    "type": "object",
    "properties": {"code": {"type": "string", "pattern": "b+"},
                   "letter": {"type": "string", "pattern": "^\\u0041$"},
                   "labels": {"type": "object", "patternProperties": {"^x-": {"type": "integer"}},
                              "additionalProperties": False},
                   "names": {"type": "object", "propertyNames": {"pattern": "^[a-z]+$"}}}}}


async def test_patterns_still_match_and_refuse(server: Server) -> None:
    calls = [call("codes", code="abbbc", letter="A", labels={"x-a": 1}, names={"ok": 1}),
             call("codes", code="ac"), call("codes", letter="B"),
             call("codes", labels={"x-a": "one"}), call("codes", labels={"y": 1}),
             call("codes", names={"Bad": 1})]
    async with joined(server) as (client, _), httpx.AsyncClient() as http:
        ack = await start(client, script(*({"tool_calls": [c]} for c in calls),
                                         {"say": "Done."}), tools=[CODES])
        tool_call = await client.recv_until("tool.call")
        assert tool_call["arguments"] == calls[0]["arguments"]
        await answer(client, tool_call, "ok")
        finished = await client.recv_until("run.finished")
        assert finished["status"] == "completed"
        assert len(of_run(client.events, ack["run_id"], "tool.call")) == 1
        told = _tool_messages(await _history(http, server.http), ack["run_id"])
    assert told == ["ok",
        "invalid arguments for codes at code: 'ac' does not match 'b+'",
        "invalid arguments for codes at letter: 'B' does not match '^\\\\u0041$'",
        "invalid arguments for codes at labels/x-a: 'one' is not of type 'integer'",
        "invalid arguments for codes at labels: 'y' does not match any of the regexes: '^x-'",
        "invalid arguments for codes at names: 'Bad' does not match '^[a-z]+$'",
    ], told


@pytest.mark.timeout(60)  # on `re` (the bug) it never would: failed by the timeout
def test_the_evil_pattern_answers_at_once_in_process() -> None:
    check = argument_check("lookup", LOOKUP["parameters"])  # type: ignore[arg-type]
    assert callable(check)
    assert check({"x": EVIL}) == f"invalid arguments for lookup at x: {EVIL!r} does not " \
        "match '^(a+)+$'"
    assert check({"x": "a" * 40}) is None
    evil_key = {"type": "object", "patternProperties": {"^(a+)+$": {"type": "integer"}},
                "additionalProperties": False}
    keys = argument_check("keys", evil_key, untrusted=True)
    assert callable(keys)
    assert keys({"a" * 40: 1}) is None
    assert "does not match any of the regexes" in str(keys({EVIL: 1}))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("where", ["root", "subschema", "ref"])
def test_a_subschema_naming_another_draft_still_searches_on_re2(where: str) -> None:
    """jsonschema picks the validator class again in every subschema with a `$schema`
    (and in the metaschemas a `$ref` reaches): a stock class there would search on `re`.
    The engine is told by `\\d`: ASCII on RE2 (as in ECMA-262), any digit on `re`."""
    digit: dict[str, Any] = {"$schema": "http://json-schema.org/draft-07/schema#",
                             "type": "string", "pattern": "^\\d$"}
    schema: dict[str, Any] = {
        "root": {**digit, "type": "object", "properties": {"x": {"pattern": "^\\d$"}}},
        "subschema": {"type": "object", "properties": {"x": digit}},
        "ref": {"type": "object", "$defs": {"d": digit}, "properties": {"x": {
            "$ref": "#/$defs/d"}}}}[where]
    check = argument_check("t", schema, untrusted=True)
    assert callable(check)
    assert check({"x": "7"}) is None
    assert check({"x": "\u0663"}) == "invalid arguments for t at x: '\u0663' does not match " \
        "'^\\\\d$'"
    evil = {**schema, "properties": {"x": {**digit, "pattern": "^(a+)+$"}}}
    evil_check = argument_check("t", evil, untrusted=True)
    assert callable(evil_check) and "does not match" in str(evil_check({"x": EVIL}))


# -- what RE2 cannot run is refused up front in a client tool --------------------------------

LOOKAROUND = {"name": "peek", "description": "Peek.", "parameters": {
    "type": "object", "properties": {"q": {"type": "object", "patternProperties": {
        "^(?!secret)": {"type": "string"}}}}}}
PEEK_REFUSED = "tools.peek.parameters is not usable: the pattern at " \
    "/properties/q/patternProperties/^(?!secret) cannot run on RE2"


def test_patterns_re2_cannot_run_are_named_with_their_tool_and_path() -> None:
    backref = _tool("echo", {"type": "object", "properties": {
        "w": {"type": "string", "pattern": "^(a)\\1$"}}})
    problem = check_tool_schemas([backref])
    assert problem is not None and problem.startswith(
        "tools.echo.parameters is not usable: the pattern at /properties/w/pattern cannot "
        "run on RE2 (invalid escape sequence: \\1); client tool patterns run on RE2: no "
        "lookaround, no backreferences, counted repeats up to 1000"), problem
    peek = check_tool_schemas([_tool("peek", LOOKAROUND["parameters"])])  # type: ignore[arg-type]
    assert peek is not None and peek.startswith(f"{PEEK_REFUSED} (invalid perl operator: "
                                                "(?!)"), peek
    both = _tool("both", {"type": "object", "patternProperties": {"^x": {}},
                          "unevaluatedProperties": False})
    assert "unevaluatedProperties" in str(check_tool_schemas([both]))
    # a run restored from before the check (a takeover by a newer instance): refused calls
    box = ToolBox([backref], None)
    assert box.check("echo", {"w": "aa"}) == \
        "tool echo cannot be called: its input schema cannot be used: the pattern at " \
        "/properties/w/pattern cannot run on RE2 (invalid escape sequence: \\1); client " \
        "tool patterns run on RE2: no lookaround, no backreferences, counted repeats up to 1000"


def test_operator_schemas_keep_python_patterns() -> None:
    check = argument_check("server_tool", {"type": "object", "properties": {
        "w": {"type": "string", "pattern": "^(?!secret)"}}})
    assert callable(check)
    assert check({"w": "public"}) is None
    assert "does not match" in str(check({"w": "secret"}))


async def test_a_client_tool_with_a_lookaround_is_refused_at_run_start(server: Server) -> None:
    async with joined(server) as (client, _):
        await client.send({"type": "run.start", "id": "s", "prompt": script({"say": "no"}),
                           "tools": [LOOKAROUND]})
        refused = await client.recv_until(lambda e: e.get("reply_to") == "s")
        assert (refused["type"], refused["code"]) == ("error", "invalid_message"), refused
        assert refused["message"].startswith(PEEK_REFUSED), refused
        assert not [e for e in client.events if e.get("type") == "run.started"]


async def test_the_adapters_refuse_a_lookaround_tool_too(server: Server) -> None:
    async with httpx.AsyncClient() as http:
        status, items = await sse(http, "POST", f"{server.http}/v1/ai-sdk/doc-2/chat", {
            "id": "c1", "messages": [user_message(script({"say": "no"}))],
            "tools": [LOOKAROUND]})
        assert status == 400 and items[0]["code"] == "invalid_message", items
        assert items[0]["message"].startswith(PEEK_REFUSED)
        status, items = await sse(http, "POST", f"{server.http}/v1/agui/doc-3", {
            "threadId": "t1", "runId": "agui-1", "state": {}, "context": [],
            "forwardedProps": {}, "tools": [LOOKAROUND],
            "messages": [{"id": "m1", "role": "user", "content": script({"say": "no"})}]})
        assert status == 400 and items[0]["code"] == "invalid_message", items
        assert items[0]["message"].startswith(PEEK_REFUSED)


def test_patterns_that_make_re2_slow_are_refused_and_long_strings_bounded() -> None:
    """A review found a pattern RE2 can compile but not run fast within a small memory
    budget: `(a|aa){1,1000}$` against 900,000 characters froze an instance for 38 s
    (RE2's slow path, microseconds per character). A client pattern's program is now
    bounded (`PROGRAM_SIZE_MAX`, refused at run.start with the tool named), RE2 gets its
    default 8 MiB, and no string over `PATTERN_TEXT_MAX` is searched at all."""
    for pattern in ("(a|aa){1,1000}$", "a.{800}b"):
        slow = _tool("slow", {"type": "object", "properties": {
            "x": {"type": "string", "pattern": pattern}}})
        problem = check_tool_schemas([slow])
        assert problem is not None and "is too large for a client tool" in problem, problem
        assert "/properties/x/pattern" in problem
    dated = argument_check("d", {"type": "object", "properties": {
        "x": {"type": "string", "pattern": "^[a-z]{1,500}$"}}}, untrusted=True)
    assert callable(dated)
    assert dated({"x": "a" * 500}) is None
    long = dated({"x": "a" * (PATTERN_TEXT_MAX + 1)})
    assert long == f"invalid arguments for d at x: a string of {PATTERN_TEXT_MAX + 1} " \
        f"characters is longer than {PATTERN_TEXT_MAX}, the most a pattern is checked against"
