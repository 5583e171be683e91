"""Tests for gate/core/ratelimit.py: token buckets and the per-tenant limiter."""

from __future__ import annotations

import copy
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gate.core.ratelimit import UNLIMITED, RateLimiter, RateVerdict, TenantLimits, TokenBucket


def clone(bucket: TokenBucket) -> TokenBucket:
    rate, capacity, level, last = bucket.state()
    return TokenBucket(rate, capacity, last, level=level)


# -- TokenBucket: examples ---------------------------------------------------


def test_bucket_starts_full_and_refills_at_its_rate() -> None:
    b = TokenBucket(rate_per_s=2.0, capacity=10.0, now=100.0)
    assert b.level(100.0) == 10.0
    assert b.take(10, 100.0)
    assert b.level(100.0) == 0.0
    assert b.level(101.5) == 3.0
    assert b.level(1000.0) == 10.0  # never above capacity


def test_take_is_all_or_nothing_and_a_refusal_changes_nothing() -> None:
    b = TokenBucket(1.0, 5.0, now=0.0)
    assert b.take(4, 0.0)
    before = b.state()
    assert not b.take(2, 0.5)
    assert b.state() == before
    assert b.level(0.5) == 1.5


def test_wait_time_is_zero_when_available_and_exact_otherwise() -> None:
    b = TokenBucket(0.5, 10.0, now=0.0)
    assert b.wait_time(10, 0.0) == 0.0
    assert b.take(10, 0.0)
    assert b.wait_time(3, 0.0) == 6.0
    assert not b.take(3, 5.999)
    assert b.take(3, 6.0)


def test_wait_time_is_infinite_for_more_than_capacity_or_a_bucket_that_never_refills() -> None:
    assert TokenBucket(1.0, 10.0, 0.0).wait_time(10.5, 0.0) == math.inf
    frozen = TokenBucket(0.0, 10.0, 0.0)
    assert frozen.take(10, 0.0)
    assert frozen.wait_time(1, 0.0) == math.inf
    assert frozen.wait_time(0, 0.0) == 0.0


def test_refund_never_fills_above_capacity() -> None:
    b = TokenBucket(1.0, 10.0, now=0.0)
    assert b.take(6, 0.0)
    b.refund(4, 1.0)
    assert b.level(1.0) == 9.0
    b.refund(100, 1.0)
    assert b.level(1.0) == 10.0


def test_an_earlier_now_is_treated_as_the_last_one_seen() -> None:
    b = TokenBucket(1.0, 10.0, now=50.0)
    assert b.take(10, 50.0)
    assert b.level(40.0) == 0.0
    assert not b.take(1, 40.0)
    assert b.wait_time(1, 40.0) == 11.0  # 10 s to get back to 50, then 1 s to refill
    assert b.take(1, 51.0)


@pytest.mark.parametrize("amount", [-1.0, math.nan, math.inf])
def test_bucket_rejects_bad_amounts(amount: float) -> None:
    b = TokenBucket(1.0, 10.0, 0.0)
    for call in (b.take, b.wait_time, b.refund):
        with pytest.raises(ValueError):
            call(amount, 0.0)


@pytest.mark.parametrize("rate, capacity", [(-1.0, 1.0), (1.0, -1.0), (math.nan, 1.0), (1.0, math.inf)])
def test_bucket_rejects_bad_parameters(rate: float, capacity: float) -> None:
    with pytest.raises(ValueError):
        TokenBucket(rate, capacity, 0.0)


# -- TokenBucket: properties -------------------------------------------------

# Buckets as the limiter builds them: capacity N refilling over a period.
bucket_params = st.tuples(
    st.floats(min_value=1.0, max_value=1e6),  # capacity
    st.floats(min_value=1.0, max_value=3600.0),  # seconds to refill from empty
    st.floats(min_value=0.0, max_value=1e5),  # start time
)
bucket_ops = st.lists(
    st.tuples(
        st.sampled_from(["take", "refund", "wait"]),
        st.floats(min_value=0.0, max_value=1.2),  # amount as a fraction of capacity
        st.floats(min_value=0.0, max_value=120.0),  # time since the previous op
    ),
    max_size=40,
)


@settings(max_examples=500, deadline=None)
@given(bucket_params, bucket_ops)
def test_bucket_level_stays_within_bounds_and_refusals_change_nothing(params, ops) -> None:
    capacity, period, now = params
    b = TokenBucket(capacity / period, capacity, now)
    for op, fraction, dt in ops:
        now += dt
        amount = fraction * capacity
        if op == "take":
            before = b.state()
            expected = b.level(now) >= amount
            taken = b.take(amount, now)
            assert taken == expected
            if not taken:
                assert b.state() == before
        elif op == "refund":
            b.refund(amount, now)
        else:
            before = b.state()
            b.wait_time(amount, now)
            assert b.state() == before  # asking is free
        b.check_invariants()
        assert 0.0 <= b.level(now) <= capacity


