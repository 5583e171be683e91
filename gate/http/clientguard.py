"""What one client may cost the gate: time to send its request, body size, write stalls.

* **Headers** (:func:`guarded_protocol`): uvicorn's ``timeout_keep_alive`` only covers
  the idle time between requests; nothing bounds a request whose headers trickle in
  (slowloris: 100 connections sending a byte every few seconds were held 45 s+).
  The protocol subclass closes a connection whose request headers are not complete
  within ``header_timeout_s`` of its start, and one whose request line + headers
  exceed :data:`MAX_HEADER_BYTES`. It also lends the app a way to abort the
  connection (``scope["extensions"]["tokengate.abort"]``): a client that stopped
  reading must not keep the socket, whose unsent bytes a plain close would wait on.
  And it closes "lingering" (as nginx does): a connection closed while the client is
  still sending its body (a 413 before reading) would make the kernel answer with a
  reset that destroys the 413 in flight (measured: the client saw ECONNRESET instead
  of the 413 on about one 300 MB upload in two). So the gate shuts its sending side,
  then reads and discards for up to :data:`LINGER_S` before it closes.
* **Body** (:class:`BodyReader`): wraps ``receive`` on every route. A Content-Length
  over ``max_body_bytes`` is refused on the first ``receive``, before any of the body
  is read; a chunked body is refused as soon as it passes the limit; a body not
  complete within ``body_timeout_s`` is 408 ``client_stalled``. Measured: one 300 MB
  POST to /tokenize used to raise the gate's RSS from 57 to 649 MiB before its 413.
* **Writes**: a ``send`` that does not complete within ``write_stall_s`` (the client
  takes in nothing while the socket buffer is full) raises ``client_stalled``.
* **Header names as spelled**: uvicorn's httptools protocol writes every response header name
  in lower case (``name.lower()`` as it builds the head). HTTP says names are case-insensitive,
  but clients that copy headers into a plain dict do not (llama.cpp's own server tests look up
  ``Access-Control-Allow-Origin`` and ``Process-Start-Time-Unix``: 16 of them failed through the
  gate for that alone). The protocol notes, at each ``http.response.start``, the names the app
  spelled with capitals (llama-server's relayed headers, as it sent them), and the connection's
  transport writes the head with those spellings (:func:`respell`). uvicorn's h11 protocol keeps
  names as given, but costs twice the CPU (0.158 against 0.070 s per 1,000 requests, measured).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gate.core.errors import GateError
from gate.core.reasons import Reason

# Request line + headers. Real clients send about 1 KiB; nginx's default buffers hold 8 KiB
# (large_client_header_buffers 4 x 8k).
MAX_HEADER_BYTES = 64 * 1024
ABORT = "tokengate.abort"
LINGER_S = 2.0  # how long unread request bytes are drained after the answer, before the close

Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


def guarded_protocol(header_timeout_s: float) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with a header-read deadline and a header size cap."""

    class GuardedProtocol(HttpToolsProtocol):
        _header_timer: asyncio.TimerHandle | None = None
        _header_bytes = 0

        _lingering = False

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            wrapped = _Transport(transport, self)
            self.transport = wrapped  # type: ignore[assignment]
            self.app = _Spelled(self.app, wrapped)
            self._arm()

        def data_received(self, data: bytes) -> None:
            if not self._lingering:
                super().data_received(data)

        def body_unread(self) -> bool:
            return self.cycle is not None and self.cycle.more_body and self.parser is not None

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._header_bytes = 0
            self.scope["extensions"] = {ABORT: self.transport.abort}  # type: ignore[dict-item]  # an ASGI extension may be any value
            if self._header_timer is None:
                self._arm()  # the next request on a kept-alive connection

        def on_url(self, url: bytes) -> None:
            self._count(len(url))
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._count(len(name) + len(value))
            super().on_header(name, value)

        def on_headers_complete(self) -> None:
            self._disarm()
            super().on_headers_complete()

        def _count(self, n: int) -> None:
            self._header_bytes += n
            if self._header_bytes > MAX_HEADER_BYTES and not self.transport.is_closing():
                self.logger.info("closing a connection: request headers over %d bytes", MAX_HEADER_BYTES)
                self.send_400_response("Request headers too large.")

        def _arm(self) -> None:
            self._disarm()
            self._header_timer = self.loop.call_later(header_timeout_s, self._headers_overdue)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_overdue(self) -> None:
            self._header_timer = None
            if (self.cycle is None or self.cycle.response_complete) and not self.transport.is_closing():
                self.transport.abort()

    return GuardedProtocol


class _Spelled:
    """The app, whose every ``http.response.start`` tells the transport how its names are spelled."""

    __slots__ = ("app", "transport")

    def __init__(self, app: Any, transport: _Transport) -> None:
        self.app, self.transport = app, transport

    def __call__(self, scope: Any, receive: Receive, send: Send) -> Awaitable[None]:
        return self.app(scope, receive, _SpellingSend(send, self.transport))


