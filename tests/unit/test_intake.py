"""Tests for gate/http/intake.py: raw request -> validated Intake or an OpenAI-shaped 4xx."""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

import pytest

from gate.config import parse_config
from gate.core.errors import GateError, error_object
from gate.core.reasons import Reason
from gate.http.intake import (
    ENDPOINTS,
    MAX_JSON_DEPTH,
    Intake,
    build_intake,
    fit_injected,
    parse_request,
)
from gate.http.tenants import Caller, TenantDirectory

CHAT = "/v1/chat/completions"
CMPL = "/v1/completions"
NATIVE = "/completion"

CONFIG_TOML = """
default_class = "interactive"
[classes.interactive]
priority = 10
default_max_tokens = 256
max_tokens_cap = 1024
[classes.batch]
priority = 1
default_max_tokens = 512
max_tokens_cap = 8192
"""
CONFIG = parse_config(CONFIG_TOML)
OPEN = TenantDirectory.from_config(CONFIG, {})

KEY = "sk-intake-test"
TENANT_CONFIG = parse_config(
    CONFIG_TOML
    + f"""
[[tenants]]
name = "team-a"
api_key_sha256 = "{hashlib.sha256(KEY.encode()).hexdigest()}"
"""
)
TENANTS = TenantDirectory.from_config(TENANT_CONFIG, {})

MSG = [{"role": "user", "content": "hi"}]


def raw(body: Any) -> bytes:
    return json.dumps(body).encode()


def parse(
    path: str,
    body: Any,
    headers: dict[str, str] | None = None,
    host: str | None = "10.0.0.9",
    config=CONFIG,
    tenants=OPEN,
) -> Intake:
    data = body if isinstance(body, bytes) else raw(body)
    return parse_request(path, data, headers or {}, host, config, tenants)


def refusal(path: str, body: Any, **kw: Any) -> GateError:
    with pytest.raises(GateError) as info:
        parse(path, body, **kw)
    return info.value


def nested(depth: int) -> bytes:
    return b'{"model": "m", "x": ' + b"[" * depth + b"]" * depth + b"}"


# -- malformed requests: (path, body, param, fragment of the message) ----------------------------
# Every one is 400 invalid_request in open mode.

