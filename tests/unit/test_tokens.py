"""TokenCounter against a fake llama-server (httpx.MockTransport): cache, fallback, estimates."""

from __future__ import annotations

import asyncio
import json
import logging
import math

import httpx
import pytest

from gate.backend.tokens import (
    TokenCount,
    TokenCounter,
    cache_key,
    canonical_json,
    estimate_tokens,
    prompt_fields,
)

URL = "http://backend:8080"
MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Tell me about the lazy dog."},
]


class FakeLlamaServer:
    """A stand-in for llama-server's counting endpoints, with switches for every failure mode.

    Its tokenizer is one token per whitespace-separated word, plus BOS when
    ``add_special``; its chat template wraps each message in ``<role> ... </role>``.
    """

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict]] = []
        self.headers: list[httpx.Headers] = []
        self.has_input_tokens = True
        self.no_route_status = 404
        self.down = False
        self.status: int | None = None  # forced status for every endpoint
        self.raw_body: bytes | None = None  # forced 200 body for every endpoint
        self.raw_status: tuple[int, bytes] | None = None  # forced status and body for every endpoint
        self.gate: asyncio.Event | None = None  # when set, answers wait for it

    def paths(self) -> list[str]:
        return [path for path, _ in self.calls]

    @staticmethod
    def template(messages: list[dict]) -> str:
        return " ".join(f"<{m['role']}> {m['content']} </{m['role']}>" for m in messages) + " <assistant>"

    @staticmethod
    def tokenize(text: str, add_special: bool) -> list[int]:
        return [1] * add_special + [7] * len(text.split())

    async def handler(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.calls.append((request.url.path, body))
        self.headers.append(request.headers)
        if self.gate is not None:
            await self.gate.wait()
        if self.down:
            raise httpx.ConnectError("connection refused", request=request)
        if self.status is not None:
            return httpx.Response(self.status, json={"error": {"code": self.status, "message": "Loading model"}})
        if self.raw_body is not None:
            return httpx.Response(200, content=self.raw_body)
        if self.raw_status is not None:
            return httpx.Response(self.raw_status[0], content=self.raw_status[1])
        path = request.url.path
        if path == "/v1/chat/completions/input_tokens":
            if not self.has_input_tokens:
                return httpx.Response(self.no_route_status, json={"error": {"code": 404, "message": "File Not Found"}})
            n = len(self.tokenize(self.template(body["messages"]), True))
            return httpx.Response(200, json={"input_tokens": n, "object": "response.input_tokens"})
        if path == "/apply-template":
            return httpx.Response(200, json={"prompt": self.template(body["messages"])})
        if path == "/tokenize":
            return httpx.Response(200, json={"tokens": self.tokenize(body["content"], body["add_special"])})
        return httpx.Response(404)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def upstream() -> FakeLlamaServer:
    return FakeLlamaServer()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def client(upstream):
    async with httpx.AsyncClient(transport=httpx.MockTransport(upstream.handler)) as c:
        yield c


@pytest.fixture
def counter(client, clock) -> TokenCounter:
    return TokenCounter(client, cache_size=8, timeout_s=1.0, clock=clock)


def chat(messages=MESSAGES, **extra) -> dict:
    return {"messages": messages, **extra}


def true_chat_count(messages=MESSAGES) -> int:
    return len(FakeLlamaServer.tokenize(FakeLlamaServer.template(messages), True))


# --- exact counts and the cache ---------------------------------------------


async def test_chat_is_counted_by_input_tokens_then_served_from_cache_without_http(counter, upstream):
    first = await counter.count(URL, "chat", chat(max_tokens=5))
    assert first == TokenCount(true_chat_count(), "exact", cached=False)
    assert upstream.paths() == ["/v1/chat/completions/input_tokens"]

    second = await counter.count(URL, "chat", chat(max_tokens=5))
    assert second == TokenCount(true_chat_count(), "exact", cached=True)
    assert len(upstream.calls) == 1
    assert counter.stats() == {"hits": 1, "misses": 1, "exact": 2, "estimate": 0, "errors": 0, "coalesced": 0}


async def test_only_prompt_bearing_fields_are_sent_upstream(counter, upstream):
    await counter.count(URL, "chat", chat(tools=[{"type": "function"}], temperature=0.3, stream=True, max_tokens=9))
    ((_, sent),) = upstream.calls
    assert sent == {"messages": MESSAGES, "tools": [{"type": "function"}]}


async def test_unrelated_fields_share_a_cache_entry_but_other_messages_do_not(counter, upstream):
    await counter.count(URL, "chat", chat(temperature=0.1, max_tokens=5, stream=False))
    hit = await counter.count(URL, "chat", chat(temperature=0.9, max_tokens=500, stream=True, user="bob"))
    assert hit.cached

    other = [*MESSAGES, {"role": "user", "content": "And the fox?"}]
    miss = await counter.count(URL, "chat", chat(other, temperature=0.1))
    assert not miss.cached
    assert miss.tokens == true_chat_count(other)
    assert len(upstream.calls) == 2


def test_cache_key_depends_on_prompt_fields_backend_and_kind_only():
    def key(body, url=URL, kind="chat"):
        return cache_key(url, kind, canonical_json(prompt_fields(kind, body)))

    base = key(chat())
    assert key(chat(temperature=1.0, max_tokens=3, stream=True, top_p=0.5)) == base
    assert key({"messages": list(reversed(MESSAGES))}) != base
    assert key(chat(tools=[])) != base
    assert key(chat(tool_choice="none")) != base
    assert key(chat(chat_template_kwargs={"enable_thinking": False})) != base
    assert key(chat(add_generation_prompt=False)) != base
    assert key(chat(), url="http://other:8080") != base
    assert key(chat(), url=URL + "/") == base
    # Key order inside messages is not content.
    assert key({"messages": [{"content": m["content"], "role": m["role"]} for m in MESSAGES]}) == base
    assert key({"prompt": "x"}, kind="completions") != key({"prompt": "x"}, kind="completion")
    assert key({"prompt": "x", "n_predict": 3}, kind="completion") == key({"prompt": "x"}, kind="completion")
    assert len(base) == 32  # a sha256 digest, never the text


async def test_cache_holds_digests_and_counts_only(counter):
    await counter.count(URL, "completions", {"prompt": "secret words here"})
    ((key, value),) = counter._cache.items()
    assert isinstance(key, bytes) and len(key) == 32 and b"secret" not in key
    assert value == 4


async def test_lru_evicts_the_least_recently_used_entry_at_cache_size(client, upstream):
    counter = TokenCounter(client, cache_size=2)
    a, b, c = ({"prompt": f"prompt {w}"} for w in "abc")
    await counter.count(URL, "completion", a)
    await counter.count(URL, "completion", b)
    assert (await counter.count(URL, "completion", a)).cached  # a is now the most recent
    await counter.count(URL, "completion", c)  # evicts b
    assert len(counter) == 2
    assert (await counter.count(URL, "completion", a)).cached
    assert (await counter.count(URL, "completion", c)).cached
    calls = len(upstream.calls)
    assert not (await counter.count(URL, "completion", b)).cached
    assert len(upstream.calls) == calls + 1


async def test_cache_size_zero_never_caches(client, upstream):
    counter = TokenCounter(client, cache_size=0)
    for _ in range(2):
        assert not (await counter.count(URL, "completions", {"prompt": "a b"})).cached
    assert len(upstream.calls) == 2 and len(counter) == 0


def test_constructor_rejects_nonsense(client):
    with pytest.raises(ValueError):
        TokenCounter(client, cache_size=-1)
    with pytest.raises(ValueError):
        TokenCounter(client, timeout_s=0)


# --- the fallback when input_tokens is missing ------------------------------


@pytest.mark.parametrize("status", [404, 405, 501])
async def test_missing_input_tokens_falls_back_to_apply_template_and_is_remembered(counter, upstream, status):
    upstream.has_input_tokens = False
    upstream.no_route_status = status
    first = await counter.count(URL, "chat", chat())
    assert first == TokenCount(true_chat_count(), "exact", cached=False)
    assert upstream.paths() == ["/v1/chat/completions/input_tokens", "/apply-template", "/tokenize"]
    assert upstream.calls[2][1] == {
        "content": FakeLlamaServer.template(MESSAGES),
        "add_special": True,
        "parse_special": True,
    }

    other = [{"role": "user", "content": "something else entirely"}]
    second = await counter.count(URL, "chat", chat(other))
    assert second == TokenCount(true_chat_count(other), "exact", cached=False)
    assert upstream.paths()[3:] == ["/apply-template", "/tokenize"]  # no second probe


async def test_input_tokens_is_probed_again_after_reprobe_s(counter, upstream, clock, caplog):
    caplog.set_level(logging.INFO, logger="tokengate.tokens")
    upstream.has_input_tokens = False
    await counter.count(URL, "chat", chat())
    clock.now += 599
    await counter.count(URL, "chat", chat([{"role": "user", "content": "one"}]))
    assert upstream.paths().count("/v1/chat/completions/input_tokens") == 1

    clock.now += 2  # past 10 minutes: still missing, probed once more, then quiet again
    await counter.count(URL, "chat", chat([{"role": "user", "content": "two"}]))
    await counter.count(URL, "chat", chat([{"role": "user", "content": "three"}]))
    assert upstream.paths().count("/v1/chat/completions/input_tokens") == 2

    upstream.has_input_tokens = True  # the backend was upgraded
    clock.now += 601
    n = await counter.count(URL, "chat", chat([{"role": "user", "content": "four"}]))
    assert n.source == "exact"
    assert upstream.paths()[-1] == "/v1/chat/completions/input_tokens"
    messages = [r.getMessage() for r in caplog.records]
    assert sum("has no /v1/chat/completions/input_tokens" in m for m in messages) == 1
    assert sum("now answers" in m for m in messages) == 1


async def test_input_tokens_support_is_remembered_per_backend(counter, upstream):
    upstream.has_input_tokens = False
    await counter.count(URL, "chat", chat())
    upstream.has_input_tokens = True
    await counter.count("http://other:8080", "chat", chat())
    assert upstream.paths()[-1] == "/v1/chat/completions/input_tokens"


# --- failures give estimates --------------------------------------------------


def expected_estimate(kind, body) -> int:
    return max(1, math.ceil(len(canonical_json(prompt_fields(kind, body))) / 3))


async def test_backend_down_gives_an_uncached_estimate_and_the_next_call_retries(counter, upstream):
    upstream.down = True
    body = chat()
    first = await counter.count(URL, "chat", body)
    assert first == TokenCount(expected_estimate("chat", body), "estimate", cached=False)
    assert len(counter) == 0

    again = await counter.count(URL, "chat", body)
    assert again.source == "estimate" and len(upstream.calls) == 2  # tried the backend again

    upstream.down = False
    assert await counter.count(URL, "chat", body) == TokenCount(true_chat_count(), "exact", cached=False)
    assert counter.stats()["errors"] == 2
    assert counter.stats()["estimate"] == 2


async def test_backend_down_does_not_mark_input_tokens_missing(counter, upstream):
    upstream.down = True
    await counter.count(URL, "chat", chat())
    upstream.down = False
    await counter.count(URL, "chat", chat())
    assert upstream.paths() == ["/v1/chat/completions/input_tokens"] * 2


async def test_a_hanging_backend_gives_an_estimate_within_the_timeout(client, upstream):
    counter = TokenCounter(client, timeout_s=0.05)
    upstream.gate = asyncio.Event()  # never set
    result = await asyncio.wait_for(counter.count(URL, "completions", {"prompt": "a b c"}), 2)
    assert result.source == "estimate"
    assert counter.stats()["errors"] == 1


@pytest.mark.parametrize("status", [500, 502, 503])
async def test_server_errors_and_loading_give_estimates(counter, upstream, status):
    upstream.status = status
    result = await counter.count(URL, "chat", chat())
    assert result.source == "estimate" and not result.cached
    assert upstream.paths() == ["/v1/chat/completions/input_tokens"]  # 5xx is not "no such route"


@pytest.mark.parametrize(
    "raw",
    [
        b"<html>not json</html>",
        b"[1, 2, 3]",
        b'{"object": "response.input_tokens"}',
        b'{"input_tokens": -4}',
        b'{"input_tokens": true}',
        b'{"input_tokens": "12"}',
        b'{"input_tokens": 1.5}',
    ],
)
async def test_malformed_input_tokens_answers_give_estimates(counter, upstream, raw):
    upstream.raw_body = raw
    result = await counter.count(URL, "chat", chat())
    assert result == TokenCount(expected_estimate("chat", chat()), "estimate", cached=False)
    assert len(counter) == 0


@pytest.mark.parametrize("raw", [b'{"tokens": "many"}', b'{"prompt": 3}', b"{}", b"null"])
async def test_malformed_fallback_answers_give_estimates(counter, upstream, raw):
    upstream.has_input_tokens = False
    await counter.count(URL, "chat", chat())  # learn that input_tokens is missing
    upstream.raw_body = raw
    result = await counter.count(URL, "chat", chat([{"role": "user", "content": "x"}]))
    assert result.source == "estimate"
    assert (await counter.count(URL, "completion", {"prompt": "y"})).source == "estimate"


async def test_state_changes_are_logged_once_each(counter, upstream, caplog):
    caplog.set_level(logging.DEBUG, logger="tokengate.tokens")
    upstream.status = 503
    for i in range(3):
        await counter.count(URL, "completions", {"prompt": f"p {i}"})
    upstream.status = None
    for i in range(3):
        await counter.count(URL, "completions", {"prompt": f"q {i}"})
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2
    assert "failing (/tokenize answered HTTP 503)" in warnings[0] and URL in warnings[0]
    assert "recovered" in warnings[1]


async def test_a_refused_body_gives_an_estimate_without_a_health_warning(counter, upstream, caplog):
    caplog.set_level(logging.WARNING, logger="tokengate.tokens")
    upstream.status = 400
    result = await counter.count(URL, "chat", chat())
    assert result.source == "estimate"
    assert counter.stats()["errors"] == 1
    assert caplog.records == []


@pytest.mark.parametrize(
    ("status", "body", "warned"),
    [
        # llama-server's own 500 for an exception while it read this body (an image without an
        # mmproj): the same request straight gets the same answer; the backend is fine
        (500, {"error": {"code": 500, "message": "image input is not supported", "type": "server_error"}}, False),
        (500, None, True),  # a 500 without llama-server's error object: something else broke
        (502, {"error": {"code": 502, "message": "bad gateway"}}, True),
        (503, {"error": {"code": 503, "message": "Loading model"}}, True),
    ],
)
async def test_a_500_for_the_body_is_not_a_health_warning(counter, upstream, caplog, status, body, warned):
    caplog.set_level(logging.WARNING, logger="tokengate.tokens")
    upstream.raw_status = (status, b"<html>oops</html>" if body is None else json.dumps(body).encode())
    result = await counter.count(URL, "chat", chat())
    assert result.source == "estimate"
    assert any("failing" in r.getMessage() for r in caplog.records) is warned


def test_estimate_is_bytes_of_the_canonical_json_over_three_and_at_least_one():
    assert estimate_tokens(b"") == 1
    assert estimate_tokens(b"abc") == 1
    assert estimate_tokens(b"abcd") == 2
    body = {"prompt": "héllo wörld", "max_tokens": 99}
    canonical = canonical_json(prompt_fields("completion", body))
    assert canonical == '{"prompt":"héllo wörld"}'.encode()
    assert estimate_tokens(canonical) == math.ceil(len(canonical) / 3) == 9


# --- completion prompts -----------------------------------------------------


async def test_completion_prompt_string_is_tokenized_with_bos_and_special_tokens(counter, upstream):
    result = await counter.count(URL, "completion", {"prompt": "the quick brown fox", "n_predict": 4})
    assert result == TokenCount(5, "exact", cached=False)
    assert upstream.calls == [("/tokenize", {"content": "the quick brown fox", "add_special": True, "parse_special": True})]


async def test_token_id_prompts_need_no_backend(counter, upstream):
    result = await counter.count(URL, "completions", {"prompt": [1, 400, 500, 600]})
    assert result == TokenCount(4, "exact", cached=False)
    assert upstream.calls == []


async def test_mixed_prompt_is_one_prompt_with_bos_only_on_a_leading_string(counter, upstream):
    assert (await counter.count(URL, "completions", {"prompt": ["a b", 9, "c d e"]})).tokens == (1 + 2) + 1 + 3
    assert [body["add_special"] for _, body in upstream.calls] == [True, False]
    upstream.calls.clear()
    assert (await counter.count(URL, "completions", {"prompt": [9, "c d"]})).tokens == 1 + 2
    assert [body["add_special"] for _, body in upstream.calls] == [False]


async def test_a_list_of_prompts_counts_the_sum_of_its_prompts(counter, upstream):
    result = await counter.count(URL, "completions", {"prompt": ["a b", "c", [5, 6, 7]]})
    assert result.tokens == 3 + 2 + 3
    assert [body["add_special"] for _, body in upstream.calls] == [True, True]


async def test_an_empty_entry_of_a_prompt_list_counts_no_tokens(counter, upstream):
    # llama-server runs it (200) as a prompt of no tokens; only [] as the whole prompt is refused
    assert (await counter.count(URL, "completions", {"prompt": [[]]})).tokens == 0
    assert (await counter.count(URL, "completions", {"prompt": [[], "a b"]})).tokens == 3


@pytest.mark.parametrize("prompt", [[], None, 42, {"prompt_string": "x"}, ["a", None]])
async def test_prompts_of_unknown_shape_are_estimated_without_http(counter, upstream, prompt):
    result = await counter.count(URL, "completion", {"prompt": prompt})
    assert result.source == "estimate"
    assert upstream.calls == []


# --- headers, coalescing, shutdown ----------------------------------------------


async def test_extra_headers_reach_the_backend(counter, upstream):
    upstream.has_input_tokens = False
    await counter.count(URL, "chat", chat(), headers={"Authorization": "Bearer s3cret"})
    assert [h["authorization"] for h in upstream.headers] == ["Bearer s3cret"] * 3
    assert all(h["content-type"] == "application/json" for h in upstream.headers)


async def test_trailing_slash_in_base_url_is_the_same_backend(counter, upstream):
    await counter.count(URL + "/", "chat", chat())
    assert (await counter.count(URL, "chat", chat())).cached
    assert len(upstream.calls) == 1


async def test_identical_concurrent_misses_share_one_backend_call(counter, upstream):
    upstream.gate = asyncio.Event()
    waiters = [asyncio.create_task(counter.count(URL, "chat", chat(temperature=t))) for t in (0.1, 0.2, 0.3)]
    await asyncio.sleep(0.01)
    upstream.gate.set()
    results = await asyncio.gather(*waiters)
    assert all(r == TokenCount(true_chat_count(), "exact", cached=False) for r in results)
    assert len(upstream.calls) == 1
    assert counter.stats()["coalesced"] == 2


async def test_a_cancelled_waiter_does_not_break_the_others(counter, upstream):
    upstream.gate = asyncio.Event()
    first = asyncio.create_task(counter.count(URL, "chat", chat()))
    second = asyncio.create_task(counter.count(URL, "chat", chat()))
    await asyncio.sleep(0.01)
    first.cancel()
    await asyncio.sleep(0)
    upstream.gate.set()
    assert await second == TokenCount(true_chat_count(), "exact", cached=False)
    assert first.cancelled()
    assert (await counter.count(URL, "chat", chat())).cached
    assert len(upstream.calls) == 1


async def test_a_lookup_outlives_its_only_cancelled_caller_and_fills_the_cache(counter, upstream):
    upstream.gate = asyncio.Event()
    only = asyncio.create_task(counter.count(URL, "chat", chat()))
    await asyncio.sleep(0.01)
    only.cancel()
    with pytest.raises(asyncio.CancelledError):
        await only
    upstream.gate.set()
    for _ in range(10):
        await asyncio.sleep(0)
    assert (await counter.count(URL, "chat", chat())).cached


async def test_aclose_cancels_lookups_and_their_callers_get_estimates(counter, upstream):
    upstream.gate = asyncio.Event()
    waiter = asyncio.create_task(counter.count(URL, "chat", chat()))
    await asyncio.sleep(0.01)
    await counter.aclose()
    result = await waiter
    assert result.source == "estimate"
    assert counter._inflight == {}


# --- the bound of a prompt forwarded beside its count --------------------------------------------


async def test_the_bound_covers_the_counts_of_a_backend_whose_tokens_are_short_and_eases_back(counter, upstream):
    from gate.backend.tokens import BOUND_MARGIN

    dense = chat([{"role": "user", "content": "a " * 900}])  # one token per 2 bytes: under 3
    est = estimate_tokens(canonical_json(prompt_fields("chat", dense)))
    assert counter.bound(URL, "chat", dense) == est + BOUND_MARGIN  # nothing learned yet: the estimate
    exact = (await counter.count(URL, "chat", dense)).tokens
    assert exact > est + BOUND_MARGIN  # the negative control: the plain estimate was not a bound
    assert counter.bound(URL, "chat", dense) >= exact  # learned: now it is
    assert counter.bound("http://other:8080", "chat", dense) == est + BOUND_MARGIN  # per backend
    # English-like text eases it back toward the estimate, never under it
    for i in range(400):
        await counter.count(URL, "chat", chat([{"role": "user", "content": f"word{i} " * 20}]))
    assert est + BOUND_MARGIN <= counter.bound(URL, "chat", dense) < exact


async def test_the_bound_grows_no_further_than_a_token_per_byte(counter, upstream):
    from gate.backend.tokens import BOUND_MARGIN

    upstream.raw_body = json.dumps({"input_tokens": 10**6}).encode()  # a count far over any bound
    body = chat([{"role": "user", "content": "hello"}])
    await counter.count(URL, "chat", body)
    assert counter.bound(URL, "chat", body) == math.ceil(estimate_tokens(canonical_json(prompt_fields("chat", body))) * 3.0) + BOUND_MARGIN


async def test_a_likely_count_follows_what_the_backends_exact_counts_gave_per_estimated_token(counter, upstream):
    """The journal of a request refused before its count: the plain estimate (bytes / 3) at
    first, then scaled by the typical exact tokens per estimated token of that backend."""
    body = chat([{"role": "user", "content": "a " * 300}])
    est = estimate_tokens(canonical_json(prompt_fields("chat", body)))
    first = counter.likely(URL, "chat", body)
    assert (first.tokens, first.source) == (est, "estimate")  # nothing learned yet
    exact = (await counter.count(URL, "chat", body)).tokens
    assert exact != est  # the negative control: the plain estimate was off
    assert counter.likely(URL, "chat", body).tokens == exact  # one exact count: its ratio
    assert counter.likely("http://other:8080", "chat", body).tokens == est  # per backend


# --- the chat template's own tokens (for `tokengate log --format aiperf`) ---------------------


@pytest.mark.parametrize("input_tokens", [True, False], ids=["input_tokens", "apply-template"])
async def test_the_chat_templates_tokens_are_a_one_message_chats_count_less_its_content(counter, upstream, input_tokens):
    """What the template adds, counted as chat requests are counted (input_tokens, else
    apply-template + tokenize): the fake's template of one user message is `<user> hello </user>
    <assistant>` + BOS: 5 tokens, 4 around the content's 1 (tokenized without BOS)."""
    upstream.has_input_tokens = input_tokens
    assert await counter.chat_template_tokens(URL) == 4
    assert ("/tokenize", {"content": "hello", "add_special": False, "parse_special": False}) in upstream.calls


async def test_measuring_the_chat_template_teaches_no_estimate_and_caches_nothing(counter, upstream):
    # a one-token message is nearly all template: learned as a count, its tokens per estimated
    # token (5 for 16 bytes) would have lifted the estimates of every request refused before its count
    body = chat([{"role": "user", "content": "a " * 300}])
    before = (counter.likely(URL, "chat", body), counter.bound(URL, "chat", body))
    assert await counter.chat_template_tokens(URL) == 4
    assert (counter.likely(URL, "chat", body), counter.bound(URL, "chat", body)) == before and len(counter) == 0


async def test_a_backend_that_cannot_count_gives_no_template_size_and_no_health_warning(counter, upstream, caplog):
    caplog.set_level(logging.WARNING, logger="tokengate.tokens")
    upstream.status = 404  # a server (or a fake) without /tokenize
    assert await counter.chat_template_tokens(URL) is None
    assert upstream.paths() == ["/tokenize"]  # the chat count is never asked then
    upstream.status, upstream.down = None, True
    assert await counter.chat_template_tokens(URL) is None
    assert not caplog.records
