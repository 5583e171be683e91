"""Example-based tests of the admission core (gate/core/admission.py)."""

from __future__ import annotations

import pytest

from gate.core.admission import Admit, Capacity, Queue, Refuse, TenantPolicy, check_invariants, clamp_retry
from gate.core.ledger import Request
from gate.core.reasons import Reason
from gate.core.waits import MIN_HOLDS
from tests.unit.core_helpers import req, state_of, two_classes


def test_request_that_fits_is_admitted_and_reserves_its_worst_case_cost():
    adm = two_classes()
    r = req("interactive", 300, prompt=100)
    decision = adm.offer(r, now=0.0)
    assert isinstance(decision, Admit)
    assert adm.ledger.in_flight == 300
    assert adm.ledger.prefilling == 100
    assert adm.ledger.class_tokens("interactive") == 300


def test_request_larger_than_a_slot_context_is_refused_400_and_never_queued():
    adm = two_classes(slot_context=512, budget=2048)
    before = state_of(adm)
    decision = adm.offer(req("batch", 513), now=0.0)
    assert isinstance(decision, Refuse)
    assert decision.reason is Reason.CONTEXT_LENGTH_EXCEEDED
    assert decision.status == 400
    assert decision.retry_after_s is None
    assert state_of(adm) == before


def test_request_beyond_class_limit_at_the_ceiling_never_fits():
    adm = two_classes(batch={"limit_tokens": 300})
    decision = adm.offer(req("batch", 301), now=0.0)
    assert isinstance(decision, Refuse) and decision.reason is Reason.CONTEXT_LENGTH_EXCEEDED


def test_request_beyond_current_working_budget_but_within_ceiling_is_429_with_retry():
    adm = two_classes(budget=1000)
    adm.set_budget(400)
    decision = adm.offer(req("batch", 500), now=0.0)
    assert isinstance(decision, Refuse)
    assert decision.reason is Reason.TOKEN_BUDGET_EXCEEDED
    assert decision.status == 429
    assert 1.0 <= decision.retry_after_s <= 120.0


def test_request_larger_than_the_tenant_quota_itself_is_refused_tenant_quota():
    adm = two_classes(tenants={"small": TenantPolicy(max_tokens_in_flight=200)})
    decision = adm.offer(req("batch", 201, tenant="small"), now=0.0)
    assert isinstance(decision, Refuse) and decision.reason is Reason.TENANT_QUOTA
    assert decision.status == 429


def test_full_budget_queues_then_release_dispatches_the_waiter():
    adm = two_classes(budget=1000)
    first = req("batch", 800)
    assert isinstance(adm.offer(first, 0.0), Admit)
    second = req("batch", 300, at=1.0)
    decision = adm.offer(second, 1.0)
    assert isinstance(decision, Queue)
    assert decision.deadline == pytest.approx(11.0)
    assert adm.advance(2.0).admitted == ()
    adm.release(first.id, 3.0)
    step = adm.advance(3.0)
    assert [a.request.id for a in step.admitted] == [second.id]
    assert step.admitted[0].queued_s == pytest.approx(2.0)


def test_newcomer_never_overtakes_a_waiting_request_of_its_class():
    adm = two_classes(budget=1000)
    adm.offer(req("batch", 700), 0.0)
    big = req("batch", 400)
    assert isinstance(adm.offer(big, 0.0), Queue)
    small = req("batch", 100)
    # 100 would fit in the 300 left, but `big` is ahead of it.
    assert isinstance(adm.offer(small, 0.0), Queue)


def test_interactive_arrivals_dispatch_before_every_queued_batch_request():
    adm = two_classes(budget=1000, slots=2)
    running = [req("batch", 400), req("batch", 400)]
    for r in running:
        assert isinstance(adm.offer(r, 0.0), Admit)
    queued_batch = [req("batch", 100, at=0.1) for _ in range(3)]
    for r in queued_batch:
        assert isinstance(adm.offer(r, 0.1), Queue)  # no free slot
    late_interactive = req("interactive", 100, at=0.5)
    assert isinstance(adm.offer(late_interactive, 0.5), Queue)
    adm.release(running[0].id, 1.0)
    step = adm.advance(1.0)
    assert [a.request.id for a in step.admitted] == [late_interactive.id]


