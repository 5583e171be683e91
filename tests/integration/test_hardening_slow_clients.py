"""Slow clients (#11): header read, body read and write stalls are cut off; the reservation goes back.

Before the fix nothing bounded them: 100 slowloris connections were held 45 s+, and
a streaming client that stopped reading kept its reservation (4,005 tokens in
flight for 90 s, the llama-server slot long done). The timeouts here are short
(config) so the tests wait for events, never for fixed delays.
"""

from __future__ import annotations

import asyncio
import socket

import httpx
import pytest

from tests.integration.gate_harness import busy_slots, ledger_total, running_gate, wait_until
from tests.integration.hardening import AUTH, BACKEND_EXTRA, ENV, TENANTS, record_of, still_serves

pytestmark = pytest.mark.llama

SLOW = "[gate]\nheader_timeout_s = 0.5\nbody_timeout_s = 0.5\nwrite_stall_s = 1.0\n"


async def idle(client: httpx.AsyncClient, llama_url: str) -> bool:
    return await busy_slots(client, llama_url) == 0


async def closed_by_gate(reader: asyncio.StreamReader) -> bytes:
    """Everything the gate sent until it closed the connection (EOF or reset)."""
    data = b""
    try:
        while chunk := await asyncio.wait_for(reader.read(65536), 30):
            data += chunk
    except ConnectionResetError:
        pass
    return data


SLOWLORIS = [
    ("silent", b""),
    ("request-line-only", b"POST /v1/chat/completions HTTP/1.1\r\n"),
    ("headers-unfinished", b"POST /tokenize HTTP/1.1\r\nHost: gate\r\nContent-Type: appl"),
    ("get-unfinished", b"GET /health HTTP/1.1\r\nHost: gate\r\nX-a: 1\r\n"),
]


@pytest.mark.parametrize(("name", "prefix"), SLOWLORIS, ids=[s[0] for s in SLOWLORIS])
async def test_headers_not_complete_in_time_close_the_connection(llama_split, name, prefix):
    async with (
        running_gate(llama_split.url, SLOW + TENANTS, environ=ENV, kv="split", backend_extra=BACKEND_EXTRA) as gate,
        httpx.AsyncClient(timeout=30) as client,
    ):
        conns = [await asyncio.open_connection("127.0.0.1", gate.port) for _ in range(20)]
        for _, writer in conns:
            writer.write(prefix)
        answers = await asyncio.gather(*(closed_by_gate(reader) for reader, _ in conns))
        assert all(a == b"" for a in answers), answers[:1]  # closed, no request was ever started
        for _, writer in conns:
            writer.close()
        assert gate.records.total == 0
        await still_serves(gate, client)


async def test_oversized_headers_are_refused(llama_split):
    async with (
        running_gate(llama_split.url, SLOW + TENANTS, environ=ENV, kv="split", backend_extra=BACKEND_EXTRA) as gate,
        httpx.AsyncClient(timeout=30) as client,
    ):
        reader, writer = await asyncio.open_connection("127.0.0.1", gate.port)
        writer.write(b"GET /health HTTP/1.1\r\nHost: gate\r\n" + b"X-Big: " + b"a" * 100_000 + b"\r\n\r\n")
        answer = await closed_by_gate(reader)
        assert answer.startswith(b"HTTP/1.1 400") or answer == b"", answer[:100]
        writer.close()
        await still_serves(gate, client)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/tokenize"])
async def test_body_not_complete_in_time_is_408_client_stalled(llama_split, path):
    async with (
        running_gate(llama_split.url, SLOW + TENANTS, environ=ENV, kv="split", backend_extra=BACKEND_EXTRA) as gate,
        httpx.AsyncClient(timeout=30) as client,
    ):
        reader, writer = await asyncio.open_connection("127.0.0.1", gate.port)
        writer.write(
            f"POST {path} HTTP/1.1\r\nHost: gate\r\nAuthorization: {AUTH['Authorization']}\r\n"
            'X-Request-Id: slow-body\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"mess'.encode()
        )
        answer = await closed_by_gate(reader)
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert b'"code":"client_stalled"' in answer.replace(b" ", b"")
        writer.close()
        if path.startswith("/v1/"):
            record = await record_of(gate, "slow-body")
            assert (record.outcome, record.reason, record.http_status) == ("cancelled", "client_stalled", 408)
        await still_serves(gate, client)


async def test_stream_client_that_stops_reading_is_cut_and_its_tokens_released(llama_unified):
    """/completion with n_probs makes each token event ~10 KB, so the socket buffers fill fast."""
    async with (
        running_gate(llama_unified.url, SLOW + TENANTS, environ=ENV, backend_extra=BACKEND_EXTRA) as gate,
        httpx.AsyncClient(timeout=30) as client,
    ):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: a small window
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", gate.port))
        reader, writer = await asyncio.open_connection(sock=sock)
        body = b'{"model": "tiny", "prompt": "the quick brown fox", "n_predict": 1800, "ignore_eos": true, "stream": true, "n_probs": 200}'
        writer.write(
            f"POST /completion HTTP/1.1\r\nHost: gate\r\nAuthorization: {AUTH['Authorization']}\r\n"
            f"X-Request-Id: not-reading\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
        assert head.startswith(b"HTTP/1.1 200"), head
        reader._transport.pause_reading()  # the client stops reading; the gate's writes stall
        record = await record_of(gate, "not-reading", timeout_s=120)
        assert (record.outcome, record.reason, record.http_status) == ("cancelled", "client_stalled", 200)
        assert record.completion_tokens is None or record.completion_tokens < 1800
        await wait_until(lambda: ledger_total(gate) == 0, timeout_s=10)
        await wait_until(lambda: idle(client, llama_unified.url), timeout_s=10)  # upstream closed
        reader._transport.resume_reading()
        await closed_by_gate(reader)  # the connection was dropped, not left open
        writer.close()
        await still_serves(gate, client)
