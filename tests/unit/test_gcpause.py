"""GcPauses: the collector's pauses of the gate's loop, timed from CPython's gc.callbacks."""

from __future__ import annotations

import gc

import pytest

from gate.observe.gcpause import GcPauses
from gate.observe.looplag import LoopLagMonitor


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def collect(pauses: GcPauses, clock: Clock, generation: int, seconds: float) -> None:
    """One collection of `seconds`, as CPython reports it."""
    pauses.on_gc("start", {"generation": generation})
    clock.now += seconds
    pauses.on_gc("stop", {"generation": generation, "collected": 0, "uncollectable": 0})


def test_a_real_full_collection_is_counted_while_installed_and_not_after():
    pauses = GcPauses()
    pauses.install()
    try:
        pauses.install()  # once only, however often asked
        assert gc.callbacks.count(pauses.on_gc) == 1
        gc.collect(2)
        assert pauses.count[2] >= 1 and pauses.total_s[2] > 0.0
        assert pauses.longest(2) > 0.0
    finally:
        pauses.uninstall()
    assert pauses.on_gc not in gc.callbacks
    before = pauses.count[2]
    gc.collect(2)
    assert pauses.count[2] == before


def test_each_generation_keeps_its_count_total_and_longest_pause_of_the_last_minute():
    clock = Clock()
    pauses = GcPauses(clock=clock, window_s=60.0)
    collect(pauses, clock, 0, 0.001)
    collect(pauses, clock, 2, 0.700)
    collect(pauses, clock, 0, 0.003)
    assert pauses.count == [2, 0, 1]
    assert pauses.total_s[0] == pytest.approx(0.004) and pauses.total_s[2] == pytest.approx(0.7)
    assert pauses.longest(0) == pytest.approx(0.003) and pauses.longest(1) == 0.0 and pauses.longest(2) == pytest.approx(0.7)
    clock.now += 61.0  # a minute on: the longest is forgotten, the totals are not
    assert pauses.longest(2) == 0.0 and pauses.total_s[2] == pytest.approx(0.7)


def test_a_stop_without_its_start_counts_nothing():
    """Installed while a collection ran: its end alone is no pause."""
    pauses = GcPauses(clock=Clock())
    pauses.on_gc("stop", {"generation": 2})
    assert pauses.count == [0, 0, 0] and not any(pauses.recent)


def test_young_collections_never_push_a_full_one_out_of_the_last_minute():
    """Generation 0 runs hundreds of times a second under load; the bound on what is kept is
    per generation, so the minute's longest full collection is still there."""
    clock = Clock()
    pauses = GcPauses(clock=clock, keep=16)
    collect(pauses, clock, 2, 0.300)
    for _ in range(100):
        collect(pauses, clock, 0, 0.0001)
    assert pauses.longest(2) == pytest.approx(0.3) and len(pauses.recent[0]) == 16


def test_within_gives_the_collectors_share_of_a_stretch_and_its_deepest_generation():
    clock = Clock()
    pauses = GcPauses(clock=clock)
    collect(pauses, clock, 1, 0.010)  # ends at 100.010, before the stall
    clock.now = 101.0
    stall_from = clock.now
    collect(pauses, clock, 0, 0.002)
    collect(pauses, clock, 2, 0.500)
    clock.now += 0.040
    seconds, generation = pauses.within(stall_from, clock.now)
    assert seconds == pytest.approx(0.502) and generation == 2
    assert pauses.within(101.6, 102.0) == (0.0, -1)  # nothing ended then


def test_the_loop_lag_warning_says_how_much_of_a_stall_was_garbage_collection():
    clock = Clock()
    pauses = GcPauses(clock=clock)
    monitor = LoopLagMonitor(clock=clock, gc_pauses=pauses)
    due = clock.now
    collect(pauses, clock, 2, 0.540)
    clock.now += 0.010
    assert monitor._cause(due, clock.now) == "; 0.54 s of it in garbage collection (generation 2)"
    assert monitor._cause(clock.now, clock.now + 0.6) == "; no garbage collection ran meanwhile"
    assert LoopLagMonitor(clock=clock)._cause(due, clock.now) == ""
