"""How long a waiter still has to wait for a slot, from measured hold times (pure).

A slot frees when a running request ends. Every release gives one hold time (dispatch to
release); their mean over the last WINDOW releases is what a slot is held now, at the
current occupancy (a busier backend decodes each stream slower, and the holds grow with it).
A running request that has held its slot `e` seconds is expected to free it in
max(0, mean - e); the waiter at position p (0: next to be dispatched) gets the (p mod k)-th
slot to free of the k slots, p div k rounds of one mean hold later:

    wait(p) = sorted(remaining)[p mod k] + (p div k) x mean          (k = slots)

This is the measured drain rate applied to the requests ahead, with the state of the slots
that hold them: with fixed service times (the virtual-time harness) it is exact; against
llama-server it is an estimate that follows the load. Until MIN_HOLDS releases are in, there
is no estimate (None) and nobody is refused on it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

WINDOW = 32
MIN_HOLDS = 4


@dataclass(slots=True)
class HoldTimes:
    window: int = WINDOW
    min_holds: int = MIN_HOLDS
    _holds: deque[float] = field(default_factory=deque)
    _total: float = 0.0

    def record(self, seconds: float) -> None:
        if not seconds >= 0:
            return
        self._holds.append(seconds)
        self._total += seconds
        while len(self._holds) > self.window:
            self._total -= self._holds.popleft()

    @property
    def mean_s(self) -> float | None:
        if len(self._holds) < self.min_holds:
            return None
        return self._total / len(self._holds)


def remaining(held_since: Iterable[float], mean_s: float, now: float, slots: int) -> list[float]:
    """Expected seconds until each slot frees, soonest first (a free slot: 0)."""
    left = sorted(max(0.0, mean_s - (now - at)) for at in held_since)
    return ([0.0] * max(0, slots - len(left)) + left)[: max(1, slots)]


def wait_at(position: int, frees: list[float], mean_s: float) -> float:
    """Expected wait of the waiter `position` places from the front (see the module)."""
    k = len(frees)
    return frees[position % k] + (position // k) * mean_s
