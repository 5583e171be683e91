"""Per-tenant rate limits: token buckets for requests/minute and tokens/minute.

Pure: no clock, no I/O, no asyncio. Every method that depends on time takes
``now`` (seconds on a monotonic clock) from the caller, which owns the only
clock and the only timers (it sleeps until ``wait_s`` and asks again).

A limit of N per minute is a bucket of capacity N that refills at N/60 per
second and starts full, so a tenant may burst a whole minute's allowance and
then proceeds at the steady rate.

Invariants (checked by ``check_invariants`` after every step in the tests):

1. A bucket's level is always within [0, capacity].
2. A refused ``take`` or ``check`` changes no bucket level.
3. ``wait_time`` is exact: ``take(amount, now + wait_time(amount, now))``
   succeeds, and any moment noticeably earlier fails (no other takes between).
   ``wait_time`` is 0.0 exactly when ``take`` would succeed at ``now``, and
   ``math.inf`` when the amount can never pass (amount > capacity, or a
   bucket that never refills).
4. ``check`` is atomic over a tenant's two buckets: it takes from both or from
   neither; its ``wait_s`` is the longer of the two waits.
5. A tenant with no limits is always allowed and holds no buckets.
6. A bucket is only forgotten when it is full, so forgetting it and creating
   it again (full) later is indistinguishable from keeping it.
7. Time never runs backwards inside a bucket: a ``now`` earlier than the last
   one seen is treated as that last one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "Limit",
    "RateLimiter",
    "RateVerdict",
    "TenantLimits",
    "TokenBucket",
    "UNLIMITED",
]

Limit = Literal["requests", "tokens"]


class TokenBucket:
    """A classic token bucket: refills continuously at ``rate_per_s`` up to ``capacity``."""

    __slots__ = ("rate_per_s", "capacity", "_level", "_last")

    def __init__(self, rate_per_s: float, capacity: float, now: float, level: float | None = None) -> None:
        if not rate_per_s >= 0.0 or math.isinf(rate_per_s):
            raise ValueError(f"rate_per_s must be finite and >= 0, got {rate_per_s!r}")
        if not capacity >= 0.0 or math.isinf(capacity):
            raise ValueError(f"capacity must be finite and >= 0, got {capacity!r}")
        self.rate_per_s = float(rate_per_s)
        self.capacity = float(capacity)
        # Starts full unless told otherwise; a given level is clamped so a
        # rebuilt bucket (limits changed) never starts above its new capacity.
        self._level = self.capacity if level is None else min(self.capacity, max(0.0, level))
        self._last = float(now)

    def level(self, now: float) -> float:
        """Tokens available at ``now`` (does not change the bucket)."""
        if now <= self._last:
            return self._level
        return min(self.capacity, self._level + (now - self._last) * self.rate_per_s)

    def is_full(self, now: float) -> bool:
        """True when the bucket holds its whole capacity at ``now``."""
        return self.level(now) >= self.capacity

    def wait_time(self, amount: float, now: float) -> float:
        """Seconds from ``now`` until ``amount`` can be taken; inf if never."""
        _check_amount(amount)
        if amount > self.capacity:
            return math.inf
        level = self.level(now)
        if level >= amount:
            return 0.0
        if self.rate_per_s == 0.0:
            return math.inf
        start = max(now, self._last)
        wait = (start - now) + (amount - level) / self.rate_per_s
        # The division and the caller's own ``now + wait`` each round; nudge the
        # wait up by a few ulps until taking at ``now + wait`` really succeeds,
        # so a caller that sleeps exactly ``wait`` is never refused.
        step = max(math.ulp(wait), math.ulp(now))
        for _ in range(64):
            if self.level(now + wait) >= amount:
                break
            wait += step
            step *= 2.0
        return wait

    def take(self, amount: float, now: float) -> bool:
        """Take ``amount`` if available now; a refusal changes nothing."""
        _check_amount(amount)
        level = self.level(now)
        if level < amount:
            return False
        self._level = level - amount
        self._last = max(self._last, now)
        return True

    def refund(self, amount: float, now: float) -> None:
        """Give back ``amount`` (e.g. tokens reserved but not used), never above capacity."""
        _check_amount(amount)
        self._level = min(self.capacity, self.level(now) + amount)
        self._last = max(self._last, now)

    def state(self) -> tuple[float, float, float, float]:
        """Everything that defines the bucket, for tests comparing before and after."""
        return (self.rate_per_s, self.capacity, self._level, self._last)

    def check_invariants(self) -> None:
        """Raise AssertionError if invariant 1 does not hold."""
        if not 0.0 <= self._level <= self.capacity:
            raise AssertionError(f"level {self._level} outside [0, {self.capacity}]")

    def __repr__(self) -> str:
        return f"TokenBucket(rate_per_s={self.rate_per_s!r}, capacity={self.capacity!r}, level={self._level!r}, last={self._last!r})"


def _check_amount(amount: float) -> None:
    # NaN fails both comparisons, so `not amount >= 0` catches it too.
    if not amount >= 0.0 or math.isinf(amount):
        raise ValueError(f"amount must be finite and >= 0, got {amount!r}")


@dataclass(frozen=True, slots=True)
class TenantLimits:
    """A tenant's limits per minute; None means unlimited."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None

    def __post_init__(self) -> None:
        for name in ("requests_per_minute", "tokens_per_minute"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must be >= 0 or None, got {value!r}")

    @property
    def unlimited(self) -> bool:
        return self.requests_per_minute is None and self.tokens_per_minute is None


UNLIMITED = TenantLimits()


@dataclass(frozen=True, slots=True)
class RateVerdict:
    """The answer of ``RateLimiter.check``; ``wait_s`` feeds Retry-After."""

    allowed: bool
    # Seconds until the request would pass (0.0 when allowed, inf when never).
    wait_s: float
    # Which limit refused it (the one with the longer wait); None when allowed.
    limit: Limit | None
    # True when the request can never pass (larger than the per-minute limit).
    never: bool


_ALLOWED = RateVerdict(allowed=True, wait_s=0.0, limit=None, never=False)


def _bucket_for(per_minute: int | None, now: float, old: TokenBucket | None) -> TokenBucket | None:
    if per_minute is None:
        return None
    # Keep what the tenant had left when limits change, so a config reload
    # neither refills a tenant that was throttled nor exceeds the new capacity.
    level = None if old is None else old.level(now)
    return TokenBucket(per_minute / 60.0, float(per_minute), now, level)


class _TenantBuckets:
    __slots__ = ("limits", "requests", "tokens", "last_seen")

    def __init__(self, limits: TenantLimits, now: float, old: _TenantBuckets | None = None) -> None:
        self.limits = limits
        self.requests: TokenBucket | None = _bucket_for(limits.requests_per_minute, now, None if old is None else old.requests)
        self.tokens: TokenBucket | None = _bucket_for(limits.tokens_per_minute, now, None if old is None else old.tokens)
        self.last_seen = now

    def buckets(self) -> tuple[TokenBucket, ...]:
        return tuple(b for b in (self.requests, self.tokens) if b is not None)


class RateLimiter:
    """Per-tenant request and token buckets, created lazily from the tenant's limits."""

    def __init__(
        self,
        limits: Callable[[str], TenantLimits] | Mapping[str, TenantLimits],
        default: TenantLimits = UNLIMITED,
    ) -> None:
        if isinstance(limits, Mapping):
            table = dict(limits)
            self._limits_for: Callable[[str], TenantLimits] = lambda t: table.get(t, default)
        else:
            self._limits_for = limits
        self._tenants: dict[str, _TenantBuckets] = {}

    def _entry(self, tenant: str, now: float) -> _TenantBuckets | None:
        limits = self._limits_for(tenant)
        entry = self._tenants.get(tenant)
        if limits.unlimited:
            # Limits may have been lifted by a reload: drop what was held (inv. 5).
            if entry is not None:
                del self._tenants[tenant]
            return None
        if entry is None or entry.limits != limits:
            entry = _TenantBuckets(limits, now, entry)
            self._tenants[tenant] = entry
        return entry

    def check(self, tenant: str, tokens: int, now: float) -> RateVerdict:
        """Admit one request of ``tokens`` for ``tenant`` if both buckets allow it."""
        _check_amount(tokens)
        entry = self._entry(tenant, now)
        if entry is None:
            return _ALLOWED
        entry.last_seen = max(entry.last_seen, now)
        wait_requests = 0.0 if entry.requests is None else entry.requests.wait_time(1, now)
        wait_tokens = 0.0 if entry.tokens is None else entry.tokens.wait_time(tokens, now)
        if wait_requests == 0.0 and wait_tokens == 0.0:
            # Both waits are 0.0, so both takes succeed: the pair is atomic (inv. 4).
            if entry.requests is not None:
                entry.requests.take(1, now)
            if entry.tokens is not None:
                entry.tokens.take(tokens, now)
            return _ALLOWED
        wait = max(wait_requests, wait_tokens)
        limit: Limit = "requests" if wait_requests >= wait_tokens else "tokens"
        return RateVerdict(allowed=False, wait_s=wait, limit=limit, never=math.isinf(wait))

    def limited(self, tenant: str) -> bool:
        """Does `tenant` have a request or token limit? (Changes nothing.)"""
        return not self._limits_for(tenant).unlimited

    def refund(self, tenant: str, tokens: int, now: float, *, requests: int = 0) -> None:
        """Return tokens reserved but not used; ``requests`` undoes whole admissions."""
        _check_amount(tokens)
        _check_amount(requests)
        entry = self._tenants.get(tenant)
        # A forgotten tenant's buckets were full, and a refund cannot overfill.
        if entry is None:
            return
        if entry.tokens is not None and tokens > 0:
            entry.tokens.refund(tokens, now)
        if entry.requests is not None and requests > 0:
            entry.requests.refund(requests, now)

    def forget_idle(self, now: float, idle_s: float) -> int:
        """Drop tenants unseen for ``idle_s`` whose buckets are full; return how many."""
        stale = [
            name
            for name, entry in self._tenants.items()
            if now - entry.last_seen >= idle_s and all(b.is_full(now) for b in entry.buckets())
        ]
        for name in stale:
            del self._tenants[name]
        return len(stale)

    def remaining(self, tenant: str, now: float) -> tuple[float | None, float | None]:
        """(requests, tokens) left for ``tenant`` now; None for an unlimited dimension."""
        limits = self._limits_for(tenant)
        if limits.unlimited:
            return (None, None)
        # What the next check would see, without storing it: an untracked
        # tenant is full, a tenant whose limits changed keeps its level.
        view = _TenantBuckets(limits, now, self._tenants.get(tenant))
        return (
            None if view.requests is None else view.requests.level(now),
            None if view.tokens is None else view.tokens.level(now),
        )

    @property
    def tenants(self) -> frozenset[str]:
        """Names of tenants currently holding buckets."""
        return frozenset(self._tenants)

    def check_invariants(self) -> None:
        """Raise AssertionError if a held tenant breaks invariants 1 or 5."""
        for name, entry in self._tenants.items():
            if entry.limits.unlimited or not entry.buckets():
                raise AssertionError(f"tenant {name!r} holds buckets without limits")
            for bucket in entry.buckets():
                bucket.check_invariants()
