"""What the gate relies on from the real llama-server, checked against the pinned build.

Every test runs against both KV layouts (``-np 4`` split and ``-np 4 -kvu``
unified, 2048 tokens in all; see tests/conftest.py).  Requests are sequential,
so the server is idle between tests.
"""

from __future__ import annotations

import json

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.llama

MESSAGES = [
    {"role": "system", "content": "You are a quick brown fox."},
    {"role": "user", "content": "Tell me a story about the lazy dog and the llama server."},
]
N_PREDICT = 8


@pytest.fixture(params=["split", "unified"])
def llama(request):
    return request.getfixturevalue(f"llama_{request.param}")


@pytest.fixture
def client(llama):
    with httpx.Client(base_url=llama.url, timeout=30) as c:
        yield c


def expected_slot_ctx(llama) -> int:
    """Split: each slot owns ctx / slots.  Unified: each slot may use the whole pool."""
    return llama.ctx // llama.n_slots if llama.mode == "split" else llama.ctx


def chat_body(**extra) -> dict:
    return {"messages": MESSAGES, "max_tokens": N_PREDICT, "ignore_eos": True, **extra}


def metric_samples(client: httpx.Client) -> dict[str, float]:
    resp = client.get("/metrics")
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/plain")
    return {s.name: s.value for fam in text_string_to_metric_families(resp.text) for s in fam.samples}


def tokenize(client: httpx.Client, text: str, **extra) -> list[int]:
    resp = client.post("/tokenize", json={"content": text, **extra})
    assert resp.status_code == 200, resp.text
    return resp.json()["tokens"]


# --- /props, /slots, /v1/models: slot count and per-slot context -------------


def test_props_report_four_slots_and_the_per_slot_context(llama, client):
    props = client.get("/props").json()
    assert props["total_slots"] == llama.n_slots == 4
    assert llama.n_ctx == {"split": 512, "unified": 2048}[llama.mode]
    assert props["default_generation_settings"]["n_ctx"] == expected_slot_ctx(llama)
    assert props["endpoint_metrics"] is True and props["endpoint_slots"] is True
    assert props["is_sleeping"] is False
    assert props["model_path"] == str(llama.model)
    assert "<|im_start|>" in props["chat_template"]
    # /props has no field for the KV layout; the server's log line is the only direct sign.
    assert "kv_unified" not in json.dumps(props)
    assert llama.kv_unified is (llama.mode == "unified")


def test_models_meta_agrees_with_props(llama, client):
    (model,) = client.get("/v1/models").json()["data"]
    meta = model["meta"]
    assert meta["n_ctx"] == expected_slot_ctx(llama)
    assert meta["n_embd"] == 640
    assert meta["n_ctx_train"] == 4096
    assert meta["n_vocab"] > 259  # 3 specials + 256 bytes + word pieces


def test_slots_lists_four_idle_slots_with_their_context(llama, client):
    slots = client.get("/slots").json()
    assert [s["id"] for s in slots] == list(range(llama.n_slots))
    for slot in slots:
        assert slot["n_ctx"] == expected_slot_ctx(llama)
        assert slot["is_processing"] is False
    # fail_on_no_slot answers 200 while any slot is idle
    assert client.get("/slots", params={"fail_on_no_slot": 1}).status_code == 200


def test_slots_after_serving_show_the_finished_task(client):
    resp = client.post("/v1/chat/completions", json=chat_body())
    assert resp.status_code == 200, resp.text
    served = [s for s in client.get("/slots").json() if s.get("id_task", -1) >= 0]
    assert served, "no slot remembers a task"
    for slot in served:
        assert slot["is_processing"] is False
        next_token = slot["next_token"]
        # A list of one object in this build (an object in older ones).
        entry = next_token[0] if isinstance(next_token, list) else next_token
        assert {"n_remain", "n_decoded"} <= entry.keys()


# --- /metrics -----------------------------------------------------------------


def test_metrics_expose_the_gauges_and_counters_the_gate_polls(client):
    resp = client.get("/metrics")
    families = {fam.name: fam for fam in text_string_to_metric_families(resp.text)}
    # The parser strips `_total` from a counter's family name; samples keep it.
    assert families["llamacpp:requests_processing"].type == "gauge"
    assert families["llamacpp:requests_deferred"].type == "gauge"
    assert families["llamacpp:tokens_predicted"].type == "counter"
    samples = metric_samples(client)
    for name in (
        "llamacpp:requests_processing",
        "llamacpp:requests_deferred",
        "llamacpp:tokens_predicted_total",
        "llamacpp:prompt_tokens_total",
        "llamacpp:n_decode_total",
    ):
        assert isinstance(samples[name], (int, float)), name  # the parser gives int for "0"
    assert samples["llamacpp:requests_processing"] == 0  # idle between tests
    assert samples["llamacpp:requests_deferred"] == 0
    # Gone upstream: the gate must not expect a KV usage metric.
    assert not any("kv_cache" in name for name in samples)


def test_tokens_predicted_total_counts_a_finished_request_exactly(client):
    before = metric_samples(client)["llamacpp:tokens_predicted_total"]
    resp = client.post("/v1/chat/completions", json=chat_body())
    assert resp.status_code == 200, resp.text
    # The counter is bumped when the slot is released, in the same server-loop
    # step that sends the final result, so a scrape after the reply sees it.
    after = metric_samples(client)["llamacpp:tokens_predicted_total"]
    assert after - before == N_PREDICT


