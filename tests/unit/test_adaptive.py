"""Tests for gate/core/adaptive.py: nearest-rank p95 and the budget controller."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gate.core.adaptive import (
    BudgetController,
    Cause,
    ControllerSettings,
    FixedBudget,
    Move,
    has_demand,
    p95,
    percentile_nearest_rank,
)

SLO = 1.0  # seconds of p95 TTFT
LOW = 0.5 * SLO  # below open_below x SLO
OK = 1.0 * SLO  # between open_below and close_above x SLO: hold
HIGH = 2.0 * SLO  # above close_above x SLO


def make(**overrides: object) -> BudgetController:
    base: dict[str, object] = dict(min_tokens=1000, ceiling_tokens=100_000, slo_ttft_p95_s=SLO, min_samples=20)
    initial = overrides.pop("initial_budget", 10_000)
    base.update(overrides)
    return BudgetController(ControllerSettings(**base), initial_budget=initial)  # type: ignore[arg-type]


def feed(c: BudgetController, now: float, ttft: float | None, n: int = 20, tpot: float | None = None) -> None:
    for _ in range(n):
        c.observe(now, ttft, tpot)


# -- percentile --------------------------------------------------------------


def test_p95_of_twenty_values_is_the_nineteenth_smallest() -> None:
    # 0.95 * 20 is 19.000000000000004 in floats; a float ceil would pick the 20th.
    values = [float(i) for i in range(20, 0, -1)]
    assert p95(values) == 19.0


def test_p95_small_and_round_sizes() -> None:
    assert p95([7.0]) == 7.0
    assert p95([1.0, 2.0]) == 2.0
    assert p95([float(i) for i in range(1, 101)]) == 95.0
    assert p95([float(i) for i in range(1, 102)]) == 96.0  # ceil(95.95) = 96


def test_percentile_edges() -> None:
    assert percentile_nearest_rank([3.0, 1.0, 2.0], 100) == 3.0
    assert percentile_nearest_rank([3.0, 1.0, 2.0], 1) == 1.0
    with pytest.raises(ValueError):
        p95([])
    with pytest.raises(ValueError):
        percentile_nearest_rank([1.0], 0)
    with pytest.raises(ValueError):
        percentile_nearest_rank([1.0], 101)


@settings(max_examples=500, deadline=None)
@given(
    st.lists(st.floats(min_value=0.0, max_value=1e6), min_size=1, max_size=200),
    st.integers(min_value=1, max_value=100),
)
def test_percentile_is_the_smallest_value_covering_pct_percent(values, pct) -> None:
    r = percentile_nearest_rank(values, pct)
    n = len(values)
    assert r in values
    assert 100 * sum(v <= r for v in values) >= pct * n
    assert 100 * sum(v < r for v in values) < pct * n


# -- settings and small helpers ----------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [
        dict(min_tokens=0),
        dict(ceiling_tokens=0),
        dict(slo_ttft_p95_s=0.0),
        dict(slo_tpot_p95_s=-1.0),
        dict(window_s=0.0),
        dict(min_samples=0),
        dict(cooldown_s=-1.0),
        dict(increase=1.0),
        dict(decrease=1.0),
        dict(open_below=1.5, close_above=1.2),
        dict(smoothing=0.0),
        dict(smoothing=1.5),
        dict(max_samples=10),
    ],
)
def test_settings_reject_bad_values(bad: dict[str, object]) -> None:
    base: dict[str, object] = dict(min_tokens=1000, ceiling_tokens=10_000, slo_ttft_p95_s=1.0)
    base.update(bad)
    with pytest.raises(ValueError):
        ControllerSettings(**base)  # type: ignore[arg-type]


def test_has_demand_means_a_queue_or_a_budget_four_fifths_full() -> None:
    assert has_demand(queued=1, in_flight_tokens=0, budget=1000)
    assert has_demand(queued=0, in_flight_tokens=800, budget=1000)
    assert not has_demand(queued=0, in_flight_tokens=799, budget=1000)


def test_move_and_settings_are_frozen_and_causes_are_journal_strings() -> None:
    m = Move(0.0, 1, 2, Cause.OPEN, None, None, 0)
    with pytest.raises(AttributeError):
        m.new_budget = 3  # type: ignore[misc]
    assert [c.value for c in Cause] == ["open", "close", "manual", "ceiling_changed"]
    assert Cause.CEILING_CHANGED == "ceiling_changed"


# -- controller: examples ----------------------------------------------------


def test_initial_budget_defaults_to_the_ceiling_and_is_clamped() -> None:
    s = ControllerSettings(min_tokens=1000, ceiling_tokens=8000, slo_ttft_p95_s=1.0)
    assert BudgetController(s).budget == 8000
    assert BudgetController(s, initial_budget=10).budget == 1000
    assert BudgetController(s, initial_budget=10**9).budget == 8000


def test_a_ceiling_below_the_configured_minimum_wins() -> None:
    s = ControllerSettings(min_tokens=2048, ceiling_tokens=1024, slo_ttft_p95_s=1.0)
    c = BudgetController(s)
    assert (c.min_tokens, c.budget, c.ceiling_tokens) == (1024, 1024, 1024)
    c.check_invariants()


def test_no_move_until_the_window_holds_min_samples() -> None:
    c = make()
    feed(c, 0.0, HIGH, n=19)
    assert c.tick(1.0, demand=True) is None
    assert c.budget == 10_000 and c.p95_ttft_s is None
    feed(c, 1.0, HIGH, n=1)
    move = c.tick(1.0, demand=True)
    assert move == Move(1.0, 10_000, 8_000, Cause.CLOSE, HIGH, None, 20)


def test_high_latency_closes_by_the_decrease_factor() -> None:
    c = make()
    feed(c, 0.0, HIGH)
    assert c.tick(0.0, demand=False) is not None
    assert c.budget == 8000


def test_low_latency_opens_only_with_demand() -> None:
    c = make()
    feed(c, 0.0, LOW)
    assert c.tick(0.0, demand=False) is None
    assert c.budget == 10_000
    move = c.tick(1.0, demand=True)
    assert move is not None and move.cause is Cause.OPEN
    assert c.budget == 11_000


def test_latency_between_the_thresholds_holds() -> None:
    c = make()
    feed(c, 0.0, OK)
    assert c.tick(0.0, demand=True) is None
    assert c.budget == 10_000


def test_cool_down_separates_moves() -> None:
    c = make(cooldown_s=5.0)
    feed(c, 0.0, HIGH)
    assert c.tick(0.0, demand=True) is not None
    assert c.tick(4.999, demand=True) is None
    assert c.budget == 8000
    assert c.tick(5.0, demand=True) is not None
    assert c.budget == 6400


def test_samples_older_than_the_window_drop_out() -> None:
    c = make(window_s=30.0)
    feed(c, 0.0, HIGH)
    assert c.samples == 20
    assert c.tick(30.0, demand=True) is None  # the samples are exactly 30 s old
    assert c.samples == 0 and c.p95_ttft_s is None


def test_new_p95_is_smoothed_with_the_previous_one() -> None:
    c = make(window_s=1.0, smoothing=0.5)
    feed(c, 0.0, 1.0)
    c.tick(0.0, demand=False)
    assert c.p95_ttft_s == 1.0  # the first p95 is taken as it is
    feed(c, 1.0, 3.0)
    c.tick(1.0, demand=False)
    assert c.p95_ttft_s == 2.0  # 0.5 * 3.0 + 0.5 * 1.0


def test_smoothing_restarts_after_a_quiet_period() -> None:
    c = make(window_s=1.0)
    feed(c, 0.0, HIGH)
    c.tick(0.0, demand=False)
    c.tick(10.0, demand=False)
    assert c.p95_ttft_s is None
    feed(c, 20.0, LOW)
    c.tick(20.0, demand=False)
    assert c.p95_ttft_s == LOW  # the old overload does not leak in


def test_none_samples_are_ignored() -> None:
    c = make()
    feed(c, 0.0, None, n=100)
    assert c.samples == 0
    feed(c, 0.0, None, n=20, tpot=0.01)
    assert c.samples == 20
    assert c.tick(0.0, demand=True) is None  # TPOT alone has no SLO to steer by
    assert c.p95_tpot_s == 0.01  # but is shown


def test_tpot_over_its_slo_closes_even_with_good_ttft() -> None:
    c = make(slo_tpot_p95_s=0.05)
    feed(c, 0.0, LOW, tpot=0.2)
    move = c.tick(0.0, demand=True)
    assert move is not None and move.cause is Cause.CLOSE
    assert move.p95_tpot_s == 0.2 and move.p95_ttft_s == LOW


def test_opening_needs_every_configured_signal_ready_and_low() -> None:
    c = make(slo_tpot_p95_s=0.05)
    feed(c, 0.0, LOW)  # no TPOT samples yet
    assert c.tick(0.0, demand=True) is None
    feed(c, 0.0, LOW, tpot=0.04)  # 0.04 > 0.7 x 0.05
    assert c.tick(0.0, demand=True) is None
    c2 = make(slo_tpot_p95_s=0.05)
    feed(c2, 0.0, LOW, tpot=0.01)
    move = c2.tick(0.0, demand=True)
    assert move is not None and move.cause is Cause.OPEN


def test_a_small_budget_still_moves_by_at_least_one_token() -> None:
    c = make(min_tokens=1, ceiling_tokens=100, initial_budget=5)
    feed(c, 0.0, LOW)
    c.tick(0.0, demand=True)
    assert c.budget == 6  # 5 x 1.1 rounds down to 5
    c2 = make(min_tokens=1, ceiling_tokens=100, initial_budget=2)
    feed(c2, 0.0, HIGH)
    c2.tick(0.0, demand=True)
    assert c2.budget == 1


def test_a_move_blocked_by_a_bound_is_none_and_does_not_start_the_cool_down() -> None:
    c = make(initial_budget=100_000)
    feed(c, 0.0, LOW)
    assert c.tick(0.0, demand=True) is None
    assert c.last_move_ts == -math.inf
    c.observe(0.0, 100.0, None)  # one outlier lifts the p95 over the SLO
    feed(c, 0.0, HIGH, n=5)
    assert c.tick(0.0, demand=True) is not None  # no cool-down pending


def test_close_clamps_at_the_minimum() -> None:
    c = make(initial_budget=1100, cooldown_s=0.0)
    feed(c, 0.0, HIGH)
    assert c.tick(0.0, demand=True) == Move(0.0, 1100, 1000, Cause.CLOSE, HIGH, None, 20)
    assert c.tick(0.0, demand=True) is None


def test_frozen_controller_never_moves_but_manual_set_still_works() -> None:
    c = make()
    c.freeze()
    assert c.frozen
    feed(c, 0.0, HIGH)
    assert c.tick(0.0, demand=True) is None
    assert c.p95_ttft_s == HIGH  # still measured for display
    move = c.set_budget(1.0, 50_000)
    assert move.cause is Cause.MANUAL and c.budget == 50_000
    c.unfreeze()
    assert c.tick(3.0, demand=True) is None  # cool-down from the manual move
    assert c.tick(6.0, demand=True) is not None


def test_set_budget_is_clamped_always_recorded_and_starts_the_cool_down() -> None:
    c = make()
    assert c.set_budget(1.0, 10**9) == Move(1.0, 10_000, 100_000, Cause.MANUAL, None, None, 0)
    assert c.set_budget(2.0, 1) == Move(2.0, 100_000, 1000, Cause.MANUAL, None, None, 0)
    assert c.set_budget(3.0, 1000).old_budget == c.set_budget(3.0, 1000).new_budget
    assert c.last_move_ts == 3.0


def test_lower_ceiling_clamps_the_budget_and_may_pull_the_minimum_down() -> None:
    c = make(initial_budget=50_000)
    assert c.set_ceiling(1.0, 200_000) is None
    assert c.set_ceiling(1.0, 30_000) == Move(1.0, 50_000, 30_000, Cause.CEILING_CHANGED, None, None, 0)
    assert c.set_ceiling(2.0, 500) is not None
    assert (c.min_tokens, c.budget, c.ceiling_tokens) == (500, 500, 500)
    # Capacity back: the configured minimum applies again.
    move = c.set_ceiling(3.0, 100_000)
    assert move is not None and move.new_budget == 1000
    with pytest.raises(ValueError):
        c.set_ceiling(4.0, 0)


def test_set_ceiling_applies_even_when_frozen_or_cooling_down() -> None:
    c = make(initial_budget=50_000)
    c.freeze()
    c.set_budget(0.0, 60_000)
    assert c.set_ceiling(0.1, 40_000) is not None
    assert c.budget == 40_000


def test_set_bounds_retunes_the_minimum() -> None:
    c = make(initial_budget=5000)
    move = c.set_bounds(1.0, min_tokens=6000)
    assert move is not None and move.cause is Cause.MANUAL and c.budget == 6000
    assert c.set_bounds(2.0, min_tokens=100, ceiling_tokens=5000) == Move(2.0, 6000, 5000, Cause.MANUAL, None, None, 0)
    assert (c.min_tokens, c.ceiling_tokens) == (100, 5000)
    with pytest.raises(ValueError):
        c.set_bounds(3.0, min_tokens=0)


@pytest.mark.parametrize("value", [-0.1, math.nan, math.inf])
def test_observe_rejects_impossible_latencies(value: float) -> None:
    c = make()
    with pytest.raises(ValueError):
        c.observe(0.0, value, None)
    with pytest.raises(ValueError):
        c.observe(0.0, None, value)


def test_window_memory_is_bounded() -> None:
    c = make(max_samples=100, min_samples=20)
    for i in range(10_000):
        c.observe(i * 0.001, LOW, None)
    assert c.samples == 100
    c.check_invariants()


def test_out_of_order_samples_keep_the_window_in_time_order() -> None:
    c = make()
    c.observe(10.0, LOW, None)
    c.observe(9.0, LOW, None)
    c.check_invariants()


# -- controller: properties --------------------------------------------------


@st.composite
def controller_settings(draw: st.DrawFn, *, cooldown: bool = True) -> ControllerSettings:
    lo = draw(st.integers(min_value=1, max_value=50_000))
    hi = draw(st.integers(min_value=lo, max_value=100_000))
    open_below = draw(st.floats(min_value=0.3, max_value=0.95))
    return ControllerSettings(
        min_tokens=lo,
        ceiling_tokens=hi,
        slo_ttft_p95_s=draw(st.floats(min_value=0.05, max_value=5.0)),
        slo_tpot_p95_s=draw(st.one_of(st.none(), st.floats(min_value=0.01, max_value=0.5))),
        window_s=draw(st.floats(min_value=5.0, max_value=60.0)),
        min_samples=draw(st.integers(min_value=1, max_value=20)),
        cooldown_s=draw(st.floats(min_value=0.0, max_value=10.0)) if cooldown else 0.0,
        increase=draw(st.floats(min_value=1.05, max_value=2.0)),
        decrease=draw(st.floats(min_value=0.5, max_value=0.95)),
        open_below=open_below,
        close_above=draw(st.floats(min_value=max(1.0, open_below), max_value=2.0)),
        smoothing=draw(st.floats(min_value=0.05, max_value=1.0)),
        max_samples=draw(st.integers(min_value=20, max_value=200)),
    )


# Latencies as multiples of the SLO, clustered so that windows are often
# clearly low (opens), clearly high (closes) or in between (holds).
latency_multiples = st.one_of(st.sampled_from([0.0, 0.2, 0.5, 1.0, 2.0, 3.0]), st.floats(min_value=0.0, max_value=3.0))
# Time steps: mostly short, as between requests, sometimes long enough to
# empty the window or end a cool-down.
time_steps = st.one_of(st.sampled_from([0.0, 0.5, 1.0]), st.floats(min_value=0.0, max_value=10.0))


def _op(name: str, value: st.SearchStrategy[float], counts: st.SearchStrategy[int]) -> st.SearchStrategy:
    # (op, value, samples to observe first, dt, demand)
    return st.tuples(st.just(name), value, counts, time_steps, st.booleans())


_none = st.just(0.0)
controller_ops = st.lists(
    st.one_of(
        # Observing and ticking dominate, as in service: a tick follows a burst.
        _op("tick", latency_multiples, st.integers(min_value=0, max_value=25)),
        _op("tick", latency_multiples, st.integers(min_value=0, max_value=25)),
        _op("tick", latency_multiples, st.integers(min_value=0, max_value=25)),
        _op("observe", latency_multiples, st.integers(min_value=1, max_value=25)),
        _op("set_budget", st.integers(min_value=0, max_value=120_000).map(float), st.just(0)),
        _op("set_ceiling", st.integers(min_value=1, max_value=120_000).map(float), st.just(0)),
        # value > 0.75 freezes, else unfreezes: mostly thawed, so freezing hides little.
        _op("freeze", st.floats(min_value=0.0, max_value=1.0), st.just(0)),
    ),
    min_size=5,
    max_size=40,
)
# Initial budget as a fraction of [min, ceiling]; a little outside tests clamping.
initial_fraction = st.floats(min_value=-0.1, max_value=1.1)


def initial_budget(s: ControllerSettings, fraction: float) -> int:
    return round(s.min_tokens + fraction * (s.ceiling_tokens - s.min_tokens))


@settings(max_examples=500, deadline=None)
@given(controller_settings(), initial_fraction, controller_ops)
def test_controller_keeps_its_invariants_under_any_sequence(s, fraction, ops) -> None:
    c = BudgetController(s, initial_budget=initial_budget(s, fraction))
    c.check_invariants()
    now = 0.0
    last_move = -math.inf
    for op, value, count, dt, demand in ops:
        now += dt
        for _ in range(count):
            tpot = None if s.slo_tpot_p95_s is None else value * s.slo_tpot_p95_s
            c.observe(now, value * s.slo_ttft_p95_s, tpot)
        before = c.budget
        if op == "tick":
            move = c.tick(now, demand=demand)
            if move is None:
                assert c.budget == before
            else:
                assert now - last_move >= s.cooldown_s  # no move within the cool-down
                assert not c.frozen  # frozen never moves
                assert move.cause in (Cause.OPEN, Cause.CLOSE)
                if c.samples < s.min_samples:  # a reopen on few samples: never blind, every one low
                    assert move.cause is Cause.OPEN and c.samples >= 1 and move.p95_ttft_s is None
                    assert move.largest_ttft_s is not None and move.largest_ttft_s < s.open_below * s.slo_ttft_p95_s
                else:
                    assert move.largest_ttft_s is None
                if move.cause is Cause.OPEN:
                    assert demand  # never opens without demand
                    assert move.new_budget > move.old_budget
                else:
                    assert move.new_budget < move.old_budget
                assert (move.ts, move.old_budget, move.new_budget) == (now, before, c.budget)
                last_move = now
        elif op == "set_budget":
            move = c.set_budget(now, int(value))
            assert move.cause is Cause.MANUAL and move.new_budget == c.budget
            last_move = now
        elif op == "set_ceiling":
            move = c.set_ceiling(now, int(value))
            if move is None:
                assert c.budget == before
            else:
                assert move.cause is Cause.CEILING_CHANGED and move.new_budget != before
                last_move = now
        elif op == "freeze":
            c.freeze() if value > 0.75 else c.unfreeze()
        else:
            assert c.budget == before  # observing alone never moves
        c.check_invariants()
        assert c.min_tokens <= c.budget <= c.ceiling_tokens


@settings(max_examples=500, deadline=None)
@given(controller_settings(), initial_fraction, controller_ops)
def test_frozen_controller_moves_only_by_hand(s, fraction, ops) -> None:
    c = BudgetController(s, initial_budget=initial_budget(s, fraction))
    c.freeze()
    now = 0.0
    for op, value, count, dt, demand in ops:
        now += dt
        for _ in range(count):
            c.observe(now, value * s.slo_ttft_p95_s, value * (s.slo_tpot_p95_s or 0.1))
        before = c.budget
        if op == "tick":
            assert c.tick(now, demand=demand) is None
        elif op == "set_budget":
            c.set_budget(now, int(value))
            continue
        # set_ceiling and unfreeze are skipped: only a manual set may move it.
        assert c.budget == before
    assert c.frozen


@settings(max_examples=500, deadline=None)
@given(controller_settings(), st.integers(0, 120_000), st.floats(min_value=1.25, max_value=10.0))
def test_sustained_high_latency_drives_the_budget_to_the_minimum_monotonically(s, initial, factor) -> None:
    c = BudgetController(s, initial_budget=initial)
    # Step by a whole window so each tick sees only fresh samples; whole
    # seconds keep `now - last_move` exact in floats.
    step = float(math.ceil(max(s.window_s, s.cooldown_s)))
    now = 0.0
    for _ in range(400):
        for _ in range(s.min_samples):
            c.observe(now, factor * close_ttft(s), None)
        before = c.budget
        move = c.tick(now, demand=True)
        assert c.budget <= before
        assert move is None or move.cause is Cause.CLOSE
        if c.budget == s.min_tokens:
            break
        assert move is not None  # above the minimum, every tick closes
        now += step
    assert c.budget == s.min_tokens


@settings(max_examples=500, deadline=None)
@given(controller_settings(), st.integers(0, 120_000), st.floats(min_value=0.0, max_value=0.99))
def test_low_latency_with_demand_drives_the_budget_to_the_ceiling_monotonically(s, initial, factor) -> None:
    c = BudgetController(s, initial_budget=initial)
    step = float(math.ceil(max(s.window_s, s.cooldown_s)))
    now = 0.0
    for _ in range(400):
        tpot = None if s.slo_tpot_p95_s is None else factor * s.open_below * s.slo_tpot_p95_s
        for _ in range(s.min_samples):
            c.observe(now, factor * s.open_below * s.slo_ttft_p95_s, tpot)
        before = c.budget
        move = c.tick(now, demand=True)
        assert c.budget >= before
        if c.budget == s.ceiling_tokens:
            break
        assert move is not None and move.cause is Cause.OPEN
        now += step
    assert c.budget == s.ceiling_tokens


def close_ttft(s: ControllerSettings) -> float:
    return s.close_above * s.slo_ttft_p95_s


@settings(max_examples=500, deadline=None)
@given(controller_settings(), st.integers(min_value=0, max_value=19), st.booleans())
def test_with_fewer_than_min_samples_it_never_closes_and_opens_only_on_every_sample_low(s, short, demand) -> None:
    """Never closes on fewer than min_samples; opens on fewer only with demand and at least one
    sample, every one under open_below x SLO (one sample at it holds the budget)."""
    n = min(short, s.min_samples - 1)
    for latency in (0.0, 10.0 * s.slo_ttft_p95_s, s.open_below * s.slo_ttft_p95_s):
        c = BudgetController(s, initial_budget=(s.min_tokens + s.ceiling_tokens) // 2)
        before = c.budget
        for i in range(n):
            low = 0.0 if i else latency  # one sample at `latency`, the others 0
            c.observe(0.0, low, low if s.slo_tpot_p95_s is None else 0.0)
        move = c.tick(0.0, demand=demand)
        if latency == 0.0 and demand and n >= 1 and before < s.ceiling_tokens:
            assert move is not None and move.cause is Cause.OPEN and c.budget > before
        else:
            assert move is None and c.budget == before


def test_a_budget_closed_to_its_floor_reopens_on_a_trickle_of_fast_first_tokens() -> None:
    """A trial: an overload closed the budget to its floor, then only batch came, one request
    per aging_s by its turn, 4-6 first tokens a window: never min_samples again, and the budget
    stayed at the floor 14 minutes with every slot idle. A trickle of fast ones reopens it, a
    cool-down apart, up to the ceiling; one slow sample among them holds it; none holds it."""
    c = make(min_tokens=1000, ceiling_tokens=2000, initial_budget=2000, cooldown_s=5.0, increase=1.25)
    feed(c, 0.0, HIGH)
    t = 0.0
    while c.budget > 1000:
        move = c.tick(t, demand=True)
        t += 5.0
    assert c.budget == 1000 and move is not None and move.cause is Cause.CLOSE
    t += 60.0  # the overload's samples are out of the window
    assert c.tick(t, demand=True) is None and c.budget == 1000  # no sample: never opens blind
    c.observe(t, LOW, None)
    c.observe(t, HIGH, None)  # one slow one among a few: holds
    assert c.tick(t, demand=True) is None and c.budget == 1000
    t += 60.0
    budgets = []
    for _ in range(10):
        c.observe(t, LOW, None)
        assert c.tick(t, demand=False) is None  # no demand: traffic, not the budget, holds it
        move = c.tick(t, demand=True)
        if move is not None:
            assert move.p95_ttft_s is None and move.largest_ttft_s == LOW and move.samples < 20
        budgets.append(c.budget)
        t += 5.0
    assert budgets[:4] == [1250, 1562, 1952, 2000] and c.budget == 2000


def test_a_reopen_on_few_samples_is_audited_with_the_largest_first_token() -> None:
    """The audit row says why the budget moved with no p95: "p95 TTFT n/a" said nothing."""
    from gate.observe.metrics import GateMetrics
    from gate.observe.recorder import Recorder

    recorder = Recorder(GateMetrics(), gate_id="host:1:t", clock=lambda: 0.0)
    recorder.budget_moved("default", Move(5.0, 1024, 1126, Cause.OPEN, None, None, 1, largest_ttft_s=0.038), 2000.0)
    recorder.budget_moved("default", Move(10.0, 1126, 1238, Cause.OPEN, None, None, 14, largest_ttft_s=0.053), 2000.0)
    recorder.budget_moved("default", Move(15.0, 1238, 990, Cause.CLOSE, 2.6, None, 20), 2000.0)
    notes = [(a.action, a.note) for a in recorder.recent_audit]
    assert notes == [
        ("budget_open", "largest TTFT 38 ms vs SLO 2000 ms over 1 sample, too few for a p95: it is well under it, so the budget reopens"),
        (
            "budget_open",
            "largest TTFT 53 ms vs SLO 2000 ms over 14 samples, too few for a p95: every one well under it, so the budget reopens",
        ),
        ("budget_close", "p95 TTFT 2600 ms vs SLO 2000 ms over 20 samples"),
    ]


@settings(max_examples=200, deadline=None)
@given(
    asked=st.integers(1, 200_000),
    how=st.sampled_from(["set", "freeze", "fixed"]),
    ceilings=st.lists(st.integers(1, 200_000), min_size=1, max_size=8),
    floors=st.lists(st.one_of(st.none(), st.integers(1, 50_000)), min_size=8, max_size=8),
)
def test_an_operators_budget_comes_back_when_the_bounds_allow_it(asked, how, ceilings, floors) -> None:
    # invariant 7: a trial froze 1,200 on a 2,048 pool, restarted llama-server at 1,024 and again
    # at 2,048, and the budget stayed at 1,024 for good while the console said 1,200
    if how == "fixed":
        c: BudgetController = FixedBudget(ControllerSettings(min_tokens=1000, ceiling_tokens=200_000, slo_ttft_p95_s=SLO), asked)
    else:
        c = make(ceiling_tokens=200_000)
        if how == "set":
            c.freeze()
            c.set_budget(0.0, asked)
        else:
            c.set_budget(0.0, asked)
            c.freeze()
            asked = c.budget  # frozen where it stood
    floor = 1000
    for i, (ceiling, new_floor) in enumerate(zip(ceilings, floors)):
        c.set_ceiling(float(i + 1), ceiling, new_floor, reseat=bool(i % 2))
        floor = new_floor or floor
        c.check_invariants()
        low = min(floor, ceiling)
        assert c.budget == max(low, min(ceiling, asked)), (c.budget, asked, ceiling, floor)
    # an unfrozen controller moves by itself: nothing is asked of it
    if how != "fixed":
        c.unfreeze()
        assert c.asked is None
