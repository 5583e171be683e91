"""Is Redis usable for admission, and what applies when it is not. Pure: no I/O, no clock.

The I/O layer (:mod:`gate.sharedlimits.client`) reports each call's fate here and reads
back the state: ``ok`` (admission asks Redis) or the failure policy being applied,
``fail_open`` or ``fail_closed`` (admission does not ask Redis at all).

Rules (numbered; ``tests/unit/test_shared_health.py`` checks each):

1. A connection error (Redis refused, reset, unreachable) degrades at once.
2. A call past the wait bound degrades after ``timeouts_to_degrade`` such calls in a row, so
   one slow answer (a pause of the gate's own event loop looks the same) costs one request
   the policy, not a flip of the whole gate; any answer in time resets the count.
3. Only a probe (the lease renewal, once per renewal interval) brings a degraded gate back,
   and only one that answered within the wait bound: a Redis that answers, but too slowly
   for admission, stays out of the request path instead of flapping in and out of it.
4. Every change of state is returned once, as a :class:`Flip`, for the audit and the log;
   a call that changes nothing returns None.
5. ``divisor`` is the number of gates seen on Redis at the last good probe (at least 1),
   while ``fail_open`` applies, else 1: fail_open runs each gate on 1/N of each limit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["Flip", "SharedHealth", "SharedState", "local_share"]

SharedState = Literal["off", "ok", "fail_open", "fail_closed"]
Policy = Literal["fail_open", "fail_closed"]


@dataclass(frozen=True, slots=True)
class Flip:
    """A change of state: what it was, what it is, why, and the N fail_open divides by."""

    old: SharedState
    new: SharedState
    why: str
    gates: int


class SharedHealth:
    """The state machine of rules 1-5."""

    __slots__ = ("policy", "timeouts_to_degrade", "state", "gates", "_timeouts", "ever_seen")

    def __init__(self, policy: Policy, *, timeouts_to_degrade: int = 3, state: SharedState = "ok") -> None:
        if policy not in ("fail_open", "fail_closed"):
            raise ValueError(f"policy must be fail_open or fail_closed, got {policy!r}")
        if timeouts_to_degrade < 1:
            raise ValueError("timeouts_to_degrade must be at least 1")
        self.policy: Policy = policy
        self.timeouts_to_degrade = timeouts_to_degrade
        self.state: SharedState = state
        #: gates seen on Redis at the last good probe, this one included
        self.gates = 1
        #: False until one probe answered: N = 1 is then a guess, not a count
        self.ever_seen = False
        self._timeouts = 0

    @property
    def degraded(self) -> bool:
        return self.state != "ok"

    @property
    def divisor(self) -> int:
        """What fail_open divides each tenant limit by (rule 5)."""
        return self.gates if self.state == "fail_open" else 1

    def answered(self) -> None:
        """An admission call answered within the bound (rule 2: the count of slow ones resets)."""
        self._timeouts = 0

    def timed_out(self, what: str) -> Flip | None:
        """An admission call passed the wait bound (rule 2)."""
        if self.degraded:
            return None
        self._timeouts += 1
        if self._timeouts < self.timeouts_to_degrade:
            return None
        return self._degrade(f"{self._timeouts} calls in a row slower than the wait bound ({what})")

    def failed(self, why: str) -> Flip | None:
        """Redis could not be reached, or answered with an error (rule 1)."""
        if self.degraded:
            return None
        return self._degrade(why)

    def probed(self, gates: int, in_time: bool) -> Flip | None:
        """A probe answered: ``gates`` seen on Redis; ``in_time`` within the wait bound (rule 3)."""
        self.gates = max(1, gates)
        self.ever_seen = True
        if not self.degraded:
            self._timeouts = 0
            return None
        if not in_time:
            return None
        old = self.state
        self.state = "ok"
        self._timeouts = 0
        return Flip(old, "ok", "Redis answers in time again", self.gates)

    def _degrade(self, why: str) -> Flip:
        old = self.state
        self.state = self.policy
        self._timeouts = 0
        return Flip(old, self.policy, why, self.gates)


def local_share(limit: int | None, divisor: int) -> int | None:
    """One gate's share of a fleet-wide ``limit`` under fail_open: floor(limit / N), at least 1.

    N shares add up to at most ``limit`` whenever ``limit >= N``; below that each gate keeps
    1 so that fail_open still serves the tenant (N x 1 may then exceed the limit by < N).
    """
    if limit is None or divisor <= 1:
        return limit
    return max(1, limit // divisor)
