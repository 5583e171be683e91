"""Sustained overload of the admission core in virtual time (pure: no I/O, no real clock).

A discrete-event harness for choosing and checking a queue discipline before real runs:
Poisson arrivals per class into a scheduler (the real :class:`Admission`, or a control),
a backend of ``slots`` identical slots where every request takes ``ttft_s`` to its first
token and holds its slot ``service_s`` in all. It answers what a client would measure:
per class, what was sent, served, refused and how fast, and what was served in each
window of ``window_s`` (starvation).

The backend model is deliberately crude (fixed service time, no prefill interference):
it is the queueing the gate controls, not llama-server's kernels. The tests use it for
the fairness property with negative controls (:class:`NoControl`, one FIFO for every
class: what the old aging rule became once every waiter had aged); ``bench/`` uses it
to compare disciplines in seconds before spending minutes on real runs.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from gate.core.admission import Admission, Admit, Capacity, ClassPolicy, Decision, Queue, Refuse, Step
from gate.core.ledger import Request
from gate.core.reasons import Reason


class Scheduler(Protocol):
    def offer(self, request: Request, now: float) -> Decision: ...
    def advance(self, now: float) -> Step: ...
    def release(self, request_id: str, now: float) -> object: ...
    def first_token(self, request_id: str) -> bool: ...
    def next_deadline(self, now: float | None = None) -> float | None: ...


@dataclass(frozen=True, slots=True)
class Stream:
    """One class's Poisson arrivals."""

    cls: str
    rate: float  # requests per second
    prompt_tokens: int = 40
    max_tokens: int = 256


@dataclass(slots=True)
class Outcome:
    request: Request
    admitted_at: float | None = None
    first_token_at: float | None = None
    refused_at: float | None = None
    reason: Reason | None = None
    retry_after_s: float | None = None

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_at is None else self.first_token_at - self.request.arrival


@dataclass(slots=True)
class ClassResult:
    sent: int = 0
    served: int = 0
    refused: int = 0
    refused_at_once: int = 0
    within_objective: int = 0
    ttfts: list[float] = field(default_factory=list)
    refusal_waits: list[float] = field(default_factory=list)
    served_per_window: list[int] = field(default_factory=list)

    def ttft_p(self, q: float) -> float | None:
        if not self.ttfts:
            return None
        ordered = sorted(self.ttfts)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass(slots=True)
class Result:
    duration_s: float
    classes: dict[str, ClassResult]
    outcomes: list[Outcome]


class NoControl:
    """A NEGATIVE CONTROL: one FIFO for every class, up to ``timeout_s`` in it; a slot is
    the only limit. Under sustained overload this is what "aged waiters go first, oldest
    first, whatever their class" amounts to once every waiter has aged."""

    def __init__(self, slots: int, timeout_s: float) -> None:
        self.slots = slots
        self.timeout_s = timeout_s
        self.busy: set[str] = set()
        self.fifo: list[Request] = []

    def offer(self, request: Request, now: float) -> Decision:
        if not self.fifo and len(self.busy) < self.slots:
            self.busy.add(request.id)
            return Admit(request, now)
        self.fifo.append(request)
        return Queue(request, now + self.timeout_s)

    def advance(self, now: float) -> Step:
        expired = tuple(Refuse(r, Reason.QUEUE_TIMEOUT, "waited too long", 1.0) for r in self.fifo if r.arrival + self.timeout_s <= now)
        gone = {e.request.id for e in expired}
        self.fifo = [r for r in self.fifo if r.id not in gone]
        admitted = []
        while self.fifo and len(self.busy) < self.slots:
            r = self.fifo.pop(0)
            self.busy.add(r.id)
            admitted.append(Admit(r, now))
        return Step(tuple(admitted), expired)

    def release(self, request_id: str, now: float) -> object:
        self.busy.discard(request_id)
        return None

    def first_token(self, request_id: str) -> bool:
        return False

    def next_deadline(self, now: float | None = None) -> float | None:
        return min((r.arrival + self.timeout_s for r in self.fifo), default=None)


def admission(
    classes: Iterable[ClassPolicy],
    *,
    slots: int = 4,
    ceiling: int = 2048,
    aging_s: float | None = 5.0,
    ttft_s: float | None = None,
    default_objective_ms: float | None = None,
) -> Admission:
    """The real core as the gate builds it, with `ttft_s` as its measured first-token time."""
    return Admission(
        classes,
        Capacity(slots=slots, slot_context=ceiling, ceiling=ceiling),
        aging_s=aging_s,
        expected_ttft=None if ttft_s is None else (lambda _r, _p: ttft_s),
        default_ttft_objective_ms=default_objective_ms,
    )


