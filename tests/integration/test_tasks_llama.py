"""Infill, embeddings, rerank and multi-task requests admitted through the gate (issue 21).

Against a real llama-server: the fast tiny model generated with fill-in-the-middle tokens
(``fim=True``, so ``/infill`` runs), started with ``--embeddings --pooling mean`` (the OpenAI
embeddings route refuses pooling ``none``), and a second one with ``--reranking`` (rank
pooling: the random model has no classifier head, so its scores are meaningless, but the route
and its tasks are real). Every test ends with the ledger back at zero (``released``).
"""

from __future__ import annotations

import json
import os

import httpx
import pytest

from tests.integration.gate_harness import released, running_gate, words
from tests.llama.server import LlamaServer, free_port

pytestmark = pytest.mark.llama

SLOTS = 4
CTX = 2048  # 4 slots x 512
N_CTX = CTX // SLOTS
ORIGIN = "http://app.example"

EXTRA = """
[classes.interactive]
priority = 10
default_max_tokens = 16
max_tokens_cap = 400
"""


def _server(llama_bin, tmp_path_factory, name: str, *args: str, port: int | None = None):
    from tests.llama.make_model import cached_model

    model = cached_model("fast", fim=True)
    log = tmp_path_factory.mktemp("llama") / f"llama-server-{name}.log"
    server = LlamaServer(llama_bin, model, mode="split", ctx=CTX, n_slots=SLOTS, log_path=log, extra_args=args, port=port)
    server.start()
    return server


@pytest.fixture(scope="module")
def llama_predict(llama_bin, tmp_path_factory):
    """llama-server in Vertex AI mode: /predict registered (AIP_HTTP_PORT would move its port)."""
    port = free_port()
    saved = {k: os.environ.get(k) for k in ("AIP_MODE", "AIP_HTTP_PORT")}
    os.environ.update({"AIP_MODE": "PREDICTION", "AIP_HTTP_PORT": str(port)})
    try:
        server = _server(llama_bin, tmp_path_factory, "predict", "--embeddings", "--pooling", "mean", port=port)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def llama_embed(llama_bin, tmp_path_factory):
    server = _server(llama_bin, tmp_path_factory, "embed", "--embeddings", "--pooling", "mean")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def llama_rerank(llama_bin, tmp_path_factory):
    server = _server(llama_bin, tmp_path_factory, "rerank", "--reranking")
    try:
        yield server
    finally:
        server.stop()


def record(gate, request_id: str):
    return next(r for r in gate.records if r.request_id == request_id)


async def test_openai_embeddings_single_and_list_through_the_gate(llama_embed):
    import openai

    async with running_gate(llama_embed.url, EXTRA) as gate:
        sdk = openai.AsyncOpenAI(base_url=gate.url + "/v1", api_key="none", max_retries=0)
        one = await sdk.embeddings.create(model="tiny", input="hello there")
        many = await sdk.embeddings.create(model="tiny", input=["the quick brown fox", "lazy dog", "hello"])
        await sdk.close()
        assert len(one.data) == 1 and len(one.data[0].embedding) > 0
        assert [d.index for d in many.data] == [0, 1, 2]
        async with httpx.AsyncClient(timeout=30) as client:
            straight = (
                await client.post(llama_embed.url + "/v1/embeddings", json={"input": ["the quick brown fox", "lazy dog", "hello"]})
            ).json()
            through = await client.post(gate.url + "/v1/embeddings", json={"input": ["the quick brown fox", "lazy dog", "hello"]})
        assert through.status_code == 200
        # The gate's count is llama-server's own: exact, every input's tokens (BOS each), no decode.
        rec = record(gate, through.headers["x-request-id"])
        assert rec.outcome == "admitted" and rec.token_count_source == "exact"
        assert rec.prompt_tokens == straight["usage"]["prompt_tokens"] == many.usage.prompt_tokens
        assert rec.max_tokens == 0 and rec.reserved_tokens == rec.prompt_tokens
        assert through.json()["data"] == straight["data"]
        await released(gate)
        (backend,) = gate.backends
        assert backend.admission is not None and backend.admission.ledger.slots == 0


