"""Admission through the real gate in front of the real llama-server.

What token-aware admission is for, shown end to end on the pinned llama.cpp
build (tests/conftest.py: 4 slots, 2048 tokens of KV cache, split or unified):

1. a burst that overflows the unified KV pool makes llama-server fail requests
   with 500 "Context size has been exceeded"; through the gate the same burst
   only ever sees 200 or 429 + Retry-After;
2. queued requests are dispatched by class priority;
3. a request that can never fit a slot is refused at once, without reaching
   llama-server;
4. bounded queues: queue_full, queue_timeout, and a real OpenAI SDK client
   that honours Retry-After and eventually gets its answer;
5. /metrics counts every decision by class, outcome and reason.

The llama-server fixtures are session-scoped and shared: every test leaves
them idle (no slot busy) when it ends, whatever happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Iterable

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.gate_harness import busy_slots, released, running_gate, wait_until, words

pytestmark = pytest.mark.llama

# No top-level keys here: gate_toml() appends this after the [[backends]] tables, so a
# top-level key would land in the last backend table. default_class is "interactive"
# anyway when that class exists.
# These tests queue requests behind occupiers for seconds on purpose: the TTFT objective every
# class has by default (budget.slo_ttft_p95_ms, 2 s from arrival) would refuse those waiters
# early (#25; that rule is tested in tests/unit/test_ttft_guard.py), so it is set out of the way.
CLASSES = """
[classes.interactive]
priority = 10
queue_depth = 8
queue_timeout_s = 30
ttft_objective_ms = 120000

[classes.batch]
priority = 1
queue_depth = 16
queue_timeout_s = 60
ttft_objective_ms = 120000
"""

# Strict priority: aging (a waiter older than budget.aging_s goes first whatever its class)
# would let batch waiters overtake when the occupiers run long on a slow machine.
STRICT_PRIORITY = (
    CLASSES
    + """
[budget]
aging_s = 0
"""
)

CHAT = "/v1/chat/completions"
INTERACTIVE = {"X-Tokengate-Class": "interactive"}
BATCH = {"X-Tokengate-Class": "batch"}


# ---- helpers --------------------------------------------------------------------------


def chat_body(n_words: int, max_tokens: int, **extra) -> dict:
    return {
        "messages": [{"role": "user", "content": words(n_words)}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        **extra,
    }


def samples(text: str) -> list:
    """Every sample of a Prometheus text exposition, parsed by prometheus_client."""
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


async def llama_metrics(client: httpx.AsyncClient, llama_url: str) -> dict[str, float]:
    resp = await client.get(llama_url + "/metrics")
    assert resp.status_code == 200, resp.text
    return {s.name: s.value for s in samples(resp.text)}


async def stream_chat(client: httpx.AsyncClient, url: str, body: dict, headers: dict | None = None) -> tuple[int, int | None]:
    """POST a streaming chat request and read it to the end: (status, usage.completion_tokens)."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    completion_tokens = None
    async with client.stream("POST", url + CHAT, json=body, headers=headers) as resp:
        if resp.status_code != 200:
            await resp.aread()
            return resp.status_code, None
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            assert "error" not in chunk, chunk
            if chunk.get("usage"):
                completion_tokens = chunk["usage"]["completion_tokens"]
    return 200, completion_tokens


@contextlib.asynccontextmanager
async def idle_afterwards(client: httpx.AsyncClient, llama_url: str) -> AsyncIterator[list[asyncio.Task]]:
    """Tasks appended to the yielded list are cancelled if the body fails; on exit the
    shared llama-server must have no busy slot (a cancelled stream frees its slot ~0.05 s
    after the gate closes it upstream)."""
    tasks: list[asyncio.Task] = []
    try:
        yield tasks
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await wait_until(lambda: _idle(client, llama_url), timeout_s=30)


async def _idle(client: httpx.AsyncClient, llama_url: str) -> bool:
    return await busy_slots(client, llama_url) == 0


def spawn(tasks: list[asyncio.Task], coro: Awaitable) -> asyncio.Task:
    task = asyncio.ensure_future(coro)
    tasks.append(task)
    return task


