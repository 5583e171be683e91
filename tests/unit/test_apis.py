"""Tests for gate/http/apis/: the Messages and Responses intake and cost model, their stream
readers, their error shapes, and their counting routes (a fake llama-server, httpx.MockTransport)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from gate.backend.tokens import TokenCounter, prompt_fields
from gate.backend.upstream import RelayStats, SseRelay, upstream_body
from gate.config import parse_config
from gate.core.errors import GateError, anthropic_error_object, render
from gate.core.reasons import Reason
from gate.http.apis.anthropic import MessagesEvents
from gate.http.apis.dispatch import error_shape, event_format, parse_request
from gate.http.apis.responses import ResponsesEvents
from gate.http.assembly import stream_loses
from gate.http.intake import build_intake
from gate.http.tenants import Caller, TenantDirectory

CONFIG = parse_config(
    """
default_class = "interactive"
[classes.interactive]
priority = 10
default_max_tokens = 256
max_tokens_cap = 1024
"""
)
OPEN = TenantDirectory.from_config(CONFIG, {})
MSG = [{"role": "user", "content": "hi"}]


def parse(path: str, body: Any, client: str = "10.0.0.1"):
    return parse_request(path, json.dumps(body).encode(), {}, client, CONFIG, OPEN)


def refused(path: str, body: Any) -> GateError:
    with pytest.raises(GateError) as info:
        parse(path, body)
    assert info.value.reason is Reason.INVALID_REQUEST and info.value.status == 400
    return info.value


# ---- Messages: intake and cost -----------------------------------------------------------


def test_messages_max_tokens_is_the_limit_and_the_body_goes_as_sent() -> None:
    body = {"model": "m", "max_tokens": 40, "messages": MSG, "system": [{"type": "text", "text": "be brief"}], "stream": True}
    it = parse("/v1/messages", body)
    assert (it.kind, it.max_tokens, it.max_tokens_injected, it.stream, it.model) == ("messages", 40, False, True, "m")
    assert it.body == body and it.body is not body


def test_messages_without_max_tokens_get_the_class_default_not_llama_servers_4096() -> None:
    it = parse("/v1/messages", {"messages": MSG})
    assert it.max_tokens == 256 and it.max_tokens_injected and it.body["max_tokens"] == 256


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": MSG, "max_tokens": 1025}, "max_tokens"),  # over the class cap
        ({"messages": MSG, "max_tokens": -1}, "max_tokens"),
        ({"messages": MSG, "max_tokens": "8"}, "max_tokens"),
        ({"messages": MSG, "n_predict": 5000}, "n_predict"),
        ({"max_tokens": 8}, "messages"),
        ({"messages": [{"content": "hi"}], "max_tokens": 8}, "messages[0].role"),
        ({"messages": [{"role": "user"}], "max_tokens": 8}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": [{"type": "text", "text": 3}]}], "max_tokens": 8}, "messages[0].content[0].text"),
        ({"messages": MSG, "stream": "yes"}, "stream"),
    ],
)
def test_messages_bad_input_is_a_400_naming_the_field(body, param) -> None:
    assert refused("/v1/messages", body).param == param


def test_messages_agreeing_limits_are_accepted_and_an_assistant_without_content_skipped() -> None:
    it = parse("/v1/messages", {"messages": [*MSG, {"role": "assistant"}], "max_tokens": 9, "n_predict": 9})
    assert it.max_tokens == 9


@pytest.mark.parametrize(
    ("path", "body"),
    [
        # llama-server reads these as it can and answers 200 (server-chat.cpp skips a block or a
        # system it cannot use), so the gate forwards them: tests/integration/test_apis_llama.py
        # SHAPES checks each against llama-server itself
        ("/v1/messages", {"messages": [{"role": "user", "content": [{"text": "x"}, 5]}], "max_tokens": 8}),
        ("/v1/messages", {"messages": MSG, "system": 3}),
        ("/v1/messages", {"messages": MSG, "system": [{"type": "text"}, 5]}),
        ("/v1/messages", {"messages": MSG, "metadata": {"user_id": 7}}),
        ("/v1/messages", {"messages": MSG, "metadata": 5, "model": 3}),
        ("/v1/messages", {"messages": [{"role": "user", "content": None}]}),
        ("/v1/responses", {"input": "hi", "instructions": ["x"]}),
        ("/v1/responses", {"input": "hi", "stream_options": {"include_usage": True}}),
        ("/v1/responses", {"input": "hi", "user": 5, "model": 7}),
    ],
)
def test_what_llama_server_reads_leniently_is_forwarded(path, body) -> None:
    it = parse(path, body)
    assert {k: it.body[k] for k in body} == body and it.model is None and not it.include_usage


@pytest.mark.parametrize(("path", "field"), [("/v1/messages", "max_tokens"), ("/v1/responses", "max_output_tokens")])
def test_a_zero_limit_reserves_the_one_token_llama_server_decodes(path, field) -> None:
    body = {"messages": MSG} if path == "/v1/messages" else {"input": "hi"}
    it = parse(path, {**body, field: 0})
    assert it.body[field] == 0 and it.max_tokens == 1


@pytest.mark.parametrize(
    ("path", "body", "reserved"),
    [
        # llama-server drops n_predict on /v1/messages and runs max_tokens, else 4096: the gate
        # injects max_tokens beside it (471 tokens ran on a reservation of 5 before)
        ("/v1/messages", {"messages": MSG, "n_predict": 5}, 256),
        ("/v1/messages", {"messages": MSG, "max_tokens": 8, "n_predict": 1000}, 1000),
        ("/v1/messages", {"messages": MSG, "max_tokens": 8, "max_completion_tokens": 900}, 900),
        ("/v1/responses", {"input": "hi", "max_output_tokens": 8, "n_predict": 900}, 900),
        ("/v1/responses", {"input": "hi", "max_output_tokens": 8, "max_tokens": 900}, 900),
        ("/v1/responses", {"input": "hi", "max_output_tokens": 8, "max_tokens": "x"}, 8),
    ],
)
def test_a_limit_under_another_name_is_reserved_never_bypassed(path, body, reserved) -> None:
    it = parse(path, body)
    assert it.max_tokens == reserved
    if path == "/v1/messages" and "max_tokens" not in body:
        assert it.body["max_tokens"] == 256 and it.max_tokens_injected  # what llama-server reads here


def test_empty_lists_are_llama_servers_to_answer() -> None:
    # llama-server answers an empty Messages list 200 (its own test_anthropic_empty_messages)
    assert parse("/v1/messages", {"messages": [], "max_tokens": 8}).max_tokens == 8
    assert parse("/v1/responses", {"input": []}).max_tokens == 256


def test_messages_open_mode_caller_is_metadata_user_id() -> None:
    it = parse("/v1/messages", {"messages": MSG, "metadata": {"user_id": "ann"}})
    assert it.caller.tenant == "ann"


def test_intake_refuses_to_build_the_adapters_kinds_itself() -> None:
    caller = Caller("t", "interactive", None)
    with pytest.raises(ValueError):
        build_intake("messages", "/v1/messages", {"messages": MSG}, caller, CONFIG)


# ---- Responses: intake and cost ----------------------------------------------------------


@pytest.mark.parametrize("path", ["/v1/responses", "/responses"])
def test_responses_max_output_tokens_is_the_limit(path) -> None:
    it = parse(path, {"input": "hi", "max_output_tokens": 30, "instructions": "terse"})
    assert (it.kind, it.path, it.max_tokens, it.max_tokens_injected) == ("responses", path, 30, False)


def test_responses_without_a_limit_get_the_class_default_as_max_output_tokens() -> None:
    it = parse("/v1/responses", {"input": [{"role": "user", "content": "hi"}]})
    assert it.max_tokens == 256 and it.body["max_output_tokens"] == 256 and "max_tokens" not in it.body


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": "hi", "max_output_tokens": 2000}, "max_output_tokens"),
        # llama-server reads n_predict before the max_tokens that max_output_tokens becomes
        ({"input": "hi", "n_predict": -1}, "n_predict"),
        ({"input": "hi", "n": 0}, "n"),
        ({}, "input"),
        ({"input": 3}, "input"),
        ({"input": ["hi"]}, "input[0]"),
        ({"input": "hi", "previous_response_id": "resp_1"}, "previous_response_id"),
    ],
)
def test_responses_bad_input_is_a_400_naming_the_field(body, param) -> None:
    assert refused("/v1/responses", body).param == param


@pytest.mark.parametrize(("path", "body"), [("/v1/responses", {"input": "hi"}), ("/v1/messages", {"messages": MSG, "max_tokens": 8})])
def test_messages_and_responses_are_admitted_for_every_copy_llama_server_runs(path, body) -> None:
    # llama-server reads n_cmpl (else n) on Responses (its chat body keeps them) and drops both on
    # Messages (a new body: one task); a number there still counts: the gate reserves the most.
    assert parse(path, body).copies == 1
    assert parse(path, {**body, "n": 3}).copies == 3
    assert parse(path, {**body, "n": 3, "n_cmpl": 2}).copies == 3  # n_cmpl read, n counted too: the most
    assert parse(path, {**body, "n": "x", "n_cmpl": 2}).copies == 2  # an alias llama-server ignores
    if path == "/v1/responses":
        assert refused(path, {**body, "n_cmpl": 0}).param == "n_cmpl"  # read: llama-server's 400 too
    else:
        assert parse(path, {**body, "n_cmpl": 0, "n": "x"}).copies == 1  # dropped: llama-server's 200


def test_the_openai_routes_still_go_through_intake() -> None:
    it = parse("/v1/chat/completions", {"messages": MSG, "user": "bob"})
    assert (it.kind, it.max_tokens, it.caller.tenant) == ("chat", 256, "bob")


# ---- the upstream body and the plain relay -----------------------------------------------


def test_the_typed_apis_get_no_stream_options_and_their_plain_answer_is_relayed_as_sent() -> None:
    for kind in ("messages", "responses"):
        assert upstream_body(kind, {"x": 1}) == {"x": 1, "stream": True}
        assert stream_loses(kind, {})
    assert "stream_options" in upstream_body("chat", {})


# ---- error shapes ------------------------------------------------------------------------


def test_anthropic_shape_by_status_with_the_gates_code_and_retry_after() -> None:
    cases = {
        Reason.INVALID_REQUEST: "invalid_request_error",
        Reason.INVALID_API_KEY: "authentication_error",
        Reason.CLASS_NOT_ALLOWED: "permission_error",
        Reason.MODEL_NOT_FOUND: "invalid_request_error",  # 400, as llama-server's router
        Reason.BODY_TOO_LARGE: "request_too_large",
        Reason.QUEUE_FULL: "rate_limit_error",
        Reason.SHED_OVERRUN: "overloaded_error",
        Reason.SHUTTING_DOWN: "overloaded_error",
        Reason.UPSTREAM_ERROR: "api_error",
        Reason.UPSTREAM_TIMEOUT: "timeout_error",
    }
    for reason, kind in cases.items():
        body = anthropic_error_object(GateError(reason, "why"))
        assert body == {"type": "error", "error": {"type": kind, "message": "why", "code": reason.value}}, reason
    status, headers, raw = render(GateError(Reason.QUEUE_FULL, "full", retry_after_s=2.5), "anthropic")
    assert status == 429 and (b"Retry-After", b"3") in headers and (b"Retry-After-Ms", b"2500") in headers
    assert json.loads(raw) == {
        "type": "error",
        "error": {"type": "rate_limit_error", "message": "full", "code": "queue_full"},
        "retry_after_s": 2.5,
    }


def test_a_backends_own_body_is_relayed_whatever_the_shape() -> None:
    err = GateError(Reason.UPSTREAM_ERROR, "backend answered 400", status=400, body=b'{"error":{"code":400}}')
    assert render(err, "anthropic")[2] == b'{"error":{"code":400}}'


def test_error_shape_by_path() -> None:
    assert error_shape("/v1/messages") == error_shape("/v1/messages/count_tokens") == "anthropic"
    assert error_shape("/v1/messagesX") == error_shape("/v1/responses") == error_shape("/v1/chat/completions") == "openai"


# ---- the stream readers ------------------------------------------------------------------

ANTHROPIC_STREAM = (
    'event: message_start\ndata: {"message":{"id":"m1","usage":{"input_tokens":5,"output_tokens":0}},"type":"message_start"}\n\n'
    'event: content_block_start\ndata: {"content_block":{"text":"","type":"text"},"index":0,"type":"content_block_start"}\n\n'
    'event: content_block_delta\ndata: {"delta":{"text":"a","type":"text_delta"},"index":0,"type":"content_block_delta"}\n\n'
    ":\n\n"
    'event: content_block_delta\ndata: {"delta":{"text":"b","type":"text_delta"},"index":0,"type":"content_block_delta"}\n\n'
    'event: content_block_stop\ndata: {"index":0,"type":"content_block_stop"}\n\n'
    'event: message_delta\ndata: {"delta":{"stop_reason":"max_tokens"},"type":"message_delta","usage":{"output_tokens":2}}\n\n'
    'event: message_stop\ndata: {"type":"message_stop"}\n\n'
)
RESPONSES_STREAM = (
    'event: response.created\ndata: {"response":{"id":"resp_9","object":"response","status":"in_progress"},"type":"response.created"}\n\n'
    'event: response.in_progress\ndata: {"response":{"id":"resp_9"},"type":"response.in_progress"}\n\n'
    'event: response.output_text.delta\ndata: {"delta":"a","item_id":"msg_1","type":"response.output_text.delta"}\n\n'
    'event: response.output_text.delta\ndata: {"delta":"b","item_id":"msg_1","type":"response.output_text.delta"}\n\n'
    'event: response.output_text.done\ndata: {"item_id":"msg_1","text":"ab","type":"response.output_text.done"}\n\n'
    'event: response.completed\ndata: {"response":{"id":"resp_9","status":"completed","usage":{"input_tokens":5,"output_tokens":2}},'
    '"timings":{"predicted_n":2},"type":"response.completed"}\n\n'
)


async def relay(stream: str, events, split: int = 7) -> tuple[SseRelay, str, str, list[float]]:
    data = stream.encode()

    async def body():
        for i in range(0, len(data), split):  # reads cut anywhere, mid-line included
            yield data[i : i + split]

    firsts: list[float] = []
    ticks = iter(range(1, 10_000))
    relay = SseRelay(
        httpx.Response(200, content=body()), RelayStats(0.0), lambda: float(next(ticks)), lambda: firsts.append(1.0), events=events
    )
    now, held = "", ""
    async for a, b in relay.reads():
        now, held = now + a, held + b
    return relay, now, held, firsts


async def test_messages_stream_tokens_are_content_deltas_and_message_stop_is_held_back() -> None:
    r, now, held, firsts = await relay(ANTHROPIC_STREAM, MessagesEvents())
    assert now + held == ANTHROPIC_STREAM  # relayed as sent, pings included
    assert held == 'event: message_stop\ndata: {"type":"message_stop"}\n\n'
    assert (r.stats.tokens, r.stats.completion_tokens, r.stats.finished, r.error) == (2, 2, True, None)
    assert len(firsts) == 1 and r.stats.first_token_at is not None


async def test_responses_stream_tokens_are_deltas_and_completed_ends_it() -> None:
    events = ResponsesEvents()
    r, now, held, _ = await relay(RESPONSES_STREAM, events)
    assert now + held == RESPONSES_STREAM and held.startswith("event: response.completed")
    assert (r.stats.tokens, r.stats.completion_tokens, r.stats.finished) == (2, 2, True)
    assert events.response == {"id": "resp_9", "object": "response", "status": "in_progress"}


async def test_llama_servers_own_mid_stream_errors_are_seen() -> None:
    cut = ANTHROPIC_STREAM.split("event: content_block_stop")[0]
    r, *_ = await relay(cut + 'event: error\ndata: {"code":500,"message":"boom","type":"server_error"}\n\n', MessagesEvents())
    assert r.error == {"code": 500, "message": "boom", "type": "server_error"} and not r.stats.finished
    cut = RESPONSES_STREAM.split("event: response.output_text.done")[0]
    r, *_ = await relay(cut + 'data: {"error":{"code":500,"message":"boom"}}\n\n', ResponsesEvents())
    assert r.error == {"code": 500, "message": "boom"} and not r.stats.finished


async def test_the_gates_own_error_events() -> None:
    err = GateError(Reason.SHED_OVERRUN, "no progress")
    raw = MessagesEvents().error_event(err).decode()
    assert raw.startswith("event: error\ndata: ") and raw.endswith("\n\n")
    assert json.loads(raw.split("data: ", 1)[1]) == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "no progress", "code": "shed_overrun"},
    }
    events = ResponsesEvents()
    await relay(RESPONSES_STREAM.split("event: response.output_text.done")[0], events)
    first, second = events.error_event(err).decode().strip().split("\n\n")
    assert first.startswith("event: error\n") and second.startswith("event: response.failed\n")
    error = json.loads(first.split("data: ", 1)[1])
    assert (error["type"], error["code"], error["message"], error["sequence_number"]) == ("error", "shed_overrun", "no progress", 4)
    failed = json.loads(second.split("data: ", 1)[1])
    assert failed["type"] == "response.failed" and failed["sequence_number"] == 5
    assert failed["response"] == {
        "id": "resp_9",
        "object": "response",
        "status": "failed",
        "error": {"code": "shed_overrun", "message": "no progress"},
    }
    assert event_format("chat") is None and isinstance(event_format("responses"), ResponsesEvents)


async def test_a_plain_answer_without_timings_leaves_ttft_unmeasured() -> None:
    seen: list[int] = []
    r = SseRelay(httpx.Response(200, content=b'{"usage":{"output_tokens":3}}'), RelayStats(0.0), lambda: 5.0, lambda: seen.append(1))
    await r.whole()
    assert (r.stats.ttft_s, r.stats.completion_tokens, r.stats.finished, seen) == (None, 3, True, [1])


# ---- counting on llama-server's own routes -------------------------------------------------


async def test_messages_and_responses_are_counted_by_their_own_routes_and_cached() -> None:
    calls: list[tuple[str, dict]] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        calls.append((request.url.path, json.loads(request.content)))
        return httpx.Response(200, json={"input_tokens": 17})

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        counter = TokenCounter(client, cache_size=8, timeout_s=1.0)
        body = {"model": "m", "system": "s", "messages": MSG, "max_tokens": 9, "stream": True, "temperature": 0.5}
        first = await counter.count("http://b", "messages", body)
        again = await counter.count("http://b", "messages", {**body, "max_tokens": 99})  # the limit is no prompt
        assert (first.tokens, first.source, again.cached) == (17, "exact", True)
        resp = await counter.count("http://b", "responses", {"input": "hi", "instructions": "x", "max_output_tokens": 5})
        assert resp.tokens == 17
    assert calls == [
        ("/v1/messages/count_tokens", {"messages": MSG, "system": "s"}),
        ("/v1/responses/input_tokens", {"input": "hi", "instructions": "x"}),
    ]


async def test_a_build_without_the_counting_route_gets_estimates() -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(404)

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        counter = TokenCounter(client, cache_size=8, timeout_s=1.0)
        count = await counter.count("http://b", "responses", {"input": "hello there"})
    assert count.source == "estimate" and count.tokens >= 1


def test_prompt_fields_keep_what_llama_server_templates() -> None:
    body = {"system": "s", "messages": MSG, "tools": [], "thinking": {"type": "enabled"}, "max_tokens": 3, "stop_sequences": ["x"]}
    assert set(prompt_fields("messages", body)) == {"system", "messages", "tools", "thinking"}
    body = {"input": "i", "instructions": "s", "tools": [], "reasoning": {}, "max_output_tokens": 3, "messages": ["ignored"]}
    assert set(prompt_fields("responses", body)) == {"input", "instructions", "tools", "reasoning"}


@pytest.mark.parametrize(("stream", "events"), [(RESPONSES_STREAM, ResponsesEvents), (ANTHROPIC_STREAM, MessagesEvents)])
async def test_ttft_is_the_first_content_event_not_the_first_event(stream, events) -> None:
    # one read per event, each at its own time: the first token is the first *.delta / content_block_delta
    parts = [p + "\n\n" for p in stream.split("\n\n") if p]
    now = [0.0]

    async def body():
        for i, part in enumerate(parts):
            now[0] = float(i + 1)
            yield part.encode()

    r = SseRelay(httpx.Response(200, content=body()), RelayStats(0.0), lambda: now[0], lambda: None, events=events())
    async for _ in r.reads():
        pass
    first_delta = next(i for i, p in enumerate(parts) if "delta" in p.split("\n")[0] and "message_delta" not in p)
    assert r.stats.first_token_at == float(first_delta + 1) > 1.0


def test_a_messages_field_that_is_not_a_list_is_llama_servers_to_answer() -> None:
    # server-chat.cpp converts only an array: anything else is no messages, and it answers 200
    assert parse("/v1/messages", {"messages": "hi", "max_tokens": 8}).max_tokens == 8
    assert refused("/v1/messages", {"max_tokens": 8}).param == "messages"  # absent: its 500, the gate's 400
