"""Telemetry tells what it knows: traffic that bypasses the gate is shown as such, and values
from a llama-server that stopped answering are marked stale (finding 7 of #22)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from console.widgets.slots import render_capacity
from tests.integration.gate_harness import running_gate, wait_until
from tests.llama.server import LlamaServer

pytestmark = pytest.mark.llama


async def test_bypass_occupancy_is_shown_and_a_dead_servers_telemetry_is_stale(llama_bin, tmp_path, caplog):
    from tests.llama.make_model import cached_model

    server = LlamaServer(llama_bin, cached_model("default"), mode="unified", ctx=2048, n_slots=4, log_path=tmp_path / "llama.log").start()
    try:
        async with running_gate(server.url, kv="unified") as gate, httpx.AsyncClient(timeout=60) as client:

            def view():
                return next(b for b in gate.snapshot().backends if b.name == "b0")

            # straight to llama-server, not through the gate: a long generation holds one slot
            direct = asyncio.create_task(
                client.post(server.url + "/completion", json={"prompt": "hello", "n_predict": 1500, "ignore_eos": True})
            )
            await wait_until(lambda: view().bypass_slots == 1, timeout_s=20)
            v = view()
            assert v.slots_busy == 0 and not v.telemetry_stale
            assert "+1 bypassing the gate" in render_capacity(gate.snapshot(), compact=False).plain
            # ... and where an on-call looks without a console (a trial's two gates in front of one
            # llama-server said nothing): /health, and once in the log
            health = (await client.get(gate.url + "/health")).json()
            assert health["backends"]["b0"]["bypassing_slots"] == 1, health
            said = [r for r in caplog.records if "this gate did not send" in r.getMessage()]
            assert len(said) == 1 and said[0].levelname == "WARNING", said
            direct.cancel()
            await asyncio.gather(direct, return_exceptions=True)

            server.stop()
            await wait_until(lambda: view().telemetry_stale, timeout_s=20)
            v = view()
            assert v.bypass_slots == 0  # stale figures are not evidence of anything
            text = render_capacity(gate.snapshot(), compact=False).plain
            assert "telemetry STALE" in text and "(last read, stale)" in text
            # the crash leaves its mark on the audit log (and so on the review's chart)
            await wait_until(lambda: any(a.action == "backend_down" for a in gate.snapshot().audit), timeout_s=10)
            down = next(a for a in gate.snapshot().audit if a.action == "backend_down")
            assert (down.target, down.old_value, down.new_value) == ("backend:b0", "ready", "down")
    finally:
        server.stop()
