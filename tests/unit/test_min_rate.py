"""The minimum rate works for a class with a TTFT objective (#25, G1 b).

With objectives no waiter ever ages: T1 refuses it at arrival (its expected wait behind every
higher-class waiter is too long) or it is served within the objective, long before aging_s. So
G1's minimum rate, which applied to aged waiters only, never applied, and batch's share rested on
interactive leaving a slot free: on the real host batch got 10, 15, 1, 0 in four 10 s windows,
and in virtual time, with the example's 2 s objective, none in some 10 s windows. Now a class
that has started no request for aging_s gives its oldest waiter (or a newcomer, when none waits)
its turn, aged or not: it takes the next slot that frees, and T1/T2 count its wait from there.

Each harness below also runs against the rule taken away (a negative control, like Kubernetes
APF's TestNoRestraint) and must fail there.
"""

from __future__ import annotations

from hypothesis import Phase, find, given, settings
from hypothesis import strategies as st

from gate.core.admission import Admission, Admit, Capacity, Queue, Refuse, check_aged, check_invariants
from gate.core.ledger import Request
from gate.core.reasons import Reason
from gate.tools import overload_sim as sim
from tests.unit.core_helpers import req
from tests.unit.test_admission_levers import EXAMPLES, ObjCls, pair
from tests.unit.test_aging_share import CAPACITY_RPS, SERVICE_S, SLOTS, example_classes, pressure_ops, run_g1, two_class_failures

# ---- the rule, small ---------------------------------------------------------------------------


def one_slot(aging_s: float | None = 5.0, objective_ms: float = 2000.0) -> Admission:
    """One slot, both classes with a 2 s objective, first token 0.2 s after dispatch."""
    classes = [
        ObjCls("interactive", 10, queue_timeout_s=10.0, ttft_objective_ms=objective_ms),
        ObjCls("batch", 1, queue_timeout_s=120.0, ttft_objective_ms=objective_ms),
    ]
    adm = Admission(classes, Capacity(slots=1, slot_context=4000, ceiling=4000), aging_s=aging_s, expected_ttft=lambda r, p: 0.2)
    adm.holds.min_holds = 1  # the waits count from the first hold measured
    return adm


class Busy:
    """Interactive keeps the one slot busy: at each whole second the request running (each holds
    it 1 s) ends, the next starts, and one chat waits behind it (unless T1 refuses it). Batch's first request arrives at
    1.0 (its minimum rate counts from there) and is refused: behind the chat, 1 s + 1 s + 0.2 s
    passes its 2 s."""

    def __init__(self, adm: Admission) -> None:
        self.adm = adm
        self.running = req("interactive", at=0.0)
        assert isinstance(adm.offer(self.running, 0.0), Admit)
        self.waiter: Request | None = None
        self.t = 0.0

    def tick(self) -> list[str]:
        """The next whole second; returns the ids dispatched."""
        adm = self.adm
        self.t += 1.0
        t = self.t
        adm.release(self.running.id, t)
        started = [a.request.id for a in adm.advance(t).admitted]
        if not started:
            self.running = req("interactive", at=t)
            assert isinstance(adm.offer(self.running, t), Admit)
        else:
            (self.running,) = [r.request for r in adm.ledger]
        self.waiter = req("interactive", at=t)
        if not isinstance(adm.offer(self.waiter, t), Queue):
            self.waiter = None
        if t == 1.0:
            refused = adm.offer(req("batch", at=1.0), 1.0)
            assert isinstance(refused, Refuse) and refused.reason is Reason.QUEUE_TIMEOUT
        return started

    def until(self, t: float) -> None:
        while self.t < t:
            self.tick()


def test_a_class_that_started_nothing_for_aging_s_is_queued_with_its_turn_and_takes_the_next_slot():
    adm = one_slot()
    busy = Busy(adm)
    busy.until(6.0)
    chat = busy.waiter
    assert chat is not None
    # 6.0: batch has started nothing for 5 s: its newcomer has its turn, position 0 (the slot
    # frees in 1 s: 1.2 s < 2 s), where behind the chat it was 2.2 s and refused
    turn = req("batch", at=6.0)
    assert isinstance(adm.offer(turn, 6.0), Queue)
    later = req("batch", at=6.0)  # behind it and the chat: no turn, refused
    assert isinstance(adm.offer(later, 6.0), Refuse)
    late_chat = req("interactive", at=6.0)  # behind the chat AND the batch waiter with its turn
    decision = adm.offer(late_chat, 6.0)
    assert isinstance(decision, Refuse) and "for 2 ahead" in decision.detail
    # T2 counts the chat behind the batch waiter: due by 6 + 2 - 0.2 - 2 = 5.8, refused now,
    # not after waiting in vain
    step = adm.advance(6.0)
    assert [r.request.id for r in step.expired] == [chat.id]
    adm.release(busy.running.id, 7.0)
    assert [a.request.id for a in adm.advance(7.0).admitted] == [turn.id]  # ahead of interactive
    check_aged(adm, 7.0)
    check_invariants(adm)