class DeferredSampler:
    """Scrapes llama-server's `requests_deferred` gauge while a burst runs.

    The gauge is llama-server's own FIFO (requests that found every slot busy); there
    is no counter of it, so sampling is the only way to see it from outside.
    """

    def __init__(self, client: httpx.AsyncClient, llama_url: str, interval_s: float = 0.05) -> None:
        self.client = client
        self.url = llama_url
        self.interval_s = interval_s
        self.values: list[float] = []
        self._task: asyncio.Task | None = None

    async def _run(self) -> None:
        while True:
            self.values.append((await llama_metrics(self.client, self.url))["llamacpp:requests_deferred"])
            await asyncio.sleep(self.interval_s)

    async def __aenter__(self) -> DeferredSampler:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self.values.append((await llama_metrics(self.client, self.url))["llamacpp:requests_deferred"])

    @property
    def peak(self) -> float:
        return max(self.values)


def record_dispatches(gatekeeper) -> list[str]:
    """Wrap `gatekeeper.advance` (called on every release, timer and probe change) to log
    the class of every queued request it dispatches, in dispatch order."""
    dispatched: list[str] = []
    original = gatekeeper.advance

    def advance():
        step = original()
        dispatched.extend(admit.request.cls for admit in step.admitted)
        return step

    gatekeeper.advance = advance
    return dispatched


def track_peak(admission) -> dict[str, int]:
    """Wrap the two methods that reserve (`offer`, `advance`) to record the most tokens
    and requests ever in flight."""
    peak = {"tokens": 0, "requests": 0}

    def wrap(fn):
        def wrapper(*args, **kwargs):
            result = fn(*args, **kwargs)
            peak["tokens"] = max(peak["tokens"], admission.ledger.in_flight)
            peak["requests"] = max(peak["requests"], len(admission.ledger))
            return result

        return wrapper

    admission.offer = wrap(admission.offer)
    admission.advance = wrap(admission.advance)
    return peak