def test_unused_reservation_of_another_class_is_held_back_from_borrowers():
    adm = two_classes(budget=1000, interactive={"reserved_tokens": 400})
    assert isinstance(adm.offer(req("batch", 600), 0.0), Admit)
    # 400 tokens are free, but they are interactive's reservation.
    assert isinstance(adm.offer(req("batch", 100), 0.0), Queue)
    assert isinstance(adm.offer(req("interactive", 400), 0.0), Admit)


def test_batch_borrows_idle_interactive_share_only_beyond_reservations():
    adm = two_classes(budget=1000, interactive={"reserved_tokens": 300}, batch={"limit_tokens": 900})
    # Batch can reach budget - interactive's reservation = 700, not its 900 limit.
    assert adm.class_reach("batch", adm.budget) == 700
    assert isinstance(adm.offer(req("batch", 700), 0.0), Admit)


def test_class_limit_stops_borrowing():
    adm = two_classes(budget=1000, batch={"limit_tokens": 500})
    assert isinstance(adm.offer(req("batch", 400), 0.0), Admit)
    assert isinstance(adm.offer(req("batch", 200), 0.0), Queue)
    assert isinstance(adm.offer(req("interactive", 200), 0.0), Admit)


def test_lower_class_yields_borrowed_budget_while_higher_class_waits_for_it():
    adm = two_classes(budget=1000, batch={"reserved_tokens": 200})
    adm.offer(req("interactive", 750), 0.0)
    # Interactive can reach 800 (budget - batch's reservation): 750 + 300 waits.
    assert isinstance(adm.offer(req("interactive", 300), 0.0), Queue)
    # 250 free tokens exist, but borrowing them would starve the waiting interactive request.
    assert isinstance(adm.offer(req("batch", 250), 0.0), Queue)


def test_batch_within_its_reservation_still_runs_while_interactive_waits():
    adm = two_classes(budget=1000, batch={"reserved_tokens": 300})
    adm.offer(req("interactive", 650), 0.0)
    assert isinstance(adm.offer(req("interactive", 400), 0.0), Queue)  # needs 1050 - waits
    # Batch's guaranteed 300 are not interactive's to take.
    assert isinstance(adm.offer(req("batch", 300), 0.0), Admit)


def test_no_free_slot_queues_even_with_budget_left():
    adm = two_classes(budget=10_000, slots=1)
    adm.offer(req("batch", 10), 0.0)
    assert isinstance(adm.offer(req("interactive", 10), 0.0), Queue)


def test_prefill_limit_holds_back_a_burst_of_long_prompts_until_first_token():
    adm = two_classes(budget=10_000, slot_context=10_000, max_prefill_tokens=1000)
    first = req("batch", 900, prompt=800)
    adm.offer(first, 0.0)
    second = req("batch", 900, prompt=800)
    assert isinstance(adm.offer(second, 0.0), Queue)
    assert adm.first_token(first.id) is True
    assert adm.first_token(first.id) is False
    assert [a.request.id for a in adm.advance(0.5).admitted] == [second.id]


def test_tenant_at_its_quota_waits_without_blocking_other_tenants_of_the_class():
    adm = two_classes(budget=10_000, slot_context=10_000, tenants={"greedy": TenantPolicy(max_tokens_in_flight=500)})
    adm.offer(req("batch", 400, tenant="greedy"), 0.0)
    capped = req("batch", 400, tenant="greedy")
    assert isinstance(adm.offer(capped, 0.0), Queue)
    other = req("batch", 400, tenant="polite")
    assert isinstance(adm.offer(other, 0.0), Queue)  # behind `capped`: no overtaking on arrival
    step = adm.advance(0.0)
    assert [a.request.id for a in step.admitted] == [other.id]
    assert capped.id in adm.queue("batch")


def test_queue_full_refuses_with_retry_after_and_changes_nothing():
    adm = two_classes(budget=100, slots=1, batch={"queue_depth": 2})
    adm.offer(req("batch", 100), 0.0)
    adm.offer(req("batch", 100), 0.0)
    adm.offer(req("batch", 100), 0.0)
    before = state_of(adm)
    decision = adm.offer(req("batch", 100), 0.0)
    assert isinstance(decision, Refuse) and decision.reason is Reason.QUEUE_FULL
    assert decision.retry_after_s is not None
    assert state_of(adm) == before


