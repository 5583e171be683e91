"""T1 refuses at arrival a newcomer unlikely to make its objective (#25): the chance of a slot in
time, from the spread of the measured holds (gate/core/waits.chance_in_time).

On the mean alone, a newcomer expected to make it on average was queued, and against
llama-server, whose holds spread, most of those were refused after a wait (38 of 44 refusals
at 3x, p95 1.9 s; the target is p95 under 50 ms)."""

from __future__ import annotations

import math
from bisect import bisect_right
from itertools import product

from hypothesis import assume, given
from hypothesis import strategies as st

from gate.core.admission import IN_TIME_CHANCE, Admission, Admit, Capacity, Queue, Refuse, check_invariants
from gate.core.reasons import Reason
from gate.core.waits import chance_in_time, remaining, wait_at
from gate.tools import overload_sim as sim
from tests.unit.core_helpers import Cls, req
from tests.unit.test_admission_levers import EXAMPLES
from tests.unit.test_ttft_guard import CAPACITY_RPS, OBJECTIVE_S, SLOTS, TTFT_S, chat, overload, targets

# ---- the chance, against oracles ------------------------------------------------------------


@EXAMPLES
@given(
    hold=st.floats(0.1, 5.0),
    n=st.integers(1, 8),
    ages=st.lists(st.floats(0.0, 6.0), max_size=4),
    slots=st.integers(1, 4),
    position=st.integers(0, 12),
    within=st.floats(0.0, 12.0),
)
def test_with_holds_of_one_length_the_chance_is_the_means_wait_met_or_not(hold, n, ages, slots, position, within):
    ages = [a for a in ages[:slots] if a < hold]  # held past every hold: see the test below
    frees = remaining((-a for a in ages), hold, 0.0, slots)  # held since -a: held a seconds at 0
    wait = wait_at(position, frees, hold)
    assume(abs(wait - within) > 1e-6)  # not on the boundary, where rounding decides
    assert chance_in_time(position, within, ages, [hold] * n, slots) == (1.0 if wait <= within else 0.0)


def reference_chance(position, within_s, ages, holds, slots, enough=None):
    """waits.chance_in_time as first written (#25): the convolution as a loop over (j, m) pairs.
    The core's list passes must give the same floats (#24 made it ~3x faster). (What is left
    after a slot's first free: since 2026-12-05 after its expected first free, as the core.)"""
    if within_s < 0:
        return 0.0
    need, n = position + 1, len(holds)
    dist = [1.0] + [0.0] * need
    reach = 0
    ages = list(ages)[: max(0, slots)]
    if need <= slots - len(ages):
        return 1.0
    for age in ages + [None] * max(0, slots - len(ages)):
        if age is None:
            first, rest = 1.0, within_s
        elif (at := bisect_right(holds, age)) == n:
            mean = sum(holds) / n
            first, rest = 1.0 - math.exp(-within_s / max(1e-9, mean)), within_s - mean
        else:
            ends = bisect_right(holds, age + within_s) - at
            first = ends / (n - at)
            rest = within_s - (sum(holds[at:]) / (n - at) - age) if ends else 0.0
        at_least = [1.0, first]
        for m in range(2, need + 1):
            if at_least[-1] <= 0.0 or rest <= 0.0:
                break
            at_least.append(first * bisect_right(holds, rest / (m - 1)) / n)
        at_least.append(0.0)
        nxt = [0.0] * (need + 1)
        for j in range(reach + 1):
            pj = dist[j]
            if pj == 0.0:
                continue
            for m in range(len(at_least) - 1):
                q = at_least[m] - at_least[m + 1]
                if q > 0.0:
                    nxt[min(need, j + m)] += pj * q
        dist = nxt
        reach = min(need, reach + len(at_least) - 2)
        if dist[need] >= 1.0 or (enough is not None and dist[need] >= enough):
            break
    return min(1.0, dist[need])


