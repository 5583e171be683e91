"""gate.traffic: the deterministic schedule, and the generator against the simulator."""

from __future__ import annotations

import asyncio
import itertools
import json
import warnings

import httpx
import pytest

from gate.tools.simulator import SimulatorConfig, build_simulator_app
from gate.tools.traffic import DEFAULT_TENANTS, PlannedRequest, TrafficGenerator, build_request, traffic_schedule


def take(it, n: int) -> list[PlannedRequest]:
    return list(itertools.islice(it, n))


def until(it, t: float) -> list[PlannedRequest]:
    return list(itertools.takewhile(lambda r: r.at < t, it))


# --- the schedule ----------------------------------------------------------------------


def test_same_seed_same_sequence_different_seed_different() -> None:
    a = take(traffic_schedule(7), 300)
    assert a == take(traffic_schedule(7), 300)
    b = take(traffic_schedule(8), 300)
    assert [(r.at, r.kind, r.prompt_words) for r in a] != [(r.at, r.kind, r.prompt_words) for r in b]


def test_arrivals_are_in_time_order_and_indexed() -> None:
    reqs = take(traffic_schedule(1), 2000)
    assert [r.index for r in reqs] == list(range(2000))
    assert all(x.at <= y.at for x, y in zip(reqs, reqs[1:]))


def test_rates_sizes_and_tenants_match_the_brief() -> None:
    reqs = until(traffic_schedule(3), 600.0)
    steady = [r for r in reqs if not r.burst]
    interactive = [r for r in steady if r.kind == "interactive"]
    batch = [r for r in steady if r.kind == "batch"]
    assert len(interactive) == pytest.approx(2.0 * 600, rel=0.1)
    assert len(batch) == pytest.approx(0.5 * 600, rel=0.2)
    for r in interactive:
        assert 8 <= r.prompt_words <= 60 and 64 <= r.max_tokens <= 128
    for r in [r for r in reqs if r.kind == "batch"]:
        assert 500 <= r.prompt_words <= 2000 and 256 <= r.max_tokens <= 512
    assert {r.tenant for r in reqs} == set(DEFAULT_TENANTS)
    by_tenant = {t: sum(1 for r in reqs if r.tenant == t) for t in DEFAULT_TENANTS}
    assert by_tenant["acme"] > 2 * by_tenant["hooli"]  # the noisy neighbour


def test_a_burst_every_minute() -> None:
    reqs = until(traffic_schedule(5, burst_every_s=60.0, burst_size=20), 300.0)
    bursts = [r for r in reqs if r.burst]
    assert len(bursts) == 4 * 20  # at 60, 120, 180, 240 s
    for k in range(1, 5):
        assert sum(1 for r in bursts if k * 60 <= r.at < k * 60 + 2) == 20
    assert {r.kind for r in bursts} == {"interactive", "batch"}


def test_rates_can_be_turned_off() -> None:
    reqs = until(traffic_schedule(0, rate_batch=0.0, burst_size=0), 100.0)
    assert reqs and {r.kind for r in reqs} == {"interactive"}


def test_build_request_bodies() -> None:
    inter, batch = None, None
    for r in traffic_schedule(2):
        if r.kind == "interactive" and inter is None:
            inter = r
        if r.kind == "batch" and batch is None:
            batch = r
        if inter and batch:
            break
    path, headers, body = build_request(inter, seed=2)
    assert path == "/v1/chat/completions" and headers == {"X-Tokengate-Class": "interactive"}
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["user"] == inter.tenant and body["max_tokens"] == inter.max_tokens
    assert "model" not in body
    path, headers, body = build_request(batch, seed=2, model="m")
    assert headers == {"X-Tokengate-Class": "batch"} and body["stream"] is False and body["model"] == "m"
    text = body["messages"][-1]["content"]
    assert text.startswith("Summarise") and len(text.split()) >= batch.prompt_words
    assert build_request(batch, seed=2, model="m") == (path, headers, body)  # deterministic text


# --- the generator -----------------------------------------------------------------------


