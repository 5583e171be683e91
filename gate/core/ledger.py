"""The reservation ledger: what is in flight, and exactly-once release.

Pure: no I/O, no clock; times are passed in. One ledger guards one backend.

Invariants (checked by `check_invariants`):
  L1. in_flight == sum of the costs of the held reservations.
  L2. by_class[c] and by_tenant[t] are the sums over the reservations of c and t;
      keys whose sum is zero are absent.
  L3. prefilling == sum of prompt tokens of reservations that have not produced
      their first token.
  L4. A reservation is released at most once: a second release returns None and
      changes nothing but the `double_releases` counter.
  L5. slots == sum of the tasks of the held reservations: a request llama-server
      splits into several tasks (a list of prompts, n > 1, a list of embedding
      inputs, rerank documents) holds one slot per task, all of them at once, and
      gives them all back with its one release.
  L6. while `oldest_first`, the reservations iterate by their moment of admission, oldest first.
  L7. `swap` replaces a reservation's request in place (same id, moment, place and prefilling
      state): L1-L3, L5-L6, L8 and L10 hold after it as if the new request had been reserved then.
  L8. slots_by_class[c] is the sum of the tasks of c's reservations; keys whose sum is zero
      are absent (F7 asks it per class on every dispatch look: a walk of the ledger was ~4% of
      a replay, #24).
  L9. `moments()` is the reservations' moments of admission in iteration order (built when
      asked, then kept in step by reserve and release: T2's walk and the deadline ask on every
      event, #24).
  L10. prefilling_by_class[c] is the number of c's reservations that have not produced their
      first token; keys whose count is zero are absent (F6 asks per dispatch look whether a
      higher class still prefills: a walk of the ledger was ~2% of a replay, #24).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator
from dataclasses import dataclass, field
from operator import attrgetter


@dataclass(frozen=True, slots=True)
class Request:
    """What admission needs to know about one request; no prompt text."""

    id: str
    cls: str
    tenant: str
    prompt_tokens: int  # every task's prompt, summed (what the server prefills)
    max_tokens: int  # the generation limit of ONE task (0: no decode, as embeddings)
    arrival: float
    tasks: int = 1  # the slots it occupies at once: one per task llama-server runs
    slot_tokens: int | None = None  # the most one task holds in its slot; None: `cost` (one task)
    #: when it reached the gate, before its prompt was counted: its TTFT objective counts from
    #: there, as the journal's ttft_arrival_ms and the console's "met" do (None: `arrival`)
    came: float | None = None
    # tasks >= 1 is the caller's to keep (gate.http.routing.measure): a __post_init__ check
    # doubled the cost of building a Request (2.4 -> 5.3 us, contended 2-core machine).

    @property
    def objective_from(self) -> float:
        """The moment its TTFT objective counts from: when it reached the gate."""
        return self.arrival if self.came is None else self.came

    @property
    def cost(self) -> int:
        """Worst-case KV tokens: every task's prompt plus every token each task may generate."""
        return self.prompt_tokens + self.tasks * self.max_tokens

    @property
    def largest_task(self) -> int:
        """Worst-case KV tokens of its largest task: what one slot must hold."""
        return self.cost if self.slot_tokens is None else self.slot_tokens


@dataclass(frozen=True, slots=True)
class Reservation:
    request: Request
    admitted_at: float
    prefilling: bool = True

    @property
    def cost(self) -> int:
        return self.request.cost


_ADMITTED_AT = attrgetter("admitted_at")


