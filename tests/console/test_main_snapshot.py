"""SVG snapshots of the MAIN screen at 80x24 (compact) and 160x48 (wide), from a fixed state.

A REAL GateService on a fake llama-server transport (as conftest.py), with every source
of change pinned at its source, not in the app:
  * the gate's clock and the app's clock are FIXED_NOW (rollups, oldest wait, header);
  * TZ=UTC (the header and the decision tail print local time);
  * the listen port is the configured one (the gate is never started, so it has none);
  * decisions carry fixed request ids and times (not conftest's process-wide counter);
  * the chart history is a fixed 10-minute series;
  * the tick's own duration (status line "tick N ms") is read from a frozen perf_counter;
  * cursor blink off.

Regenerate after an intended change with
    .venv/bin/pytest tests/console/test_main_snapshot.py --snapshot-update
and look at the report/SVGs before committing them.
"""

from __future__ import annotations

import asyncio
import math
import time
import types

import pytest
from textual.pilot import Pilot
from textual.widgets import Input

import console.app
from console.app import TokengateApp
from gate.config import parse_config
from gate.core.ledger import Request
from gate.data.records import AuditRecord, DecisionRecord
from gate.observe.gpu import GpuDevice, GpuReading
from gate.ops.link import InProcessLink
from gate.service import GateService
from tests.console.conftest import CONFIG, ENVIRON, FIXED_NOW, SLOTS
from tests.fakes import fake_llama_transport

TENANTS = ("acme", "globex", "initech", "umbrella")


