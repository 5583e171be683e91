"""The lease renewal runs at a fixed rate: a slow renewal does not push the next one back.

Slept after each renewal, the gap between two renewals was the interval plus the renewal's
own time; on a loaded host leases a gate still held expired on Redis between two renewals
(a lease lives 3 intervals) and another gate admitted past the tenant's quota. The clock
and the sleep are injected: the gaps are exact, whatever the machine's speed.
"""

from __future__ import annotations

import asyncio

import pytest

from gate.config.schema import SharedConfig
from gate.fleet.sharedlimits.client import SharedLimits


@pytest.mark.parametrize(
    ("renewal_s", "slept"),
    [
        (0.0, [1.0, 1.0, 1.0, 1.0]),  # an instant renewal: one interval apart
        (0.6, [1.0, 0.4, 0.4, 0.4]),  # a slow one: the next still starts an interval after it started
        (1.5, [1.0, 0.0, 0.0, 0.0]),  # slower than the interval: the next starts at once
    ],
)
async def test_renewals_start_an_interval_apart_however_long_each_takes(renewal_s: float, slept: list[float]) -> None:
    limits = SharedLimits(SharedConfig(redis_url="redis://unused", renew_interval_s=1.0), "gate")
    clock = [0.0]
    sleeps: list[float] = []
    starts: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(round(seconds, 9))
        clock[0] += seconds
        if len(sleeps) > 4:
            raise asyncio.CancelledError

    async def renew() -> bool:
        starts.append(clock[0])
        clock[0] += renewal_s
        return True

    limits.renew = renew  # type: ignore[method-assign]
    with pytest.raises(asyncio.CancelledError):
        await limits._run(clock=lambda: clock[0], sleep=sleep)
    assert sleeps[:4] == slept
    gaps = [round(b - a, 9) for a, b in zip(starts, starts[1:], strict=False)]
    assert gaps == [max(1.0, renewal_s)] * 3
