"""The incremental aging scan answers exactly what the brute-force walk answered (#24).

The core used to find the aged waiters, the next aging moment and the TTFT start-by moments by
walking (and sorting) every waiter of every class on each `advance` and `next_deadline`; a
replay of 100,000 decisions spent most of its 200 s there. The queues now walk their waiters
in enqueue order and stop at the first one not yet aged. The brute-force walks are kept here,
as the reference, and compared with the core's answers after every step of random sequences
(ties in arrival time and a clock that goes back included, where the order must be sorted).
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gate.core.admission import RECHECK_S, Admission, Capacity, Waiting, check_invariants
from gate.core.ledger import Request
from gate.core.queueing import ClassQueue
from gate.core.waits import remaining, wait_at
from tests.unit.test_admission_levers import CLASSES, EXAMPLES, aged_setups, ops
from tests.unit.test_aging_share import pressure_ops, pressure_setups

# ---- the brute-force references (the core's walks before #24) ----------------------------------


def brute_aged(adm: Admission, now: float) -> list[Waiting]:
    if adm.aging_s is None:
        return []
    aged = [w for c in adm._order if not c.queue.paused for w in c.queue if adm.has_turn(w, now)]
    return sorted(aged, key=lambda w: (w.enqueued_at, w.request.id))


def brute_expected_wait(adm: Admission, position: int, now: float) -> float | None:
    mean = adm.holds.mean_s
    if mean is None:
        return None
    # a slot held past the longest hold measured is one mean hold from freeing, not due now (#25)
    return wait_at(position, remaining((r.admitted_at for r in adm.ledger), mean, now, adm.capacity.slots, adm.holds.longest_s), mean)


def brute_slots(adm: Admission, now: float) -> list[tuple[float, bool]]:
    """Each slot's expected time to free and whether it grows as time goes on (held past every
    hold measured: its overrun), in the order they are expected to free (a tie: the one that does
    not grow first)."""
    mean, longest = adm.holds.mean_s, adm.holds.longest_s
    assert mean is not None
    slots = []
    for r in adm.ledger:
        age = now - r.admitted_at
        slots.append((age - longest, True) if longest is not None and age > longest else (max(0.0, mean - age), False))
    return sorted([(0.0, False)] * max(0, adm.capacity.slots - len(slots)) + slots)[: max(1, adm.capacity.slots)]


def brute_crossing(adm: Admission, now: float, upto: int) -> float | None:
    """The first moment a growing free meets the shrinking one just above it, at places 0..upto + 1."""
    slots = brute_slots(adm, now)
    meets = [
        (slots[i + 1][0] - slots[i][0]) / 2.0
        for i in range(len(slots) - 1)
        if i <= upto and slots[i][1] and not slots[i + 1][1] and slots[i + 1][0] > slots[i][0]
    ]
    return max(now + RECHECK_S, now + min(meets)) if meets else None


def brute_start_bys(
    adm: Admission, now: float | None, places: list[int] | None = None
) -> list[tuple[Waiting, float, float | None, float | None]]:
    """(waiter, start-by moment, expected wait, the first moment it may be late: its start-by if it
    is late now or its wait stays as it is; halfway there if its wait grows as time goes on, behind
    a slot held past every hold; once its slot is due if its wait shrinks); `places`, if given,
    gets each one's place (how many are served before it)"""
    out: list[tuple[Waiting, float, float | None, float | None]] = []
    if not any(adm.objective_ms(c) for c in adm.class_names):
        return out
    ahead = 0
    # in the order of service (G2): the waiters with their turn first, where places matter
    first = brute_aged(adm, now) if now is not None and adm.holds.mean_s is not None else []
    rest = [
        w
        for c in adm._order
        if not c.queue.paused
        for w in sorted(c.queue, key=lambda w: (w.enqueued_at, w.request.id))
        if all(w is not f for f in first)
    ]
    for w in first + rest:
        objective_ms = adm.objective_ms(w.request.cls)
        # T4: with the prompt tokens a waiter is expected to meet prefilling at its dispatch
        expected = (None if adm.expected_ttft is None else adm.expected_ttft(w.request, adm.prefill_met())) if objective_ms else None
        wait = None if now is None or not objective_ms else brute_expected_wait(adm, ahead, now)
        if expected is None and wait is None:
            ahead += 1
            continue
        assert objective_ms
        start_by = w.request.arrival + objective_ms / 1000.0 - (expected or 0.0) - (wait or 0.0)
        late_at = start_by
        if wait is not None and now is not None and start_by > now:
            slots = brute_slots(adm, now)
            free, grows = slots[ahead % len(slots)]
            late_at = max(now + RECHECK_S, (start_by + now) / 2.0) if grows else start_by + free
        if places is not None:
            places.append(ahead)
        if now is None or start_by > now:
            ahead += 1
        out.append((w, start_by, wait, late_at))
    return out