@pytest.fixture
async def simulated():
    apps = []

    def make(**cfg) -> httpx.AsyncClient:
        app = build_simulator_app(SimulatorConfig(**cfg))
        apps.append(app)
        return httpx.AsyncClient(transport=httpx.ASGITransport(app=app))

    yield make
    for app in apps:
        await app.state.simulator.aclose()


async def test_generator_sends_and_counts_then_stops_cleanly(simulated) -> None:
    client = simulated(slots=8, ctx=65536, speed=200.0)
    gen = TrafficGenerator("http://sim", seed=1, rate_interactive=40.0, rate_batch=10.0, burst_every_s=0.3, burst_size=5, client=client)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        await gen.start()
        for _ in range(300):
            await asyncio.sleep(0.01)
            if gen.counts["200"] >= 10:
                break
        await gen.stop()
    assert gen.counts["200"] >= 10
    assert gen.sent >= gen.counts["200"]
    assert gen.in_flight == 0 and not gen.running
    assert set(gen.status_counts()) <= {"200", "200+error", "500", "400", "skipped", "transport_error"}
    await client.aclose()


async def test_stop_cancels_requests_in_flight(simulated) -> None:
    client = simulated(slots=1, speed=1.0)  # slow: requests stay in flight
    gen = TrafficGenerator("http://sim", seed=2, rate_interactive=50.0, rate_batch=0.0, burst_size=0, client=client)
    await gen.start()
    for _ in range(200):
        await asyncio.sleep(0.01)
        if gen.in_flight >= 3:
            break
    assert gen.in_flight >= 3
    await asyncio.wait_for(gen.stop(), 2.0)
    assert gen.in_flight == 0 and not gen.running
    await client.aclose()


async def test_in_flight_is_bounded_and_extra_arrivals_are_skipped(simulated) -> None:
    client = simulated(slots=1, speed=1.0)
    gen = TrafficGenerator("http://sim", seed=3, rate_interactive=200.0, rate_batch=0.0, burst_size=0, client=client, max_in_flight=3)
    await gen.start()
    for _ in range(200):
        await asyncio.sleep(0.01)
        assert gen.in_flight <= 3
        if gen.counts["skipped"] >= 5:
            break
    await gen.stop()
    assert gen.counts["skipped"] >= 5
    await client.aclose()


async def test_only_the_given_url_is_targeted_and_statuses_are_tallied() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        body = json.loads(request.content)
        if body["stream"]:
            sse = b'data: {"choices":[]}\n\ndata: {"error":{"code":500,"message":"x","type":"server_error"}}\n\n'
            return httpx.Response(200, content=sse, headers={"content-type": "text/event-stream"})
        return httpx.Response(429, json={"error": {"code": "queue_full"}})

    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    gen = TrafficGenerator("http://127.0.0.1:8081/", seed=4, rate_interactive=100.0, rate_batch=100.0, burst_size=0, client=client)
    await gen.start()
    for _ in range(200):
        await asyncio.sleep(0.01)
        if gen.counts["429"] >= 3 and gen.counts["200+error"] >= 3:
            break
    await gen.stop()
    assert gen.counts["429"] >= 3 and gen.counts["200+error"] >= 3
    assert gen.counts_by_class["batch"]["429"] == gen.counts["429"]
    assert gen.counts_by_class["interactive"]["200+error"] == gen.counts["200+error"]
    assert {str(r.url) for r in seen} == {"http://127.0.0.1:8081/v1/chat/completions"}
    assert {r.headers["x-tokengate-class"] for r in seen} == {"interactive", "batch"}
    await client.aclose()


async def test_generator_with_its_own_client_closes_it() -> None:
    gen = TrafficGenerator("http://127.0.0.1:9", seed=0, rate_interactive=100.0, rate_batch=0.0, burst_size=0)
    await gen.start()
    for _ in range(200):
        await asyncio.sleep(0.01)
        if gen.counts["transport_error"]:
            break
    await gen.stop()
    assert gen.counts["transport_error"] >= 1  # nothing listens on the discard port
    assert gen._client is None