@EXAMPLES
@given(
    holds=st.lists(st.floats(0.01, 20.0), min_size=1, max_size=40),
    ages=st.lists(st.floats(0.0, 30.0), max_size=40),
    slots=st.integers(1, 40),
    position=st.integers(0, 80),
    within=st.floats(-1.0, 60.0),
    enough=st.sampled_from([None, 0.5, IN_TIME_CHANCE]),
)
def test_the_chance_is_the_reference_loops_to_the_bit(holds, ages, slots, position, within, enough):
    """Exact to the bit; with `enough`, exact below it and at least it otherwise (the reference
    stops summing there, the core may answer from its first-frees bound before summing)."""
    holds = sorted(holds)
    got = chance_in_time(position, within, ages, holds, slots, enough)
    ref = reference_chance(position, within, ages, holds, slots, enough)
    if enough is None or ref < enough:
        assert got == ref
    else:
        assert enough <= got <= reference_chance(position, within, ages, holds, slots) + 1e-12


@EXAMPLES
@given(
    holds=st.lists(st.floats(0.01, 20.0), min_size=1, max_size=40),
    ages=st.lists(st.floats(0.0, 30.0), max_size=40),
    slots=st.integers(1, 40),
    position=st.integers(0, 80),
    within=st.floats(0.0, 60.0),
)
def test_the_first_frees_bound_never_exceeds_the_chance(holds, ages, slots, position, within):
    """The shortcut T1 takes (#24) is a lower bound: never more likely than the exact sum."""
    from gate.core.waits import _first_frees_bound

    holds = sorted(holds)
    ages = ages[:slots]
    if position + 1 <= slots - len(ages):
        return  # a free slot: answered before the bound
    bound = _first_frees_bound(position + 1, within, ages, holds, slots)
    assert 0.0 <= bound <= reference_chance(position, within, ages, holds, slots) + 1e-12


def test_a_newcomer_very_likely_to_make_it_is_answered_from_the_bound():
    from gate.core.waits import _first_frees_bound

    holds = [1.0 + i / 100 for i in range(64)]  # holds of 1.00-1.63 s
    ages = [1.2] * 32  # each slot frees within 0.3 s with 30 / 43: 4 of 32 are needed
    got = chance_in_time(3, 0.3, ages, holds, 32, IN_TIME_CHANCE)
    assert got == _first_frees_bound(4, 0.3, ages, holds, 32)  # answered from the bound
    assert IN_TIME_CHANCE <= got <= chance_in_time(3, 0.3, ages, holds, 32)
    # too few likely frees for the bound: the exact sum answers (4 of 4 slots must free)
    assert chance_in_time(3, 0.3, ages[:4], holds, 4, IN_TIME_CHANCE) == chance_in_time(3, 0.3, ages[:4], holds, 4)


def test_a_slot_held_past_every_hold_measured_frees_at_the_mean_holds_pace_not_at_once():
    # the mean calls it due now (remaining 0); the chance does not count on it
    assert remaining([-3.0], 2.0, 0.0, 1) == [0.0]
    got = chance_in_time(0, 1.0, [3.0], [1.0, 3.0], 1)
    assert abs(got - (1 - math.exp(-1.0 / 2.0))) < 1e-12
    # and frees again in what is left after one mean hold (8 s: every hold measured fits)
    assert abs(chance_in_time(1, 10.0, [3.0], [1.0, 3.0], 1) - (1 - math.exp(-10.0 / 2.0))) < 1e-12
    # not again when what is left is shorter than every hold
    assert chance_in_time(1, 2.5, [3.0], [1.0, 3.0], 1) == 0.0


def test_a_long_objective_is_reachable_behind_slots_held_past_every_hold() -> None:
    """CI (test_shared_fleet): every slot overran the holds measured, and a waiter 40 places back
    of a 600 s objective was refused at "0% likely": the slots were counted to free once."""
    holds = [1.0, 2.0, 3.0, 4.0]
    assert chance_in_time(40, 600.0, [5.0, 6.0, 7.0, 8.0], holds, 4) > 0.99


