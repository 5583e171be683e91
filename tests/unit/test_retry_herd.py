"""R1: Retry-After of refusals to wait is staggered behind the herd refused with them; R2: a
refusal only an operator ends (a pause, a budget set by hand) is not told the drain's estimate.

A trial's 38 refusals in one instant were all told 5 s for 4 slots; of 203 clients that obeyed,
15 took 5 or more tries. These tests pin that the k-th refusal of a herd is told k spacings of
slot frees more, that spaced refusals and lower classes do not push each other, and (negative
control) that the obeying herd of a model without R1 comes back as one and is refused again,
where with R1 it comes back spread over the slots' frees.
"""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from gate.core.admission import HERD_WINDOW_S, RETRY_MAX_S, RETRY_MIN_S, Admission, Admit, Capacity, Refuse
from gate.core.reasons import Reason
from tests.unit.core_helpers import Cls, req


def busy_core(*, slots: int = 4, hold_s: float = 2.0) -> Admission:
    """`slots` slots, all busy from t=10; holds measured at `hold_s`; interactive above batch,
    both with a 500 ms objective and a 100 ms first token: a newcomer that must wait for a
    slot is refused at once (T1), its Retry-After the wait for the next free slot."""
    adm = Admission(
        [Cls("interactive", 10, queue_depth=64, ttft_objective_ms=500.0), Cls("batch", 1, queue_depth=64, ttft_objective_ms=500.0)],
        Capacity(slots=slots, slot_context=4000, ceiling=40000),
        expected_ttft=lambda _r, _p: 0.1,
    )
    for _ in range(4):
        r = req("interactive", 100, at=0.0)
        assert isinstance(adm.offer(r, 0.0), Admit)
        adm.release(r.id, hold_s)
    for _ in range(slots):
        assert isinstance(adm.offer(req("interactive", 100, at=10.0), 10.0), Admit)
    return adm


def refuse(adm: Admission, cls: str, at: float) -> Refuse:
    decision = adm.offer(req(cls, 100, at=at), at)
    assert isinstance(decision, Refuse) and decision.reason is Reason.QUEUE_TIMEOUT, decision
    assert decision.retry_after_s is not None
    return decision


def test_a_herd_refused_at_once_is_told_to_come_back_one_slot_free_apart():
    adm = busy_core(slots=4, hold_s=2.0)
    told = [refuse(adm, "interactive", 10.5).retry_after_s for _ in range(12)]
    spacing = 2.0 / 4  # the mean hold over the slots: a slot frees every 0.5 s
    assert told == sorted(told) and len(set(told)) == 12
    assert [round(b - a, 9) for a, b in zip(told, told[1:], strict=False)] == [spacing] * 11


def test_refusals_further_apart_than_the_herd_window_are_not_pushed():
    adm = busy_core(hold_s=4.0)
    refuse(adm, "interactive", 10.5)
    later = 10.5 + HERD_WINDOW_S + 0.01
    # the estimate a core that refused nobody gives then: the first herd has gone
    assert refuse(adm, "interactive", later).retry_after_s == refuse(busy_core(hold_s=4.0), "interactive", later).retry_after_s


def test_a_lower_class_goes_behind_the_higher_classes_herd_never_the_other_way():
    adm = busy_core()
    batch = [refuse(adm, "batch", 10.5).retry_after_s for _ in range(3)]
    interactive = refuse(adm, "interactive", 10.5).retry_after_s
    alone = busy_core()
    assert interactive == refuse(alone, "interactive", 10.5).retry_after_s  # batch's herd does not push it
    assert refuse(adm, "batch", 10.5).retry_after_s > batch[-1]  # behind batch's 3 and interactive's 1


def test_nothing_measured_no_stagger():
    adm = Admission([Cls("interactive", 10, queue_depth=1)], Capacity(slots=1, slot_context=4000, ceiling=40000))
    assert isinstance(adm.offer(req("interactive", 100, at=0.0), 0.0), Admit)
    assert not isinstance(adm.offer(req("interactive", 100, at=0.0), 0.0), Refuse)  # the queue's one place
    told = set()
    for _ in range(5):
        decision = adm.offer(req("interactive", 100, at=0.1), 0.1)
        assert isinstance(decision, Refuse) and decision.reason is Reason.QUEUE_FULL
        told.add(decision.retry_after_s)
    assert len(told) == 1  # no hold measured: no spacing to stagger by


@given(st.integers(min_value=1, max_value=400), st.floats(min_value=1.0, max_value=30.0), st.integers(min_value=1, max_value=16))
def test_retry_after_stays_within_its_bounds_and_never_falls_within_a_herd(n, hold_s, slots):
    adm = busy_core(slots=slots, hold_s=hold_s)
    told = [refuse(adm, "interactive", 10.5).retry_after_s for _ in range(n)]
    assert all(RETRY_MIN_S <= t <= RETRY_MAX_S for t in told)
    assert told == sorted(told)


