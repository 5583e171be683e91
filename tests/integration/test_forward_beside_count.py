"""The forward beside the count ([gate] forward_beside_count, gate/http/proxy.py).

A request that fits at once on an upper bound of its prompt goes to llama-server while
llama-server counts it; the count then settles its reservation, or, over the bound, takes it
back (llama-server's connection closed) and the request is admitted, queued or refused as
counted. These tests hold the count open on a FAKE upstream (tests/integration/fake_upstream.py:
only a fake can answer a count late on purpose) and look at the order llama-server's side saw
things in; after each the ledger is back to zero and the journal has the counted request.
The real llama-server's side of it (the count settled, exact reservations) is
tests/integration/test_apis_llama.py, which runs with the default (on).
"""

from __future__ import annotations

import asyncio

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.fake_upstream import fake_upstream
from tests.integration.gate_harness import ledger_total, released, running_gate, wait_until

CHAT = "/v1/chat/completions"
BODY = {"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 16, "stream": True}


def backend_of(gate):
    return next(iter(gate.backends))


def sample(gate, name: str, **labels: str) -> float | None:
    """One series of the gate's own Prometheus text."""
    body, _ = gate.metrics.render()
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            if s.name == name and dict(s.labels) == labels:
                return s.value
    return None


async def record_of(gate, request_id: str):
    await wait_until(lambda: gate.records.find(request_id) is not None)
    return gate.records.find(request_id)


@pytest.mark.parametrize("beside", [True, False], ids=["beside", "off-negative-control"])
async def test_the_forward_goes_while_the_count_is_out_and_the_count_settles_the_reservation(beside: bool):
    async with fake_upstream("slow", delay_s=0.01) as fake:
        fake.count_hold = asyncio.Event()
        extra = "" if beside else "[gate]\nforward_beside_count = false\n"
        async with running_gate(fake.url, extra) as gate, httpx.AsyncClient(base_url=gate.url, timeout=10) as client:
            answer = asyncio.create_task(client.post(CHAT, json=BODY, headers={"X-Request-Id": "early"}))
            await fake.count_asked.wait()
            if beside:
                # llama-server has the request before its count is answered: the round trip is off the path
                await wait_until(lambda: fake.completions == 1)
                assert ledger_total(gate) > 12 + 16  # held on the bound meanwhile, never less
            fake.count_hold.set()
            response = await answer
            assert response.status_code == 200
            assert fake.completions == 1
            assert fake.count_answered_at is not None
            # the order llama-server saw: the completion before the count's answer, or after it when off
            assert (fake.completion_at[0] < fake.count_answered_at) is beside
            record = await record_of(gate, "early")
            assert record.outcome == "admitted" and record.prompt_tokens == 12
            assert record.reserved_tokens == 12 + 16  # the count, not the bound
            assert record.queue_ms < 1.0  # no wait: the decision's microseconds
            await released(gate)
            settled = sample(gate, "tokengate_forward_beside_count_total", result="settled")
            assert settled == (1 if beside else 0)


async def test_a_count_that_never_fits_closes_the_forward_sent_beside_it_and_answers_400():
    async with fake_upstream("hang") as fake:
        fake.count_hold = asyncio.Event()
        fake.count_tokens = 5000  # over the fake's 2048-token slot: never fits
        async with running_gate(fake.url) as gate, httpx.AsyncClient(base_url=gate.url, timeout=10) as client:
            answer = asyncio.create_task(client.post(CHAT, json=BODY, headers={"X-Request-Id": "big"}))
            await fake.held.wait()  # the forward went beside the count
            fake.count_hold.set()
            response = await answer
            assert response.status_code == 400
            assert response.json()["error"]["type"] == "exceed_context_size_error"
            await fake.released.wait()  # the gate closed llama-server's request
            record = await record_of(gate, "big")
            assert record.outcome == "refused" and record.reason == "context_length_exceeded"
            assert record.reserved_tokens == 0
            await released(gate)
            assert backend_of(gate).admission.ledger.double_releases == 0
            assert sample(gate, "tokengate_forward_beside_count_total", result="over_bound") == 1


async def test_a_count_over_the_bound_that_fits_where_it_stood_keeps_the_forward():
    async with fake_upstream("slow", delay_s=0.05) as fake:
        fake.count_hold = asyncio.Event()
        # over the bound of a 54-byte prompt (18 estimated + 64), within a token per byte
        fake.count_tokens = 110
        async with running_gate(fake.url) as gate, httpx.AsyncClient(base_url=gate.url, timeout=10) as client:
            answer = asyncio.create_task(client.post(CHAT, json=BODY, headers={"X-Request-Id": "over"}))
            await wait_until(lambda: fake.completions == 1)  # the forward beside the count
            fake.count_hold.set()
            response = await answer
            assert response.status_code == 200
            assert fake.completions == 1  # grown where the bound stood: llama-server's work kept
            record = await record_of(gate, "over")
            assert record.outcome == "admitted" and record.reserved_tokens == 110 + 16
            await released(gate)
            assert sample(gate, "tokengate_forward_beside_count_total", result="grown") == 1
            # the backend's counts taught the bound: the next such prompt settles
            body = {**BODY, "messages": [{"role": "user", "content": "hello again"}]}
            response = await client.post(CHAT, json=body, headers={"X-Request-Id": "learned"})
            assert response.status_code == 200 and fake.completions == 2
            assert sample(gate, "tokengate_forward_beside_count_total", result="settled") == 1
            await released(gate)
            assert backend_of(gate).admission.ledger.double_releases == 0


async def test_a_count_that_does_not_fit_where_its_bound_stood_is_taken_back_and_waits_as_counted():
    async with fake_upstream("slow", delay_s=0.5) as fake:
        async with running_gate(fake.url) as gate, httpx.AsyncClient(base_url=gate.url, timeout=10) as client:
            # 12 + 1500 of the fake's 2,048 tokens held for half a second
            held = asyncio.create_task(client.post(CHAT, json={**BODY, "max_tokens": 1500}, headers={"X-Request-Id": "held"}))
            await wait_until(lambda: fake.completions == 1)
            fake.count_hold, fake.count_tokens = asyncio.Event(), 600  # 600 + 16 does not fit beside it
            other = {**BODY, "messages": [{"role": "user", "content": "hello later"}]}  # not in the count cache
            answer = asyncio.create_task(client.post(CHAT, json=other, headers={"X-Request-Id": "later"}))
            await wait_until(lambda: fake.completions == 2)  # its bound (82 + 16) fit: sent beside the count
            fake.count_hold.set()
            response = await answer
            assert response.status_code == 200 and (await held).status_code == 200
            assert fake.completions == 3  # taken back, then sent again once the held one ended
            record = await record_of(gate, "later")
            assert record.outcome == "admitted" and record.reserved_tokens == 600 + 16 and record.queue_ms > 100
            assert sample(gate, "tokengate_forward_beside_count_total", result="over_bound") == 1
            await released(gate)
            assert backend_of(gate).admission.ledger.double_releases == 0


async def test_a_client_gone_during_the_count_closes_the_forward_and_gives_the_bound_back():
    async with fake_upstream("hang") as fake:
        fake.count_hold = asyncio.Event()
        async with running_gate(fake.url) as gate, httpx.AsyncClient(base_url=gate.url, timeout=10) as client:
            answer = asyncio.create_task(client.post(CHAT, json=BODY, headers={"X-Request-Id": "gone"}))
            await fake.held.wait()
            assert ledger_total(gate) > 0
            answer.cancel()  # the client hangs up while the count is out
            await fake.released.wait()
            await released(gate)
            record = await record_of(gate, "gone")
            assert record.outcome == "cancelled" and record.http_status == 499
            assert record.reserved_tokens == 0
            fake.count_hold.set()
            assert sample(gate, "tokengate_forward_beside_count_total", result="taken_back") == 1
            assert backend_of(gate).admission.ledger.double_releases == 0
            assert backend_of(gate).admission.holds.mean_s is None  # nothing ran: no hold measured


async def test_a_failure_before_the_forward_is_sent_gives_the_bound_back_at_once(monkeypatch):
    # Whatever breaks between the bound's admission and the forward (it was a client's
    # `stream_options: 5` once), the bound goes back then, not when the reaper finds it.
    import gate.http.proxy as proxy

    def broken(kind, body):
        raise RuntimeError("a bug building the upstream body")

    monkeypatch.setattr(proxy, "upstream_body", broken)
    async with fake_upstream("slow", delay_s=0.01) as fake:
        async with running_gate(fake.url) as gate, httpx.AsyncClient(base_url=gate.url, timeout=10) as client:
            response = await client.post(CHAT, json=BODY, headers={"X-Request-Id": "broken"})
            assert response.status_code == 500 and "internal error in the gate" in response.text
            assert response.json()["error"]["code"] == "internal_error"  # the gate's fault, not llama-server's
            assert fake.completions == 0
            await released(gate)
            gatekeeper = backend_of(gate).gatekeeper
            assert gatekeeper.reaped == 0  # given back on the path, not reclaimed
            assert gatekeeper.admission.ledger.double_releases == 0
            record = await record_of(gate, "broken")
            assert record.http_status == 500 and record.reserved_tokens == 0
            assert (record.outcome, record.reason) == ("failed", "internal_error")
