"""F7: a lower class leaves free the slots a higher class is expected to need (#25, pure core).

With TTFT objectives nobody waits long enough for priority among waiters to act: a request
that finds a slot free starts, and batch at 2x the rate took the slots that freed before
interactive at 1x arrived (74 served to interactive's 25 on the real host). F7 keeps, from a
lower class, the free slots the higher classes' recent arrival rate x the mean hold says they
will need beside what they hold; a waiter with its turn (G1, the lower class's bounded share)
is exempt.
"""

from __future__ import annotations

from gate.core.admission import DEMAND_WINDOW_S, Admit, Queue, check_invariants
from gate.core.waits import HoldTimes
from tests.unit.core_helpers import req
from tests.unit.test_admission_levers import pair


def _with_demand(adm, *, rate: float, until: float, hold_s: float = 1.0) -> None:
    """Interactive arrivals at `rate` per second up to `until`, each served and released at
    once; holds of `hold_s` measured."""
    for _ in range(8):
        adm.holds.record(hold_s)
    n = int(until * rate)
    for i in range(n):
        t = until - (n - 1 - i) / rate
        r = req("interactive", 100, at=t)
        assert isinstance(adm.offer(r, t), Admit)
        adm.release(r.id, t)
    adm.holds = HoldTimes()
    adm._class_holds.clear()  # interactive's own holds unmeasured: the mean of all, `hold_s`
    for _ in range(8):
        adm.holds.record(hold_s)


def test_batch_leaves_free_the_slots_interactive_is_expected_to_need():
    adm = pair(slots=4)
    _with_demand(adm, rate=2.0, until=10 * DEMAND_WINDOW_S)  # ~2 arrivals/s x 1 s holds: ~2 slots
    assert 1.9 < adm.demand("interactive", 100.0) < 2.1
    assert adm.kept_slots(1) == 2
    batch = [req("batch", 100, at=100.0) for _ in range(3)]
    decisions = [adm.offer(r, 100.0) for r in batch]
    assert [type(d) for d in decisions[:2]] == [Admit, Admit]
    assert not isinstance(decisions[2], Admit)  # the last two free slots are interactive's
    assert adm.waiting_on("batch") in ("", "priority")
    chat = req("interactive", 100, at=100.0)
    assert isinstance(adm.offer(chat, 100.0), Admit)  # a chat arriving finds its slot free
    check_invariants(adm)


def test_negative_control_without_f7_batch_takes_every_free_slot():
    adm = pair(slots=4)
    adm.keep_slots = False
    _with_demand(adm, rate=2.0, until=10 * DEMAND_WINDOW_S)
    assert all(isinstance(adm.offer(req("batch", 100, at=100.0), 100.0), Admit) for _ in range(4))
    assert not isinstance(adm.offer(req("interactive", 100, at=100.0), 100.0), Admit)  # the chat finds none


def test_a_slot_held_by_interactive_counts_toward_what_it_needs():
    adm = pair(slots=4)
    _with_demand(adm, rate=2.0, until=100.0)
    held = req("interactive", 100, at=100.0)
    assert isinstance(adm.offer(held, 100.0), Admit)
    assert adm.kept_slots(1) == 1  # ~2 needed, 1 held
    assert [isinstance(adm.offer(req("batch", 100, at=100.0), 100.0), Admit) for _ in range(3)] == [True, True, False]


def test_the_demand_fades_when_interactive_stops_and_nothing_is_kept_before_holds_are_measured():
    adm = pair(slots=4)
    _with_demand(adm, rate=2.0, until=100.0)
    later = 100.0 + 5 * DEMAND_WINDOW_S  # ~e^-5 of the rate: 0.01 slots
    assert adm.kept_slots(1) == 2
    assert all(isinstance(adm.offer(req("batch", 100, at=later), later), Admit) for _ in range(4))
    unmeasured = pair(slots=4)
    _with_demand(unmeasured, rate=2.0, until=100.0)
    unmeasured.holds = HoldTimes()  # demand, but no hold measured: nothing to size it by
    assert unmeasured.kept_slots(1) == 0


def test_a_paused_higher_class_keeps_nothing_and_the_highest_class_is_never_held():
    adm = pair(slots=4)
    _with_demand(adm, rate=2.0, until=100.0)
    assert adm.kept_slots(10) == 0  # nothing above interactive
    adm.queue("interactive").paused = True
    assert adm.kept_slots(1) == 0


def test_a_batch_waiter_with_its_turn_is_not_held_by_f7():
    # G1 (b): batch's minimum rate holds even when interactive's demand keeps every slot.
    adm = pair(slots=2, aging_s=5.0)
    _with_demand(adm, rate=4.0, until=100.0)  # ~4 slots needed of 2: everything kept
    assert adm.kept_slots(1) == 2
    waiter = req("batch", 100, at=100.0)
    assert isinstance(adm.offer(waiter, 100.0), Queue)  # both slots free, both kept
    assert adm.advance(104.9).admitted == ()
    assert [a.request.id for a in adm.advance(105.0).admitted] == [waiter.id]  # its minimum-rate turn
    check_invariants(adm)


def test_keep_slots_false_in_a_replay_proposal_reaches_the_core():
    # The replay builds its core from the config as the gate does: the proposal must change decisions.
    from tests.unit.test_replay_golden import _case

    on, off = _case("example", ""), _case("example", "budget.keep_slots=false")
    moved = sum(1 for k in on if (on[k].admitted, on[k].reason) != (off[k].admitted, off[k].reason))
    assert moved > 0


def test_the_higher_class_is_sized_by_its_own_holds_not_by_the_lower_class_long_ones():
    # batch's long generations (30 s) must not make interactive's 1 s chats look like 30 s ones:
    # at 1 chat/s that would keep all 4 slots from batch instead of the 1 interactive needs.
    adm = pair(slots=4)
    _with_demand(adm, rate=1.0, until=100.0)
    for _ in range(24):
        adm.holds.record(30.0)  # every class's mean: batch's long holds weigh in
    own = adm._class_holds["interactive"] = HoldTimes()
    for _ in range(8):
        own.record(1.0)
    assert adm.holds.mean_s > 10
    assert adm.kept_slots(1) == 1  # interactive's own ~1 s holds x ~1/s
    adm._class_holds.clear()  # the negative control: sized by every class's mean
    assert adm.kept_slots(1) == 4


def test_a_release_records_the_hold_for_its_class():
    adm = pair(slots=4)
    for i in range(4):
        r = req("interactive", 100, at=float(i))
        adm.offer(r, float(i))
        adm.release(r.id, i + 2.0)
    assert adm._class_holds["interactive"].mean_s == 2.0 and "batch" not in adm._class_holds
