"""X-Tokengate-Class on a refusal at intake names the class the request was refused in.

A user sent `X-Tokengate-Class: batch` with `max_tokens` 9999 and got 400 "'max_tokens' must be
at most 4096 (the cap of class 'batch')" with `x-tokengate-class:` EMPTY, while the journal row
and `admission_control_denials_total{priority_class="batch"}` said batch (DESIGN.md 5: the
header is on every proxied request). The header read only the whole intake; the journal also
reads the caller an intake refusal carries. A FAKE upstream (tests/integration/fake_upstream.py)
is enough: the request never reaches it.
"""

from __future__ import annotations

import httpx

from tests.integration.fake_upstream import fake_upstream
from tests.integration.gate_harness import running_gate


async def test_an_intake_refusal_carries_the_class_it_was_refused_in():
    async with fake_upstream("slow", delay_s=0.01) as fake, running_gate(fake.url) as gate, httpx.AsyncClient(timeout=30) as client:
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 9999}
        r = await client.post(f"{gate.url}/v1/chat/completions", json=body, headers={"X-Tokengate-Class": "batch"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_request"
        assert "class 'batch'" in r.json()["error"]["message"]
        assert r.headers["x-tokengate-class"] == "batch"
        assert r.headers["x-request-id"] and "x-tokengate-queue-ms" in r.headers
        # an unknown class stays unnamed: there is no class to name, and no empty `x-tokengate-class:`
        # header either (a trial), here nor before the body is read as JSON
        r = await client.post(f"{gate.url}/v1/chat/completions", json=body, headers={"X-Tokengate-Class": "nosuch"})
        assert r.status_code == 400 and "x-tokengate-class" not in r.headers, r.headers
        r = await client.post(f"{gate.url}/v1/chat/completions", content=b"{")
        assert r.status_code == 400 and "x-tokengate-class" not in r.headers, r.headers
        assert r.headers["x-request-id"] and "x-tokengate-queue-ms" in r.headers
