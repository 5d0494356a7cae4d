"""`POST /v1/documents/{id}/runs/{run_id}/tool-results` over a real server:
a pending client tool call answered by HTTP instead of the WebSocket."""

import asyncio
from typing import Any

import httpx
import orjson

from protocol.codes import ErrorCode
from server.adapters.http import HttpFailure
from tests.harness import Server, joined, running_server, token
from tests.runs import call, of_run, script, start


def _url(server: Server, run_id: str, document_id: str = "doc-1") -> str:
    return f"{server.http}/v1/documents/{document_id}/runs/{run_id}/tool-results"


def _auth(sub: str = "alice", **claims: Any) -> dict[str, str]:
    return {"Authorization": f"Bearer {token(sub, **claims)}"}


PROMPT = script({"say": "Reading.", "tool_calls": [call("read_document")]}, {"say": "Done."})


async def test_accepted_then_duplicate_and_the_run_goes_on(server: Server) -> None:
    two_calls = script({"tool_calls": [call("read_document")]},
                       {"tool_calls": [call("insert_text", text="!")]}, {"say": "Done."})
    async with joined(server) as (client, _), httpx.AsyncClient() as http:
        ack = await start(client, two_calls)
        tool_call = await client.recv_until("tool.call")
        body = {"call_id": tool_call["call_id"], "token": tool_call["token"],
                "output": {"text": "hello"}}
        first = await http.post(_url(server, ack["run_id"]), json=body, headers=_auth())
        assert (first.status_code, first.json()) == (200, {"status": "accepted"})
        done = await client.recv_until("tool.done")
        assert done["status"] == "ok" and done["output"] == {"text": "hello"}
        second = await client.recv_until("tool.call")  # the run waits on its next call
        again = await http.post(_url(server, ack["run_id"]), json=body, headers=_auth())
        assert (again.status_code, again.json()) == (200, {"duplicate": True})
        assert len(of_run(client.events, ack["run_id"], "tool.done")) == 1
        answered = await http.post(_url(server, ack["run_id"]), headers=_auth(), json={
            "call_id": second["call_id"], "token": second["token"], "output": "ok"})
        assert answered.json() == {"status": "accepted"}
        finished = await client.recv_until("run.finished")
        assert finished["status"] == "completed"


async def test_refusals_leave_the_call_pending(server: Server) -> None:
    async with joined(server) as (client, _), httpx.AsyncClient() as http:
        ack = await start(client, PROMPT)
        tool_call = await client.recv_until("tool.call")
        url = _url(server, ack["run_id"])
        good = {"call_id": tool_call["call_id"], "token": tool_call["token"], "output": 1}

        wrong = await http.post(url, json={**good, "token": good["token"][:-2] + "xx"},
                                headers=_auth())
        assert wrong.status_code == 403 and wrong.json()["code"] == "invalid_token"
        foreign = await http.post(url, json=good, headers=_auth("mallory"))
        assert foreign.status_code == 403 and foreign.json()["code"] == "invalid_token"
        other_doc = await http.post(url, json=good, headers=_auth(docs=["elsewhere"]))
        assert other_doc.status_code == 403 and other_doc.json()["code"] == "forbidden"
        viewer = await http.post(url, json=good, headers=_auth(role="viewer"))
        assert viewer.status_code == 403 and viewer.json()["code"] == "forbidden"
        no_jwt = await http.post(url, json=good)
        assert no_jwt.status_code == 401 and no_jwt.json()["code"] == "invalid_token"
        no_call_token = await http.post(url, json={"call_id": good["call_id"], "output": 1},
                                        headers=_auth())
        assert no_call_token.status_code == 400
        assert no_call_token.json()["code"] == "invalid_message"
        assert any(d["loc"] == ["token"] for d in no_call_token.json()["details"])
        not_pending = await http.post(url, json={**good, "call_id": "nope"}, headers=_auth())
        assert not_pending.status_code == 409 and not_pending.json()["code"] == "call_not_pending"
        unknown = await http.post(_url(server, "run_none"), json=good, headers=_auth())
        assert unknown.status_code == 404 and unknown.json()["code"] == "run_not_found"
        # a run id no run can have is the path's fault, not the body's ("invalid body")
        long_id = await http.post(_url(server, "r" * 200), json=good, headers=_auth())
        assert long_id.status_code == 404 and long_id.json()["code"] == "run_not_found"

        malformed = await http.post(url, content=b"{not json", headers=_auth())
        assert malformed.status_code == 400 and malformed.json()["code"] == "invalid_message"
        both = await http.post(url, json={**good, "error": {"message": "x"}}, headers=_auth())
        assert both.status_code == 400 and both.json()["code"] == "invalid_message"
        extra = await http.post(url, json={**good, "run_id": "other"}, headers=_auth())
        assert extra.status_code == 400 and extra.json()["code"] == "invalid_message"
        deep: Any = 1
        for _ in range(server.settings.max_json_depth + 1):
            deep = [deep]
        too_deep = await http.post(url, json={**good, "output": deep}, headers=_auth())
        assert too_deep.status_code == 400 and too_deep.json()["code"] == "invalid_message"
        assert "deeper" in too_deep.json()["message"]
        big = "x" * (server.settings.max_message_bytes + 1)
        oversized = await http.post(url, json={**good, "output": big}, headers=_auth())
        assert oversized.status_code == 413 and oversized.json()["code"] == "too_large"

        # None of that touched the call: the right result is still accepted.
        assert of_run(client.events, ack["run_id"], "tool.done") == []
        accepted = await http.post(url, json=good, headers=_auth())
        assert accepted.json() == {"status": "accepted"}
        assert (await client.recv_until("run.finished"))["status"] == "completed"


