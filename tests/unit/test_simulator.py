"""gate.simulator: the pure scheduling model (a hand-driven clock) and its HTTP shapes.

The shapes are llama-server's (llama.cpp 0c1e570, notes/llama-server.md).  HTTP
tests run the app in-process through httpx.ASGITransport (which buffers whole
responses) at a high speed factor; the disconnect and CLI tests use a real
socket on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gate.backend.telemetry import parse_metrics, parse_slots
from gate.tools.simulator import (
    CONTEXT_EXCEEDED,
    Done,
    Failed,
    Simulator,
    SimulatorConfig,
    Token,
    apply_template,
    build_simulator_app,
    count_tokens,
    serve_simulator,
)

# --- the pure model, driven by hand ----------------------------------------------------


def run_until_idle(sim: Simulator, start: float = 0.0, limit: int = 100_000) -> list[tuple[float, object]]:
    """Advance step by step; returns (time, event) for every event."""
    out = []
    for _ in range(limit):
        at = sim.next_event_at()
        if at is None:
            return out
        now = max(start, at)
        out.extend((now, ev) for ev in sim.advance(now))
    raise AssertionError("the simulator never went idle")


def token_times(events, task: int) -> list[float]:
    return [t for t, ev in events if isinstance(ev, Token) and ev.task == task]


def test_one_slot_alone_generates_at_45_ms_per_token() -> None:
    sim = Simulator(SimulatorConfig())
    tid = sim.submit(10, 5, now=0.0, ignore_eos=True)
    events = run_until_idle(sim)
    times = token_times(events, tid)
    assert len(times) == 5
    # The first token comes at the end of the prefill step: 10 tokens at 1500 tok/s.
    assert times[0] == pytest.approx(10 / 1500)
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert gaps == pytest.approx([0.045] * 4)
    done = [ev for _, ev in events if isinstance(ev, Done)]
    assert done[0].stop_type == "limit" and done[0].n_decoded == 5 and not done[0].truncated


def test_per_token_latency_grows_with_busy_slots() -> None:
    def decode_gap(n_requests: int) -> float:
        sim = Simulator(SimulatorConfig(slots=4))
        ids = [sim.submit(8, 20, now=0.0, ignore_eos=True) for _ in range(n_requests)]
        events = run_until_idle(sim)
        times = token_times(events, ids[0])
        return times[5] - times[4]  # every slot is generating by then

    gaps = [decode_gap(n) for n in (1, 2, 3, 4)]
    assert gaps == pytest.approx([0.045, 0.090, 0.135, 0.180])


def test_speed_divides_every_duration() -> None:
    sim = Simulator(SimulatorConfig(speed=10))
    tid = sim.submit(10, 3, now=0.0, ignore_eos=True)
    times = token_times(run_until_idle(sim), tid)
    assert times[2] - times[1] == pytest.approx(0.0045)


def test_a_long_prompt_stalls_every_running_decode() -> None:
    sim = Simulator(SimulatorConfig(ctx=16384))
    first = sim.submit(8, 50, now=0.0, ignore_eos=True)
    sim.advance(0.5)  # first is decoding alone
    sim.submit(1500, 5, now=0.5, ignore_eos=True)
    events = run_until_idle(sim, start=0.5)
    gaps = [b - a for a, b in zip(token_times(events, first), token_times(events, first)[1:])]
    # One step carries the whole 1500-token prompt: ~1 s on top of the decode.
    assert max(gaps) == pytest.approx(1.0 + 0.045, rel=0.01)


def test_requests_beyond_the_slots_wait_in_fifo_order() -> None:
    sim = Simulator(SimulatorConfig(slots=2))
    ids = [sim.submit(8, 4, now=0.0, ignore_eos=True) for _ in range(5)]
    # Waiting requests take free slots when the next step starts (the first one's prefill ends).
    assert sim.busy_slots == 1 and sim.deferred == 3
    events = sim.advance(0.01)
    assert sim.busy_slots == 2 and sim.deferred == 3
    events = [(0.01, ev) for ev in events] + run_until_idle(sim)
    first_token = {ev.task: t for t, ev in events if isinstance(ev, Token) and ev.n_decoded == 1}
    assert sorted(first_token, key=first_token.get) == ids
    assert sim.deferred == 0 and sim.busy_slots == 0


def test_unified_pool_exhaustion_fails_every_active_request() -> None:
    sim = Simulator(SimulatorConfig(slots=3, ctx=600))
    ids = [sim.submit(150, 400, now=0.0, ignore_eos=True) for _ in range(3)]  # 3 x 550 > 600
    events = run_until_idle(sim)
    failed = [(t, ev) for t, ev in events if isinstance(ev, Failed)]
    assert sorted(ev.task for _, ev in failed) == ids
    assert len({t for t, _ in failed}) == 1  # all at once
    for _, ev in failed:
        assert ev.status == 500
        assert ev.error == {"code": 500, "message": CONTEXT_EXCEEDED, "type": "server_error"}
    # Up to that moment the pool held at most its size.
    tokens = [ev for _, ev in events if isinstance(ev, Token)]
    assert 600 - 3 < 3 * 150 + len(tokens) - 3 <= 600
    assert sim.busy_slots == 0 and sim.kv_used == 0


def test_unified_requests_that_fit_the_pool_together_succeed() -> None:
    sim = Simulator(SimulatorConfig(slots=3, ctx=600))
    for _ in range(3):
        sim.submit(100, 90, now=0.0, ignore_eos=True)  # 3 x 190 <= 600
    events = run_until_idle(sim)
    assert not [ev for _, ev in events if isinstance(ev, Failed)]
    assert len([ev for _, ev in events if isinstance(ev, Done)]) == 3


def test_split_refuses_a_prompt_longer_than_its_slot_once_a_slot_takes_it() -> None:
    sim = Simulator(SimulatorConfig(slots=2, ctx=1024, kv="split"))
    busy = [sim.submit(8, 10, now=0.0, ignore_eos=True) for _ in range(2)]
    big = sim.submit(600, 10, now=0.0)
    assert sim.deferred == 1  # it waits first, like upstream
    events = run_until_idle(sim)
    failed = [ev for _, ev in events if isinstance(ev, Failed)]
    assert [ev.task for ev in failed] == [big]
    assert failed[0].status == 400
    assert failed[0].error["type"] == "exceed_context_size_error"
    assert failed[0].error["n_prompt_tokens"] == 600 and failed[0].error["n_ctx"] == 512
    assert len([ev for _, ev in events if isinstance(ev, Done) and ev.task in busy]) == 2


def test_split_truncates_generation_at_the_slot_size() -> None:
    sim = Simulator(SimulatorConfig(slots=2, ctx=1024, kv="split"))
    tid = sim.submit(500, 100, now=0.0, ignore_eos=True)
    done = [ev for _, ev in run_until_idle(sim) if isinstance(ev, Done)]
    assert done[0].task == tid and done[0].truncated and done[0].stop_type == "limit"
    assert done[0].n_prompt + done[0].n_decoded == 512


def test_cancel_frees_the_slot_for_the_next_waiting_request() -> None:
    sim = Simulator(SimulatorConfig(slots=1))
    first = sim.submit(8, 1000, now=0.0, ignore_eos=True)
    second = sim.submit(8, 3, now=0.0, ignore_eos=True)
    sim.advance(0.2)
    assert sim.deferred == 1
    assert sim.cancel(first, now=0.2)
    assert sim.busy_slots == 0 and sim.deferred == 0  # the slot is free; the step under way ends
    events = run_until_idle(sim, start=0.2)
    assert {ev.task for _, ev in events if isinstance(ev, Token)} == {second}
    assert events[0][0] < 0.2 + 0.045 + 0.01  # it took the slot at the next step
    assert not sim.cancel(first, now=1.0)


def test_random_eos_is_seeded_and_ignore_eos_runs_to_max() -> None:
    def lengths(seed: int, ignore_eos: bool) -> list[int]:
        sim = Simulator(SimulatorConfig(seed=seed, eos_probability=0.05, slots=8))
        for _ in range(8):
            sim.submit(8, 200, now=0.0, ignore_eos=ignore_eos)
        return [ev.n_decoded for _, ev in run_until_idle(sim) if isinstance(ev, Done)]

    assert lengths(1, False) == lengths(1, False)
    assert lengths(1, False) != lengths(2, False)
    assert min(lengths(1, False)) < 200
    assert lengths(1, True) == [200] * 8


def test_generated_text_is_deterministic_per_seed() -> None:
    def text(seed: int) -> str:
        sim = Simulator(SimulatorConfig(seed=seed))
        sim.submit(8, 30, now=0.0, ignore_eos=True)
        return "".join(ev.text for _, ev in run_until_idle(sim) if isinstance(ev, Token))

    assert text(7) == text(7) != text(8)
    assert len(text(7).split()) == 30


def test_metrics_counters_follow_the_work() -> None:
    sim = Simulator(SimulatorConfig(slots=2))
    for _ in range(3):
        sim.submit(40, 10, now=0.0, ignore_eos=True)
    run_until_idle(sim)
    m = parse_metrics(sim.metrics_text())
    assert m["prompt_tokens_total"] == 120
    assert m["tokens_predicted_total"] == 30
    assert m["tokens_predicted_seconds_total"] > 0 and m["prompt_seconds_total"] > 0
    assert m["requests_processing"] == 0 and m["requests_deferred"] == 0
    assert 1.0 <= m["n_busy_slots_per_decode"] <= 2.0


# --- HTTP, in-process ------------------------------------------------------------------

FAST = dict(speed=50.0)


@pytest.fixture
async def sim_client():
    clients = []

    async def make(**cfg) -> httpx.AsyncClient:
        app = build_simulator_app(SimulatorConfig(**{**FAST, **cfg}))
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://sim")
        clients.append((client, app))
        return client

    yield make
    for client, app in clients:
        await client.aclose()
        await app.state.simulator.aclose()


def sse_events(text: str) -> list[str]:
    """The `data:` payloads of an SSE body, in order."""
    return [block[len("data: ") :] for block in text.split("\n\n") if block.startswith("data: ")]


CHAT = {"messages": [{"role": "user", "content": "Why is the sky blue?"}], "max_tokens": 6, "ignore_eos": True}


async def test_health_props_and_idle_slots(sim_client) -> None:
    client = await sim_client(slots=3, ctx=3072, kv="split")
    assert (await client.get("/health")).json() == {"status": "ok"}
    props = (await client.get("/props")).json()
    assert props["total_slots"] == 3
    assert props["default_generation_settings"]["n_ctx"] == 1024
    assert props["model_path"] == "simulated" and props["build_info"]
    slots = (await client.get("/slots")).json()
    assert [s["id"] for s in slots] == [0, 1, 2]
    assert all(s["n_ctx"] == 1024 and s["is_processing"] is False for s in slots)
    assert parse_slots(slots)[0].n_ctx == 1024


async def test_unified_slots_each_report_the_whole_pool(sim_client) -> None:
    client = await sim_client(slots=4, ctx=8192)
    assert (await client.get("/props")).json()["default_generation_settings"]["n_ctx"] == 8192
    assert {s["n_ctx"] for s in (await client.get("/slots")).json()} == {8192}


async def test_metrics_parse_with_prometheus_client_and_use_llamacpp_names(sim_client) -> None:
    client = await sim_client()
    await client.post("/v1/chat/completions", json=CHAT)
    resp = await client.get("/metrics")
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(resp.text)}
    for gauge in ("requests_processing", "requests_deferred", "n_busy_slots_per_decode", "predicted_tokens_seconds"):
        assert families[f"llamacpp:{gauge}"].type == "gauge"
    for counter in ("prompt_tokens", "prompt_seconds", "tokens_predicted", "tokens_predicted_seconds", "n_decode"):
        family = families[f"llamacpp:{counter}"]
        assert family.type == "counter"
        assert family.samples[0].name == f"llamacpp:{counter}_total"
    values = parse_metrics(resp.text)
    assert values["tokens_predicted_total"] == 6
    assert values["prompt_tokens_total"] == count_tokens(apply_template(CHAT["messages"]), add_special=True)
    assert "kv_cache_usage_ratio" not in values  # not in this llama-server either


async def test_tokenize_template_and_input_tokens_agree(sim_client) -> None:
    client = await sim_client()
    text = "héllo wörld, tokens"
    plain = (await client.post("/tokenize", json={"content": text})).json()["tokens"]
    special = (await client.post("/tokenize", json={"content": text, "add_special": True})).json()["tokens"]
    assert len(plain) == math.ceil(len(text.encode()) / 4) and special == [1, *plain]
    assert plain == (await client.post("/tokenize", json={"content": text})).json()["tokens"]
    pieces = (await client.post("/tokenize", json={"content": "abcdefgh", "with_pieces": True})).json()["tokens"]
    assert [p["piece"] for p in pieces] == ["abcd", "efgh"]
    body = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]}
    prompt = (await client.post("/apply-template", json=body)).json()["prompt"]
    assert prompt.startswith("<|im_start|>system\nBe brief.<|im_end|>") and prompt.endswith("<|im_start|>assistant\n")
    n = (await client.post("/v1/chat/completions/input_tokens", json=body)).json()["input_tokens"]
    as_gate_counts = {"content": prompt, "add_special": True, "parse_special": True}
    n_tok = len((await client.post("/tokenize", json=as_gate_counts)).json()["tokens"])
    assert n == n_tok
    done = (await client.post("/v1/chat/completions", json={**body, "max_tokens": 2})).json()
    assert done["usage"]["prompt_tokens"] == n


async def test_streaming_chat_ends_with_done_and_carries_usage_and_timings(sim_client) -> None:
    client = await sim_client()
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    resp = await client.post("/v1/chat/completions", json=body)
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
    events = sse_events(resp.text)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    content = [c["choices"][0]["delta"]["content"] for c in chunks[1:7]]
    assert len(content) == 6 and all(content)
    assert chunks[-2]["choices"][0]["finish_reason"] == "length" and chunks[-2]["choices"][0]["delta"] == {}
    last = chunks[-1]
    assert last["choices"] == []
    usage = last["usage"]
    assert usage["completion_tokens"] == 6 and usage["total_tokens"] == usage["prompt_tokens"] + 6
    timings = last["timings"]
    assert timings["predicted_n"] == 6 and timings["prompt_n"] == last["usage"]["prompt_tokens"]
    for key in ("prompt_ms", "predicted_ms", "predicted_per_second"):
        assert timings[key] > 0


async def test_streaming_chat_without_include_usage_has_timings_on_the_finish_chunk(sim_client) -> None:
    client = await sim_client()
    events = sse_events((await client.post("/v1/chat/completions", json={**CHAT, "stream": True})).text)
    assert events[-1] == "[DONE]"
    last = json.loads(events[-2])
    assert "usage" not in last and last["choices"][0]["finish_reason"] == "length" and "timings" in last


async def test_native_completion_stream_ends_with_stop_true_and_no_done(sim_client) -> None:
    client = await sim_client()
    body = {"prompt": "Once upon a time", "n_predict": 4, "stream": True, "ignore_eos": True}
    resp = await client.post("/completion", json=body)
    events = sse_events(resp.text)
    assert "[DONE]" not in events
    chunks = [json.loads(e) for e in events]
    assert [c["stop"] for c in chunks] == [False] * 4 + [True]
    assert all(c["content"] for c in chunks[:4])
    final = chunks[-1]
    assert final["tokens_predicted"] == 4 and final["stop_type"] == "limit" and final["truncated"] is False
    assert final["tokens_evaluated"] == count_tokens("Once upon a time", add_special=True)
    assert final["timings"]["predicted_n"] == 4


async def test_non_streaming_shapes(sim_client) -> None:
    client = await sim_client()
    chat = (await client.post("/v1/chat/completions", json=CHAT)).json()
    assert chat["object"] == "chat.completion" and chat["id"].startswith("chatcmpl-")
    assert chat["choices"][0]["message"]["role"] == "assistant"
    assert len(chat["choices"][0]["message"]["content"].split()) == 6
    assert chat["usage"]["completion_tokens"] == 6 and chat["timings"]["predicted_n"] == 6
    cmpl = (await client.post("/v1/completions", json={"prompt": "abc", "max_tokens": 3, "ignore_eos": True})).json()
    assert cmpl["object"] == "text_completion" and cmpl["choices"][0]["finish_reason"] == "length"
    assert cmpl["usage"] == {
        "completion_tokens": 3,
        "prompt_tokens": 2,
        "total_tokens": 5,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    native = (await client.post("/completion", json={"prompt": "abc", "n_predict": 3, "ignore_eos": True})).json()
    assert native["stop"] is True and native["tokens_predicted"] == 3 and len(native["tokens"]) == 3
    body = {"prompt": "abc", "max_tokens": 2, "stream": True}
    stream_cmpl = sse_events((await client.post("/v1/completions", json=body)).text)
    assert stream_cmpl[-1] == "[DONE]" and "usage" in json.loads(stream_cmpl[-2])


async def test_malformed_requests_get_llama_server_errors(sim_client) -> None:
    client = await sim_client()
    resp = await client.post("/v1/chat/completions", content=b"{not json")
    assert resp.status_code == 400 and resp.json()["error"]["type"] == "invalid_request_error"
    resp = await client.post("/v1/chat/completions", json={"max_tokens": 3})
    assert resp.status_code == 400 and resp.json()["error"]["code"] == 400
    resp = await client.post("/completion", json={"prompt": "x", "n_predict": "many"})
    assert resp.status_code == 400


async def test_more_requests_than_slots_are_deferred_while_they_wait(sim_client) -> None:
    client = await sim_client(slots=2, speed=20.0)
    body = {**CHAT, "max_tokens": 20}
    tasks = [asyncio.create_task(client.post("/v1/chat/completions", json=body)) for _ in range(5)]
    deferred_seen = 0
    for _ in range(200):
        values = parse_metrics((await client.get("/metrics")).text)
        deferred_seen = max(deferred_seen, values["requests_deferred"])
        if deferred_seen and values["requests_processing"] == 2:
            slots = (await client.get("/slots")).json()
            assert all(s["is_processing"] for s in slots)
            assert (await client.get("/slots", params={"fail_on_no_slot": 1})).status_code == 503
            break
        await asyncio.sleep(0.005)
    assert deferred_seen == 3
    assert [r.status_code for r in await asyncio.gather(*tasks)] == [200] * 5
    values = parse_metrics((await client.get("/metrics")).text)
    assert values["requests_deferred"] == 0 and values["requests_processing"] == 0


async def test_unified_exhaustion_fails_every_active_request_with_500(sim_client) -> None:
    client = await sim_client(slots=3, ctx=1024, speed=100.0)
    small = {"messages": [{"role": "user", "content": "Tell me a story."}], "max_tokens": 900, "ignore_eos": True}
    streamed = asyncio.create_task(client.post("/v1/chat/completions", json={**small, "stream": True}))
    plain = asyncio.create_task(client.post("/v1/chat/completions", json=small))
    for _ in range(500):  # until both generate
        slots = parse_slots((await client.get("/slots")).json())
        if sum(1 for s in slots if s.processing and s.n_decoded) == 2:
            break
        await asyncio.sleep(0.002)
    else:
        raise AssertionError("the two requests never started generating")
    # 1000 prompt tokens fit the pool alone, not with what the other two hold.
    late = await client.post("/completion", json={"prompt": "abcd" * 999, "n_predict": 10, "stream": True})
    error = {"error": {"code": 500, "message": "Context size has been exceeded.", "type": "server_error"}}
    # Before its first token a streaming request gets a plain HTTP error ...
    assert late.status_code == 500 and late.json() == error
    plain_resp = await plain
    assert plain_resp.status_code == 500 and plain_resp.json() == error
    # ... after it, an SSE error event ends the stream (no [DONE]).
    stream_resp = await streamed
    assert stream_resp.status_code == 200
    events = sse_events(stream_resp.text)
    assert json.loads(events[-1]) == error and "[DONE]" not in events
    assert len(events) > 2
    slots = (await client.get("/slots")).json()
    assert not any(s["is_processing"] for s in slots)


async def test_split_oversize_prompt_is_a_400_exceed_context_size_error(sim_client) -> None:
    client = await sim_client(slots=4, ctx=2048, kv="split")
    for stream in (False, True):
        resp = await client.post("/completion", json={"prompt": "abcd" * 600, "n_predict": 4, "stream": stream})
        assert resp.status_code == 400
        error = resp.json()["error"]
        assert error["type"] == "exceed_context_size_error" and error["code"] == 400
        assert error["n_prompt_tokens"] == 601 and error["n_ctx"] == 512


async def test_timings_show_slower_tokens_with_more_busy_slots(sim_client) -> None:
    client = await sim_client(slots=4, speed=20.0)
    body = {"prompt": "a b c", "n_predict": 12, "ignore_eos": True}
    alone = (await client.post("/completion", json=body)).json()["timings"]["predicted_per_token_ms"]
    together = await asyncio.gather(*(client.post("/completion", json=body) for _ in range(4)))
    busy = [r.json()["timings"]["predicted_per_token_ms"] for r in together]
    assert min(busy) > 2.5 * alone


# --- over a real socket ----------------------------------------------------------------


async def test_streaming_client_disconnect_frees_its_slot() -> None:
    handle = await serve_simulator(SimulatorConfig(slots=1, speed=10.0), "127.0.0.1", 0)
    try:
        assert handle.url.startswith("http://127.0.0.1:")
        async with httpx.AsyncClient(base_url=handle.url, timeout=5.0) as client:
            body = {"prompt": "hello", "n_predict": 100000, "ignore_eos": True, "stream": True}
            async with client.stream("POST", "/completion", json=body) as resp:
                assert resp.status_code == 200
                async for line in resp.aiter_lines():
                    if line.startswith("data: "):
                        break
                slots = (await client.get("/slots")).json()
                assert slots[0]["is_processing"] is True
            deadline = time.monotonic() + 2.0
            while (await client.get("/slots")).json()[0]["is_processing"]:
                assert time.monotonic() < deadline, "the slot was not freed after the client left"
                await asyncio.sleep(0.01)
            # The next request gets the slot.
            done = (await client.post("/completion", json={"prompt": "x", "n_predict": 2})).json()
            assert done["stop"] is True
            assert parse_metrics((await client.get("/metrics")).text)["requests_processing"] == 0
    finally:
        await handle.stop()


async def test_non_streaming_disconnect_is_noticed_only_after_a_quiet_second() -> None:
    # llama-server checks a non-streaming client only when a 1 s wait for results times out.
    handle = await serve_simulator(SimulatorConfig(slots=1, speed=10.0), "127.0.0.1", 0)
    try:
        async with httpx.AsyncClient(base_url=handle.url, timeout=5.0) as client:
            body = {"prompt": "hello", "n_predict": 100000, "ignore_eos": True}
            with pytest.raises(httpx.ReadTimeout):
                await client.post("/completion", json=body, timeout=httpx.Timeout(5.0, read=0.2))
            left = time.monotonic()
            while (await client.get("/slots")).json()[0]["is_processing"]:
                assert time.monotonic() - left < 3.0, "the abandoned request was never cancelled"
                await asyncio.sleep(0.02)
            assert time.monotonic() - left >= 0.7  # it kept running for a while, as upstream does
    finally:
        await handle.stop()


def test_cli_simulate_serves_until_sigterm() -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gate.cli",
            "simulate",
            "--port",
            "0",
            "--slots",
            "2",
            "--split",
            "--ctx",
            "4096",
            "--decode-tps",
            "100",
            "--speed",
            "5",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    )
    try:
        first = proc.stdout.readline()
        assert "listening on http://127.0.0.1:" in first, first + proc.stderr.read()
        settings = proc.stdout.readline()
        assert "slots 2" in settings and "split KV, 2048 per slot" in settings and "100.0 tok/s alone" in settings
        url = first.split("listening on ", 1)[1].strip()
        props = httpx.get(url + "/props", timeout=5).json()
        assert props["total_slots"] == 2 and props["default_generation_settings"]["n_ctx"] == 2048
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=10)
        assert proc.returncode == 0, err
        assert "simulator stopped" in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_cli_simulate_rejects_bad_values(capsys: pytest.CaptureFixture[str]) -> None:
    from gate.cli import main

    assert main(["simulate", "--slots", "0"]) == 2
    assert main(["simulate", "--unified", "--split"]) == 2
    assert main(["simulate", "--decode-tps", "-3"]) == 2
