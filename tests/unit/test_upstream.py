"""Assembling non-streaming answers from llama-server's stream chunks, and header hygiene."""

from __future__ import annotations

from gate.upstream import RelayStats, assemble, forward_headers, upstream_body


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


def test_relay_stats_read_usage_and_timings_from_any_endpoint_shape():
    stats = RelayStats(dispatched_at=0.0)
    stats.read_final({"usage": {"completion_tokens": 3, "prompt_tokens": 9}})
    stats.read_final({"timings": {"predicted_n": 4, "predicted_per_second": 50.0, "prompt_ms": 120.0}})
    assert (stats.completion_tokens, stats.prompt_tokens, stats.decode_tps, stats.prompt_s) == (4, 9, 50.0, 0.12)


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
