"""HTTP endpoints (PROTOCOL.md section 8) and the refusals before the upgrade."""

import json

import httpx
import pytest
from websockets.exceptions import InvalidStatus

from protocol.schema import SCHEMA_PATH, render_schema
from tests.harness import Server, joined, running_server, token, ws_client
from tests.runs import call, script, start


async def test_health_ready_metrics_and_page(server: Server) -> None:
    async with httpx.AsyncClient(base_url=server.http) as http:
        assert (await http.get("/healthz")).json() == {"status": "ok"}
        ready = await http.get("/readyz")
        assert ready.status_code == 200
        page = await http.get("/")
        assert page.status_code == 200 and "cowrite" in page.text
        typings = await http.get("/static/client.d.ts")  # was Qt's text/vnd.trolltech.linguist
        assert typings.headers["content-type"].startswith("application/typescript")
        script_file = await http.get("/static/client.js")
        assert script_file.headers["content-type"].startswith("text/javascript")
        async with joined(server):
            metrics = (await http.get("/metrics")).text
        assert "cowrite_connections_open 1.0" in metrics
        assert 'cowrite_messages_in_total{type="hello"} 1.0' in metrics
        assert 'cowrite_messages_out_total{type="welcome"} 1.0' in metrics


async def test_errors_the_run_engine_sends_are_counted(server: Server) -> None:
    """`cowrite_errors_total` counted only errors made by the connection, not those the
    run engine answers with (a result for no pending call, a bad call token)."""
    async with joined(server) as (client, _), httpx.AsyncClient(base_url=server.http) as http:
        ack = await start(client, script({"tool_calls": [call("read_document")]}, {"say": "d"}))
        pending = await client.recv_until("tool.call")
        await client.send({"type": "tool.result", "id": "a", "run_id": ack["run_id"],
                           "call_id": "nope", "token": pending["token"], "output": 1})
        await client.send({"type": "tool.result", "id": "b", "run_id": ack["run_id"],
                           "call_id": pending["call_id"], "token": pending["token"][:-3] + "xxx",
                           "output": 1})
        first = await client.recv_until(lambda e: e.get("reply_to") == "a")
        second = await client.recv_until(lambda e: e.get("reply_to") == "b")
        assert [first["code"], second["code"]] == ["call_not_pending", "invalid_token"]
        metrics = (await http.get("/metrics")).text
    assert 'cowrite_errors_total{code="call_not_pending"} 1.0' in metrics
    assert 'cowrite_errors_total{code="invalid_token"} 1.0' in metrics


async def test_schema_is_served_and_checked_in_copy_is_current(server: Server) -> None:
    async with httpx.AsyncClient(base_url=server.http) as http:
        served = (await http.get("/v1/protocol/schema")).json()
    assert SCHEMA_PATH.read_text() == render_schema(), "run `python -m protocol.schema`"
    assert served == json.loads(SCHEMA_PATH.read_text())
    client_types = {d["properties"]["type"]["const"] for d in served["$defs"].values()
                    if "type" in d.get("properties", {})}
    assert {"hello", "run.start", "tool.result", "approval", "auth.refresh", "run.cancel",
            "editor.change", "ping", "welcome", "run.finished", "document.changed"} <= client_types


async def test_dev_token_only_in_dev_mode() -> None:
    async with running_server() as srv, httpx.AsyncClient(base_url=srv.http) as http:
        assert (await http.post("/v1/dev/token", json={"user": "bob"})).status_code == 404
    async with running_server(dev=True) as srv, httpx.AsyncClient(base_url=srv.http) as http:
        bad = await http.post("/v1/dev/token", json={"user": ""})
        assert bad.status_code == 422
        issued = (await http.post("/v1/dev/token", json={"user": "bob", "docs": ["d1"]})).json()
        principal = srv.services.auth.verify(issued["token"])
        assert principal.user_id == "bob" and principal.may_open("d1")
        assert not principal.may_open("d2")


async def test_history_requires_a_token_for_the_document(server: Server) -> None:
    async with httpx.AsyncClient(base_url=server.http) as http:
        url = "/v1/documents/doc-1/history"
        assert (await http.get(url)).status_code == 401
        assert (await http.get(url, headers={"Authorization": "Bearer nope"})).status_code == 401
        foreign = {"Authorization": f"Bearer {token(docs=['other'])}"}
        assert (await http.get(url, headers=foreign)).status_code == 403
        ok = await http.get(url, headers={"Authorization": f"Bearer {token()}"})
        assert ok.json() == {"document_id": "doc-1", "thread_id": "main", "messages": [],
                             "more": False}


@pytest.mark.parametrize("document_id", ["bad%20id", "a" * 129, "x%2Fy"])
async def test_malformed_document_id_is_404_before_upgrade(server: Server, document_id: str
                                                           ) -> None:
    with pytest.raises(InvalidStatus) as info:
        async with ws_client(server.ws_url(document_id)):
            pass
    assert info.value.response.status_code == 404


async def test_origin_allow_list() -> None:
    async with running_server(allowed_origins="https://app.example") as srv:
        with pytest.raises(InvalidStatus) as info:
            async with ws_client(srv.ws_url(), origin="https://evil.example"):
                pass
        assert info.value.response.status_code == 403
        async with joined(srv, origin="https://app.example"):
            pass
        async with joined(srv):  # no Origin header: a non-browser client
            pass


async def test_subprotocol_selected_when_offered(server: Server) -> None:
    async with joined(server, subprotocols=["cowrite.v1"]) as (client, _):
        assert client.ws.subprotocol == "cowrite.v1"
    async with joined(server) as (client, _):
        assert client.ws.subprotocol is None


async def test_history_is_a_503_to_retry_while_the_backend_is_down(
        server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    from server.backends.base import BackendUnavailable

    async def down(_document_id: str) -> list[dict[str, object]]:
        raise BackendUnavailable("redis is down")

    monkeypatch.setattr(server.services.backend, "read_history", down)
    headers = {"Authorization": f"Bearer {token()}"}
    async with httpx.AsyncClient() as http:
        for path in ("history", "threads"):
            answer = await http.get(f"{server.http}/v1/documents/doc-1/{path}", headers=headers)
            assert answer.status_code == 503 and answer.headers["retry-after"] == "1"
            assert "redis" not in answer.text and "retry" in answer.json()["error"]
