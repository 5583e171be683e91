"""httpx's plain-HTTP connections on asyncio directly, without anyio in between.

httpx (DESIGN.md: every HTTP client call) sits on httpcore, whose default network
backend does each read and write through anyio: a cancel scope, a deadline and a
sniffio lookup around every call. On the proxied path that was about a third of
the gate's CPU; `bench/upstream_clients.py` measured the same relay with this
backend at 1.35x the requests/s and 0.74x the CPU per request. httpx and httpcore
stay in charge of HTTP, pooling and timeouts; only the socket I/O changes. TLS
connections keep httpx's own transport (`client_transports`).

A request that says `Connection: close` (every call the gate makes to llama-server, see
gate/backend/upstream.py) gets a connection of its own, opened for it and closed with its
answer, outside httpcore's pool (`_Pool`): such a connection is never reused, yet the pool
would still queue the request, scan every connection and every waiting request under its
lock to assign it one (twice: when it starts and when it ends), so the pool's cost grew
with the number in flight. `bench/close_bypass.py` measured the client's CPU per request
14% lower at 1 and 32 in flight, 19% at 128 and 30% at 256 with the bypass (2-vCPU VM, load
average 8-10 from other work).

Such an answer's body (`BODY_EXTENSION` in the response's extensions) can be read in batches:
`batch_reads(s)` makes each read of the socket wait until `s` seconds after the last one, so
the tokens llama-server wrote meanwhile come in one read, and `pending()` says whether the next
part is already here (read, or in h11's buffer) so that the relay writes them to its client at
once (gate/backend/upstream.py, `[gate] stream_batch_ms`). llama-server writes each token as
its own chunk: relayed one at a time, a 64-token stream of the tiny test model cost the gate
17 ms of CPU (a wake-up, an h11 event, an ASGI send and a socket write per token).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from http.cookiejar import CookieJar, DefaultCookiePolicy
from typing import Any

import httpcore
import httpx

# A chunked body's last chunk (no trailers: llama-server sends none), behind the CRLF that ends
# the chunk before it. Inside a chunk it cannot occur in an SSE stream (JSON escapes CR and LF).
_LAST_CHUNK = b"\r\n0\r\n\r\n"


def _ends_body(buffer: bytearray) -> bool:
    return buffer.endswith(_LAST_CHUNK) or buffer == _LAST_CHUNK[2:]


# Stop reading from the socket while this much is buffered and unread: a client
# that reads slowly must not make the gate hold a whole answer in memory.
_HIGH_WATER = 256 * 1024
_LOW_WATER = 64 * 1024

#: the key of a `Connection: close` answer's body (`_OwnConnectionStream`) in its extensions
BODY_EXTENSION = "tokengate.body"


class _Connection(asyncio.Protocol):
    """Buffers what the socket delivers; wakes the one reader and the one writer httpcore allows."""

    def __init__(self) -> None:
        self.transport: Any = None  # asyncio's or uvloop's TCP transport
        self.buffer = bytearray()
        self.eof = False
        self.error: BaseException | None = None
        self.reading_paused = False
        self.writing_paused = False
        self._read_waiter: asyncio.Future[None] | None = None
        self._drain_waiter: asyncio.Future[None] | None = None
        self._end_waiter: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # uvloop's is not an asyncio.Transport subclass, but quacks like one

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if len(self.buffer) > _HIGH_WATER and self.transport is not None and not self.reading_paused:
            self.reading_paused = True
            self.transport.pause_reading()
        _wake(self._read_waiter)
        if self._end_waiter is not None and _ends_body(self.buffer):
            _wake(self._end_waiter)

    def eof_received(self) -> bool:
        self.eof = True
        _wake(self._read_waiter)
        _wake(self._end_waiter)
        return False  # close our side too: HTTP/1.1 has no use for a half-open connection

    def connection_lost(self, exc: Exception | None) -> None:
        self.eof = True
        self.error = exc
        _wake(self._read_waiter)
        _wake(self._drain_waiter)
        _wake(self._end_waiter)

    def pause_writing(self) -> None:
        self.writing_paused = True

    def resume_writing(self) -> None:
        self.writing_paused = False
        _wake(self._drain_waiter)

    async def wait_readable(self) -> None:
        self._read_waiter = asyncio.get_running_loop().create_future()
        try:
            await self._read_waiter
        finally:
            self._read_waiter = None

    async def wait_batch(self, seconds: float) -> None:
        """`seconds`, or less when the body's end comes meanwhile (or the peer goes): nothing
        more can join the batch then."""
        loop = asyncio.get_running_loop()
        self._end_waiter = loop.create_future()
        timer = loop.call_later(seconds, _wake, self._end_waiter)
        try:
            await self._end_waiter
        finally:
            timer.cancel()
            self._end_waiter = None

    async def wait_drained(self) -> None:
        self._drain_waiter = asyncio.get_running_loop().create_future()
        try:
            await self._drain_waiter
        finally:
            self._drain_waiter = None


def _wake(waiter: asyncio.Future[None] | None) -> None:
    if waiter is not None and not waiter.done():
        waiter.set_result(None)


class AsyncioStream(httpcore.AsyncNetworkStream):
    """One TCP connection as httpcore sees it."""

    def __init__(self, conn: _Connection) -> None:
        self._conn = conn
        self._batch_s = 0.0
        self._next_read_at = 0.0

    def batch_reads(self, seconds: float) -> None:
        """From now on, a read that finds data waits until `seconds` after the previous read
        returned, and returns all that came by then (0: at once, as before); but no longer than
        until the body's end (the last chunk, or the peer gone) is here: nothing can join it.
        llama-server writes its final event, [DONE] and the last chunk right behind the last
        token (0.06 ms apart, one read): waited out, they ended every answer a batch late,
        a plain answer (streamed from llama-server, gate/http/assembly.py) 10 ms slower and
        every slot released 10 ms after llama-server had freed it."""
        self._batch_s = max(0.0, seconds)
        self._next_read_at = asyncio.get_running_loop().time() + self._batch_s

    def pending(self) -> bool:
        """Bytes received and not read yet."""
        return bool(self._conn.buffer)

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        conn = self._conn
        if not conn.buffer and not conn.eof:
            try:
                async with asyncio.timeout(timeout):
                    await conn.wait_readable()
            except TimeoutError:
                raise httpcore.ReadTimeout(f"no data within {timeout} s") from None
        if self._batch_s and conn.buffer and not conn.eof and not _ends_body(conn.buffer):
            loop = asyncio.get_running_loop()
            delay = self._next_read_at - loop.time()
            if delay > 0:
                await conn.wait_batch(delay)  # data is here: what follows within the batch joins it
            self._next_read_at = loop.time() + self._batch_s
        if conn.buffer:
            data = bytes(conn.buffer[:max_bytes])
            del conn.buffer[:max_bytes]
            if conn.reading_paused and len(conn.buffer) < _LOW_WATER and conn.transport is not None:
                conn.reading_paused = False
                conn.transport.resume_reading()
            return data
        if conn.error is not None:
            raise httpcore.ReadError(str(conn.error) or type(conn.error).__name__)
        return b""  # the peer closed the connection

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        conn = self._conn
        if not buffer:
            return
        if conn.transport is None or conn.transport.is_closing():
            raise httpcore.WriteError(str(conn.error) if conn.error else "connection closed")
        conn.transport.write(buffer)
        if conn.writing_paused:
            try:
                async with asyncio.timeout(timeout):
                    await conn.wait_drained()
            except TimeoutError:
                raise httpcore.WriteTimeout(f"could not write within {timeout} s") from None
            if conn.error is not None:
                raise httpcore.WriteError(str(conn.error))

    async def aclose(self) -> None:
        if self._conn.transport is not None:
            self._conn.transport.close()

    async def start_tls(self, *args: Any, **kwargs: Any) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("TLS is not handled here: https:// goes through httpx's own transport")

    def get_extra_info(self, info: str) -> Any:
        if info == "is_readable":
            # httpcore asks before reusing an idle pooled connection: anything there
            # (a close, or bytes nobody asked for) means it is not fit to reuse.
            return self._conn.eof or bool(self._conn.buffer)
        transport = self._conn.transport
        if transport is None:
            return None
        key = {"client_addr": "sockname", "server_addr": "peername"}.get(info, info)
        return transport.get_extra_info(key)


class AsyncioBackend(httpcore.AsyncNetworkBackend):
    """Opens plain TCP connections with the running loop (uvloop under `tokengate serve`)."""

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                transport, conn = await loop.create_connection(
                    _Connection, host, port, local_addr=(local_address, 0) if local_address else None
                )
        except TimeoutError:
            raise httpcore.ConnectTimeout(f"no connection to {host}:{port} within {timeout} s") from None
        except OSError as exc:
            raise httpcore.ConnectError(f"{host}:{port}: {exc}") from exc
        sock = transport.get_extra_info("socket")
        if sock is not None:
            for option in socket_options or ():
                sock.setsockopt(*option)
        return AsyncioStream(conn)

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("unix sockets are not supported by the gate's backends")

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


def _says_close(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    return any(name.lower() == b"connection" and b"close" in value.lower() for name, value in headers)


class _OwnConnectionStream:
    """The body of an answer on a connection of its own: closing it closes the connection."""

    def __init__(self, stream: Any, connection: httpcore.AsyncHTTP11Connection, network: AsyncioStream | None = None) -> None:
        self._stream = stream
        self._connection = connection
        self._network = network
        self._closed = False

    def batch_reads(self, seconds: float) -> None:
        """See `AsyncioStream.batch_reads` (nothing on a connection that is not ours)."""
        if self._network is not None:
            self._network.batch_reads(seconds)

    def pending(self) -> bool:
        """Is part of the body here already, so that the next read of it needs no wait? (In h11's
        buffer, or received and not read yet; False when that cannot be told: as if not.)"""
        if self._network is not None and self._network.pending():
            return True
        h11_state = getattr(self._connection, "_h11_state", None)  # httpcore's; h11's trailing_data is public
        trailing = getattr(h11_state, "trailing_data", None)
        # After a chunk h11 keeps its CRLF until the next event: that alone is no data.
        return bool(trailing and trailing[0].strip(b"\r\n"))

    async def __aiter__(self) -> Any:
        try:
            async for part in self._stream:
                yield part
        except BaseException:
            await self.aclose()
            raise

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self._stream.aclose()
        finally:
            await self._connection.aclose()  # h11 closes it anyway after `Connection: close`; never left open


class _Pool(httpcore.AsyncConnectionPool):
    """httpcore's pool for kept-alive requests; a `Connection: close` one goes around it (module docstring)."""

    async def handle_async_request(self, request: httpcore.Request) -> httpcore.Response:
        if request.url.scheme != b"http" or not _says_close(request.headers):
            return await super().handle_async_request(request)
        origin = request.url.origin
        stream = await self._network_backend.connect_tcp(
            origin.host.decode("ascii"),
            origin.port,
            timeout=request.extensions.get("timeout", {}).get("connect"),
            local_address=self._local_address,
            socket_options=self._socket_options,
        )
        connection = httpcore.AsyncHTTP11Connection(origin=origin, stream=stream)
        try:
            response = await connection.handle_async_request(request)
        except BaseException:
            await connection.aclose()
            raise
        body = _OwnConnectionStream(response.stream, connection, stream if isinstance(stream, AsyncioStream) else None)
        return httpcore.Response(
            status=response.status,
            headers=response.headers,
            content=body,
            extensions={**response.extensions, BODY_EXTENSION: body},
        )