@settings(max_examples=500, deadline=None)
@given(bucket_params, bucket_ops, st.floats(min_value=0.0, max_value=1.2))
def test_wait_time_is_exact(params, ops, fraction) -> None:
    capacity, period, now = params
    b = TokenBucket(capacity / period, capacity, now)
    for op, f, dt in ops:
        now += dt
        if op == "take":
            b.take(f * capacity, now)
        elif op == "refund":
            b.refund(f * capacity, now)
    amount = fraction * capacity
    wait = b.wait_time(amount, now)
    if amount > capacity:
        assert wait == math.inf
        assert not clone(b).take(amount, now + 1e9)
        return
    assert wait < math.inf
    assert (wait == 0.0) == clone(b).take(amount, now)
    # After waiting exactly wait_s, the take succeeds...
    assert clone(b).take(amount, now + wait)
    if wait > 0.0:
        # ...and a hair earlier it fails. The hair covers float rounding only:
        # about a microsecond here, far below anything a caller could sleep.
        hair = 1e-9 * (abs(now) + wait + 1.0) + 1e-9 * period
        early = clone(b)
        before = early.state()
        assert not early.take(amount, now + wait - hair)
        assert early.state() == before


# -- RateLimiter: examples ---------------------------------------------------


def test_tenant_without_limits_is_always_allowed_and_allocates_nothing() -> None:
    rl = RateLimiter({"a": TenantLimits(10, None)})
    for i in range(1000):
        assert rl.check("nobody", 10**9, float(i)).allowed
    assert rl.tenants == frozenset()
    assert rl.remaining("nobody", 0.0) == (None, None)


def test_requests_per_minute_refuses_the_request_after_the_allowance() -> None:
    rl = RateLimiter({"a": TenantLimits(requests_per_minute=2)})
    assert rl.check("a", 100, 0.0).allowed
    assert rl.check("a", 100, 0.0).allowed
    v = rl.check("a", 100, 0.0)
    assert v == RateVerdict(allowed=False, wait_s=30.0, limit="requests", never=False)
    assert rl.check("a", 100, 30.0).allowed


def test_tokens_per_minute_refuses_with_the_time_until_enough_tokens() -> None:
    rl = RateLimiter({"a": TenantLimits(tokens_per_minute=600)})
    assert rl.check("a", 400, 0.0).allowed
    v = rl.check("a", 400, 0.0)
    assert not v.allowed and v.limit == "tokens" and not v.never
    assert v.wait_s == pytest.approx(20.0)  # 200 missing at 10 tokens/s
    assert rl.check("a", 400, v.wait_s).allowed


def test_request_larger_than_tokens_per_minute_can_never_pass() -> None:
    rl = RateLimiter({"a": TenantLimits(requests_per_minute=10, tokens_per_minute=1000)})
    v = rl.check("a", 1001, 0.0)
    assert v == RateVerdict(allowed=False, wait_s=math.inf, limit="tokens", never=True)
    assert rl.remaining("a", 0.0) == (10.0, 1000.0)


def test_zero_requests_per_minute_blocks_the_tenant() -> None:
    rl = RateLimiter({"a": TenantLimits(requests_per_minute=0)})
    v = rl.check("a", 1, 0.0)
    assert v.never and v.limit == "requests"


def test_check_takes_from_neither_bucket_when_one_refuses() -> None:
    rl = RateLimiter({"a": TenantLimits(requests_per_minute=5, tokens_per_minute=600)})
    assert rl.check("a", 500, 0.0).allowed
    assert rl.remaining("a", 0.0) == (4.0, 100.0)
    v = rl.check("a", 200, 0.0)
    assert not v.allowed and v.limit == "tokens"
    assert rl.remaining("a", 0.0) == (4.0, 100.0)  # the request was not counted


def test_wait_is_the_longer_of_the_two_limits() -> None:
    rl = RateLimiter({"a": TenantLimits(requests_per_minute=1, tokens_per_minute=60)})
    assert rl.check("a", 60, 0.0).allowed
    v = rl.check("a", 30, 0.0)  # requests: 60 s away, tokens: 30 s away
    assert v.wait_s == 60.0 and v.limit == "requests"
    assert not rl.check("a", 30, 59.0).allowed
    assert rl.check("a", 30, 60.0).allowed


def test_refund_returns_unused_tokens() -> None:
    rl = RateLimiter({"a": TenantLimits(tokens_per_minute=1000)})
    assert rl.check("a", 1000, 0.0).allowed
    rl.refund("a", 700, 0.0)  # reserved 1000, generated only 300
    assert rl.check("a", 700, 0.0).allowed


def test_refund_of_requests_undoes_an_admission() -> None:
    rl = RateLimiter({"a": TenantLimits(requests_per_minute=1, tokens_per_minute=100)})
    assert rl.check("a", 100, 0.0).allowed
    rl.refund("a", 100, 0.0, requests=1)
    assert rl.remaining("a", 0.0) == (1.0, 100.0)


def test_refund_to_an_unknown_tenant_is_a_no_op() -> None:
    rl = RateLimiter({"a": TenantLimits(tokens_per_minute=1000)})
    rl.refund("a", 500, 0.0)
    rl.refund("ghost", 500, 0.0)
    assert rl.tenants == frozenset()