def test_the_turn_comes_once_per_aging_s():
    adm = one_slot()
    busy = Busy(adm)
    busy.until(6.0)
    first = req("batch", at=6.0)
    assert isinstance(adm.offer(first, 6.0), Queue)
    assert first.id in busy.tick()  # 7.0: by its turn, ahead of the chat
    busy.until(11.0)
    assert isinstance(adm.offer(req("batch", at=11.0), 11.0), Refuse)  # batch started at 7.0: no turn
    busy.tick()
    # 12.0: batch's turn comes due and it had a request 1 s ago: the chat, whose slot frees at
    # 13.0, counts a batch request ahead (T1) and is refused at arrival
    assert busy.waiter is None
    again = req("batch", at=12.0)  # 5 s since batch's last start: its turn again
    assert isinstance(adm.offer(again, 12.0), Queue)
    assert again.id in busy.tick()
    check_invariants(adm)


def test_an_interactive_newcomer_counts_a_lower_class_turn_that_comes_before_its_slot():
    """T1 looks ahead: batch's minimum rate comes due at 5.0 (it started at 0.0) and a batch
    request arriving then would take the slot first; an interactive newcomer whose slot frees
    after that counts it, so that it is refused at arrival rather than after a wait (T2)."""

    def setup(until: float) -> Admission:
        adm = one_slot(objective_ms=1500.0)
        batch = req("batch", at=0.0)
        assert isinstance(adm.offer(batch, 0.0), Admit)  # batch's last start and its last offer
        adm.release(batch.id, 0.5)
        t, running = 0.5, None
        while t <= until:  # interactive back to back from 0.5, 1 s each
            if running is not None:
                adm.release(running.id, t)
            running = req("interactive", at=t)
            assert isinstance(adm.offer(running, t), Admit)
            t += 1.0
        return adm

    # 4.5: the slot frees at ~5.4 (mean hold 0.875 s), after batch's turn comes due: counted,
    # 0.875 x 2 + 0.2 s passes 1.5 s (alone: 1.075 s, queued)
    refused = setup(4.5).offer(req("interactive", at=4.5), 4.5)
    assert isinstance(refused, Refuse) and "for 1 ahead" in refused.detail
    # 5.5: batch's turn is due, but nothing of batch came for 5 s: no demand to count
    assert isinstance(setup(5.5).offer(req("interactive", at=5.5), 5.5), Queue)


def test_a_turn_does_not_stretch_the_controllers_budget_before_its_request_has_aged():
    """E1/E2 are unchanged: a request larger than the controller's budget waits until it has aged,
    even when it has its class's turn (G1 b: batch started nothing for 10 s); holding the turn, it
    keeps the others within their reservations while it waits (G2)."""
    adm = pair(ceiling=4000, aging_s=5.0, interactive_reserved=300, elastic=True)
    adm.set_budget(600)
    small = req("batch", 100, at=0.0)
    assert isinstance(adm.offer(small, 0.0), Admit)
    adm.release(small.id, 1.0)
    big = req("batch", 1500, prompt=1000, at=10.0)
    assert isinstance(adm.offer(big, 10.0), Queue)  # its turn, but 1500 > 600 - 300 held back
    assert adm.advance(10.0).admitted == ()
    assert isinstance(adm.offer(req("interactive", 300, at=12.0), 12.0), Admit)  # within its 300
    assert isinstance(adm.offer(req("interactive", 200, at=12.0), 12.0), Queue)  # no borrowing
    assert adm.advance(14.9).admitted == ()
    check_aged(adm, 14.9)
    assert adm.effective_budget == 600
    assert [a.request.id for a in adm.advance(15.0).admitted] == [big.id]  # aged: stretched (E2)
    assert adm.effective_budget == 1800  # 1500 + interactive's 300
    check_invariants(adm)


def test_without_aging_there_is_no_turn():
    adm = one_slot(aging_s=None)
    Busy(adm).until(6.0)
    assert isinstance(adm.offer(req("batch", at=6.0), 6.0), Refuse)  # behind the chat, as ever


# ---- the G1 property with objectives: a turn passes a higher class once per aging_s ---------