BAD = [
    # the body as a whole
    pytest.param(CHAT, b"", None, "empty", id="empty-body"),
    pytest.param(CHAT, b"   \n", None, "empty", id="blank-body"),
    pytest.param(CHAT, b'{"model": "m", "messages": \xff}', None, "UTF-8", id="invalid-utf8"),
    pytest.param(CHAT, b'{"model": "\xc3\x28"}', None, "at byte 11", id="invalid-utf8-position"),
    pytest.param(CHAT, b'{"model": "m",', None, "line 1, column 15", id="truncated-json"),
    pytest.param(CHAT, b'{"messages": [\n  {"role": "user",}\n]}', None, "line 2", id="trailing-comma"),
    pytest.param(CHAT, b"{'model': 'm'}", None, "invalid JSON", id="single-quotes"),
    pytest.param(CHAT, b'{"max_tokens": NaN}', None, "NaN is not a JSON value", id="nan"),
    pytest.param(CHAT, b'{"max_tokens": Infinity}', None, "Infinity", id="infinity"),
    pytest.param(CHAT, b'{"max_tokens": 10, "max_tokens": 99999}', None, "duplicate key", id="duplicate-key"),
    pytest.param(CHAT, b'{"n": ' + b"9" * 5000 + b"}", None, "digits", id="huge-int-literal"),
    pytest.param(CHAT, b'{"temperature": 1e309, "messages": []}', "temperature", "finite", id="float-overflow"),
    pytest.param(CHAT, b'{"logit_bias": {"5": [-1e999]}}', "logit_bias.5[0]", "finite", id="nested-overflow"),
    pytest.param(CHAT, b'{"seed": 18446744073709551616}', "seed", "out of range", id="int-above-uint64"),
    pytest.param(CHAT, b'{"seed": -9223372036854775809}', "seed", "out of range", id="int-below-int64"),
    pytest.param(
        CHAT,
        b'{"messages": [{"role": "user", "content": "a\\ud800b"}]}',
        "messages[0].content",
        "surrogate",
        id="lone-surrogate",
    ),
    pytest.param(CHAT, b'{"\\udfff": 1}', "\\udfff", "surrogate", id="lone-surrogate-key"),
    pytest.param(CHAT, b"[1, 2]", None, "JSON object, got an array", id="array-body"),
    pytest.param(CHAT, b'"hello"', None, "JSON object, got string", id="string-body"),
    pytest.param(CHAT, b"null", None, "JSON object, got null", id="null-body"),
    pytest.param(CHAT, nested(100_000), None, "nested deeper", id="deep-nesting-recursion"),
    pytest.param(CHAT, nested(MAX_JSON_DEPTH + 5), None, "nested deeper", id="deep-nesting-walk"),
    # common fields
    pytest.param(CHAT, {"stream": "true", "messages": MSG}, "stream", "boolean", id="stream-string"),
    pytest.param(CHAT, {"stream": 1, "messages": MSG}, "stream", "boolean", id="stream-int"),
    pytest.param(
        CHAT,
        {"messages": MSG, "stream": True, "stream_options": {"include_usage": "yes"}},
        "stream_options.include_usage",
        "boolean",
        id="include-usage-string",
    ),
    pytest.param(CHAT, {"messages": MSG, "n": 0}, "n", "at least 1", id="n-0"),
    pytest.param(CMPL, {"prompt": "p", "n_cmpl": -1}, "n_cmpl", "at least 1", id="n-cmpl-negative"),
    # chat messages
    pytest.param(CHAT, {"model": "m"}, "messages", "required", id="messages-missing"),
    pytest.param(CHAT, {"messages": "hi"}, "messages", "array", id="messages-string"),
    pytest.param(CHAT, {"messages": ["hi"]}, "messages[0]", "message object", id="message-string"),
    pytest.param(CHAT, {"messages": [{"content": "hi"}]}, "messages[0].role", "required", id="no-role"),
    pytest.param(CHAT, {"messages": [{"role": 1, "content": "hi"}]}, "messages[0].role", "string", id="role-int"),
    pytest.param(
        CHAT,
        {"messages": [*MSG, {"role": "user", "content": 5}]},
        "messages[1].content",
        "got integer 5",
        id="content-int",
    ),
    pytest.param(CHAT, {"messages": [{"role": "user"}]}, "messages[0].content", "required", id="content-missing"),
    pytest.param(
        CHAT,
        {"messages": [{"role": "user", "content": ["hi"]}]},
        "messages[0].content[0]",
        "content part",
        id="content-part-string",
    ),
    pytest.param(
        CHAT,
        {"messages": [{"role": "user", "content": [{"text": "hi"}]}]},
        "messages[0].content[0].type",
        "required",
        id="content-part-no-type",
    ),
    pytest.param(
        CHAT,
        {"messages": [{"role": "user", "content": [{"type": 3}]}]},
        "messages[0].content[0].type",
        "string",
        id="content-part-type-int",
    ),
    pytest.param(
        CHAT,
        {"messages": [{"role": "user", "content": [{"type": "text", "text": 3}]}]},
        "messages[0].content[0].text",
        "string",
        id="text-part-text-int",
    ),
    # completions prompt
    pytest.param(CMPL, {"model": "m"}, "prompt", "required", id="prompt-missing"),
    pytest.param(CMPL, {"prompt": None}, "prompt", "required", id="prompt-null"),
    pytest.param(CMPL, {"prompt": []}, "prompt", "empty", id="prompt-empty-list"),
    pytest.param(CMPL, {"prompt": 42}, "prompt", "got integer 42", id="prompt-int"),
    pytest.param(CMPL, {"prompt": {"x": 1}}, "prompt", "prompt_string", id="prompt-object-without-text"),
    pytest.param(CMPL, {"prompt": ["a", {"prompt_string": 5}]}, "prompt[1].prompt_string", "string", id="prompt-object-text-int"),
    pytest.param(CMPL, {"prompt": [1, -2, 3]}, "prompt[1]", "token id", id="prompt-negative-token"),
    pytest.param(CMPL, {"prompt": [1, True]}, "prompt[1]", "got true", id="prompt-bool-token"),
    pytest.param(CMPL, {"prompt": [1, 1.5]}, "prompt[1]", "got number 1.5", id="prompt-float-token"),
    pytest.param(CMPL, {"prompt": ["a", 5, -1]}, "prompt[2]", "token id", id="prompt-mixed-bad-id"),
    pytest.param(NATIVE, {"n_predict": 8}, "prompt", "required", id="native-prompt-missing"),
    # max tokens
    pytest.param(CHAT, {"messages": MSG, "max_tokens": 1025}, "max_tokens", "at most 1024", id="max-tokens-over-cap"),
    pytest.param(CHAT, {"messages": MSG, "max_tokens": 10**30}, "max_tokens", "out of range", id="max-tokens-huge"),
    pytest.param(CHAT, {"messages": MSG, "max_tokens": -5}, "max_tokens", "at least 0", id="max-tokens-negative"),
    pytest.param(CHAT, {"messages": [*MSG, {"role": "assistant"}]}, "messages[1].content", "tool_calls", id="assistant-neither"),
    pytest.param(CHAT, {"messages": MSG, "max_tokens": "64"}, "max_tokens", "integer", id="max-tokens-string"),
    pytest.param(
        CHAT,
        {"messages": MSG, "max_completion_tokens": 5000},
        "max_completion_tokens",
        "at most 1024",
        id="max-completion-tokens-over-cap",
    ),
    pytest.param(NATIVE, {"prompt": "p", "n_predict": -1}, "n_predict", "unlimited", id="n-predict-unlimited"),
    pytest.param(NATIVE, {"prompt": "p", "n_predict": -7}, "n_predict", "at least 0", id="n-predict-negative"),
    pytest.param(CHAT, {"messages": MSG, "n_predict": "8", "max_tokens": 8}, "n_predict", "integer", id="read-name-string"),
    pytest.param(CHAT, {"messages": MSG, "n_predict": 8, "max_tokens": -1}, "max_tokens", "unlimited", id="unread-name-unlimited"),
    pytest.param(CHAT, {"messages": MSG, "n_predict": 8, "max_tokens": 5000}, "max_tokens", "at most", id="unread-name-over-cap"),
    pytest.param(NATIVE, {"prompt": "p", "n_predict": -1.0}, "n_predict", "unlimited", id="n-predict-unlimited-float"),
    pytest.param(CHAT, {"messages": MSG, "n": 0.5}, "n", "at least 1", id="n-half"),
    pytest.param(NATIVE, {"prompt": "p", "n_predict": 2048}, "n_predict", "at most 1024", id="n-predict-over-cap"),
    pytest.param(CMPL, {"prompt": "p", "max_tokens": -1}, "max_tokens", "unlimited", id="max-tokens-minus-one"),
    # llama-server reads n_predict on every endpoint, before max_tokens: no way around the cap
    pytest.param(
        CHAT,
        {"messages": MSG, "max_tokens": 16, "n_predict": -1},
        "n_predict",
        "unlimited",
        id="chat-n-predict-bypass",
    ),
    pytest.param(
        NATIVE,
        {"prompt": "p", "max_tokens": 5000},
        "max_tokens",
        "at most 1024",
        id="native-max-tokens-alias-over-cap",
    ),
]


