"""A client's X-Request-Id names its request in the answer, the journal and the log; the
admission core's ids are the gate's own (gate/http/proxy.py `Exchange.core_id`).

A client may send one id twice at once: an SDK retrying a plain call its timeout cut keeps
the id, and the cut call's reservation is held until llama-server lets go of it. The core's
ids are unique (a second reservation under one id raises), and before the fix the retry
was answered 500 internal_error, which pages. The first call is held open on a FAKE
upstream (tests/integration/fake_upstream.py: only a fake holds a stream open on purpose).
"""

from __future__ import annotations

import asyncio

import httpx

from tests.integration.fake_upstream import fake_upstream
from tests.integration.gate_harness import released, running_gate, wait_until
from tests.integration.hardening import AUTH, ENV, TENANTS, record_of
from tests.llama.server import free_port

CHAT = "/v1/chat/completions"


def body(text: str) -> dict:
    return {"messages": [{"role": "user", "content": text}], "max_tokens": 16, "stream": True}


async def test_a_client_id_sent_twice_at_once_admits_both_and_journals_both_under_it():
    async with fake_upstream("hang") as fake:
        async with running_gate(fake.url, "") as gate, httpx.AsyncClient(base_url=gate.url, timeout=30) as client:
            admission = next(iter(gate.backends)).admission
            headers = {"X-Request-Id": "retry-7"}
            calls = []
            for text in ("first try", "the retry"):
                calls.append(asyncio.create_task(client.post(CHAT, json=body(text), headers=headers)))
                await wait_until(lambda n=len(calls): fake.completions == n or any(c.done() for c in calls))
            assert not any(c.done() for c in calls), [c.result().text for c in calls if c.done()]
            assert len(admission.ledger) == 2  # two reservations, one per call, under the gate's own ids
            for call in calls:
                call.cancel()
            await asyncio.gather(*calls, return_exceptions=True)
            await released(gate)
            assert admission.ledger.double_releases == 0
            await wait_until(lambda: sum(r.request_id == "retry-7" for r in gate.records) == 2)
            assert {r.reason for r in gate.records if r.request_id == "retry-7"} != {"internal_error"}


async def test_a_forwarded_route_refused_by_the_gate_answers_under_the_clients_id(llama_split):
    """A refusal on a forwarded route (401 without a key, 403 operator-only) is journaled under the
    client's id; its answer names it too (before the fix it carried no X-Request-Id at all: a client
    tracing by id could not find the row the journal holds)."""
    async with running_gate(llama_split.url, TENANTS, environ=ENV, kv="split") as gate, httpx.AsyncClient(timeout=30) as client:
        asks = [("no-key", "/tokenize", {}, 401), ("not-operator", "/slots/0?action=erase", AUTH, 403)]
        for rid, path, auth, status in asks:
            r = await client.post(gate.url + path, json={"content": "hi"}, headers={**auth, "X-Request-Id": rid})
            assert r.status_code == status, r.text
            assert r.headers.get("x-request-id") == rid, r.headers
            record = await record_of(gate, rid)
            assert (record.outcome, record.http_status) == ("refused", status)
        r = await client.post(gate.url + "/tokenize", json={"content": "hi"}, headers={**AUTH, "X-Request-Id": "served"})
        assert (r.status_code, r.headers.get("x-request-id")) == (200, "served")


async def test_a_forwarded_route_whose_backend_is_down_answers_under_the_clients_id():
    async with running_gate(f"http://127.0.0.1:{free_port()}") as gate, httpx.AsyncClient(timeout=30) as client:
        r = await client.post(gate.url + "/tokenize", json={"content": "hi"}, headers={"X-Request-Id": "down-1"})
        assert r.status_code == 503, r.text
        assert r.headers.get("x-request-id") == "down-1", r.headers
        assert "127.0.0.1" not in r.text
