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

import httpx
import pytest

from gate.config import parse_config
from gate.service import GateService
from tests.integration.gate_harness import busy_slots, gate_toml, ledger_total, wait_until
from tests.integration.hardening import AUTH, BACKEND_EXTRA, CHAT, ENV, TENANTS, chat, data_events

pytestmark = pytest.mark.llama


@pytest.mark.parametrize("stream", [False, True], ids=["non-stream", "stream"])
async def test_request_cut_at_shutdown_is_journaled_as_answered(llama_unified, tmp_path, stream):
    config = parse_config(gate_toml([llama_unified.url], TENANTS, backend_extra=BACKEND_EXTRA), "test.toml")
    journal = tmp_path / "journal.db"
    gate = GateService(config, environ=ENV, probe_interval_s=0.2, journal_path=str(journal))
    await gate.start(port=0)
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
        rows = db.execute("SELECT outcome, reason, http_status FROM decisions WHERE request_id = 'cut'").fetchall()
    assert rows == [("cancelled", "server_cancelled", status)]
    await wait_until(lambda: ledger_total(gate) == 0, timeout_s=10)
    async with httpx.AsyncClient(timeout=10) as client:  # upstream closed: the shared server is free again
        await wait_until(lambda: idle(client, llama_unified.url), timeout_s=10)


async def busy(client: httpx.AsyncClient, url: str) -> bool:
    return await busy_slots(client, url) > 0


async def idle(client: httpx.AsyncClient, url: str) -> bool:
    return await busy_slots(client, url) == 0
