"""Admission: does a request run now, wait, or get refused? (pure core)

No I/O and no clock: every method takes `now`. One `Admission` guards one
backend: its ledger (what is in flight), its class queues (what waits) and
the rules below. The async shell owns the timers; it calls `advance(now)` on
every release, budget change or at `next_deadline()`.

Terms (per class c):
  reserved_c  tokens guaranteed to c: other classes never borrow them while c
              leaves them unused.
  limit_c     the most c may hold, reserved share plus borrowing.
  held back   sum over the other classes c' of max(0, reserved_c' - in_flight_c').

  R0. The reservations in force add up to at most RESERVED_SHARE_MAX of the ceiling: past
      it each class's reserved_tokens is scaled down in proportion (rounded down) on that
      backend (`reservations_in_force`), so that on any pool the gate finds, the other
      classes and the controller keep room (#25: the example's interactive 1,024 on a
      1,024-token pool left the controller's floor at the ceiling, and batch could hold
      nothing: 400 on every request). reserved_c below is the one in force.

A request r of class c, tenant t fits when all of:
  F1. in_flight + cost(r) <= budget - held back            (shared budget; E3 may raise it)
  F2. in_flight_c + cost(r) <= limit_c                      (class limit)
  F3. in_flight_t + cost(r) <= max_tokens_in_flight_t       (tenant quota, if set)
  F4. prefilling + prompt(r) <= max_prefill_tokens          (prefill burst, if set;
      a prompt may always start when nothing else is prefilling)
  F5. a slot is free for each of its tasks                  (llama-server never defers;
      A5: a request llama-server splits into several tasks holds them all at once)
  F6. a long prompt (> prefill_yield_tokens) does not start while a request of a
      higher-priority class waits or is still prefilling    (prefill yields, if set)
  F7. the free slots it leaves are at least what the higher-priority classes are expected
      to need beside what they hold: the nearest whole number to the sum over the unpaused
      higher classes h of max(0, demand_h x mean hold - slots held by h), demand_h being h's
      arrival rate lately (its offers, decayed over DEMAND_WINDOW_S) and the hold h's own mean
      measured slot hold (the mean of every class's until h has its own; nothing kept while
      no hold is measured). A waiter with its turn (G1) is
      exempt: the lower class keeps its bounded share (#25: with objectives nobody waits,
      so priority never acted: batch at 2x took the slots that freed before interactive at
      1x arrived, and served 74 to interactive's 25 on the real host).
While a higher-priority class waits for the shared budget (F1/F4), a lower
class may only dispatch within its own reservation: its borrowing yields.

Aging (no starvation, if `aging_s` is set): a waiter that has waited `aging_s`
or longer is *aged*. Aging gives a class a bounded share, never precedence over
a higher class beyond it (#25: under sustained overload every batch waiter had
aged, aged waiters went first whatever their class, and interactive was starved
instead; interactive admitted 8 of 94 at 1x saturation beside batch at 2x):
  G1. a waiter of class c *has its turn* when
      (a) it is aged, and no higher-priority class has an unpaused waiter or is expected to
          need a free slot (F7 keeps one for it), or it fits c's share: in_flight_c + cost <=
          reserved_c, or c has started no request by its turn for `aging_s`; or
      (b) it is c's oldest waiter (a newcomer, when none waits), aged or not, and c has
          started no request at all for `aging_s` (counted from its first arrival): the
          minimum rate. It needs no aging, so it holds for a class with a TTFT objective,
          whose waiters are refused (T1, T2) or served long before they age (#25: with
          objectives batch got 10, 15, 1, 0 in four 10 s windows on the real host, and
          none in some 10 s windows in virtual time with the example's 2 s objective).
      Past c's reservation while a higher class waits or is expected to need a slot, at most
      one request per `aging_s` starts by a turn (c's turn is used: (a) and (b) wait for the
      next). With TTFT objectives a higher class's newcomers are refused at arrival, not
      queued: "waits" alone let aged batch waiters take every slot that freed (a trial, the
      example with interactive at 1.5 s and batch at 60 s: 21 batch starts to 1 interactive in
      19 s; in virtual time interactive served 135-144 in time beside batch against 181-193
      alone, 158-176 with F7's demand counted).
  G2. waiters with their turn are served before every other waiter, oldest first, and never
      yield (F6, borrowing); while one of them waits for the shared budget, the prefill cap or
      a slot, no other class dispatches past its own reservation. A newcomer with its turn
      starts at once if it fits so and no other waiter has its turn; else it waits with it.
      An aged waiter without its turn waits in its class's order.
An operator's budget (static mode, a retune while the controller is frozen) is
never exceeded.

An elastic budget (`budget_elastic()` true: the adaptive controller's, which is
a congestion estimate and not a limit) stretches for aged work, so that the
controller sitting at its floor cannot starve a class of large requests:
  E1. with aging on, a request that the class can reach at the ceiling but not at
      the current budget waits (instead of 429 token_budget_exceeded);
  E2. an aged waiter's F1 is checked against max(budget, cost + the other classes'
      reservations): the smallest budget at which it could run, never above the
      ceiling. It starts once the others are back within their reservations (they
      may not borrow while it waits), one such request at a time. So is a request with
      its turn (G1) whose class's TTFT objective ends before it could age (T2 would refuse
      it first: #25, the controller at its floor, the interactive reservation on a
      2,048-token pool, left batch nothing, and batch started 0 of 181 with every slot free);
  E3. while it runs, that stretched budget is F1's budget for everyone (`effective_budget`),
      so the other classes keep their reservations beside it; it ends with its release.

TTFT objectives (#25: admitted must mean served in time). Every class has one: its own
`ttft_objective_ms`, else `default_ttft_objective_ms` (the shell: [budget] slo_ttft_p95_ms),
from arrival. `expected_ttft` (injected: the fitted prefill model, else the first-token time
measured lately) says how long a request dispatched now takes to its first token; the hold
times measured at release say when the slots free (gate/core/waits.py):
  T1. a newcomer that must wait is refused at once (429 queue_timeout, Retry-After = its
      expected wait) when its expected wait behind everything served before it (the waiters
      with their turn, G1, then everything of its class and the higher ones; a newcomer with
      its turn only behind the other waiters with theirs: position 0 when none waits; one more
      when a lower class's minimum-rate turn comes due before its slot frees and will go to a
      waiter of that class, or to a newcomer of one offered a request within aging_s; without
      its turn, as many more as the higher classes are expected to offer within its wait,
      beyond the slots F7 keeps for them: each will pass it), plus
      its expected first-token time and that time's own spread (IN_TIME_CHANCE of the first
      tokens measured lately came within it: `first_token_spread`; T2 and T3 judge by the
      estimate alone, so a waiter T1 queued is not refused when the estimate moves within
      that spread), passes its objective, or when the chance that
      a slot frees for it in time (from the spread of the measured holds, waits.chance_in_time)
      is below IN_TIME_CHANCE (before any hold is measured, a start under load: from how long
      the slots have run without a release, waits.chance_before_any_hold): it is queued only
      if it is likely to make it, so that a waiter
      refused after a wait (T2) is the exception, not the rule (#25: on the mean alone 38 of
      44 refusals at 3x came after a wait);
  T2. a waiter is refused as soon as its expected remaining wait plus first-token time passes
      its objective (not once it has passed): the queue stays short in time, not in count; its
      place is counted in the order of service (the waiters with their turn first, G2); a slot
      held past the longest hold measured is expected to run as long again as its overrun
      (waits.remaining), so the waiter is refused once the overrun leaves it no time, not the
      moment the slot passes the longest (when it most often frees);
  T3. a waiter is never dispatched when, with the prompts prefilling at that moment, its first
      token is expected after its objective.
  T4. T1 and T2 estimate a waiter's first-token time with the prompt tokens it will meet
      prefilling at its dispatch: the mean of what the last MET_KEPT waiters met at theirs
      (`prefill_met`), or what prefills now when that is more (a dispatch within one prefill).
      With the prompts prefilling at arrival instead, a newcomer arriving on a quiet moment
      was judged with none, queued, and met the prompts dispatched just before it: refused
      after its wait (T2, T3) instead of at arrival.
Retry-After of a refusal to wait (T1, a full queue, T2/T3, a timeout, a drain):
  R1. it is staggered behind the refusals of the classes served before or with it (its own and
      the higher ones) in the last HERD_WINDOW_S: the k-th such refusal gets k x the spacing of
      slot frees (the mean hold / slots) more than its own estimate. Those refused at about
      the same moment, told one figure, came back at the same moment and were refused again
      as one herd (a trial: 38 refusals in one instant all told 5 s for 4 slots; of 203
      clients that obeyed, 15 took 5 or more tries). Clamped to [1, 120] s like every
      Retry-After; no decision reads it.
  R2. a refusal that only an operator's action ends (a paused class; a budget the operator set,
      static or frozen, that the class's share cannot reach) is told its class's queue_timeout_s
      at the least, not the drain's estimate: no drain ends it.
  R3. a T1 refusal is told when its slot is expected to free by the spread of the holds (the
      mean of the holds longer than a slot's age, less its age), never less than the mean's
      wait; the drain rate is told only from MIN_HOLDS releases in its window (else the class's
      objective, or its queue_timeout_s).
A newcomer that fits now is admitted (the backend can start it; refusing on an estimate with
nothing running would stop the measurements too). Unmeasured parts count as zero; with nothing
measured there is no early refusal, and the waiter waits up to queue_timeout_s.

Never fits (refused at once, never queued): more tasks than the backend has slots (400),
its largest task > the context one slot holds,
cost > the largest share the class can reach at the ceiling (400), or cost >
the tenant's whole quota (429 tenant_quota). Cost above what the class can reach
at the current working budget is 429 token_budget_exceeded.

Invariants (`check_invariants`): the ledger's L1-L4, the queues' Q1-Q4, and
  A1. no request is both waiting and holding a reservation;
  A2. busy slots (reservations held) <= slots;
  A3. after `advance(now)`, the oldest waiter with its turn (G1) of an unpaused
      class that its own tenant quota or class limit does not hold back does not fit
      (F1, F4, F5): aged work within its share never waits for a higher class, only
      for capacity (checked by `check_aged`; with A2, G1's minimum rate and the
      reservations, the starvation guarantee);
  A4. in_flight <= ceiling; an admission leaves in_flight above the budget only within a
      stretch (E2, E3), and never above `effective_budget`.
  A5. slots held (one per task, L5) <= slots: a multi-task request is admitted for all of its
      tasks or waits; it never holds part of them, and no request is admitted with more tasks
      than there are slots (refused at once).
A refusal changes nothing; shrinking the budget revokes nothing already admitted.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol

from gate.core import ledger as ledger_mod
from gate.core import queueing
from gate.core.ledger import Ledger, Request, Reservation
from gate.core.queueing import ClassQueue, Waiting
from gate.core.reasons import Reason
from gate.core.waits import (
    MIN_HOLDS,
    HoldTimes,
    chance_before_any_hold,
    chance_in_time,
    crossing,
    first_frees,
    growing_frees,
    remaining,
    residual_frees,
    wait_at,
)

RETRY_MIN_S = 1.0
RETRY_MAX_S = 120.0
#: F7: the window (time constant, s) over which a class's arrival rate is measured
DEMAND_WINDOW_S = 10.0
# T1: a newcomer that must wait is queued only if a slot frees for it in time with at least this
# chance (the measured holds' spread). Higher refuses more at arrival and fewer after a wait.
IN_TIME_CHANCE = 0.9
#: T2 looks again no sooner than this behind a slot held past every hold measured (its start-by moment
#: comes back as time goes on; without a floor, rounding could ask for the same moment again)
RECHECK_S = 1e-6
#: T2's walk stops early only past this much more than the bound needs: the rounding of a
#: waiter's moments (a few ulps of a clock's seconds, ~1e-6 s even at epoch seconds) is far less
SKIP_MARGIN_S = 1e-3
#: T4: the dispatches of waiters whose prefilling met is averaged
MET_KEPT = 16
#: R1: refusals within this many seconds of each other are one herd (their Retry-After staggered)
HERD_WINDOW_S = 1.0


class ClassPolicy(Protocol):
    """The fields of config.ClassConfig that admission reads."""

    @property
    def name(self) -> str: ...
    @property
    def priority(self) -> int: ...
    @property
    def reserved_tokens(self) -> int: ...
    @property
    def limit_tokens(self) -> int | None: ...
    @property
    def queue_depth(self) -> int: ...
    @property
    def queue_timeout_s(self) -> float: ...
    @property
    def ttft_objective_ms(self) -> float | None: ...


#: R0: the most of the ceiling the classes' reservations hold back together
RESERVED_SHARE_MAX = 0.5


class Reserves(Protocol):
    """What R0 reads of a class: its name and its configured reservation."""

    @property
    def name(self) -> str: ...
    @property
    def reserved_tokens(self) -> int: ...


def reservations_in_force(policies: Iterable[Reserves], ceiling: int) -> dict[str, int]:
    """R0: each class's reservation on a backend of this ceiling: its reserved_tokens, or, when
    they add up to more than RESERVED_SHARE_MAX of the ceiling, its share of that, rounded down."""
    wanted = {p.name: p.reserved_tokens for p in policies}
    total = sum(wanted.values())
    most = int(ceiling * RESERVED_SHARE_MAX)
    if total <= most:
        return wanted
    return {name: n * most // total for name, n in wanted.items()}


@dataclass(frozen=True, slots=True)
class TenantPolicy:
    weight: float = 1.0
    max_tokens_in_flight: int | None = None


@dataclass(frozen=True, slots=True)
class Capacity:
    """What the backend can physically hold."""

    slots: int
    slot_context: int  # tokens one request can occupy (per-slot n_ctx)
    ceiling: int  # the most KV tokens in flight (pool size, or slots x slot_context)
    max_prefill_tokens: int | None = None  # F4; None: the measured `prefill_cap_auto`; 0: no cap
    prefill_yield_tokens: int | None = None  # F6: longer prompts yield to higher classes
    pool: int | None = None  # the KV pool llama-server reported, when `ceiling` is a configured token_budget


@dataclass(frozen=True, slots=True)
class Admit:
    request: Request
    at: float

    @property
    def queued_s(self) -> float:
        return self.at - self.request.arrival


@dataclass(frozen=True, slots=True)
class Queue:
    request: Request
    deadline: float


@dataclass(frozen=True, slots=True)
class Refuse:
    request: Request
    reason: Reason
    detail: str
    retry_after_s: float | None = None

    @property
    def status(self) -> int:
        return self.reason.status


Decision = Admit | Queue | Refuse


class Block(Enum):
    """Why a request does not fit right now (F1-F7)."""

    BUDGET = "budget"
    CLASS_LIMIT = "class_limit"
    TENANT = "tenant"
    PREFILL = "prefill"
    SLOTS = "slots"
    KEPT = "kept"  # F7: the free slots are kept for a higher class's expected demand
    YIELD = "yield"  # F6: a long prefill waits for a higher class


_SHARED = (Block.BUDGET, Block.PREFILL)
_AGED_WAITS = (Block.BUDGET, Block.PREFILL, Block.SLOTS)


@dataclass(frozen=True, slots=True)
class Step:
    """What `advance` changed: requests dispatched and requests whose wait ran out."""

    admitted: tuple[Admit, ...] = ()
    expired: tuple[Refuse, ...] = ()
    # A step that changed nothing: the moment `advance` ran and the earliest moment its walk found
    # that a waiter may be late (T2), still true while nothing changes (`next_deadline(now, after=step)`).
    unchanged_at: float | None = field(default=None, compare=False)
    late_at: float | None = field(default=None, compare=False)


@dataclass(slots=True)
class _Class:
    policy: ClassPolicy
    queue: ClassQueue
    reserved: int = 0  # its reservation in force (R0: `reservations_in_force`)
    # the queue's own index of its waiters: is anyone waiting, in C (a queue's truth is a Python
    # __len__ call, ~800k of them per 20,000 decisions replayed, #24)
    waiters: Mapping[str, Waiting] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.waiters = self.queue.by_id


@dataclass(slots=True)
class DrainRate:
    """Reserved tokens released per second of busy time over a sliding window.

    Busy means something in flight or waiting: a stretch with neither (`idle` .. `busy`) is
    the clients' pace, not the backend's, and is left out of the span. Counted over the whole
    span, one request served in a quiet spell made the next overload's rate look tiny (a
    trial: 14 tokens/s where the backend drained ~1,100, and refusals after a wait said
    Retry-After 120 s, then 55, 42, 28 s, for the drain window's 30 s)."""

    window_s: float = 30.0
    # Releases in the window before a rate is told (as the holds: waits.MIN_HOLDS): one request
    # served 15 s before a burst, at a fresh gate, made a rate of its lone release, and the
    # burst's refusals were told Retry-After 120, 116, 108 ... 9 s while the slots freed 4.9 s
    # after it came (a user's trial, 2026-12-07); without a rate they are told their class's
    # objective (or queue_timeout_s).
    min_releases: int = MIN_HOLDS
    _events: deque[tuple[float, int]] = field(default_factory=deque)
    _total: int = 0
    _since: float | None = None
    _idle: deque[tuple[float, float]] = field(default_factory=deque)  # idle stretches (start, end)
    _idle_from: float | None = None  # idle now, since then

    def record(self, now: float, tokens: int) -> None:
        self._trim(now)
        if self._since is None or not self._events:
            # The first release, or the first after a window with none (an idle night): the
            # rate is counted from here. Counted from the first release ever, an idle gap
            # spread the first releases of the next busy spell over the whole window (a
            # trial's gate, idle 40 s, told interactive clients Retry-After 120 s).
            self._since = now
        self._events.append((now, tokens))
        self._total += tokens
        self._trim(now)

    def idle(self, now: float) -> None:
        """Nothing in flight and nothing waiting, from `now`."""
        if self._idle_from is None:
            self._idle_from = now

    def busy(self, now: float) -> None:
        """A request was admitted or queued: an idle stretch, if any, ends."""
        if self._idle_from is not None:
            if now > self._idle_from:
                self._idle.append((self._idle_from, now))
            self._idle_from = None

    def rate(self, now: float) -> float:
        self._trim(now)
        if self._since is None or len(self._events) < self.min_releases:
            return 0.0
        start = now - min(self.window_s, now - self._since)
        idle = sum(max(0.0, min(end, now) - max(begin, start)) for begin, end in self._idle)
        if self._idle_from is not None:
            idle += max(0.0, now - max(self._idle_from, start))
        # A burst of releases at one instant says little: count at least one second.
        return self._total / max(now - start - idle, 1.0)

    def _trim(self, now: float) -> None:
        while self._events and self._events[0][0] < now - self.window_s:
            self._total -= self._events.popleft()[1]
        while self._idle and self._idle[0][1] < now - self.window_s:
            self._idle.popleft()