def client_transports(limits: httpx.Limits) -> tuple[httpx.AsyncBaseTransport, dict[str, httpx.AsyncBaseTransport]]:
    """The transport for http:// (on AsyncioBackend) and the mounts for the rest (httpx's own)."""
    plain = httpx.AsyncHTTPTransport(limits=limits)
    # httpx has no public way to hand its transport a network backend; its pool is
    # replaced with an identical one that has ours. tests/unit/test_netio.py checks
    # that requests really go through AsyncioBackend, so an httpx upgrade that
    # changes this fails there rather than silently falling back.
    plain._pool = _Pool(
        max_connections=limits.max_connections,
        max_keepalive_connections=limits.max_keepalive_connections,
        keepalive_expiry=limits.keepalive_expiry,
        http1=True,
        http2=False,
        network_backend=AsyncioBackend(),
    )
    return plain, {"https://": httpx.AsyncHTTPTransport(limits=limits)}


def transport_for(client: httpx.AsyncClient, url: httpx.URL) -> httpx.AsyncBaseTransport:
    """The transport `client` sends `url` through (its mount for the scheme, else its own):
    what `Upstream.open` hands an admitted request to directly."""
    return client._transport_for_url(url)  # httpx's own choice; tests/unit/test_netio.py pins it


__all__ = ["AsyncioBackend", "AsyncioStream", "client_transports", "transport_for"]


def upstream_client(transport: httpx.AsyncBaseTransport | None = None) -> httpx.AsyncClient:
    """The one httpx client every call to a llama-server goes through (`transport`: a test seam)."""
    # Shorter than llama-server's own 5 s keep-alive, so a pooled connection is
    # never reused in the instant the server closes it.
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=256, keepalive_expiry=2.0)
    mounts: dict[str, httpx.AsyncBaseTransport] = {}
    if transport is None:
        transport, mounts = client_transports(limits)
    return httpx.AsyncClient(
        transport=transport,
        mounts=mounts,
        timeout=httpx.Timeout(connect=5.0, read=None, write=30.0, pool=30.0),
        # One client carries every caller's requests: a cookie one answer sets must never go out
        # with another caller's request (a jar that accepts none).
        cookies=CookieJar(DefaultCookiePolicy(allowed_domains=[])),
    )