@pytest.mark.parametrize("path, body, param, fragment", BAD)
def test_malformed_request_is_400_invalid_request(path, body, param, fragment) -> None:
    e = refusal(path, body)
    assert e.reason is Reason.INVALID_REQUEST
    assert e.status == 400
    assert e.param == param
    assert fragment in e.message
    err = error_object(e)["error"]
    assert err == {
        "message": e.message,
        "type": "invalid_request_error",
        "code": "invalid_request",
        "param": param,
    }
    json.dumps(error_object(e))  # serialisable as is


def test_the_table_is_large_enough() -> None:
    assert len(BAD) >= 30


def test_cap_depends_on_the_class() -> None:
    body = {"messages": MSG, "max_tokens": 5000}
    e = refusal(CHAT, body)
    assert "'interactive'" in e.message
    ok = parse(CHAT, body, headers={"X-Tokengate-Class": "batch"})
    assert ok.max_tokens == 5000 and ok.caller.cls == "batch"


# -- positive cases ------------------------------------------------------------------------------


def test_chat_without_max_tokens_gets_the_class_default_injected() -> None:
    body = {"model": "llama", "messages": MSG, "temperature": 0.2}
    it = parse(CHAT, body)
    assert it.kind == "chat" and it.path == CHAT
    assert it.model == "llama"
    assert it.stream is False and it.include_usage is False
    assert it.max_tokens == 256 and it.max_tokens_injected
    assert it.body == {**body, "max_tokens": 256}
    assert it.caller == Caller(tenant="10.0.0.9", cls="interactive", tenant_config=None)


