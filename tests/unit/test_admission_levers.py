"""The overload levers of the pure core (#13): prefill yielding (F6), the prefill cap
that lets a prompt start alone (F4), deadlines that leave room for the first token,
and aging (A3, no starvation), with hypothesis properties for the last two."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import count

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gate.core.admission import Admission, Admit, Capacity, Queue, Refuse, check_aged, check_invariants
from gate.core.ledger import Request
from gate.core.reasons import Reason
from tests.unit.core_helpers import Cls, req

EXAMPLES = settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@dataclass(frozen=True)
class ObjCls(Cls):
    ttft_objective_ms: float | None = None


def pair(
    *,
    ceiling=4000,
    slots=4,
    yield_tokens=None,
    prefill_cap=None,
    aging_s=None,
    expected=None,
    objective_ms=None,
    batch_reserved=0,
    interactive_reserved=0,
    elastic=False,
) -> Admission:
    classes = [
        ObjCls("interactive", 10, reserved_tokens=interactive_reserved, queue_timeout_s=30.0, ttft_objective_ms=objective_ms),
        ObjCls("batch", 1, reserved_tokens=batch_reserved, queue_timeout_s=120.0),
    ]
    capacity = Capacity(
        slots=slots, slot_context=ceiling, ceiling=ceiling, max_prefill_tokens=prefill_cap, prefill_yield_tokens=yield_tokens
    )
    return Admission(classes, capacity, aging_s=aging_s, expected_ttft=expected, budget_elastic=lambda: elastic)


# ---- F4 and F6 ----------------------------------------------------------------------


def test_a_prompt_longer_than_the_prefill_cap_starts_when_nothing_else_prefills():
    adm = pair(prefill_cap=500)
    long = req("batch", 1500, prompt=1200)
    assert isinstance(adm.offer(long, 0.0), Admit)  # alone: it could never start otherwise
    second = req("interactive", 200, prompt=100)
    assert isinstance(adm.offer(second, 0.0), Queue)  # 1200 + 100 prefilling > 500
    adm.first_token(long.id)
    assert [a.request.id for a in adm.advance(0.1).admitted] == [second.id]


def test_a_long_batch_prefill_waits_while_an_interactive_request_prefills():
    adm = pair(yield_tokens=512)
    chat = req("interactive", 200, prompt=100)
    assert isinstance(adm.offer(chat, 0.0), Admit)
    long = req("batch", 1400, prompt=1000)
    assert isinstance(adm.offer(long, 0.0), Queue)
    assert adm.waiting_on("batch") == "prefill yields"
    short = req("batch", 300, prompt=200)  # under the threshold, but behind `long` (no overtaking)
    assert isinstance(adm.offer(short, 0.0), Queue)
    adm.first_token(chat.id)  # the interactive prompt is processed: the long prefill may go
    assert [a.request.id for a in adm.advance(0.1).admitted] == [long.id, short.id]


def test_a_long_batch_prefill_waits_while_interactive_requests_wait_for_a_slot():
    adm = pair(yield_tokens=512, slots=1)
    first = req("interactive", 200, prompt=100)
    adm.offer(first, 0.0)
    adm.first_token(first.id)
    waiting_chat = req("interactive", 200, prompt=100)
    assert isinstance(adm.offer(waiting_chat, 0.0), Queue)
    long = req("batch", 1400, prompt=1000)
    assert isinstance(adm.offer(long, 0.0), Queue)
    adm.release(first.id, 0.5)
    assert [a.request.id for a in adm.advance(0.5).admitted] == [waiting_chat.id]
    assert adm.waiting_on("batch") == "slots 1/1 busy"


def test_short_batch_prompts_do_not_yield():
    adm = pair(yield_tokens=512)
    adm.offer(req("interactive", 200, prompt=100), 0.0)
    assert isinstance(adm.offer(req("batch", 600, prompt=300), 0.0), Admit)


# ---- deadlines that leave room for the first token ------------------------------------


def test_a_waiter_that_can_no_longer_meet_its_ttft_objective_is_refused_early():
    # First token expected 150 ms after dispatch; objective 300 ms: it must start by 150 ms.
    adm = pair(slots=1, objective_ms=300, expected=lambda r, prefilling: 0.150)
    adm.offer(req("batch", 100, prompt=50), 0.0)  # takes the only slot
    chat = req("interactive", 100, prompt=50, at=0.0)
    assert isinstance(adm.offer(chat, 0.0), Queue)
    assert abs(adm.next_deadline() - 0.150) < 1e-9  # the one timer fires at the start-by
    assert adm.advance(0.149).expired == ()
    step = adm.advance(0.150)
    assert [r.request.id for r in step.expired] == [chat.id]
    refusal = step.expired[0]
    assert refusal.reason is Reason.QUEUE_TIMEOUT and refusal.status == 429
    assert "300 ms time-to-first-token objective" in refusal.detail
    assert 1 <= refusal.retry_after_s <= 120
    check_invariants(adm)


def test_a_refusal_by_the_budget_default_objective_names_the_key_it_comes_from():
    """A trial's batch (`queue_timeout_s = 120`) was refused in 5 ms with `queue_timeout` by the
    [budget] default objective it inherits; the message named only "its 2000 ms objective", and
    the timeout is the knob an engineer reaches for. A class with its own objective is not told."""
    adm = pair(slots=1, objective_ms=300, expected=lambda r, prefilling: 0.150)
    adm.default_ttft_objective_ms = 200.0  # [budget] slo_ttft_p95_ms, for batch (none of its own)
    adm.offer(req("interactive", 100, prompt=50), 0.0)  # takes the only slot
    batch = req("batch", 100, prompt=50, at=0.0)
    assert isinstance(adm.offer(batch, 0.0), Queue)
    refusal = adm.advance(0.051).expired[0]  # 200 ms - 150 ms to its first token: late after 50 ms
    assert "200 ms time-to-first-token objective ([budget] slo_ttft_p95_ms: class 'batch' sets no ttft_objective_ms)" in refusal.detail
    chat = req("interactive", 100, prompt=50, at=1.0)
    own = adm.offer(chat, 1.0)  # refused at once (T1) or once late (T2): its own objective either way
    if isinstance(own, Queue):
        own = adm.advance(1.151).expired[0]
    assert "300 ms time-to-first-token objective" in own.detail and "slo_ttft_p95_ms" not in own.detail


def test_a_newcomer_that_must_wait_and_cannot_make_it_is_refused_at_once():
    adm = pair(slots=1, objective_ms=300, expected=lambda r, prefilling: 0.400)
    adm.offer(req("batch", 100, prompt=50), 0.0)
    decision = adm.offer(req("interactive", 100, prompt=50, at=0.0), 0.0)
    assert isinstance(decision, Refuse) and decision.reason is Reason.QUEUE_TIMEOUT


def test_a_newcomer_that_fits_is_admitted_even_when_it_will_be_late():
    # Refusing early exists to stop waiting in vain; a request that can start now starts.
    adm = pair(objective_ms=300, expected=lambda r, prefilling: 0.400)
    assert isinstance(adm.offer(req("interactive", 100, prompt=50), 0.0), Admit)


def test_no_estimate_yet_means_no_early_refusal():
    adm = pair(slots=1, objective_ms=300, expected=lambda r, prefilling: None)
    adm.offer(req("batch", 100, prompt=50), 0.0)
    assert isinstance(adm.offer(req("interactive", 100, prompt=50), 0.0), Queue)
    assert adm.advance(5.0).expired == ()


def test_the_estimate_sees_the_prompts_still_prefilling():
    seen = []

    def expected(r: Request, prefilling: int) -> float:
        seen.append(prefilling)
        return (r.prompt_tokens + prefilling) / 1000.0

    adm = pair(slots=1, objective_ms=500, expected=expected)
    adm.offer(req("batch", 900, prompt=800), 0.0)  # 800 tokens prefilling
    chat = req("interactive", 100, prompt=50)
    decision = adm.offer(chat, 0.0)
    assert isinstance(decision, Refuse)  # (50 + 800) / 1000 = 0.85 s > 0.5 s
    assert seen[-1] == 800


# ---- aging ---------------------------------------------------------------------------


def test_an_aged_batch_request_stops_yielding_and_goes_ahead_of_interactive():
    adm = pair(ceiling=4000, aging_s=5.0, yield_tokens=512, interactive_reserved=500)
    first = req("interactive", 200, prompt=100)
    adm.offer(first, 0.0)  # prefilling (a slow prefill, or a stream of short ones)
    big = req("batch", 1500, prompt=1000)
    assert isinstance(adm.offer(big, 0.0), Queue)  # yields to the interactive prefill
    assert adm.advance(4.9).admitted == ()
    adm.first_token(first.id)
    chat = req("interactive", 200, prompt=100, at=4.95)
    assert isinstance(adm.offer(chat, 4.95), Admit)  # interactive keeps coming
    assert adm.advance(4.96).admitted == ()  # `chat` prefills: the long prompt still yields
    step = adm.advance(5.0)
    assert [a.request.id for a in step.admitted] == [big.id]  # aged: first, and no more yielding
    check_aged(adm, 5.0)
    check_invariants(adm)


def test_aging_never_goes_past_the_working_budget():
    adm = pair(ceiling=4000, aging_s=5.0)
    adm.set_budget(600)  # an operator's retune, or the controller at its floor
    assert adm.offer(req("batch", 1500, prompt=1000), 0.0).reason is Reason.TOKEN_BUDGET_EXCEEDED
    fits = req("batch", 500, prompt=400)
    adm.offer(req("batch", 400, prompt=300), 0.0)
    assert isinstance(adm.offer(fits, 0.0), Queue)
    assert adm.advance(60.0).admitted == ()  # aged, but 400 + 500 > 600: it waits for room
    check_aged(adm, 60.0)


def test_the_controllers_budget_stretches_for_an_aged_request_larger_than_it():
    """E1/E2: the adaptive controller at its floor (600) and a 1,500-token batch request:
    it waits instead of a 429, and once aged it starts as soon as interactive is back
    within its reservation, above the budget but never above the ceiling."""
    adm = pair(ceiling=4000, aging_s=5.0, interactive_reserved=300, elastic=True)
    adm.set_budget(600)
    chat = req("interactive", 500, prompt=100)
    assert isinstance(adm.offer(chat, 0.0), Admit)  # borrows 200 past its reservation
    big = req("batch", 1500, prompt=1000)
    assert isinstance(adm.offer(big, 0.0), Queue)
    assert adm.waiting_on("batch") == "aging (budget)"  # the console: it is not stuck, it ages
    assert adm.advance(4.9).admitted == ()  # not aged yet: the budget holds
    assert adm.advance(5.0).admitted == ()  # aged, but interactive holds 500 > its 300
    borrow = req("interactive", 200, prompt=100, at=5.0)
    assert isinstance(adm.offer(borrow, 5.0), Queue)  # nobody borrows while it waits
    adm.release(chat.id, 5.1)
    step = adm.advance(5.1)
    # 1500 + interactive's 300 reserved: stretched to 1800 (E2), and while `big` runs that is
    # everyone's budget (E3): interactive keeps its reservation beside it, `borrow` (200) starts.
    assert [a.request.id for a in step.admitted] == [big.id, borrow.id]
    assert adm.effective_budget == 1800 and adm.budget == 600
    check_aged(adm, 5.1)
    check_invariants(adm)
    past = req("interactive", 200, prompt=100, at=5.1)
    assert isinstance(adm.offer(past, 5.1), Queue)  # 400 > its 300: no borrowing past the stretch
    adm.release(big.id, 9.0)
    assert adm.effective_budget == 600  # the stretch ends with its request
    assert [a.request.id for a in adm.advance(9.0).admitted] == [past.id]
    check_invariants(adm)


def test_a_stretch_is_one_request_at_a_time_and_never_past_the_ceiling():
    adm = pair(ceiling=2000, aging_s=5.0, elastic=True)
    adm.set_budget(500)
    first, second = req("batch", 1500, prompt=1000), req("batch", 1500, prompt=1000)
    assert isinstance(adm.offer(first, 0.0), Queue)
    assert isinstance(adm.offer(second, 0.0), Queue)
    assert [a.request.id for a in adm.advance(5.0).admitted] == [first.id]
    assert adm.ledger.in_flight == 1500  # `second` waits: 3000 would pass the ceiling
    check_aged(adm, 5.0)
    too_big = req("batch", 2001, prompt=1000)
    assert adm.offer(too_big, 5.0).reason is Reason.CONTEXT_LENGTH_EXCEEDED


def test_without_aging_or_with_an_operators_budget_a_larger_request_is_refused_at_once():
    elastic_no_aging = pair(ceiling=4000, elastic=True)
    frozen = pair(ceiling=4000, aging_s=5.0)  # the default: the budget is an operator's limit
    for adm in (elastic_no_aging, frozen):
        adm.set_budget(600)
        refused = adm.offer(req("batch", 1500, prompt=1000), 0.0)
        assert refused.reason is Reason.TOKEN_BUDGET_EXCEEDED and refused.retry_after_s >= 1


def test_while_an_aged_request_waits_for_room_nobody_borrows_past_their_reservation():
    adm = pair(ceiling=2000, aging_s=5.0, interactive_reserved=300)
    first = req("batch", 1500, prompt=1000)
    adm.offer(first, 0.0)
    second = req("batch", 1500, prompt=1000)
    adm.offer(second, 0.0)
    assert adm.advance(6.0).admitted == ()  # aged, but the pool holds `first`
    within = req("interactive", 300, prompt=100, at=6.0)
    assert isinstance(adm.offer(within, 6.0), Admit)
    borrow = req("interactive", 200, prompt=100, at=6.0)
    assert isinstance(adm.offer(borrow, 6.0), Queue)  # would borrow: the aged request comes first


# ---- properties ----------------------------------------------------------------------

CLASSES = ("hi", "mid", "lo")
_ids = count()


@st.composite
def aged_setups(draw):
    ceiling = draw(st.integers(1000, 4000))
    reserved = [draw(st.integers(0, ceiling // 4)) for _ in CLASSES]
    classes = [
        ObjCls(
            name,
            prio,
            reserved_tokens=res,
            queue_depth=draw(st.integers(1, 6)),
            queue_timeout_s=draw(st.floats(0.5, 30.0)),
            ttft_objective_ms=draw(st.one_of(st.none(), st.floats(50.0, 2000.0))),
        )
        for (name, prio), res in zip(zip(CLASSES, (30, 20, 10)), reserved)
    ]
    capacity = Capacity(
        slots=draw(st.integers(1, 4)),
        slot_context=draw(st.integers(300, ceiling)),
        ceiling=ceiling,
        max_prefill_tokens=draw(st.one_of(st.none(), st.integers(100, 2000))),
        prefill_yield_tokens=draw(st.one_of(st.none(), st.integers(50, 800))),
    )
    rate = draw(st.floats(500.0, 5000.0))
    base = draw(st.floats(0.0, 0.3))
    aging = draw(st.floats(0.5, 10.0))
    elastic = draw(st.booleans())
    return classes, capacity, rate, base, aging, elastic


ops = st.one_of(
    st.tuples(st.just("arrive"), st.sampled_from(CLASSES), st.integers(1, 600), st.integers(1, 600)),
    st.tuples(st.just("arrive"), st.sampled_from(CLASSES), st.integers(1, 600), st.integers(1, 600)),
    st.tuples(st.just("release"), st.integers(0, 50)),
    st.tuples(st.just("first_token"), st.integers(0, 50)),
    st.tuples(st.just("budget"), st.integers(1, 3000)),
    st.tuples(st.just("pause"), st.sampled_from(CLASSES)),
    st.tuples(st.just("resume"), st.sampled_from(CLASSES)),
    st.tuples(st.just("tick"), st.floats(0.0, 4.0)),
)


@EXAMPLES
@given(setup=aged_setups(), seq=st.lists(ops, max_size=60))
def test_levers_keep_every_invariant_and_aged_work_never_waits_for_anything_but_capacity(setup, seq):
    """A1-A3 and the ledger/queue invariants after every step; a request dispatched from a
    queue of a class with a TTFT objective left at least its expected first-token time."""
    classes, capacity, rate, base, aging, elastic = setup
    objective = {c.name: c.ttft_objective_ms for c in classes}
    adm = Admission(
        classes,
        capacity,
        aging_s=aging,
        budget_elastic=lambda: elastic,
        expected_ttft=lambda r, prefilling: base + (r.prompt_tokens + prefilling) / rate,
    )
    now = 0.0
    ended: set[str] = set()

    def on_step(step, at):
        for a in step.admitted:
            obj = objective[a.request.cls]
            if obj is not None:
                assert a.at < a.request.arrival + obj / 1000.0 - (base + a.request.prompt_tokens / rate) + 1e-9
        assert adm.ledger.in_flight <= capacity.ceiling
        if step.admitted and adm.ledger.in_flight > adm.budget:  # A4: only within a stretch (E2, E3)
            assert elastic and adm.ledger.in_flight <= adm.effective_budget, "A4 past the budget"
        check_aged(adm, at)

    for op in seq:
        kind = op[0]
        held = [r.request.id for r in adm.ledger]
        if kind == "arrive":
            _, cls, prompt, max_tokens = op
            r = Request(f"p{next(_ids)}", cls, "t", prompt, max_tokens, now)
            if isinstance(adm.offer(r, now), Admit):
                assert adm.ledger.in_flight <= adm.effective_budget, "A4 a newcomer admitted past the budget"
        elif kind == "release" and held:
            rid = held[op[1] % len(held)]
            adm.release(rid, now)
            ended.add(rid)
            on_step(adm.advance(now), now)
        elif kind == "first_token" and held:
            adm.first_token(held[op[1] % len(held)])
            on_step(adm.advance(now), now)
        elif kind == "budget":
            adm.set_budget(op[1])
            on_step(adm.advance(now), now)
        elif kind == "pause":
            adm.pause(op[1])
        elif kind == "resume":
            adm.resume(op[1])
            on_step(adm.advance(now), now)
        elif kind == "tick":
            now += op[1]
            on_step(adm.advance(now), now)
        check_invariants(adm)


@EXAMPLES
@given(
    ceiling=st.integers(1500, 4000),
    slots=st.integers(1, 4),
    hi_reserved=st.integers(0, 600),
    aging=st.floats(0.5, 5.0),
    duration=st.floats(0.1, 3.0),
    hi_gaps=st.lists(st.floats(0.01, 0.5), min_size=50, max_size=200),
    hi_costs=st.lists(st.integers(20, 400), min_size=1, max_size=20),
    lo_cost=st.integers(100, 1500),
    extra_budget=st.integers(0, 2000),
    elastic_budget=st.one_of(st.none(), st.integers(1, 4000)),
)
def test_a_low_priority_request_is_never_starved_by_sustained_high_priority_traffic(
    ceiling, slots, hi_reserved, aging, duration, hi_gaps, hi_costs, lo_cost, extra_budget, elastic_budget
):
    """Liveness: with high-priority requests arriving without pause, each running
    `duration` s, and the working budget anywhere the low request can reach (or, when it
    is the controller's elastic budget, anywhere at all: E1, E2), a waiting
    low-priority request is dispatched within aging_s + one `duration`
    per request that was ahead of it (waiting or running when it arrived) plus one
    arrival gap: nothing that arrives after it overtakes it for long."""
    lo_cost = min(lo_cost, ceiling - hi_reserved)
    classes = [
        Cls("hi", 10, reserved_tokens=hi_reserved, queue_depth=1000, queue_timeout_s=1e9),
        Cls("lo", 1, queue_depth=10, queue_timeout_s=1e9),
    ]
    adm = Admission(classes, Capacity(slots=slots, slot_context=ceiling, ceiling=ceiling, prefill_yield_tokens=100), aging_s=aging)
    if elastic_budget is None:
        adm.set_budget(min(ceiling, lo_cost + hi_reserved + extra_budget))
    else:  # the adaptive controller, at its floor or anywhere below what `lo` needs
        adm.budget_elastic = lambda: True
        adm.set_budget(min(ceiling, elastic_budget))
    running: dict[str, float] = {}  # request id -> its end
    started: dict[str, float] = {}

    def admitted(step_or_decision, at):
        items = (
            step_or_decision.admitted
            if hasattr(step_or_decision, "admitted")
            else ([step_or_decision] if isinstance(step_or_decision, Admit) else [])
        )
        for a in items:
            started[a.request.id] = at
            running[a.request.id] = at + duration
            adm.first_token(a.request.id)  # prompts are processed at once in this model

    now = 0.0
    # The high class is busy first, then the low request arrives.
    lo = Request("lo-1", "lo", "t", lo_cost // 2, lo_cost - lo_cost // 2, 0.0)
    for i, gap in enumerate(hi_gaps):
        # Finish what ends before the next arrival, advancing at each end (as the shell does).
        target = now + gap
        while True:  # releases and the core's own timer, in time order, up to the next arrival
            ends = [(end, rid) for rid, end in running.items() if end <= target]
            timer = adm.next_deadline(now)
            events = sorted(ends + ([(timer, None)] if timer is not None and timer <= target else []), key=lambda e: e[0])
            if not events:
                break
            at, rid = events[0]
            if rid is not None:
                adm.release(rid, at)
                del running[rid]
            now = at
            admitted(adm.advance(at), at)
        now = target
        admitted(adm.advance(now), now)
        if i == 3:
            ahead = adm.waiting() + len(adm.ledger)
            lo = Request("lo-1", "lo", "t", lo_cost // 2, lo_cost - lo_cost // 2, now)
            admitted(adm.offer(lo, now), now)
        if i > 3:
            bound = lo.arrival + aging + (ahead + 1) * duration + max(hi_gaps) + 1e-6
            assert started.get("lo-1", now) <= bound, "starved"
            if "lo-1" in started:
                break
        cost = hi_costs[i % len(hi_costs)]
        admitted(adm.offer(Request(f"h{i}", "hi", "t", cost // 2, cost - cost // 2, now), now), now)


def test_a_429_over_a_budget_set_by_hand_says_what_holds_the_rest_of_it():
    """A trial of R0: under a budget frozen at 1,024, batch's 429 said "class 'batch' can reach 0
    at the current budget of 1024" and nothing of interactive's reservation holding all of it."""
    adm = pair(ceiling=1000, slots=4, interactive_reserved=500, elastic=False)
    adm.set_budget(500)
    refusal = adm.offer(req("batch", 100, prompt=50), 0.0)
    assert isinstance(refusal, Refuse) and refusal.reason is Reason.TOKEN_BUDGET_EXCEEDED
    assert refusal.detail.endswith("class 'batch' can reach 0 at the current budget of 500 (500 of it reserved for other classes)")
    # nothing held elsewhere: nothing added
    adm = pair(ceiling=1000, slots=4, elastic=False)
    adm.set_budget(100)
    refusal = adm.offer(req("batch", 150, prompt=50), 0.0)
    assert isinstance(refusal, Refuse) and refusal.detail.endswith("can reach 100 at the current budget of 100")


def test_a_refusal_of_a_class_held_back_by_the_others_reservations_says_so_not_only_the_objective():
    """A user's trial of R0: at the adaptive floor (the reservations in force), batch reaches 0
    tokens and waits for its turn (E1); its 429 said only "would miss its ... objective"."""
    adm = pair(ceiling=1000, slots=4, aging_s=5.0, interactive_reserved=500, elastic=True, expected=lambda r, p: 0.1)
    adm.default_ttft_objective_ms = 300.0
    adm.set_budget(500)
    batch = req("batch", 100, prompt=50, at=0.0)
    assert isinstance(adm.offer(batch, 0.0), Queue)  # beyond its reach: it waits for its turn
    (refusal,) = adm.advance(0.3).expired
    assert refusal.reason is Reason.QUEUE_TIMEOUT
    assert "300 ms time-to-first-token objective" in refusal.detail
    assert "class 'batch' can reach 0 tokens of the current budget of 500" in refusal.detail
    # within its reach (the slot is what it waits for), the refusal names the objective alone
    adm = pair(ceiling=1000, slots=1, aging_s=5.0, interactive_reserved=500, elastic=True, expected=lambda r, p: 0.1)
    adm.default_ttft_objective_ms = 300.0
    assert isinstance(adm.offer(req("interactive", 100, prompt=50), 0.0), Admit)  # the only slot
    assert isinstance(adm.offer(req("batch", 100, prompt=50, at=0.0), 0.0), Queue)
    (refusal,) = adm.advance(0.3).expired
    assert "300 ms time-to-first-token objective" in refusal.detail and "can reach" not in refusal.detail
