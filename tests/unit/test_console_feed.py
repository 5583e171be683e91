"""SnapshotFeed: the consoles' snapshots, built at most every min_interval_s, encoded once, shared."""

from __future__ import annotations

import json

import pytest

from gate.config import parse_config
from gate.data.snapshot import GateSnapshot
from gate.data.wire import decode
from gate.ops.console_feed import SnapshotFeed
from tests.console.conftest import decision, record
from tests.fakes import GATE_CONFIG, fake_llama_transport


@pytest.fixture
async def gate():
    from gate.service import GateService

    g = GateService(parse_config(GATE_CONFIG), environ={"USER": "alice"}, transport=fake_llama_transport())
    await g.backends.probe_all()
    yield g
    for b in g.backends:
        b.gatekeeper.close()
    await g.client.aclose()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def counted(gate):
    calls = []

    def build(after: int, n: int) -> GateSnapshot:
        calls.append(after)
        return gate.snapshot(decisions_after=after, max_decisions=n)

    return build, calls


def read(line: bytes) -> tuple[dict, GateSnapshot]:
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    reply = json.loads(line)
    return reply, decode(GateSnapshot, reply["snapshot"])


async def test_a_reply_is_the_gate_snapshot_a_console_asked_for(gate):
    for _ in range(5):
        record(gate, decision("batch"))
    feed = SnapshotFeed(lambda after, n: gate.snapshot(decisions_after=after, max_decisions=n), clock=Clock())
    reply, snap = read(feed.reply({"any": "id"}, 2))
    assert reply["id"] == {"any": "id"} and reply["ok"] is True and reply["v"] == 1
    want = gate.snapshot(decisions_after=2)
    assert snap.decisions == want.decisions and len(snap.decisions) == 3
    assert snap.decisions_seq == 5
    assert snap.classes == want.classes and snap.backends == want.backends and snap.controller == want.controller


async def test_many_consoles_asking_often_cost_one_build_per_interval(gate):
    clock = Clock()
    build, calls = counted(gate)
    feed = SnapshotFeed(build, clock=clock, min_interval_s=0.25)
    for i in range(1000):  # 1,000 asks from 10 consoles within 0.2 s
        clock.now += 0.0002
        feed.reply(i, i % 10)
    assert len(calls) == 1
    clock.now += 0.25
    feed.reply(0, 0)
    assert len(calls) == 2


async def test_each_decision_is_encoded_once_and_every_console_gets_those_it_has_not_seen(gate):
    clock = Clock()
    build, calls = counted(gate)
    feed = SnapshotFeed(build, clock=clock, min_interval_s=0.25)
    for _ in range(3):
        record(gate, decision("batch"))
    _, first = read(feed.reply(1, 0))
    assert [d.request_id for d in first.decisions] == [r.request_id for r in gate.records.since(0, 10)]
    for _ in range(4):
        record(gate, decision("interactive"))
    _, stale = read(feed.reply(2, 3))  # within the interval: the last build, nothing new for this console
    assert stale.decisions == () and stale.decisions_seq == 3
    clock.now += 0.3
    _, fresh = read(feed.reply(3, 3))
    assert [d.cls for d in fresh.decisions] == ["interactive"] * 4 and fresh.decisions_seq == 7
    _, slow = read(feed.reply(4, 0))  # a console that saw nothing gets the whole ring, oldest first
    assert [d.request_id for d in slow.decisions] == [r.request_id for r in gate.records.since(0, 10)]
    assert calls == [0, 3]  # the second build asked only for the decisions the first did not have


async def test_the_ring_keeps_the_newest_max_decisions(gate):
    clock = Clock()
    feed = SnapshotFeed(lambda after, n: gate.snapshot(decisions_after=after, max_decisions=n), clock=clock, max_decisions=20)
    for _ in range(50):
        record(gate, decision("batch"))
    _, snap = read(feed.reply(1, 0))
    assert [d.request_id for d in snap.decisions] == [r.request_id for r in gate.records.since(0, 20)]
    assert len(snap.decisions) == 20


async def test_a_change_is_seen_at_the_next_ask(gate):
    clock = Clock()
    build, calls = counted(gate)
    feed = SnapshotFeed(build, clock=clock, min_interval_s=0.25)
    _, before = read(feed.reply(1, 0))
    gate.control.paused.add("batch")
    _, cached = read(feed.reply(2, 0))
    assert cached == before  # within the interval: the shared build
    feed.invalidate()
    _, after = read(feed.reply(3, 0))
    assert next(c for c in after.classes if c.name == "batch").paused
    assert len(calls) == 2