def run(
    scheduler: Scheduler,
    streams: Sequence[Stream],
    *,
    slots: int = 4,
    service_s: float = 2.1,
    ttft_s: float = 0.2,
    duration_s: float = 120.0,
    objective_s: dict[str, float] | None = None,
    window_s: float = 10.0,
    seed: int = 1,
    service_spread: float = 0.0,
    ttft_choices: Sequence[float] = (),
    ttft_jitter: float = 0.0,
    on_first_token: Callable[[Request, float], None] | None = None,
) -> Result:
    """Drive `scheduler` with `streams` for `duration_s` of virtual time, then let it drain.

    `service_spread`: each request holds its slot `service_s` x a uniform factor in
    [1 - spread, 1 + spread] (llama-server's holds vary; 0: all alike), drawn apart from the
    arrivals so that the same seed sends the same traffic. `ttft_choices`: each request's first
    token comes one of these after its dispatch, drawn alike (a prompt meets llama-server's batch
    between decode steps or behind one: 130 or 340 ms on a 2-core host), x a uniform factor in
    [1 - ttft_jitter, 1 + ttft_jitter]; none: `ttft_s`. `on_first_token(request, seconds from
    dispatch)`: what the gate's shell measures at each first token (its PrefillModel)."""
    rng = random.Random(seed)
    spread = random.Random(seed * 7919 + 1)
    first_tokens = random.Random(seed * 104729 + 3)
    events: list[tuple[float, int, str, str]] = []  # (time, seq, kind, request id)
    seq = 0

    def push(at: float, kind: str, rid: str) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (at, seq, kind, rid))

    outcomes: dict[str, Outcome] = {}
    for s in streams:
        t = rng.expovariate(s.rate)
        i = 0
        while t < duration_s:
            r = Request(f"{s.cls}-{i}", s.cls, "t", s.prompt_tokens, s.max_tokens, t)
            outcomes[r.id] = Outcome(r)
            push(t, "arrive", r.id)
            t += rng.expovariate(s.rate)
            i += 1

    def dispatched(admits: Iterable[Admit], now: float) -> None:
        for a in admits:
            o = outcomes[a.request.id]
            o.admitted_at = now
            first = ttft_s
            if ttft_choices:
                first = first_tokens.choice(ttft_choices) * (1.0 + ttft_jitter * (2.0 * first_tokens.random() - 1.0))
            push(now + first, "first", a.request.id)
            hold = service_s * (1.0 + service_spread * (2.0 * spread.random() - 1.0)) if service_spread else service_s
            push(now + max(hold, first), "end", a.request.id)

    def refused(refusals: Iterable[Refuse], now: float) -> None:
        for f in refusals:
            o = outcomes[f.request.id]
            o.refused_at, o.reason, o.retry_after_s = now, f.reason, f.retry_after_s

    def step(now: float) -> None:
        st = scheduler.advance(now)
        refused(st.expired, now)
        dispatched(st.admitted, now)

    timer: float | None = None
    while events or timer is not None:
        if events and (timer is None or events[0][0] <= timer):
            now, _, kind, rid = heapq.heappop(events)
        else:
            assert timer is not None
            now, kind, rid = timer, "timer", ""
        if kind == "arrive":
            d = scheduler.offer(outcomes[rid].request, now)
            if isinstance(d, Admit):
                dispatched([d], now)
            elif isinstance(d, Refuse):
                refused([d], now)
        elif kind == "first":
            o = outcomes[rid]
            o.first_token_at = now
            if on_first_token is not None and o.admitted_at is not None:
                on_first_token(o.request, now - o.admitted_at)
            if scheduler.first_token(rid):
                step(now)
        elif kind == "end":
            scheduler.release(rid, now)
            step(now)
        else:
            step(now)
        nxt = scheduler.next_deadline(now)
        timer = None if nxt is None else max(nxt, now + 1e-6)

    return _tally(list(outcomes.values()), duration_s, objective_s or {}, window_s)


def _tally(outcomes: list[Outcome], duration_s: float, objective_s: dict[str, float], window_s: float) -> Result:
    classes: dict[str, ClassResult] = {}
    windows = max(1, int(duration_s // window_s))
    for o in outcomes:
        c = classes.setdefault(o.request.cls, ClassResult(served_per_window=[0] * windows))
        c.sent += 1
        if o.admitted_at is not None:
            c.served += 1
            ttft = o.ttft
            assert ttft is not None
            c.ttfts.append(ttft)
            objective = objective_s.get(o.request.cls)
            if objective is not None and ttft <= objective:
                c.within_objective += 1
            w = int(o.admitted_at // window_s)
            if w < windows:
                c.served_per_window[w] += 1
        elif o.refused_at is not None:
            c.refused += 1
            c.refusal_waits.append(o.refused_at - o.request.arrival)
            if o.refused_at == o.request.arrival:
                c.refused_at_once += 1
    return Result(duration_s, classes, outcomes)


def summary(result: Result, capacity_rps: float | None = None) -> str:
    """One line per class, for a bench log."""
    lines = []
    for name, c in sorted(result.classes.items()):
        p50, p95 = c.ttft_p(0.5), c.ttft_p(0.95)
        lines.append(
            f"{name:12s} sent {c.sent:4d} served {c.served:4d} refused {c.refused:4d} (at once {c.refused_at_once:4d}) "
            f"within objective {c.within_objective:4d} ({c.within_objective / max(1, c.sent):.0%} of sent) "
            f"TTFT p50 {_s(p50)} p95 {_s(p95)} min served/window {min(c.served_per_window, default=0)}"
        )
    if capacity_rps:
        ideal = capacity_rps * result.duration_s
        within = sum(c.within_objective for c in result.classes.values())
        lines.append(f"served within objective / ideal ({ideal:.0f}): {within / ideal:.0%}")
    return "\n".join(lines)


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}s"


SchedulerFactory = Callable[[], Scheduler]
