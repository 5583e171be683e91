"""Stopping the shared limits while a renewal answers: the cancellation is never lost.

On Python 3.11 `asyncio.wait_for` returns the inner result instead of raising
CancelledError when the answer and the cancel land in the same loop turn; the renewal
loop then ran on and `SharedLimits.stop()` (and with it the gate's shutdown) waited for
ever. These tests make the two land in the same turn, deterministically.
"""

from __future__ import annotations

import asyncio

import pytest

from gate.config.schema import SharedConfig
from gate.fleet.sharedlimits.client import SharedLimits


def limits_answering(answer: asyncio.Future) -> tuple[SharedLimits, list[int]]:
    """SharedLimits whose Redis call waits for `answer` (no Redis: the race is in asyncio)."""
    limits = SharedLimits(SharedConfig(redis_url="redis://unused", renew_interval_s=0.001, wait_ms=50), "gate")
    calls: list[int] = []

    async def renew_call(**_: object) -> tuple[int, int]:
        calls.append(1)
        return await answer

    limits._renew_call = renew_call  # type: ignore[method-assign]
    return limits, calls


async def test_a_renewal_cancelled_as_redis_answers_raises_cancelled() -> None:
    answer: asyncio.Future = asyncio.get_running_loop().create_future()
    limits, calls = limits_answering(answer)
    task = asyncio.create_task(limits.renew())
    while not calls:
        await asyncio.sleep(0)
    answer.set_result((1, 0))
    task.cancel()  # same loop turn as the answer
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_stop_ends_the_renewal_loop_even_when_a_renewal_answers_in_the_same_turn() -> None:
    answer: asyncio.Future = asyncio.get_running_loop().create_future()
    limits, calls = limits_answering(answer)
    limits._runner = asyncio.create_task(limits._run())
    while not calls:
        await asyncio.sleep(0)
    answer.set_result((1, 0))
    async with asyncio.timeout(5):  # before the fix: stop() never returned
        await limits.stop()  # cancels the runner in the turn the answer lands
    assert limits._runner is None