async def test_embeddings_with_more_inputs_than_slots_are_served_holding_every_slot(llama_embed):
    # A RAG batch larger than the slots: llama-server embeds it in waves, so the gate admits it
    # holding every slot (for the largest inputs) instead of refusing what it could never serve.
    async with running_gate(llama_embed.url, EXTRA) as gate, httpx.AsyncClient(timeout=30) as client:
        r = await client.post(gate.url + "/v1/embeddings", json={"input": ["a", "b", "c", "d", "e"]})
        assert r.status_code == 200, r.text
        assert len(r.json()["data"]) == 5
        assert record(gate, r.headers["x-request-id"]).outcome == "admitted"
        await released(gate)


async def test_infill_is_admitted_counted_with_fim_tokens_and_n_predict_injected(llama_embed):
    body = {
        "input_prefix": "def hello(",
        "input_suffix": "return x",
        "input_extra": [{"filename": "a.py", "text": "the fox"}],
        "prompt": "y",
    }
    async with running_gate(llama_embed.url, EXTRA) as gate, httpx.AsyncClient(timeout=30) as client:
        r = await client.post(gate.url + "/infill", json=body)
        assert r.status_code == 200, r.text
        answer = r.json()
        rec = record(gate, r.headers["x-request-id"])
        assert rec.outcome == "admitted" and rec.max_tokens == 16  # the class default, injected as n_predict
        assert answer["tokens_predicted"] <= 16
        # The gate reserves for the untruncated prompt: at least what llama-server evaluated
        # (it drops the extra context when its batch leaves no room, here n_batch 2048 > n_ctx 512).
        assert rec.prompt_tokens >= answer["tokens_evaluated"]
        streamed = await client.post(gate.url + "/infill", json={**body, "stream": True, "n_predict": 4})
        assert streamed.status_code == 200 and streamed.text.startswith("data: ")
        await released(gate)


async def test_prompt_lists_and_n_are_admitted_for_every_task(llama_embed):
    async with running_gate(llama_embed.url, EXTRA) as gate, httpx.AsyncClient(timeout=60) as client:
        r = await client.post(gate.url + "/v1/completions", json={"prompt": ["the quick", "lazy dog"], "n": 2, "max_tokens": 5})
        assert r.status_code == 200, r.text
        assert len(r.json()["choices"]) == 4  # 2 prompts x 2 completions: 4 tasks, 4 slots
        rec = record(gate, r.headers["x-request-id"])
        # every task's prompt (the two prompts, twice) and every task's 5 tokens
        assert rec.reserved_tokens == rec.prompt_tokens + 4 * 5
        streamed = await client.post(
            gate.url + "/v1/completions", json={"prompt": ["the quick", "lazy dog"], "n": 2, "max_tokens": 5, "stream": True}
        )
        events = [line for line in streamed.text.splitlines() if line.startswith("data: {")]
        assert streamed.status_code == 200 and {
            json.loads(e[6:])["choices"][0]["index"] for e in events if json.loads(e[6:])["choices"]
        } == {0, 1, 2, 3}
        single = await client.post(gate.url + "/v1/completions", json={"prompt": "the quick", "max_tokens": 5})
        one = record(gate, single.headers["x-request-id"])
        assert rec.prompt_tokens >= 2 * one.prompt_tokens
        native = await client.post(
            gate.url + "/completion", json={"prompt": ["the quick", "lazy dog"], "n_predict": 4, "stream": True, "ignore_eos": True}
        )
        chunks = [json.loads(line[6:]) for line in native.text.splitlines() if line.startswith("data: {")]
        # /completion ends without [DONE]: the stream is over only after every task's stop chunk
        assert sorted(c["index"] for c in chunks if c.get("stop")) == [0, 1]
        native_rec = record(gate, native.headers["x-request-id"])
        # the journal counts what every task generated: 2 x 4 (each stop chunk has its own 4)
        assert native_rec.outcome == "admitted" and native_rec.completion_tokens == 8
        chat = await client.post(
            gate.url + "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "hi"}], "n": 3, "max_tokens": 4, "ignore_eos": True},
        )
        assert chat.status_code == 200 and len(chat.json()["choices"]) == 3
        streamed_chat = await client.post(
            gate.url + "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "hi"}], "n": 3, "max_tokens": 4, "ignore_eos": True, "stream": True},
        )
        # llama-server's usage chunks are each task's own (4 each); the journal's is the
        # request's: 3 x 4. (A plain answer carries only its first task's usage, server-context.cpp
        # handle_completions_impl: the journal can read no more than that one.)
        assert record(gate, streamed_chat.headers["x-request-id"]).completion_tokens == 12
        # More tasks than slots: llama-server runs them in waves; the request holds every slot
        waves = await client.post(gate.url + "/completion", json={"prompt": ["a", "b", "c"], "n_cmpl": 2, "n_predict": 4})
        assert waves.status_code == 200 and len(waves.json()) == 6, waves.text
        assert record(gate, waves.headers["x-request-id"]).outcome == "admitted"
        # llama-server's multimodal prompt object, text only: accepted where llama-server accepts it
        obj = await client.post(gate.url + "/completion", json={"prompt": {"prompt_string": "the quick"}, "n_predict": 3})
        assert obj.status_code == 200, obj.text
        await released(gate)
        (backend,) = gate.backends
        assert backend.admission is not None and backend.admission.ledger.slots == 0


