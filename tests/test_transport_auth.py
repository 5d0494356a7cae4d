"""Authentication and authorization (PROTOCOL.md section 2), over real sockets."""

import asyncio
import time

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from tests.harness import SECRET, Server, joined, running_server, token, ws_client


async def hello_and_close_code(server: Server, hello_token: str | None, document_id: str = "doc-1",
                               **kwargs: object) -> tuple[list[dict[str, object]], int | None]:
    async with ws_client(server.ws_url(document_id), **kwargs) as client:
        message: dict[str, object] = {"type": "hello", "protocol": 1, "client_id": "t"}
        if hello_token is not None:
            message["token"] = hello_token
        await client.send(message)
        code = await client.expect_close()
        return client.events, code


@pytest.mark.parametrize(
    ("make_token", "expected_close"),
    [
        (lambda: None, 4001),
        (lambda: "not-a-jwt", 4001),
        (lambda: token(secret="another-secret-of-sufficient-length!"), 4001),
        (lambda: token(ttl_s=-10), 4001),
        (lambda: jwt.encode({"sub": "a", "docs": ["*"]}, SECRET, algorithm="HS256"), 4001),
        (lambda: token(docs=[]), 4003),
        (lambda: jwt.encode({"sub": "a", "exp": int(time.time()) + 60}, SECRET,
                            algorithm="HS256"), 4003),
        (lambda: token(docs=["doc-2"]), 4003),
    ],
    ids=["missing", "garbage", "wrong-secret", "expired", "no-exp", "empty-docs", "no-docs",
         "foreign-doc"],
)
async def test_bad_tokens_close_before_anything_is_sent(
    server: Server, make_token: object, expected_close: int
) -> None:
    events, code = await hello_and_close_code(server, make_token())  # type: ignore[operator]
    assert code == expected_close
    assert [e["type"] for e in events] == ["error"]  # nothing about the document
    assert events[0]["code"] in {"invalid_token", "forbidden"}


async def test_bearer_header_and_wildcard_docs(server: Server) -> None:
    headers = {"Authorization": f"Bearer {token('carol', docs=['doc-9'])}"}
    async with ws_client(server.ws_url("doc-9"), additional_headers=headers) as client:
        await client.send({"type": "hello", "protocol": 1, "client_id": "t"})
        welcome = await client.recv()
    assert welcome["type"] == "welcome" and welcome["user_id"] == "carol"
    assert welcome["role"] == "editor" and welcome["document_id"] == "doc-9"


async def test_audience_is_enforced_when_configured() -> None:
    async with running_server(jwt_audience="cowrite") as srv:
        _, code = await hello_and_close_code(srv, token())
        assert code == 4001
        async with ws_client(srv.ws_url()) as client:
            await client.send({"type": "hello", "protocol": 1, "client_id": "t",
                               "token": token(aud="cowrite")})
            assert (await client.recv())["type"] == "welcome"


@pytest.mark.parametrize("algorithm", ["RS256", "ES256"])
async def test_public_key_verification(algorithm: str) -> None:
    key = (rsa.generate_private_key(public_exponent=65537, key_size=2048)
           if algorithm == "RS256" else ec.generate_private_key(ec.SECP256R1()))
    public_pem = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    signed = jwt.encode({"sub": "dana", "docs": ["*"], "exp": int(time.time()) + 60}, key,
                        algorithm=algorithm)
    async with running_server(jwt_public_key=public_pem, jwt_secret=None) as srv:
        async with ws_client(srv.ws_url()) as client:
            await client.send({"type": "hello", "protocol": 1, "client_id": "t", "token": signed})
            assert (await client.recv())["user_id"] == "dana"
        _, code = await hello_and_close_code(srv, token())  # an HS256 token is refused
        assert code == 4001


async def test_hello_rules() -> None:
    async with running_server(hello_timeout_s=0.3) as srv:
        async with ws_client(srv.ws_url()) as client:  # silence
            assert await client.expect_close() == 4001
        async with ws_client(srv.ws_url()) as client:  # not hello first
            await client.send({"type": "ping", "id": "p1"})
            assert await client.expect_close() == 4001
            assert client.events[0]["code"] == "not_ready"
            assert client.events[0]["reply_to"] == "p1"
        async with ws_client(srv.ws_url()) as client:  # hello failing the schema
            await client.send({"type": "hello", "protocol": 2, "client_id": "t", "token": token()})
            assert await client.expect_close() == 4001
            assert client.events[0]["code"] == "invalid_message"
            assert client.events[0]["details"][0]["loc"] == ["protocol"]
        async with ws_client(srv.ws_url()) as client:  # binary first frame
            await client.ws.send(b"\x00\x01")
            assert await client.expect_close() == 4001
            assert client.events[0]["code"] == "invalid_message"