async def test_error_result_and_finished_run(server: Server) -> None:
    async with joined(server) as (client, _), httpx.AsyncClient() as http:
        ack = await start(client, PROMPT)
        tool_call = await client.recv_until("tool.call")
        url = _url(server, ack["run_id"])
        failed = await http.post(url, headers=_auth(), json={
            "call_id": tool_call["call_id"], "token": tool_call["token"],
            "error": {"message": "no editor", "code": "gone"}})
        assert failed.json() == {"status": "accepted"}
        done = await client.recv_until("tool.done")
        assert done["status"] == "error" and done["error"]["message"] == "no editor"
        await client.recv_until("run.finished")

        ack2 = await start(client, PROMPT, run_id="run-second")
        call2 = await client.recv_until(lambda e: e.get("type") == "tool.call"
                                        and e["run_id"] == "run-second")
        await client.send({"type": "run.cancel", "run_id": ack2["run_id"]})
        await client.recv_until(lambda e: e.get("type") == "run.finished"
                                and e["run_id"] == "run-second")
        late = await http.post(_url(server, "run-second"), headers=_auth(), json={
            "call_id": call2["call_id"], "token": call2["token"], "output": None})
        assert late.status_code == 409 and late.json()["code"] == "run_not_active"


def test_engine_errors_map_to_http_statuses() -> None:
    """rate_limited and unavailable carry Retry-After (seconds, rounded up)."""
    limited = HttpFailure(ErrorCode.RATE_LIMITED, "slow down", retry_after_ms=1500).response()
    assert limited.status_code == 429 and limited.headers["Retry-After"] == "2"
    down = HttpFailure(ErrorCode.UNAVAILABLE, "later", retry_after_ms=1000).response()
    assert down.status_code == 503 and down.headers["Retry-After"] == "1"
    assert orjson.loads(down.body) == {"code": "unavailable", "message": "later",
                                       "retry_after_ms": 1000}


async def test_made_up_runs_make_no_documents_and_results_are_rate_limited() -> None:
    """Each POST joined its document before the run was looked up: made-up run ids on
    made-up documents made documents, and the memory backend evicted idle ones, their
    history with them, for them. Nothing limited the endpoint's rate."""
    async with running_server(memory_max_documents=5, rate_messages_per_s=5) as srv, \
            httpx.AsyncClient() as http:
        async with joined(srv, "victim") as (client, _):
            await start(client, script({"say": "kept"}))
            await client.recv_until("run.finished")
        history = f"{srv.http}/v1/documents/victim/history"
        assert len((await http.get(history, headers=_auth())).json()["messages"]) == 2
        body = {"call_id": "c", "token": "t", "output": 1}
        answers = []
        for n in range(30):
            reply = await http.post(_url(srv, f"run-{n}", f"junk-{n}"), json=body,
                                    headers=_auth())
            answers.append(reply.status_code)
            if reply.status_code == 429:
                assert reply.json()["code"] == "rate_limited"
                assert int(reply.headers["Retry-After"]) >= 1
                await asyncio.sleep(reply.json()["retry_after_ms"] / 1000)
        assert set(answers) == {404, 429} and answers[:10] == [404] * 10  # burst: 2x rate
        assert len((await http.get(history, headers=_auth())).json()["messages"]) == 2
        other_user = await http.post(_url(srv, "run-x", "junk-x"), json=body,
                                     headers=_auth("bob"))
        assert other_user.status_code == 404  # the limit is per user
