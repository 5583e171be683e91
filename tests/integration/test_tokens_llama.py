"""TokenCounter against the real llama-server: its counts equal what the server reports it ran.

Chat counts are checked against ``usage.prompt_tokens`` of a real request,
both through ``/v1/chat/completions/input_tokens`` and through the fallback an
older build forces (``/apply-template`` + ``/tokenize``); ``/v1/completions``
against ``usage.prompt_tokens``; ``/completion`` against ``tokens_evaluated``.
"""

from __future__ import annotations

import math

import httpx
import pytest

from gate.backend.tokens import INPUT_TOKENS_PATH, TokenCounter, canonical_json, estimate_tokens, prompt_fields

pytestmark = pytest.mark.llama

CHAT_SHAPES = {
    "one_user_message": [{"role": "user", "content": "Tell me a story about the lazy dog."}],
    "system_and_user": [
        {"role": "system", "content": "You are a quick brown fox."},
        {"role": "user", "content": "What is the token budget of the gate?"},
    ],
    "multi_turn": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Why does the queue grow when the slots are busy?"},
    ],
    "assistant_prefill": [
        {"role": "user", "content": "Tell me about the llama server."},
        {"role": "assistant", "content": "The llama server"},
    ],
    "text_parts": [{"role": "user", "content": [{"type": "text", "text": "Part one."}, {"type": "text", "text": "Part two."}]}],
    "non_ascii": [{"role": "user", "content": "Grüße aus Köln: 你好, ça va? 🦙 <s> </s>"}],
}
CHAT_EXTRAS = {
    "plain": {},
    "no_generation_prompt": {"add_generation_prompt": False},
    "with_tools": {
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "lookup",
                    "description": "Look up a word",
                    "parameters": {"type": "object", "properties": {"word": {"type": "string"}}},
                },
            }
        ]
    },
}
PROMPTS = {
    "english": "The quick brown fox jumps over the lazy dog.",
    "special_tokens": "Hello</s> world <s> again",  # parse_special: <s> and </s> are one token each
    "non_ascii": "Grüße aus Köln: 你好 🦙",
    "leading_space_and_newlines": "  two spaces\nthen a new line\n\n",
}


class WithoutInputTokens(httpx.AsyncBaseTransport):
    """The real server, except that input_tokens answers 404 as on builds that predate it."""

    def __init__(self) -> None:
        self._inner = httpx.AsyncHTTPTransport()
        self.paths: list[str] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.paths.append(request.url.path)
        if request.url.path == INPUT_TOKENS_PATH:
            return httpx.Response(404, json={"error": {"code": 404, "message": "File Not Found"}})
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()


@pytest.fixture
def llama(llama_unified):
    return llama_unified


@pytest.fixture
async def http():
    async with httpx.AsyncClient(timeout=60) as client:
        yield client


@pytest.fixture
async def old_build():
    transport = WithoutInputTokens()
    async with httpx.AsyncClient(transport=transport, timeout=60) as client:
        yield client, transport


async def real_chat_prompt_tokens(http: httpx.AsyncClient, url: str, body: dict) -> int:
    resp = await http.post(f"{url}/v1/chat/completions", json={**body, "max_tokens": 1, "stream": False})
    assert resp.status_code == 200, resp.text
    return resp.json()["usage"]["prompt_tokens"]


@pytest.mark.parametrize("extra", CHAT_EXTRAS.values(), ids=CHAT_EXTRAS.keys())
@pytest.mark.parametrize("messages", CHAT_SHAPES.values(), ids=CHAT_SHAPES.keys())
async def test_chat_count_equals_the_real_prompt_tokens_on_both_paths(llama, http, old_build, messages, extra):
    body = {"messages": messages, **extra}
    real = await real_chat_prompt_tokens(http, llama.url, body)

    direct = await TokenCounter(http).count(llama.url, "chat", body)
    assert (direct.tokens, direct.source) == (real, "exact")

    old_client, transport = old_build
    fallback = await TokenCounter(old_client).count(llama.url, "chat", body)
    assert (fallback.tokens, fallback.source) == (real, "exact")
    assert transport.paths == [INPUT_TOKENS_PATH, "/apply-template", "/tokenize"]


async def test_chat_count_is_cached_and_ignores_generation_settings(llama, http):
    counter = TokenCounter(http)
    messages = CHAT_SHAPES["multi_turn"]
    first = await counter.count(llama.url, "chat", {"messages": messages, "max_tokens": 5})
    again = await counter.count(llama.url, "chat", {"messages": messages, "temperature": 0.2, "stream": True})
    assert again.cached and again.tokens == first.tokens
    assert counter.stats()["misses"] == 1