def brute_late_at(adm: Admission, now: float | None) -> float | None:
    """The first moment a waiter may be late, or the order the slots free in change (T2's walk)."""
    places: list[int] = []
    walked = brute_start_bys(adm, now, places)
    moments = [late_at for _, _, _, late_at in walked if late_at is not None]
    waiting_at = [
        p for p, (_, start_by, wait, _) in zip(places, walked, strict=True) if now is not None and wait is not None and start_by > now
    ]
    if waiting_at and adm.holds.mean_s is not None:
        # up to the last place a waiter waits at (a waiter late now is nobody's wait)
        cross = brute_crossing(adm, now, min(max(waiting_at), adm.capacity.slots - 1))
        if cross is not None:
            moments.append(cross)
    return min(moments, default=None)


def brute_next_deadline(adm: Admission, now: float | None) -> float | None:
    deadlines = [d for c in adm._order if (d := c.queue.next_deadline()) is not None]
    walked_at = brute_late_at(adm, now)
    if walked_at is not None:
        deadlines.append(walked_at)
    longest = adm.holds.longest_s
    if longest is not None and now is not None and adm.waiting():  # a slot overruns the longest hold (#25)
        deadlines.extend(r.admitted_at + longest + 1e-6 for r in adm.ledger if r.admitted_at + longest + 1e-6 > now)
    if adm.aging_s is not None and now is not None:
        aging = adm.aging_s
        deadlines.extend(w.enqueued_at + aging for c in adm._order if not c.queue.paused for w in c.queue if w.enqueued_at + aging > now)
        deadlines.extend(t + aging for cls, t in adm._turn_at.items() if t + aging > now and adm._classes[cls].queue)
        deadlines.extend(t + aging for cls, t in adm._started_at.items() if t + aging > now and adm._classes[cls].queue)
    return min(deadlines) if deadlines else None


def same_answers(adm: Admission, now: float) -> None:
    assert adm._aged(now) == brute_aged(adm, now)
    for at in (now, None):
        walked = brute_start_bys(adm, at)
        late = [(w, wait) for w, start_by, wait, _ in walked if at is not None and start_by <= at]
        assert adm._start_by_walk(at, late=True) == (late, brute_late_at(adm, at))
    assert adm.next_deadline(now) == brute_next_deadline(adm, now)
    assert adm.next_deadline() == brute_next_deadline(adm, None)
    for cls in adm.class_names:
        q = adm.queue(cls)
        assert list(q.in_order()) == sorted(q, key=lambda w: (w.enqueued_at, w.request.id))


# ---- the property ---------------------------------------------------------------------------


@EXAMPLES
@given(
    setup_seq=st.one_of(
        st.tuples(aged_setups(), st.lists(ops, max_size=60)),
        st.tuples(pressure_setups(), st.lists(pressure_ops, min_size=20, max_size=80)),
    ),
    back=st.lists(st.floats(0.0, 3.0), max_size=3),
    stops=st.booleans(),
)
def test_the_incremental_aging_scan_equals_the_brute_force_walk_after_every_step(setup_seq, back, stops):
    """_aged, _start_by_walk and next_deadline (also reusing the step of an advance that changed
    nothing) equal the brute-force walks after every offer and advance; a few arrivals are offered with a clock set back (`back`), which the core does not
    promise to handle well but must still answer exactly. `stops`: the walk may stop at the first
    waiter that the widest prompt's estimate shows can be neither late nor the earliest moment
    (`ttft_grows_with_prompt`, as the gate and the replay build the core); the same answers."""
    (classes, capacity, rate, base, aging, elastic), seq = setup_seq
    adm = Admission(
        classes,
        capacity,
        aging_s=aging,
        budget_elastic=lambda: elastic,
        expected_ttft=lambda r, prefilling: base + (r.prompt_tokens + prefilling) / rate,
        ttft_grows_with_prompt=stops,
    )
    now = 0.0
    ids = iter(range(10**6))
    setbacks = iter(back)
    arrivals = 0
    for op in seq:
        kind = op[0]
        held = [r.request.id for r in adm.ledger]
        if kind == "arrive":
            _, cls, prompt, max_tokens = op
            arrivals += 1
            at = now
            if arrivals % 7 == 0:  # now and then, a clock that went back
                at = max(0.0, now - next(setbacks, 0.0))
            # ids that sort out of arrival order ("g10" < "g9") make ties in time unordered by push
            r = Request(f"g{next(ids)}", cls, "t", prompt, max_tokens, at)
            adm.offer(r, at)
            same_answers(adm, now)
            continue
        if kind == "release" and held:
            adm.release(held[op[1] % len(held)], now)
        elif kind == "first_token" and held:
            adm.first_token(held[op[1] % len(held)])
        elif kind == "budget":
            adm.set_budget(op[1])
        elif kind == "pause":
            adm.pause(op[1])
        elif kind == "resume":
            adm.resume(op[1])
        elif kind == "tick":
            now += op[1]
        same_answers(adm, now)
        step = adm.advance(now)
        same_answers(adm, now)
        # a step that changed nothing lends its walk to the deadline (#24); one that did, does not
        assert adm.next_deadline(now, after=step) == brute_next_deadline(adm, now)
        assert (step.unchanged_at is None) == bool(step.admitted or step.expired)
    assert set(CLASSES) >= set(adm.class_names)