async def test_never_fits_answers_in_llama_servers_own_context_error_shape(llama_embed):
    prompt = words(300)
    async with running_gate(llama_embed.url, EXTRA) as gate, httpx.AsyncClient(timeout=30) as client:
        straight = (await client.post(llama_embed.url + "/completion", json={"prompt": words(600), "n_predict": 4})).json()["error"]
        r = await client.post(gate.url + "/completion", json={"prompt": prompt, "n_predict": 300})
        assert r.status_code == 400
        error = r.json()["error"]
        assert error["type"] == straight["type"] == "exceed_context_size_error"
        assert error["code"] == "context_length_exceeded"  # the gate's own code stays
        assert error["n_ctx"] == straight["n_ctx"] == N_CTX
        rec = record(gate, r.headers["x-request-id"])
        assert error["n_prompt_tokens"] == rec.prompt_tokens and rec.prompt_tokens + 300 > N_CTX
        await released(gate)


async def test_cors_on_the_gates_own_429_as_on_llama_servers_200(llama_embed):
    key = "sk-cors-1"
    extra = EXTRA + '\n[[tenants]]\nname = "web"\napi_key_env = "WEB_KEY"\nclass = "interactive"\nrequests_per_minute = 1\n'
    headers = {"Authorization": f"Bearer {key}", "Origin": ORIGIN}
    async with running_gate(llama_embed.url, extra, environ={"WEB_KEY": key}) as gate, httpx.AsyncClient(timeout=30) as client:
        ok = await client.post(gate.url + "/completion", json={"prompt": "hi", "n_predict": 2}, headers=headers)
        assert ok.status_code == 200
        refused = await client.post(gate.url + "/completion", json={"prompt": "hi", "n_predict": 2}, headers=headers)
        assert refused.status_code == 429 and refused.json()["error"]["code"] == "rate_limited"
        assert ok.headers.get_list("access-control-allow-origin") == [ORIGIN]  # llama-server's, relayed
        assert refused.headers.get_list("access-control-allow-origin") == [ORIGIN]  # the gate's, the same
        unauthorized = await client.post(gate.url + "/completion", json={"prompt": "hi"}, headers={"Origin": ORIGIN})
        assert unauthorized.status_code == 401 and unauthorized.headers["access-control-allow-origin"] == ORIGIN
        health = await client.get(gate.url + "/health", headers={"Origin": ORIGIN})
        assert health.headers["access-control-allow-origin"] == ORIGIN
        no_origin = await client.get(gate.url + "/health")
        assert "access-control-allow-origin" not in no_origin.headers
        await released(gate)