def test_forget_idle_drops_only_full_idle_tenants() -> None:
    limits = TenantLimits(requests_per_minute=60, tokens_per_minute=6000)
    rl = RateLimiter(lambda tenant: limits)
    assert rl.check("early", 6000, 0.0).allowed
    assert rl.check("recent", 1, 115.0).allowed
    assert rl.check("drained", 6000, 95.0).allowed
    # At 120 s: "early" refilled and idle; "drained" still refilling; "recent" too new.
    assert rl.forget_idle(120.0, idle_s=10.0) == 1
    assert rl.tenants == {"recent", "drained"}
    assert rl.forget_idle(1000.0, idle_s=10.0) == 2
    assert rl.tenants == frozenset()


def test_many_tenants_stay_bounded_with_forget_idle() -> None:
    rl = RateLimiter(lambda tenant: TenantLimits(requests_per_minute=60))
    for i in range(10_000):
        rl.check(f"t{i}", 1, i * 0.01)
        if i % 1000 == 999:
            rl.forget_idle(i * 0.01, idle_s=1.0)
    assert len(rl.tenants) <= 1000 + 100


def test_changed_limits_keep_the_tenants_level_clamped_to_the_new_capacity() -> None:
    table = {"a": TenantLimits(tokens_per_minute=1000)}
    rl = RateLimiter(lambda t: table.get(t, UNLIMITED))
    assert rl.check("a", 900, 0.0).allowed
    table["a"] = TenantLimits(tokens_per_minute=5000)
    assert rl.remaining("a", 0.0) == (None, 100.0)  # no free refill from a reload
    table["a"] = TenantLimits(tokens_per_minute=50)
    assert rl.check("a", 50, 0.0).allowed  # clamped to 50, still had 100
    assert rl.remaining("a", 0.0) == (None, 0.0)
    table["a"] = UNLIMITED
    assert rl.check("a", 10**6, 0.0).allowed
    assert rl.tenants == frozenset()


def test_dict_limits_use_the_default_for_unknown_tenants() -> None:
    rl = RateLimiter({}, default=TenantLimits(requests_per_minute=1))
    assert rl.check("x", 1, 0.0).allowed
    assert not rl.check("x", 1, 0.0).allowed


def test_verdict_and_limits_are_frozen() -> None:
    with pytest.raises(AttributeError):
        RateVerdict(True, 0.0, None, False).allowed = False  # type: ignore[misc]
    with pytest.raises(AttributeError):
        TenantLimits(1, 1).requests_per_minute = 2  # type: ignore[misc]
    with pytest.raises(ValueError):
        TenantLimits(requests_per_minute=-1)


def test_check_rejects_negative_tokens() -> None:
    with pytest.raises(ValueError):
        RateLimiter({}).check("a", -1, 0.0)


# -- RateLimiter: properties -------------------------------------------------

limit_values = st.one_of(st.none(), st.integers(min_value=0, max_value=10_000))
limiter_ops = st.lists(
    st.tuples(
        st.sampled_from(["check", "check", "check", "refund", "forget"]),
        st.sampled_from(["a", "b", "c"]),
        st.integers(min_value=0, max_value=12_000),  # tokens
        st.floats(min_value=0.0, max_value=30.0),  # time since the previous op
    ),
    max_size=40,
)


@settings(max_examples=500, deadline=None)
@given(
    st.dictionaries(st.sampled_from(["a", "b", "c"]), st.builds(TenantLimits, limit_values, limit_values)),
    limiter_ops,
)
def test_check_is_atomic_and_its_wait_is_exact(table, ops) -> None:
    rl = RateLimiter(table)
    now = 0.0
    for op, tenant, tokens, dt in ops:
        now += dt
        limits = table.get(tenant, UNLIMITED)
        if op == "check":
            req_before, tok_before = rl.remaining(tenant, now)
            later = copy.deepcopy(rl)
            v = rl.check(tenant, tokens, now)
            req_after, tok_after = rl.remaining(tenant, now)
            if v.allowed:
                assert v == RateVerdict(True, 0.0, None, False)
                if req_before is not None:
                    assert req_after == req_before - 1
                if tok_before is not None:
                    assert tok_after == tok_before - tokens
            else:
                # Neither bucket moved, and waiting wait_s is enough.
                assert (req_after, tok_after) == (req_before, tok_before)
                assert v.wait_s > 0.0 and v.limit is not None
                assert v.never == math.isinf(v.wait_s)
                expect_never = limits.requests_per_minute == 0 or (
                    limits.tokens_per_minute is not None and tokens > limits.tokens_per_minute
                )
                assert v.never == expect_never
                if not v.never:
                    assert later.check(tenant, tokens, now + v.wait_s).allowed
            if limits.unlimited:
                assert v.allowed and tenant not in rl.tenants
        elif op == "refund":
            rl.refund(tenant, tokens, now)
        else:
            before = {t: rl.remaining(t, now) for t in "abc"}
            rl.forget_idle(now, idle_s=dt)
            # Forgetting is invisible: a forgotten tenant comes back full, as it was.
            assert {t: rl.remaining(t, now) for t in "abc"} == before
        rl.check_invariants()
