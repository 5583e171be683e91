"""The inference-gateway gauges against the REAL llama-server: a scripted load through the
real gate, `/metrics` scraped over HTTP at each step, every value checked exactly.

The endpoint picker of the Gateway API Inference Extension routes on three gauges per model
server (deploy/kubernetes/): queued requests, running requests and KV-cache utilization. It
scrapes /metrics/inference (those three alone); /metrics must say the same.
Here the expected values come from outside the gate: which requests the script has sent,
held and cancelled, and each prompt's token count as llama-server itself reports it
(`usage.prompt_tokens` of the same messages sent to it directly). The KV pool is the split
backend's 4 slots x 512 tokens (llama-server -c 2048 -np 4).
"""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.gate_harness import busy_slots, released, running_gate, wait_until, words

pytestmark = pytest.mark.llama

# The scripted waiters wait behind long holders on purpose: the TTFT objective every class has by
# default (#25) would refuse them early, so it is set out of the way.
CLASSES = """
[budget]
mode = "static"

[classes.interactive]
priority = 10
queue_depth = 8
queue_timeout_s = 120
ttft_objective_ms = 600000

[classes.batch]
priority = 1
queue_depth = 8
queue_timeout_s = 120
ttft_objective_ms = 600000
"""
CHAT = "/v1/chat/completions"
GAUGES = ("tokengate_num_requests_waiting", "tokengate_num_requests_running", "tokengate_kv_cache_usage_ratio")
SLOT = 512  # split: -c 2048 over 4 slots
POOL = 4 * SLOT

# Long generations hold their slot for the whole script: each fills its slot (a holder) or
# nearly (a waiter), so a swap of one for the other moves the KV figure.
HOLD = {"words": 12, "cls": "batch", "cost": SLOT}
WAIT = {"words": 40, "cls": "interactive", "cost": SLOT - 16}


def messages(n_words: int) -> list[dict]:
    return [{"role": "user", "content": words(n_words)}]


async def prompt_tokens(client: httpx.AsyncClient, llama_url: str, n_words: int) -> int:
    """What llama-server itself counts for these messages (asked directly, not through the gate)."""
    resp = await client.post(llama_url + CHAT, json={"messages": messages(n_words), "max_tokens": 1})
    assert resp.status_code == 200, resp.text
    return resp.json()["usage"]["prompt_tokens"]


async def hold(client: httpx.AsyncClient, gate_url: str, kind: dict, max_tokens: int) -> int:
    """A streaming request that generates until cancelled (or its max_tokens)."""
    body = {"messages": messages(kind["words"]), "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
    async with client.stream("POST", gate_url + CHAT, json=body, headers={"X-Tokengate-Class": kind["cls"]}) as resp:
        async for line in resp.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                assert "error" not in json.loads(line[6:]), line
        return resp.status_code


async def gauges(client: httpx.AsyncClient, gate_url: str) -> tuple[tuple[float, float, float], ...]:
    """The three gauges of backend b0 / model tiny as scrapers read them: from the endpoint
    picker's lean /metrics/inference, then from the whole /metrics."""
    return (await _read(client, gate_url + "/metrics/inference"), await _read(client, gate_url + "/metrics"))


async def _read(client: httpx.AsyncClient, url: str) -> tuple[float, float, float]:
    resp = await client.get(url)
    assert resp.status_code == 200
    found = {
        s.name: s.value
        for fam in text_string_to_metric_families(resp.text)
        for s in fam.samples
        if s.name in GAUGES and s.labels == {"backend": "b0", "model": "tiny"}
    }
    return tuple(found[name] for name in GAUGES)  # type: ignore[return-value]


async def test_the_three_gauges_track_a_scripted_load_exactly(llama_split):
    url = llama_split.url
    async with httpx.AsyncClient(timeout=120) as client:
        hold_cost, wait_cost = HOLD["cost"], WAIT["cost"]
        hold_max = hold_cost - await prompt_tokens(client, url, HOLD["words"])
        wait_max = wait_cost - await prompt_tokens(client, url, WAIT["words"])
        assert hold_max > 400 and wait_max > 400
        tasks: list[asyncio.Task] = []
        try:
            async with running_gate(url, CLASSES, kv="split", backend_extra='models = ["tiny"]') as gate:
                admission = gate.backends.backends[0].admission
                assert admission.capacity.ceiling == POOL
                seen = []

                async def expect(waiting: int, running: int, reserved: int) -> None:
                    """Scrape until the gauges read exactly this (the gate moves a request from its
                    queue into a freed slot a few milliseconds after llama-server frees it)."""
                    want = (waiting, running, reserved / POOL)
                    last = None
                    deadline = time.monotonic() + 20
                    while (last := await gauges(client, gate.url)) != (want, want) and time.monotonic() < deadline:
                        await asyncio.sleep(0.02)
                    ended = sum(t.done() and not t.cancelled() for t in tasks)
                    assert last == (want, want), f"gauges (lean, full) {last}, expected {want}; {ended} requests ended on their own"
                    seen.append(want)

                await expect(0, 0, 0)

                # 1. four long requests take the four slots
                holders = [asyncio.create_task(hold(client, gate.url, HOLD, hold_max)) for _ in range(4)]
                tasks += holders
                await expect(0, 4, 4 * hold_cost)
                await wait_until(lambda: _busy(client, url, 4), timeout_s=20)  # llama-server agrees

                # 2. five more wait in the gate's queue (every slot is taken)
                waiters = [asyncio.create_task(hold(client, gate.url, WAIT, wait_max)) for _ in range(5)]
                tasks += waiters
                await expect(5, 4, 4 * hold_cost)

                # 3. one holder's client goes away: its slot goes to the first waiter
                holders[0].cancel()
                await expect(4, 4, 3 * hold_cost + wait_cost)

                # 4. two more go: two more waiters move in
                holders[1].cancel()
                holders[2].cancel()
                await expect(2, 4, hold_cost + 3 * wait_cost)

                # 5. everyone leaves
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                await expect(0, 0, 0)
                await released(gate)
                print(f"\nscripted load, (waiting, running, kv usage) at each step: {seen}")
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await wait_until(lambda: _busy(client, url, 0), timeout_s=30)


async def _busy(client: httpx.AsyncClient, llama_url: str, n: int) -> bool:
    return await busy_slots(client, llama_url) == n