async def test_rerank_is_one_task_per_document(llama_rerank):
    body = {"query": "the quick fox", "documents": ["a lazy dog", "the brown fox jumps", "hello"]}
    async with running_gate(llama_rerank.url, EXTRA) as gate, httpx.AsyncClient(timeout=30) as client:
        straight = (await client.post(llama_rerank.url + "/v1/rerank", json=body)).json()
        r = await client.post(gate.url + "/v1/rerank", json=body)
        assert r.status_code == 200, r.text
        assert [x["index"] for x in r.json()["results"]] == [x["index"] for x in straight["results"]]
        rec = record(gate, r.headers["x-request-id"])
        # query + document per task, and the 4 tokens the server may add around them: an upper bound
        assert rec.token_count_source == "exact" and rec.max_tokens == 0
        assert straight["usage"]["prompt_tokens"] <= rec.prompt_tokens <= straight["usage"]["prompt_tokens"] + 4 * 3
        # More documents than slots: served in waves, every slot held (a RAG batch must not be a 400)
        waves = await client.post(gate.url + "/rerank", json={"query": "q", "documents": ["a"] * 5})
        assert waves.status_code == 200 and len(waves.json()["results"]) == 5, waves.text
        await released(gate)


async def test_predict_admits_every_instance_and_answers_as_llama_server(llama_predict):
    instances = [
        {"@requestFormat": "completion", "prompt": "the quick", "n_predict": 4},
        {"@requestFormat": "embeddings", "input": ["a", "b"]},
        {"@requestFormat": "tokenize", "content": "hello"},
    ]
    async with running_gate(llama_predict.url, EXTRA) as gate, httpx.AsyncClient(timeout=60) as client:
        r = await client.post(gate.url + "/predict", json={"instances": instances})
        assert r.status_code == 200, r.text
        predictions = r.json()["predictions"]
        assert len(predictions) == 3 and predictions[0]["tokens_predicted"] <= 4 and predictions[2]["tokens"]
        rec = record(gate, r.headers["x-request-id"])
        # the completion's prompt and both embedding inputs; 3 tasks, each reserved for 4 tokens
        assert rec.outcome == "admitted" and rec.max_tokens == 4
        assert rec.reserved_tokens == rec.prompt_tokens + 3 * 4
        messages = await client.post(gate.url + "/predict", json={"instances": [{"@requestFormat": "messages", "messages": []}]})
        assert messages.status_code == 400 and "POST /v1/messages" in messages.json()["error"]["message"]
        await released(gate)


# What llama-server answers 200, the gate forwards; what it refuses, the gate refuses (each row
# compared with llama-server straight; the two 200s here were once the gate's own 400).
SAME_STATUS = [
    ("/infill", {"input_prefix": "def f(", "input_suffix": ")", "prompt": [1, 2], "n_predict": 4}),
    ("/infill", {"input_prefix": "a", "input_suffix": "b", "input_extra": [{"filename": "f"}], "n_predict": 4}),
    ("/infill", {"input_prefix": "a", "input_suffix": "b", "n_predict": 0}),
    ("/v1/embeddings", {"input": [[1, 2], [3]], "model": 5, "user": 5}),
    ("/v1/embeddings", {"input": []}),
    ("/embedding", {}),
]
SAME_STATUS_RERANK = [
    ("/v1/rerank", {"query": "q", "documents": ["a", "b"], "top_n": "2"}),
    ("/v1/rerank", {"query": "q", "documents": []}),
    ("/v1/rerank", {"query": "q", "documents": [5]}),
]


async def _same_status(server, rows) -> None:
    async with running_gate(server.url, EXTRA) as gate, httpx.AsyncClient(timeout=60) as client:
        for path, body in rows:
            straight = await client.post(server.url + path, json=body)
            through = await client.post(gate.url + path, json=body)
            assert through.status_code == straight.status_code, (path, body, straight.text[:200], through.text[:200])
        await released(gate)


async def test_infill_and_embeddings_answer_as_llama_server_does(llama_embed):
    await _same_status(llama_embed, SAME_STATUS)


async def test_rerank_answers_as_llama_server_does(llama_rerank):
    await _same_status(llama_rerank, SAME_STATUS_RERANK)
