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
    # default_max_tokens 2048: the fake's slot, which a request without max_tokens fits only with no prompt
    async with fake_upstream("hang") as fake:
        async with (
            running_gate(fake.url, CONFIG + "default_max_tokens = 2048\n") as gate,
            httpx.AsyncClient(base_url=gate.url, timeout=30) as client,
        ):
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
            # A trial: the class default (512 on slots of 512) was journaled for a request refused
            # before its count, where a counted one gets what its slot holds after its prompt:
            # replay re-ran it as never-fits, and `log --format aiperf` asked for 512 tokens.
            unlimited = {"messages": [{"role": "user", "content": "no limit given"}], "stream": True}
            response = await client.post(CHAT, json=unlimited, headers={"X-Request-Id": "nolimit"})
            assert response.status_code == 429, response.text
            await wait_until(lambda: gate.records.find("nolimit") is not None)
            record = gate.records.find("nolimit")
            assert record.token_count_source == "estimate" and fake.counts == asked  # refused before its count
            assert record.max_tokens == 2048 - record.prompt_tokens  # the limit it would have had, not the default
            fake.count_hold.set()
            for task in (*held, waiter):
                task.cancel()
            await asyncio.gather(*held, waiter, return_exceptions=True)
            await released(gate)
            assert admission.ledger.double_releases == 0


async def test_a_burst_is_counted_a_few_at_a_time_and_the_rest_refused_once_the_first_queue():
    """A burst arriving together found an empty queue each, so every request waited on its
    count before most were refused (a trial: 60 at once, 53 refused after up to 2 s). Counted a
    few at a time, each looking again when its turn comes, the rest are refused without one."""
    from gate.backend.pool import COUNTS_AT_ONCE

    async with fake_upstream("hang") as fake:
        async with running_gate(fake.url, CONFIG) as gate, httpx.AsyncClient(base_url=gate.url, timeout=30) as client:
            admission = next(iter(gate.backends)).admission
            held = [asyncio.create_task(client.post(CHAT, json=body(f"hold {i}"))) for i in range(4)]
            await wait_until(lambda: fake.completions == 4)  # every slot held: newcomers must wait
            fake.count_hold = asyncio.Event()  # counts are answered late
            asked = fake.counts
            burst = [asyncio.create_task(client.post(CHAT, json=body(f"burst {i}"))) for i in range(12)]
            await wait_until(lambda: fake.counts - asked == COUNTS_AT_ONCE)
            await asyncio.sleep(0.2)  # the others wait for their turn, not on llama-server
            assert fake.counts - asked == COUNTS_AT_ONCE
            fake.count_hold.set()
            await wait_until(lambda: sum(t.done() for t in burst) == 11)  # all but the one queued
            assert admission.waiting() == 1  # the class's one place
            assert sorted(t.result().status_code for t in burst if t.done()) == [429] * 11
            # the ones that waited for their turn found the queue full and were refused uncounted
            assert fake.counts - asked == COUNTS_AT_ONCE
            # ... after a wait in the gate, which they report (a trial: "queue ms 0" after 2 s):
            # the 0.2 s at least that the counts were held, in the header and the journal alike
            refused = [t.result() for t in burst if t.done()]
            waited = [float(r.headers["x-tokengate-queue-ms"]) for r in refused]
            assert sum(w >= 200.0 for w in waited) == 12 - COUNTS_AT_ONCE, waited
            for r in refused:
                await wait_until(lambda r=r: gate.records.find(r.headers["x-request-id"]) is not None)
                record = gate.records.find(r.headers["x-request-id"])
                assert round(record.queue_ms, 1) == float(r.headers["x-tokengate-queue-ms"]), (record, r.headers)
            for task in (*held, *burst):
                task.cancel()
            await asyncio.gather(*held, *burst, return_exceptions=True)
            await released(gate)
            assert admission.ledger.double_releases == 0
