"""How long Redis has had to answer a call: only the time the gate's own loop could hear it.

A reservation's wall time is Redis's time plus the gate's: the call waits for its turn of the
event loop to go out, and the answer waits in the socket until the loop comes round to read
it. On a busy host the second part is most of it. Issue #23 on this 2-core VM, three CPU
hogs beside two gates and 12 clients (tests/integration/test_shared_burst.py, before this
module): 11 of 1,202 reservations passed the 20 ms bound, 3 of them in a row, and both
gates flipped to fail_open, while Redis spent 53 us per script call on average and logged
none of its 1,259 calls over 10 ms (INFO commandstats, SLOWLOG).

So the wait bound is counted in *heard* time. The wait is cut into ``turns`` slices of
``bound / turns``; each wake-up adds to ``heard_s`` at most the slice it planned, and how
late it woke (the loop was busy, or the process was off the CPU) goes to ``lag_s``: an
answer may have sat unread all that time, which says nothing about Redis. Redis is judged
not to answer only once ``heard_s`` reaches the bound. On a quiet loop that is the bound
itself (plus timer slack: about 1 ms on uvloop, whose clock moves in whole milliseconds);
on a busy one it is at least ``turns`` wake-ups, that is twice as many turns of the loop
(a timer fires in one, the waiting task resumes in the next), while an answer that came in
time needs three to be read (the readable socket, the reading task, this waiter).

:class:`Heard` is the arithmetic (pure, no clock); :func:`hear` is the wait.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

__all__ = ["TURNS", "Heard", "hear"]

#: slices of the wait bound: wake-ups before Redis can be judged, however busy the loop
TURNS = 8


@dataclass(slots=True)
class Heard:
    """One wait on Redis: ``heard_s`` the loop could have read an answer, ``lag_s`` it could not."""

    bound_s: float
    turns: int = TURNS
    heard_s: float = 0.0
    lag_s: float = 0.0
    wakes: int = 0

    def __post_init__(self) -> None:
        if self.bound_s <= 0 or self.turns < 1:
            raise ValueError("the bound must be positive and cut into at least one slice")

    @property
    def spent(self) -> bool:
        """Redis has had the whole bound of the gate's attention."""
        return self.heard_s >= self.bound_s

    def next_slice(self) -> float:
        """How long the next wait may be: a slice, or what is left of the bound."""
        return max(1e-4, min(self.bound_s / self.turns, self.bound_s - self.heard_s))

    def woke(self, planned_s: float, took_s: float) -> None:
        """A wait planned for ``planned_s`` (or ended early by the answer) took ``took_s``."""
        late = max(0.0, took_s - planned_s)
        self.heard_s += took_s - late
        self.lag_s += late
        self.wakes += 1


async def hear(call: asyncio.Future, bound_s: float, *, turns: int = TURNS) -> Heard:
    """Wait until ``call`` is done or Redis has had ``bound_s`` of heard time; never cancels it."""
    heard = Heard(bound_s, turns)
    clock = time.perf_counter  # not loop.time(): uvloop's clock moves in whole milliseconds
    while not call.done() and not heard.spent:
        planned = heard.next_slice()
        started = clock()
        await asyncio.wait((call,), timeout=planned)
        heard.woke(planned, clock() - started)
    return heard
