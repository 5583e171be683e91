"""Multi-task requests in the pure core (L5, A5): one request, several slots, one release.

llama-server runs a list of prompts, ``n > 1``, a list of embedding inputs or rerank documents
as one task per item, each in its own slot. The gate admits such a request for all of its tasks
at once, or not at all, so llama-server never has to defer a task the gate dispatched.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gate.core.admission import Admission, Admit, Capacity, Queue, Refuse, check_invariants
from gate.core.ledger import Ledger, Request
from gate.core.ledger import check_invariants as check_ledger
from gate.core.reasons import Reason
from tests.unit.core_helpers import Cls
from tests.unit.test_admission_properties import CLASSES, EXAMPLES, TENANTS, Run, ops, setups

many = st.tuples(
    st.just("arrive_many"),
    st.sampled_from(CLASSES),
    st.sampled_from(TENANTS),
    st.integers(1, 5),  # tasks (more than the slots sometimes: refused at once)
    st.integers(1, 200),  # prompt tokens of each task
    st.integers(0, 200),  # max_tokens of each task (0: no decode, as an embedding)
)


class TaskRun(Run):
    def apply(self, op) -> None:
        if op[0] != "arrive_many":
            super().apply(op)
            return
        _, cls, tenant, tasks, prompt, max_tokens = op
        adm = self.adm
        r = Request(f"r{next(self.ids)}", cls, tenant, prompt * tasks, max_tokens, self.now, tasks=tasks, slot_tokens=prompt + max_tokens)
        slots_before = adm.ledger.slots
        decision = adm.offer(r, self.now)
        if tasks > adm.capacity.slots:
            # A5: never admitted, never queued: refused at once, saying how many tasks and slots.
            assert isinstance(decision, Refuse) and decision.reason is Reason.INVALID_REQUEST
            assert f"{tasks} tasks" in decision.detail and f"{adm.capacity.slots} slots" in decision.detail
        if isinstance(decision, Admit):
            assert adm.ledger.slots == slots_before + tasks  # all of its slots, at once
            self.on_admit([decision], from_queue=False)
        elif isinstance(decision, Refuse):
            self.fates[r.id] += 1
        else:
            assert isinstance(decision, Queue)
        check_invariants(adm)

    def finish(self) -> None:
        super().finish()
        assert self.adm.ledger.slots == 0


@EXAMPLES
@given(setup=setups(), seq=st.lists(st.one_of(ops, many, many), max_size=60))
def test_multi_task_requests_hold_every_slot_at_once_and_give_all_back_exactly_once(setup, seq):
    run = TaskRun(*setup)
    for op in seq:
        run.apply(op)
    run.finish()


def _adm(slots: int = 4, ctx: int = 1000) -> Admission:
    return Admission([Cls("c", 10)], Capacity(slots=slots, slot_context=ctx, ceiling=slots * ctx))


def test_cost_counts_each_tasks_generation_limit():
    r = Request("x", "c", "t", prompt_tokens=30, max_tokens=10, arrival=0.0, tasks=3, slot_tokens=20)
    assert r.cost == 60 and r.largest_task == 20
    assert Request("y", "c", "t", 30, 10, 0.0).largest_task == 40  # one task: its whole cost


def test_a_request_with_more_tasks_than_slots_is_refused_at_once():
    adm = _adm(slots=2)
    decision = adm.offer(Request("x", "c", "t", 30, 5, 0.0, tasks=3, slot_tokens=15), 0.0)
    assert isinstance(decision, Refuse) and decision.status == 400
    assert "3 tasks" in decision.detail and "2 slots" in decision.detail
    assert adm.ledger.slots == 0 and adm.waiting() == 0


def test_the_largest_task_must_fit_a_slot_not_the_sum():
    adm = _adm(slots=4, ctx=100)
    # 3 tasks of 60 tokens: 180 in all, more than one slot's 100, but each task fits its slot.
    assert isinstance(adm.offer(Request("ok", "c", "t", 150, 10, 0.0, tasks=3, slot_tokens=60), 0.0), Admit)
    big = adm.offer(Request("big", "c", "t", 30, 95, 0.0, tasks=1), 0.0)
    assert isinstance(big, Refuse) and big.reason is Reason.CONTEXT_LENGTH_EXCEEDED
    wide = adm.offer(Request("wide", "c", "t", 200, 10, 0.0, tasks=2, slot_tokens=110), 0.0)
    assert isinstance(wide, Refuse) and "largest of its 2 tasks needs 110" in wide.detail


def test_a_multi_task_request_waits_until_all_its_slots_are_free():
    adm = _adm(slots=4)
    assert isinstance(adm.offer(Request("a", "c", "t", 10, 10, 0.0), 0.0), Admit)
    assert isinstance(adm.offer(Request("b", "c", "t", 10, 10, 0.0), 0.0), Admit)
    # 3 tasks, 2 slots free: it waits rather than holding two and letting llama-server defer one.
    assert isinstance(adm.offer(Request("m", "c", "t", 30, 10, 0.0, tasks=3, slot_tokens=20), 0.0), Queue)
    assert adm.ledger.slots == 2
    adm.release("a", 1.0)
    assert adm.advance(1.0).admitted[0].request.id == "m"
    assert adm.ledger.slots == 4 and len(adm.ledger) == 2
    assert adm.release("m", 2.0) is not None and adm.release("m", 2.0) is None
    assert adm.ledger.slots == 1
    check_invariants(adm)


def test_ledger_l5_counts_slots():
    led = Ledger()
    led.reserve(Request("a", "c", "t", 10, 0, 0.0, tasks=4, slot_tokens=3), 0.0)
    assert led.slots == 4 and led.in_flight == 10
    check_ledger(led)
    led.release("a")
    assert led.slots == 0 and led.in_flight == 0


def test_ledger_l8_counts_each_classs_slots_through_a_swap_and_a_release():
    """L8 (F7 reads it per class): the tasks per class, kept through swap (a class change too)
    and release, absent at zero as L2's sums."""
    led = Ledger()
    led.reserve(Request("a", "chat", "t", 10, 0, 0.0, tasks=3), 0.0)
    led.reserve(Request("b", "batch", "t", 10, 0, 0.0), 0.0)
    assert led.slots_by_class == {"chat": 3, "batch": 1}
    led.swap(Request("a", "batch", "t", 10, 0, 0.0, tasks=2))
    assert led.slots_by_class == {"batch": 3}
    check_ledger(led)
    led.release("b")
    led.release("a")
    assert led.slots_by_class == {}
