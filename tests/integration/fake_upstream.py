"""A FAKE upstream for fault tests: it looks ready like llama-server but never finishes an answer.

This is NOT llama-server and not the simulator: a few dozen lines of plain asyncio
HTTP/1.1 on loopback (keep-alive, Content-Length bodies) that answer just enough for
the gate to consider it a ready backend:

* ``GET /health`` -> 200 ``{"status": "ok"}``
* ``GET /props`` -> ``total_slots`` 4, ``default_generation_settings.n_ctx`` 2048
* ``POST /v1/chat/completions/input_tokens`` -> ``{"input_tokens": 12}``

and then misbehave on ``POST /v1/chat/completions``:

* ``mode="hang"``: accept the request and never send a byte (a stuck backend).
* ``mode="stall"``: send the 200 status line, SSE headers and one token chunk, then
  never send another byte (a backend that stalls mid-stream).

Either way it holds the connection until the client (the gate) closes it; ``held``
is set once a completion request is being held and ``released`` once the gate
has closed that connection, so a test can await both instead of sleeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Literal

PROPS = {
    "total_slots": 4,
    "default_generation_settings": {"n_ctx": 2048},
    "model_path": "fake.gguf",
    "build_info": "fake-upstream",
}

_CHUNK = {
    "id": "chatcmpl-fake",
    "object": "chat.completion.chunk",
    "created": 0,
    "model": "fake",
    "choices": [{"index": 0, "delta": {"role": "assistant", "content": "hello"}, "finish_reason": None}],
}


class FakeUpstream:
    """A FAKE llama-server on 127.0.0.1 that holds every chat completion forever."""

    def __init__(self, mode: Literal["hang", "stall"] = "hang") -> None:
        self.mode = mode
        self.port: int | None = None
        self.held = asyncio.Event()  # a completion request is being held
        self.released = asyncio.Event()  # the gate closed a held connection
        self.completions = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> FakeUpstream:
        self._server = await asyncio.start_server(self._connection, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for writer in list(self._writers):
                writer.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:] if ":" in line)}
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                if method == "POST" and path == "/v1/chat/completions":
                    await self._hold(reader, writer)
                    return
                if method == "GET" and path == "/health":
                    self._reply(writer, 200, {"status": "ok"})
                elif method == "GET" and path == "/props":
                    self._reply(writer, 200, PROPS)
                elif method == "POST" and path == "/v1/chat/completions/input_tokens":
                    json.loads(body)
                    self._reply(writer, 200, {"input_tokens": 12})
                else:
                    self._reply(writer, 404, {"error": {"code": 404, "message": "File Not Found", "type": "not_found_error"}})
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _hold(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.completions += 1
        if self.mode == "stall":
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
            event = b"data: " + json.dumps(_CHUNK).encode() + b"\n\n"
            writer.write(b"%x\r\n%s\r\n" % (len(event), event))
            await writer.drain()
        self.held.set()
        # The gate sends nothing more on this connection: EOF means it closed it.
        while await reader.read(65536):
            pass
        self.released.set()

    @staticmethod
    def _reply(writer: asyncio.StreamWriter, status: int, payload: object) -> None:
        body = json.dumps(payload).encode()
        reason = {200: "OK", 404: "Not Found"}[status]
        writer.write(f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)


@contextlib.asynccontextmanager
async def fake_upstream(mode: Literal["hang", "stall"] = "hang") -> AsyncIterator[FakeUpstream]:
    fake = await FakeUpstream(mode).start()
    try:
        yield fake
    finally:
        await fake.stop()
