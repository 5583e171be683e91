"""The gate keeps an idle client connection longer than its clients keep it (gate/http/server.py
KEEP_ALIVE_S). A server that closes first races the client's reuse: the request sent on the
closing connection fails with a reset, and a POST is not retried (a CI run of three gates saw an
httpx.ReadError; httpx, and so the OpenAI SDK, keeps idle connections 5 s, uvicorn's default)."""

from __future__ import annotations

import asyncio

import httpx

from gate.http.server import KEEP_ALIVE_S, HttpServer

REQUEST = b"POST /v1/completions HTTP/1.1\r\nhost: gate\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"


async def app(scope, receive, send) -> None:
    await receive()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


async def answered(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes:
    writer.write(REQUEST)
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    await reader.readexactly(2)
    return head.split(b"\r\n", 1)[0]


def test_the_gate_outlasts_the_clients_idle_connections() -> None:
    httpx_expiry = httpx.Limits().keepalive_expiry or 0.0  # what httpx.AsyncClient() keeps
    assert httpx_expiry == 5.0
    assert KEEP_ALIVE_S > httpx_expiry
    assert KEEP_ALIVE_S >= 60  # load balancers' common idle timeout in front of a gate


async def test_a_connection_idle_past_httpx_s_expiry_is_still_served() -> None:
    """The negative control is uvicorn's default (5 s): this connection is closed under the
    second request, which reads EOF instead of its answer."""
    server = HttpServer(app, header_timeout_s=10.0)
    port = await server.start("127.0.0.1", 0)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        assert await answered(reader, writer) == b"HTTP/1.1 200 OK"
        await asyncio.sleep(httpx.Limits().keepalive_expiry + 0.3)  # the idle time itself is the point
        assert await answered(reader, writer) == b"HTTP/1.1 200 OK"
        writer.close()
    finally:
        server.stop()
        assert server.task is not None
        await server.task