class _SpellingSend:
    __slots__ = ("send", "transport")

    def __init__(self, send: Send, transport: _Transport) -> None:
        self.send, self.transport = send, transport

    def __call__(self, message: MutableMapping[str, Any]) -> Awaitable[None]:
        if message["type"] == "http.response.start":
            self.transport.spell(message.get("headers", ()))
        return self.send(message)


def respell(head: bytes, spelling: Mapping[bytes, bytes]) -> bytes:
    """An HTTP response head (status line, header lines, blank line) with each header name that
    `spelling` knows (by its lower-case form) written as spelled there; the rest as it was."""
    lines = head.split(b"\r\n")
    for i in range(1, len(lines)):
        name, colon, rest = lines[i].partition(b":")
        spelled = spelling.get(name) if colon else None
        if spelled is not None:
            lines[i] = spelled + colon + rest
    return b"\r\n".join(lines)


class _Transport:
    """The connection's transport: its `close` drains an unread request body first, and the head
    of each answer is written with the app's spelling of its header names (see above)."""

    def __init__(self, transport: Any, protocol: Any) -> None:
        self._transport = transport
        self._protocol = protocol
        self._closing = False
        self._spelling: dict[bytes, bytes] | None = None  # for the next head written

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def spell(self, headers: Iterable[tuple[bytes, bytes]]) -> None:
        """The answer starting now has these headers: note the names not all in lower case."""
        spelling = {name.lower(): name for name, _ in headers if not name.islower()}
        self._spelling = spelling or None

    def write(self, data: bytes) -> None:
        spelling = self._spelling
        if spelling is not None:
            self._spelling = None
            if data.startswith(b"HTTP/"):  # uvicorn writes the status line and headers at once
                data = respell(data, spelling)
        self._transport.write(data)

    def is_closing(self) -> bool:
        return self._closing or self._transport.is_closing()

    def close(self) -> None:
        transport = self._transport
        if self._closing or transport.is_closing():
            return
        self._closing = True
        if not self._protocol.body_unread() or not transport.can_write_eof():
            transport.close()
            return
        self._protocol._lingering = True
        transport.write_eof()  # the answer goes out, then FIN: the client sees the end of it
        transport.resume_reading()
        asyncio.get_running_loop().call_later(LINGER_S, transport.close)


def too_large(length: int, limit: int) -> GateError:
    return GateError(Reason.BODY_TOO_LARGE, f"request body is {length} bytes or more, over the limit of {limit} bytes")


class BodyReader:
    """`receive` for one request, with the body's size limit and read deadline."""

    __slots__ = ("receive", "limit", "timeout_s", "declared", "size", "deadline", "done")

    def __init__(self, receive: Receive, headers: list[tuple[bytes, bytes]], limit: int, timeout_s: float) -> None:
        self.receive = receive
        self.limit = limit
        self.timeout_s = timeout_s
        self.declared: int | None = None
        for name, value in headers:
            if name.lower() == b"content-length" and value.strip().isdigit():
                self.declared = int(value)
        self.size = 0
        self.deadline: float | None = None
        self.done = False

    async def __call__(self) -> MutableMapping[str, Any]:
        if self.done:
            return await self.receive()  # after the body: only the disconnect is left to wait for
        if self.declared is not None and self.declared > self.limit:
            raise too_large(self.declared, self.limit)
        loop = asyncio.get_running_loop()
        if self.deadline is None:
            self.deadline = loop.time() + self.timeout_s
        try:
            async with asyncio.timeout_at(self.deadline):
                message = await self.receive()
        except TimeoutError:
            raise GateError(Reason.CLIENT_STALLED, f"request body not received within body_timeout_s={self.timeout_s:g}") from None
        if message["type"] != "http.request":
            self.done = True
            return message
        self.size += len(message.get("body", b""))
        if self.size > self.limit:
            raise too_large(self.size, self.limit)
        if not message.get("more_body", False):
            self.done = True
        return message


def stalled(write_stall_s: float) -> GateError:
    return GateError(Reason.CLIENT_STALLED, f"the client took in nothing for write_stall_s={write_stall_s:g}")


async def send_within(send: Send, message: MutableMapping[str, Any], write_stall_s: float) -> None:
    """`send(message)`, or `client_stalled` when the client does not take it in time."""
    try:
        async with asyncio.timeout(write_stall_s):
            await send(message)
    except TimeoutError:
        raise stalled(write_stall_s) from None


async def abort(scope: MutableMapping[str, Any]) -> None:
    """Drop the client's connection at once (unsent bytes included), where the server allows."""
    fn = scope.get("extensions", {}).get(ABORT)
    if fn is not None:
        fn()
        # The transport reports the loss on the next loop turn: let uvicorn see it before the
        # app returns, or it logs "ASGI callable returned without completing response".
        await asyncio.sleep(0)
