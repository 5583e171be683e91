"""gate/backend/netio.py over real loopback sockets: httpx requests really use it, and its failures map to httpx's."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from gate.backend.netio import AsyncioBackend, client_transports

ANSWER = b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{"ok":true}'


async def _server(handler):
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")), 0)
    return head + await reader.readexactly(length)


class CountingBackend(AsyncioBackend):
    def __init__(self) -> None:
        self.connects = 0

    async def connect_tcp(self, *args, **kwargs):
        self.connects += 1
        return await super().connect_tcp(*args, **kwargs)


def _client(limits: httpx.Limits | None = None, **timeouts) -> tuple[httpx.AsyncClient, CountingBackend]:
    plain, mounts = client_transports(limits or httpx.Limits(max_keepalive_connections=8, keepalive_expiry=5.0))
    backend = CountingBackend()
    plain._pool._network_backend = backend  # count what the real transport opens
    return httpx.AsyncClient(transport=plain, mounts=mounts, timeout=httpx.Timeout(5.0, **timeouts)), backend


async def test_requests_go_through_the_asyncio_backend_and_reuse_kept_alive_connections():
    async def handler(reader, writer):
        while True:
            try:
                body = await _read_request(reader)
            except asyncio.IncompleteReadError:
                return
            assert body.endswith(b"hello")
            writer.write(ANSWER)
            await writer.drain()

    server, url = await _server(handler)
    client, backend = _client()
    async with server, client:
        assert isinstance(client._transport_for_url(httpx.URL(url))._pool._network_backend, AsyncioBackend)
        for _ in range(3):
            r = await client.post(url + "/x", content=b"hello")
            assert r.json() == {"ok": True}
        assert backend.connects == 1


async def test_an_idle_connection_the_server_closed_says_it_is_not_fit_for_reuse():
    release = asyncio.Event()
    closed = asyncio.Event()

    async def handler(reader, writer):
        await release.wait()
        writer.close()  # what llama-server does after a stream, on a connection it kept alive
        await writer.wait_closed()
        closed.set()

    server, url = await _server(handler)
    async with server:
        port = int(url.rsplit(":", 1)[1])
        stream = await AsyncioBackend().connect_tcp("127.0.0.1", port, timeout=5)
        assert stream.get_extra_info("is_readable") is False  # open and quiet: reusable
        release.set()
        await closed.wait()
        # The FIN is on its way; the condition httpcore checks must turn True (bounded wait).
        async with asyncio.timeout(2):
            while not stream.get_extra_info("is_readable"):
                await asyncio.sleep(0.005)
        assert await stream.read(1024) == b""
        await stream.aclose()


async def test_a_read_that_gets_nothing_times_out_as_httpx_read_timeout():
    async def handler(reader, writer):
        await _read_request(reader)
        await asyncio.sleep(10)

    server, url = await _server(handler)
    client, _ = _client(read=0.2)
    async with server, client:
        with pytest.raises(httpx.ReadTimeout):
            await client.post(url, content=b"x")


async def test_a_refused_connection_is_httpx_connect_error_and_a_cut_answer_is_a_protocol_error():
    async def handler(reader, writer):
        await _read_request(reader)
        writer.write(ANSWER[:40])
        await writer.drain()
        writer.transport.abort()

    server, url = await _server(handler)
    client, _ = _client()
    async with client:
        async with server:
            with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
                await client.post(url, content=b"x")
        with pytest.raises(httpx.ConnectError):
            await client.post(url, content=b"x")  # the server is gone now


CLOSE = {"Connection": "close"}


async def test_connection_close_requests_get_their_own_connection_closed_with_the_answer_outside_the_pool():
    """What the gate sends llama-server: 32 at once, each on a connection of its own that the
    server sees closed once its answer is read; the pool never holds one."""
    ended = 0
    all_ended = asyncio.Event()
    both_in = asyncio.Event()
    arrived = 0
    in_flight: list[tuple[int, int]] = []

    async def handler(reader, writer):
        nonlocal ended, arrived
        body = await _read_request(reader)
        if b"connection: keep-alive" in body.lower():
            writer.write(ANSWER)
            return
        assert b"connection: close" in body.lower()
        arrived += 1
        if arrived == 32:
            in_flight.append((len(pool.connections), len(pool._requests)))  # what the pool holds meanwhile
            both_in.set()
        await both_in.wait()  # all 32 in flight together
        writer.write(ANSWER)
        await writer.drain()
        assert await reader.read() == b""  # the client closes it: nothing more comes
        writer.close()
        ended += 1
        if ended == 32:
            all_ended.set()

    server, url = await _server(handler)
    client, backend = _client()
    async with server, client:
        pool = client._transport_for_url(httpx.URL(url))._pool
        answers = await asyncio.gather(*(client.post(url + "/x", content=b"hello", headers=CLOSE) for _ in range(32)))
        assert [r.json() for r in answers] == [{"ok": True}] * 32
        assert backend.connects == 32
        assert in_flight == [(0, 0)]  # the pool never saw them
        await asyncio.wait_for(all_ended.wait(), 5)
        assert pool.connections == [] and pool._requests == []
        # a kept-alive request still goes through the pool
        await client.post(url + "/x", content=b"hello")
        assert len(pool.connections) == 1


async def test_a_connection_close_stream_abandoned_midway_closes_its_connection():
    """A client gone mid-answer: closing the response closes the socket, so llama-server frees the slot."""
    gone = asyncio.Event()

    async def handler(reader, writer):
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        writer.write(b"6\r\ndata:1\r\n")
        await writer.drain()
        assert await reader.read() == b""  # never answered in full: the client must hang up
        gone.set()

    server, url = await _server(handler)
    client, backend = _client()
    async with server, client:
        async with client.stream("POST", url, content=b"x", headers=CLOSE) as r:
            async for chunk in r.aiter_raw():
                assert chunk == b"data:1"
                break
        await asyncio.wait_for(gone.wait(), 5)
        assert backend.connects == 1


async def test_connection_close_requests_map_failures_to_httpx_errors():
    async def handler(reader, writer):
        await _read_request(reader)
        await asyncio.sleep(10)

    server, url = await _server(handler)
    client, _ = _client(read=0.2)
    async with client:
        async with server:
            with pytest.raises(httpx.ReadTimeout):
                await client.post(url, content=b"x", headers=CLOSE)
        with pytest.raises(httpx.ConnectError):
            await client.post(url, content=b"x", headers=CLOSE)  # the server is gone now


async def test_a_large_answer_arrives_whole_while_reading_pauses_and_resumes():
    big = bytes(range(256)) * 8192  # 2 MiB, past the high-water mark many times over

    async def handler(reader, writer):
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(big) + big)
        await writer.drain()

    server, url = await _server(handler)
    client, _ = _client()
    async with server, client:
        async with client.stream("POST", url, content=b"x") as r:
            got = bytearray()
            async for chunk in r.aiter_raw():
                got += chunk
                await asyncio.sleep(0)  # a slow reader: the buffer fills and reading pauses
        assert bytes(got) == big


def test_the_same_round_trips_and_large_answers_work_on_uvloop():
    # `tokengate serve` runs on uvloop, whose transports are not asyncio's classes.
    uvloop = pytest.importorskip("uvloop")

    async def both() -> None:
        await test_requests_go_through_the_asyncio_backend_and_reuse_kept_alive_connections()
        await test_a_large_answer_arrives_whole_while_reading_pauses_and_resumes()
        await test_an_idle_connection_the_server_closed_says_it_is_not_fit_for_reuse()
        await test_after_the_first_token_a_stream_is_read_in_batches_and_relayed_in_one_write_each()
        await test_a_chunks_crlf_left_in_h11s_buffer_is_not_more_of_the_stream()

    uvloop.run(both())


# ---- a stream's reads in batches ([gate] stream_batch_ms) ------------------------------------


def _chunk(event: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(event), event)


async def _relayed_in_batches(batch_s: float, spacing_s: float) -> tuple[list[str], float]:
    """A chunked SSE stream, as llama-server writes one: the first token, then (once the relay has
    yielded it) ten more, each a write of its own `spacing_s` apart, then [DONE]. Returns what
    SseRelay.reads yielded, one string per write the gate would make, and the seconds between
    the first two yields."""
    first_out = asyncio.Event()
    tokens = [b'data: {"choices":[{"delta":{"content":"t%d"}}]}\n\n' % i for i in range(11)]

    async def handler(reader, writer):
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n" + _chunk(tokens[0]))
        await writer.drain()
        await first_out.wait()
        for token in tokens[1:]:
            await asyncio.sleep(spacing_s)
            writer.write(_chunk(token))
            await writer.drain()
        writer.write(_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        await writer.drain()
        writer.close()

    yields, _ = await _relay(handler, batch_s, lambda now, held: first_out.set())
    writes = [now + held for now, held, _ in yields]
    assert "".join(writes) == "".join(t.decode() for t in tokens) + "data: [DONE]\n\n"  # every event, in order
    return writes, yields[1][2] - yields[0][2]


async def _relay(handler, batch_s: float, seen=None) -> tuple[list[tuple[str, str, float]], float]:
    """`handler` as the upstream, SseRelay.reads over its answer: (now, held, when) per yield,
    `seen(now, held)` called after each, and when the stream ended."""
    from gate.backend.upstream import RelayStats, SseRelay

    server, url = await _server(handler)
    client, _ = _client()
    loop = asyncio.get_running_loop()
    yields = []
    async with server, client:
        request = client.build_request("POST", url + "/v1/chat/completions", content=b"{}", headers={"connection": "close"})
        response = await client.send(request, stream=True)
        relay = SseRelay(response, RelayStats(dispatched_at=0.0), loop.time, lambda: None, batch_s=batch_s)
        async for now, held in relay.reads():
            yields.append((now, held, loop.time()))
            if seen is not None:
                seen(now, held)
        ended = loop.time()
        await response.aclose()
    return yields, ended


async def test_after_the_first_token_a_stream_is_read_in_batches_and_relayed_in_one_write_each():
    # The first token goes out alone and at once: the server sends nothing more until it did.
    writes, gap = await _relayed_in_batches(batch_s=0.5, spacing_s=0.002)
    assert writes[0].count("data:") == 1
    # The ten tokens sent 2 ms apart (~20 ms) came within one batch: one write, [DONE] with them.
    assert len(writes) == 2, [w.count("data:") for w in writes]
    # The batch waited for them (~20 ms), and went out when the body's end came with [DONE], not
    # the rest of its 0.5 s later: nothing could join it any more.
    assert 0.015 <= gap < 0.4


async def test_without_batches_each_token_is_its_own_write():
    # The negative control of the test above: the same stream with stream_batch_ms = 0.
    writes, _ = await _relayed_in_batches(batch_s=0.0, spacing_s=0.005)
    assert len(writes) >= 6, [w.count("data:") for w in writes]


async def test_once_the_terminal_event_is_in_the_streams_end_is_read_without_a_batchs_wait():
    # The end of the stream is when the gate releases the slot: a batch's wait there would
    # hold a slot the next request waits for.
    terminator_after = asyncio.Event()

    async def handler(reader, writer):
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n" + _chunk(b"data: {}\n\n"))
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(_chunk(b"data: [DONE]\n\n"))
        await writer.drain()
        await terminator_after.wait()
        writer.write(b"0\r\n\r\n")  # the chunked body's end, written apart (a read of its own)
        await writer.drain()
        writer.close()

    yields, ended = await _relay(handler, 1.0, lambda now, held: held and terminator_after.set())
    now, held, done_at = yields[-1]
    assert (now, held) == ("", "data: [DONE]\n\n")
    assert ended - done_at < 0.5  # not a 1 s batch (a few ms here)


async def _first_token(reader, writer) -> None:
    """The request read, and a chunked stream begun with its first token (no Connection: close)."""
    await _read_request(reader)
    writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + _chunk(b'data: {"t":1}\n\n'))
    await writer.drain()


async def test_the_end_written_right_behind_the_last_token_is_read_without_a_batchs_wait():
    # llama-server writes its final event, [DONE] and the last chunk 0.06 ms after the last token
    # (one read): a batch's wait there ended every answer a batch late (a plain answer, which the
    # gate streams from llama-server, and the slot's release with it).
    keep_open = asyncio.Event()
    written: list[float] = []
    loop = asyncio.get_running_loop()

    async def handler(reader, writer):
        await _first_token(reader, writer)
        await asyncio.sleep(0.05)  # the relay has yielded the first token: batches from here
        writer.write(_chunk(b'data: {"t":2}\n\n'))
        await writer.drain()
        await asyncio.sleep(0.01)
        written.append(loop.time())
        writer.write(_chunk(b'data: {"finish_reason":"length"}\n\n') + _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        await writer.drain()
        await keep_open.wait()  # the connection stays open (keep-alive): no EOF to end the wait
        writer.close()

    try:
        yields, ended = await _relay(handler, 1.0)
    finally:
        keep_open.set()
    assert "".join(now + held for now, held, _ in yields).endswith("data: [DONE]\n\n")
    assert ended - written[0] < 0.5  # not the rest of a 1 s batch (a few ms here)


async def test_a_peer_that_goes_mid_batch_ends_the_batchs_wait():
    # llama-server killed mid-answer: no last chunk, the connection closes. The read waiting out
    # its batch hears it at once (the stream broke), not a batch later.
    from gate.core.errors import GateError

    first_out = asyncio.Event()
    closed: list[float] = []
    loop = asyncio.get_running_loop()

    async def handler(reader, writer):
        await _first_token(reader, writer)
        await first_out.wait()
        writer.write(_chunk(b'data: {"t":2}\n\n'))  # read within the batch: it waits for more
        await writer.drain()
        await asyncio.sleep(0.05)
        closed.append(loop.time())
        writer.close()

    with pytest.raises(GateError):
        await _relay(handler, 1.0, lambda now, held: first_out.set())
    assert loop.time() - closed[0] < 0.5  # not the rest of a 1 s batch


async def _role_then_content(role: bytes) -> tuple[float, float, float]:
    """llama-server's chat stream: `role` (its role-only opening chunk), then the first token's
    text 50 ms later, on a kept-open connection, relayed with a 1 s batch. Returns when the text
    was written, when the relay yielded it, and the relay's first-token time."""
    from gate.backend.upstream import RelayStats, SseRelay

    keep_open = asyncio.Event()
    content = b'data: {"choices":[{"index":0,"delta":{"content":"Hi"}}]}\n\n'
    written: list[float] = []
    loop = asyncio.get_running_loop()

    async def handler(reader, writer):
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + _chunk(role))
        await writer.drain()
        await asyncio.sleep(0.05)
        written.append(loop.time())
        writer.write(_chunk(content))
        await writer.drain()
        await keep_open.wait()
        writer.close()

    server, url = await _server(handler)
    client, _ = _client()
    stats = RelayStats(dispatched_at=0.0)
    async with server, client:
        request = client.build_request("POST", url + "/v1/chat/completions", content=b"{}", headers={"connection": "close"})
        response = await client.send(request, stream=True)
        relay = SseRelay(response, stats, loop.time, lambda: None, batch_s=1.0)
        try:
            async for now, _held in relay.reads():
                if "Hi" in now:
                    out = loop.time()
                    break
        finally:
            keep_open.set()
            await response.aclose()
    return written[0], out, stats.first_token_at


