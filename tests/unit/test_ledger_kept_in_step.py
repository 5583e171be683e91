"""The ledger's kept figures (#24): L9, the moments of admission kept as a list between walks
(appended at a reservation, taken out at a release), and L10, the prefilling reservations
counted per class. Each must equal what a walk of the ledger gives after any sequence of
reservations, first tokens, swaps and releases, with the list asked for (and so kept) at any
point: a kept figure that went stale would move T2's places (L9) or F6's yield (L10)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gate.core.ledger import Ledger, Request, check_invariants

ops = st.lists(
    st.one_of(
        st.tuples(st.just("reserve"), st.sampled_from(("a", "b", "c")), st.integers(0, 50), st.floats(-1.0, 3.0)),
        st.tuples(st.just("release"), st.integers(0, 40)),
        st.tuples(st.just("first_token"), st.integers(0, 40)),
        st.tuples(st.just("swap"), st.integers(0, 40), st.sampled_from(("a", "b", "c")), st.integers(0, 50)),
        st.tuples(
            st.just("ask"),
        ),
    ),
    max_size=80,
)


@settings(max_examples=400, deadline=None)
@given(seq=ops)
def test_the_kept_moments_and_prefilling_counts_are_what_a_walk_of_the_ledger_gives(seq):
    ledger = Ledger()
    now = 0.0
    for n, op in enumerate(seq):
        held = [r.request.id for r in ledger]
        if op[0] == "reserve":
            now += op[3]  # now and then a moment that goes back: the ledger is no longer oldest first
            ledger.reserve(Request(f"r{n}", op[1], "t", op[2], 1, now), now)
        elif op[0] == "release" and held:
            ledger.release(held[op[1] % len(held)])
        elif op[0] == "first_token" and held:
            ledger.first_token(held[op[1] % len(held)])
        elif op[0] == "swap" and held:
            rid = held[op[1] % len(held)]
            ledger.swap(Request(rid, op[2], "t", op[3], 1, 0.0))
        elif op[0] == "ask":
            assert ledger.moments() == [r.admitted_at for r in ledger]
        check_invariants(ledger)  # L9 (while kept) and L10 among them
        assert ledger.moments() == [r.admitted_at for r in ledger]
        counts: dict[str, int] = {}
        for r in ledger:
            if r.prefilling:
                counts[r.request.cls] = counts.get(r.request.cls, 0) + 1
        assert ledger.prefilling_by_class == counts


def test_a_release_takes_out_one_moment_of_several_equal_ones():
    """Two reservations admitted at one instant: releasing either leaves one moment of it."""
    ledger = Ledger()
    for i, at in enumerate((1.0, 2.0, 2.0, 3.0)):
        ledger.reserve(Request(f"r{i}", "a", "t", 10, 1, at), at)
    assert ledger.moments() == [1.0, 2.0, 2.0, 3.0]
    ledger.release("r2")
    assert ledger.moments() == [1.0, 2.0, 3.0]
    ledger.release("r0")
    ledger.reserve(Request("r4", "a", "t", 10, 1, 4.0), 4.0)
    assert ledger.moments() == [2.0, 3.0, 4.0]
    check_invariants(ledger)
