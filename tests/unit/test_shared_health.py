"""The shared limits' health state machine and fail_open's 1/N share (gate/fleet/sharedlimits/health.py)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gate.fleet.sharedlimits.health import Flip, SharedHealth, local_share


def test_a_connection_error_degrades_at_once_to_the_policy() -> None:  # rule 1
    for policy in ("fail_open", "fail_closed"):
        h = SharedHealth(policy)
        assert h.failed("refused") == Flip("ok", policy, "refused", 1)
        assert h.state == policy and h.degraded
        assert h.failed("refused again") is None  # rule 4: once per change


def test_slow_answers_degrade_only_when_they_come_in_a_row() -> None:  # rule 2
    h = SharedHealth("fail_open", timeouts_to_degrade=3)
    assert h.timed_out("slow") is None
    assert h.timed_out("slow") is None
    h.answered()  # one answer in time resets the count
    assert h.timed_out("slow") is None
    assert h.timed_out("slow") is None
    flip = h.timed_out("slow")
    assert flip is not None and (flip.old, flip.new) == ("ok", "fail_open")
    assert "3 calls in a row" in flip.why
    assert h.timed_out("slow") is None


def test_only_a_probe_in_time_brings_a_degraded_gate_back() -> None:  # rule 3
    h = SharedHealth("fail_closed")
    h.failed("down")
    h.answered()  # a late admission answer is no probe
    assert h.state == "fail_closed"
    assert h.probed(gates=3, in_time=False) is None  # answers, but too slowly for admission
    assert h.state == "fail_closed"
    assert h.probed(gates=3, in_time=True) == Flip("fail_closed", "ok", "Redis answers in time again", 3)
    assert h.state == "ok" and not h.degraded
    assert h.probed(gates=3, in_time=True) is None


def test_fail_open_divides_by_the_gates_seen_at_the_last_probe() -> None:  # rule 5
    h = SharedHealth("fail_open")
    assert h.divisor == 1 and not h.ever_seen
    h.probed(gates=3, in_time=True)
    assert h.divisor == 1  # ok: the gate's own limits stay whole
    flip = h.failed("down")
    assert flip is not None and flip.gates == 3
    assert h.divisor == 3
    h.probed(gates=0, in_time=False)  # never below one gate: this one
    assert h.gates == 1 and h.divisor == 1


def test_fail_closed_never_divides() -> None:
    h = SharedHealth("fail_closed")
    h.probed(gates=4, in_time=True)
    h.failed("down")
    assert h.divisor == 1  # limited tenants are refused; nothing to divide


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError):
        SharedHealth("open")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        SharedHealth("fail_open", timeouts_to_degrade=0)


@settings(max_examples=500)
@given(limit=st.integers(min_value=1, max_value=10**7), gates=st.integers(min_value=1, max_value=64))
def test_n_local_shares_never_add_up_to_more_than_the_limit_when_each_can_have_one(limit: int, gates: int) -> None:
    share = local_share(limit, gates)
    assert share is not None and share >= 1
    if limit >= gates:
        assert share * gates <= limit
        assert (share + 1) * gates > limit  # and no smaller than it need be
    else:
        assert share == 1  # fail_open still serves the tenant
    assert local_share(limit, 1) == limit
    assert local_share(None, gates) is None


@settings(max_examples=500)
@given(
    policy=st.sampled_from(["fail_open", "fail_closed"]),
    events=st.lists(
        st.one_of(
            st.just(("answered",)),
            st.just(("timed_out",)),
            st.just(("failed",)),
            st.tuples(st.just("probed"), st.integers(min_value=0, max_value=8), st.booleans()),
        ),
        max_size=60,
    ),
)
def test_every_flip_is_reported_once_and_matches_the_state(policy: str, events: list[tuple]) -> None:
    h = SharedHealth(policy)  # type: ignore[arg-type]
    state = h.state
    for event in events:
        if event[0] == "probed":
            flip = h.probed(event[1], event[2])
        elif event[0] == "answered":
            flip = h.answered()
        else:
            flip = getattr(h, event[0])("why")
        if flip is None:
            assert h.state == state  # rule 4: no flip, no change
        else:
            assert (flip.old, flip.new) == (state, h.state) and flip.old != flip.new
        assert h.state in ("ok", policy)
        assert h.divisor == (h.gates if h.state == "fail_open" else 1) and h.gates >= 1
        state = h.state