def brute_force(position: int, within: float, ages: list[float], holds: list[float], slots: int) -> float:
    """Every combination of the slots' remaining holds, equally likely per slot (each hold longer
    than its age); `within` shorter than every hold, so a slot frees at most once."""
    choices = [[h - a for h in holds if h > a] for a in ages] + [[0.0]] * (slots - len(ages))
    combos = list(product(*choices))  # each equally likely
    return sum(1 for combo in combos if sum(1 for left in combo if left <= within) >= position + 1) / len(combos)


@EXAMPLES
@given(
    holds=st.lists(st.floats(0.5, 5.0), min_size=1, max_size=5),
    ages=st.lists(st.floats(0.0, 6.0), max_size=4),
    slots=st.integers(1, 4),
    position=st.integers(0, 4),
    within=st.floats(0.0, 1.0),
)
def test_the_chance_is_exact_when_no_slot_can_free_twice_in_time(holds, ages, slots, position, within):
    holds, ages = sorted(holds), ages[:slots]
    assume(within < holds[0])
    assume(all(a < holds[-1] for a in ages))  # held past every hold: see the test above
    assume(all(abs(h - a - within) > 1e-9 for h in holds for a in ages))
    got = chance_in_time(position, within, ages, holds, slots)
    assert abs(got - brute_force(position, within, ages, holds, slots)) < 1e-9


@EXAMPLES
@given(
    holds=st.lists(st.floats(0.05, 5.0), min_size=1, max_size=32),
    ages=st.lists(st.floats(0.0, 6.0), max_size=4),
    slots=st.integers(1, 4),
    position=st.integers(0, 16),
    a=st.floats(0.0, 12.0),
    b=st.floats(0.0, 12.0),
)
def test_the_chance_is_a_probability_that_grows_with_the_time_left_and_falls_with_the_position(holds, ages, slots, position, a, b):
    holds, ages = sorted(holds), ages[:slots]
    lo, hi = min(a, b), max(a, b)
    c_lo, c_hi = (chance_in_time(position, t, ages, holds, slots) for t in (lo, hi))
    assert 0.0 <= c_lo <= c_hi + 1e-12 <= 1.0 + 1e-12
    assert chance_in_time(position + 1, hi, ages, holds, slots) <= c_hi + 1e-12
    assert chance_in_time(position, -0.1, ages, holds, slots) == 0.0
    if position < slots - len(ages):
        assert c_lo == 1.0  # a free slot for it


def test_more_time_never_makes_the_chance_smaller_when_a_long_hold_ends_in_time():
    """hypothesis found it: behind holds of 1.25 and 3 s, 6 frees within 2.5 s were 9% likely and
    within 3 s 0%, because what was left after a first free was averaged over the holds that end
    in time, and the 3 s hold ending in time raised that average."""
    holds, ages = [1.25, 3.0], [0.0, 0.0]
    assert chance_in_time(5, 2.5, ages, holds, 3) <= chance_in_time(5, 3.0, ages, holds, 3)


# ---- T1 with the chance ---------------------------------------------------------------------


@given(
    holds=st.lists(st.floats(0.05, 5.0), min_size=1, max_size=32),
    ages=st.lists(st.floats(0.0, 6.0), max_size=8),
    slots=st.integers(1, 8),
    position=st.integers(0, 24),
    within=st.floats(0.0, 12.0),
    enough=st.floats(0.0, 1.0),
)
def test_summed_until_enough_the_chance_decides_as_the_whole_sum(holds, ages, slots, position, within, enough):
    """T1 stops the sum once the chance reaches IN_TIME_CHANCE: below it the answer is exact,
    at or above it the answer is at least it, so the decision is the whole sum's."""
    holds = sorted(holds)
    whole = chance_in_time(position, within, ages, holds, slots)
    early = chance_in_time(position, within, ages, holds, slots, enough)
    # summed in floats the mass can move by an ulp from slot to slot: decided apart from the tie
    assume(abs(whole - enough) > 1e-9)
    assert (early >= enough) == (whole >= enough)
    if whole < enough:
        assert early == whole
    else:
        assert enough <= early <= whole + 1e-9


