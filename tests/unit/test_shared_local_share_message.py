"""fail_open's local-share refusal says what the gate holds apart from what it still waits on.

A trial (two gates, 40 requests of one tenant at once) read "tenant 'team-a' holds 1738 of
its 300 in-flight tokens on this gate" from a gate that had admitted two requests (288
tokens): the rest were the burst's reservations still out to Redis when the gate flipped,
which the rule counts (rightly) but the message called held.
"""

from __future__ import annotations

import time

import pytest

from gate.config.schema import SharedConfig, TenantConfig
from gate.core.errors import GateError
from gate.core.reasons import Reason
from gate.fleet.sharedlimits.client import SharedLimits


def degraded(gates: int) -> SharedLimits:
    limits = SharedLimits(SharedConfig(redis_url="redis://unused", failure_policy="fail_open"), "gate")
    limits.health.seen(gates, time.monotonic())
    assert limits.health.failed("test") is not None
    return limits


def refusal(limits: SharedLimits, cost: int) -> str:
    team = TenantConfig(name="team-a", api_key_sha256="a" * 64, max_tokens_in_flight=600)
    with pytest.raises(GateError) as info:
        limits._by_policy(team.name, cost, None, None, team.max_tokens_in_flight)
    assert info.value.reason is Reason.TENANT_QUOTA
    return str(info.value)


def test_reservations_awaiting_redis_are_named_apart_from_what_is_held() -> None:
    limits = degraded(2)
    limits._held_tokens["team-a"] = 288
    limits._pending_tokens["team-a"] = 1450
    text = refusal(limits, 144)
    assert "holds 288 of its 300 in-flight tokens on this gate" in text
    assert "1450 more awaiting Redis" in text
    assert "(1/2 of 600)" in text and "needs 144" in text


def test_without_reservations_awaiting_redis_the_message_names_only_what_is_held() -> None:
    limits = degraded(2)
    limits._held_tokens["team-a"] = 288
    text = refusal(limits, 144)
    assert "holds 288 of its 300 in-flight tokens on this gate" in text
    assert "awaiting" not in text


def test_fail_closed_names_the_tenant_in_plain_words() -> None:
    """A fail_closed gate with Redis stopped told every limited client "tenant 'team-a''s limits
    are shared across gates ...": the possessive after the quoted name read as a stray quote."""
    limits = SharedLimits(SharedConfig(redis_url="redis://unused", failure_policy="fail_closed"), "gate")
    assert limits.health.failed("test") is not None
    with pytest.raises(GateError) as info:
        limits._by_policy("team-a", 100, None, None, 600)
    assert info.value.reason is Reason.SHARED_LIMIT_UNAVAILABLE
    text = str(info.value)
    assert "''s" not in text
    assert "the limits of tenant 'team-a' are shared across gates and cannot be checked right now" in text
