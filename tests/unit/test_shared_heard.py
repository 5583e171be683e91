"""The wait on Redis counts only the time the gate's loop could hear it (gate/fleet/sharedlimits/heard.py).

No Redis here: the "call" is a plain future. A busy loop is made by a callback that holds
the loop (time.sleep inside it: the loop itself is what is being blocked, on purpose).
"""

from __future__ import annotations

import asyncio
import time

import pytest

from gate.fleet.sharedlimits.heard import TURNS, Heard, hear


def test_a_late_wake_up_counts_as_lag_not_as_heard_time() -> None:
    h = Heard(0.020)
    h.woke(0.0025, 0.0025)
    h.woke(0.0025, 0.0300)  # the loop was busy for 27.5 ms
    assert h.heard_s == pytest.approx(0.005) and h.lag_s == pytest.approx(0.0275)
    assert not h.spent and h.wakes == 2
    h.woke(0.0025, 0.0010)  # ended early by the answer
    assert h.heard_s == pytest.approx(0.006) and h.lag_s == pytest.approx(0.0275)


def test_the_bound_is_spent_only_after_every_slice() -> None:
    h = Heard(0.020)
    for _ in range(TURNS):
        assert not h.spent
        planned = h.next_slice()
        assert planned == pytest.approx(0.020 / TURNS)
        h.woke(planned, planned + 0.5)  # however late each wake-up
    assert h.spent and h.wakes == TURNS


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError):
        Heard(0.0)
    with pytest.raises(ValueError):
        Heard(0.02, turns=0)


async def test_an_answer_in_time_ends_the_wait_at_once() -> None:
    loop = asyncio.get_running_loop()
    call = loop.create_future()
    loop.call_later(0.002, call.set_result, "ok")
    heard = await hear(call, 0.5)
    assert call.done() and not heard.spent and heard.heard_s < 0.1


async def test_no_answer_on_a_quiet_loop_spends_the_bound_in_about_the_bound() -> None:
    call = asyncio.get_running_loop().create_future()
    started = time.perf_counter()
    heard = await hear(call, 0.020)
    took = time.perf_counter() - started
    assert heard.spent and not call.done()
    assert 0.020 <= took < 0.5  # the bound plus timer slack (a loaded CI machine adds some)


async def test_a_busy_loop_does_not_spend_the_bound_while_an_answer_waits_to_be_read() -> None:
    """The loop is blocked for 60 ms, three times the bound, with the answer ready after 1 ms:
    the wait ends with the answer, not with Redis judged slow."""
    loop = asyncio.get_running_loop()
    call = loop.create_future()
    loop.call_later(0.001, call.set_result, "ok")
    loop.call_soon(time.sleep, 0.060)  # the gate's own work: a burst of requests, a loaded CPU
    heard = await hear(call, 0.020)
    assert call.done() and not heard.spent
    assert heard.lag_s >= 0.040


async def test_a_busy_loop_still_gives_up_on_a_call_that_never_answers() -> None:
    loop = asyncio.get_running_loop()
    call = loop.create_future()
    for i in range(3 * TURNS):  # busy on every turn for a while
        loop.call_later(i * 0.004, time.sleep, 0.003)
    heard = await hear(call, 0.020)
    assert heard.spent and not call.done()
