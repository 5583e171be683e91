"""The loop-lag gauge of a real gate: blocking the gate's event loop shows in /metrics.

The gate runs on this test's event loop (`running_gate`), so a `time.sleep` here blocks the
gate as a long synchronous step of its own would. /metrics is scraped over a real socket.
"""

from __future__ import annotations

import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.gate_harness import running_gate

NOTHING_LISTENS = "http://127.0.0.1:9"  # the gate runs without a ready backend; /metrics needs none


async def loop_lag(client: httpx.AsyncClient, url: str) -> dict[str, float]:
    body = (await client.get(url + "/metrics")).text
    family = next(f for f in text_string_to_metric_families(body) if f.name == "tokengate_event_loop_lag_seconds")
    assert family.type == "summary"
    return {s.labels.get("quantile", s.name.rsplit("_", 1)[-1]): s.value for s in family.samples}


async def test_blocking_the_gates_event_loop_raises_the_loop_lag_gauge():
    async with running_gate(NOTHING_LISTENS) as gate, httpx.AsyncClient(timeout=30) as client:
        before = await loop_lag(client, gate.url)
        assert set(before) == {"0.5", "0.99", "1", "count", "sum"}
        # Longer than anything seen so far, so the rise can only come from this block. The probe
        # was asleep when the block began, due at most one interval later: it wakes at least
        # block - interval late.
        block = max(0.6, before["1"] + 0.3)
        time.sleep(block)  # noqa: ASYNC251 - the point: the gate's loop does nothing meanwhile
        # The probe's overdue wake-up runs before this scrape's request is even read; scrape
        # again (bounded) in case a loop ran them in the other order.
        for _ in range(20):
            after = await loop_lag(client, gate.url)
            if after["1"] >= block - gate.loop_lag.window.interval_s:
                break
        assert after["1"] >= block - gate.loop_lag.window.interval_s
        # The stall is ~all of the last moments the window holds: p99 reads it, not the healthy lag.
        assert after["0.99"] >= block / 2
        assert after["count"] > before["count"] and after["sum"] >= before["sum"] + block / 2
        # Beside it, the kernel's word on whether the gate had the CPU meanwhile (it had: it slept).
        body = (await client.get(gate.url + "/metrics")).text
        cpu = next(f for f in text_string_to_metric_families(body) if f.name == "tokengate_cpu_seconds")
        assert {s.labels["state"] for s in cpu.samples} == {"running", "waiting"}
        assert all(s.value >= 0 for s in cpu.samples) and cpu.type == "counter"


async def test_a_full_garbage_collection_in_the_gate_shows_as_its_own_pause():
    """The collector stops the gate's loop as a block does; /metrics says it was the collector."""
    import gc

    async with running_gate(NOTHING_LISTENS) as gate, httpx.AsyncClient(timeout=30) as client:

        def pauses(body: str) -> dict[tuple[str, str], float]:
            family = next(f for f in text_string_to_metric_families(body) if f.name == "tokengate_gc_pause_seconds")
            assert family.type == "summary"
            return {(s.labels["generation"], s.labels.get("quantile", s.name.rsplit("_", 1)[-1])): s.value for s in family.samples}

        before = pauses((await client.get(gate.url + "/metrics")).text)
        assert {g for g, _ in before} == {"0", "1", "2"}
        garbage = [[i] for i in range(200_000)]  # tracked objects a full collection walks
        started = time.perf_counter()
        gc.collect(2)
        took = time.perf_counter() - started
        del garbage
        after = pauses((await client.get(gate.url + "/metrics")).text)
        assert after[("2", "count")] >= before[("2", "count")] + 1
        assert after[("2", "sum")] - before[("2", "sum")] >= took / 2
        assert took / 2 <= after[("2", "1")]