@st.composite
def objective_setups(draw):
    """As test_aging_share's pressure setups, every class with a TTFT objective, often shorter
    than aging_s (so that waiters are refused or served before they age: only G1 b passes)."""
    ceiling = draw(st.integers(1000, 4000))
    objective = st.floats(200.0, 3000.0)
    classes = [
        ObjCls(
            "hi",
            30,
            reserved_tokens=draw(st.integers(300, ceiling // 2 - 200)),  # with lo's, within R0's half
            queue_depth=8,
            queue_timeout_s=60.0,
            ttft_objective_ms=draw(objective),
        ),
        ObjCls("mid", 20, queue_depth=8, queue_timeout_s=60.0, ttft_objective_ms=draw(objective)),
        ObjCls("lo", 10, reserved_tokens=draw(st.integers(0, 200)), queue_depth=8, queue_timeout_s=60.0, ttft_objective_ms=draw(objective)),
    ]
    capacity = Capacity(slots=draw(st.integers(1, 3)), slot_context=ceiling, ceiling=ceiling)
    return classes, capacity, 2000.0, 0.05, draw(st.floats(0.5, 6.0)), draw(st.booleans())


objective_seqs = st.tuples(objective_setups(), st.lists(pressure_ops, min_size=20, max_size=80))


@EXAMPLES
@given(setup_seq=objective_seqs)
def test_with_objectives_a_higher_class_waiting_within_its_reservation_is_passed_only_within_the_lower_share(setup_seq):
    """The issue's rule, with every class's objective: a request of class c dispatched while a
    higher class has a waiter within its reservation stays within c's reservation, or is c's turn:
    at most one such dispatch per aging_s (run_g1 checks A3 and the invariants after each step)."""
    run_g1(setup_seq, Admission)


class Recording(Admission):
    """The core, noting each request started by its minimum-rate turn before it aged (G1 b)
    past its class's share while a higher class waited."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.unaged_turns: list[str] = []

    def _start(self, request: Request, now: float, *, turn: bool = False, aged: bool = False) -> Admit:
        if turn and not aged and self._beyond_share(request):
            self.unaged_turns.append(request.id)
        return super()._start(request, now, turn=turn, aged=aged)


def test_the_property_exercises_turns_that_need_no_aging():
    """Not vacuous: the property's sequences do hold a request that passes a waiting higher class
    by its class's minimum rate, unaged."""
    found: list[Recording] = []

    class Keep(Recording):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            found.append(self)

    def passes_unaged(setup_seq) -> bool:
        found.clear()
        run_g1(setup_seq, Keep)
        return bool(found[-1].unaged_turns)

    assert find(objective_seqs, passes_unaged, settings=settings(max_examples=3000, deadline=None, database=None, phases=[Phase.generate]))


class EveryTurn(Admission):
    """A NEGATIVE CONTROL: the minimum rate unbounded (a class's oldest waiter always has its
    turn, G1 b without its aging_s)."""

    def _min_rate_due(self, cls: str, now: float) -> bool:
        return self.aging_s is not None and cls in self._started_at


def test_negative_control_the_property_fails_against_an_unbounded_minimum_rate():
    def passes_beyond_share(setup_seq) -> bool:
        try:
            run_g1(setup_seq, EveryTurn)
        except AssertionError as e:
            return "passed a higher class beyond its share" in str(e)
        return False

    found = find(
        objective_seqs, passes_beyond_share, settings=settings(max_examples=3000, deadline=None, database=None, phases=[Phase.generate])
    )
    assert found is not None


# ---- two classes, the example's 2 s objective, interactive 1x + batch 2x, in virtual time ----

OBJECTIVE_MS, TTFT_S = 2000.0, 0.2  # `tokengate config example`: slo_ttft_p95_ms = 2000, every class's
SEEDS = tuple(range(1, 9))


class NoMinRate(Admission):
    """A NEGATIVE CONTROL: the core before G1 (b), the minimum rate for aged waiters only."""

    def _min_rate_due(self, cls: str, now: float) -> bool:
        return False


def core(make: type[Admission] = Admission, aging_s: float | None = 5.0) -> Admission:
    """The core as the gate builds it from the example: classes without an objective of their
    own, [budget] slo_ttft_p95_ms as every class's."""
    return make(
        example_classes(),
        Capacity(slots=SLOTS, slot_context=2048, ceiling=2048),
        aging_s=aging_s,
        expected_ttft=lambda _r, _p: TTFT_S,
        default_ttft_objective_ms=OBJECTIVE_MS,
    )


def run(scheduler: sim.Scheduler, streams: list[sim.Stream], seed: int) -> sim.Result:
    objective = {"interactive": OBJECTIVE_MS / 1000, "batch": OBJECTIVE_MS / 1000}
    return sim.run(
        scheduler,
        streams,
        slots=SLOTS,
        service_s=SERVICE_S,
        ttft_s=TTFT_S,
        duration_s=120.0,
        objective_s=objective,
        seed=seed,
        service_spread=0.3,
    )


BOTH = [sim.Stream("interactive", CAPACITY_RPS), sim.Stream("batch", 2 * CAPACITY_RPS)]


def longest_gap(result: sim.Result, cls: str) -> float:
    """The longest time within the run without a start of `cls` (its ends included)."""
    starts = sorted(
        o.admitted_at for o in result.outcomes if o.request.cls == cls and o.admitted_at is not None and o.admitted_at < result.duration_s
    )
    points = [0.0, *starts, result.duration_s]
    return max(b - a for a, b in zip(points, points[1:], strict=False))


def judged(result: sim.Result, alone: sim.Result) -> list[str]:
    """What the issue asks of two classes: interactive served in time and keeping at least half of
    what it gets alone within the objective; batch served in every 10 s window, the aligned ones
    and any other (no 10 s without a batch start)."""
    failures = two_class_failures(result, alone)
    if (gap := longest_gap(result, "batch")) >= 10.0:
        failures.append(f"batch starved: no start for {gap:.1f} s")
    return failures


def test_with_the_examples_objective_batch_is_served_in_every_10_s_window_and_interactive_keeps_its_share():
    """Measured (seeds 1-8): batch 1-3 in its emptiest 10 s window, its longest time without a
    start 5.4-6.4 s (aging_s, then a wait for the next slot); interactive 167-179 in time beside
    batch against 185-203 alone (87-91%); the core without G1 (b): 172-185."""
    for seed in SEEDS:
        alone = run(core(), BOTH[:1], seed)
        result = run(core(), BOTH, seed)
        assert judged(result, alone) == [], (seed, sim.summary(result), sim.summary(alone))


def test_negative_control_without_the_minimum_rate_for_unaged_waiters_batch_is_starved():
    """The same harness against the core before G1 (b), and without aging at all: batch goes
    10 s or more without a start in most seeds (measured, both: 7 of 8, the longest 8.5-20.2 s;
    an aligned 10 s window with none in 5 of 8)."""
    for make, aging_s in ((NoMinRate, 5.0), (Admission, None)):
        starved = []
        for seed in SEEDS:
            alone = run(core(make, aging_s), BOTH[:1], seed)
            failed = judged(run(core(make, aging_s), BOTH, seed), alone)
            assert not any("interactive" in f for f in failed), (make, aging_s, seed, failed)
            if any("batch starved" in f for f in failed):
                starved.append(seed)
        assert len(starved) >= 3, (make.__name__, aging_s, starved)


def test_the_minimum_rate_stretches_a_controller_budget_that_leaves_the_class_nothing():
    """#25, on the real host: the controller closed to its floor, 1,024 tokens on a 2,048-token
    pool, which is the interactive reservation: batch could reach 0 tokens, its waiters never aged
    (the 2 s objective refused them first, after ~1.9 s) and so never got E2's stretch; batch
    started 0 of 181 in 60 s with every slot free. Its minimum-rate turn (G1 b) now stretches the
    budget as an aged waiter's does, because it could never age: one start per aging_s."""
    classes = [
        ObjCls("interactive", 10, reserved_tokens=1024, queue_timeout_s=10.0, ttft_objective_ms=2000.0),
        ObjCls("batch", 1, queue_depth=256, queue_timeout_s=120.0, ttft_objective_ms=2000.0),
    ]
    adm = Admission(
        classes,
        Capacity(slots=4, slot_context=2048, ceiling=2048),
        budget=1024,
        aging_s=5.0,
        budget_elastic=lambda: True,
        expected_ttft=lambda r, p: 0.3,
    )
    adm.holds.min_holds = 1
    warm = req("interactive", 200, at=0.0)
    assert isinstance(adm.offer(warm, 0.0), Admit)
    adm.release(warm.id, 1.0)  # one hold measured
    starts: list[float] = []
    t = 1.0
    while t < 61.0:
        t = round(t + 0.25, 2)
        decisions = [adm.offer(req("batch", 200, at=t), t), *adm.advance(t).admitted]
        check_invariants(adm)
        check_aged(adm, t)
        for d in decisions:
            if isinstance(d, Admit):
                starts.append(t)
                adm.release(d.request.id, t)  # served at once: only the budget held batch back
    assert adm.effective_budget == 1024  # every stretch ended with its request
    windows = [sum(1 for s in starts if w <= s < w + 10.0) for w in range(1, 61, 10)]
    assert all(n >= 1 for n in windows), windows  # never starved in a 10 s window
    assert len(starts) <= 60 / 5.0 + 1  # a bounded share: one per aging_s, not a free-for-all
