"""Shutdown truthfulness (#11): the decision row records what the client actually received.

Before the fix a request cut off at the end of the grace period got uvicorn's bare
HTTP 500 while the journal said 499 server_cancelled. Now it gets 503
shutting_down (or, once streaming, an SSE error event and the end of the stream),
and the journal's row says 503 (or 200) too. Real gate, real llama-server; the
journal file itself is read back after the gate stopped.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path

import httpx
import pytest

from gate.config import parse_config
from gate.service import GateService
from tests.integration.gate_harness import busy_slots, gate_toml, ledger_total, wait_until
from tests.integration.hardening import AUTH, BACKEND_EXTRA, CHAT, ENV, TENANTS, chat, data_events

pytestmark = pytest.mark.llama


async def started_gate(url: str, tmp_path: Path) -> tuple[GateService, Path]:
    """A gate stopped by the test itself (not running_gate's), and its journal file, read after."""
    config = parse_config(gate_toml([url], TENANTS, backend_extra=BACKEND_EXTRA), "test.toml")
    journal = tmp_path / "journal.db"
    gate = GateService(config, environ=ENV, probe_interval_s=0.2, journal_path=str(journal))
    await gate.start(port=0)
    return gate, journal


@pytest.mark.parametrize("stream", [False, True], ids=["non-stream", "stream"])
async def test_request_cut_at_shutdown_is_journaled_as_answered(llama_unified, tmp_path, stream):
    gate, journal = await started_gate(llama_unified.url, tmp_path)
    stopped = False
    try:
        async with httpx.AsyncClient(timeout=60) as client:
            headers = {**AUTH, "X-Request-Id": "cut"}
            first = asyncio.Event()

            async def call() -> tuple[int, list[str] | str]:
                if not stream:
                    r = await client.post(gate.url + CHAT, json=chat(1800), headers=headers)
                    return r.status_code, r.text
                async with client.stream("POST", gate.url + CHAT, json=chat(1800, stream=True), headers=headers) as r:
                    lines = []
                    async for line in r.aiter_lines():
                        lines.append(line)
                        first.set()
                    return r.status_code, lines

            task = asyncio.create_task(call())
            if stream:
                await asyncio.wait_for(first.wait(), 30)
            else:
                await wait_until(lambda: ledger_total(gate) > 0, timeout_s=30)
            await gate.stop(grace_s=0.2)  # far shorter than 1800 tokens take
            stopped = True
            status, answer = await asyncio.wait_for(task, 30)
    finally:
        if not stopped:
            await gate.stop(grace_s=0.2)
    if stream:
        assert status == 200
        events = data_events(answer)
        assert "[DONE]" not in events
        assert json.loads(events[-1])["error"]["code"] == "shutting_down"
    else:
        assert status == 503, answer
        assert json.loads(answer)["error"]["code"] == "shutting_down"
    with sqlite3.connect(journal) as db:
        rows = db.execute("SELECT outcome, reason, http_status, detail FROM decisions WHERE request_id = 'cut'").fetchall()
    # the code and message the client got (a trial grepped the journal for `shutting_down`)
    assert rows == [("cancelled", "shutting_down", status, "the gate shut down before this request finished")]
    await wait_until(lambda: ledger_total(gate) == 0, timeout_s=10)
    async with httpx.AsyncClient(timeout=10) as client:  # upstream closed: the shared server is free again
        await wait_until(lambda: idle(client, llama_unified.url), timeout_s=10)


async def busy(client: httpx.AsyncClient, url: str) -> bool:
    return await busy_slots(client, url) > 0


async def idle(client: httpx.AsyncClient, url: str) -> bool:
    return await busy_slots(client, url) == 0


async def test_a_paused_classs_waiters_are_refused_when_the_gate_stops_not_held_for_the_grace(llama_unified, tmp_path):
    """A trial: SIGTERM with 7 requests queued in a paused class held them for the whole 30 s
    grace (nothing could resume them), then cut them: 47-53 s in the queue in all. They are
    refused as the gate starts to stop, journaled with the code and message they got."""
    from gate.ops.control import Operator

    gate, journal = await started_gate(llama_unified.url, tmp_path)
    stopping = None
    try:
        async with httpx.AsyncClient(timeout=60) as client:
            cap = next(iter(gate.backends)).capacity
            slots, long = cap.slots, cap.ceiling // cap.slots - 64  # every slot held, as long as they hold
            holders = [
                asyncio.create_task(client.post(gate.url + CHAT, json={**chat(long), "ignore_eos": True}, headers=AUTH))
                for _ in range(slots)
            ]
            await wait_until(lambda: len(next(iter(gate.backends)).admission.ledger) == slots, timeout_s=30)
            batch = {**AUTH, "X-Tokengate-Class": "batch"}
            waiters = [
                asyncio.create_task(client.post(gate.url + CHAT, json=chat(4), headers={**batch, "X-Request-Id": f"paused-{i}"}))
                for i in range(3)
            ]
            await wait_until(lambda: next(iter(gate.backends)).admission.waiting() == 3, timeout_s=10)
            gate.control.pause("batch", True, operator=Operator("t", "local"))
            stopping = asyncio.create_task(gate.stop(grace_s=30))
            answers = await asyncio.wait_for(asyncio.gather(*waiters), 5)  # not the grace's 30 s
            for r in answers:
                assert r.status_code == 503, r.text
                error = r.json()["error"]
                assert error["code"] == "shutting_down" and "class 'batch' is paused" in error["message"], error
            for t in holders:
                t.cancel()
            await asyncio.gather(*holders, return_exceptions=True)
            await asyncio.wait_for(stopping, 30)
    finally:
        if stopping is None:
            await gate.stop(grace_s=0.2)
    with sqlite3.connect(journal) as db:
        rows = db.execute("SELECT outcome, reason, http_status FROM decisions WHERE request_id LIKE 'paused-%'").fetchall()
    assert rows == [("refused", "shutting_down", 503)] * 3
