"""T1 counts the higher classes' arrivals a lower-class newcomer will wait behind (#25).

A batch newcomer queued behind the waiters it sees is passed by every interactive request that
arrives while it waits (priority, G2). Counted on the waiters it saw, it was queued and then
refused after its wait once they came: a trial with two classes (interactive 1x, batch 2x, a 5 s
batch objective) had 219 of 443 batch refusals after a wait, most 3.5-5 s in. In virtual time
(bench/discipline_sim.py --spread 0.3, two classes at the example's 2 s objective, 3 seeds):
batch refused after a wait 284 of 1,299 before, 128 of 1,303 with the higher classes' demand
counted; served in time 115 -> 111 batch, 533 -> 536 interactive.

The rule, small: one slot held 2 s, a batch newcomer 1.5 s from it with a 0.2 s first token and
a 2 s objective makes it alone, and not behind the one or two chats expected to arrive in those
1.5 s; the same with no chat coming is queued; and with the rule taken away (a negative control)
it is queued either way.
"""

from __future__ import annotations

from gate.core.admission import Admission, Admit, Capacity, Queue, Refuse
from gate.core.reasons import Reason
from tests.unit.core_helpers import req
from tests.unit.test_admission_levers import ObjCls


def one_slot() -> Admission:
    classes = [
        ObjCls("interactive", 10, queue_depth=16, ttft_objective_ms=2000.0),
        ObjCls("batch", 1, queue_depth=16, queue_timeout_s=60.0, ttft_objective_ms=2000.0),
    ]
    adm = Admission(classes, Capacity(slots=1, slot_context=4000, ceiling=4000), expected_ttft=lambda r, p: 0.2)
    adm.holds.min_holds = 1
    adm.keep_slots = False  # F7's kept slots aside: the arrivals alone
    first = req("interactive", at=0.0)
    assert isinstance(adm.offer(first, 0.0), Admit)
    adm.release(first.id, 2.0)  # one hold measured: 2 s
    assert isinstance(adm.offer(req("interactive", at=2.0), 2.0), Admit)  # the slot is due at 4.0
    return adm


def chats_arriving(adm: Admission, n: int, at: float) -> None:
    """`n` chats offered at `at` whose clients then go away: interactive's demand, nobody waiting."""
    for _ in range(n):
        r = req("interactive", at=at)
        if isinstance(adm.offer(r, at), Queue):
            adm.cancel(r.id)
    assert adm.waiting() == 0


def test_a_batch_newcomer_that_chats_arriving_during_its_wait_would_pass_is_refused_at_arrival():
    adm = one_slot()
    chats_arriving(adm, 10, 2.0)  # ~1.1 chats a second lately
    assert adm.demand("interactive", 2.5) > 1.0
    decision = adm.offer(req("batch", at=2.5), 2.5)
    assert isinstance(decision, Refuse) and decision.reason is Reason.QUEUE_TIMEOUT, decision
    # the two chats expected within its 1.5 s, said as not here yet (nobody waits)
    assert "for 2 ahead (2 of them expected to arrive or take a turn first)" in decision.detail, decision.detail


def test_with_no_chat_coming_the_same_batch_newcomer_is_queued():
    adm = one_slot()
    assert adm.demand("interactive", 2.5) < 0.5
    assert isinstance(adm.offer(req("batch", at=2.5), 2.5), Queue)


def test_negative_control_without_the_rule_it_is_queued_to_be_passed(monkeypatch):
    monkeypatch.setattr(Admission, "_higher_coming", lambda self, priority, within_s: 0)
    adm = one_slot()
    chats_arriving(adm, 10, 2.0)
    assert isinstance(adm.offer(req("batch", at=2.5), 2.5), Queue)