def _floor_pct(share: float) -> str:
    """A share as a percentage rounded down to a tenth: "only 90% likely ... it queues at 90%"
    read as a contradiction for 89.6% (a trial's message)."""
    return f"{math.floor(share * 1000) / 10:g}%"


def clamp_retry(seconds: float) -> float:
    """Retry-After is always within [1, 120] s."""
    if math.isnan(seconds):
        return RETRY_MAX_S
    return min(RETRY_MAX_S, max(RETRY_MIN_S, seconds))


class Admission:
    """The admission core for one backend."""

    def __init__(
        self,
        classes: Iterable[ClassPolicy],
        capacity: Capacity,
        *,
        budget: int | None = None,
        tenant_policy: Callable[[str], TenantPolicy] = lambda _t: TenantPolicy(),
        drain_window_s: float = 30.0,
        aging_s: float | None = None,
        expected_ttft: Callable[[Request, int], float | None] | None = None,
        first_token_spread: Callable[[float], float] | None = None,
        budget_elastic: Callable[[], bool] = lambda: False,
        default_ttft_objective_ms: float | None = None,
        keep_slots: bool = True,
        ttft_grows_with_prompt: bool = False,
    ) -> None:
        self.capacity = capacity
        # Is the working budget the adaptive controller's estimate (E1, E2), or an operator's limit?
        self.budget_elastic = budget_elastic
        self.aging_s = aging_s if aging_s else None
        # (request, prompt tokens prefilling now) -> seconds to its first token if dispatched
        # now, or None while unmeasured; the shell's measurement, injected to keep this pure.
        self.expected_ttft = expected_ttft
        # chance -> seconds above `expected_ttft` within which that share of the first tokens came
        # lately (the shell's measurement, as `expected_ttft`): T1 counts it, T2 and T3 do not
        self.first_token_spread = first_token_spread
        # The shell's word that `expected_ttft` never falls as a request's prompt tokens grow, and
        # reads nothing else of the request (the prefill model's line, a median, a constant): T2's
        # walk then stops at the first waiter that, with the widest prompt waiting, can be neither
        # late nor the earliest moment (#24). False: every waiter is walked.
        self.ttft_grows_with_prompt = ttft_grows_with_prompt
        # The TTFT objective of a class that sets none (the shell: [budget] slo_ttft_p95_ms).
        self.default_ttft_objective_ms = default_ttft_objective_ms
        # F4's cap when the capacity sets none (None there; 0 there means no cap): derived by
        # the shell from the measured prefill rate and the TTFT objective.
        self.prefill_cap_auto: int | None = None
        self.budget = capacity.ceiling if budget is None else budget
        self.ledger = Ledger()
        # E3: request id -> the budget it was stretched to, while it holds its reservation.
        self._stretched: dict[str, int] = {}
        # G1: class -> when it last started a request by its turn past its share (a).
        self._turn_at: dict[str, float] = {}
        # G1: class -> when it last started any request, or its first arrival (b).
        self._started_at: dict[str, float] = {}
        # T1: class -> when it was last offered a request (a lower class's coming turn, G1 b).
        self._offered_at: dict[str, float] = {}
        # F7: class -> (its arrival rate per second, decayed to that moment, the moment)
        self._arrivals: dict[str, tuple[float, float]] = {}
        # R1: class -> the moments of its refusals to wait in the last HERD_WINDOW_S
        self._refused_at: dict[str, deque[float]] = {}
        # F7: class -> its own slot holds (a class of long generations must not make another's
        # short ones look long, and so keep every slot from the lower classes)
        self._class_holds: dict[str, HoldTimes] = {}
        self.keep_slots = keep_slots  # F7 ([budget] keep_slots)
        self._now = 0.0  # the latest moment offer() or advance() was given (F7's decay)
        self.drain_rate = DrainRate(drain_window_s)
        # T1: measured slot hold times, for the expected wait of a newcomer or a waiter.
        self.holds = HoldTimes()
        self.in_time_chance = IN_TIME_CHANCE  # T1 (0: the mean's wait alone)
        # T4: the prompt tokens prefilling when each of the last MET_KEPT waiters was dispatched
        self._met: deque[int] = deque(maxlen=MET_KEPT)
        self._tenant_policy = tenant_policy
        self._classes: dict[str, _Class] = {}
        for policy in classes:
            self._classes[policy.name] = _Class(
                policy,
                ClassQueue(
                    policy.name,
                    depth=policy.queue_depth,
                    timeout_s=policy.queue_timeout_s,
                    weight_of=lambda t: self._tenant_policy(t).weight,
                ),
            )
        self._order: list[_Class] = []
        self._reserved_other: dict[str, int] = {}
        self._sort_classes()
        self._queues = tuple(c.queue for c in self._classes.values())  # a class keeps its queue
        self._ids = tuple(q.by_id for q in self._queues)  # their indexes: len() without a Python call

    # ---- reading -----------------------------------------------------------

    @property
    def class_names(self) -> tuple[str, ...]:
        return tuple(c.policy.name for c in self._order)

    def policy(self, cls: str) -> ClassPolicy:
        return self._classes[cls].policy

    def objective_ms(self, cls: str) -> float | None:
        """The class's TTFT objective from arrival: its own, else the default."""
        return self._classes[cls].policy.ttft_objective_ms or self.default_ttft_objective_ms

    def queue(self, cls: str) -> ClassQueue:
        return self._classes[cls].queue

    def waiting(self) -> int:
        return sum(map(len, self._ids))  # in C: asked on every event, several times (#24)

    def next_deadline(self, now: float | None = None, *, after: Step | None = None) -> float | None:
        """The earliest moment a waiter times out, may be late for its TTFT objective (T2: see
        `_start_by_walk`; a slot passing the longest hold measured is such a moment too) or ages
        (for the shell's one timer). Aging moments count only after `now`: an aged waiter still
        waiting waits for capacity, which a release announces, not a timer.

        `after`: the step `advance(now)` has just returned, nothing having changed since (the
        injected first-token estimate included): when it changed nothing, its walk of the
        waiters is reused instead of walked again (#24: 93% of a replay's advances change
        nothing, and the walk is O(waiters))."""
        # an empty queue has no deadline (its stale heap entries wait for its next look, #24)
        deadlines = [d for c in self._order if c.waiters and (d := c.queue.next_deadline()) is not None]
        if after is not None and now is not None and after.unchanged_at == now:
            earliest = after.late_at
        else:
            earliest = self._start_by_walk(now)[1]
        if earliest is not None:
            deadlines.append(earliest)
        longest = self.holds.longest_s
        if longest is not None and now is not None and self.waiting():
            # a slot held past the longest hold stops being due now (waits.remaining): T2 looks again
            if self.ledger.oldest_first:  # the first to pass it is the earliest (x + c grows with x)
                # by bisection in the moments (L9): `at + longest + 1e-6 > now` only turns true along
                # them; a generator over the slots held past it was ~1/20 of a replay (#24)
                moments = self.ledger.moments()
                lo, hi = 0, len(moments)
                while lo < hi:
                    mid = (lo + hi) // 2
                    if moments[mid] + longest + 1e-6 > now:
                        hi = mid
                    else:
                        lo = mid + 1
                if lo < len(moments):
                    deadlines.append(moments[lo] + longest + 1e-6)
            else:
                deadlines.extend(t for r in self.ledger if (t := r.admitted_at + longest + 1e-6) > now)
        if self.aging_s is not None and now is not None:  # the moment a waiter ages is a moment to dispatch
            aging = self.aging_s
            for c in self._order:
                if c.queue.paused:
                    continue
                # in enqueue order, the first waiter not yet aged is the next to age (loops, not
                # generators: asked on every event, #24)
                for w in c.queue.in_order():
                    if (at := w.enqueued_at + aging) > now:
                        deadlines.append(at)
                        break
            # ... and so is the moment a class's next turn comes (G1 a), or its minimum rate's (G1 b)
            for last_at in (self._turn_at, self._started_at):
                for cls, t in last_at.items():
                    if t + aging > now and self._classes[cls].waiters:
                        deadlines.append(t + aging)
        return min(deadlines) if deadlines else None

    def _overrunning(self, now: float, longest: float) -> bool:
        """Is a slot held past the longest hold measured? (The oldest, when the ledger is in
        admission order: asked on every walk of the waiters, T2.)"""
        if self.ledger.oldest_first:
            return next((now - r.admitted_at > longest for r in self.ledger), False)
        return any(now - r.admitted_at > longest for r in self.ledger)

    def held_back(self, cls: str) -> int:
        """Unused reservations of the classes other than `cls`."""
        by_class = self.ledger.by_class
        held = 0
        for c in self._order:  # a loop, not sum(max(...)): blocker asks on every dispatch look
            policy = c.policy
            if policy.name != cls:
                unused = c.reserved - by_class.get(policy.name, 0)
                if unused > 0:
                    held += unused
        return held

    def _reserved_elsewhere(self, cls: str) -> int:
        return self._reserved_other[cls]

    def _sort_classes(self) -> None:
        """The classes by priority, each one's reservation in force (R0) and `_reserved_elsewhere`
        (they change only with a policy or the capacity)."""
        self._order = sorted(self._classes.values(), key=lambda c: -c.policy.priority)
        in_force = reservations_in_force((c.policy for c in self._order), self.capacity.ceiling)
        for c in self._order:
            c.reserved = in_force[c.policy.name]
        self._reserved_other = {c.policy.name: sum(o.reserved for o in self._order if o is not c) for c in self._order}

    @property
    def reserved_total(self) -> int:
        """The reservations in force, together (R0: at most RESERVED_SHARE_MAX of the ceiling)."""
        return sum(c.reserved for c in self._order)

    def reserved(self, cls: str) -> int:
        """The class's reservation in force on this backend (R0: its reserved_tokens, or less on
        a small pool)."""
        return self._classes[cls].reserved

    def class_reach(self, cls: str, budget: int) -> int:
        """The most tokens `cls` could hold at `budget` with every other class idle."""
        policy = self._classes[cls].policy
        reach = budget - self._reserved_elsewhere(cls)
        if policy.limit_tokens is not None:
            reach = min(reach, policy.limit_tokens)
        return reach

    def _beyond_budget(self, request: Request) -> bool:
        """Is `request` larger than its class can reach at the working budget (429, or E1)?"""
        return request.cost > self.class_reach(request.cls, self.budget)

    def _reach_why(self, cls: str) -> str:
        """Why `cls` reaches less than the working budget, for a 429 token_budget_exceeded: a trial
        (R0) saw "class 'batch' can reach 0 at the current budget of 1024" under a frozen budget,
        with nothing saying that interactive's reservation held all of it. (A class's own
        limit_tokens below the request is never-fits, 400, before this.)"""
        held = self._reserved_elsewhere(cls)
        return f" ({held} of it reserved for other classes)" if held > 0 else ""

    def _held_back(self, request: Request) -> str:
        """What a refusal of a waiter beyond its class's reach adds (E1: it waited for its turn):
        without it, "would miss its time-to-first-token objective" blamed the objective when the
        budget at its floor was the others' reservations (a user's trial of R0: batch reached 0)."""
        if not self._beyond_budget(request):
            return ""
        return (
            f"; class {request.cls!r} can reach {max(0, self.class_reach(request.cls, self.budget))} tokens of the "
            f"current budget of {self.budget} (the rest is reserved for other classes), so it starts only by its turn"
        )

    def _stretches(self) -> bool:
        """E1/E2 apply: the budget is elastic and aged work exists to use the stretch."""
        return self.aging_s is not None and self.budget_elastic()

    @property
    def effective_budget(self) -> int:
        """The working budget, or the budget a running stretched request was given if larger (E3)."""
        if not self._stretched:
            return self.budget  # the common case, without building the max below
        return max(self.budget, min(self.capacity.ceiling, max(self._stretched.values(), default=0)))

    @property
    def stretched_to(self) -> int | None:
        """`effective_budget` while a stretch raises it above the working budget (E3), else None."""
        effective = self.effective_budget
        return effective if effective > self.budget else None

    def working_budget(self, request: Request, *, aged: bool = False) -> int:
        """F1's budget for `request`: the effective budget, stretched for an aged waiter (E2)."""
        budget = self.effective_budget
        if not (aged and self._stretches()):
            return budget
        need = request.cost + self._reserved_elsewhere(request.cls)
        return max(budget, min(self.capacity.ceiling, need))

    def blocker(self, request: Request, *, own_share_only: bool = False, aged: bool = False, stretch: bool | None = None) -> Block | None:
        """The first of F5, F7, F1-F4, F6 that `request` fails now, or None if it fits.

        `aged`: checked as a waiter with its turn (G1: no yielding, F6 and borrowing do not
        apply); `stretch` (default: `aged`): against E2's stretched budget, for an aged one.
        """
        led = self.ledger
        policy = self._classes[request.cls].policy
        cost = request.cost
        if led.slots + request.tasks > self.capacity.slots:
            return Block.SLOTS
        if not aged and self.keep_slots and led.slots + request.tasks > self.capacity.slots - self.kept_slots(policy.priority):
            return Block.KEPT
        in_class = led.class_tokens(request.cls)
        budget = self.working_budget(request, aged=True) if (aged if stretch is None else stretch) else self.effective_budget
        if led.in_flight + cost > budget - self.held_back(request.cls):
            return Block.BUDGET
        if own_share_only and not aged and in_class + cost > self._classes[request.cls].reserved:
            return Block.BUDGET
        if policy.limit_tokens is not None and in_class + cost > policy.limit_tokens:
            return Block.CLASS_LIMIT
        quota = self._tenant_policy(request.tenant).max_tokens_in_flight
        if quota is not None and led.tenant_tokens(request.tenant) + cost > quota:
            return Block.TENANT
        cap = self.capacity.max_prefill_tokens
        if cap is None:
            cap = self.prefill_cap_auto
        if cap and led.prefilling > 0 and led.prefilling + request.prompt_tokens > cap:
            return Block.PREFILL
        long_prompt = self.capacity.prefill_yield_tokens
        if not aged and long_prompt is not None and request.prompt_tokens > long_prompt and self._higher_busy(policy.priority):
            return Block.YIELD
        return None

    def demand(self, cls: str, now: float | None = None) -> float:
        """`cls`'s arrival rate lately, per second (F7): offers, decayed over DEMAND_WINDOW_S."""
        rate, at = self._arrivals.get(cls, (0.0, 0.0))
        now = self._now if now is None else now
        return rate * math.exp(-(now - at) / DEMAND_WINDOW_S) if now > at else rate

    def kept_slots(self, priority: int) -> int:
        """F7: free slots a class of `priority` leaves to the higher classes' expected demand."""
        shared = self.holds.mean_s
        if shared is None:
            return 0
        want = 0.0
        for c in self._order:
            policy = c.policy
            if policy.priority <= priority:
                break  # _order is by priority, highest first
            if c.queue.paused:
                continue
            own = self._class_holds.get(policy.name)
            hold = own.mean_s if own is not None else None
            if hold is None:
                hold = shared  # until its own holds are measured
            busy = self.ledger.slots_by_class.get(policy.name, 0)  # L8
            left = self.demand(policy.name) * hold - busy
            if left > 0:
                want += left
        return min(self.capacity.slots, math.floor(want + 0.5))

    def _higher_busy(self, priority: int) -> bool:
        """Does a higher-priority class wait (unpaused) or still prefill a prompt (F6)?"""
        prefilling = self.ledger.prefilling_by_class  # L10: not a walk of the ledger per look (#24)
        for c in self._order:
            if c.policy.priority <= priority:
                return False  # _order is by priority, highest first
            if (c.waiters and not c.queue.paused) or c.policy.name in prefilling:
                return True
        return False

    def aged(self, item: Waiting, now: float) -> bool:
        return self.aging_s is not None and now - item.enqueued_at >= self.aging_s

    def _stretched_turn(self, request: Request, since: float, now: float) -> bool:
        """E2 for a request with its turn (G1) that waits (or would wait) since `since`: it is aged,
        or its class's TTFT objective ends before it could age: T2 refuses it first, so waiting
        for aging would starve the class whenever the controller's budget leaves it nothing (#25:
        the controller at its floor, the interactive reservation, on a 2,048-token pool; batch
        started 0 of 181 in 60 s with every slot free)."""
        aging = self.aging_s
        if aging is None:
            return False
        if now - since >= aging:
            return True
        objective_ms = self.objective_ms(request.cls)
        return objective_ms is not None and objective_ms > 0 and request.objective_from + objective_ms / 1000.0 < since + aging

    def _aged_waiting(self, now: float) -> bool:
        """Does a waiter with its turn (G1) wait?"""
        if self.aging_s is None:
            return False
        return bool(self._aged(now))

    def _higher_waiting(self, priority: int) -> bool:
        return any(c.policy.priority > priority and c.waiters and not c.queue.paused for c in self._order)

    def _higher_wants(self, priority: int) -> bool:
        """G1 (a): does a higher class wait, or is it expected to need a free slot (F7's kept
        slots; its newcomers are refused at arrival rather than queued, see G1)?"""
        if self._higher_waiting(priority):
            return True
        return self.keep_slots and self.kept_slots(priority) > 0

    def _beyond_share(self, request: Request) -> bool:
        """Would `request` take its class past its reservation while a higher class waits or
        is expected to need the slot (G1)?"""
        entry = self._classes[request.cls]
        if not self._higher_wants(entry.policy.priority):
            return False
        return self.ledger.class_tokens(request.cls) + request.cost > entry.reserved

    def has_turn(self, item: Waiting, now: float) -> bool:
        """G1: may this waiter go ahead of every other waiter now?"""
        cls = item.request.cls
        if self.aging_s is None or self._classes[cls].queue.paused:
            return False
        if self._min_rate_due(cls, now) and next(self._classes[cls].queue.in_order(), None) is item:
            return True  # (b)
        if not self.aged(item, now):
            return False
        if not self._beyond_share(item.request):
            return True
        last = self._turn_at.get(cls)
        return last is None or now - last >= self.aging_s

    def _min_rate_due(self, cls: str, now: float) -> bool:
        """G1 (b): has `cls` started no request for aging_s (since its first arrival)?"""
        if self.aging_s is None:
            return False
        last = self._started_at.get(cls)
        return last is not None and now - last >= self.aging_s

    def _newcomer_turn(self, entry: _Class, now: float) -> bool:
        """G1 (b) for a newcomer: none of its class waits and the class's minimum rate is due."""
        return not entry.queue and not entry.queue.paused and self._min_rate_due(entry.policy.name, now)

    def _start(self, request: Request, now: float, *, turn: bool = False, aged: bool = False) -> Admit:
        """Reserve for `request` now; `turn`: it starts by its turn (G1); `aged`: it is aged
        (E2's stretch)."""
        cls = request.cls
        if aged:
            stretch = self.working_budget(request, aged=True)
            if stretch > self.effective_budget:
                self._stretched[request.id] = stretch  # E3: held until its release
        if turn:
            if self._beyond_share(request):
                self._turn_at[cls] = now  # G1: its turn past its share, used
        self._started_at[cls] = now
        self.ledger.reserve(request, now)
        self.drain_rate.busy(now)
        return Admit(request, now)

    def expected_wait(self, position: int, now: float) -> float | None:
        """T1: seconds until the waiter `position` places from the front is dispatched, from the
        measured hold times and the slots' state (gate/core/waits.py); None while unmeasured."""
        mean = self.holds.mean_s
        if mean is None or not self.capacity.slots:
            return None  # no slots (a router's model not loaded): its load, not a slot, decides
        led = self.ledger
        if led.oldest_first:  # L6: the slots up to its place only (waits.first_frees; T1 asks per newcomer)
            slots = self.capacity.slots
            frees = first_frees(led.moments(), mean, now, slots, self.holds.longest_s, position + 1)[0]
            return frees[position % slots] + (position // slots) * mean  # = wait_at with every slot's frees
        frees = remaining((r.admitted_at for r in led), mean, now, self.capacity.slots, self.holds.longest_s)
        return wait_at(position, frees, mean)

    def chance_in_time(self, position: int, within_s: float, now: float, enough: float | None = None) -> float | None:
        """T1: the chance that the waiter `position` places from the front gets a slot within
        `within_s`, from the spread of the measured holds (gate/core/waits.py); None while
        unmeasured. With `enough`: exact below it, at least it otherwise (waits.chance_in_time)."""
        holds = self.holds.sorted_s()
        if holds is None:
            return None
        ages = [now - at for at in self.ledger.moments()]  # L9: not a generator over the ledger (#24)
        return chance_in_time(position, within_s, ages, holds, self.capacity.slots, enough)

    def _ttft(self, request: Request) -> float | None:
        """T3: the first-token time of `request` dispatched now."""
        return None if self.expected_ttft is None else self.expected_ttft(request, self.ledger.prefilling)

    def prefill_met(self) -> int:
        """T4: the prompt tokens a waiter is expected to meet prefilling at its dispatch: the
        mean of what the last MET_KEPT waiters met, or what prefills now when that is more."""
        now = self.ledger.prefilling
        met = self._met
        if not met:
            return now
        mean = sum(met) // len(met)
        return mean if mean > now else now

    def _start_by_walk(self, now: float | None = None, *, late: bool = False) -> tuple[list[tuple[Waiting, float | None]], float | None]:
        """T2's walk: (with `late`, every waiter that must be dispatched by `now` to meet its
        class's TTFT objective and cannot be, with its expected wait; the first moment after `now`
        that one of them may be, or None). That moment, for a waiter not late now: its start-by
        moment when its wait stays as it is (nothing measured, its slot due); once its slot is
        due when its wait shrinks as time goes on (a slot not due yet: its start-by moment moves
        on as fast as time, so looking at it found the waiter as far from late each time, every
        few ms for up to a hold: 87 looks in a review's case, 2 now); halfway to its start-by
        moment when its wait grows (behind a slot held past every hold measured: the moment comes
        back as fast as time goes on); and, while a slot is held past every hold, the first moment
        the order the slots free in changes (waits.crossing), which changes whose wait grows.
        A waiter's start-by moment is the latest moment it can be dispatched and still meet its class's objective, brought forward by its expected wait:
        it is refused when it is expected to miss, not when it has; known once the first-token
        time or the hold times are measured. Waiters are walked in the order they are served
        (G2): those with their turn (G1) first, oldest first, then by priority; so a waiter with
        its turn waits for the next slot, not behind every higher-class waiter; a waiter refused
        now is nobody's wait.

        One loop of locals, no generator: O(waiters) on every `advance` and `next_deadline`, it
        was ~3/4 of a replay's time (#24: 3.1 M waiter steps in an engine run of 10,000
        decisions; the same floats as wait_at and the injected first-token time give)."""
        out: list[tuple[Waiting, float | None]] = []
        earliest: float | None = None
        waiting = self.waiting()
        default_ms = self.default_ttft_objective_ms
        objectives = [c.policy.ttft_objective_ms or default_ms for c in self._order]  # = objective_ms, per class
        if not waiting or not any(objectives):
            return out, earliest  # nothing to walk: no slot state either (a release's advance, idle queues)
        ahead = 0
        # no slots (a router's model not loaded): no slot state says when a waiter starts
        mean = None if now is None or not self.capacity.slots else self.holds.mean_s
        frees: list[float] = []
        grows: list[bool] | None = None  # which of `frees` grow as time goes on (None: none does)
        behind: int | None = None
        k = 0
        if mean is not None:  # the slot state once per walk: the ledger does not change while it runs
            longest = self.holds.longest_s
            at = now or 0.0
            if self.ledger.oldest_first:  # L6: only the places the waiters wait at (waits.first_frees)
                frees, grows = first_frees(self.ledger.moments(), mean, at, self.capacity.slots, longest, waiting + 1)
            elif longest is not None and self._overrunning(at, longest):
                # marked for the places the waiters wait at, and the one above (waits.crossing)
                places = waiting + 1
                frees, grows = growing_frees((r.admitted_at for r in self.ledger), mean, at, self.capacity.slots, longest, places)
            else:
                frees = remaining((r.admitted_at for r in self.ledger), mean, at, self.capacity.slots, longest)
            k = self.capacity.slots  # = len(remaining(...)); `frees` may hold only the first places
        # the place after the last one behind a free that grows (0: none grows)
        flat_from = 0 if grows is None or True not in grows else len(grows) - grows[::-1].index(True)
        expected_ttft = self.expected_ttft
        prefilling = self.prefill_met()  # T4
        # the waiters with their turn, where places matter (a wait is computed only with a mean)
        first = self._aged(now, served=True) if mean is not None and now is not None else []
        firsts = {w.request.id for w in first}
        walk: list[tuple[float | None, Iterable[Waiting], int, ClassQueue | None]] = [
            (self.objective_ms(w.request.cls), (w,), 1, None) for w in first
        ]
        bounded = self.ttft_grows_with_prompt
        for c, objective in zip(self._order, objectives, strict=True):
            cq = c.queue
            if cq.paused:
                continue
            if firsts:
                rest: Iterable[Waiting] = [w for w in cq.in_order() if w.request.id not in firsts]
                count = len(cq) - sum(1 for w in first if w.request.cls == c.policy.name)
            else:  # most walks (#24): nobody has a turn
                rest, count = cq.in_order(), len(cq)
            walk.append((objective, rest, count, cq if bounded and cq.from_ordered else None))
        horizon = math.inf if now is None else now
        slack: float | None = None
        floor = last = half_last = 0.0
        for objective_ms, waiters, count, queue in walk:
            if not objective_ms:
                ahead += count  # no objective: each waiter is only someone's wait
                continue
            objective_s = objective_ms / 1000.0
            if expected_ttft is None and mean is None:
                ahead += count  # nothing measured: no start-by moment
                continue
            if expected_ttft is not None and mean is not None and ahead + count <= k:
                # the common case (#24: ~99% of a replay's waiter steps), the loop below without
                # the branches it cannot take: every place in the slots' first round
                slack = None
                flat_slack = 0.0
                halfway = False  # are the places from `ahead` on bounded by the halfway moment?
                stop = math.inf  # a waiter whose objective counts from after this: it and the rest are skipped
                if queue is not None and count > 1:
                    # #24: with the waiters' moments rising (queue.from_ordered) and no first-token
                    # estimate above the widest prompt's (ttft_grows_with_prompt), a waiter whose
                    # moment is past `stop` and every one after it is neither late now (its wait is
                    # at most `last`, the class's last place's free) nor earlier than `earliest`:
                    # its late_at is start_by + its free = its moment + objective - its estimate,
                    # or, behind a slot whose free grows, halfway from now to its start-by moment
                    # (hence 2 x earliest - now + its free), less rounding, which SKIP_MARGIN_S
                    # covers: the walk stops there, with the same answer. Only the places before
                    # `flat_from` are behind a free that grows, so the halfway bound takes the
                    # largest free among them (`half_last`) and the places past them the bound
                    # without (#24: 9 of 10 of a replay's waiter steps were in walks behind slots
                    # held past every hold, bounded by the class's last free, a slot held long)
                    widest = queue.widest
                    flat_slack = (0.0 if widest is None else (expected_ttft(widest, prefilling) or 0.0)) - objective_s + SKIP_MARGIN_S
                    slack = flat_slack + SKIP_MARGIN_S  # the halfway moment: twice the rounding
                    last = frees[ahead + count - 1]
                    floor = horizon + last
                    halfway = ahead < flat_from
                    half_last = frees[(flat_from if flat_from < ahead + count else ahead + count) - 1] if halfway else 0.0
                    if earliest is not None:
                        stop = (earliest if earliest > floor else floor) + flat_slack
                        if halfway:
                            bound = 2.0 * earliest - horizon + half_last
                            half_stop = (bound if bound > horizon + half_last else horizon + half_last) + slack
                            stop = half_stop if half_stop > stop else stop
                for i, w in enumerate(waiters):
                    request = w.request
                    since = request.arrival if request.came is None else request.came
                    if halfway and ahead >= flat_from:  # from here on, no free that grows (above)
                        halfway = False
                        if earliest is not None:
                            stop = (earliest if earliest > floor else floor) + flat_slack
                    if since > stop:
                        ahead += count - i  # each a place, none late (see above)
                        if grows is not None:
                            behind = ahead - 1  # the last of them
                        break
                    first_round = frees[ahead]  # its wait (and its slot's free)
                    start_by = since + objective_s - (expected_ttft(request, prefilling) or 0.0) - first_round
                    if start_by > horizon:
                        if grows is None:
                            late_at = start_by + first_round
                        else:  # as below
                            behind = ahead
                            if grows[ahead]:
                                late_at = (start_by + horizon) / 2.0
                                late_at = late_at if late_at > horizon + RECHECK_S else horizon + RECHECK_S
                            else:
                                late_at = start_by + first_round
                        if earliest is None or late_at < earliest:
                            earliest = late_at
                            if slack is not None:  # as above
                                stop = (earliest if earliest > floor else floor) + flat_slack
                                if halfway:
                                    bound = 2.0 * earliest - horizon + half_last
                                    half_stop = (bound if bound > horizon + half_last else horizon + half_last) + slack
                                    stop = half_stop if half_stop > stop else stop
                        ahead += 1
                    else:
                        if earliest is None or start_by < earliest:
                            earliest = start_by
                        if late:
                            out.append((w, first_round))
                continue
            for w in waiters:
                request = w.request
                expected = None if expected_ttft is None else expected_ttft(request, prefilling)
                if mean is None:
                    if expected is None:
                        ahead += 1
                        continue
                    wait = None
                    start_by = request.objective_from + objective_s - expected
                else:
                    if ahead < k:  # the slots' first round: + 0 x mean adds 0.0 to a free >= +0.0
                        wait = free = frees[ahead]
                    else:
                        free = frees[ahead % k]
                        wait = free + (ahead // k) * mean  # = wait_at(ahead, frees, mean)
                    # request.objective_from, inlined (a property call per waiter per walk, #24)
                    start_by = (request.arrival if request.came is None else request.came) + objective_s - (expected or 0.0) - wait
                    if start_by > horizon:
                        behind = ahead  # the last place a waiter waits at (for the crossings below)
                        if grows is not None and grows[ahead % k]:
                            # behind a slot held past every hold: its wait grows as time goes on,
                            # the start-by moment comes back as fast and is reached halfway
                            late_at = (start_by + horizon) / 2.0
                            late_at = late_at if late_at > horizon + RECHECK_S else horizon + RECHECK_S
                        else:
                            # its wait shrinks as time goes on (until its slot is due): the start-by
                            # moment moves on as fast, and is reached once the slot is due
                            late_at = start_by + free
                        if earliest is None or late_at < earliest:
                            earliest = late_at
                        ahead += 1
                        continue
                if earliest is None or start_by < earliest:
                    earliest = start_by
                if start_by > horizon or now is None:
                    ahead += 1
                elif late:
                    out.append((w, wait))
        if grows is not None and behind is not None:
            # the first moment a waiter's wait stops shrinking and grows: a slot held past every
            # hold meets the slot the waiter waits for, from below (waits.crossing)
            # (none past `flat_from`: no free grows there; crossing's loop stops at it, #24)
            met = crossing(frees, grows, horizon, min(behind, k - 1, flat_from - 1))
            if met is not None:
                met = met if met > horizon + RECHECK_S else horizon + RECHECK_S  # rounding: never `now` itself
                if earliest is None or met < earliest:
                    earliest = met
        return out, earliest

    def _misses(self, request: Request, now: float) -> float | None:
        """T3: dispatched now, `request`'s expected first-token time when that misses its
        objective, else None."""
        objective_ms = self.objective_ms(request.cls)
        expected = self._ttft(request)
        if not objective_ms or expected is None:
            return None
        return expected if now + expected > request.objective_from + objective_ms / 1000.0 else None

    def fits_now(self, request: Request) -> bool:
        """Would `offer` admit `request` at once? Changes nothing (the fallback's look-ahead;
        it does not count a turn, G1, nor the waiters with theirs)."""
        entry = self._classes.get(request.cls)
        if entry is None or entry.queue.paused or entry.queue or self._never_fits(request) is not None:
            return False
        if self._beyond_budget(request):
            return False
        return self.blocker(request, own_share_only=self._yield_to_higher(entry)) is None

    def waiting_on(self, cls: str) -> str:
        """What keeps `cls`'s oldest waiter waiting right now, in at most 14 characters for the
        console: "paused", "slots 4/4 busy", "token budget", "reservations" (the budget has room,
        the other classes' unused reservations hold it: a paused class's too; a trial read
        "token budget" with 445 of 1,500 in flight), "aging (budget)" (larger than the
        controller's budget lets it be: it starts once aged, E1-E2), "class limit", "tenant quota",
        "prefill limit", "priority" (a higher class waits for the shared budget); "" when none waits."""
        queue = self._classes[cls].queue
        head = queue.oldest()
        if head is None:
            return ""
        if queue.paused:
            return "paused"
        block = self.blocker(head.request)
        if block is Block.BUDGET and self._stretches() and self._beyond_budget(head.request):
            return "aging (budget)"
        if block is Block.SLOTS and not self._stretches() and self._beyond_budget(head.request):
            # no free slot would start it: the budget an operator holds leaves its class less (a
            # trial's batch, 31 waiting under a budget held at 1,024 that interactive's reservation
            # took whole, read "slots 4/4 busy")
            return "reservations" if head.request.cost <= self.budget else "token budget"
        if block is Block.SLOTS:
            return f"slots {self.ledger.slots}/{self.capacity.slots} busy"
        if block is Block.BUDGET and self.ledger.in_flight + head.request.cost <= self.effective_budget:
            return "reservations"
        return {
            Block.BUDGET: "token budget",
            Block.CLASS_LIMIT: "class limit",
            Block.TENANT: "tenant quota",
            Block.PREFILL: "prefill limit",
            Block.YIELD: "prefill yields",
        }.get(block, "priority")  # type: ignore[arg-type]

    def retry_after(self, cls: str, cost: int, now: float, *, ahead: int | None = None) -> float:
        """Seconds until the class queue has drained enough for `cost`, clamped to [1, 120]."""
        queue = self._classes[cls].queue
        tokens_ahead = queue.tokens if ahead is None else ahead
        rate = self.drain_rate.rate(now)
        if rate <= 0:
            # Nothing has finished yet to measure: the class's own wait bound is the honest guess.
            return clamp_retry(queue.timeout_s)
        return clamp_retry((tokens_ahead + cost) / rate)

    # ---- deciding ----------------------------------------------------------

    def offer(self, request: Request, now: float) -> Decision:
        """Admit, enqueue or refuse a new request; a refusal changes nothing."""
        entry = self._classes.get(request.cls)
        if entry is None:
            raise KeyError(f"unknown class {request.cls!r}")
        never = self._never_fits(request)
        if never is not None:
            return never
        if entry.queue.paused:
            return self._paused(request, now)
        if self._beyond_budget(request) and not self._stretches():
            return Refuse(
                request,
                Reason.TOKEN_BUDGET_EXCEEDED,
                f"request needs {request.cost} tokens; class {request.cls!r} can reach "
                f"{max(0, self.class_reach(request.cls, self.budget))} at the current budget of {self.budget}"
                f"{self._reach_why(request.cls)}",
                # R2: an operator's budget (static, frozen) moves only by the operator's hand
                self.retry_after(request.cls, request.cost, now) if self.budget_elastic() else self._retry_operator(request, now),
            )
        self._count_arrival(request, now)
        # No overtaking: with requests of its class waiting, a newcomer waits behind them.
        turn = self._newcomer_turn(entry, now)  # G1 (b)
        if not entry.queue:
            others = self._aged_waiting(now)
            if self._newcomer_block(entry, request, turn, others, now) is None:
                first = turn and not others
                return self._start(request, now, turn=first, aged=first and self._stretched_turn(request, now, now))
        refusal = self._refused_to_wait(entry, request, now, turn)
        if refusal is not None:
            return refusal
        item = entry.queue.push(request, now)
        assert item is not None
        self.drain_rate.busy(now)
        return Queue(request, item.deadline)

    def refuses_before_count(self, request: Request, now: float) -> Refuse | None:
        """Would `offer` refuse `request` at once however large its prompt is beyond
        `request.prompt_tokens` (a lower bound: the prompt not counted yet)?
        A refusal counts the arrival as `offer`'s does (F7's demand, G1 b) and its moment (R1);
        nothing else changes.
        Only the refusals that need no size (a paused class) or that a larger prompt can only
        confirm: it must wait (its class has waiters, or even the bound does not fit: F1-F7 only
        tighten as a request grows) and T1 says it cannot make its objective (its first-token time
        only grows with the prompt) or its queue is full. Anything else (it may fit, never fits,
        over the budget) waits for the count. The shell asks before counting: under overload a
        count waited up to 2 s on llama-server's busy HTTP threads (a user's trial, 2026-12-05:
        refusals decided "at arrival" took 2.0 s on average while counts timed out)."""
        entry = self._classes.get(request.cls)
        if entry is None or self._never_fits(request) is not None:
            return None
        if entry.queue.paused:
            return self._paused(request, now)
        if self._beyond_budget(request) and not self._stretches():
            return None
        turn = self._newcomer_turn(entry, now)
        if not entry.queue and self._newcomer_block(entry, request, turn, self._aged_waiting(now), now) is None:
            return None
        refusal = self._refused_to_wait(entry, request, now, turn)
        if refusal is not None:
            # counted as `offer` counts an arrival it refuses to wait: uncounted, a class refused
            # before its count looked idle to F7 and G1 b (a two-class run at 1x + 2x: interactive's
            # demand undercounted, its kept slots went to batch, interactive served 76-96 of ~200
            # against 106-111 before refusals came before the count)
            self._count_arrival(request, now)
        return refusal

    def _count_arrival(self, request: Request, now: float) -> None:
        """An arrival offered (or refused before its count as `offer` would refuse it): G1 b's
        first and last offer, F7's demand."""
        self._started_at.setdefault(request.cls, now)  # G1 (b) counts from the first arrival
        self._offered_at[request.cls] = now
        self._now = max(self._now, now)
        self._arrivals[request.cls] = (self.demand(request.cls, now) + 1.0 / DEMAND_WINDOW_S, now)

    def _newcomer_block(self, entry: _Class, request: Request, turn: bool, others: bool, now: float) -> Block | None:
        """What keeps a newcomer of a class with no waiters from starting now (None: it starts);
        `others`: a waiter of another class has its turn (`_aged_waiting`)."""
        if turn and not others:  # G2: with its turn and nobody else's, it does not yield
            # E2 waits for aging, unless the objective refuses it first
            return self.blocker(request, aged=True, stretch=self._stretched_turn(request, now, now))
        return self.blocker(request, own_share_only=self._yield_to_higher(entry) or others)

    def _refused_to_wait(self, entry: _Class, request: Request, now: float, turn: bool) -> Refuse | None:
        """A newcomer that must wait: refused (T1, or its queue is full), else None (it queues)."""
        late = self._unreachable(entry, request, now, turn=turn)
        if late is not None:
            return self._staggered(late, now)
        if entry.queue.full:
            return self._staggered(
                Refuse(
                    request,
                    Reason.QUEUE_FULL,
                    f"class {request.cls!r} queue is full ({entry.queue.depth} waiting)",
                    self.retry_after(request.cls, request.cost, now),
                ),
                now,
            )
        return None

    def _staggered(self, refusal: Refuse, now: float) -> Refuse:
        """R1: `refusal` with its Retry-After behind the refusals to wait of its class and the
        higher ones in the last HERD_WINDOW_S (k of them: k x the spacing of slot frees more)."""
        cls = refusal.request.cls
        own = self._refused_at.setdefault(cls, deque())
        priority = self._classes[cls].policy.priority
        k = 0
        for c in self._order:
            if c.policy.priority < priority:
                break
            recent = self._refused_at.get(c.policy.name)
            if recent:
                while recent and recent[0] <= now - HERD_WINDOW_S:
                    recent.popleft()
                k += len(recent)
        own.append(now)
        mean = self.holds.mean_s
        if not k or mean is None or refusal.retry_after_s is None or self.capacity.slots < 1:
            return refusal
        return Refuse(refusal.request, refusal.reason, refusal.detail, clamp_retry(refusal.retry_after_s + k * mean / self.capacity.slots))

    def _paused(self, request: Request, now: float) -> Refuse:
        return Refuse(
            request,
            Reason.CLASS_PAUSED,
            f"class {request.cls!r} is paused by the operator",
            self._retry_operator(request, now),
        )

    def _retry_operator(self, request: Request, now: float) -> float:
        """R2: Retry-After of a refusal that only an operator's action ends (a paused class, a
        budget set by hand): no drain ends it, so not the drain's estimate (a trial's clients
        of a paused class were told 1 s, again and again), but the class's own wait bound, its
        queue_timeout_s, at the least."""
        timeout_s = self._classes[request.cls].queue.timeout_s
        return clamp_retry(max(self.retry_after(request.cls, request.cost, now), timeout_s))

    def advance(self, now: float) -> Step:
        """Expire overdue waiters, serve aged waiters, then dispatch by priority and DRR
        while requests fit."""
        self._now = max(self._now, now)
        late, late_at = self._start_by_walk(now, late=True)
        expired = list(self._expire(now, late))
        admitted: list[Admit] = []
        shared_blocked, slots_full = self._serve_aged(now, admitted, expired)
        if slots_full:
            return self._step(now, admitted, expired, late_at)
        for entry in self._order:
            queue = entry.queue
            if queue.paused or not entry.waiters:
                continue
            exclude: set[str] = set()
            while True:
                item = queue.select(exclude)
                if item is None:
                    break
                block = self.blocker(item.request, own_share_only=shared_blocked)
                miss = None if block is not None else self._misses(item.request, now)
                if miss is not None:
                    queue.remove(item.request.id)
                    expired.append(self._late_refusal(item, now, first_s=miss))
                    continue
                if block is None:
                    queue.pop(item)
                    self._met.append(self.ledger.prefilling)  # T4
                    admitted.append(self._start(item.request, now))
                    continue
                if block is Block.SLOTS:
                    return self._step(now, admitted, expired, late_at)
                if block is Block.TENANT:
                    exclude.add(item.request.tenant)
                    continue
                if block is Block.KEPT:
                    break  # this class and the lower ones leave the rest to the higher classes
                if block in _SHARED:
                    shared_blocked = True
                break
        return self._step(now, admitted, expired, late_at)

    def _step(self, now: float, admitted: list[Admit], expired: list[Refuse], late_at: float | None) -> Step:
        if expired and not admitted:
            self._idle_if_empty(now)  # the last waiters refused (timed out, late) with nothing in flight
        if admitted or expired:
            return Step(tuple(admitted), tuple(expired))
        return Step(unchanged_at=now, late_at=late_at)  # selecting (DRR) moves no start-by moment

    def _aged(self, now: float, *, served: bool = False, waiting_above: int | None = None) -> list[Waiting]:
        """Every waiter of an unpaused class that has its turn (G1), oldest first: aged ones (a)
        and each class's oldest when its minimum rate is due (b).

        `served`: only those that will be served by it (T1, T2 count places with it): past its
        share while a higher class waits, a class's turn serves one waiter, and the next has no
        turn until aging_s later (G1); listed all, a chat queued beside aged batch waiters read
        them all ahead of it and was refused after its wait. `waiting_above`: as if a waiter of
        that priority waited (T1: a newcomer, once queued, is that higher class)."""
        if self.aging_s is None:
            return []
        aging = self.aging_s
        aged: list[Waiting] = []
        for c in self._order:
            if c.queue.paused or not c.waiters:
                continue
            min_rate = self._min_rate_due(c.policy.name, now)  # a method: test_min_rate's negative control overrides it
            waiters = c.queue.in_order()
            oldest = next(waiters)
            if not now - oldest.enqueued_at >= aging:  # none aged (most looks: #24, before the rest)
                if min_rate:
                    aged.append(oldest)  # (b): the oldest, aged or not
                continue
            # has_turn's inputs that are the same for every waiter of the class, once per class
            higher = (waiting_above is not None and c.policy.priority < waiting_above) or self._higher_wants(c.policy.priority)
            in_class = self.ledger.class_tokens(c.policy.name)
            last = self._turn_at.get(c.policy.name)
            turn_due = last is None or now - last >= aging
            by_turn = False  # `served`: the class's one turn past its share is taken
            for i, w in enumerate(itertools.chain((oldest,), waiters)):  # aged waiters are a prefix of the enqueue order
                if not now - w.enqueued_at >= aging:
                    if i == 0 and min_rate:
                        aged.append(w)  # (b): the oldest, aged or not
                    break
                # = has_turn(w, now): not beyond its share while a higher class waits, or its turn
                if not higher or in_class + w.request.cost <= c.reserved:
                    aged.append(w)
                elif (turn_due or (i == 0 and min_rate)) and not (served and by_turn):
                    aged.append(w)
                    by_turn = True
        return sorted(aged, key=lambda w: (w.enqueued_at, w.request.id)) if len(aged) > 1 else aged

    def _serve_aged(self, now: float, admitted: list[Admit], expired: list[Refuse]) -> tuple[bool, bool]:
        """Dispatch aged waiters, oldest first, until the oldest one left needs shared
        capacity (budget, prefill, a slot) that is not free; returns (an aged
        waiter still waits for shared capacity, the slots are full). Waiters held by their own
        tenant quota or class limit are passed over: nothing else would free those."""
        skip: set[str] = set()
        while True:
            for w in self._aged(now):
                if w.request.id in skip:
                    continue
                stretch = self._stretched_turn(w.request, w.enqueued_at, now)
                block = self.blocker(w.request, aged=True, stretch=stretch)
                miss = None if block is not None else self._misses(w.request, now)
                if miss is not None:
                    self._classes[w.request.cls].queue.remove(w.request.id)
                    expired.append(self._late_refusal(w, now, first_s=miss))
                    break
                if block is None:
                    self._classes[w.request.cls].queue.remove(w.request.id)
                    self._met.append(self.ledger.prefilling)  # T4
                    admitted.append(self._start(w.request, now, turn=True, aged=stretch))
                    break
                if block in _AGED_WAITS:
                    return True, block is Block.SLOTS
                skip.add(w.request.id)
            else:
                return False, False

    def cancel(self, request_id: str, now: float | None = None) -> Waiting | None:
        """A waiting request's client went away: forget it (no reservation to release)."""
        for entry in self._order:
            item = entry.queue.remove(request_id)
            if item is not None:
                self._idle_if_empty(self._now if now is None else now)
                return item
        return None

    def first_token(self, request_id: str) -> bool:
        return self.ledger.first_token(request_id)

    def release(self, request_id: str, now: float) -> Reservation | None:
        """Return a reservation's tokens exactly once; None if it was already released."""
        res = self.ledger.release(request_id)
        self._stretched.pop(request_id, None)
        if res is not None:
            self.drain_rate.record(now, res.cost)
            self._idle_if_empty(now)
            self.holds.record(now - res.admitted_at)
            own = self._class_holds.get(res.request.cls)
            if own is None:
                own = self._class_holds[res.request.cls] = HoldTimes()
            own.record(now - res.admitted_at)
        return res

    def settle(self, request: Request) -> bool:
        """The reservation held under `request.id` was admitted on an upper bound of a request's
        prompt (its count not back yet: the shell forwards it beside the count); now it holds
        `request`, counted (L7), when that is no larger: every rule the bound passed (F1-F7,
        never-fits; a newcomer that fits is not judged by T3) it passes with less, so it stays
        admitted from that moment. A larger one stays admitted when it would be admitted at once
        in the bound's place (never-fits, the budget it can reach, F1-F7 with the bound set
        aside): llama-server already runs it. False, changing nothing, otherwise: the caller
        takes the bound back and offers the request afresh."""
        held = self.ledger.get(request.id)
        if held is None:
            return False
        bound = held.request
        if request.prompt_tokens <= bound.prompt_tokens and request.cost <= bound.cost and request.tasks == bound.tasks:
            self.ledger.swap(request)
            return True
        entry = self._classes.get(request.cls)
        if entry is None or request.cls != bound.cls or self._never_fits(request) is not None or self._beyond_budget(request):
            return False
        # the bound set aside in place (no slot, no tokens), to judge the count where it stands
        self.ledger.swap(Request(request.id, bound.cls, bound.tenant, 0, 0, bound.arrival, tasks=0))
        fits = self.blocker(request, own_share_only=self._yield_to_higher(entry)) is None
        self.ledger.swap(request if fits else bound)
        return fits

    def withdraw(self, request_id: str, now: float | None = None) -> Reservation | None:
        """Undo an admission whose request never ran as admitted (a bound its count exceeded,
        a count or rate limit that failed, the client gone before it): its tokens come back, and
        no hold, drain rate or turn is measured from it, as from a request that ran."""
        self._stretched.pop(request_id, None)
        res = self.ledger.release(request_id)
        self._idle_if_empty(self._now if now is None else now)
        return res

    def _idle_if_empty(self, now: float) -> None:
        """Nothing in flight and nothing waiting that may start (a paused class's waiters wait
        for the operator, not the backend): the drain rate's busy time stops here. Marked at a
        release only, when nothing waited at all, a quiet spell that began with the last waiter
        of a paused class timed out, drained or gone counted as busy time, and the next
        overload's refusals were told a Retry-After that spell's few releases made too long."""
        if not len(self.ledger) and not any(c.queue for c in self._order if not c.queue.paused):
            self.drain_rate.idle(now)

    def drain(self, cls: str, now: float) -> list[Refuse]:
        """Refuse everything waiting in `cls` (operator action). A paused class's waiters are
        told what its newcomers are (R2: only the operator ends the pause), not the drain's
        estimate: told 1 s, they came back to 503 class_paused."""
        queue = self._classes[cls].queue
        paused = queue.paused
        refused = [
            self._staggered(
                Refuse(
                    w.request,
                    Reason.DRAINED,
                    f"class {cls!r} queue was drained by the operator",
                    self._retry_operator(w.request, now) if paused else self.retry_after(cls, w.request.cost, now, ahead=0),
                ),
                now,
            )
            for w in queue.drain()
        ]
        self._idle_if_empty(now)
        return refused

    # ---- steering ----------------------------------------------------------

    def set_budget(self, tokens: int) -> None:
        """Change the working budget; admitted work is never revoked, only new admissions wait."""
        if tokens < 1:
            raise ValueError(f"budget must be positive, got {tokens}")
        self.budget = min(tokens, self.capacity.ceiling)

    def set_capacity(self, capacity: Capacity) -> None:
        self.capacity = capacity
        self.budget = min(self.budget, capacity.ceiling)
        self._sort_classes()  # R0: the reservations in force follow the ceiling

    def set_policy(self, policy: ClassPolicy) -> None:
        """Replace a class's shares and queue bounds; waiters keep their deadlines.

        A smaller depth refuses newcomers until the queue is below it; nothing
        already waiting is dropped.
        """
        entry = self._classes[policy.name]
        entry.policy = policy
        entry.queue.depth = policy.queue_depth
        entry.queue.timeout_s = policy.queue_timeout_s
        self._sort_classes()

    def paused(self, cls: str) -> bool:
        return self._classes[cls].queue.paused

    def pause(self, cls: str) -> None:
        self._classes[cls].queue.paused = True

    def resume(self, cls: str) -> None:
        self._classes[cls].queue.paused = False

    # ---- internals ---------------------------------------------------------

    def _never_fits(self, request: Request) -> Refuse | None:
        cost = request.cost
        if 0 < self.capacity.slots < request.tasks:  # 0 slots: a model not loaded yet, it waits
            return Refuse(
                request,
                Reason.INVALID_REQUEST,
                f"the request runs as {request.tasks} tasks ({cost} tokens) and the backend has "
                f"{self.capacity.slots} slots: it can never run at once",
            )
        if request.largest_task > self.capacity.slot_context:
            if request.tasks == 1:
                detail = (
                    f"prompt ({request.prompt_tokens}) + max_tokens ({request.max_tokens}) = {cost} "
                    f"tokens exceeds the {self.capacity.slot_context}-token context of a slot"
                )
            else:
                detail = (
                    f"the largest of its {request.tasks} tasks needs {request.largest_task} tokens "
                    f"(max_tokens {request.max_tokens} included), more than the "
                    f"{self.capacity.slot_context}-token context of a slot"
                )
            return Refuse(request, Reason.CONTEXT_LENGTH_EXCEEDED, detail)
        reach = self.class_reach(request.cls, self.capacity.ceiling)
        if cost > reach:  # R0: the others leave it at least half the ceiling (a limit_tokens may say less)
            detail = f"request needs {cost} tokens; class {request.cls!r} can never hold more than {reach}"
            return Refuse(request, Reason.CONTEXT_LENGTH_EXCEEDED, detail)
        quota = self._tenant_policy(request.tenant).max_tokens_in_flight
        if quota is not None and cost > quota:
            return Refuse(
                request,
                Reason.TENANT_QUOTA,
                f"request needs {cost} tokens; tenant {request.tenant!r} may hold at most {quota}",
            )
        return None

    def _yield_to_higher(self, entry: _Class) -> bool:
        """Does a higher-priority class wait for the shared budget (so `entry` may not borrow)?"""
        for other in self._order:
            if other is entry:
                return False
            if other.queue.paused or not other.waiters:
                continue
            item = other.queue.select()
            if item is not None and self.blocker(item.request) in _SHARED:
                return True
        return False

    def _unreachable(self, entry: _Class, request: Request, now: float, *, turn: bool = False) -> Refuse | None:
        """A newcomer that must wait and already cannot meet its class's TTFT objective;
        `turn`: it waits with its turn (G1 b)."""
        objective_ms = self.objective_ms(entry.policy.name)
        if not objective_ms:
            return None
        expected = None if self.expected_ttft is None else self.expected_ttft(request, self.prefill_met())  # T4
        spread = 0.0
        if expected is not None and self.first_token_spread is not None and self.in_time_chance > 0.0:
            spread = self.first_token_spread(self.in_time_chance)  # T1: the first token's own spread
            expected += spread
        ahead = self._ahead_of_newcomer(entry, now, turn)
        wait = self.expected_wait(ahead, now)
        forecast = 0  # of `ahead`, those not here yet (the message says so: "46 ahead" beside a queue of 3 read as a bug)
        if wait is not None and not turn and self._turn_coming(entry, now, now + wait):
            ahead += 1  # a lower class's turn comes before its slot: it will go first (G1 b, G2)
            forecast += 1
            wait = self.expected_wait(ahead, now)
        if wait is not None and not turn:
            coming = self._higher_coming(entry.policy.priority, wait)
            if coming:
                ahead += coming
                forecast += coming
                wait = self.expected_wait(ahead, now)
        if expected is None and wait is None:
            return None
        left = request.objective_from + objective_ms / 1000.0 - now - (expected or 0.0)  # to get a slot
        chance = self.chance_in_time(ahead, left, now, self.in_time_chance) if wait is not None and wait <= left else None
        unmeasured = wait is None and self.in_time_chance > 0.0 and self.holds.sorted_s() is None
        if unmeasured:  # T1 before any hold is measured: how long the slots have run without a release
            chance = chance_before_any_hold(ahead, left, (now - r.admitted_at for r in self.ledger), self.capacity.slots)
        if (wait or 0.0) <= left and (chance is None or chance >= self.in_time_chance):
            return None
        # The message names the rule that refused: a user's trial read "expected wait 0 ms + first
        # token 693 ms would miss its 2000 ms objective" on 154 of 225 refusals, whose sums did
        # not miss: the chance refused them, and "0 ms" was a wait nobody had measured.
        # "first token 0 ms" beside "first token 2335 ms" a minute later read as a measurement (a
        # trial): nothing measured counts as 0 and says so
        first = f"first token {expected * 1000:.0f} ms" if expected is not None else "first token not measured yet"
        if spread > 0.0:
            first += f" ({self.in_time_chance:.0%} of first tokens lately within it)"
        due = f" ({forecast} of them expected to arrive or take a turn first)" if forecast else ""
        if wait is None:
            waiting = f"{ahead} ahead, no slot has freed yet"
        elif wait < 0.0005 and self.ledger.slots >= self.capacity.slots:
            # the busy slots are past the mean hold, so the mean says "now" where the spread of
            # the holds says how unlikely it is ("expected wait 0 ms ... 0% likely", a trial)
            waiting = f"{ahead} ahead, the slots held past their mean hold"
        else:
            waiting = f"expected wait {wait * 1000:.0f} ms for {ahead} ahead{due}"
        if (wait or 0.0) > left:
            # The objective counts from when the request came (before its body and count were
            # in): a sum without that time did not miss ("expected wait 614 ms + first token
            # 745 ms would miss its 2000 ms", for a client whose body took 2.2 s).
            spent_ms = (now - request.objective_from) * 1000
            since = f"{spent_ms:.0f} ms since it came + " if spent_ms >= 0.5 else ""
            why = f"{since}{waiting} + {first} would miss its {self._objective_said(request.cls, objective_ms)}"
        else:
            why = (
                f"a slot is only {_floor_pct(chance or 0.0)} likely to free within the {max(0.0, left) * 1000:.0f} ms its "
                f"{self._objective_said(request.cls, objective_ms)} leaves ({waiting}; {first}); "
                f"it queues at {self.in_time_chance:.0%}"
            )
        return Refuse(
            request,
            Reason.QUEUE_TIMEOUT,
            f"class {request.cls!r} cannot start now: {why}{self._held_back(request)}",
            clamp_retry(self._retry_wait(ahead, now, wait)) if wait is not None else self._retry_unmeasured(request.cls, request.cost, now),
        )

    def _objective_said(self, cls: str, objective_ms: float) -> str:
        """The objective a T1/T2 refusal names, and whose it is when the class sets none: a trial's
        batch, `queue_timeout_s = 120` in its file, was refused in 5 ms with `queue_timeout` by
        the [budget] default of 2 s it inherits, and raising the timeout would change nothing."""
        said = f"{objective_ms:g} ms time-to-first-token objective"
        if self._classes[cls].policy.ttft_objective_ms:
            return said
        return f"{said} ([budget] slo_ttft_p95_ms: class {cls!r} sets no ttft_objective_ms)"

    def _retry_wait(self, position: int, now: float, wait: float) -> float:
        """R3: a T1 refusal's Retry-After: when the slot of the waiter `position` places from the
        front is expected to free by the spread of the holds (waits.residual_frees), not by their
        mean (`wait`), which says "now" of a slot held past it; never less than `wait`."""
        holds, mean = self.holds.sorted_s(), self.holds.mean_s
        if holds is None or mean is None or not self.capacity.slots:
            return wait
        frees = residual_frees([now - at for at in self.ledger.moments()], holds, self.capacity.slots)
        return max(wait, wait_at(position, frees, mean))

    def _higher_coming(self, priority: int, within_s: float) -> int:
        """T1: the higher classes' requests expected to arrive within `within_s` (their demand),
        beyond the slots F7 already keeps for them: each goes ahead of a waiter of `priority`."""
        rate = 0.0
        for c in self._order:
            if c.policy.priority <= priority:
                break
            if not c.queue.paused:
                rate += self.demand(c.policy.name)
        kept = self.kept_slots(priority) if self.keep_slots else 0
        return max(0, math.floor(rate * within_s + 0.5) - kept)

    def _retry_unmeasured(self, cls: str, cost: int, now: float) -> float:
        """Retry-After of a refusal for a TTFT objective with no wait measured: the drain rate's,
        else (nothing has finished yet: a cold start) the class's objective, not its queue_timeout_s
        (a trial's batch clients were told 120 s at a cold start whose slots freed within 6 s)."""
        if self.drain_rate.rate(now) > 0:
            return self.retry_after(cls, cost, now)
        objective_ms = self.objective_ms(cls)
        timeout_s = self._classes[cls].queue.timeout_s
        return clamp_retry(min(timeout_s, objective_ms / 1000.0) if objective_ms else timeout_s)

    def _ahead_of_newcomer(self, entry: _Class, now: float, turn: bool) -> int:
        """T1: how many waiters are served before a newcomer of `entry` (G2): the waiters with
        their turn (G1), then, unless it has its turn, everything else of its class and the
        higher ones."""
        priority = entry.policy.priority
        if turn:
            # the waiters with their turn once it waits: a lower class past its share by its one
            # turn (G1), as below; counted all, a chat with its minimum-rate turn beside a batch
            # flood read "expected wait 38791 ms for 66 ahead" with its own queue empty (a trial)
            return len(self._aged(now, served=True, waiting_above=priority))
        ahead = sum(len(c.queue) for c in self._order if c.policy.priority >= priority and not c.queue.paused)
        if self.keep_slots:
            ahead += self.kept_slots(priority)  # F7: the slots kept are taken, as far as it is concerned
        # the lower classes' waiters that go first once it waits (their bounded share), not every
        # aged one: with nobody of its class waiting each had its turn, and counted all, a chat
        # beside a long-objective batch queue read "expected wait 10761 ms for 19 ahead", was
        # refused, so none ever waited and aged batch kept every slot (a trial: interactive
        # served 0 in the last 20 s of 60, batch 45)
        with_turn = self._aged(now, served=True, waiting_above=priority)
        return ahead + sum(1 for w in with_turn if self._classes[w.request.cls].policy.priority < priority)

    def _turn_coming(self, entry: _Class, now: float, by: float) -> bool:
        """T1: will a lower class's minimum-rate turn (G1 b) come by `by` and go to a request that
        is not counted ahead yet: its oldest waiter, once due, or, when none waits, a newcomer of
        a class with demand (offered a request within aging_s)?"""
        aging = self.aging_s
        if aging is None:
            return False
        for c in self._order:
            name = c.policy.name
            if c.policy.priority >= entry.policy.priority or c.queue.paused or not self._min_rate_due(name, by):
                continue
            if c.queue:
                if not self._min_rate_due(name, now):
                    return True  # its oldest waiter will have its turn by then (counted once it has)
            elif self._min_rate_due(name, math.nextafter(by, -math.inf)) and now - self._offered_at.get(name, -math.inf) < aging:
                return True  # a newcomer arriving before then would have it
        return False

    def _late_refusal(self, w: Waiting, now: float, wait: float | None = None, first_s: float | None = None) -> Refuse:
        """T2 (`wait`: its expected wait left) or T3 (`first_s`: its first-token time now)."""
        cls = w.request.cls
        objective_ms = self.objective_ms(cls) or 0.0
        expecting = (
            f" after an expected {wait:.2f}s more" if wait else " now"
        )  # its slot is due: "dispatched, it would miss" read as a past
        before = ""
        if first_s is not None:
            expecting = f" now, its first token expected in {first_s * 1000:.0f} ms"
        else:
            # the sum said whole: "waited 1.69s; dispatched after an expected 0.02s more, it would
            # miss the 2000 ms" did not add up without the first token's time (a trial)
            first = None if self.expected_ttft is None else self.expected_ttft(w.request, self.prefill_met())
            expecting += f", its first token {first * 1000:.0f} ms later" if first is not None else ""
            before_s = w.enqueued_at - w.request.objective_from  # reading its body and counting it
            # beside the wait it adds to ("first token 546 ms later (16 ms before it queued)" read as
            # part of the first token's time, a trial)
            before = f" (and {before_s * 1000:.0f} ms before it, being read and counted)" if before_s >= 0.0005 else ""
        refusal = Refuse(
            w.request,
            Reason.QUEUE_TIMEOUT,
            # "if": it was refused, not dispatched ("dispatched now, ..., it would miss" read as a
            # dispatch, a trial)
            f"waited {now - w.enqueued_at:.2f}s in class {cls!r}{before}; if dispatched{expecting}, it would miss "
            f"the class's {self._objective_said(cls, objective_ms)}{self._held_back(w.request)}",
            clamp_retry(wait) if wait else self._retry_unmeasured(cls, w.request.cost, now),
        )
        return self._staggered(refusal, now)

    def _expire(self, now: float, late: list[tuple[Waiting, float | None]]) -> Iterable[Refuse]:
        for w, wait in late:
            self._classes[w.request.cls].queue.remove(w.request.id)
            yield self._late_refusal(w, now, wait)
        for entry in self._order:
            for w in entry.queue.expire(now):
                yield self._staggered(
                    Refuse(
                        w.request,
                        Reason.QUEUE_TIMEOUT,
                        f"waited {now - w.enqueued_at:.1f}s in class {entry.policy.name!r}, its limit is "
                        f"{entry.queue.timeout_s:g}s{self._held_back(w.request)}",
                        # R2: a paused class's waiter is told what its newcomers are, as a drain's
                        self._retry_operator(w.request, now)
                        if entry.queue.paused
                        else self.retry_after(entry.policy.name, w.request.cost, now),
                    ),
                    now,
                )


def check_invariants(adm: Admission) -> None:
    """Raise AssertionError if any of L1-L4, Q1-Q4, A1-A2 does not hold."""
    ledger_mod.check_invariants(adm.ledger)
    for cls in adm.class_names:
        queueing.check_invariants(adm.queue(cls))
        for w in adm.queue(cls):
            assert w.request.id not in adm.ledger, "A1 waiting and reserved"
    assert len(adm.ledger) <= adm.capacity.slots, "A2 slots"
    assert adm.ledger.slots <= adm.capacity.slots, "A5 task slots"
    assert all(rid in adm.ledger for rid in adm._stretched), "E3 a stretch outlived its reservation"
    wanted = sum(adm.policy(c).reserved_tokens for c in adm.class_names)
    in_force = sum(adm.reserved(c) for c in adm.class_names)
    most = int(adm.capacity.ceiling * RESERVED_SHARE_MAX)
    assert in_force == wanted if wanted <= most else in_force <= most, "R0 reservations in force"
    assert all(adm.reserved(c) <= adm.policy(c).reserved_tokens for c in adm.class_names), "R0 above its own"


def check_aged(adm: Admission, now: float) -> None:
    """A3, right after `advance(now)`: no waiter with its turn (G1) of an unpaused class fits,
    aged or by its class's minimum rate."""
    for w in adm._aged(now):
        block = adm.blocker(w.request, aged=True, stretch=adm._stretched_turn(w.request, w.enqueued_at, now))
        assert block is not None, f"A3 waiter {w.request.id} with its turn left waiting though it fits"
        if block in _AGED_WAITS:
            return  # the oldest waiter with its turn is held by shared capacity: nothing younger may pass it