# --- /tokenize ------------------------------------------------------------------


def test_tokenize_is_deterministic_and_grows_with_the_text(client):
    short = "the quick brown fox jumps over the lazy dog"
    tokens = tokenize(client, short)
    assert tokens and all(isinstance(t, int) for t in tokens)
    assert tokenize(client, short) == tokens
    # Whole words are in the vocabulary: about one token per word, not bytes.
    assert len(tokens) <= len(short.split()) + 2
    longer = tokenize(client, " ".join([short] * 5))
    assert len(longer) > len(tokens)
    # add_special prepends BOS (id 1) and nothing else.
    assert tokenize(client, short, add_special=True) == [1, *tokens]


# --- /v1/chat/completions -------------------------------------------------------


def test_chat_completion_non_streamed_returns_exactly_max_tokens(client):
    resp = client.post("/v1/chat/completions", json=chat_body())
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["object"] == "chat.completion"
    (choice,) = body["choices"]
    assert choice["finish_reason"] == "length"
    assert isinstance(choice["message"]["content"], str)
    assert body["usage"]["completion_tokens"] == N_PREDICT
    assert body["usage"]["prompt_tokens"] > 0
    assert body["timings"]["predicted_n"] == N_PREDICT


def test_chat_completion_streamed_sends_chunks_then_done(client):
    events: list[str] = []
    with client.stream("POST", "/v1/chat/completions", json=chat_body(stream=True, stream_options={"include_usage": True})) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        for line in resp.iter_lines():
            if line.startswith("data: "):
                events.append(line[len("data: ") :])
            else:
                assert line == "" or line.startswith(":"), line  # blank separators, SSE comments
    assert events[-1] == "[DONE]"
    assert "[DONE]" not in events[:-1]
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert sum("content" in d for d in deltas) >= 1
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0].get("finish_reason")]
    assert finishes == ["length"]
    usage = [c["usage"] for c in chunks if c.get("usage")]
    assert usage and usage[-1]["completion_tokens"] == N_PREDICT
    timings = [c["timings"] for c in chunks if "timings" in c]
    assert timings and timings[-1]["predicted_n"] == N_PREDICT


FILLER = "the quick brown fox jumps over the lazy dog "


def input_tokens(client: httpx.Client, content: str) -> int:
    resp = client.post("/v1/chat/completions/input_tokens", json={"messages": [{"role": "user", "content": content}]})
    assert resp.status_code == 200, resp.text
    return resp.json()["input_tokens"]


def test_prompt_longer_than_the_slot_context_is_refused_with_400(llama, client):
    content = FILLER * (expected_slot_ctx(llama) // 9 + 8)
    resp = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": content}], "max_tokens": 4})
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["type"] == "exceed_context_size_error"
    assert error["n_ctx"] == expected_slot_ctx(llama)
    assert error["n_prompt_tokens"] == input_tokens(client, content) > error["n_ctx"]


def test_prompt_that_fits_is_cut_short_at_the_slot_context_not_refused(llama_split):
    # prompt + max_tokens > n_ctx is NOT refused in this build: generation stops
    # when prompt + output reaches the slot's n_ctx, with a 200 and finish_reason
    # "length" (native /completion also says truncated: true).  The gate must cap
    # max_tokens itself.  Split mode only: the same check in unified mode needs a
    # ~2000-token context, whose decode on 2 shared cores takes tens of seconds.
    n_ctx = expected_slot_ctx(llama_split)
    with httpx.Client(base_url=llama_split.url, timeout=60) as client:
        one, ten = input_tokens(client, FILLER), input_tokens(client, FILLER * 10)
        per_rep = (ten - one) // 9
        reps = (n_ctx - 24 - (one - per_rep)) // per_rep
        content = FILLER * reps
        prompt = input_tokens(client, content)
        assert n_ctx - 24 - per_rep < prompt <= n_ctx - 24
        resp = client.post(
            "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": content}], "max_tokens": 64, "ignore_eos": True},
        )
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["prompt_tokens"] == prompt
    assert body["usage"]["completion_tokens"] == n_ctx - prompt < 64


# --- token counting for admission -------------------------------------------------


def test_input_tokens_endpoint_matches_the_prompt_the_server_evaluates(client):
    # The pinned build (llama.cpp 0c1e570) answers 200 {"input_tokens": N}; older
    # builds answer 404, so the gate keeps the /apply-template + /tokenize fallback,
    # which this test also checks against the same real count.
    real = client.post("/v1/chat/completions", json=chat_body()).json()["usage"]["prompt_tokens"]

    resp = client.post("/v1/chat/completions/input_tokens", json=chat_body())
    if resp.status_code == 404:
        assert resp.json()["error"]["type"] == "not_found_error"
    else:
        assert resp.status_code == 200, resp.text
        assert resp.json()["input_tokens"] == real  # body also has "object": "response.input_tokens"

    prompt = client.post("/apply-template", json={"messages": MESSAGES}).json()["prompt"]
    assert prompt.endswith("<|im_start|>assistant\n")
    assert len(tokenize(client, prompt, add_special=True, parse_special=True)) == real