def test_waiter_past_its_deadline_is_expired_not_dispatched():
    adm = two_classes(budget=100, batch={"queue_timeout_s": 5.0})
    running = req("batch", 100)
    adm.offer(running, 0.0)
    late = req("batch", 100)
    adm.offer(late, 0.0)
    adm.release(running.id, 5.0)
    step = adm.advance(5.0)
    assert step.admitted == ()
    assert [(r.request.id, r.reason) for r in step.expired] == [(late.id, Reason.QUEUE_TIMEOUT)]
    assert adm.ledger.in_flight == 0


def test_next_deadline_reports_the_earliest_waiter():
    adm = two_classes(budget=100, interactive={"queue_timeout_s": 2.0}, batch={"queue_timeout_s": 9.0})
    adm.offer(req("batch", 100), 0.0)
    adm.offer(req("batch", 10), 1.0)
    adm.offer(req("interactive", 10), 3.0)
    assert adm.next_deadline() == pytest.approx(5.0)


def test_paused_class_refuses_newcomers_and_holds_its_waiters():
    adm = two_classes(budget=100)
    running = req("batch", 100)
    adm.offer(running, 0.0)
    held = req("batch", 50)
    adm.offer(held, 0.0)
    adm.pause("batch")
    decision = adm.offer(req("batch", 10), 0.0)
    assert isinstance(decision, Refuse) and decision.reason is Reason.CLASS_PAUSED
    assert decision.status == 503
    adm.release(running.id, 1.0)
    assert adm.advance(1.0).admitted == ()
    adm.resume("batch")
    assert [a.request.id for a in adm.advance(1.0).admitted] == [held.id]


def test_drain_refuses_every_waiter_with_drained():
    adm = two_classes(budget=100)
    adm.offer(req("batch", 100), 0.0)
    waiters = [req("batch", 10) for _ in range(3)]
    for r in waiters:
        adm.offer(r, 0.0)
    refused = adm.drain("batch", 1.0)
    assert [r.request.id for r in refused] == [r.id for r in waiters]
    assert {r.reason for r in refused} == {Reason.DRAINED}
    assert len(adm.queue("batch")) == 0


def test_a_drain_of_a_paused_class_tells_the_pauses_retry_after_not_the_drains():
    """On call: pause batch, then drain its queue. The drained clients were told Retry-After 1
    (the drain's estimate, for a queue no longer there); retrying after 1 s they met 503
    class_paused with Retry-After 90. Only the operator ends a pause (R2): a drained waiter of
    a paused class is told its queue_timeout_s at the least, as a newcomer is."""
    adm = two_classes(budget=100, batch={"queue_timeout_s": 90.0})
    for _ in range(4):  # a completed-token rate (from MIN_HOLDS releases): the drain's estimate is a few seconds
        served = req("batch", 20)
        adm.offer(served, 0.0)
        adm.release(served.id, 0.5)
    adm.offer(req("batch", 100), 0.5)
    adm.offer(req("batch", 10), 0.5)
    adm.pause("batch")
    newcomer = adm.offer(req("batch", 10), 1.0)
    (drained,) = adm.drain("batch", 1.0)
    assert isinstance(newcomer, Refuse) and newcomer.retry_after_s == 90.0
    assert drained.reason is Reason.DRAINED and drained.retry_after_s >= 90.0
    # not paused, a drain's refusal keeps the drain's own estimate
    adm.resume("batch")
    adm.offer(req("batch", 10), 2.0)
    (drained,) = adm.drain("batch", 2.0)
    assert drained.retry_after_s < 90.0