def test_completions_injects_max_tokens_and_native_injects_n_predict() -> None:
    it = parse(CMPL, {"prompt": "once upon"})
    assert it.body == {"prompt": "once upon", "max_tokens": 256} and it.max_tokens_injected
    it = parse(NATIVE, {"prompt": "once upon"}, headers={"x-tokengate-class": "batch"})
    assert it.body == {"prompt": "once upon", "n_predict": 512}
    assert it.max_tokens == 512 and it.max_tokens_injected


def test_null_limit_counts_as_absent_and_is_replaced() -> None:
    it = parse(CHAT, {"messages": MSG, "max_tokens": None, "n": None, "stream": None})
    assert it.max_tokens_injected and it.body["max_tokens"] == 256
    assert it.stream is False


def test_an_injected_default_that_does_not_fit_the_slot_is_lowered_to_what_does() -> None:
    # llama-server asked without a limit generates until the slot is full: straight at it such a
    # request is served, and the gate refused it 400 naming a max_tokens the client never sent
    # (a trial: batch's default 512 on slots of 512)
    native = parse(NATIVE, {"prompt": "once upon"}, headers={"x-tokengate-class": "batch"})
    fitted = fit_injected(native, 41, 512)
    assert fitted.max_tokens == 471 and fitted.body == {"prompt": "once upon", "n_predict": 471}
    assert native.body["n_predict"] == 512  # the intake itself is left as it was
    chat = parse(CHAT, {"messages": MSG})
    assert fit_injected(chat, 41, 2048) is chat  # 256 fits: nothing changes
    assert fit_injected(chat, 200, 300).body["max_tokens"] == 100
    # what the client asked for is its own: refused as it is when it does not fit
    given = parse(CHAT, {"messages": MSG, "max_tokens": 512})
    assert fit_injected(given, 41, 512) is given
    # a prompt that fills the slot alone is left to be refused; several tasks are not fitted
    assert fit_injected(chat, 300, 300) is chat
    several = parse(CHAT, {"messages": MSG, "n": 2})
    assert fit_injected(several, 200, 300) is several


def test_given_max_tokens_is_kept_and_not_injected() -> None:
    it = parse(CHAT, {"messages": MSG, "max_tokens": 1024})
    assert it.max_tokens == 1024 and not it.max_tokens_injected
    assert it.body == {"messages": MSG, "max_tokens": 1024}


def test_max_completion_tokens_alone_is_the_limit() -> None:
    it = parse(CHAT, {"messages": MSG, "max_completion_tokens": 40})
    assert it.max_tokens == 40 and not it.max_tokens_injected
    assert "max_tokens" not in it.body


def test_agreeing_limit_fields_are_accepted() -> None:
    it = parse(CHAT, {"messages": MSG, "max_completion_tokens": 40, "max_tokens": 40, "n_predict": 40})
    assert it.max_tokens == 40


def test_native_completion_takes_n_predict() -> None:
    it = parse(NATIVE, {"prompt": [1, 2, 3], "n_predict": 7, "stream": True})
    assert it.kind == "completion" and it.max_tokens == 7 and it.stream
    assert not it.max_tokens_injected


def test_streaming_with_include_usage() -> None:
    it = parse(CHAT, {"messages": MSG, "stream": True, "stream_options": {"include_usage": True}})
    assert it.stream and it.include_usage
    it = parse(CHAT, {"messages": MSG, "stream": True, "stream_options": {}})
    assert it.stream and not it.include_usage
    it = parse(CHAT, {"messages": MSG, "stream": False, "stream_options": None})
    assert not it.include_usage


@pytest.mark.parametrize("prompt", ["text", "", [1, 2, 3], ["one prompt"]], ids=["string", "empty-string", "tokens", "list-of-one"])
def test_prompt_shapes_accepted(prompt) -> None:
    assert parse(CMPL, {"prompt": prompt}).body["prompt"] == prompt


def test_chat_message_shapes_accepted() -> None:
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "developer", "content": [{"type": "text", "text": "rules"}]},
        {"role": "user", "content": [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "x"}}]},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function"}]},
        {"role": "assistant", "tool_calls": [{"id": "c2", "type": "function"}]},
        {"role": "tool", "tool_call_id": "c1", "content": "42"},
    ]
    it = parse(CHAT, {"messages": messages, "n": 1})
    assert it.body["messages"] == messages