def spread_admission(holds: list[float]) -> Admission:
    adm = Admission(
        [Cls("chat", 10, queue_depth=50, queue_timeout_s=30.0, ttft_objective_ms=1000.0)],
        Capacity(slots=2, slot_context=4000, ceiling=4000),
        expected_ttft=lambda _r, _p: 0.2,
    )
    for h in holds:
        adm.holds.record(h)
    return adm


def test_a_newcomer_that_makes_it_on_the_mean_but_rarely_in_fact_is_refused_at_once():
    # holds of 1 s or 3 s (mean 2 s): two slots held 1.5 s free on the mean at 0.5 s, but only
    # the 3 s holds are still possible, which free at 1.5 s: too late for 1 s - 0.2 s
    adm = spread_admission([1.0, 3.0, 1.0, 3.0])
    for _ in range(2):
        assert isinstance(adm.offer(req("chat", 100, at=0.0), 0.0), Admit)
    late = req("chat", 100, at=1.5)
    refusal = adm.offer(late, 1.5)
    assert adm.expected_wait(0, 1.5) == 0.5  # the mean's wait would have queued it (0.5 + 0.2 < 1)
    assert isinstance(refusal, Refuse) and refusal.reason is Reason.QUEUE_TIMEOUT
    # told when the slots are expected to free, by the holds that run that long (R3: 3 s holds
    # held 1.5 s free in 1.5 s), not the mean's "now" (1 s: it was told 1.0)
    assert "only 0% likely to free within the 800 ms" in refusal.detail and refusal.retry_after_s == 1.5
    assert "expected wait 500 ms for 0 ahead" in refusal.detail, refusal.detail
    check_invariants(adm)
    adm.in_time_chance = 0.0  # the mean alone: queued, to be refused after a wait
    assert isinstance(adm.offer(req("chat", 100, at=1.5), 1.5), Queue)


def test_a_newcomer_likely_enough_to_make_it_is_queued():
    adm = spread_admission([1.9] * 9 + [3.0])  # one hold in ten is long
    for _ in range(2):
        assert isinstance(adm.offer(req("chat", 100, at=0.0), 0.0), Admit)
    # a slot held 1.9 s frees at 0.4 s: one of the two does, unless both are long
    assert abs(adm.chance_in_time(0, 0.6, 1.5) - (1 - 0.1**2)) < 1e-9
    assert isinstance(adm.offer(req("chat", 100, at=1.5), 1.5), Queue)
    # behind it, the second to free must too: both holds short
    assert abs(adm.chance_in_time(1, 0.6, 1.5) - 0.9**2) < 1e-9
    assert isinstance(adm.offer(req("chat", 100, at=1.5), 1.5), Refuse)  # 0.81 < IN_TIME_CHANCE
    assert IN_TIME_CHANCE == 0.9


# ---- sustained overload with holds that spread, with a negative control ----------------------


def test_at_3x_with_holds_that_spread_the_rest_is_still_refused_at_once():
    for seed in (1, 2, 3):
        result = overload(sim.admission(chat(OBJECTIVE_S * 1000), slots=SLOTS, ttft_s=TTFT_S), seed, spread=0.3)
        assert targets(result) == [], (seed, sim.summary(result, CAPACITY_RPS))


def test_negative_control_on_the_mean_alone_holds_that_spread_refuse_after_a_wait():
    failed = []
    for seed in (1, 2, 3):
        adm = sim.admission(chat(OBJECTIVE_S * 1000), slots=SLOTS, ttft_s=TTFT_S)
        adm.in_time_chance = 0.0
        failed += [f for f in targets(overload(adm, seed, spread=0.3)) if f.startswith("refused after waiting")]
    assert len(failed) == 3, failed


