"""A refusal the count could only confirm is made before it (gate/http/proxy.py
`_refuse_before_count`, `Admission.refuses_before_count`).

Under overload llama-server answers the gate's token counts late (its HTTP threads are busy
with streams): a user's trial on 2026-12-05 saw refusals decided "at arrival" take 2.0 s on
average where counts timed out. A newcomer that must wait behind a full queue (or that T1 says
cannot make its objective even with no prompt at all) is refused without asking. The count is
held open on a FAKE upstream (tests/integration/fake_upstream.py: only a fake can answer a
count late on purpose); the refused request's count is never asked.
"""

from __future__ import annotations

import asyncio

import httpx

from tests.integration.fake_upstream import fake_upstream
from tests.integration.gate_harness import released, running_gate, wait_until

CHAT = "/v1/chat/completions"
CONFIG = """
default_class = "interactive"
[classes.interactive]
priority = 10
queue_depth = 1
"""


def body(text: str) -> dict:
    return {"messages": [{"role": "user", "content": text}], "max_tokens": 16, "stream": True}


async def test_a_newcomer_behind_a_full_queue_is_refused_without_waiting_on_its_count():
    async with fake_upstream("hang") as fake:
        async with running_gate(fake.url, CONFIG) as gate, httpx.AsyncClient(base_url=gate.url, timeout=30) as client:
            admission = next(iter(gate.backends)).admission
            held = [asyncio.create_task(client.post(CHAT, json=body(f"hold {i}"))) for i in range(4)]
            await wait_until(lambda: fake.completions == 4)  # the fake's 4 slots, each held
            waiter = asyncio.create_task(client.post(CHAT, json=body("wait")))
            await wait_until(lambda: admission.waiting() == 1)  # the class's one place taken
            fake.count_hold = asyncio.Event()  # llama-server answers no count from now on
            asked = fake.counts
            response = await client.post(CHAT, json=body("one too many"), headers={"X-Request-Id": "early"})
            assert response.status_code == 429, response.text
            assert response.json()["error"]["message"].startswith("class 'interactive' queue is full")
            assert "retry-after" in response.headers
            assert fake.counts == asked, "the refused request's count was asked (and waited on)"
            await wait_until(lambda: gate.records.find("early") is not None)
            record = gate.records.find("early")
            assert (record.outcome, record.reason, record.queue_ms) == ("refused", "queue_full", 0.0)
            # no count: its prompt is the estimate (the JSON of its prompt fields / 3)
            assert record.token_count_source == "estimate" and record.prompt_tokens is not None
            fake.count_hold.set()
            for task in (*held, waiter):
                task.cancel()
            await asyncio.gather(*held, waiter, return_exceptions=True)
            await released(gate)
            assert admission.ledger.double_releases == 0
