"""TelemetryPoller against the real llama-server (``llama_split``: 4 slots x 512 tokens).

Checks the shapes the unit tests assume: slots parsed, exactly one busy slot
and ``requests_processing == 1`` while one streaming request runs, the busy
slot's ``n_prompt_tokens`` = prompt + tokens generated so far (give or take
the one just sampled), and a per-slot
decode rate from the counter deltas once the request has finished.  Every test
leaves the shared server idle.
"""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from gate.backend.kvsize import kv_bytes_per_token
from gate.backend.telemetry import TelemetryPoller

pytestmark = pytest.mark.llama

N_PREDICT = 96  # long enough that the request is still running when polled


@pytest.fixture
async def client():
    async with httpx.AsyncClient(timeout=60) as c:
        yield c


def poller_for(client, llama) -> TelemetryPoller:
    # Generous timeout: on 2 busy cores /slots waits for the current batch.
    return TelemetryPoller(client, [("llama", llama.url, None)], timeout_s=10)


async def wait_idle(llama, timeout_s: float = 30) -> None:
    # Its own client: llama-server closes keep-alive connections idle for 5 s, and
    # a request sent on one just as it closes fails with RemoteProtocolError.
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(base_url=llama.url, timeout=10) as c:
        while True:
            slots = (await c.get("/slots")).json()
            if not any(s["is_processing"] for s in slots):
                return
            assert time.monotonic() < deadline, f"server still busy: {slots}"
            await asyncio.sleep(0.05)  # polling a server that offers no "idle" signal


async def test_slots_of_the_split_server_are_parsed(client, llama_split):
    await wait_idle(llama_split)
    t = (await poller_for(client, llama_split).poll_once())["llama"]
    assert t.error is None and t.stale is False
    assert [s.id for s in t.slots] == [0, 1, 2, 3]
    assert {s.n_ctx for s in t.slots} == {512}
    assert t.busy_slots == 0
    assert t.requests_processing == 0 and t.requests_deferred == 0


async def test_one_streaming_request_shows_one_busy_slot_then_a_decode_rate(client, llama_split):
    await wait_idle(llama_split)
    poller = poller_for(client, llama_split)
    await poller.poll_once()  # baseline for the counters
    body = {
        "messages": [{"role": "user", "content": "Tell me a story about the lazy dog and the llama server."}],
        "max_tokens": N_PREDICT,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    usage = None
    async with client.stream("POST", llama_split.url + "/v1/chat/completions", json=body) as resp:
        assert resp.status_code == 200
        lines = resp.aiter_lines()
        async for line in lines:  # wait for the first token: the slot is busy now
            if line.startswith("data: ") and '"content"' in line:
                break
        during = (await poller.poll_once())["llama"]
        async for line in lines:
            if line.startswith("data: {"):
                usage = json.loads(line[6:]).get("usage") or usage
    assert during.error is None
    busy = [s for s in during.slots if s.processing]
    assert len(busy) == 1
    assert during.busy_slots == 1
    assert during.requests_processing == 1
    assert during.requests_deferred == 0
    # This build counts generated tokens in n_prompt_tokens (the slot's cache); the
    # token sampled last enters the cache with the next batch, so it may lag by one.
    (slot,) = busy
    assert usage is not None and usage["completion_tokens"] == N_PREDICT
    assert slot.n_decoded >= 1
    assert usage["prompt_tokens"] + slot.n_decoded - 1 <= slot.n_prompt_tokens <= usage["prompt_tokens"] + slot.n_decoded
    assert slot.context_used == slot.n_prompt_tokens <= slot.n_ctx

    await wait_idle(llama_split)
    after = (await poller.poll_once())["llama"]
    assert after.busy_slots == 0 and after.requests_processing == 0
    assert after.decode_tps is not None and after.decode_tps > 0
    assert after.prompt_tps is not None and after.prompt_tps > 0


async def test_kv_bytes_per_token_of_the_served_model(client, llama_split):
    """The model path from /props is local here: its header gives the KV size per token."""
    props = (await client.get(llama_split.url + "/props")).json()
    per_token = kv_bytes_per_token(props["model_path"])
    assert per_token == 8 * (64 * 10 * 2 * 2)  # 8 layers x (K + V) x 10 heads x 64 dims x f16