def _behind_two_slots_about_to_free() -> tuple[Admission, object]:
    """Two slots taken at 0, every hold measured 2 s; a waiter at 1.9 (objective 1 s, first token
    0.2 s: it must start by 2.7), queued: the slots free at 2.0."""
    adm = spread_admission([2.0] * 4)
    for _ in range(2):
        assert isinstance(adm.offer(req("chat", 100, at=0.0), 0.0), Admit)
    w = req("chat", 100, at=1.9)
    assert isinstance(adm.offer(w, 1.9), Queue)
    assert adm.advance(2.0).expired == ()
    assert adm.next_deadline(2.0) is not None and adm.next_deadline(2.0) < 2.05  # the overrun is a moment to look
    return adm, w


@EXAMPLES
@given(
    held_since=st.lists(st.floats(-10.0, 0.0), max_size=12),
    mean=st.floats(0.01, 5.0),
    longest=st.floats(0.01, 8.0),
    slots=st.integers(0, 12),
    places=st.integers(0, 14),
)
def test_the_growing_frees_are_the_remaining_ones_marked(held_since, mean, longest, slots, places):
    """growing_frees: the same floats as remaining, in the same order, each marked growing when
    it is a slot's overrun (past the longest hold), a tie with one that does not grow after it."""
    from gate.core.waits import growing_frees

    frees, grows = growing_frees(held_since, mean, 0.0, slots, longest, places)
    assert frees == remaining(held_since, mean, 0.0, slots, longest)
    assert len(grows) == min(places, len(frees))
    frees = frees[: len(grows)]
    overruns = sorted(-at - longest for at in held_since if -at > longest)
    assert sorted(f for f, g in zip(frees, grows, strict=True) if g) == overruns[: sum(grows)]
    for (a, ga), (b, gb) in zip(zip(frees, grows, strict=True), zip(frees[1:], grows[1:], strict=True), strict=False):
        assert a < b or (a == b and not (ga and not gb))


@EXAMPLES
@given(
    held_since=st.lists(st.floats(-10.0, 0.0), max_size=12),
    mean=st.floats(0.01, 5.0),
    longest=st.one_of(st.none(), st.floats(0.01, 8.0)),
    slots=st.integers(1, 12),
    places=st.integers(1, 14),
)
def test_the_first_frees_are_the_first_places_of_the_whole_walk(held_since, mean, longest, slots, places):
    """first_frees (T2's walk, the ledger oldest first, L6): the first min(places, slots) floats of
    remaining, bit for bit, and growing_frees's marks for them (None where none of them grows:
    the walk reads None and no mark alike). Negative control: the moments in the
    ledger's order reversed (newest first) give the newest slots' frees, not the soonest."""
    from gate.core.waits import first_frees, growing_frees

    held_since = sorted(held_since)  # oldest first, as the ledger holds them (L6)
    frees, grows = first_frees(held_since, mean, 0.0, slots, longest, places)
    whole = remaining(held_since, mean, 0.0, slots, longest)
    m = min(places, slots)
    assert [repr(f) for f in frees] == [repr(f) for f in whole[:m]]
    if longest is None:
        assert grows is None
    else:  # None when no slot overruns or the free slots fill every place: none grows there
        marks = growing_frees(held_since, mean, 0.0, slots, longest, places)[1][:m]
        assert (grows if grows is not None else [False] * len(marks)) == marks


def test_the_first_frees_need_the_oldest_first():
    """The negative control of the property above: newest first, the soonest slots are missed."""
    from gate.core.waits import first_frees

    newest_first = [0.0, -1.0, -2.0]  # held 0, 1 and 2 s; the mean hold 2.5 s: frees 2.5, 1.5, 0.5
    assert first_frees(newest_first[::-1], 2.5, 0.0, 3, None, 1)[0] == [0.5]
    assert first_frees(newest_first, 2.5, 0.0, 3, None, 1)[0] == [2.5]  # wrong: the caller checks L6