def test_a_paused_class_s_waiter_that_times_out_is_told_the_pause_s_retry_after():
    """R2: a refusal that only an operator's action ends is told the class's queue_timeout_s at
    the least. A waiter of a paused class that waits out its queue_timeout_s was told the drain's
    estimate (1 s while another class drains fast) and, back after it, met 503 class_paused."""
    adm = two_classes(budget=100, batch={"queue_timeout_s": 10.0})
    for t in range(10):  # interactive drains fast: the drain's estimate is about a second
        done = req("interactive", 100)
        adm.offer(done, float(t))
        adm.release(done.id, t + 0.5)
    blocker = req("interactive", 100)
    adm.offer(blocker, 10.0)
    waiter = req("batch", 10)
    assert isinstance(adm.offer(waiter, 10.0), Queue)
    adm.pause("batch")
    (expired,) = adm.advance(20.0).expired
    assert expired.request.id == waiter.id and expired.reason is Reason.QUEUE_TIMEOUT
    assert expired.retry_after_s is not None and expired.retry_after_s >= 10.0
    # not paused, a timeout keeps the drain's own estimate
    waiter = req("batch", 10)
    adm.resume("batch")
    assert isinstance(adm.offer(waiter, 20.0), Queue)
    (expired,) = adm.advance(30.0).expired
    assert expired.retry_after_s is not None and expired.retry_after_s < 10.0


def test_release_is_exactly_once():
    adm = two_classes()
    r = req("batch", 100)
    adm.offer(r, 0.0)
    assert adm.release(r.id, 1.0) is not None
    assert adm.release(r.id, 1.0) is None
    assert adm.ledger.in_flight == 0
    assert adm.ledger.double_releases == 1


def test_shrinking_the_budget_revokes_nothing_and_stops_new_admissions():
    adm = two_classes(budget=1000)
    held = [req("batch", 300) for _ in range(3)]
    for r in held:
        adm.offer(r, 0.0)
    adm.set_budget(500)
    assert adm.ledger.in_flight == 900
    assert all(r.id in adm.ledger for r in held)
    assert isinstance(adm.offer(req("interactive", 100), 0.0), Queue)
    adm.release(held[0].id, 1.0)
    adm.release(held[1].id, 1.0)
    assert len(adm.advance(1.0).admitted) == 1


def test_budget_cannot_exceed_the_ceiling():
    adm = two_classes(budget=1000)
    adm.set_budget(5000)
    assert adm.budget == 1000
    with pytest.raises(ValueError):
        adm.set_budget(0)


def test_cancel_removes_a_waiter_without_touching_the_ledger():
    adm = two_classes(budget=100)
    adm.offer(req("batch", 100), 0.0)
    waiter = req("batch", 10)
    adm.offer(waiter, 0.0)
    assert adm.cancel(waiter.id) is not None
    assert adm.cancel(waiter.id) is None
    assert adm.ledger.in_flight == 100
    check_invariants(adm)


def test_retry_after_comes_from_queued_tokens_over_the_measured_drain_rate():
    adm = two_classes(budget=1000, slot_context=1000, slots=1)
    for t in range(10):
        r = req("batch", 200)
        adm.offer(r, float(t))
        adm.release(r.id, float(t) + 0.5)  # 200 tokens released per second
    blocker = req("batch", 1000)
    adm.offer(blocker, 10.0)
    for _ in range(3):
        adm.offer(req("batch", 400), 10.0)  # 1200 tokens queued
    rate = adm.drain_rate.rate(10.0)
    # busy 4.5 of the 9.5 s since the first release: the backend idled between the requests
    # (nothing in flight or waiting), and it drains 200 tokens per half-second hold
    assert rate == pytest.approx(2000 / 4.5)
    expected = (1200 + 400) / rate
    assert adm.retry_after("batch", 400, 10.0) == pytest.approx(expected)


def _busy_spell(adm, start: float) -> float:
    """Ten seconds of 200 tokens released per second from `start`, then 1,200 tokens queued:
    the Retry-After of a 400-token request then."""
    for t in range(10):
        r = req("batch", 200)
        adm.offer(r, start + t)
        adm.release(r.id, start + t + 0.5)  # 200 tokens released per second
    adm.offer(req("batch", 1000), start + 10.0)
    for _ in range(3):
        adm.offer(req("batch", 400), start + 10.0)  # 1200 tokens queued
    return adm.retry_after("batch", 400, start + 10.0)


