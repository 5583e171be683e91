"""The plain answer rebuilt from llama-server's stream chunks (shapes recorded from llama.cpp 0c1e570)."""

from __future__ import annotations

import pytest

from gate.http.assembly import assemble, plain_body, stream_loses


def _probs(tok: int, text: str, logprob: float, key: str = "logprob") -> dict:
    entry = {"id": tok, "token": text, "bytes": list(text.encode()), key: logprob}
    return {**entry, "top_" + key + "s": [entry]}


def test_chat_answer_is_assembled_with_content_finish_reason_usage_and_timings():
    chunks = [
        {"id": "c1", "created": 7, "model": "m", "choices": [{"index": 0, "delta": {"role": "assistant", "content": None}}]},
        {"id": "c1", "created": 7, "model": "m", "choices": [{"index": 0, "delta": {"content": "Hel"}}]},
        {"id": "c1", "created": 7, "model": "m", "choices": [{"index": 0, "delta": {"content": "lo"}}]},
        {"id": "c1", "created": 7, "model": "m", "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]},
        {
            "id": "c1",
            "created": 7,
            "model": "m",
            "system_fingerprint": "b1-0c1e570",
            "choices": [],
            "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7, "prompt_tokens_details": {"cached_tokens": 4}},
            "timings": {"predicted_n": 2},
        },
    ]
    out = assemble("chat", chunks)
    assert out["object"] == "chat.completion"
    assert out["choices"] == [{"index": 0, "message": {"role": "assistant", "content": "Hello"}, "finish_reason": "length"}]
    assert out["usage"]["prompt_tokens_details"] == {"cached_tokens": 4}
    assert out["timings"] == {"predicted_n": 2}
    assert (out["id"], out["created"], out["model"], out["system_fingerprint"]) == ("c1", 7, "m", "b1-0c1e570")


def test_streamed_tool_call_fragments_are_joined_and_content_stays_a_string():
    chunks = [
        {"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "t1", "function": {"name": "get_", "arguments": '{"a"'}}]}}]},
        {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"name": "time", "arguments": ": 1}"}}]}}]},
        {"choices": [{"delta": {}, "finish_reason": "tool_calls"}]},
    ]
    message = assemble("chat", chunks)["choices"][0]["message"]
    assert message["content"] == ""  # common_chat_msg::to_json_oaicompat never writes null
    assert message["tool_calls"] == [{"type": "function", "id": "t1", "function": {"name": "get_time", "arguments": '{"a": 1}'}}]


def test_text_completion_gathers_per_token_logprobs_and_keeps_null_without_them():
    chunks = [
        {"id": "x", "choices": [{"text": "some", "index": 0, "logprobs": {"content": [_probs(645, "some", -6.0)]}, "finish_reason": None}]},
        {
            "id": "x",
            "choices": [{"text": "hist", "index": 0, "logprobs": {"content": [_probs(1774, "hist", -5.9)]}, "finish_reason": None}],
        },
        {"id": "x", "choices": [{"text": "", "index": 0, "logprobs": None, "finish_reason": "length"}], "usage": {"completion_tokens": 2}},
    ]
    choice = assemble("completions", chunks)["choices"][0]
    assert choice["text"] == "somehist" and choice["finish_reason"] == "length"
    assert choice["logprobs"] == {"content": [_probs(645, "some", -6.0), _probs(1774, "hist", -5.9)]}
    plain = assemble("completions", [{"choices": [{"text": "a"}]}, {"choices": [{"text": "b", "finish_reason": "stop"}]}])
    assert plain["choices"][0] == {"text": "ab", "index": 0, "logprobs": None, "finish_reason": "stop"}


def test_native_completion_takes_the_final_fields_and_gathers_text_and_probabilities():
    final = {
        "index": 0,
        "content": "",
        "tokens": [],
        "id_slot": 3,
        "stop": True,
        "model": "m",
        "tokens_predicted": 2,
        "tokens_evaluated": 4,
        "generation_settings": {"n_probs": 2, "stream": True, "post_sampling_probs": True},
        "prompt": "<s> the quick",
        "has_new_line": False,
        "truncated": False,
        "stop_type": "limit",
        "stopping_word": "",
        "tokens_cached": 5,
        "timings": {"predicted_n": 2},
    }
    chunks = [
        # return_progress: a prompt-progress chunk carries no token
        {"index": 0, "content": "", "tokens": [-1], "stop": False, "prompt_progress": {"total": 4, "cache": 0, "processed": 4}},
        {
            "index": 0,
            "content": "hom",
            "tokens": [1482],
            "stop": False,
            "tokens_predicted": 1,
            "completion_probabilities": [_probs(1482, "hom", 0.4, "prob")],
        },
        {
            "index": 0,
            "content": " mod",
            "tokens": [1918],
            "stop": False,
            "tokens_predicted": 2,
            "completion_probabilities": [_probs(1918, " mod", 0.3, "prob")],
        },
        final,
    ]
    out = assemble("completion", chunks)
    assert out["content"] == "hom mod" and out["stop"] is True and out["tokens"] == []
    assert out["completion_probabilities"] == [_probs(1482, "hom", 0.4, "prob"), _probs(1918, " mod", 0.3, "prob")]
    assert out["generation_settings"] == {"n_probs": 2, "stream": False, "post_sampling_probs": True}
    for key in ("stop_type", "stopping_word", "truncated", "tokens_cached", "timings", "prompt", "tokens_evaluated", "has_new_line"):
        assert out[key] == final[key], key
    assert final["generation_settings"]["stream"] is True  # the chunk itself is not mutated


