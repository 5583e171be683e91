"""How long a waiter still has to wait for a slot, from measured hold times (pure).

A slot frees when a running request ends. Every release gives one hold time (dispatch to
release); their mean over the last WINDOW releases is what a slot is held now, at the
current occupancy (a busier backend decodes each stream slower, and the holds grow with it).
A running request that has held its slot `e` seconds is expected to free it in
max(0, mean - e) (past the longest hold measured, in e - longest: `remaining`); the waiter at position p (0: next to be dispatched) gets the (p mod k)-th
slot to free of the k slots, p div k rounds of one mean hold later:

    wait(p) = sorted(remaining)[p mod k] + (p div k) x mean          (k = slots)

This is the measured drain rate applied to the requests ahead, with the state of the slots
that hold them: with fixed service times (the virtual-time harness) it is exact; against
llama-server it is an estimate that follows the load. Until MIN_HOLDS releases are in, there
is no estimate (None) and nobody is refused on it.

The mean says when a slot is expected to free, not how sure that is: against llama-server the
holds spread (and grow as the host slows), and a newcomer queued on the mean was often refused
after a wait (#25: 38 of 44 refusals at 3x came after a wait, p95 1.9 s). `chance_in_time`
reads the spread of the same holds: the chance that enough slots free within the time a
newcomer has, so that it is refused at arrival unless it is likely to make it. A slot held
`a` seconds frees within `d` with the chance that a hold longer than `a` is at most `a + d`
(among the holds measured; a free slot frees at once). One held longer than every hold measured
(the holds are growing: #25's real runs queued newcomers behind slots "due now" on the mean,
which then waited out their objective) frees within `d` with 1 - exp(-d / mean hold), and what
is left after it is d less one mean hold; a slot frees m times with the chance of its first free
times the chance that one hold is at most what is left after its expected first free / (m - 1). The waiter
at position p needs p + 1 frees:

    chance(p, d) = P(N_1 + ... + N_k >= p + 1),  N_i: the frees of slot i within d

(the N_i independent; summed exactly, capped at p + 1). With holds of one length (the
virtual-time harness) and no slot held past them, it is 1 when the mean's wait(p) <= d and 0
otherwise: the two agree.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

WINDOW = 32
MIN_HOLDS = 4


@dataclass(slots=True)
class HoldTimes:
    window: int = WINDOW
    min_holds: int = MIN_HOLDS
    _holds: deque[float] = field(default_factory=deque)
    _total: float = 0.0
    # the window sorted, kept until the next record: asked per newcomer (T1) and per walk (T2)
    _sorted: list[float] | None = None

    def record(self, seconds: float) -> None:
        if not seconds >= 0:
            return
        self._sorted = None
        self._holds.append(seconds)
        self._total += seconds
        while len(self._holds) > self.window:
            self._total -= self._holds.popleft()

    def sorted_s(self) -> list[float] | None:
        """The holds of the window, shortest first (None while too few: see `mean_s`); the
        caller reads it and does not change it."""
        if len(self._holds) < self.min_holds:
            return None
        if self._sorted is None:
            self._sorted = sorted(self._holds)
        return self._sorted

    @property
    def longest_s(self) -> float | None:
        holds = self.sorted_s()
        return None if holds is None else holds[-1]

    @property
    def mean_s(self) -> float | None:
        if len(self._holds) < self.min_holds:
            return None
        return self._total / len(self._holds)


def remaining(held_since: Iterable[float], mean_s: float, now: float, slots: int, longest_s: float | None = None) -> list[float]:
    """Expected seconds until each slot frees, soonest first (a free slot: 0). A slot held longer
    than `longest_s` (the longest hold measured) is not due now: it is expected to run as much
    longer as it has run past the longest (its overrun; a run that outlives every one measured
    is expected to go on the longer, the longer it has gone on), so a waiter behind it is refused
    once the overrun leaves it no time (before its deadline: #25's stalling host) and not the
    moment the slot passes the longest. That moment is when it most often frees: against
    llama-server, whose 64-token holds were all alike (~1 s at 3x), 9 of 14 refusals after a wait
    in one run came when a slot passed the longest hold and its wait jumped from 0 to one mean
    hold, as it was counted then (2026-12-05). T1 stays wary of such a slot (`chance_in_time`:
    memoryless at the mean hold's pace): a newcomer is not queued on it, a waiter is not dropped
    for it at once."""
    # a list and `x if x > 0.0 else 0.0` (= max(0.0, x), NaN included), not sorted(generator of
    # max()): asked once per walk of the waiters (T2) and per newcomer (T1), it was ~1/8 of a
    # replay's time (#24); the ledger is in admission order, so the sort meets one or two runs
    ages = [now - at for at in held_since]
    if longest_s is None:
        left = [r if (r := mean_s - age) > 0.0 else 0.0 for age in ages]
    else:
        left = [age - longest_s if age > longest_s else (r if (r := mean_s - age) > 0.0 else 0.0) for age in ages]
    left.sort()
    return ([0.0] * max(0, slots - len(left)) + left)[: max(1, slots)]


def residual_frees(ages: Iterable[float], holds: Sequence[float], slots: int) -> list[float]:
    """Expected seconds until each slot frees, soonest first (a free slot: 0), from the spread of
    the measured holds (`holds` sorted): a slot held `a` seconds frees, on average, when the holds
    longer than `a` ended: their mean less `a`; one held past every hold measured in its overrun,
    as `remaining` has it. A refusal's Retry-After, not T1-T3's judgement: the mean hold says a
    slot past it frees "now" (1 s), while the holds that ran that long ran far longer (a user's
    trial: four Retry-After: 1 in a row, each saying "0% likely to free", while the four slots
    freed 12 s later)."""
    n = len(holds)
    longest = holds[-1] if n else 0.0
    left: list[float] = []
    for age in ages:
        i = bisect_right(holds, age)
        left.append(sum(holds[i:]) / (n - i) - age if i < n else age - longest)
    left.sort()
    return ([0.0] * max(0, slots - len(left)) + left)[: max(1, slots)]


def growing_frees(
    held_since: Iterable[float], mean_s: float, now: float, slots: int, longest_s: float, places: int
) -> tuple[list[float], list[bool]]:
    """`remaining` (the same floats, in the same order) and, for the first `places` of them,
    whether each grows as time goes on: a slot held past `longest_s` (its overrun; the others stay
    or shrink). Of equal values the one that does not grow comes first, as the order after any
    moment more would have it. Asked on every walk of the waiters while a slot overruns (T2), for
    the places they wait at: marking every slot in Python was the most of a replay's time (#24)."""
    left: list[float] = []
    over: list[float] = []
    for at in held_since:
        age = now - at
        if age > longest_s:
            over.append(age - longest_s)
        else:
            left.append(r if (r := mean_s - age) > 0.0 else 0.0)
    left.sort()
    over.sort()
    left = [0.0] * max(0, slots - len(left) - len(over)) + left
    frees = sorted(left + over)[: max(1, slots)]
    grows: list[bool] = []
    i = j = 0
    for _ in range(min(places, len(frees))):  # the two merged, a tie: the one that does not grow first
        if j < len(over) and (i >= len(left) or over[j] < left[i]):
            grows.append(True)
            j += 1
        else:
            grows.append(False)
            i += 1
    return frees, grows


def first_frees(
    held_since: Sequence[float], mean_s: float, now: float, slots: int, longest_s: float | None, places: int
) -> tuple[list[float], list[bool] | None]:
    """The first min(`places`, slots) of `remaining`'s frees (the same floats, in the same order)
    and `growing_frees`'s marks for them (None when none of them grows: no slot is held past
    `longest_s`, or the free slots fill every place), from
    the reservations' moments OLDEST FIRST (the ledger's L6 and L9; the caller checks L6). Their
    ages then only fall, so the slots held past the longest are a prefix, and after it each
    slot's free only grows: the first `places` of them are the soonest, and the rest are not
    looked at. T2's walk reads only the places its waiters wait at (and the one above,
    `crossing`): ~50 of 128 slots in the bench's replay, where `growing_frees` and `remaining`
    over every slot were ~1/6 of an engine run (#24)."""
    m = min(places, max(1, slots))
    held = len(held_since)
    left: list[float] = [0.0] * max(0, min(m, slots - held))  # the free slots: 0, soonest of all
    need = m - len(left)
    if need <= 0:
        return left[:m], None
    # the prefix held past the longest, by bisection: `now - at > longest_s` only turns false
    # along the moments (they rise, and a float difference never rises with them); it was a
    # Python loop over that prefix, ~40 of 128 slots per walk in the bench's replay (#24)
    over: list[float] = []
    over_end = 0
    if longest_s is not None:
        hi = held
        while over_end < hi:
            mid = (over_end + hi) // 2
            if now - held_since[mid] > longest_s:
                over_end = mid + 1
            else:
                hi = mid
        over = [now - at - longest_s for at in held_since[:over_end]]  # age - longest_s
    # the rest of the places: none past the longest (their ages only fall)
    left += [r if (r := mean_s - (now - at)) > 0.0 else 0.0 for at in held_since[over_end : over_end + need]]
    if not over:
        return left[:m], None
    left.sort()  # sorted already (ages fall); as growing_frees reads them
    over.sort()
    frees = sorted(left + over)[:m]
    marked = min(places, len(frees))
    grows = [False] * marked
    for j, o in enumerate(over):
        # growing_frees's merge: a tie, the one that does not grow first, so each overrun comes
        # after the frees <= it (those not computed come after the m places: never before it)
        place = j + bisect_right(left, o)
        if place >= marked:
            break  # `over` and `left` sorted: each later overrun's place is further still (#24)
        grows[place] = True
    return frees, grows


def crossing(frees: list[float], grows: list[bool], now: float, upto: int) -> float | None:
    """The first moment after `now` that a growing free (a slot held past every hold measured)
    meets the shrinking one just above it (a slot not due yet) at the places 0..`upto` + 1: the
    order the slots free in changes there, and a waiter at the upper place may wait behind a slot
    that overruns from then on (T2 looks again). Frees move by one second a second, up or down,
    so the first to meet are neighbours in `frees` (in order) now; meetings further up are not
    looked for (a waiter is still refused by its deadline: its start-by once its slot is due).
    None when none will."""
    closest: float | None = None
    for i in range(min(upto + 1, len(grows) - 1)):
        if grows[i] and not grows[i + 1]:
            gap = frees[i + 1] - frees[i]
            if gap > 0.0 and (closest is None or gap < closest):
                closest = gap
    return None if closest is None else now + closest / 2.0


def wait_at(position: int, frees: list[float], mean_s: float) -> float:
    """Expected wait of the waiter `position` places from the front (see the module)."""
    k = len(frees)
    return frees[position % k] + (position // k) * mean_s


def chance_before_any_hold(position: int, within_s: float, ages: Iterable[float], slots: int) -> float:
    """`chance_in_time` before any hold is measured (a start under load): the busy slots free
    memorylessly, each at the pace of h, the longest any of them has been held so far (none has
    freed in that time), so their frees within `within_s` are Poisson with mean busy x within_s / h;
    a free slot frees at once. The waiter at `position` needs position + 1 frees. Not a bound: a
    guess that queues a newcomer while the slots are young (h small: likely) and refuses it at
    arrival once they have run long without a release, where it would have waited only to be
    refused (#25: a cold gate at 3x queued 15 newcomers in its first second, each refused ~105 ms
    later by T2)."""
    ages = list(ages)[: max(0, slots)]
    want = position + 1 - max(0, slots - len(ages))
    if want <= 0:
        return 1.0
    longest = max(ages, default=0.0)
    if within_s <= 0.0:
        return 0.0
    if longest <= 0.0:
        return 1.0  # the slots have just started: nothing says they are slow
    mean = len(ages) * within_s / longest
    if not mean < 700.0:
        return 1.0  # e^-mean underflows (0 x inf below): the slots free at once by comparison
    term = math.exp(-mean)  # P(0 frees)
    below = term
    for j in range(1, want):
        term *= mean / j
        below += term
    return max(0.0, 1.0 - below)


def _first_frees_bound(need: int, within_s: float, ages: list[float], holds: list[float], slots: int) -> float:
    """A lower bound of `chance_in_time` from each slot's first free alone (Hoeffding): with S
    the number of slots that free at least once within `within_s` (independent, each with the
    chance `first` that chance_in_time computes), mu = E[S] over the k slots,
    P(S >= need) >= 1 - exp(-2 (mu - need + 1)^2 / k) when mu > need - 1, and every free counts
    at least that. One bisect pair per slot, no convolution: a newcomer that is very likely to
    make it is told so at once (#24: T1's exact sum was 28% of a replay, and every one of a
    10,000-decision run's 4,416 calls ended "likely")."""
    n = len(holds)
    mu = float(slots - len(ages))  # free slots: one free each, at once
    mean = None
    for age in ages:
        at = bisect_right(holds, age)
        if at == n:
            if mean is None:
                mean = sum(holds) / n
            mu += 1.0 - math.exp(-within_s / max(1e-9, mean))
        else:
            mu += (bisect_right(holds, age + within_s) - at) / (n - at)
    slack = mu - (need - 1)
    if slack <= 0.0:
        return 0.0
    return 1.0 - math.exp(-2.0 * slack * slack / max(1, slots))


def chance_in_time(
    position: int, within_s: float, ages: Iterable[float], holds: list[float], slots: int, enough: float | None = None
) -> float:
    """The chance that the waiter `position` places from the front has a slot within `within_s`
    seconds, given how long each busy slot has been held (`ages`) and the holds measured
    (`holds`, shortest first, not empty). See the module docstring. With `enough`, the sum stops
    once the chance reaches it (it only grows slot by slot): the answer is then at least `enough`,
    not exact, which is all a caller comparing with `enough` needs (T1: most newcomers that
    queue are likely to make it; 32 slots, 128 holds, 16-128 ahead: 1-2 ms a call summed whole)."""
    if within_s < 0:
        return 0.0
    need = position + 1
    n = len(holds)
    # dist[j]: the chance of j frees so far (j < need); dist[need]: of need or more
    dist = [1.0] + [0.0] * need
    reach = 0  # dist[j] == 0 for every j < need beyond it: the sums stop there (adding 0 is exact)
    ages = list(ages)[: max(0, slots)]
    if need <= slots - len(ages):
        return 1.0  # a free slot for it (summed, the pieces of 1 can round to 0.9999999999999999)
    if enough is not None:
        bound = _first_frees_bound(need, within_s, ages, holds, slots)
        if bound >= enough:
            return bound  # at least `enough`: all T1 asks (#24: most newcomers that queue)
    for age in ages + [None] * max(0, slots - len(ages)):  # None: a free slot, one free at once
        if age is None:
            first, rest = 1.0, within_s
        elif (at := bisect_right(holds, age)) == n:
            # held past every hold measured (the holds grow: a slower host, longer answers): when
            # it ends is unknown; memoryless, at the mean hold's pace, then holds as measured in
            # what is left after one mean hold (counting no second free made a slot overrunning
            # its holds free once in 600 s: T1 refused a waiter of a 600 s objective at "0%", CI)
            mean = sum(holds) / n
            first, rest = 1.0 - math.exp(-within_s / max(1e-9, mean)), within_s - mean
        else:
            ends = bisect_right(holds, age + within_s) - at
            first = ends / (n - at)
            # what is left after its expected first free (the mean of the holds longer than its
            # age, less the age): averaged over the frees in time only, it shrank as the time
            # grew (a longer hold ending in time raised the mean) and the chance fell with more
            # time: 0.094 at 2.5 s and 0 at 3.0 s for 6 frees behind holds of 1.25 and 3 s
            # (hypothesis). This way it grows with the time, and with it the chance.
            rest = within_s - (sum(holds[at:]) / (n - at) - age) if ends else 0.0
        # at_least[m]: the chance of m or more frees of this slot within `within_s`
        at_least = [1.0, first]
        for m in range(2, need + 1):
            if at_least[-1] <= 0.0 or rest <= 0.0:
                break
            at_least.append(first * bisect_right(holds, rest / (m - 1)) / n)
        at_least.append(0.0)
        if first <= 0.0:
            continue  # it cannot free in time: the distribution is unchanged (x * 1.0 + 0.0 = x)
        # q[m]: the chance of exactly m frees; the sum below is the convolution of `dist` with q,
        # each nxt[t] summed over m descending (j = t - m ascending) and the capped last one over j
        # ascending, then m ascending: the same float operations, in the same order, as the loop of
        # (j, m) pairs it replaces, a list pass per m instead (#24: ~1/4 of a replay's time at
        # 128 slots and 60 ahead); a q of 0 adds nothing, as there
        qs = [at_least[m] - at_least[m + 1] for m in range(len(at_least) - 1)]
        top = len(qs) - 1
        nxt = [0.0] * need
        for m in range(top, -1, -1):
            q = qs[m]
            if q > 0.0 and m < need:
                end = min(need, reach + m + 1)
                nxt[m:end] = [x + d * q for x, d in zip(nxt[m:end], dist, strict=False)]
        reach = min(need - 1, reach + top)
        capped = 0.0
        for j in range(max(0, need - top), need + 1):
            pj = dist[j]
            if pj == 0.0:
                continue
            for m in range(need - j, top + 1):
                q = qs[m]
                if q > 0.0:
                    capped += pj * q
        nxt.append(capped)
        dist = nxt
        if dist[need] >= 1.0 or (enough is not None and dist[need] >= enough):
            break
    return min(1.0, dist[need])
