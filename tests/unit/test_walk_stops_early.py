"""T2's walk stops at the first waiter that can be neither late nor the earliest moment (#24).

With the waiters' moments rising in the order they are walked (`ClassQueue.from_ordered`) and a
first-token estimate that never falls as a prompt grows (`ttft_grows_with_prompt`, as the gate
and the replay build the core), the widest prompt waiting bounds every later waiter's estimate,
and so its start-by and late moments: the walk stops where that bound shows none of the rest
matters. It must answer exactly what the whole walk answers: here a core that stops and one
that walks every waiter are driven through the same random sequences and compared to the bit
after every step, and a walk is shown to stop (fewer estimates asked than waiters).
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gate.core.admission import Admission, Capacity, Queue
from gate.core.ledger import Request
from tests.unit.test_admission_levers import EXAMPLES, ObjCls
from tests.unit.test_aging_incremental import same_answers


def _core(
    stops: bool, objective_ms: float, base: float, rate: float, asked: list[int] | None = None, slots: int = 48, depth: int = 24
) -> Admission:
    def expected(r: Request, prefilling: int) -> float:
        if asked is not None:
            asked.append(r.prompt_tokens)
        t = base + (r.prompt_tokens + prefilling) / rate
        return t if t > 0.0 else 0.0

    classes = [
        ObjCls("interactive", 10, reserved_tokens=0, queue_depth=depth, queue_timeout_s=30.0, ttft_objective_ms=objective_ms),
        ObjCls("batch", 1, reserved_tokens=0, queue_depth=depth, queue_timeout_s=60.0),
    ]
    # a small pool: the waiters wait for tokens, every place in the slots' first round (with 12
    # slots, some behind held slots, which may be held past every hold measured: frees that grow)
    capacity = Capacity(slots=slots, slot_context=2000, ceiling=2000)
    return Admission(classes, capacity, expected_ttft=expected, default_ttft_objective_ms=2 * objective_ms, ttft_grows_with_prompt=stops)


def _walk(adm: Admission, now: float | None) -> tuple[list[tuple[str, str | None]], str | None]:
    late, at = adm._start_by_walk(now, late=True)
    return [(w.request.id, None if x is None else x.hex()) for w, x in late], None if at is None else at.hex()


step_ops = st.one_of(
    st.tuples(st.just("arrive"), st.sampled_from(("interactive", "batch")), st.integers(1, 900), st.integers(1, 300)),
    st.tuples(st.just("arrive"), st.sampled_from(("interactive", "batch")), st.integers(1, 900), st.integers(1, 300)),
    st.tuples(st.just("release"), st.integers(0, 50)),
    st.tuples(st.just("release"), st.just(-1)),  # the newest: short holds, the older slots overrun them
    st.tuples(st.just("first_token"), st.integers(0, 50)),
    st.tuples(st.just("tick"), st.floats(0.0, 0.4)),
)


@EXAMPLES
@given(
    objective_ms=st.floats(200.0, 4000.0),
    base=st.floats(-0.05, 0.3),
    rate=st.floats(1000.0, 50000.0),
    seq=st.lists(step_ops, min_size=10, max_size=120),
    back=st.sets(st.integers(0, 119), max_size=3),
    slots=st.sampled_from((12, 48)),
)
def test_a_walk_that_stops_early_answers_what_the_whole_walk_answers(objective_ms, base, rate, seq, back, slots):
    cores = [
        _core(True, objective_ms, base, rate, slots=slots, depth=slots // 2),
        _core(False, objective_ms, base, rate, slots=slots, depth=slots // 2),
    ]
    now = 0.0
    for n, op in enumerate(seq):
        answers = []
        for adm in cores:
            held = [r.request.id for r in adm.ledger]
            if op[0] == "arrive":
                at = max(0.0, now - 0.5) if n in back else now  # now and then a moment that went back
                d = adm.offer(Request(f"r{n}", op[1], "t", op[2], op[3], at), at)
                answers.append(repr(d))
            elif op[0] == "release" and held:
                adm.release(held[op[1] % len(held)], now)
            elif op[0] == "first_token" and held:
                adm.first_token(held[op[1] % len(held)])
            step = adm.advance(now + (op[1] if op[0] == "tick" else 0.0))
            answers.append(repr(step))
            answers.append(_walk(adm, now))
            answers.append(_walk(adm, None))
            d_at = adm.next_deadline(now)
            answers.append(None if d_at is None else d_at.hex())
        if op[0] == "tick":
            now += op[1]
        assert answers[: len(answers) // 2] == answers[len(answers) // 2 :]
    same_answers(cores[0], now)


@pytest.mark.parametrize("slots", [48, 24])
def test_the_walk_asks_fewer_estimates_than_there_are_waiters_and_answers_the_same(slots):
    """48 slots: every waiter's place a free slot; 24: the last places behind slots held past
    every hold measured (their frees grow, the halfway moments)."""
    asked: list[int] = []
    cores = [_core(True, 2000.0, 0.02, 20000.0, asked, slots), _core(False, 2000.0, 0.02, 20000.0, slots=slots)]
    for adm in cores:
        for i in range(8):  # 8 x 250 tokens fill the pool, then measured holds
            adm.offer(Request(f"h{i}", "batch", "t", 150, 100, 0.0), 0.0)
        for i in range(4):
            adm.release(f"h{i}", 1.0 + i * 0.1)
        for i in range(4, 8):
            adm.offer(Request(f"h{i}b", "batch", "t", 150, 100, 1.5), 1.5)
        for i in range(20):  # 20 waiters, 50 ms apart, of prompts 100-580 tokens
            at = 2.0 + 0.05 * i
            assert isinstance(adm.offer(Request(f"w{i}", "interactive", "t", 100 + 24 * i, 100, at), at), Queue)
    assert cores[0].queue("interactive").from_ordered
    asked.clear()
    stopped = _walk(cores[0], 3.0)
    assert 0 < len(asked) < 20  # the widest prompt's estimate and a few waiters', not 20
    assert stopped == _walk(cores[1], 3.0)
    assert stopped[1] is not None