@dataclass(slots=True)
class Ledger:
    """Held reservations with running sums per class and per tenant."""

    _held: dict[str, Reservation] = field(default_factory=dict)
    in_flight: int = 0
    prefilling: int = 0
    slots: int = 0  # L5: slots held, one per task
    by_class: dict[str, int] = field(default_factory=dict)
    by_tenant: dict[str, int] = field(default_factory=dict)
    slots_by_class: dict[str, int] = field(default_factory=dict)  # L8
    prefilling_by_class: dict[str, int] = field(default_factory=dict)  # L10
    double_releases: int = 0
    # Iteration is in admission order; while every reservation's moment is >= the one before
    # (the shell's clock is monotonic; reset when empty) that is also oldest first, and a look
    # for the first one held past some age may stop early (#24: the core asks on every deadline)
    oldest_first: bool = True
    _last_at: float = 0.0
    _moments: list[float] | None = None  # L9: `moments()`, None until asked since the last change

    def __len__(self) -> int:
        return len(self._held)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._held

    def __iter__(self) -> Iterator[Reservation]:
        return iter(self._held.values())

    def get(self, request_id: str) -> Reservation | None:
        return self._held.get(request_id)

    def moments(self) -> list[float]:
        """L9: the moments of admission in iteration order (oldest first while `oldest_first`,
        L6): read it, do not change it nor keep it past a change of the ledger. Kept in step: T2's walk and the next
        deadline look for the slots held past the longest hold by bisection in it, where a Python
        loop over the ledger was ~1/10 of a replay (#24)."""
        moments = self._moments
        if moments is None:
            moments = self._moments = list(map(_ADMITTED_AT, self._held.values()))
        return moments

    def class_tokens(self, cls: str) -> int:
        return self.by_class.get(cls, 0)

    def tenant_tokens(self, tenant: str) -> int:
        return self.by_tenant.get(tenant, 0)

    def reserve(self, request: Request, now: float) -> Reservation:
        """Hold `request.cost` tokens; the caller has checked that it fits."""
        if request.id in self._held:
            raise ValueError(f"request {request.id!r} already holds a reservation")
        res = Reservation(request, now)
        if not self._held:
            self.oldest_first = True
        elif now < self._last_at:
            self.oldest_first = False
        self._last_at = now
        self._held[request.id] = res
        if self._moments is not None:
            self._moments.append(now)  # L9: a new key iterates last
        self.in_flight += request.cost
        self.prefilling += request.prompt_tokens
        self.slots += request.tasks
        _add(self.by_class, request.cls, request.cost)
        _add(self.by_tenant, request.tenant, request.cost)
        _add(self.slots_by_class, request.cls, request.tasks)
        _add(self.prefilling_by_class, request.cls, 1)
        return res

    def first_token(self, request_id: str) -> bool:
        """The prompt is processed: stop counting it against the prefill limit."""
        res = self._held.get(request_id)
        if res is None or not res.prefilling:
            return False
        self._held[request_id] = Reservation(res.request, res.admitted_at, prefilling=False)
        self.prefilling -= res.request.prompt_tokens
        _add(self.prefilling_by_class, res.request.cls, -1)
        return True

    def swap(self, request: Request) -> Reservation | None:
        """L7: the reservation of `request.id` now holds `request`, in place (its moment, its
        place and whether it prefills stay); None, changing nothing, when it is not held. A
        request reserved on an upper bound of its prompt before its count came back
        (gate/http/proxy.py, `[gate] forward_beside_count`) is settled to its count so."""
        res = self._held.get(request.id)
        if res is None:
            return None
        old = res.request
        new = Reservation(request, res.admitted_at, res.prefilling)
        self._held[request.id] = new  # an existing key keeps its place and moment: L6 and L9 hold
        self.in_flight += request.cost - old.cost
        self.slots += request.tasks - old.tasks
        if res.prefilling:
            self.prefilling += request.prompt_tokens - old.prompt_tokens
            _add(self.prefilling_by_class, old.cls, -1)
            _add(self.prefilling_by_class, request.cls, 1)
        _add(self.by_class, old.cls, -old.cost)
        _add(self.by_class, request.cls, request.cost)
        _add(self.by_tenant, old.tenant, -old.cost)
        _add(self.by_tenant, request.tenant, request.cost)
        _add(self.slots_by_class, old.cls, -old.tasks)
        _add(self.slots_by_class, request.cls, request.tasks)
        return new

    def release(self, request_id: str) -> Reservation | None:
        """Give the tokens back; exactly once. A repeat returns None and is counted."""
        res = self._held.pop(request_id, None)
        if res is None:
            self.double_releases += 1
            return None
        moments = self._moments
        if moments is not None:
            if self.oldest_first:  # L9: equal moments are neighbours (L6); any of them is the same list
                del moments[bisect_left(moments, res.admitted_at)]
            else:
                self._moments = None
        req = res.request
        self.in_flight -= req.cost
        self.slots -= req.tasks
        if res.prefilling:
            self.prefilling -= req.prompt_tokens
            _add(self.prefilling_by_class, req.cls, -1)
        _add(self.by_class, req.cls, -req.cost)
        _add(self.by_tenant, req.tenant, -req.cost)
        _add(self.slots_by_class, req.cls, -req.tasks)
        return res


def _add(sums: dict[str, int], key: str, delta: int) -> None:
    value = sums.get(key, 0) + delta
    if value:
        sums[key] = value
    else:
        # Absent rather than zero, so idle tenants do not accumulate forever.
        sums.pop(key, None)


def check_invariants(ledger: Ledger) -> None:
    """Raise AssertionError if L1-L3, L5, L6 or L8 do not hold."""
    held = list(ledger)
    assert ledger.in_flight == sum(r.cost for r in held), "L1 in_flight"
    by_class: dict[str, int] = {}
    by_tenant: dict[str, int] = {}
    for r in held:
        _add(by_class, r.request.cls, r.cost)
        _add(by_tenant, r.request.tenant, r.cost)
    assert ledger.by_class == by_class, "L2 by_class"
    assert ledger.by_tenant == by_tenant, "L2 by_tenant"
    assert ledger.prefilling == sum(r.request.prompt_tokens for r in held if r.prefilling), "L3"
    assert ledger.slots == sum(r.request.tasks for r in held), "L5 slots"
    slots_by_class: dict[str, int] = {}
    for r in held:
        _add(slots_by_class, r.request.cls, r.request.tasks)
    assert ledger.slots_by_class == slots_by_class, "L8 slots_by_class"
    prefilling_by_class: dict[str, int] = {}
    for r in held:
        if r.prefilling:
            _add(prefilling_by_class, r.request.cls, 1)
    assert ledger.prefilling_by_class == prefilling_by_class, "L10 prefilling_by_class"
    if ledger.oldest_first:
        assert all(a.admitted_at <= b.admitted_at for a, b in zip(held, held[1:], strict=False)), "L6 oldest first"
    assert ledger._moments is None or ledger._moments == [r.admitted_at for r in held], "L9 moments"