def test_native_completion_without_probabilities_has_no_probabilities_key():
    out = assemble("completion", [{"content": "x", "tokens": [5], "stop": False}, {"content": "", "stop": True, "tokens_predicted": 1}])
    assert out["content"] == "x" and "completion_probabilities" not in out


@pytest.mark.parametrize(
    ("kind", "body", "loses"),
    [
        ("completion", {"n_probs": 3}, False),
        ("completion", {"n_probs": 2, "post_sampling_probs": True}, False),
        ("completion", {"n_probs": 2, "stop": ["x"]}, True),
        ("completion", {"stop": ["x"]}, False),
        ("completion", {"logprobs": 2, "stop": ["x"]}, True),  # an alias of n_probs
        ("completion", {"n_probs": 0, "logprobs": 2, "stop": ["x"]}, False),  # n_probs wins
        ("completion", {"return_tokens": True}, True),
        ("completion", {"response_fields": ["content"]}, True),
        ("completion", {"n_indent": 2}, True),
        ("completion", {"n_indent": 0}, False),
        ("completion", {"grammar": "root ::= [a-z]+", "json_schema": {"type": "object"}}, False),
        ("completions", {"logprobs": 2}, False),
        ("completions", {"logprobs": 2, "stop": "x"}, True),
        ("completions", {"logprobs": 0, "stop": "x"}, False),
        ("completions", {"return_tokens": True}, False),  # ids appear only in /completion's answer
        ("chat", {"logprobs": True, "top_logprobs": 2}, True),
        ("chat", {"logprobs": False}, False),
        ("chat", {"n_probs": 2}, True),
        ("chat", {"tools": [{"type": "function"}]}, True),
        ("chat", {"tools": []}, False),
        ("chat", {"response_format": {"type": "json_object"}}, True),
        ("chat", {"response_format": {"type": "text"}}, False),
        ("chat", {"json_schema": {"type": "object"}}, True),
        ("chat", {"grammar": "root ::= [a-z]+", "stop": ["x"], "logit_bias": {"5": -100}}, False),
        ("chat", {"verbose": True}, True),
    ],
)
def test_stream_loses_exactly_the_options_whose_plain_answer_it_lacks(kind, body, loses):
    assert stream_loses(kind, body) is loses


def test_plain_body_asks_for_a_plain_answer_and_keeps_the_clients_slot():
    body = {"prompt": "x", "stream": False, "id_slot": 1, "n_probs": 2}
    assert plain_body(body) == {"prompt": "x", "stream": False, "id_slot": 1, "n_probs": 2}
    assert body["id_slot"] == 1


def test_a_verbose_servers_debug_object_gets_the_text_and_probabilities_the_stream_carried_apart():
    # llama-server --verbose: each streamed /v1/completions chunk carries its own __verbose, the
    # final one with content "" and stream: true (server-task.cpp, to_json_non_oaicompat)
    final = {"content": "", "tokens": [], "stop": True, "prompt": "<s> hi", "generation_settings": {"stream": True, "n_predict": 2}}
    chunks = [
        {
            "id": "c",
            "choices": [{"text": "Hel", "index": 0}],
            "__verbose": {"content": "Hel", "stop": False, "completion_probabilities": [1]},
        },
        {
            "id": "c",
            "choices": [{"text": "lo", "index": 0}],
            "__verbose": {"content": "lo", "stop": False, "completion_probabilities": [2]},
        },
        {"id": "c", "choices": [{"text": "", "index": 0, "finish_reason": "length"}], "__verbose": final},
    ]
    verbose = assemble("completions", chunks)["__verbose"]
    assert verbose == {
        **final,
        "content": "Hello",
        "completion_probabilities": [1, 2],
        "generation_settings": {"stream": False, "n_predict": 2},
    }
    chat = [
        {"id": "c", "choices": [{"index": 0, "delta": {"content": "Hi"}}]},
        {"id": "c", "choices": [{"index": 0, "delta": {}}], "__verbose": final},
    ]
    assert assemble("chat", chat)["__verbose"]["content"] == "Hi"
    assert "__verbose" not in assemble("chat", chat[:1])  # a server without --verbose: none
