"""`python -m bench.edges`: memory at the edges (issue 11), before and after.

"Before" is the same server with the protections switched off by settings
(`COWRITE_MEMORY_IDLE_S=0`, `COWRITE_MEMORY_MAX_DOCUMENTS=0`: never evict;
`COWRITE_OUTBOUND_MAX_BYTES` huge: frames counted only, as before), "after"
the defaults (or small idle times, to see eviction within the run). RSS of
the server subprocess from /proc. Bounded: a few thousand documents and two
5 MB streams per side; about a minute.
"""

import argparse
import asyncio
import base64
import os
import re
import socket
from pathlib import Path
from typing import Any

import httpx
import orjson
from websockets.asyncio.client import ClientConnection, connect

from bench.common import Proc, bench_token, server_process

README = Path(__file__).resolve().parent.parent / "README.md"
START, END = "<!-- bench-edges:start -->", "<!-- bench-edges:end -->"
OFF = {"COWRITE_MEMORY_IDLE_S": "0", "COWRITE_MEMORY_MAX_DOCUMENTS": "0",
       "COWRITE_OUTBOUND_MAX_BYTES": str(1 << 40)}
STREAM = orjson.dumps({"type": "run.start", "prompt": orjson.dumps({
    "script": [{"say": "x" * 5_000_000}], "chunk_chars": 1000, "delay_ms": 1}).decode()}).decode()


async def _gauge(proc: Proc, name: str) -> float:
    async with httpx.AsyncClient() as http:
        text = (await http.get(proc.url("/metrics", "http"))).text
    found = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


async def _join(proc: Proc, document_id: str, client_id: str) -> ClientConnection:
    ws = await connect(proc.url(f"/v1/documents/{document_id}/ws"), compression=None,
                       max_size=None)
    await ws.send(orjson.dumps({"type": "hello", "protocol": 1, "client_id": client_id,
                                "token": bench_token()}).decode())
    await ws.recv()
    return ws


async def _flood(proc: Proc, prefix: str, count: int, parallel: int = 32) -> None:
    names = iter(range(count))

    async def worker() -> None:
        for index in names:
            ws = await _join(proc, f"{prefix}-{index}", "c")
            await ws.send('{"type":"editor.change","document_version":1}')
            while "document.changed" not in str(await ws.recv()):
                pass
            await ws.close()

    await asyncio.gather(*(worker() for _ in range(parallel)))


async def _wait_evicted(proc: Proc, limit_s: float = 60) -> None:
    for _ in range(int(limit_s / 0.2)):
        if await _gauge(proc, "cowrite_memory_documents") == 0:
            return
        await asyncio.sleep(0.2)


async def documents(count: int, env: dict[str, str]) -> dict[str, float]:
    """KiB of RSS per 1,000 documents used once: held, and after eviction."""
    async with server_process("cowrite", COWRITE_MAX_CONNECTIONS_PER_USER="0", **env) as proc:
        await _flood(proc, "warm", 300)
        await _wait_evicted(proc, 10)
        before = proc.rss_bytes()
        await _flood(proc, "doc", count)
        held = proc.rss_bytes()
        await _wait_evicted(proc, 30 if env.get("COWRITE_MEMORY_IDLE_S") != "0" else 0)
        after = proc.rss_bytes()
        kept = await _gauge(proc, "cowrite_memory_documents")
    per = 1000 / count / 1024
    return {"held_kib": (held - before) * per, "after_kib": (after - before) * per,
            "kept": kept}


async def _drain(ws: ClientConnection) -> None:
    async for raw in ws:
        if b'"run.finished"' in (raw if isinstance(raw, bytes) else raw.encode()):
            return