async def test_token_expiry_closes_unless_refreshed(server: Server) -> None:
    async with ws_client(server.ws_url()) as client:
        await client.send({"type": "hello", "protocol": 1, "client_id": "t",
                           "token": token(ttl_s=1.5)})
        await client.recv_until("welcome")
        await client.send({"type": "auth.refresh", "id": "r1", "token": token(ttl_s=600)})
        ack = await client.recv_until("ack")
        assert ack["reply_to"] == "r1"
        await asyncio.sleep(2.0)  # past the first token's exp: still open
        await client.send({"type": "ping", "ts": 1})
        assert (await client.recv_until("pong"))["ts"] == 1

    async with ws_client(server.ws_url()) as client:
        await client.send({"type": "hello", "protocol": 1, "client_id": "t",
                           "token": token(ttl_s=1.5)})
        await client.recv_until("welcome")
        # refused refreshes leave the old token in force, so the expiry still closes
        await client.send({"type": "auth.refresh", "id": "r2", "token": token("mallory")})
        assert (await client.recv_until("error"))["code"] == "forbidden"
        await client.send({"type": "auth.refresh", "id": "r3", "token": "junk"})
        assert (await client.recv_until("error"))["code"] == "invalid_token"
        assert await client.expect_close(timeout=4) == 4001


async def test_viewer_receives_but_may_not_write(server: Server) -> None:
    async with joined(server, sub="vic", role="viewer") as (viewer, welcome), \
            joined(server, sub="ed", client_id="tab-2") as (editor, _):
        assert welcome["role"] == "viewer"
        for message in (
            {"type": "editor.change", "id": "v1"},
            {"type": "run.start", "id": "v2", "prompt": "hi"},
            {"type": "run.cancel", "id": "v3", "run_id": "r"},
        ):
            await viewer.send(message)
            error = await viewer.recv_until("error")
            assert error["code"] == "forbidden" and error["reply_to"] == message["id"]
        await viewer.send({"type": "ping"})
        await viewer.recv_until("pong")
        await editor.send({"type": "editor.change", "document_version": 3})
        changed = await viewer.recv_until("document.changed")
        assert changed["user_id"] == "ed" and changed["document_version"] == 3


async def test_connection_cap_per_user() -> None:
    async with running_server(max_connections_per_user=2) as srv:
        async with joined(srv, client_id="a"), joined(srv, client_id="b"):
            async with ws_client(srv.ws_url()) as third:
                await third.send({"type": "hello", "protocol": 1, "client_id": "c",
                                  "token": token()})
                assert await third.expect_close() == 4008
                assert third.events[0]["code"] == "rate_limited"
                assert third.events[0]["retry_after_ms"] > 0
            async with joined(srv, sub="bob"):  # other users are not affected
                pass
        async with joined(srv, client_id="d"):  # slots are released on disconnect
            pass


async def test_an_exp_too_large_for_a_float_is_refused(server: Server) -> None:
    huge = jwt.encode({"sub": "alice", "docs": ["*"], "exp": 10**400}, SECRET, algorithm="HS256")
    async with ws_client(server.ws_url()) as client:
        await client.send({"type": "hello", "protocol": 1, "client_id": "t", "token": huge})
        assert await client.expect_close() == 4001


async def test_before_the_hello_a_frame_is_at_most_64_kib(server: Server) -> None:
    """Nobody is known before the hello: a larger first frame fails the connection
    (1009) instead of being buffered (256 handshaking sockets of 4 MiB held ~1 GB);
    after the hello, frames up to the configured size pass as before."""
    from server.wsprotocol import HELLO_MAX_BYTES

    async with ws_client(server.ws_url()) as client:
        await client.ws.send("x" * (HELLO_MAX_BYTES + 1))
        assert await client.expect_close() == 1009
    big_context = {"document": {"text": "y" * 500_000}}  # 500 KB, under 1 MiB
    async with joined(server) as (client, _):
        await client.send({"type": "run.start", "id": "s", "prompt": "hi", "tools": [],
                           "context": big_context})
        ack = await client.recv_until(lambda e: e.get("reply_to") == "s")
        assert ack["type"] == "ack"
        await client.recv_until("run.finished")