async def test_a_chat_streams_role_chunk_is_not_its_first_token():
    # The first token is the first text: a client's TTFT (aiperf's, the OpenAI SDK's). Batching
    # from the role chunk on held that text back by up to a batch (+7 ms at p50 with 10 ms batches).
    role = b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":null}}],"object":"chat.completion.chunk"}\n\n'
    written, out, first_token_at = await _role_then_content(role)
    assert out - written < 0.5  # not the rest of a 1 s batch (a few ms here)
    assert first_token_at >= written  # measured at the text, not 50 ms early at the role


async def test_a_role_chunk_that_carries_text_is_the_first_token():
    # The negative control: the same stream whose opening chunk has text too (the role and the
    # first token in one chunk) is batched from there, so the second text waits for the batch.
    role = b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":"Oh"}}]}\n\n'
    written, out, first_token_at = await _role_then_content(role)
    assert first_token_at < written
    assert out - written >= 0.5  # in the 1 s batch that began at the first token


async def test_a_chunks_crlf_left_in_h11s_buffer_is_not_more_of_the_stream():
    # After a chunk h11 keeps its CRLF until asked for the next event: if that counted as
    # "more is here", the relay would hold the batch back for one more read (a whole batch late).
    from gate.backend.netio import BODY_EXTENSION

    done = asyncio.Event()

    async def handler(reader, writer):
        await _read_request(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n" + _chunk(b"data: a\n\n") + _chunk(b"data: b\n\n")
        )
        await writer.drain()
        await done.wait()
        writer.close()

    server, url = await _server(handler)
    client, _ = _client()
    async with server, client:
        request = client.build_request("POST", url + "/x", content=b"{}", headers={"connection": "close"})
        response = await client.send(request, stream=True)
        body = response.extensions[BODY_EXTENSION]
        parts = response.aiter_raw()
        first = await parts.__anext__()
        while first == b"":
            first = await parts.__anext__()
        assert first == b"data: a\n\n"
        assert body.pending() is True  # the second chunk is in h11's buffer
        assert await parts.__anext__() == b"data: b\n\n"
        assert body.pending() is False  # only its CRLF is left
        done.set()
        await response.aclose()


async def test_the_upstream_client_keeps_no_cookie_for_the_next_caller():
    # One client carries every caller's forwarded requests (gate/http/forward.py): a cookie one
    # answer sets would go out with the next caller's request from a normal jar.
    from gate.backend.netio import upstream_client

    async def handler(reader, writer):
        head = await _read_request(reader)
        cookie = b"yes" if b"\r\ncookie:" in head.lower() else b"no!"
        writer.write(b"HTTP/1.1 200 OK\r\nSet-Cookie: session=caller-a; Path=/\r\nContent-Length: 3\r\n\r\n" + cookie)
        await writer.drain()
        writer.close()

    server, url = await _server(handler)
    client = upstream_client()
    async with server, client:
        assert (await client.get(url + "/props")).content == b"no!"
        assert (await client.get(url + "/props")).content == b"no!"  # "yes" from a jar that keeps it
        assert len(client.cookies.jar) == 0
