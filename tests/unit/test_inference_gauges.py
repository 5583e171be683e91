"""The inference-gateway gauges (queued, running, KV-cache usage per backend and model) and
the ops-kit gauges (SLO, shared-limit fallback) on a REAL GateService: its gatekeeper holds
and queues requests, `/metrics`' refresh reads them back (the fake transport only stands in
for llama-server's /health and /props)."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gate.config import parse_config
from gate.core.ledger import Request
from gate.observe.metrics import GateMetrics
from gate.service import GateService
from tests.fakes import GATE_CONFIG, SMALL_POOL_CONFIG, fake_llama_transport, gate_on_fake_llama

CONFIG = GATE_CONFIG.replace('kv = "split"', 'kv = "split"\nname = "gpu0"\nmodels = ["qwen", "qwen-alias"]')
GAUGES = ("tokengate_num_requests_waiting", "tokengate_num_requests_running", "tokengate_kv_cache_usage_ratio")


def scrape(gate: GateService) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    gate.refresh_metrics()  # what GET /metrics does before rendering
    body, _ = gate.metrics.render()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value for fam in text_string_to_metric_families(body.decode()) for s in fam.samples
    }


def inference(gate: GateService, backend: str = "gpu0", model: str = "qwen") -> tuple[float, float, float]:
    values = scrape(gate)
    labels = (("backend", backend), ("model", model))
    return tuple(values[(name, labels)] for name in GAUGES)  # type: ignore[return-value]


@pytest.fixture
async def gate():
    async with gate_on_fake_llama(CONFIG) as g:
        yield g


async def test_gauges_track_held_and_queued_requests_exactly(gate):
    (backend,) = gate.backends
    gk = backend.gatekeeper
    assert backend.capacity.ceiling == 4 * 2048  # split: 4 slots x 2048
    assert inference(gate) == (0, 0, 0)

    holders = [await gk.acquire(Request(f"h{i}", "batch", "t", 300 + i, 200, 0.0)) for i in range(4)]
    reserved = sum(300 + i + 200 for i in range(4))
    assert inference(gate) == (0, 4, reserved / 8192)

    waiters = [asyncio.create_task(gk.acquire(Request(f"w{i}", "interactive", "t", 10, 10, 0.0))) for i in range(3)]
    await asyncio.sleep(0)
    assert inference(gate) == (3, 4, reserved / 8192)

    gk.release(holders[0])  # one slot frees: the first waiter is dispatched into it
    first = await waiters[0]
    assert inference(gate) == (2, 4, (reserved - 500 + 20) / 8192)

    for w in waiters[1:]:
        w.cancel()
    await asyncio.gather(*waiters[1:], return_exceptions=True)
    for t in [*holders[1:], first]:
        gk.release(t)
    assert inference(gate) == (0, 0, 0)
    assert backend.admission.ledger.in_flight == 0


async def test_a_backend_that_is_not_ready_reads_as_full(gate):
    (backend,) = gate.backends
    backend.state = "down"
    assert inference(gate) == (0, 0, 1.0)


async def test_only_the_first_configured_model_labels_the_series(gate):
    values = scrape(gate)
    models = {dict(labels).get("model") for (name, labels) in values if name in GAUGES}
    assert models == {"qwen"}


async def test_a_backend_without_models_has_an_empty_model_label():
    async with gate_on_fake_llama(GATE_CONFIG) as g:
        assert inference(g, backend="default", model="") == (0, 0, 0)


async def test_slo_gauge_follows_the_config_and_the_fallback_gauge_starts_at_zero(gate):
    values = scrape(gate)
    assert values[("tokengate_slo_ttft_seconds", ())] == 2.0  # [budget] slo_ttft_p95_ms default 2000
    assert values[("tokengate_shared_limit_fallback", ())] == 0
    gate.metrics.set_shared(fallback=True, gates=2)
    assert scrape(gate)[("tokengate_shared_limit_fallback", ())] == 1


async def test_each_class_s_ttft_objective_is_a_gauge_its_own_else_the_slo():
    """The objective a class is refused by and judged against ("met"): tokengate_slo_ttft_seconds
    named only [budget] slo_ttft_p95_ms, so an alert on a class with its own objective had to
    copy it from the config by hand."""
    config = GATE_CONFIG.replace("reserved_tokens = 512", "reserved_tokens = 512\nttft_objective_ms = 500")
    async with gate_on_fake_llama(config) as g:
        values = scrape(g)
    assert values[("tokengate_ttft_objective_seconds", (("class", "interactive"),))] == 0.5
    assert values[("tokengate_ttft_objective_seconds", (("class", "batch"),))] == 2.0  # the SLO's
    assert values[("tokengate_slo_ttft_seconds", ())] == 2.0


async def test_each_class_s_reservation_in_force_is_a_gauge_scaled_on_a_small_pool():
    """R0 scaled interactive's 512 to 400 on a pool of 800, said only in a warning's words."""
    async with gate_on_fake_llama(GATE_CONFIG) as g:
        values = scrape(g)
    assert values[("tokengate_class_reserved_tokens", (("class", "interactive"),))] == 512  # kept whole
    assert values[("tokengate_class_reserved_tokens", (("class", "batch"),))] == 0
    async with gate_on_fake_llama(SMALL_POOL_CONFIG) as g:
        values = scrape(g)
    assert values[("tokengate_class_reserved_tokens", (("class", "interactive"),))] == 400  # half the ceiling


def test_kv_usage_is_clamped_to_zero_one():
    m = GateMetrics()
    m.set_inference("b", "", waiting=0, running=0, kv_usage=1.7)
    body, _ = m.render()
    assert 'tokengate_kv_cache_usage_ratio{backend="b",model=""} 1.0' in body.decode()


async def test_metrics_inference_serves_the_three_gauges_alone_and_stays_open_with_tenants():
    """What an endpoint picker scrapes many times a second: three families, no tenant key."""
    import httpx

    config = CONFIG + '[[tenants]]\nname = "t"\napi_key_sha256 = "' + "a" * 64 + '"\n'
    g = GateService(parse_config(config), environ={}, transport=fake_llama_transport())
    try:
        await g.backends.probe_all()
        gk = g.backends.backends[0].gatekeeper
        held = await gk.acquire(Request("h", "batch", "t", 100, 400, 0.0))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=g.app), base_url="http://gate") as c:
            lean = await c.get("/metrics/inference")
            full = await c.get("/metrics")
            models = await c.get("/v1/models")
        assert lean.status_code == full.status_code == 200 and models.status_code == 401
        families = {f.name: f for f in text_string_to_metric_families(lean.text)}
        assert set(families) == set(GAUGES)
        lean_samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples}
        assert lean_samples == {k: v for k, v in scrape(g).items() if k[0] in GAUGES}
        assert lean_samples[("tokengate_kv_cache_usage_ratio", (("backend", "gpu0"), ("model", "qwen")))] == 500 / 8192
        assert len(lean.content) < len(full.content) / 10
        gk.release(held)
    finally:
        for b in g.backends:
            b.gatekeeper.close()
        await g.client.aclose()
