"""Assembling non-streaming answers from llama-server's stream chunks, and header hygiene."""

from __future__ import annotations

import httpx

from gate.upstream import RelayStats, SseRelay, assemble, forward_headers, upstream_body


def test_chat_answer_is_assembled_with_content_finish_reason_usage_and_timings():
    chunks = [
        {"id": "c1", "created": 7, "model": "m", "choices": [{"index": 0, "delta": {"role": "assistant", "content": None}}]},
        {"id": "c1", "created": 7, "model": "m", "choices": [{"index": 0, "delta": {"content": "Hel"}}]},
        {"id": "c1", "created": 7, "model": "m", "choices": [{"index": 0, "delta": {"content": "lo"}}]},
        {"id": "c1", "created": 7, "model": "m", "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}], "timings": {"predicted_n": 2}},
        {"id": "c1", "created": 7, "model": "m", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}},
    ]
    out = assemble("chat", chunks)
    assert out["object"] == "chat.completion"
    assert out["choices"] == [{"index": 0, "message": {"role": "assistant", "content": "Hello"}, "finish_reason": "length"}]
    assert out["usage"]["completion_tokens"] == 2
    assert out["timings"] == {"predicted_n": 2}
    assert (out["id"], out["created"], out["model"]) == ("c1", 7, "m")


def test_streamed_tool_call_fragments_are_joined():
    chunks = [
        {"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "t1", "function": {"name": "get_", "arguments": '{"a"'}}]}}]},
        {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"name": "time", "arguments": ": 1}"}}]}}]},
        {"choices": [{"delta": {}, "finish_reason": "tool_calls"}]},
    ]
    message = assemble("chat", chunks)["choices"][0]["message"]
    assert message["content"] is None
    assert message["tool_calls"] == [{"type": "function", "id": "t1", "function": {"name": "get_time", "arguments": '{"a": 1}'}}]


def test_text_completion_and_native_completion_are_assembled():
    text = assemble("completions", [{"choices": [{"text": "a"}]}, {"choices": [{"text": "b", "finish_reason": "stop"}]}])
    assert text["choices"][0]["text"] == "ab" and text["choices"][0]["finish_reason"] == "stop"
    native = assemble(
        "completion",
        [{"content": "x", "stop": False}, {"content": "y", "stop": False}, {"content": "", "stop": True, "tokens_predicted": 2}],
    )
    assert native["content"] == "xy" and native["stop"] is True and native["tokens_predicted"] == 2


def test_relay_stats_read_completion_tokens_from_any_endpoint_shape():
    stats = RelayStats(dispatched_at=0.0)
    stats.read_final({"usage": {"completion_tokens": 3, "prompt_tokens": 9}})
    assert stats.completion_tokens == 3
    stats.read_final({"timings": {"predicted_n": 4, "predicted_per_second": 50.0, "prompt_ms": 120.0}})
    assert stats.completion_tokens == 4
    stats.read_final({"tokens_predicted": 5})
    assert stats.completion_tokens == 5


def test_upstream_is_always_streamed_with_usage_and_never_pinned_to_a_slot():
    body = {"messages": [], "stream": False, "id_slot": 2}
    out = upstream_body("chat", body)
    assert out["stream"] is True and out["stream_options"] == {"include_usage": True}
    assert "id_slot" not in out and body["stream"] is False  # the input is not mutated
    assert "stream_options" not in upstream_body("completion", {"prompt": "x"})


def test_forwarded_headers_drop_hop_by_hop_client_auth_and_conversation_id():
    out = forward_headers(
        {"Authorization": "Bearer client", "X-Conversation-Id": "c", "Connection": "keep-alive", "X-Trace": "t"},
        upstream_auth="upstream",
    )
    assert out == {"X-Trace": "t", "Authorization": "Bearer upstream"}


async def test_generation_requests_ask_upstream_to_close_the_connection():
    import httpx

    from gate.upstream import Upstream

    seen = {}

    def fake_llama(request: httpx.Request) -> httpx.Response:  # a fake upstream (unit test only)
        seen.update(request.headers)
        return httpx.Response(200, text="data: [DONE]\n\n")

    async with httpx.AsyncClient(transport=httpx.MockTransport(fake_llama)) as client:
        response = await Upstream(client, "http://llama:8080").open("/v1/chat/completions", {"messages": []}, {})
        await response.aclose()
    # llama-server drops the connection after a stream while advertising keep-alive.
    assert seen["connection"] == "close"


class _Pieces(httpx.AsyncByteStream):
    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = pieces

    async def __aiter__(self):
        for piece in self.pieces:
            yield piece


async def _reads(pieces: list[bytes], *, keep_usage: bool = True, t: float = 5.0) -> tuple[list[tuple[str, str]], SseRelay]:
    firsts: list[float] = []
    relay = SseRelay(
        httpx.Response(200, stream=_Pieces(pieces)), RelayStats(dispatched_at=1.0), lambda: t,
        lambda: firsts.append(t), keep_usage_chunk=keep_usage,
    )
    out = [read async for read in relay.reads()]
    assert len(firsts) == (1 if relay.stats.first_token_at is not None else 0)
    return out, relay


STREAM = (
    ': ping\n\n'
    'data: {"choices":[{"delta":{"content":"h\u00e9"}}]}\n\n'
    'data: {"choices":[{"delta":{"content":"llo"}}]}\n\n'
    'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}\n\n'
    'data: [DONE]\n\n'
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
