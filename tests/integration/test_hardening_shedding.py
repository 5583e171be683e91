"""Shedding by progress (#11): healthy requests sharing busy slots are never shed; stuck ones are.

Before the fix, on the real llama-server (-np 8 -c 4096, split), three short
requests served alone and then 8 concurrent 300-token requests: all 8 got 503
shed_overrun, because the expected duration was learned at low occupancy. Here the
same sequence runs on 4 busy slots (the session fixture) and on 8 (a llama-server
of the test's own) with the default shed settings, and every request must finish.
A FAKE upstream (tests/integration/fake_upstream.py) stands in only for the stuck
stream, which must still be shed, with its upstream closed and its tokens released.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import tempfile
from pathlib import Path

import httpx
import pytest

from gate.config import parse_config
from gate.service import GateService
from gate.tools.simulator.config import SimulatorConfig
from gate.tools.simulator.serve import serve_simulator
from tests.integration.fake_upstream import fake_upstream
from tests.integration.gate_harness import ledger_total, running_gate, wait_until
from tests.integration.hardening import (
    AUTH,
    BACKEND_EXTRA,
    CHAT,
    ENV,
    TENANTS,
    assert_error,
    chat,
    data_events,
    record_of,
    still_serves,
)
from tests.llama.server import LlamaServer

pytestmark = pytest.mark.llama


async def busy_slots_then_all_finish(gate, n: int) -> None:
    async with httpx.AsyncClient(timeout=300) as client:
        for i in range(3):  # served alone: what the old rule learned its "expected duration" from
            r = await client.post(gate.url + CHAT, json=chat(8), headers={**AUTH, "X-Request-Id": f"alone-{i}"})
            assert r.status_code == 200, r.text

        async def one(i: int, stream: bool) -> None:
            headers = {**AUTH, "X-Request-Id": f"busy-{i}"}
            if stream:
                async with client.stream("POST", gate.url + CHAT, json=chat(300, stream=True), headers=headers) as r:
                    assert r.status_code == 200
                    lines = [line async for line in r.aiter_lines()]
                events = data_events(lines)
                assert events[-1] == "[DONE]", events[-2:]
            else:
                r = await client.post(gate.url + CHAT, json=chat(300), headers=headers)
                assert r.status_code == 200, r.text
                assert r.json()["usage"]["completion_tokens"] == 300

        await asyncio.gather(*(one(i, stream=i % 2 == 0) for i in range(n)))
        for i in range(n):
            record = await record_of(gate, f"busy-{i}")
            assert (record.outcome, record.reason) == ("admitted", "ok"), record
        await still_serves(gate, client)


async def test_four_healthy_requests_on_four_busy_slots_are_never_shed(llama_split):
    async with running_gate(llama_split.url, TENANTS, environ=ENV, kv="split", backend_extra=BACKEND_EXTRA) as gate:
        await busy_slots_then_all_finish(gate, 4)


async def test_eight_healthy_requests_on_eight_busy_slots_are_never_shed(llama_bin, tiny_model, tmp_path):
    server = LlamaServer(llama_bin, tiny_model, mode="split", ctx=4096, n_slots=8, log_path=tmp_path / "llama8.log")
    server.start()
    try:
        async with running_gate(server.url, TENANTS, environ=ENV, kv="split", backend_extra=BACKEND_EXTRA) as gate:
            assert gate.backends.backends[0].capacity.slots == 8
            await busy_slots_then_all_finish(gate, 8)
    finally:
        server.stop()


async def test_simulator_four_on_four_slots_are_never_shed():
    """The simulator makes the slowdown exact: 4.5 ms per token alone, 18 ms with 4 slots busy
    (speed 10). The old rule expected 300 x 4.5 ms and shed at 2.5 x that (3.4 s) requests
    that need 5.4 s: all 4 were shed."""
    sim = await serve_simulator(SimulatorConfig(slots=4, ctx=8192, kv="split", speed=10.0), port=0)
    try:
        async with running_gate(sim.url, TENANTS, environ=ENV, kv="split", backend_extra=BACKEND_EXTRA) as gate:
            await busy_slots_then_all_finish(gate, 4)
    finally:
        await sim.stop()


@contextlib.asynccontextmanager
async def gate_with_stuck_backend(llama_url: str, fake_url: str, gate_extra: str):
    """Model "tiny" on the real llama-server, model "stuck" on the FAKE upstream."""
    toml = (
        gate_extra
        + TENANTS
        + f'\n[[backends]]\nname = "llama"\nurl = "{llama_url}"\nkv = "split"\nmodels = ["tiny"]\n'
        + f'\n[[backends]]\nname = "stuck"\nurl = "{fake_url}"\nmodels = ["stuck"]\n'
    )
    with tempfile.TemporaryDirectory(prefix="tokengate-test-") as tmp:
        gate = GateService(parse_config(toml, "test.toml"), environ=ENV, probe_interval_s=0.2, journal_path=str(Path(tmp) / "journal.db"))
        await gate.start(port=0)
        try:
            yield gate
        finally:
            await gate.stop(grace_s=5)


@pytest.mark.parametrize(
    ("mode", "stream"),
    [("stall", True), ("stall", False), ("hang", False), ("hang", True)],
    ids=["stall-after-a-token-stream", "stall-after-a-token-non-stream", "no-first-token", "no-first-token-stream"],
)
async def test_stuck_request_is_shed_and_its_slot_freed(llama_split, mode, stream):
    async with (
        fake_upstream(mode) as fake,
        gate_with_stuck_backend(llama_split.url, fake.url, "[gate]\nshed_stall_s = 0.5\n") as gate,
        httpx.AsyncClient(timeout=60) as client,
    ):
        headers = {**AUTH, "X-Request-Id": "stuck"}
        body = chat(64, stream=stream, model="stuck")
        if stream and mode == "stall":
            async with client.stream("POST", gate.url + CHAT, json=body, headers=headers) as r:
                assert r.status_code == 200
                lines = [line async for line in r.aiter_lines()]
            events = data_events(lines)
            assert "[DONE]" not in events
            error = json.loads(events[-1])["error"]
            assert error["code"] == "shed_overrun" and "no progress" in error["message"], error
            expected = 200
        else:
            # Before the first token nothing was sent: a plain 503, streaming or not.
            r = await client.post(gate.url + CHAT, json=body, headers=headers)
            err = assert_error(r, 503, "shed_overrun")
            assert "no progress" in err["message"]
            expected = 503
        await asyncio.wait_for(fake.released.wait(), 10)  # upstream closed: a real slot would be free
        record = await record_of(gate, "stuck")
        assert (record.outcome, record.reason, record.http_status) == ("shed", "shed_overrun", expected)
        await wait_until(lambda: ledger_total(gate) == 0 and gate.in_flight_requests() == 0, timeout_s=10)
        await still_serves(gate, client)
