"""A FAKE upstream for fault and fleet tests: it looks ready like llama-server but is not one.

This is NOT llama-server and not the simulator: a few dozen lines of plain asyncio
HTTP/1.1 on loopback (keep-alive, Content-Length bodies) that answer just enough for
the gate to consider it a ready backend:

* ``GET /health`` -> 200 ``{"status": "ok"}``
* ``GET /props`` -> ``total_slots`` 4, ``default_generation_settings.n_ctx`` 2048
* ``POST /v1/chat/completions/input_tokens`` -> ``{"input_tokens": 12}`` (``count_tokens``; with
  ``count_hold`` an Event, answered once it is set; ``count_asked`` is set when one comes,
  ``counts`` counts them and ``count_answered_at`` says when the last was answered)

and then, on ``POST /v1/chat/completions``:

* ``mode="hang"``: accept the request and never send a byte (a stuck backend).
* ``mode="stall"``: send the 200 status line, SSE headers and one token chunk, then
  never send another byte (a backend that stalls mid-stream).
* ``mode="redirect"``: answer every other route 302 to an internal address (a proxy between
  the gate and llama-server), with a ``Via`` header and the address in the body.
* ``mode="slow"``: answer a completion of ``max_tokens`` tokens (a short SSE stream) after
  ``delay_s`` (a slow backend), counting the requests in progress: ``in_progress`` now,
  ``most_in_progress`` the largest it has been. A request leaves the count before its
  answer's first byte is written, so the gate can never see an answer while it counts.
  ``arrivals`` says when each came and its first message (tests put the tenant there).

Hang and stall hold the connection until the client (the gate) closes it; ``held``
is set once a completion request is being held and ``released`` once the gate
has closed that connection, so a test can await both instead of sleeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from typing import Literal

Mode = Literal["hang", "stall", "slow", "redirect"]

#: what ``mode="redirect"`` answers every route but the probes' and the count's with (a proxy in
#: front of llama-server naming its own side)
REDIRECT_TO = "http://10.9.8.7:8080/internal"

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
    """A FAKE llama-server on 127.0.0.1 that holds every chat completion forever, or
    answers each after ``delay_s`` (``mode="slow"``)."""

    def __init__(self, mode: Mode = "hang", *, delay_s: float = 1.0) -> None:
        self.mode = mode
        self.delay_s = delay_s
        self.in_progress = 0  # slow mode: completions received and not yet answered
        self.most_in_progress = 0
        self.arrivals: list[tuple[float, str]] = []  # slow mode: (monotonic time, first message)
        self._since: dict[int, float] = {}  # in progress: sequence number -> arrival
        self.port: int | None = None
        self.held = asyncio.Event()  # a completion request is being held
        self.released = asyncio.Event()  # the gate closed a held connection
        self.completions = 0
        self.completion_at: list[float] = []  # monotonic time each completion request came
        self.count_tokens = 12
        self.count_hold: asyncio.Event | None = None
        self.count_asked = asyncio.Event()
        self.counts = 0  # count requests received
        self.count_answered_at: float | None = None
        #: (method, path, the Authorization header or None) of every request, in order
        self.heard: list[tuple[str, str, str | None]] = []
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
                self.heard.append((method, path, headers.get("authorization")))
                if self.mode == "redirect" and path.split("?")[0] not in ("/health", "/props", "/v1/chat/completions/input_tokens"):
                    moved = f'<a href="{REDIRECT_TO}{path}">Found</a>'.encode()
                    writer.write(
                        f"HTTP/1.1 302 Found\r\nLocation: {REDIRECT_TO}{path}\r\nVia: 1.1 proxy.internal:3128\r\n"
                        f"Content-Type: text/html\r\nContent-Length: {len(moved)}\r\n\r\n".encode()
                        + moved
                    )
                    await writer.drain()
                    continue
                if method == "POST" and path == "/v1/chat/completions" and self.mode == "slow":
                    await self._slow(writer, json.loads(body))
                    continue
                if method == "POST" and path == "/v1/chat/completions":
                    await self._hold(reader, writer)
                    return
                if method == "GET" and path == "/health":
                    self._reply(writer, 200, {"status": "ok"})
                elif method == "GET" and path == "/props":
                    self._reply(writer, 200, PROPS)
                elif method == "POST" and path == "/v1/chat/completions/input_tokens":
                    json.loads(body)
                    self.counts += 1
                    self.count_asked.set()
                    if self.count_hold is not None:
                        await self.count_hold.wait()
                    self.count_answered_at = time.monotonic()
                    self._reply(writer, 200, {"input_tokens": self.count_tokens})
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
        self.completion_at.append(time.monotonic())
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

    def reset_most(self) -> None:
        """Start a new measurement: ``most_in_progress`` from what is in progress now."""
        self.most_in_progress = self.in_progress

    def oldest_in_progress(self) -> float | None:
        """When the oldest request in progress arrived (monotonic), None when none is."""
        return min(self._since.values(), default=None)

    async def _slow(self, writer: asyncio.StreamWriter, body: dict) -> None:
        self.completions += 1
        seq = self.completions
        now = time.monotonic()
        self.completion_at.append(now)
        messages = body.get("messages") or [{}]
        self.arrivals.append((now, str(messages[0].get("content", ""))))
        self._since[seq] = now
        self.in_progress += 1
        self.most_in_progress = max(self.most_in_progress, self.in_progress)
        try:
            await asyncio.sleep(self.delay_s)  # the modelled generation time, not a wait for a condition
        finally:
            self.in_progress -= 1
            del self._since[seq]
        # The gate always asks for a stream with usage (gate/backend/upstream.py): one chunk, the
        # finish, the usage, [DONE].
        tokens = int(body.get("max_tokens") or 1)
        base = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0, "model": "fake"}
        events = [
            {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": "ok"}, "finish_reason": None}]},
            {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]},
            {**base, "choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": tokens, "total_tokens": 12 + tokens}},
        ]
        stream = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n%s" % (len(stream), stream))
        await writer.drain()

    @staticmethod
    def _reply(writer: asyncio.StreamWriter, status: int, payload: object) -> None:
        body = json.dumps(payload).encode()
        reason = {200: "OK", 404: "Not Found"}[status]
        writer.write(f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)


@contextlib.asynccontextmanager
async def fake_upstream(mode: Mode = "hang", *, delay_s: float = 1.0) -> AsyncIterator[FakeUpstream]:
    fake = await FakeUpstream(mode, delay_s=delay_s).start()
    try:
        yield fake
    finally:
        await fake.stop()
