"""Console fixtures: a REAL GateService on a fake llama-server transport (no HTTP server),
and a TokengateApp with a fixed clock and a tick interval long enough that tests tick by hand."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from console.app import TokengateApp
from gate.data.records import DecisionRecord
from gate.observe.gpu import GpuDevice, GpuReading
from gate.ops.link import InProcessLink
from gate.service import GateService
from tests.fakes import GATE_CONFIG, gate_on_fake_llama

FIXED_NOW = 1_767_225_600.0  # 2026-01-01 00:00:00 UTC
ENVIRON = {"USER": "alice", "SSH_CONNECTION": "10.1.2.3 51000 10.0.0.1 22"}

CONFIG = GATE_CONFIG

SLOTS = [
    {"id": 0, "n_ctx": 2048, "is_processing": True, "n_prompt_tokens": 812, "next_token": {"n_decoded": 40}},
    {"id": 1, "n_ctx": 2048, "is_processing": False, "n_prompt_tokens": 300, "next_token": {"n_decoded": 0}},
    {"id": 2, "n_ctx": 2048, "is_processing": True, "n_prompt_tokens": 1900, "next_token": {"n_decoded": 400}},
    {"id": 3, "n_ctx": 2048, "is_processing": False, "n_prompt_tokens": 0, "next_token": {"n_decoded": 0}},
]


@pytest.fixture
async def gate():
    async with gate_on_fake_llama(CONFIG, environ=ENVIRON, slots=SLOTS) as g:
        yield g


def make_app(gate: GateService, **kwargs) -> TokengateApp:
    """The console on an in-process link to `gate` (same loop: tests drive both)."""
    kwargs.setdefault("interval_s", 3600.0)
    kwargs.setdefault("clock", lambda: FIXED_NOW)
    read_only = kwargs.get("read_only", False)
    return TokengateApp(InProcessLink(gate, read_only=read_only), **kwargs)


def messages(app: TokengateApp) -> list[str]:
    """The toasts shown so far (message text)."""
    return [n.message for n in app._notifications]


def severities(app: TokengateApp) -> list[str]:
    return [n.severity for n in app._notifications]


_ids = itertools.count()


def decision(
    cls: str = "batch",
    *,
    tenant: str = "acme",
    outcome: str = "admitted",
    reason: str = "ok",
    status: int = 200,
    ts: float = FIXED_NOW,
    ttft_ms: float | None = 120.0,
    queue_ms: float = 3.0,
) -> DecisionRecord:
    """A finished request; its first token from arrival is its wait plus its `ttft_ms` (from dispatch)."""
    n = next(_ids)
    return DecisionRecord(
        ts=ts,
        request_id=f"req-{n:05d}",
        tenant=tenant,
        cls=cls,
        backend="default",
        endpoint="/v1/chat/completions",
        stream=True,
        prompt_tokens=100 + n,
        token_count_source="exact",
        max_tokens=256,
        reserved_tokens=356 + n,
        outcome=outcome,
        reason=reason,
        http_status=status,
        queue_ms=queue_ms,
        ttft_ms=ttft_ms,
        duration_ms=900.0,
        completion_tokens=50,
        budget_at_decision=8192,
        in_flight_at_decision=1000,
        ttft_arrival_ms=None if ttft_ms is None else queue_ms + ttft_ms,
    )


def record(gate: GateService, rec: DecisionRecord) -> None:
    gate.record(rec, model=None, queued_s=None, ttft_s=None if rec.ttft_ms is None else rec.ttft_ms / 1000)


async def enrich(gate: GateService) -> None:
    """Telemetry, a GPU reading, decisions and denials: what a busy gate shows."""
    gate._on_telemetry(await gate.telemetry_poller.poll_once())
    gate.gpu_reading = GpuReading(devices=(GpuDevice(0, "NVIDIA H200", 61 * 2**30, 140 * 2**30, None, 44, ()),), unavailable=None)
    for i in range(30):
        record(gate, decision("interactive" if i % 3 else "batch", tenant=f"team{i % 4}", ts=FIXED_NOW - 30 + i))
    for i in range(5):
        record(gate, decision("batch", outcome="refused", reason="queue_full", status=429, ttft_ms=None, ts=FIXED_NOW - 5 + i))


class Queue:
    """Fills every slot with holders, then queues `n` waiters of `cls` in the real gatekeeper."""

    def __init__(self, gate: GateService, cls: str, n: int) -> None:
        self.gate, self.cls, self.n = gate, cls, n
        self.holders: list = []
        self.waiters: list[asyncio.Task] = []

    async def __aenter__(self) -> Queue:
        from gate.core.ledger import Request

        gk = self.gate.backends.backends[0].gatekeeper
        self.holders = [await gk.acquire(Request(f"h{i}", self.cls, "t", 10, 10, 0.0)) for i in range(4)]
        self.waiters = [asyncio.create_task(gk.acquire(Request(f"w{i}", self.cls, "t", 10, 10, 0.0))) for i in range(self.n)]
        await asyncio.sleep(0)
        return self

    async def __aexit__(self, *exc) -> None:
        gk = self.gate.backends.backends[0].gatekeeper
        for w in self.waiters:
            w.cancel()
        await asyncio.gather(*self.waiters, return_exceptions=True)
        for h in self.holders:
            gk.release(h)


def type_ahead(app, *keys: str) -> None:
    """Queue `keys` at the app all at once, as one read of the terminal delivers them (a paste,
    `tmux send-keys` with several keys, typing ahead over a laggy link); `pilot.press` instead
    waits for each key's effect before sending the next, and hid keys landing out of order."""
    from textual import events
    from textual.keys import _character_to_key

    for key in keys:
        name = _character_to_key(key) if len(key) == 1 and not key.isalnum() else key
        event = events.Key(name, key if len(key) == 1 else None)
        event.set_sender(app)
        app.post_message(event)


async def settle(pilot, turns: int = 100) -> None:
    """Until the app and every widget of its screen have emptied their message queues: the keys
    typed ahead and what they caused (a key bubbling up to its binding, Input.Changed, ...)."""
    app = pilot.app
    for _ in range(turns):
        await pilot.pause()
        if all(node._message_queue.empty() for node in (app, *app.screen.walk_children(with_self=True))):
            return
    raise AssertionError(f"the app kept messages queued after {turns} pauses")
