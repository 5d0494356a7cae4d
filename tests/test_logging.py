"""Logs are structured and never contain a token."""

import io
import json
import logging

import httpx

from tests.harness import joined, running_server, token, ws_client


async def test_log_lines_are_json_with_context_and_no_tokens() -> None:
    async with running_server(log_json=True, log_level="info") as srv:
        stream = io.StringIO()
        handler = logging.getLogger("cowrite").handlers[0]
        handler.setStream(stream)  # type: ignore[attr-defined]
        secret_token = token("eve", docs=["nope"])
        async with ws_client(srv.ws_url()) as client:
            await client.send({"type": "hello", "protocol": 1, "client_id": "t",
                               "token": secret_token})
            await client.expect_close()
        good = token("alice")
        async with joined(srv) as (client, _):
            await client.send({"type": "auth.refresh", "token": good + "x"})
            await client.recv_until("error")
        async with httpx.AsyncClient(base_url=srv.http) as http:
            await http.get("/v1/documents/doc-1/history",
                           headers={"Authorization": "Bearer " + good})
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert any(line.get("document_id") == "doc-1" and line.get("user_id") == "alice" and
               "connection_id" in line for line in lines)
    assert secret_token not in stream.getvalue() and good not in stream.getvalue()
    assert secret_token.split(".")[2] not in stream.getvalue()