def test_a_slot_held_past_every_hold_is_expected_to_run_as_long_again_as_its_overrun():
    assert remaining([-3.0], 2.0, 0.0, 1) == [0.0]  # on the mean alone: due now, for ever
    assert remaining([-3.0], 2.0, 0.0, 1, longest_s=2.5) == [0.5]  # 0.5 s past the longest
    assert remaining([-2.4, -3.0], 2.0, 0.0, 2, longest_s=2.5) == [0.0, 0.5]  # past the mean, not the longest: due


def test_a_waiter_behind_slots_that_just_overran_every_hold_keeps_its_place_and_is_served():
    """The moment a slot passes the longest hold is when it most often frees (#25, 2026-12-05:
    9 of 14 refusals after a wait at 3x against llama-server came then, when its wait was counted
    as one mean hold more). Negative control: counted so, the waiter was refused at 2.05."""
    adm, w = _behind_two_slots_about_to_free()
    assert adm.advance(2.05).expired == ()  # 0.05 s past every hold: 0.05 s more expected
    first = next(iter(adm.ledger)).request.id
    adm.first_token(first)
    adm.release(first, 2.1)
    assert [a.request.id for a in adm.advance(2.1).admitted] == [w.id]  # first token by 2.3 < 2.9
    check_invariants(adm)


def test_a_waiter_behind_slots_that_keep_overrunning_is_refused_before_its_deadline():
    """On a stalling host (#25) the slots do not free: the waiter is refused once their overrun
    leaves it no time, at 2.35 (2.35 + 0.35 = 2.7), not at its deadline 2.7 nor the moment they
    pass the longest hold; T2 looks again then by itself (next_deadline)."""
    adm, w = _behind_two_slots_about_to_free()
    assert adm.advance(2.05).expired == ()
    at = adm.next_deadline(2.05)
    assert at is not None and 2.05 < at <= 2.35 + 1e-9
    step, looks, at = _looks(adm, at)
    assert [f.request.id for f in step.expired] == [w.id]
    assert looks <= 2  # the halfway moment is the moment itself (rounding: a microsecond after it)
    assert 2.35 - 1e-9 <= at <= 2.35 + 1e-5
    check_invariants(adm)


def _looks(adm: Admission, at: float, until: float = 10.0):
    """Advance at the moments T2 asks for (as the shell's one timer would) until a step changes
    something: that step, how many moments it took and the last."""
    looks = 0
    while True:
        looks += 1
        step = adm.advance(at)
        if step.admitted or step.expired:
            return step, looks, at
        nxt = adm.next_deadline(at, after=step)
        assert nxt is not None and at < nxt < until
        at = nxt


def test_t2_looks_at_a_waiter_behind_a_slot_not_yet_due_once_when_the_slot_is_due():
    """A waiter behind a slot not yet due waits less as time goes on, so its start-by moment moves
    on as fast as time: looked at there, it was always the same few ms ahead (a review's case:
    87 looks in 0.8 s, 5 ms apart). It can be late only once its slot is due."""
    adm = Admission(
        [Cls("chat", 10, queue_depth=50, queue_timeout_s=30.0, ttft_objective_ms=805.0)],
        Capacity(slots=2, slot_context=4000, ceiling=4000),
        expected_ttft=lambda _r, _p: 0.0,
    )
    adm.in_time_chance = 0.0  # the mean's wait alone: this is about T2's moments
    for h in (1.0, 1.0, 1.0, 1.2):  # mean 1.05, longest 1.2
        adm.holds.record(h)
    assert isinstance(adm.offer(req("chat", 100, at=0.0), 0.0), Admit)  # held past 1.2 from 1.2 on
    assert isinstance(adm.offer(req("chat", 100, at=1.0), 1.0), Admit)  # due at 2.05
    w = req("chat", 100, at=1.25)  # must start by 2.055
    assert isinstance(adm.offer(w, 1.25), Queue)
    step, looks, at = _looks(adm, adm.next_deadline(1.25))
    assert [f.request.id for f in step.expired] == [w.id]
    assert looks <= 2 and abs(at - 2.055) < 1e-5  # when its slot is due, it has no time left
    check_invariants(adm)