async def _stalled(proc: Proc, document_id: str) -> asyncio.StreamWriter:
    """A socket that upgrades, says hello, and never reads (frames stay in the
    kernel, unlike a library client's user-space buffer)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", proc.port))
    reader, writer = await asyncio.open_connection(sock=sock)
    key = base64.b64encode(os.urandom(16)).decode()
    writer.write(f"GET /v1/documents/{document_id}/ws HTTP/1.1\r\nHost: x\r\n"
                 f"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                 "Sec-WebSocket-Version: 13\r\n\r\n".encode())
    while (await reader.readline()) not in (b"\r\n", b""):
        pass
    payload = orjson.dumps({"type": "hello", "protocol": 1, "client_id": "slow",
                            "token": bench_token("slow")})
    header = bytes([0x81, 0x80 | 126]) + len(payload).to_bytes(2, "big")
    writer.write(header + b"\x00\x00\x00\x00" + payload)  # masked with a zero key
    return writer


async def slow_consumer(env: dict[str, str]) -> dict[str, float]:
    """MiB of RSS a non-reading client adds during a 5 MB stream (against the same
    stream with readers only), and what is left once the document is idle."""
    env = {"COWRITE_MAX_MESSAGE_BYTES": str(8 << 20), "COWRITE_CLOSE_TIMEOUT_S": "5", **env}
    async with server_process("cowrite", **env) as proc:
        async def stream(document_id: str, slow: bool) -> int:
            reader = await _join(proc, document_id, "reader")
            stalled: Any = None
            if slow:
                stalled = await _stalled(proc, document_id)
            await reader.send(STREAM)
            await _drain(reader)
            peak = proc.rss_bytes()
            await reader.close()
            if stalled is not None:
                stalled.close()
            return peak

        for index in range(2):
            await stream(f"warm-{index}", slow=False)
        base = await stream("plain", slow=False)
        with_slow = await stream("slow", slow=True)
        idle_before = proc.rss_bytes()
        await _wait_evicted(proc, 15 if env.get("COWRITE_MEMORY_IDLE_S") != "0" else 0)
        idle_after = proc.rss_bytes()
        closes = await _gauge(proc, 'cowrite_closes_total{code="4009"}')
    mib = 1 / (1 << 20)
    return {"added_mib": (with_slow - base) * mib, "closed_4009": closes,
            "idle_drop_mib": (idle_before - idle_after) * mib}


async def measure(quick: bool = False) -> dict[str, dict[str, float]]:
    count = 1000 if quick else 3000
    return {
        "docs_before": await documents(count, OFF),
        "docs_after": await documents(count, {"COWRITE_MEMORY_IDLE_S": "2"}),
        "slow_before": await slow_consumer(OFF),
        "slow_after": await slow_consumer({"COWRITE_MEMORY_IDLE_S": "2"}),
    }


def table(m: dict[str, dict[str, float]]) -> str:
    db, da, sb, sa = m["docs_before"], m["docs_after"], m["slow_before"], m["slow_after"]
    return "\n".join([
        "| measure | before (protections off) | after (defaults; idle 2 s) |",
        "|---|---|---|",
        f"| RSS per 1,000 documents used once, while held | {db['held_kib']:,.0f} KiB | "
        f"{da['held_kib']:,.0f} KiB |",
        f"| RSS per 1,000 documents used once, once idle | {db['after_kib']:,.0f} KiB "
        f"({db['kept']:,.0f} documents kept) | {da['after_kib']:,.0f} KiB "
        f"({da['kept']:,.0f} kept) |",
        f"| RSS added by one non-reading client, 5 MB stream | {sb['added_mib']:.1f} MiB "
        f"({sb['closed_4009']:.0f} closes 4009) | {sa['added_mib']:.1f} MiB "
        f"({sa['closed_4009']:.0f} closes 4009) |",
        f"| RSS returned once that document is idle | {sb['idle_drop_mib']:.1f} MiB | "
        f"{sa['idle_drop_mib']:.1f} MiB |",
    ])


def rewrite_readme(text: str) -> None:
    readme = README.read_text()
    if START not in readme:
        return
    head, _, rest = readme.partition(START)
    _, _, tail = rest.partition(END)
    README.write_text(f"{head}{START}\n{text}\n{END}{tail}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer documents")
    parser.add_argument("--no-readme", action="store_true", help="print only")
    args = parser.parse_args()
    text = table(asyncio.run(measure(args.quick)))
    print(text)
    if not args.no_readme and not args.quick:
        rewrite_readme(text)


if __name__ == "__main__":
    main()
