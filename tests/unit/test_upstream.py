"""The upstream relay: SSE reads, accounting, plain answers, and header hygiene."""

from __future__ import annotations

import httpx
import pytest

from gate.backend.upstream import RelayStats, SseRelay, forward_headers, upstream_body
from gate.core.errors import GateError
from gate.core.reasons import Reason


def test_relay_stats_read_completion_tokens_from_any_endpoint_shape():
    stats = RelayStats(dispatched_at=0.0)
    stats.read_final({"usage": {"completion_tokens": 3, "prompt_tokens": 9}})
    assert stats.completion_tokens == 3
    stats.read_final({"timings": {"predicted_n": 4, "predicted_per_second": 50.0, "prompt_ms": 120.0}})
    assert stats.completion_tokens == 4
    stats.read_final({"tokens_predicted": 5})
    assert stats.completion_tokens == 5


def test_upstream_is_always_streamed_with_usage_and_keeps_the_clients_slot():
    body = {"messages": [], "stream": False, "id_slot": 2}
    out = upstream_body("chat", body)
    assert out["stream"] is True and out["stream_options"] == {"include_usage": True}
    assert out["id_slot"] == 2 and body["stream"] is False  # the input is not mutated
    assert "stream_options" not in upstream_body("completion", {"prompt": "x"})


def test_forwarded_headers_drop_hop_by_hop_client_auth_and_conversation_id():
    out = forward_headers(
        {"Authorization": "Bearer client", "X-Conversation-Id": "c", "Connection": "keep-alive", "X-Trace": "t"},
        upstream_auth="upstream",
    )
    assert out == {"X-Trace": "t", "Authorization": "Bearer upstream"}


async def test_generation_requests_ask_upstream_to_close_the_connection():
    import httpx

    from gate.backend.upstream import Upstream

    seen = {}

    def fake_llama(request: httpx.Request) -> httpx.Response:  # a fake upstream (unit test only)
        seen.update(request.headers)
        return httpx.Response(200, text="data: [DONE]\n\n")

    async with httpx.AsyncClient(transport=httpx.MockTransport(fake_llama)) as client:
        response = await Upstream(client, "http://llama:8080").open("/v1/chat/completions", {"messages": []}, {})
        await response.aclose()
    # llama-server drops the connection after a stream while advertising keep-alive.
    assert seen["connection"] == "close"


@pytest.mark.parametrize(("status", "retry_after_s"), [(502, 5.0), (503, 5.0), (504, 5.0), (500, None), (501, None), (400, None)])
async def test_only_a_backend_error_that_may_pass_is_relayed_with_retry_after(status, retry_after_s):
    """llama-server's 501 (`not_supported_error`: "This server does not support embeddings. Start
    it with `--embeddings`") never passes: with the gate's Retry-After: 5 on it, the SDKs waited
    5 s before each retry of it (a user's trial, 2026-12-05), where llama-server straight, without
    one, failed within a second. Nor does its 500, an answer to the request's content ("image
    input is not supported" on a text-only model, a trial): straight, llama-server sends no
    Retry-After. A 502/503/504 (a gateway in between, a backend loading) may pass."""
    from gate.backend.upstream import Upstream
    from gate.core.errors import GateError

    body = b'{"error":{"code":%d,"message":"m","type":"t"}}' % status

    def fake_llama(request: httpx.Request) -> httpx.Response:  # a fake upstream (unit test only)
        return httpx.Response(status, content=body, headers={"Content-Type": "application/json; charset=utf-8"})

    async with httpx.AsyncClient(transport=httpx.MockTransport(fake_llama)) as client:
        with pytest.raises(GateError) as caught:
            await Upstream(client, "http://llama:8080").open("/v1/embeddings", {"input": "x"}, {})
    assert (caught.value.status, caught.value.body, caught.value.retry_after_s) == (status, body, retry_after_s)


class _Pieces(httpx.AsyncByteStream):
    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = pieces

    async def __aiter__(self):
        for piece in self.pieces:
            yield piece


async def _reads(pieces: list[bytes], *, keep_usage: bool = True, t: float = 5.0) -> tuple[list[tuple[str, str]], SseRelay]:
    firsts: list[float] = []
    relay = SseRelay(
        httpx.Response(200, stream=_Pieces(pieces)),
        RelayStats(dispatched_at=1.0),
        lambda: t,
        lambda: firsts.append(t),
        keep_usage_chunk=keep_usage,
    )
    out = [read async for read in relay.reads()]
    assert len(firsts) == (1 if relay.stats.first_token_at is not None else 0)
    return out, relay