def assert_retry_after(resp: httpx.Response) -> None:
    """429s carry Retry-After (integer seconds, 1..120) and retry-after-ms (integer)."""
    retry_after = resp.headers.get("retry-after")
    assert retry_after is not None and retry_after.isdigit(), resp.headers
    assert 1 <= int(retry_after) <= 120
    retry_ms = resp.headers.get("retry-after-ms")
    assert retry_ms is not None and retry_ms.isdigit(), resp.headers
    # Retry-After is retry-after-ms rounded up to whole seconds (at least 1).
    assert int(retry_after) == max(1, -(-int(retry_ms) // 1000))
    assert resp.json()["retry_after_s"] * 1000 == pytest.approx(int(retry_ms), abs=1)


def assert_error(resp: httpx.Response, status: int, code: str, error_type: str) -> dict:
    assert resp.status_code == status, resp.text
    body = resp.json()
    error = body["error"]
    assert error["code"] == code
    assert error["type"] == error_type
    assert isinstance(error["message"], str) and error["message"]
    assert "param" in error
    return body


# ---- 1. the unified-pool incident, and the gate preventing it -----------------------------

BURST = 6
BURST_PROMPT_WORDS = 200
BURST_MAX_TOKENS = 300


async def test_unified_pool_burst_fails_direct_and_never_5xx_through_the_gate(llama_unified):
    body = chat_body(BURST_PROMPT_WORDS, BURST_MAX_TOKENS)
    async with httpx.AsyncClient(timeout=120) as client, idle_afterwards(client, llama_unified.url):
        # Straight to llama-server: 4 slots x (252 prompt + 300) tokens > the 2048-token pool.
        async with DeferredSampler(client, llama_unified.url) as direct_deferred:
            direct = await asyncio.gather(*(client.post(llama_unified.url + CHAT, json=body) for _ in range(BURST)))
        direct_status = Counter(r.status_code for r in direct)
        overflowed = [r for r in direct if r.status_code == 500 and "Context size has been exceeded" in r.text]
        print(
            f"\ndirect burst: {direct_status[200]} x 200, {len(overflowed)} x 500 'Context size has been exceeded', "
            f"statuses {dict(direct_status)}, peak requests_deferred {direct_deferred.peak:g}"
        )
        assert overflowed, f"llama-server did not overflow its unified pool: {dict(direct_status)}"
        # Control for the sampler below: it does see llama-server's own queue.
        assert direct_deferred.peak >= 1

        before = await llama_metrics(client, llama_unified.url)
        async with running_gate(llama_unified.url, CLASSES, kv="unified") as gate:
            (backend,) = gate.backends
            admission = backend.admission
            assert admission.capacity.ceiling == llama_unified.ctx == 2048
            assert admission.budget == 2048
            peak = track_peak(admission)
            async with DeferredSampler(client, llama_unified.url) as gate_deferred:
                through = await asyncio.gather(*(client.post(gate.url + CHAT, json=body) for _ in range(BURST)))

            status = Counter(r.status_code for r in through)
            ok = [r for r in through if r.status_code == 200]
            refused = [r for r in through if r.status_code == 429]
            print(
                f"gate burst: {len(ok)} x 200 ({BURST_MAX_TOKENS} tokens each), {len(refused)} x 429, "
                f"statuses {dict(status)}, peak in flight {peak['tokens']} tokens / {peak['requests']} requests, "
                f"peak requests_deferred {gate_deferred.peak:g}"
            )
            assert not [r for r in through if r.status_code >= 500], [r.text for r in through]
            assert len(ok) + len(refused) == BURST, dict(status)
            assert ok, "the gate admitted nothing"
            costs = set()
            for r in ok:
                usage = r.json()["usage"]
                assert usage["completion_tokens"] == BURST_MAX_TOKENS
                costs.add(usage["prompt_tokens"] + BURST_MAX_TOKENS)
            (cost,) = costs
            fit = min(2048 // cost, 4)  # 252 + 300 tokens each: 3 fit the pool at once, not 4
            for r in refused:
                assert r.json()["error"]["code"] in {"queue_full", "queue_timeout", "token_budget_exceeded"}
                assert_retry_after(r)

            # The gate kept the pool's worst case within the pool and ran them concurrently.
            assert peak["tokens"] <= 2048
            assert peak["requests"] == fit
            records = [r for r in gate.records if r.endpoint == CHAT]
            assert len(records) == BURST
            admitted = [r for r in records if r.outcome == "admitted"]
            assert len(admitted) == len(ok)
            assert all(r.completion_tokens == BURST_MAX_TOKENS and r.token_count_source == "exact" for r in admitted)
            assert any(r.queue_ms and r.queue_ms > 0 for r in admitted), "nothing waited: the burst did not overflow"
            await released(gate)
        after = await llama_metrics(client, llama_unified.url)
        # Never more requests than slots: llama-server's own queue stayed empty throughout.
        assert gate_deferred.peak == 0
        assert after["llamacpp:requests_deferred"] == 0
        # Every admitted request decoded all of its tokens upstream; nothing else was sent.
        predicted = after["llamacpp:tokens_predicted_total"] - before["llamacpp:tokens_predicted_total"]
        assert predicted == len(ok) * BURST_MAX_TOKENS


# ---- 2. priority ------------------------------------------------------------------------------


async def test_queued_interactive_requests_are_dispatched_before_queued_batch(llama_split):
    url = llama_split.url
    async with httpx.AsyncClient(timeout=60) as client, idle_afterwards(client, url) as tasks:
        async with running_gate(url, STRICT_PRIORITY, kv="split") as gate:
            (backend,) = gate.backends
            admission = backend.admission
            dispatched = record_dispatches(backend.gatekeeper)

            # Occupy all 4 slots with streaming batch requests (~2 s each at ~100 tok/s).
            running = [spawn(tasks, stream_chat(client, gate.url, chat_body(10, 200), BATCH)) for _ in range(4)]
            await wait_until(lambda: len(admission.ledger) == 4)
            await wait_until(lambda: _all_busy(client, url), timeout_s=10)

            def post(headers: dict, user: str) -> asyncio.Task:
                body = chat_body(10, 16, user=user)
                return spawn(tasks, client.post(gate.url + CHAT, json=body, headers=headers))

            batch = [post(BATCH, f"batch-{i}") for i in range(3)]
            await wait_until(lambda: len(admission.queue("batch")) == 3)
            interactive = [post(INTERACTIVE, f"interactive-{i}") for i in range(2)]
            await wait_until(lambda: len(admission.queue("interactive")) == 2)
            # Precondition: all five queued while the slots were still held.
            assert dispatched == [] and len(admission.ledger) == 4, "occupiers finished too early"

            assert [await t for t in running] == [(200, 200)] * 4
            batch_resp = [await t for t in batch]
            interactive_resp = [await t for t in interactive]

            assert dispatched == ["interactive", "interactive", "batch", "batch", "batch"]
            for r in batch_resp + interactive_resp:
                assert r.status_code == 200, r.text
                assert r.json()["usage"]["completion_tokens"] == 16
                assert float(r.headers["x-tokengate-queue-ms"]) > 0
            assert [r.headers["x-tokengate-class"] for r in interactive_resp] == ["interactive"] * 2
            assert [r.headers["x-tokengate-class"] for r in batch_resp] == ["batch"] * 3

            await released(gate)


async def _all_busy(client: httpx.AsyncClient, llama_url: str) -> bool:
    return await busy_slots(client, llama_url) == 4


# ---- 3. never fits ------------------------------------------------------------------------------


async def test_split_request_larger_than_a_slot_is_refused_at_once_and_never_reaches_llama(llama_split):
    url = llama_split.url
    counters = ("llamacpp:prompt_tokens_total", "llamacpp:n_decode_total", "llamacpp:tokens_predicted_total")
    # ~130 prompt tokens + 450 > the 512 tokens of one slot; the 2048-token total would hold it.
    oversized = chat_body(100, 450)
    async with httpx.AsyncClient(timeout=60) as client, idle_afterwards(client, url) as tasks:
        async with running_gate(url, CLASSES, kv="split") as gate:
            (backend,) = gate.backends
            admission = backend.admission
            assert admission.capacity.slot_context == 512 and admission.capacity.ceiling == 2048

            before = await llama_metrics(client, url)
            answers = [
                await client.post(gate.url + CHAT, json=oversized),
                await client.post(gate.url + CHAT, json={**oversized, "stream": True}),
                await client.post(gate.url + "/completion", json={"prompt": words(100), "n_predict": 450}),
            ]
            after = await llama_metrics(client, url)
            for resp in answers:
                body = assert_error(resp, 400, "context_length_exceeded", "exceed_context_size_error")
                assert body["error"]["param"] is None
                assert "512" in body["error"]["message"]
                assert "retry-after" not in resp.headers and "retry-after-ms" not in resp.headers
                assert "retry_after_s" not in body
                assert resp.headers["x-tokengate-queue-ms"] == "0.0"
            assert {k: after[k] for k in counters} == {k: before[k] for k in counters}

            refused = list(gate.records)
            assert len(refused) == 3
            for rec in refused:
                assert (rec.outcome, rec.reason, rec.http_status) == ("refused", "context_length_exceeded", 400)
                assert rec.reserved_tokens == 0 and rec.queue_ms == 0.0  # refused at once: waited 0, as its header says
                assert rec.prompt_tokens + rec.max_tokens > 512

            # Control: a request that fits does move those counters (the comparison is not vacuous).
            fits = await client.post(gate.url + CHAT, json=chat_body(100, 8))
            assert fits.status_code == 200, fits.text
            moved = await llama_metrics(client, url)
            assert all(moved[k] > after[k] for k in counters)

            # "At once" also under load: with every slot held, it does not wait for one.
            running = [spawn(tasks, stream_chat(client, gate.url, chat_body(10, 150))) for _ in range(4)]
            await wait_until(lambda: len(admission.ledger) == 4)
            resp = await client.post(gate.url + CHAT, json=oversized)
            assert len(admission.ledger) == 4, "the refusal waited for a slot"
            assert_error(resp, 400, "context_length_exceeded", "exceed_context_size_error")
            assert admission.waiting() == 0
            assert [await t for t in running] == [(200, 150)] * 4
            await released(gate)


# ---- 4. bounded queue: queue_full, queue_timeout, and a real OpenAI client -------------------

SMALL_QUEUE = """
[classes.interactive]
priority = 10
queue_depth = 1
queue_timeout_s = 1.5
ttft_objective_ms = 120000

[classes.batch]
priority = 1
queue_depth = 16
queue_timeout_s = 60
ttft_objective_ms = 120000
"""


async def test_queue_full_queue_timeout_and_openai_client_honours_retry_after(llama_split):
    import httpx2
    import openai

    url = llama_split.url
    async with httpx.AsyncClient(timeout=60) as client, idle_afterwards(client, url) as tasks:
        async with running_gate(url, SMALL_QUEUE, kv="split") as gate:
            (backend,) = gate.backends
            admission = backend.admission
            loop = asyncio.get_running_loop()

            # Hold all 4 slots for ~4.5 s (450 tokens at ~100 tok/s each, 4 busy on 2 cores).
            occupiers = [spawn(tasks, stream_chat(client, gate.url, chat_body(10, 450), BATCH)) for _ in range(4)]
            await wait_until(lambda: len(admission.ledger) == 4)

            def post(user: str) -> asyncio.Task:
                return spawn(tasks, client.post(gate.url + CHAT, json=chat_body(10, 8, user=user), headers=INTERACTIVE))

            # A waits in the 1-deep queue; B finds it full.
            started = loop.time()
            waiter = post("tenant-a")
            await wait_until(lambda: len(admission.queue("interactive")) == 1)
            full = await post("tenant-b")
            body = assert_error(full, 429, "queue_full", "rate_limit_error")
            assert body["error"]["param"] is None
            assert_retry_after(full)
            assert not waiter.done()

            # A's wait runs out after queue_timeout_s.
            timed_out = await waiter
            waited = loop.time() - started
            assert_error(timed_out, 429, "queue_timeout", "rate_limit_error")
            assert_retry_after(timed_out)
            assert waited >= 1.5
            assert len(admission.ledger) == 4, "occupiers finished before the timeout: not a queue timeout test"
            assert admission.waiting() == 0

            # C waits again, so the SDK's first attempt finds the queue full.
            third = post("tenant-c")
            await wait_until(lambda: len(admission.queue("interactive")) == 1)

            exchanges: list[tuple[str, float, httpx2.Response | None]] = []

            async def on_request(request):
                exchanges.append(("request", loop.time(), None))

            async def on_response(response):
                exchanges.append(("response", loop.time(), response))

            http_client = httpx2.AsyncClient(event_hooks={"request": [on_request], "response": [on_response]})
            sdk = openai.AsyncOpenAI(
                base_url=gate.url + "/v1",
                api_key="x",
                max_retries=6,
                http_client=http_client,
                default_headers=INTERACTIVE,
            )
            async with sdk:
                completion = await sdk.chat.completions.create(
                    model="tiny",
                    messages=[{"role": "user", "content": words(10)}],
                    max_completion_tokens=8,
                    extra_body={"ignore_eos": True, "user": "sdk-tenant"},
                )
            assert completion.usage.completion_tokens == 8
            assert completion.choices[0].finish_reason == "length"

            # The SDK saw 429s, waited at least what Retry-After said each time, then got 200.
            responses = [(t, r) for kind, t, r in exchanges if kind == "response"]
            requests = [t for kind, t, _ in exchanges if kind == "request"]
            statuses = [r.status_code for _, r in responses]
            print(f"\nopenai client: statuses {statuses}, reasons {[r.reason for r in gate.records if r.tenant == 'sdk-tenant']}")
            assert statuses[-1] == 200 and set(statuses[:-1]) == {429}, statuses
            assert len(requests) == len(responses) >= 2
            for (t_refused, refused), t_retry in zip(responses[:-1], requests[1:]):
                assert refused.headers["retry-after"].isdigit()
                assert t_retry - t_refused >= int(refused.headers["retry-after-ms"]) / 1000 - 0.01

            sdk_records = [r for r in gate.records if r.tenant == "sdk-tenant"]
            assert [r.outcome for r in sdk_records] == ["refused"] * (len(sdk_records) - 1) + ["admitted"]
            assert sdk_records[0].reason == "queue_full"
            assert all(r.reason in {"queue_full", "queue_timeout"} and r.http_status == 429 for r in sdk_records[:-1])
            assert sdk_records[-1].http_status == 200 and sdk_records[-1].completion_tokens == 8

            assert (await third).status_code in {200, 429}
            assert [await t for t in occupiers] == [(200, 450)] * 4
            await released(gate)


# ---- 5. /metrics -----------------------------------------------------------------------------------


def by_labels(parsed: Iterable, name: str, *keys: str) -> dict[tuple[str, ...], float]:
    return {tuple(s.labels[k] for k in keys): s.value for s in parsed if s.name == name}


async def test_metrics_count_every_decision_by_class_outcome_and_reason(llama_split):
    url = llama_split.url
    model = "tiny-model"  # configured: metric labels carry only configured model names
    async with httpx.AsyncClient(timeout=60) as client, idle_afterwards(client, url):
        async with running_gate(url, CLASSES, kv="split", backend_extra=f'models = ["{model}"]') as gate:
            (backend,) = gate.backends
            admission = backend.admission

            def body(n_words: int, max_tokens: int, **extra) -> dict:
                return chat_body(n_words, max_tokens, model=model, **extra)

            # Admitted: 2 interactive (one streaming), 1 batch.
            ok = [
                await client.post(gate.url + CHAT, json=body(10, 8)),
                await client.post(gate.url + CHAT, json=body(10, 8), headers=BATCH),
            ]
            assert [r.status_code for r in ok] == [200, 200]
            assert await stream_chat(client, gate.url, body(10, 8)) == (200, 8)

            # Refused: 2 never fit a 512-token slot, 1 above a lowered working budget, 1 malformed.
            for _ in range(2):
                assert_error(
                    await client.post(gate.url + CHAT, json=body(100, 450)), 400, "context_length_exceeded", "exceed_context_size_error"
                )
            # Frozen, the budget is the operator's limit (the controller's would stretch: E1).
            gate.control.freeze(True, operator=gate.operator)
            admission.set_budget(20)
            over = await client.post(gate.url + CHAT, json=body(10, 8))
            admission.set_budget(admission.capacity.ceiling)
            gate.control.freeze(False, operator=gate.operator)
            assert_error(over, 429, "token_budget_exceeded", "rate_limit_error")
            assert_retry_after(over)
            bad = await client.post(gate.url + CHAT, json={**body(10, 8), "max_tokens": -5})
            assert_error(bad, 400, "invalid_request", "invalid_request_error")

            resp = await client.get(gate.url + "/metrics")
            assert resp.status_code == 200
            parsed = samples(resp.text)

            decisions = by_labels(parsed, "tokengate_decisions_total", "class", "outcome", "reason")
            nonzero = {k: v for k, v in decisions.items() if v}
            invalid = {k: v for k, v in nonzero.items() if k[2] == "invalid_request"}
            assert list(invalid.values()) == [1] and list(invalid)[0][1] == "refused"
            assert {k: v for k, v in nonzero.items() if k[2] != "invalid_request"} == {
                ("interactive", "admitted", "ok"): 2,
                ("batch", "admitted", "ok"): 1,
                ("interactive", "refused", "context_length_exceeded"): 2,
                ("interactive", "refused", "token_budget_exceeded"): 1,
            }
            assert sum(decisions.values()) == 7 == gate.records.total

            denials = by_labels(parsed, "admission_control_denials_total", "model", "reason", "priority_class")
            admission_denials = {k: v for k, v in denials.items() if k[1] != "invalid_request"}
            assert admission_denials == {
                (model, "context_length_exceeded", "interactive"): 2,
                (model, "token_budget_exceeded", "interactive"): 1,
            }
            assert sum(denials.values()) == 4  # every refusal, malformed request included

            values = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in parsed}
            assert values[("tokengate_token_budget", ())] == 2048
            for cls in ("interactive", "batch"):
                assert values[("tokengate_tokens_in_flight", (("class", cls),))] == 0
                assert values[("tokengate_queue_depth", (("class", cls),))] == 0
            assert values[("tokengate_reaped_total", ())] == 0
            await released(gate)
