"""Per-class bounded wait queues with deadlines and weighted tenant fairness.

Pure: no I/O, no clock; `now` is passed in. The queue only orders and bounds
waiting requests; whether the selected one fits is decided by admission.py.

Inside a class, tenants are served by deficit round robin (DRR) measured in
tokens: each tenant's turn adds `quantum x weight` to its deficit, and the
tenant is served while the cost of its oldest request fits that deficit. Under
sustained backlog each tenant therefore receives tokens in proportion to its
weight, whatever the sizes of its requests.

Invariants (checked by `check_invariants`):
  Q1. len(queue) <= depth.
  Q2. Each waiting request is in exactly one tenant FIFO and in the id index.
  Q3. tokens == sum of the costs of the waiting requests.
  Q4. A tenant is in the round-robin ring iff its FIFO is non-empty; a tenant
      leaving the ring forfeits its deficit (so idle tenants bank no credit).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from gate.core.ledger import Request

DEFAULT_QUANTUM = 1024


@dataclass(frozen=True, slots=True)
class Waiting:
    request: Request
    enqueued_at: float
    deadline: float


class ClassQueue:
    """One class's waiting requests: bounded, with deadlines, DRR across tenants."""

    def __init__(
        self,
        name: str,
        *,
        depth: int,
        timeout_s: float,
        weight_of: Callable[[str], float] = lambda _tenant: 1.0,
        quantum: int = DEFAULT_QUANTUM,
    ) -> None:
        if depth < 1 or timeout_s <= 0 or quantum < 1:
            raise ValueError("depth, timeout_s and quantum must be positive")
        self.name = name
        self._by_id: dict[str, Waiting] = {}
        self.depth = depth
        self.timeout_s = timeout_s
        self.paused = False
        self.tokens = 0
        self._weight_of = weight_of
        self._quantum = quantum
        self._fifos: dict[str, deque[Waiting]] = {}
        self._ring: deque[str] = deque()  # ring[0] is the tenant whose turn it is
        self._deficit: dict[str, float] = {}
        self._turn_open = False  # has ring[0] received its quantum for this turn?
        # Deadlines in a heap with lazy deletion: removing from the middle is O(1).
        self._deadlines: list[tuple[float, int, str]] = []
        self._seq = 0
        self._grandfathered = 0
        # `_by_id` keeps push order. While every push's (now, id) sorts after the last one's,
        # (the admission core's clock is monotonic), that order is (enqueued_at, id) order and
        # `in_order` walks it as it is: the aged waiters are a prefix and the next to age is the
        # first after them, O(aged) per look instead of O(waiting) (#24: the replay of 100,000
        # decisions spent ~3/4 of its 200 s sorting and scanning every waiter per dispatch pass).
        self._last_key: tuple[float, str] | None = None
        self._in_push_order = True
        # Since the queue was last empty: do the waiters' `objective_from` moments rise in push
        # order (a moment never falls behind the one pushed before it), and the request with the
        # most prompt tokens pushed (an upper bound on those waiting: removals only lower it).
        # T2's walk stops early with them (`from_ordered`, `widest`; #24).
        self._from_rising = True
        self._last_from = -math.inf
        self._widest: Request | None = None

    def __len__(self) -> int:
        return len(self._by_id)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._by_id

    def __iter__(self) -> Iterator[Waiting]:
        for fifo in self._fifos.values():
            yield from fifo

    @property
    def full(self) -> bool:
        return len(self._by_id) >= self.depth

    @property
    def depth(self) -> int:
        return self._depth

    @depth.setter
    def depth(self, value: int) -> None:
        """Lowering the depth drops nobody: those already waiting stay (and are remembered)."""
        if value < 1:
            raise ValueError("depth must be positive")
        self._depth = value
        self._grandfathered = len(self._by_id) if len(self._by_id) > value else 0

    def oldest(self) -> Waiting | None:
        """The waiter enqueued first (of every tenant's head), or None when empty."""
        heads = [fifo[0] for fifo in self._fifos.values() if fifo]
        return min(heads, key=lambda w: w.enqueued_at) if heads else None

    def oldest_enqueued_at(self) -> float | None:
        heads = [fifo[0].enqueued_at for fifo in self._fifos.values()]
        return min(heads) if heads else None

    def in_order(self) -> Iterator[Waiting]:
        """The waiters by (enqueued_at, request id), oldest first; lazy, so a caller that stops
        at the first waiter not yet aged pays for the ones before it only. Do not change the
        queue while iterating."""
        if self._in_push_order:
            return iter(self._by_id.values())
        return iter(sorted(self._by_id.values(), key=lambda w: (w.enqueued_at, w.request.id)))

    @property
    def by_id(self) -> Mapping[str, Waiting]:
        """The waiters by id, the queue's own index: read it, do not change it (its len in C:
        admission's `waiting()`, #24; the dict itself, which a deepcopy copies, not a view)."""
        return self._by_id

    @property
    def from_ordered(self) -> bool:
        """Does `in_order` walk the waiters with their `objective_from` moments never falling
        (each at or after the one before)? True while every push since the queue was last empty
        came at or after the one before, in the push order `in_order` walks."""
        return self._in_push_order and self._from_rising

    @property
    def widest(self) -> Request | None:
        """A request with at least as many prompt tokens as every waiter (the most pushed since
        the queue was last empty; it may have left since), or None while nothing waits."""
        return self._widest if self._by_id else None

    def next_deadline(self) -> float | None:
        self._prune_deadlines()
        return self._deadlines[0][0] if self._deadlines else None

    def push(self, request: Request, now: float) -> Waiting | None:
        """Append to the tenant's FIFO; None (and no change) when the queue is full."""
        if self.full:
            return None
        if request.id in self._by_id:
            raise ValueError(f"request {request.id!r} is already waiting")
        item = Waiting(request, now, now + self.timeout_s)
        if not self._by_id:
            self._in_push_order = True  # an empty queue is in order whatever came before
            self._from_rising = True
            self._last_from = -math.inf
            self._widest = None
        since = request.objective_from
        if since < self._last_from:
            self._from_rising = False  # until the queue is empty again
        self._last_from = since
        if self._widest is None or request.prompt_tokens > self._widest.prompt_tokens:
            self._widest = request
        key = (now, request.id)
        if self._last_key is not None and key < self._last_key and self._by_id:
            self._in_push_order = False  # a clock that went back: `in_order` sorts until empty
        self._last_key = key
        self._by_id[request.id] = item
        fifo = self._fifos.get(request.tenant)
        if fifo is None:
            fifo = self._fifos[request.tenant] = deque()
            self._ring.append(request.tenant)
            self._deficit[request.tenant] = 0.0
        fifo.append(item)
        self.tokens += request.cost
        self._seq += 1
        heapq.heappush(self._deadlines, (item.deadline, self._seq, request.id))
        return item

    def select(self, exclude: frozenset[str] | set[str] = frozenset()) -> Waiting | None:
        """The request DRR serves next, not yet removed; tenants in `exclude` are passed over.

        Selecting again without a `pop` returns the same request.
        """
        candidates = [t for t in self._ring if t not in exclude]
        if not candidates:
            return None
        idle_turns = 0
        while True:
            tenant = self._ring[0]
            if tenant in exclude:
                self._end_turn()
                continue
            if not self._turn_open:
                self._deficit[tenant] += self._quantum * self._weight_of(tenant)
                self._turn_open = True
            head = self._fifos[tenant][0]
            if head.request.cost <= self._deficit[tenant]:
                return head
            self._end_turn()
            idle_turns += 1
            if idle_turns >= len(candidates):
                # A whole round served nobody: skip the rounds in which every
                # candidate would still be short, in one step (exact DRR, no spinning).
                self._fast_forward(candidates)
                idle_turns = 0

    def pop(self, item: Waiting) -> None:
        """Remove the request `select` returned and charge its tenant's deficit."""
        tenant = item.request.tenant
        if not self._ring or self._ring[0] != tenant or self._fifos[tenant][0] is not item:
            raise ValueError("pop() takes the request select() returned")
        self._deficit[tenant] -= item.request.cost
        self._fifos[tenant].popleft()
        self._forget(item)
        if not self._fifos[tenant]:
            self._drop_tenant(tenant)

    def remove(self, request_id: str) -> Waiting | None:
        """Take a waiting request out (client gone); None if it is not here."""
        item = self._by_id.get(request_id)
        if item is None:
            return None
        tenant = item.request.tenant
        self._fifos[tenant].remove(item)
        self._forget(item)
        if not self._fifos[tenant]:
            self._drop_tenant(tenant)
        return item

    def expire(self, now: float) -> list[Waiting]:
        """Remove and return every request whose deadline is at or before `now`."""
        expired: list[Waiting] = []
        while self._deadlines and self._deadlines[0][0] <= now:
            deadline, _, request_id = heapq.heappop(self._deadlines)
            item = self._by_id.get(request_id)
            # an entry left by an earlier wait of the same id (dispatched, removed) is not its deadline now
            if item is not None and item.deadline == deadline:
                self.remove(request_id)
                expired.append(item)
        return expired

    def drain(self) -> list[Waiting]:
        """Remove and return every waiting request, oldest first."""
        items = sorted(self, key=lambda w: w.enqueued_at)
        for item in items:
            self.remove(item.request.id)
        return items

    def tokens_ahead_of(self, request_id: str) -> int:
        """Queued tokens of the class that arrived before `request_id` (all if unknown)."""
        item = self._by_id.get(request_id)
        if item is None:
            return self.tokens
        return sum(w.request.cost for w in self if w.enqueued_at < item.enqueued_at)

    def _forget(self, item: Waiting) -> None:
        del self._by_id[item.request.id]
        self.tokens -= item.request.cost

    def _end_turn(self) -> None:
        self._ring.rotate(-1)
        self._turn_open = False

    def _drop_tenant(self, tenant: str) -> None:
        at_turn = self._ring[0] == tenant
        self._ring.remove(tenant)
        del self._fifos[tenant]
        del self._deficit[tenant]
        if at_turn:
            self._turn_open = False

    def _fast_forward(self, candidates: list[str]) -> None:
        rounds = min(
            math.ceil((self._fifos[t][0].request.cost - self._deficit[t]) / (self._quantum * self._weight_of(t))) for t in candidates
        )
        # The next round adds one quantum itself; add the ones before it here.
        for t in candidates:
            self._deficit[t] += max(0, rounds - 1) * self._quantum * self._weight_of(t)

    def _prune_deadlines(self) -> None:
        """Drop the entries of ids no longer waiting, or waiting again since (another deadline)."""
        while self._deadlines and ((item := self._by_id.get(self._deadlines[0][2])) is None or item.deadline != self._deadlines[0][0]):
            heapq.heappop(self._deadlines)


def check_invariants(queue: ClassQueue) -> None:
    """Raise AssertionError if Q1-Q4 do not hold."""
    items = list(queue)
    # An operator may lower the depth below what already waits; only pushes are bounded.
    assert len(items) <= max(queue.depth, queue._grandfathered), "Q1 depth"
    assert len(items) == len(queue._by_id), "Q2 index"
    assert all(queue._by_id[w.request.id] is w for w in items), "Q2 index"
    assert queue.tokens == sum(w.request.cost for w in items), "Q3 tokens"
    assert set(queue._ring) == {t for t, f in queue._fifos.items() if f}, "Q4 ring"
    assert set(queue._fifos) == set(queue._ring) == set(queue._deficit), "Q4 ring"
