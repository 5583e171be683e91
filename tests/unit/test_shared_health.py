"""The shared limits' health state machine and fail_open's 1/N share (gate/fleet/sharedlimits/health.py)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gate.fleet.sharedlimits.health import Flip, SharedHealth, fits_local_share, local_share


def test_a_connection_error_degrades_at_once_to_the_policy() -> None:  # rule 1
    for policy in ("fail_open", "fail_closed"):
        h = SharedHealth(policy)
        assert h.failed("refused") == Flip("ok", policy, "refused", 1, "none")  # N never counted, none remembered
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


def test_a_gate_comes_back_once_every_gate_has_renewed_since_redis_answered_it() -> None:  # rule 3
    h = SharedHealth("fail_open", window_s=3.0)
    h.probed(gates=2, in_time=True, now=0.0, redis_ms=0.0, fresh=2)
    h.failed("down")
    assert h.probed(gates=1, in_time=True, now=5.0, redis_ms=5000.0, fresh=1) is None  # the other has not renewed
    assert h.recovering and h.heard_since == 5000.0 and h.state == "fail_open" and h.divisor == 2
    flip = h.probed(gates=2, in_time=True, now=5.5, redis_ms=5500.0, fresh=2)
    assert flip is not None and (flip.old, flip.new) == ("fail_open", "ok") and "2 of 2 gates renewed since" in flip.why
    assert not h.recovering and h.heard_since is None


def test_recovering_ends_after_a_lease_life_and_on_new_trouble() -> None:  # rule 3
    h = SharedHealth("fail_closed", window_s=3.0)
    h.probed(gates=3, in_time=True, now=0.0, redis_ms=0.0, fresh=3)
    h.failed("down")
    assert h.probed(gates=3, in_time=True, now=1.0, redis_ms=1000.0, fresh=1) is None
    h.failed("down again")  # trouble: recovering starts over
    assert not h.recovering and h.state == "fail_closed"
    assert h.probed(gates=3, in_time=True, now=2.0, redis_ms=2000.0, fresh=1) is None
    assert h.heard_since == 2000.0
    assert h.probed(gates=3, in_time=True, now=4.9, redis_ms=4900.0, fresh=2) is None
    flip = h.probed(gates=3, in_time=True, now=5.0, redis_ms=5000.0, fresh=2)  # a silent gate holds nothing now
    assert flip is not None and flip.new == "ok" and "2 of 3" in flip.why


def test_a_call_redis_did_not_answer_in_time_degrades_at_once_by_default() -> None:  # rule 2
    h = SharedHealth("fail_closed")
    flip = h.timed_out("20 ms")
    assert flip is not None and (flip.old, flip.new) == ("ok", "fail_closed")
    assert "did not answer within the wait bound" in flip.why


def test_fail_open_divides_by_the_most_gates_seen_within_the_window() -> None:  # rule 5
    h = SharedHealth("fail_open", window_s=3.0)
    assert h.divisor == 1 and not h.ever_seen
    h.probed(gates=3, in_time=True, now=10.0)
    assert h.divisor == 1  # ok: the gate's own limits stay whole
    h.seen(1, now=11.0)  # one low count (a reservation answer) does not lower N
    assert h.gates == 3
    h.seen(2, now=12.9)
    assert h.gates == 3  # the 3 of t=10 is still within 3 s of the latest count
    flip = h.failed("down")
    assert flip is not None and flip.gates == 3
    assert h.divisor == 3
    h.probed(gates=0, in_time=False, now=13.1)  # never below one gate: this one
    assert h.gates == 3  # degraded: no count lowers N (an outage's first counts may miss gates)
    assert h.probed(gates=1, in_time=True, now=13.2) is not None  # back (no redis_ms: at once)
    h.seen(1, now=16.0)  # ok again: the counts of t <= 12.9 are more than 3 s before the latest
    assert h.gates == 1 and h.divisor == 1


def test_n_stays_what_it_was_while_no_count_comes_in() -> None:  # rule 5: Redis down
    h = SharedHealth("fail_open", window_s=3.0)
    h.probed(gates=2, in_time=True, now=0.0)
    h.failed("down")
    assert h.divisor == 2  # the window is counted from the latest count, not from a clock


def test_the_first_count_after_start_cannot_hide_a_gate_counted_since() -> None:  # rule 5, #23
    h = SharedHealth("fail_open", window_s=3.0)
    h.probed(gates=1, in_time=True, now=0.0)  # the start: the other gate has not renewed yet
    h.seen(2, now=0.2)  # a reservation answer: Redis counts both
    h.probed(gates=1, in_time=True, now=0.5)  # a late renewal of the other gate
    assert h.failed("refused") == Flip("ok", "fail_open", "refused", 2)
    assert h.divisor == 2


def test_a_gate_started_while_redis_is_out_of_reach_divides_by_the_count_its_journal_remembers() -> None:  # rule 5
    h = SharedHealth("fail_open", window_s=3.0)
    h.remember(3)
    assert h.known == "journal" and h.gates == 3
    flip = h.failed("refused")
    assert flip == Flip("ok", "fail_open", "refused", 3, "journal") and h.divisor == 3
    # Redis back: the first counts may miss gates that have not renewed yet, so while degraded
    # they do not lower the remembered N; once back, the counts alone say N
    h.probed(gates=1, in_time=True, now=10.0)
    assert h.known == "counted" and h.state == "ok"
    h.seen(1, now=10.1)
    assert h.gates == 1
    h.failed("down again")
    assert h.divisor == 1


def test_a_remembered_count_is_no_count_once_redis_has_counted() -> None:  # rule 5
    h = SharedHealth("fail_open", window_s=3.0)
    h.probed(gates=1, in_time=True, now=0.0)  # Redis reached at start: a count
    h.remember(4)  # too late: ignored
    assert h.known == "counted" and h.gates == 1
    fresh = SharedHealth("fail_open")
    fresh.remember(1)  # one gate: nothing to divide, nothing remembered
    assert fresh.known == "none" and fresh.gates == 1


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
    with pytest.raises(ValueError):
        SharedHealth("fail_open", window_s=-1.0)


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


@settings(max_examples=500)
@given(
    window=st.floats(min_value=0.0, max_value=5.0),
    counts=st.lists(st.tuples(st.floats(min_value=0.0, max_value=2.0), st.integers(min_value=-1, max_value=9)), max_size=40),
)
def test_n_is_the_largest_count_within_the_window_before_the_latest(window: float, counts: list[tuple[float, int]]) -> None:
    """Rule 5 against an oracle: every count kept, the maximum taken over the window."""
    h = SharedHealth("fail_open", window_s=window)
    now, kept = 0.0, []
    for step, gates in counts:
        now += step
        h.seen(gates, now)
        kept.append((now, max(1, gates)))
        assert h.gates == max(g for t, g in kept if t >= now - window)


@settings(max_examples=500)
@given(
    quota=st.integers(min_value=1, max_value=10_000),
    gates=st.integers(min_value=1, max_value=8),
    before=st.lists(st.integers(min_value=0, max_value=400), max_size=8),
    steps=st.lists(st.tuples(st.integers(min_value=0, max_value=7), st.integers(min_value=1, max_value=400), st.booleans()), max_size=80),
)
def test_fail_open_holds_each_gate_to_its_share_counting_what_it_held_before(
    quota: int, gates: int, before: list[int], steps: list[tuple[int, int, bool]]
) -> None:
    """Rule 6, with N = the gates counted: each gate starts with what Redis admitted before
    the flip (at most the quota between them), then admits only while `fits_local_share`,
    and its requests end in any order. A gate never grows past max(what it held at the
    flip, its share), so once the requests of before the flip have ended the fleet holds at
    most N x share <= quota (quota x gates / N, with N = gates)."""
    share = local_share(quota, gates)
    assert share is not None
    old = [[] for _ in range(gates)]  # admitted through Redis before the flip
    total = 0
    for g, cost in zip(range(gates), before):
        if total + cost <= quota:
            old[g].append(cost)
            total += cost
    new: list[list[int]] = [[] for _ in range(gates)]
    for g, cost, ends in steps:
        g %= gates
        if ends:  # gate g's oldest request ends
            if old[g]:
                old[g].pop(0)
            elif new[g]:
                new[g].pop(0)
            continue
        held = sum(old[g]) + sum(new[g])
        if fits_local_share(held, cost, quota, gates):
            new[g].append(cost)
            assert held + cost <= share  # admitted only within the share, what it held counted
        else:
            assert held + cost > share
        if not any(old):
            assert sum(map(sum, new)) <= gates * share <= max(quota, gates)
