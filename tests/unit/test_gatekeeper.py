"""The async shell around admission: futures, the deadline timer, exactly-once release."""

from __future__ import annotations

import asyncio

import pytest

from gate.backend.gatekeeper import Gatekeeper, Refused
from gate.core.reasons import Reason
from tests.unit.core_helpers import req, two_classes


def gatekeeper(**kw) -> Gatekeeper:
    return Gatekeeper(two_classes(**kw))


async def test_fitting_request_gets_a_ticket_that_releases_exactly_once():
    gk = gatekeeper()
    ticket = await gk.acquire(req("batch", 100))
    assert gk.admission.ledger.in_flight == 100
    assert gk.release(ticket) is True
    assert gk.release(ticket) is False
    assert gk.admission.ledger.in_flight == 0
    assert gk.admission.ledger.double_releases == 0


async def test_waiter_is_dispatched_when_the_holder_releases():
    gk = gatekeeper(budget=100)
    holder = await gk.acquire(req("batch", 100))
    waiter = asyncio.create_task(gk.acquire(req("batch", 60)))
    await asyncio.sleep(0)  # let the waiter enqueue
    assert len(gk.admission.queue("batch")) == 1
    gk.release(holder)
    ticket = await waiter
    assert ticket.request.cost == 60
    assert ticket.owner is waiter
    gk.release(ticket)
    assert gk.admission.ledger.in_flight == 0


async def test_queue_timeout_refuses_through_the_deadline_timer():
    gk = gatekeeper(budget=100, batch={"queue_timeout_s": 0.05})
    holder = await gk.acquire(req("batch", 100))
    with pytest.raises(Refused) as exc:
        await gk.acquire(req("batch", 50))
    assert exc.value.refusal.reason is Reason.QUEUE_TIMEOUT
    assert exc.value.refusal.retry_after_s >= 1.0
    assert len(gk.admission.queue("batch")) == 0
    gk.release(holder)
    assert gk.admission.ledger.in_flight == 0


async def test_cancelled_waiter_leaves_the_queue_and_the_ledger_untouched():
    gk = gatekeeper(budget=100)
    holder = await gk.acquire(req("batch", 100))
    waiter = asyncio.create_task(gk.acquire(req("batch", 50)))
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert len(gk.admission.queue("batch")) == 0
    gk.release(holder)
    assert gk.admission.ledger.in_flight == 0
    assert gk.tickets == ()


async def test_waiter_cancelled_in_the_instant_it_is_dispatched_gives_the_slot_back():
    gk = gatekeeper(budget=100)
    holder = await gk.acquire(req("batch", 100))
    waiter = asyncio.create_task(gk.acquire(req("batch", 50)))
    await asyncio.sleep(0)
    gk.release(holder)  # dispatches the waiter: its future now holds a ticket
    waiter.cancel()  # ...but its task is cancelled before it resumes
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert gk.admission.ledger.in_flight == 0
    assert gk.tickets == ()


async def test_drain_refuses_every_waiter_with_drained():
    gk = gatekeeper(budget=100)
    holder = await gk.acquire(req("batch", 100))
    waiters = [asyncio.create_task(gk.acquire(req("batch", 10))) for _ in range(3)]
    await asyncio.sleep(0)
    assert gk.drain("batch") == 3
    for w in waiters:
        with pytest.raises(Refused) as exc:
            await w
        assert exc.value.refusal.reason is Reason.DRAINED
    gk.release(holder)
    assert gk.admission.ledger.in_flight == 0


async def test_reaper_releases_a_ticket_whose_owner_task_is_gone():
    gk = gatekeeper()

    async def leaky() -> None:
        ticket = await gk.acquire(req("batch", 100))
        ticket.expected_s = 0.0  # overdue at once

    await asyncio.create_task(leaky())
    assert gk.admission.ledger.in_flight == 100
    reaped = gk.reap()
    assert len(reaped) == 1 and gk.reaped == 1
    assert gk.admission.ledger.in_flight == 0


async def test_reaper_leaves_live_requests_alone():
    gk = gatekeeper()
    ticket = await gk.acquire(req("batch", 100))
    ticket.expected_s = 0.0
    assert gk.reap() == []  # this test's task still owns it
    gk.release(ticket)


async def test_immediate_refusal_raises_without_waiting():
    gk = gatekeeper(slot_context=100)
    with pytest.raises(Refused) as exc:
        await gk.acquire(req("batch", 101))
    assert exc.value.refusal.reason is Reason.CONTEXT_LENGTH_EXCEEDED


# ---- the forward beside the count: admit_now, then settle or withdraw ---------------------------


async def test_a_bound_admitted_now_is_settled_or_withdrawn_exactly_once_and_frees_its_excess_for_a_waiter():
    from gate.core.ledger import Request

    gk = gatekeeper(budget=400)
    bound = gk.admit_now(Request("b", "batch", "t", 300, 100, 0.0))
    assert bound is not None and gk.admission.ledger.in_flight == 400
    waiter = asyncio.create_task(gk.acquire(req("batch", 200)))
    await asyncio.sleep(0)  # let the waiter enqueue
    assert gk.admit_now(req("interactive", 10)) is None  # somebody waits: count first, as before
    assert gk.admission.ledger.in_flight == 400 and len(gk.admission.queue("interactive")) == 0
    # the count: 100 prompt tokens, not 300; the 200 over it come back and the waiter goes
    assert gk.settle(bound, Request("b", "batch", "t", 100, 100, 0.0)) is True
    ticket = await waiter
    assert gk.admission.ledger.in_flight == 400 and bound.request.cost == 200
    assert gk.release(bound, ran=False) is True and gk.release(bound, ran=False) is False and gk.release(bound) is False
    gk.release(ticket)
    assert gk.admission.ledger.in_flight == 0 and gk.admission.ledger.double_releases == 0


async def test_a_count_that_does_not_fit_where_its_bound_stood_changes_nothing_until_withdrawn():
    from gate.core.ledger import Request

    gk = gatekeeper(budget=200)
    bound = gk.admit_now(Request("b", "batch", "t", 50, 50, 0.0))
    assert bound is not None
    assert gk.settle(bound, Request("b", "batch", "t", 151, 50, 0.0)) is False  # 201 > 200
    assert not bound.released and gk.admission.ledger.in_flight == 100 and bound.request.cost == 100
    assert gk.release(bound, ran=False) is True and gk.tickets == () and gk.admission.ledger.in_flight == 0
    assert gk.release(bound) is False and gk.admission.ledger.double_releases == 0