@pytest.mark.parametrize("prompt", PROMPTS.values(), ids=PROMPTS.keys())
async def test_v1_completions_count_equals_the_real_prompt_tokens(llama, http, prompt):
    resp = await http.post(f"{llama.url}/v1/completions", json={"prompt": prompt, "max_tokens": 1})
    assert resp.status_code == 200, resp.text
    count = await TokenCounter(http).count(llama.url, "completions", {"prompt": prompt, "max_tokens": 1})
    assert (count.tokens, count.source) == (resp.json()["usage"]["prompt_tokens"], "exact")


async def token_ids(http: httpx.AsyncClient, url: str, text: str) -> list[int]:
    resp = await http.post(f"{url}/tokenize", json={"content": text, "add_special": False})
    return resp.json()["tokens"]


async def test_token_id_and_mixed_prompts_match_the_server(llama, http):
    ids = await token_ids(http, llama.url, " the lazy dog")
    counter = TokenCounter(http)
    for prompt in (ids, [1, *ids], ["hello world", *ids, " the dog"], [*ids, " hello world"]):
        resp = await http.post(f"{llama.url}/v1/completions", json={"prompt": prompt, "max_tokens": 1})
        assert resp.status_code == 200, resp.text
        count = await counter.count(llama.url, "completions", {"prompt": prompt})
        assert (count.tokens, count.source) == (resp.json()["usage"]["prompt_tokens"], "exact"), prompt


@pytest.mark.parametrize("prompt", PROMPTS.values(), ids=PROMPTS.keys())
async def test_completion_count_equals_tokens_evaluated(llama, http, prompt):
    resp = await http.post(f"{llama.url}/completion", json={"prompt": prompt, "n_predict": 1})
    assert resp.status_code == 200, resp.text
    answer = resp.json()
    # prompt_n counts only what was not reused from the slot's cache; tokens_evaluated is the whole prompt.
    assert answer["tokens_evaluated"] == answer["timings"]["prompt_n"] + answer["timings"]["cache_n"]
    count = await TokenCounter(http).count(llama.url, "completion", {"prompt": prompt, "n_predict": 1})
    assert (count.tokens, count.source) == (answer["tokens_evaluated"], "exact")


async def test_a_list_of_prompts_counts_what_all_its_tasks_evaluate(llama, http):
    prompts = ["hello world", "the lazy dog and the quick brown fox"]
    resp = await http.post(f"{llama.url}/completion", json={"prompt": prompts, "n_predict": 1})
    assert resp.status_code == 200, resp.text
    results = resp.json()
    assert isinstance(results, list) and len(results) == 2
    count = await TokenCounter(http).count(llama.url, "completion", {"prompt": prompts})
    assert count.tokens == sum(r["tokens_evaluated"] for r in results)


# Sentences of words the tiny vocabulary holds whole, as a real tokenizer would: the
# byte-level pieces of out-of-vocabulary words (and of the ChatML markers, which this
# vocabulary lacks as special tokens) cost about one token per byte, which no bytes/3
# estimate can cover.
ENGLISH = [
    "The quick brown fox jumps over the lazy dog.",
    "Tell me a story about the lazy dog and the llama server.",
    "When the queue is full the gate will refuse the request and ask the client to retry.",
    "Each tenant has a budget of tokens, and the admission of a request depends on it.",
    "What should we do about the latency of the model when every slot is busy?",
]


@pytest.mark.parametrize("sentence", ENGLISH)
async def test_estimate_is_not_below_the_exact_count_for_english(llama, http, sentence):
    body = {"prompt": sentence}
    exact = await TokenCounter(http).count(llama.url, "completion", body)
    estimate = estimate_tokens(canonical_json(prompt_fields("completion", body)))
    assert exact.source == "exact"
    assert estimate >= exact.tokens, (estimate, exact.tokens)
    assert estimate == math.ceil(len(canonical_json(body)) / 3)


async def test_unreachable_backend_gives_an_estimate_quickly(http):
    from tests.llama.server import free_port

    counter = TokenCounter(http, timeout_s=1.0)
    count = await counter.count(f"http://127.0.0.1:{free_port()}", "chat", {"messages": CHAT_SHAPES["multi_turn"]})
    assert count.source == "estimate" and not count.cached
    assert counter.stats()["errors"] == 1
