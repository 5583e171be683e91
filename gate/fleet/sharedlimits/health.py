"""Is Redis usable for admission, and what applies when it is not. Pure: no I/O, no clock.

The I/O layer (:mod:`gate.fleet.sharedlimits.client`) reports each call's fate here and reads
back the state: ``ok`` (admission asks Redis) or the failure policy being applied,
``fail_open`` or ``fail_closed`` (admission does not ask Redis at all).

Rules (numbered; ``tests/unit/test_shared_health.py`` checks each):

1. A connection error (Redis refused, reset, unreachable) degrades at once.
2. A call Redis did not answer within the wait bound degrades at once (after
   ``timeouts_to_degrade`` such calls in a row, 1 by default). The bound is counted in time
   the gate's own loop was free to hear the answer (:mod:`.heard`): calls that were slow
   because the gate was busy (a burst, a loaded host) are never reported here, so they
   cannot flip the gate; any answer in time resets the count.
3. Only a probe (the lease renewal, once per renewal interval) brings a degraded gate back,
   and only one that answered within the wait bound: a Redis that answers, but too slowly
   for admission, stays out of the request path instead of flapping in and out of it. The
   first such probe makes the gate *recovering* (``heard_since``: Redis's clock then); it
   is back once every gate counted (N) has renewed since, so that Redis again counts all
   the fleet holds (leases made by the policy, leases that expired while Redis was out of
   reach), or once a lease's life (``window_s``) has passed since (a gate silent that long
   holds nothing Redis counts). A renewal counts from when it was composed, with every
   lease the gate then held; a reservation, or a renewal composed before the trouble that
   Redis ran only as it came back (a paused Redis runs what waited in its socket), does not. Recovering, a fail_open gate asks Redis and keeps to its
   local share as well; a fail_closed gate still refuses. Trouble again ends recovering.
4. Every change of state is returned once, as a :class:`Flip`, for the audit and the log;
   a call that changes nothing returns None. ``cause`` is the short cause of the trouble
   while degraded (:mod:`.causes`: slow, refused, credentials refused; /health says it), the
   latest one reported: a Redis that stopped answering and then refused the connection says
   the second.
5. ``gates`` (N) is the largest count of gates seen on Redis within ``window_s`` before the
   latest count, at least 1. Every renewal and every reservation answer carries one, and
   Redis counts each gate that renewed or reserved within a lease's life, so N is at least
   the number of gates holding live leases; a window longer than a renewal period keeps
   one low count (a gate that has not renewed yet, or renewed late) from lowering it, and
   while degraded no count lowers it (the first counts after an outage may miss gates that
   have not reached Redis again). ``divisor`` is N while
   ``fail_open`` applies, else 1: fail_open runs each gate on 1/N of each limit. Before its
   first count (a gate started while Redis is out of reach) N is the count this gate's
   journal remembers from its last run (:meth:`SharedHealth.remember`; ``known`` says which),
   else 1: a restart during an outage must not take each tenant's whole limit on every gate.
6. Under fail_open a gate admits a limited tenant's request only if everything the gate
   holds for that tenant, admitted through Redis before the flip or by the policy after it,
   plus the request fits its share (:func:`fits_local_share`). So while Redis cannot be asked
   the fleet holds at most ``quota x gates / N`` of a tenant's in-flight tokens (at most the
   quota while N counts every gate), and fail_closed admits nothing for a limited tenant.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Literal

__all__ = ["Flip", "Known", "SharedHealth", "SharedState", "fits_local_share", "gates_phrase", "local_share"]

SharedState = Literal["off", "ok", "fail_open", "fail_closed"]
Policy = Literal["fail_open", "fail_closed"]
#: how N is known (rule 5): counted on Redis since start, remembered from the journal, or neither
Known = Literal["counted", "journal", "none"]


@dataclass(frozen=True, slots=True)
class Flip:
    """A change of state: what it was, what it is, why, and the N fail_open divides by."""

    old: SharedState
    new: SharedState
    why: str
    gates: int
    known: Known = "counted"


def gates_phrase(gates: int, known: Known) -> str:
    """N as the log, the audit and /health say it: how it is known, for an operator at 3 a.m."""
    if known == "counted":
        return f"N = {gates} {'gate' if gates == 1 else 'gates'} seen"
    if known == "journal":
        return (
            f"N = {gates} {'gate' if gates == 1 else 'gates'}, as this gate's journal last counted them on Redis (not reached since start)"
        )
    return "N = 1: Redis not reached since start and the journal holds no count of the gates, so this gate alone"


class SharedHealth:
    """The state machine of rules 1-6 (rule 6: :func:`fits_local_share`, applied by the client)."""

    __slots__ = (
        "policy",
        "timeouts_to_degrade",
        "window_s",
        "state",
        "_timeouts",
        "ever_seen",
        "_seen",
        "heard_since",
        "remembered",
        "cause",
    )

    def __init__(self, policy: Policy, *, timeouts_to_degrade: int = 1, window_s: float = 0.0, state: SharedState = "ok") -> None:
        if policy not in ("fail_open", "fail_closed"):
            raise ValueError(f"policy must be fail_open or fail_closed, got {policy!r}")
        if timeouts_to_degrade < 1:
            raise ValueError("timeouts_to_degrade must be at least 1")
        if window_s < 0:
            raise ValueError("window_s must not be negative")
        self.policy: Policy = policy
        self.timeouts_to_degrade = timeouts_to_degrade
        #: how long a count of gates is remembered, before the latest one (rule 5)
        self.window_s = window_s
        self.state: SharedState = state
        #: False until Redis counted the gates once (a probe or a reservation answered): N is
        #: then remembered or a guess, not a count
        self.ever_seen = False
        self._timeouts = 0
        #: (when, gates) counts within the window, the largest first: each is larger than
        #: every later one (a sliding-window maximum), so the first is N
        self._seen: deque[tuple[float, int]] = deque()
        #: while degraded: Redis's clock (ms) at the first probe in time since, else None (rule 3)
        self.heard_since: float | None = None
        #: N as the journal last recorded it (rule 5), until the first count
        self.remembered: int | None = None
        #: while degraded: the short cause of the latest trouble (rule 4), else ""
        self.cause = ""

    def remember(self, gates: int) -> None:
        """N as this gate last counted it in an earlier run (its journal): what N is until
        Redis counts the gates (rule 5). A count replaces it, as any older count (the window);
        while degraded a smaller count does not lower it, as after an outage."""
        if self.ever_seen or gates <= 1:
            return
        self.remembered = gates
        self._seen.appendleft((float("-inf"), gates))

    @property
    def known(self) -> Known:
        """How N is known now (rule 5)."""
        if self.ever_seen:
            return "counted"
        return "journal" if self.remembered is not None else "none"

    @property
    def degraded(self) -> bool:
        return self.state != "ok"

    @property
    def recovering(self) -> bool:
        """Degraded, but Redis answers again: waiting for every gate to renew (rule 3)."""
        return self.degraded and self.heard_since is not None

    @property
    def gates(self) -> int:
        """N: the most gates seen within the window before the latest count (rule 5)."""
        return self._seen[0][1] if self._seen else 1

    @property
    def divisor(self) -> int:
        """What fail_open divides each tenant limit by (rule 5)."""
        return self.gates if self.state == "fail_open" else 1

    def seen(self, gates: int, now: float) -> None:
        """Redis counted ``gates`` gates at ``now`` (the caller's clock, in seconds; rule 5)."""
        gates = max(1, gates)
        self.ever_seen = True
        while self._seen and self._seen[-1][1] <= gates:
            self._seen.pop()  # older and no larger: never the maximum again
        self._seen.append((now, gates))
        # Degraded, the counts of before the trouble stay: the first counts after an outage
        # may miss gates that have not reached Redis again yet (an empty restarted Redis).
        while not self.degraded and self._seen[0][0] < now - self.window_s:
            self._seen.popleft()

    def answered(self) -> None:
        """An admission call answered within the bound (rule 2: the count of slow ones resets)."""
        self._timeouts = 0

    def timed_out(self, what: str, cause: str = "") -> Flip | None:
        """An admission call that Redis did not answer within the bound (rule 2); ``cause``
        says so shortly (rule 4)."""
        if self.degraded:
            self.heard_since = None
            self.cause = cause or self.cause
            return None
        self._timeouts += 1
        if self._timeouts < self.timeouts_to_degrade:
            return None
        if self._timeouts == 1:
            return self._degrade(f"Redis did not answer within the wait bound ({what})", cause)
        return self._degrade(f"{self._timeouts} calls in a row slower than the wait bound ({what})", cause)

    def failed(self, why: str, cause: str = "") -> Flip | None:
        """Redis could not be reached, or answered with an error (rule 1); ``cause`` says
        which shortly (rule 4)."""
        if self.degraded:
            self.heard_since = None
            self.cause = cause or self.cause
            return None
        return self._degrade(why, cause)

    def probed(
        self, gates: int, in_time: bool, *, now: float = 0.0, redis_ms: float | None = None, fresh: int | None = None
    ) -> Flip | None:
        """A probe answered: ``gates`` seen on Redis at ``now`` (the caller's clock),
        ``in_time`` within the wait bound (rule 3). ``redis_ms`` is Redis's clock at the
        probe, ``fresh`` the gates that renewed since ``heard_since`` (or since the probe
        itself when None); without them the gate is back at the first probe in time."""
        self.seen(gates, now)
        self.ever_seen = True
        if not self.degraded:
            self._timeouts = 0
            return None
        if not in_time:
            return None
        if redis_ms is not None and fresh is not None:
            if self.heard_since is None:
                self.heard_since = redis_ms
            waited_ms = redis_ms - self.heard_since
            if fresh < self.gates and waited_ms < self.window_s * 1000:
                return None  # recovering: not every gate has renewed since Redis came back
            why = f"Redis answers in time again; {fresh} of {self.gates} gates renewed since"
        else:
            why = "Redis answers in time again"
        old = self.state
        self.state = "ok"
        self._timeouts = 0
        self.heard_since = None
        self.cause = ""
        return Flip(old, "ok", why, self.gates, self.known)

    def _degrade(self, why: str, cause: str = "") -> Flip:
        old = self.state
        self.state = self.policy
        self.cause = cause or why
        self._timeouts = 0
        self.heard_since = None
        return Flip(old, self.policy, why, self.gates, self.known)


def local_share(limit: int | None, divisor: int) -> int | None:
    """One gate's share of a fleet-wide ``limit`` under fail_open: floor(limit / N), at least 1.

    N shares add up to at most ``limit`` whenever ``limit >= N``; below that each gate keeps
    1 so that fail_open still serves the tenant (N x 1 may then exceed the limit by < N).
    """
    if limit is None or divisor <= 1:
        return limit
    return max(1, limit // divisor)


def fits_local_share(held: int, cost: int, limit: int | None, divisor: int) -> bool:
    """Rule 6: may a gate that holds ``held`` of a tenant's tokens admit ``cost`` more on its own?

    ``held`` is all the gate holds for the tenant, through Redis or not, so a flip to
    fail_open does not start it from zero."""
    share = local_share(limit, divisor)
    return share is None or held + cost <= share
