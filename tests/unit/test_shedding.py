"""Shedding judges progress: the decode meter and the deadline rule (pure, no clock)."""

from __future__ import annotations

import pytest

from gate.core.reasons import Reason
from gate.core.shedding import DecodeMeter, next_deadline


def run_streams(meter: DecodeMeter, streams: int, tps: float, seconds: float, start: float = 0.0) -> float:
    """`streams` streams each delivering `tps` tokens/s, one token at a time, for `seconds`."""
    for _ in range(streams):
        meter.start(start)
    t = start
    step = 1.0 / tps
    while t < start + seconds:
        t += step
        for _ in range(streams):
            meter.add(t, 1)
    return t


@pytest.mark.parametrize("streams", [1, 4, 8])
def test_meter_reads_the_per_slot_rate_whatever_the_occupancy(streams):
    meter = DecodeMeter()
    now = run_streams(meter, streams, tps=40.0, seconds=3.0)
    assert meter.per_slot_tps(now) == pytest.approx(40.0, rel=0.05)


def test_meter_stays_right_when_most_streams_end():
    # 8 streams at 20 tok/s, 7 end; the last one alone must not be judged at 8 x 20.
    meter = DecodeMeter()
    now = run_streams(meter, 8, tps=20.0, seconds=3.0)
    for _ in range(7):
        meter.stop(now)
    for i in range(10):
        meter.add(now + (i + 1) / 20.0, 1)
    assert meter.per_slot_tps(now + 0.5) == pytest.approx(20.0, rel=0.1)


def test_meter_says_nothing_without_recent_tokens():
    meter = DecodeMeter()
    assert meter.per_slot_tps(0.0) is None
    now = run_streams(meter, 2, tps=50.0, seconds=2.0)
    meter.stop(now)
    meter.stop(now)
    assert meter.per_slot_tps(now + 60.0) is None


def deadline(**kw):
    args = dict(
        dispatched_at=0.0,
        first_token_at=None,
        last_token_at=None,
        max_tokens=300,
        per_slot_tps=None,
        factor=2.5,
        stall_s=10.0,
        timeout_s=600.0,
    )
    args.update(kw)
    return next_deadline(**args)


def test_no_first_token_within_stall_is_a_shed():
    d = deadline()
    assert (d.at, d.reason) == (10.0, Reason.SHED_OVERRUN)
    assert "first token" in d.message


def test_progress_moves_the_stall_deadline():
    d = deadline(first_token_at=1.0, last_token_at=30.0)
    assert (d.at, d.reason) == (40.0, Reason.SHED_OVERRUN)


def test_sharing_busy_slots_is_not_overrunning():
    # 300 tokens at the CURRENT 10 tok/s per slot (8 slots busy): 30 s expected, shed at 2.5 x 31 s.
    d = deadline(first_token_at=1.0, last_token_at=29.0, per_slot_tps=10.0, stall_s=60.0)
    assert d.at == pytest.approx(2.5 * 31.0)
    assert d.at > 31.0  # a request at the shared rate finishes long before


def test_far_past_the_current_rate_is_a_shed():
    d = deadline(first_token_at=0.5, last_token_at=9.0, per_slot_tps=100.0, stall_s=60.0)
    assert d.reason is Reason.SHED_OVERRUN
    assert d.at == pytest.approx(2.5 * 3.5)
    assert "current decode rate" in d.message


def test_request_timeout_comes_first_when_shorter_and_says_so():
    d = deadline(timeout_s=1.0)
    assert (d.at, d.reason) == (1.0, Reason.UPSTREAM_TIMEOUT)
    assert "request_timeout_s=1" in d.message


def test_a_plain_call_is_judged_by_the_clock_not_by_tokens_it_cannot_see():
    # No token ever arrives on a plain (non-streamed) call: no stall verdict after stall_s...
    d = deadline(blind=True, stall_s=10.0)
    assert (d.at, d.reason) == (600.0, Reason.UPSTREAM_TIMEOUT)
    # ...but far past what the current rate allows for the first token and max_tokens, a shed.
    d = deadline(blind=True, stall_s=10.0, per_slot_tps=10.0)
    assert (d.at, d.reason) == (pytest.approx(2.5 * (10.0 + 30.0)), Reason.SHED_OVERRUN)
    assert "plain upstream call" in d.message