@given(
    ops_=st.lists(
        st.one_of(
            st.tuples(st.just("push"), st.floats(0.0, 20.0), st.integers(0, 30)),
            st.tuples(st.just("remove"), st.integers(0, 30)),
            st.tuples(st.just("pop"), st.just(0)),
            st.tuples(st.just("expire"), st.floats(0.0, 40.0)),
        ),
        max_size=80,
    )
)
def test_a_class_queue_walks_its_waiters_by_enqueue_time_and_id_whatever_the_push_order(ops_):
    q = ClassQueue("c", depth=16, timeout_s=10.0)
    for op in ops_:
        if op[0] == "push":
            _, at, n = op
            if f"r{n}" not in q:
                q.push(Request(f"r{n}", "c", f"t{n % 3}", 10 + n, 5, at), at)
        elif op[0] == "remove":
            q.remove(f"r{op[1]}")
        elif op[0] == "pop":
            item = q.select()
            if item is not None:
                q.pop(item)
        else:
            q.expire(op[1])
        assert list(q.in_order()) == sorted(q, key=lambda w: (w.enqueued_at, w.request.id))
        # what T2's early stop relies on (#24): the moments rise when it says so; no prompt is wider
        froms = [w.request.objective_from for w in q.in_order()]
        assert not q.from_ordered or froms == sorted(froms)
        assert q.widest is None if not len(q) else all(w.request.prompt_tokens <= q.widest.prompt_tokens for w in q)


@EXAMPLES
@given(
    holds=st.lists(st.floats(0.2, 3.0), min_size=4, max_size=8),
    starts=st.lists(st.floats(0.0, 2.0), min_size=1, max_size=3),
    arrivals=st.lists(st.floats(0.0, 4.0), min_size=1, max_size=4),
    objective_ms=st.floats(100.0, 3000.0),
    ticks=st.lists(st.floats(0.001, 0.5), min_size=1, max_size=30),
)
def test_behind_slots_held_past_every_hold_the_walks_and_deadlines_equal_the_brute_force(holds, starts, arrivals, objective_ms, ticks):
    """Slots held past the longest hold measured (T2: their overrun is their wait, and
    next_deadline looks again halfway to the earliest start-by): the core's walks and deadlines
    equal the brute-force ones at every step, and a waiter is refused exactly when its start-by
    moment, as the brute force computes it, has come."""
    from tests.unit.core_helpers import Cls

    adm = Admission(
        [Cls("chat", 10, queue_depth=8, queue_timeout_s=30.0, ttft_objective_ms=objective_ms)],
        Capacity(slots=len(starts), slot_context=4000, ceiling=4000),
        expected_ttft=lambda _r, _p: 0.05,
    )
    for h in holds:
        adm.holds.record(h)
    events = sorted([(t, "slot") for t in starts] + [(t, "waiter") for t in arrivals])
    ids = iter(range(100))
    now = 0.0
    for at, _ in events:  # the slots are taken first (a start at the same moment as an arrival too)
        now = at
        adm.offer(Request(f"r{next(ids)}", "chat", "t", 10, 10, at), at)
        same_answers(adm, now)
    for dt in ticks:
        now += dt
        late = {w.request.id for w, start_by, _, _ in brute_start_bys(adm, now) if start_by <= now}
        same_answers(adm, now)
        step = adm.advance(now)
        assert {f.request.id for f in step.expired} >= late
        same_answers(adm, now)
        nxt = adm.next_deadline(now, after=step)
        assert nxt == brute_next_deadline(adm, now)
        if nxt is not None:  # sound: nobody becomes late before the moment T2 looks again
            for u in (0.25, 0.5, 0.75, 0.999):
                moment = now + u * (nxt - now)
                assert all(start_by > moment - 1e-6 for _, start_by, _, _ in brute_start_bys(adm, moment))
    check_invariants(adm)
