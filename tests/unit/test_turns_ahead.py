"""T1 counts only the lower classes' bounded share ahead of a higher-class newcomer (#25, G1).

A trial with the example config but batch given a long objective of its own (60 s: batch may
wait, chats may not): batch waiters aged in the queue, and with no interactive waiter every
aged one "has its turn" (G1 a: no higher class waits). T1 counted them all ahead of each chat
that arrived ("expected wait 10761 ms for 19 ahead"), refused it at arrival, so interactive
never waited, so every aged batch waiter kept its turn: interactive served 0 in the last 20 s
of a 60 s run, batch 45. Had the chat waited, G1 would have let batch pass it only by its
bounded share (one turn per aging_s, or within its reservation): that is what T1 must count.
"""

from __future__ import annotations

from gate.core.admission import Admission, Admit, Queue, Refuse, check_invariants
from gate.tools import overload_sim as sim
from tests.unit.core_helpers import req
from tests.unit.test_admission_levers import ObjCls, pair


def aged_batch_behind_busy_slots(batch_reserved: int = 0, chat_first: bool = False) -> tuple[Admission, list, list]:
    """4 slots held by batch since 8.0 (holds measured: 8 s, due at 16.0); at 14.0 six batch
    waiters have aged (none within batch's reservation unless `batch_reserved` says so).
    `chat_first`: an interactive request took one of the first 4 slots at 0.0, interactive's
    last start (its minimum-rate turn is due from 5.0)."""
    adm = pair(slots=4, aging_s=5.0, objective_ms=3000.0, expected=lambda r, p: 0.2, batch_reserved=batch_reserved)
    adm.holds.min_holds = 1
    first = [req("interactive" if chat_first and i == 0 else "batch", 100, at=0.0) for i in range(4)]
    for r in first:
        assert isinstance(adm.offer(r, 0.0), Admit)
    waiters = [req("batch", 100, at=0.1 * (i + 1)) for i in range(6)]
    for r in waiters:
        assert isinstance(adm.offer(r, r.arrival), Queue)
    for r in first:
        adm.release(r.id, 8.0)
    running = [a.request for a in adm.advance(8.0).admitted]
    assert [r.id for r in running] == [w.id for w in waiters[:4]]  # aged, nobody higher waits
    later = [req("batch", 100, at=8.5) for _ in range(4)]
    for r in later:
        assert isinstance(adm.offer(r, 8.5), Queue)
    return adm, running, waiters[4:] + later


def test_a_chat_is_queued_behind_batch_s_one_turn_not_behind_every_aged_batch_waiter():
    adm, running, aged = aged_batch_behind_busy_slots()
    chat = req("interactive", 100, at=14.0)
    decision = adm.offer(chat, 14.0)
    # one batch turn goes first, then the chat takes the next slot at 16.0: 2.0 s + 0.2 s < 3 s
    assert isinstance(decision, Queue), decision
    for r in running:
        adm.release(r.id, 16.0)
    started = [a.request.id for a in adm.advance(16.0).admitted]
    assert chat.id in started, started  # the count was right: it was served, in time
    assert started[0] == aged[0].id  # batch's bounded share: its one turn went first
    check_invariants(adm)


def test_aged_batch_waiters_within_batch_s_reservation_all_count_ahead_of_the_chat():
    # the other side of the rule: waiters within their class's reservation go first whoever
    # waits (G1 a), so the chat is behind all six and refused at arrival, as before
    adm, _, _ = aged_batch_behind_busy_slots(batch_reserved=1000)
    decision = adm.offer(req("interactive", 100, at=14.0), 14.0)
    assert isinstance(decision, Refuse) and "for 6 ahead" in decision.detail, decision


def test_in_virtual_time_a_long_batch_objective_no_longer_starves_interactive():
    # the example's classes, batch given a 60 s objective; interactive at 1x saturation, batch at
    # 2x (gate/tools/overload_sim: the real core, a crude backend). Before: interactive served
    # 49-58 of ~230 (seeds 1-3) while batch served 205-226; after: 157-170, batch 115-132 and
    # something in every 10 s window.
    classes = [
        ObjCls("interactive", 10, reserved_tokens=1024, queue_depth=64, queue_timeout_s=10.0, ttft_objective_ms=2000.0),
        ObjCls("batch", 1, limit_tokens=16384, queue_depth=256, queue_timeout_s=120.0, ttft_objective_ms=60000.0),
    ]
    adm = sim.admission(classes, slots=4, ceiling=2048, ttft_s=0.2, default_objective_ms=2000.0)
    capacity_rps = 4 / 2.1
    result = sim.run(
        adm,
        [sim.Stream("interactive", capacity_rps), sim.Stream("batch", 2 * capacity_rps)],
        slots=4,
        service_s=2.1,
        ttft_s=0.2,
        duration_s=120.0,
        objective_s={"interactive": 2.0, "batch": 60.0},
        seed=1,
        service_spread=0.3,
    )
    chat, batch = result.classes["interactive"], result.classes["batch"]
    assert chat.within_objective >= 0.6 * chat.sent, sim.summary(result)
    assert min(batch.served_per_window) >= 1, sim.summary(result)  # its bounded share, never starved


def test_a_chat_with_its_minimum_rate_turn_counts_batch_s_bounded_share_not_every_aged_waiter():
    # A trial (batch given a 60 s objective, interactive 0.5/s beside batch 3/s): a chat that
    # came aging_s after interactive's last start has its minimum-rate turn (G1 b), and T1
    # counted every aged batch waiter ahead of it ("expected wait 38791 ms for 66 ahead",
    # Retry-After 40-44 s, the interactive queue empty): with the chat waiting, batch goes
    # first only by its one turn, as for a chat without its turn above.
    adm, running, _ = aged_batch_behind_busy_slots(chat_first=True)
    assert len(adm._aged(14.0)) == 6  # six aged batch waiters, each with its turn while no chat waits
    chat = req("interactive", 100, at=14.0)
    assert adm._newcomer_turn(adm._classes["interactive"], 14.0)  # started nothing since 0.0
    decision = adm.offer(chat, 14.0)
    assert isinstance(decision, Queue), decision  # 1 ahead (batch's turn): a slot at 16.0, in time
    for r in running:
        adm.release(r.id, 16.0)
    started = [a.request.id for a in adm.advance(16.0).admitted]
    assert chat.id in started, started
    check_invariants(adm)