# What llama-server accepts (200, each checked against it: tests/integration/test_apis_llama.py
# SHAPES), the gate accepts: its intake refuses only what llama-server refuses, or answers 500 for.
ACCEPTED = [
    pytest.param(CHAT, {"messages": []}, id="messages-empty"),
    pytest.param(CHAT, {"messages": [{"role": "wizard", "content": "hi"}]}, id="unknown-role"),
    pytest.param(CHAT, {"messages": [{"role": "user", "content": None}]}, id="content-null-user"),
    pytest.param(CHAT, {"messages": [*MSG, {"role": "assistant", "content": None}]}, id="content-null-assistant"),
    pytest.param(CHAT, {"messages": [*MSG, {"role": "assistant", "tool_calls": None}]}, id="assistant-tool-calls-null"),
    pytest.param(CHAT, {"messages": MSG, "stream_options": {"include_usage": True}}, id="stream-options-without-stream"),
    pytest.param(CHAT, {"messages": MSG, "stream": True, "stream_options": True}, id="stream-options-not-object"),
    pytest.param(CHAT, {"model": 7, "messages": MSG}, id="model-int"),
    pytest.param(CHAT, {"user": ["u"], "messages": MSG}, id="user-array"),
    pytest.param(CMPL, {"prompt": [[], "a"]}, id="prompt-list-with-an-empty-entry"),
]


@pytest.mark.parametrize("path, body", ACCEPTED)
def test_what_llama_server_accepts_passes_the_intake_unchanged(path, body) -> None:
    it = parse(path, body)
    assert {k: it.body[k] for k in body} == body  # forwarded as sent
    assert it.model is None or isinstance(it.model, str)
    assert not it.include_usage  # only an object's include_usage, and only when streaming


@pytest.mark.parametrize("path, field", [(CHAT, "max_tokens"), (NATIVE, "n_predict"), (CMPL, "max_tokens")])
def test_a_zero_limit_is_forwarded_and_reserved_as_the_one_token_llama_server_decodes(path, field) -> None:
    body = {"messages": MSG} if path == CHAT else {"prompt": "p"}
    it = parse(path, {**body, field: 0})
    assert it.body[field] == 0 and not it.max_tokens_injected
    assert it.max_tokens == 1


@pytest.mark.parametrize(("given", "read"), [(3.0, 3), (2.7, 2), (0.5, 0), (1e1, 10)])
def test_a_number_limit_is_read_as_llama_server_reads_it(given, read) -> None:
    # nlohmann's get<int> truncates toward zero: llama-server decodes 2 tokens for 2.7 (200), so
    # the gate reserves what it will decode, and forwards the number as sent
    it = parse(CHAT, {"messages": MSG, "max_tokens": given, "n": 2.0})
    assert it.body["max_tokens"] == given
    assert it.max_tokens == max(read, 1) and it.copies == 2


@pytest.mark.parametrize(
    ("body", "reserved"),
    [
        # llama-server reads the first name present (n_predict, max_completion_tokens,
        # max_tokens) and ignores the rest; a number under another name still counts: the gate
        # reserves the most, so no spelling runs past the reservation
        ({"max_completion_tokens": 100, "max_tokens": 200}, 200),
        ({"max_tokens": 16, "n_predict": 900}, 900),
        ({"n_predict": 4, "max_tokens": "lots"}, 4),  # a name llama-server does not read: ignored
        ({"max_tokens": True}, 1),  # nlohmann reads true as 1
    ],
)
def test_the_limit_is_what_llama_server_reads_and_the_reservation_the_most_asked(body, reserved) -> None:
    it = parse(CHAT, {"messages": MSG, **body})
    assert it.max_tokens == reserved and not it.max_tokens_injected
    assert {k: it.body[k] for k in body} == body  # forwarded as sent


def test_utf8_bom_and_unicode_are_fine() -> None:
    data = "\ufeff".encode() + json.dumps({"messages": [{"role": "user", "content": "héllo ✓"}]}).encode()
    assert parse(CHAT, data).body["messages"][0]["content"] == "héllo ✓"


def test_nesting_at_the_limit_is_accepted() -> None:
    # the body object is level 1, so MAX_JSON_DEPTH - 1 arrays fit inside it
    it = parse(
        CHAT, b'{"messages": [{"role": "user", "content": "x"}], "x": ' + b"[" * (MAX_JSON_DEPTH - 1) + b"]" * (MAX_JSON_DEPTH - 1) + b"}"
    )
    assert it.kind == "chat"