def _retries_until_served(staggered: bool, herd: int = 24, slots: int = 4, hold_s: float = 2.0) -> list[int]:
    """A herd of `herd` obeying clients refused at one instant, against `slots` slots busy for
    `hold_s` each, nothing else arriving: each client comes back when told (Retry-After in
    whole seconds, as the header carries it) until admitted; a waiter queued is dispatched
    as the core's `advance` says. Returns each client's number of tries. `staggered` False:
    the model of a core without R1, where each refusal is told its own estimate alone (the
    first of the herd's figure, as every refusal of one instant got before R1)."""
    import heapq

    adm = busy_core(slots=slots, hold_s=hold_s)
    events: list[tuple[float, int, str, object]] = []
    seq = iter(range(10**9))
    for r in adm.ledger:
        heapq.heappush(events, (10.0 + hold_s, next(seq), "release", r.request.id))
    for client in range(herd):
        heapq.heappush(events, (10.5, next(seq), "come", client))
    tries = [0] * herd
    clients: dict[str, int] = {}
    base: dict[float, float] = {}  # instant -> the first figure told then (no R1: all get it)

    def refused(refusal: Refuse, at: float) -> None:
        assert refusal.retry_after_s is not None
        told = refusal.retry_after_s if staggered else base.setdefault(at, refusal.retry_after_s)
        heapq.heappush(events, (at + math.ceil(told), next(seq), "come", clients.pop(refusal.request.id)))

    def step(at: float) -> None:
        result = adm.advance(at)
        for admit in result.admitted:
            clients.pop(admit.request.id)
            heapq.heappush(events, (at + hold_s, next(seq), "release", admit.request.id))
        for refusal in result.expired:
            refused(refusal, at)
        deadline = adm.next_deadline(at)
        if deadline is not None and adm.waiting():
            heapq.heappush(events, (max(deadline, at), next(seq), "timer", None))

    while events:
        at, _, kind, what = heapq.heappop(events)
        if kind == "release":
            adm.release(str(what), at)
            step(at)
        elif kind == "timer":
            step(at)
        else:
            client = int(what)  # type: ignore[call-overload]
            tries[client] += 1
            r = req("interactive", 100, at=at)
            clients[r.id] = client
            decision = adm.offer(r, at)
            if isinstance(decision, Admit):
                clients.pop(r.id)
                heapq.heappush(events, (at + hold_s, next(seq), "release", r.id))
            elif isinstance(decision, Refuse):
                refused(decision, at)
            else:
                step(at)
        assert sum(tries) < 100 * herd, "the herd never got in"
    return tries


def test_negative_control_without_the_stagger_an_obeying_herd_is_refused_again_and_again():
    with_r1 = _retries_until_served(True)
    without = _retries_until_served(False)
    # With one figure for all, the whole herd comes back at one instant each time and only
    # the slots' worth get in: tries pile up. Staggered, they come back as slots free.
    assert sum(without) > sum(with_r1), (without, with_r1)
    assert max(without) > max(with_r1), (without, with_r1)


def test_r2_only_an_operator_ends_a_pause_or_a_budget_set_by_hand_so_no_drain_estimate_is_told():
    # a trial's clients of a paused class were told Retry-After 1 s, again and again; those
    # refused over a budget frozen at 1,024 ("class 'batch' can reach 0") too
    def core(elastic: bool) -> Admission:
        adm = Admission(
            [Cls("interactive", 10, reserved_tokens=900, queue_timeout_s=10.0), Cls("batch", 1, queue_timeout_s=60.0)],
            Capacity(slots=4, slot_context=4000, ceiling=4000),
            budget=1000,
            budget_elastic=lambda: elastic,
        )
        for _ in range(4):  # a drain measured (MIN_HOLDS releases): its estimate is ~1 s
            r = req("interactive", 25, at=0.0)
            assert isinstance(adm.offer(r, 0.0), Admit)
            adm.release(r.id, 1.0)
        return adm

    adm = core(elastic=False)
    adm.pause("batch")
    paused = adm.offer(req("batch", 50, at=2.0), 2.0)
    assert isinstance(paused, Refuse) and paused.reason is Reason.CLASS_PAUSED and paused.retry_after_s == 60.0
    adm.resume("batch")
    over = adm.offer(req("batch", 200, at=2.0), 2.0)  # batch reaches 100 of the frozen 1,000
    assert isinstance(over, Refuse) and over.reason is Reason.TOKEN_BUDGET_EXCEEDED and over.retry_after_s == 60.0
    # the adaptive controller's budget may move on its own: the drain's estimate stands
    elastic = core(elastic=True).offer(req("batch", 200, at=2.0), 2.0)
    assert isinstance(elastic, Refuse) and elastic.reason is Reason.TOKEN_BUDGET_EXCEEDED
    assert elastic.retry_after_s is not None and elastic.retry_after_s < 60.0