def test_retry_after_after_an_idle_spell_counts_the_drain_rate_from_the_spell_s_first_release():
    """An idle gap longer than the drain window must not dilute the next busy spell's rate:
    the same traffic an hour later gets the same Retry-After (it got 3.2x, up to 120 s)."""

    fresh = _busy_spell(two_classes(budget=1000, slot_context=1000, slots=1), 0.0)
    adm = two_classes(budget=1000, slot_context=1000, slots=1)
    r = req("batch", 200)
    adm.offer(r, 0.0)
    adm.release(r.id, 0.5)  # the last release before a quiet hour
    assert adm.drain_rate.rate(3600.0) == 0
    assert _busy_spell(adm, 3600.0) == pytest.approx(fresh)  # was 24 s: 2000 tokens over 30 s, not 9.5
    assert fresh == pytest.approx((1200 + 400) / (2000 / 4.5))


def test_retry_after_after_a_lone_request_in_a_quiet_spell_counts_from_the_busy_spell():
    """A trickle before an overload is not the backend's pace: one request served 20 s before
    the overload, with the gate idle in between, must not dilute the overload's drain rate.
    (A trial: the gate, idle but for one request 26 s before 3x load, measured 14 tokens/s
    and told clients refused after a wait Retry-After 120 s, then 55, 42, 28 s, for 30 s,
    while requests of the same size were admitted every second.)"""

    fresh = _busy_spell(two_classes(budget=1000, slot_context=1000, slots=1), 0.0)
    adm = two_classes(budget=1000, slot_context=1000, slots=1)
    r = req("batch", 200)
    adm.offer(r, 0.0)
    adm.release(r.id, 0.5)  # a lone request; then the gate is idle (nothing in flight or queued)
    assert _busy_spell(adm, 15.0) == pytest.approx(fresh, rel=0.05)  # was 17.8 s: 2,200 tokens over 24.5 s


def test_a_few_releases_are_no_drain_rate_so_a_burst_at_a_fresh_gate_is_not_told_minutes():
    """A user's trial: a fresh gate served one request, and 15 s later a burst's refusals were
    told Retry-After 120, 116, 108 ... 9 s (the queue's tokens over that lone release's rate),
    while the slots freed 4.9 s after the burst came. Until MIN_HOLDS releases are in the window
    there is no rate, and the class's own wait bound is told, as at a cold start (R3)."""
    adm = two_classes(budget=1000, slot_context=1000, slots=1, batch={"queue_timeout_s": 10.0})
    for n in range(MIN_HOLDS):
        r = req("batch", 200)
        adm.offer(r, 0.0)
        adm.release(r.id, 0.12)
        if n < MIN_HOLDS - 1:
            assert adm.drain_rate.rate(0.12) == 0  # too few to say
    assert adm.drain_rate.rate(0.12) > 0  # the negative control: enough releases make a rate
    fresh = two_classes(budget=1000, slot_context=1000, slots=1, batch={"queue_timeout_s": 10.0})
    lone = req("batch", 200)
    fresh.offer(lone, 0.0)
    fresh.release(lone.id, 0.12)
    fresh.offer(req("batch", 1000), 15.0)
    for _ in range(3):
        fresh.offer(req("batch", 400), 15.0)  # 1,200 tokens queued
    assert fresh.drain_rate.rate(15.3) == 0
    assert fresh.retry_after("batch", 400, 15.3) == 10.0  # was 8 s: 1,600 tokens at the lone release's 200 a second
    check_invariants(fresh)


def test_retry_after_is_clamped_between_1_and_120_seconds():
    assert clamp_retry(0.01) == 1.0
    assert clamp_retry(10_000.0) == 120.0
    assert clamp_retry(float("nan")) == 120.0
    assert clamp_retry(7.5) == 7.5


def test_unknown_class_is_a_programming_error_for_the_core():
    adm = two_classes()
    with pytest.raises(KeyError):
        adm.offer(req("nope", 10), 0.0)


def test_capacity_change_clamps_budget_to_new_ceiling():
    adm = two_classes(budget=1000)
    adm.set_capacity(Capacity(slots=2, slot_context=256, ceiling=512))
    assert adm.budget == 512
    decision = adm.offer(req("batch", 300), 0.0)
    assert isinstance(decision, Refuse) and decision.reason is Reason.CONTEXT_LENGTH_EXCEEDED