STREAM = (
    ": ping\n\n"
    'data: {"choices":[{"delta":{"content":"h\u00e9"}}]}\n\n'
    'data: {"choices":[{"delta":{"content":"llo"}}]}\n\n'
    'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}\n\n'
    "data: [DONE]\n\n"
).encode()


async def test_each_upstream_read_is_relayed_as_one_write_with_the_terminal_event_held_back():
    reads, relay = await _reads([STREAM])
    assert reads == [(STREAM.decode().split("data: [DONE]")[0], "data: [DONE]\n\n")]
    assert relay.stats.finished and relay.stats.first_token_at == 5.0 and relay.stats.completion_tokens == 2


async def test_reads_split_anywhere_give_the_same_events_as_one_read():
    whole, _ = await _reads([STREAM])
    expected = "".join(now + held for now, held in whole)
    for cut in range(1, len(STREAM)):  # mid-line, mid-event and inside the two-byte é
        reads, relay = await _reads([STREAM[:cut], STREAM[cut:]])
        assert "".join(now + held for now, held in reads) == expected, cut
        assert "".join(held for _, held in reads) == "data: [DONE]\n\n", cut
        assert relay.stats.completion_tokens == 2


async def test_crlf_events_a_dropped_usage_chunk_and_a_last_event_without_its_blank_line():
    crlf = STREAM.replace(b"\n", b"\r\n")[: -len(b"\r\n\r\n")]  # ends "data: [DONE]" with no blank line
    reads, relay = await _reads([crlf], keep_usage=False)
    text = "".join(now + held for now, held in reads)
    assert '"usage"' not in text and "\r" not in text
    assert text.endswith("data: [DONE]\n\n") and text.startswith(": ping\n\n")
    assert relay.stats.finished and relay.stats.completion_tokens == 2  # read from the dropped usage chunk


async def test_a_plain_answer_is_read_whole_and_dated_by_llama_servers_decode_time():
    answer = (
        b'{"content": "ab", "stop": true, "tokens_predicted": 2, "timings": {"predicted_n": 2, "predicted_ms": 1500.0, "prompt_ms": 200.0}}'
    )
    firsts: list[float] = []
    relay = SseRelay(
        httpx.Response(200, stream=_Pieces([answer[:10], answer[10:]])),
        RelayStats(dispatched_at=1.0),
        lambda: 5.0,
        lambda: firsts.append(1),
    )
    assert await relay.whole() == answer  # relayed byte for byte
    stats = relay.stats
    assert stats.finished and firsts == [1] and stats.completion_tokens == 2
    assert stats.first_token_at == 3.5 and stats.ttft_s == 2.5  # 5.0 at the end, minus 1.5 s of decoding


async def test_a_plain_answer_that_is_not_a_json_object_is_an_upstream_error():
    from gate.core.errors import GateError

    for raw in (b"not json", b"[1, 2]"):
        relay = SseRelay(httpx.Response(200, stream=_Pieces([raw])), RelayStats(dispatched_at=1.0), lambda: 5.0, lambda: None)
        with pytest.raises(GateError) as caught:
            await relay.whole()
        assert caught.value.reason.status == 502


async def test_a_completion_of_several_tasks_ends_only_with_its_last_stop_chunk():
    two = (
        b'data: {"index":0,"content":"a","stop":false}\n\n'
        b'data: {"index":0,"content":"","stop":true}\n\n'
        b'data: {"index":1,"content":"b","stop":false}\n\n'
        b'data: {"index":1,"content":"","stop":true}\n\n'
    )
    relay = SseRelay(httpx.Response(200, stream=_Pieces([two])), RelayStats(dispatched_at=1.0), lambda: 5.0, lambda: None, stops_left=2)
    reads = [read async for read in relay.reads()]
    now = "".join(n for n, _ in reads)
    held = "".join(h for _, h in reads)
    # task 1's tokens stream as they come; only the last stop chunk waits for the decision row
    assert '"index":1,"content":"b"' in now and held == 'data: {"index":1,"content":"","stop":true}\n\n'
    assert relay.stats.finished