@pytest.fixture
def utc(monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.fixture
def frozen_tick_timer(monkeypatch):
    """console.app times each tick with time.perf_counter: 0 ms, always (only in console.app)."""
    monkeypatch.setattr(console.app, "time", types.SimpleNamespace(perf_counter=lambda: 0.0, time=time.time))


def decision(
    i: int, cls: str, *, outcome: str = "admitted", reason: str = "ok", status: int = 200, ttft_ms: float | None = None
) -> DecisionRecord:
    refused = outcome != "admitted"
    return DecisionRecord(
        ts=FIXED_NOW - 40 + i,
        request_id=f"snap-{i:04d}",
        tenant=TENANTS[i % len(TENANTS)],
        cls=cls,
        backend="default",
        endpoint="/v1/chat/completions",
        stream=cls == "interactive",
        prompt_tokens=40 + (i * 37) % 900,
        token_count_source="exact",
        max_tokens=256 if cls == "batch" else 128,
        reserved_tokens=400 + (i * 37) % 900,
        outcome=outcome,
        reason=reason,
        http_status=status,
        queue_ms=0.0 if refused else float((i * 13) % 400),
        ttft_ms=None if refused else (ttft_ms or 90.0 + (i * 53) % 700),
        duration_ms=500.0 + (i * 97) % 4000,
        completion_tokens=None if refused else 40 + i % 80,
        budget_at_decision=8192,
        in_flight_at_decision=(i * 311) % 8192,
        ttft_arrival_ms=None if refused else float((i * 13) % 400) + (ttft_ms or 90.0 + (i * 53) % 700),
    )


def decisions() -> list[DecisionRecord]:
    out = []
    for i in range(36):
        if i % 9 == 4:
            out.append(decision(i, "batch", outcome="refused", reason="queue_full", status=429))
        elif i % 11 == 7:
            out.append(decision(i, "interactive", outcome="refused", reason="token_budget_exceeded", status=429))
        else:
            out.append(decision(i, "batch" if i % 3 == 0 else "interactive"))
    return out


def history(app: TokengateApp) -> None:
    """Ten minutes of chart samples every 2.5 s: the budget down (controller) and back (alice), load in waves."""
    for k in range(240):
        ts = FIXED_NOW - 600 + 2.5 * (k + 1)
        budget = 6554 if 120 <= k < 190 else 8192
        in_flight = int(3000 + 2500 * math.sin(k / 14) + 800 * math.sin(k / 3.7))
        p95 = None if k < 8 else 900 + 700 * math.sin(k / 20) + 150 * math.sin(k / 4.1)
        app.history.append((ts, budget, min(in_flight, budget), p95))


def make_gate() -> GateService:
    gate = GateService(parse_config(CONFIG), environ=ENVIRON, transport=fake_llama_transport(SLOTS), clock=lambda: FIXED_NOW)
    gate.port = gate.config.gate.listen_port  # never started: show where it would listen
    return gate


async def fill(gate: GateService, app: TokengateApp) -> None:
    """Probe, telemetry, a GPU, decisions, an audited budget move and a queue: then one tick."""
    await gate.backends.probe_all()
    gate._on_telemetry(await gate.telemetry_poller.poll_once())
    gate.gpu_reading = GpuReading(devices=(GpuDevice(0, "NVIDIA H200", 61 * 2**30, 140 * 2**30, None, 44, ()),), unavailable=None)
    for rec in decisions():
        gate.record(rec, model=None, queued_s=None, ttft_s=None if rec.ttft_ms is None else rec.ttft_ms / 1000)
    gate.audit(
        AuditRecord(
            FIXED_NOW - 300,
            "controller",
            "local",
            "controller",
            "budget_decrease",
            "backend:default",
            "8192",
            "6554",
            "p95 TTFT 2400 ms vs SLO 2000 ms over 40 samples",
        )
    )
    gate.audit(AuditRecord(FIXED_NOW - 125, "alice", "10.1.2.3", "console", "set_budget", "backend:default", "6554", "8192"))
    # Every slot held, three batch requests waiting behind them (the tasks end with the app's loop).
    gk = gate.backends.backends[0].gatekeeper
    for i in range(4):
        await gk.acquire(Request(f"hold-{i}", "interactive" if i % 2 else "batch", "acme", 300 + 100 * i, 128, FIXED_NOW))
    for i in range(3):
        asyncio.create_task(gk.acquire(Request(f"wait-{i}", "batch", "globex", 200, 256, FIXED_NOW)))
    await asyncio.sleep(0)
    for widget in app.query(Input):
        widget.cursor_blink = False
    history(app)
    await app.tick()
    app.clear_notifications()  # alice's audited move, toasted as another console's action: not in the picture


def close(gate: GateService) -> None:
    for b in gate.backends:
        if b.gatekeeper is not None:
            b.gatekeeper.close()
    asyncio.run(gate.client.aclose())


def assert_snapshot(snap_compare, gate, app: TokengateApp, size: tuple[int, int]) -> None:
    """The main screen after `fill`, as `snap_compare` pins it; the gate closed after."""

    async def run_before(pilot: Pilot) -> None:
        await fill(gate, app)
        await pilot.pause()

    try:
        assert snap_compare(app, terminal_size=size, run_before=run_before)
    finally:
        close(gate)


@pytest.mark.parametrize("size", [(80, 24), (160, 48)], ids=["80x24", "160x48"])
def test_main_screen_snapshot(snap_compare, utc, frozen_tick_timer, size: tuple[int, int]) -> None:
    gate = make_gate()
    app = TokengateApp(InProcessLink(gate), interval_s=3600.0, clock=lambda: FIXED_NOW)

    assert_snapshot(snap_compare, gate, app, size)


@pytest.mark.parametrize("size", [(80, 24), (120, 40)], ids=["80x24", "120x40"])
def test_attached_main_screen_snapshot(snap_compare, utc, frozen_tick_timer, size: tuple[int, int]) -> None:
    """As `tokengate console --attach` draws it, the header naming the socket on its one row (a
    trial's 80x24 header had lost it and had blank rows under it); at 120x40 a console reattached
    to a restarted gate whose runtime overrides came back with it (a blank row came with them)."""
    import dataclasses

    from gate.data.commands import Freeze, Retune

    gate = make_gate()
    link = InProcessLink(gate)
    link.info = dataclasses.replace(link.info, embedded=False, where="/run/tokengate/tokengate.sock" if size[0] > 80 else "tokengate.sock")
    if size[0] > 80:
        gate.control.execute(Retune(cls="interactive", class_changes={"ttft_objective_ms": 1500.0}), operator=gate.operator)
        gate.control.execute(Freeze(True), operator=gate.operator)
    app = TokengateApp(link, interval_s=3600.0, clock=lambda: FIXED_NOW)

    assert_snapshot(snap_compare, gate, app, size)