def test_waiting_on_names_what_binds_the_oldest_waiter():
    """The console's "waits on" column (#12): slots, budget, class limit, tenant quota, pause."""
    adm = two_classes(budget=1000)
    assert adm.waiting_on("batch") == ""
    adm.offer(req("batch", 800), 0.0)
    adm.offer(req("batch", 300), 0.0)
    assert adm.waiting_on("batch") == "token budget"
    adm.pause("batch")
    assert adm.waiting_on("batch") == "paused"

    adm = two_classes(budget=1000, slots=1)
    adm.offer(req("batch", 100), 0.0)
    adm.offer(req("batch", 100), 0.0)
    assert adm.waiting_on("batch") == "slots 1/1 busy"

    # the budget has room; interactive's unused reservation holds it (paused or not): a trial
    # read "token budget" with 445 of 1,500 in flight
    adm = two_classes(budget=1000, interactive={"reserved_tokens": 600})
    adm.pause("interactive")
    adm.offer(req("batch", 300), 0.0)
    adm.offer(req("batch", 300), 0.0)
    assert adm.ledger.in_flight == 300 and adm.waiting_on("batch") == "reservations"

    # every slot busy, but no free slot would start it: the budget then held (static) leaves
    # batch nothing beside interactive's 600 (a trial's 31 batch waiters, queued before a what-if
    # held the budget at 1,024 that interactive's reservation took whole, read "slots 4/4 busy")
    adm = two_classes(budget=1000, slots=1, interactive={"reserved_tokens": 600})
    adm.offer(req("interactive", 100), 0.0)
    adm.offer(req("batch", 300), 0.0)
    assert adm.waiting_on("batch") == "slots 1/1 busy"  # it fits once the slot frees
    adm.set_budget(600)
    assert adm.ledger.slots == 1 and adm.waiting_on("batch") == "reservations"
    adm.set_budget(250)
    assert adm.waiting_on("batch") == "token budget"

    adm = two_classes(budget=1000, batch={"limit_tokens": 500})
    adm.offer(req("batch", 400), 0.0)
    adm.offer(req("batch", 200), 0.0)
    assert adm.waiting_on("batch") == "class limit"

    adm = two_classes(budget=1000, tenants={"acme": TenantPolicy(max_tokens_in_flight=500)})
    adm.offer(req("batch", 400, tenant="acme"), 0.0)
    adm.offer(req("batch", 200, tenant="acme"), 0.0)
    assert adm.waiting_on("batch") == "tenant quota"


def test_reservations_past_half_the_ceiling_are_scaled_to_it_so_every_class_keeps_room():
    # R0 (#25): token_budget 600 under interactive's 1,024 reservation left batch nothing: every
    # batch request got 400 "can hold nothing" (before that, "can never hold more than -424").
    from gate.backend.gatekeeper import context_error_fields

    adm = two_classes(budget=600, interactive={"reserved_tokens": 1024})
    assert adm.reserved("interactive") == 300 and adm.reserved("batch") == 0
    assert isinstance(adm.offer(req("batch", 150), 0.0), Admit)  # 300 is batch's to borrow
    too_big = req("batch", 320)  # past what interactive's 300 leaves of the ceiling
    decision = adm.offer(too_big, 0.0)
    assert isinstance(decision, Refuse) and decision.reason is Reason.CONTEXT_LENGTH_EXCEEDED
    assert decision.detail == "request needs 320 tokens; class 'batch' can never hold more than 300"
    assert context_error_fields(adm, too_big)["n_ctx"] == 300
    assert adm.held_back("batch") == 300  # interactive's scaled reservation is still kept for it
    assert isinstance(adm.offer(req("interactive", 150), 0.0), Admit)  # interactive reaches the rest
    check_invariants(adm)


def test_reservations_in_force_follow_the_ceiling_both_ways():
    adm = two_classes(budget=4000, interactive={"reserved_tokens": 1024})
    assert adm.reserved("interactive") == 1024  # within half of 4,000: as configured
    adm.set_capacity(Capacity(slots=4, slot_context=1000, ceiling=1000))
    assert adm.reserved("interactive") == 500
    adm.set_capacity(Capacity(slots=4, slot_context=1000, ceiling=4000))
    assert adm.reserved("interactive") == 1024


# ---- admitted on a bound of the prompt, settled to its count (L7) -----------------------------