@pytest.mark.parametrize(
    ("stream", "tasks", "generated"),
    [
        # chat, n = 2: llama-server ends each task with a usage chunk of that task's own count
        (
            b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\n'
            b'data: {"choices":[],"usage":{"completion_tokens":3,"prompt_tokens":9}}\n\n'
            b'data: {"choices":[{"index":1,"delta":{"content":"b"}}]}\n\n'
            b'data: {"choices":[],"usage":{"completion_tokens":5,"prompt_tokens":9}}\n\n'
            b"data: [DONE]\n\n",
            2,
            8,
        ),
        # /completion, two prompts: each task's stop chunk carries its tokens_predicted
        (
            b'data: {"index":0,"content":"a","stop":false}\n\n'
            b'data: {"index":0,"content":"","stop":true,"tokens_predicted":4,"timings":{"predicted_n":4}}\n\n'
            b'data: {"index":1,"content":"b","stop":false,"timings":{"predicted_n":1}}\n\n'
            b'data: {"index":1,"content":"","stop":true,"tokens_predicted":6,"timings":{"predicted_n":6}}\n\n',
            2,
            10,
        ),
        # one task: its count, as before (a negative control for the sum)
        (
            b'data: {"choices":[{"delta":{"content":"a"}}]}\n\ndata: {"choices":[],"usage":{"completion_tokens":3}}\n\ndata: [DONE]\n\n',
            1,
            3,
        ),
    ],
    ids=["chat-n2", "completion-two-prompts", "one-task"],
)
async def test_the_completion_tokens_of_several_tasks_are_their_sum(stream, tasks, generated):
    relay = SseRelay(
        httpx.Response(200, stream=_Pieces([stream])),
        RelayStats(dispatched_at=1.0),
        lambda: 5.0,
        lambda: None,
        stops_left=tasks,
        tasks=tasks,
    )
    _ = [read async for read in relay.reads()]
    assert relay.stats.completion_tokens == generated


async def test_admitted_requests_share_no_cookies_and_go_through_the_clients_own_transport():
    """Upstream.open hands the request to the client's transport (gate/backend/netio.py) with the
    client's timeouts, around the client's cookie jar: a cookie set on one tenant's answer was
    sent with every later request through `client.send` (this test failed so before)."""
    import asyncio

    from gate.backend.netio import AsyncioBackend, transport_for, upstream_client
    from gate.backend.upstream import Upstream

    heads: list[bytes] = []

    async def handler(reader, writer):
        heads.append(await reader.readuntil(b"\r\n\r\n"))
        await reader.readexactly(int(heads[-1].lower().split(b"content-length: ")[1].split(b"\r\n")[0]))
        writer.write(b"HTTP/1.1 200 OK\r\nSet-Cookie: session=tenant-a\r\nContent-Length: 14\r\n\r\ndata: [DONE]\n\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    client = upstream_client()
    async with server, client:
        transport = transport_for(client, httpx.URL(url))
        assert isinstance(transport._pool._network_backend, AsyncioBackend)  # the gate's own, not anyio's
        assert transport_for(client, httpx.URL("https://llama:8443")) is not transport
        upstream = Upstream(client, url)
        for _ in range(2):
            response = await upstream.open("/v1/chat/completions", {"messages": []}, {"X-Trace": "t"})
            assert await response.aread() == b"data: [DONE]\n\n" and response.url == httpx.URL(url + "/v1/chat/completions")
            await response.aclose()
    assert len(heads) == 2
    assert b"cookie" not in heads[1].lower().replace(b"set-cookie", b"")
    assert b"x-trace: t" in heads[1].lower() and b"connection: close" in heads[1].lower()


class _Broken(httpx.AsyncByteStream):
    async def __aiter__(self):
        yield b'data: {"choices":[{"delta":{"content":"h"}}]}\n\n'
        raise httpx.RemoteProtocolError("peer closed connection without sending complete message body")


@pytest.mark.parametrize("whole", [False, True])
async def test_a_broken_answer_is_logged_with_the_backends_port(caplog, whole):
    """Two llama-servers on one host (or a router's models) differ only by port: a log line
    naming the host alone ("backend 127.0.0.1: stream broke") did not say which one broke."""
    request = httpx.Request("POST", "http://127.0.0.1:19802/v1/chat/completions")
    relay = SseRelay(httpx.Response(200, stream=_Broken(), request=request), RelayStats(dispatched_at=1.0), lambda: 5.0, lambda: None)
    with pytest.raises(GateError) as caught:
        if whole:
            await relay.whole()
        else:
            _ = [read async for read in relay.reads()]
    assert caught.value.reason is Reason.UPSTREAM_ERROR
    assert "127.0.0.1:19802" in caplog.text
    assert "19802" not in caught.value.message  # the address is the log's, never the client's