def test_brackets_inside_strings_do_not_count_as_nesting() -> None:
    it = parse(CHAT, {"messages": [{"role": "user", "content": "[" * 500 + "{" * 500}]})
    assert it.kind == "chat"


def test_open_mode_tenant_comes_from_user_field() -> None:
    it = parse(CHAT, {"messages": MSG, "user": "alice"})
    assert it.caller.tenant == "alice"
    it = parse(CHAT, {"messages": MSG}, host=None)
    assert it.caller.tenant == "anonymous"


def test_build_intake_never_mutates_the_input() -> None:
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "stream": True}
    before = copy.deepcopy(body)
    caller = Caller(tenant="t", cls="interactive", tenant_config=None)
    it = build_intake("chat", CHAT, body, caller, CONFIG)
    assert body == before
    assert it.body is not body and "max_tokens" not in body
    assert it.body["max_tokens"] == 256


def test_intake_is_frozen() -> None:
    it = parse(CHAT, {"messages": MSG})
    with pytest.raises(AttributeError):
        it.max_tokens = 5  # type: ignore[misc]


def test_endpoint_table() -> None:
    # the aliases speak their twin's API: /completions is llama-server's alias of /completion
    assert ENDPOINTS == {
        CHAT: "chat",
        "/chat/completions": "chat",
        CMPL: "completions",
        "/completions": "completion",
        "/infill": "infill",
        "/embedding": "embeddings",
        "/embeddings": "embeddings",
        "/v1/embeddings": "embeddings",
        "/rerank": "rerank",
        "/reranking": "rerank",
        "/v1/rerank": "rerank",
        "/v1/reranking": "rerank",
        "/predict": "predict",
        NATIVE: "completion",
        "/v1/messages": "messages",  # Anthropic (gate/http/apis/anthropic.py)
        "/v1/responses": "responses",  # OpenAI Responses (gate/http/apis/responses.py)
        "/responses": "responses",
    }
    with pytest.raises(ValueError):
        parse("/v1/audio/transcriptions", {"input": "x"})


# -- identity and its order against body errors ---------------------------------------------------


def test_tenants_mode_auth_is_checked_before_the_body() -> None:
    for body in (b"not json", b"\xff", raw({"messages": []})):
        e = refusal(CHAT, body, config=TENANT_CONFIG, tenants=TENANTS)
        assert e.reason is Reason.INVALID_API_KEY and e.status == 401
        assert error_object(e)["error"]["type"] == "authentication_error"
        assert error_object(e)["error"]["code"] == "invalid_api_key"


def test_tenants_mode_class_is_checked_before_the_body() -> None:
    headers = {"Authorization": f"Bearer {KEY}", "X-Tokengate-Class": "batch"}
    e = refusal(CHAT, b"not json", headers=headers, config=TENANT_CONFIG, tenants=TENANTS)
    assert e.reason is Reason.CLASS_NOT_ALLOWED and e.status == 403
    assert error_object(e)["error"]["type"] == "permission_error"
    assert e.param == "X-Tokengate-Class"


def test_tenants_mode_valid_request() -> None:
    headers = {"authorization": f"Bearer {KEY}"}
    it = parse(CHAT, {"messages": MSG, "user": "ignored"}, headers=headers, config=TENANT_CONFIG, tenants=TENANTS)
    assert it.caller.tenant == "team-a" and it.caller.tenant_config is not None
    assert it.max_tokens == 256


def test_open_mode_body_errors_come_before_an_unknown_class() -> None:
    e = refusal(CHAT, b"{", headers={"X-Tokengate-Class": "nope"})
    assert "invalid JSON" in e.message
    e = refusal(CHAT, {"messages": []}, headers={"X-Tokengate-Class": "nope"})
    assert e.param == "X-Tokengate-Class"  # identity before fields


def test_token_ids_mixed_with_strings_are_one_prompt_as_llama_server_reads_them() -> None:
    # llama.cpp's own test_completion_with_tokens_input sends [1, ..., "text", 7, ..., "text"]
    intake = parse(CMPL, {"prompt": [1, 2, "the meaning of life", 7, "is"], "max_tokens": 4})
    assert intake.plans is None and intake.copies == 1