def test_a_bound_settled_to_a_smaller_count_holds_what_the_count_would_have_held_from_the_same_moment():
    bounded, direct = two_classes(), two_classes()
    bound = Request("x", "interactive", "t", 400, 100, 0.0)
    counted = Request("x", "interactive", "t", 150, 100, 0.0)
    assert isinstance(bounded.offer(bound, now=0.0), Admit)
    assert isinstance(direct.offer(counted, now=0.0), Admit)
    assert bounded.settle(counted) is True
    assert state_of(bounded) == state_of(direct)
    assert bounded.ledger.get("x").admitted_at == 0.0 and bounded.ledger.get("x").request == counted
    check_invariants(bounded)


def test_a_count_over_its_bound_stays_admitted_only_where_it_would_be_admitted_at_once():
    adm = two_classes(budget=1000)
    assert isinstance(adm.offer(Request("x", "interactive", "t", 100, 100, 0.0), now=0.0), Admit)
    assert isinstance(adm.offer(Request("o", "batch", "t", 300, 300, 0.0), now=0.0), Admit)
    # 250 + 100 beside the other's 600: fits where the bound (200) stood, in its place
    assert adm.settle(Request("x", "interactive", "t", 250, 100, 0.0)) is True
    assert adm.ledger.in_flight == 950 and adm.ledger.get("x").admitted_at == 0.0
    check_invariants(adm)
    # 400 + 100 does not fit beside 600 in a budget of 1000: nothing changes
    held = state_of(adm)
    assert adm.settle(Request("x", "interactive", "t", 400, 100, 0.0)) is False
    assert state_of(adm) == held
    check_invariants(adm)


def test_a_withdrawal_measures_no_hold():
    adm = two_classes()
    empty = state_of(adm)
    assert isinstance(adm.offer(Request("x", "interactive", "t", 100, 100, 0.0), now=0.0), Admit)
    assert adm.withdraw("x") is not None
    assert state_of(adm) == empty
    # withdrawn, not released: nothing ran, so no hold time or drain rate comes from it
    for i in range(20):
        assert isinstance(adm.offer(Request(f"w{i}", "interactive", "t", 10, 10, 1.0), now=1.0), Admit)
        assert adm.withdraw(f"w{i}") is not None
    assert adm.holds.mean_s is None and adm.drain_rate.rate(2.0) == 0
    # the negative control: the same admissions released are measured
    for i in range(20):
        assert isinstance(adm.offer(Request(f"r{i}", "interactive", "t", 10, 10, 1.0), now=1.0), Admit)
        adm.release(f"r{i}", 2.0)
    assert adm.holds.mean_s == pytest.approx(1.0) and adm.drain_rate.rate(2.0) > 0
    assert adm.ledger.double_releases == 0


@pytest.mark.parametrize("ends", ["times_out", "drained", "cancelled"])
def test_retry_after_after_a_quiet_spell_that_began_with_a_paused_class_s_waiter(ends):
    """The busy time stops when nothing is in flight and nothing waits that may start, however
    the last waiter leaves: a paused class's waiter waits for the operator, not the backend.
    Marked at a release with nothing waiting only, the spell with a paused waiter and the quiet
    one after it (the waiter timed out, drained, gone) counted as busy, and the next overload's
    Retry-After was told 3.3x too long (12 s for 3.6 s)."""
    fresh = _busy_spell(two_classes(budget=1000, slot_context=1000, slots=1), 0.0)
    adm = two_classes(budget=1000, slot_context=1000, slots=1)
    r = req("batch", 200)
    adm.offer(r, 0.0)
    waiter = req("batch", 200)
    assert isinstance(adm.offer(waiter, 0.1), Queue)
    adm.pause("batch")
    adm.release(r.id, 0.5)  # only the paused waiter is left: the backend is idle
    if ends == "times_out":
        step = adm.advance(adm.queue("batch").timeout_s + 1.0)
        assert [x.request.id for x in step.expired] == [waiter.id] and not step.admitted
    elif ends == "drained":
        assert [x.request.id for x in adm.drain("batch", 1.0)] == [waiter.id]
    else:
        assert adm.cancel(waiter.id, 1.0) is not None
    adm.resume("batch")
    assert adm.waiting() == 0 and len(adm.ledger) == 0
    assert _busy_spell(adm, 12.0) == pytest.approx(fresh, rel=0.05)  # within the drain window
