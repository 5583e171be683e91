"""Router mode: which model to load next, and which loaded model makes room for it (pure).

llama-server's router (``--models-dir`` / ``--models-preset``, no ``-m``) runs one child
process per loaded model, at most ``--models-max`` of them (0: no limit). A request for a
model that is not loaded makes llama-server load it, evicting its own least recently used
idle model, while the request waits in llama-server's hidden queue. The gate decides
instead: it holds such requests in its own queues and asks for the load (and the eviction)
itself, when and as this plan says. No I/O and no clock: ``now`` is not even needed, every
duration comes in as an argument.

Terms, per model m:
  running     m is loading, loaded, sleeping or being evicted: it takes one of the
              ``max_loaded`` places.
  wanted      m may be loaded (``may_load``), is not running, and something asks for it:
              an operator (``asked``), a pin (``pinned``), or requests waiting in the gate.
  idle_s      seconds since m last had a request in flight (or since it loaded).
  cold_start  what loading m again would cost, in seconds (configured, or its measured
              load time).
  held        models the router runs that the gate does not serve (not in ``models``:
              loaded straight, behind the gate): each takes a place, and the gate never
              evicts them (they are not its to plan).
  evictable   m is loaded or sleeping, not pinned, holds no request in flight, has none
              waiting, and has been idle at least its cold start (ski rental: evicting a
              model used more recently than it takes to load it again costs more than
              waiting for it to go quiet). An operator's load skips the idle rule.

Rules:
  R1. One change at a time: while a model loads or is evicted, nothing else is planned.
  R2. Wanted models go in this order: asked by an operator, pinned, then the one whose
      oldest request has waited longest; ties by name.
  R3. A sleeping model with waiters is woken in place (it already holds its place).
  R4. With a free place (``max_loaded`` 0, or fewer running, ``held`` counted), the first
      wanted model loads.
  R5. Otherwise the least recently used evictable model (largest idle_s; ties by name)
      is evicted for it (with more running than the limit, only evicted: room first).
      With none evictable nothing happens and ``blocked`` says why, naming each loaded
      model's reason.

Invariants (``check_plan``):
  I1. ``evict`` is loaded or sleeping, holds no request in flight, has none waiting and is
      not pinned.
  I2. ``load`` is wanted; ``evict`` is set only when every place is taken and a model is wanted.
  I3. A load never takes running models (``held`` counted) above ``max_loaded`` (when it is
      not 0): llama-server would then evict one of its own choosing, a pinned one perhaps.
  I4. Nothing is planned while a change is under way.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

Status = Literal["unloaded", "loading", "loaded", "sleeping", "evicting", "failed", "missing"]
STATUSES: tuple[Status, ...] = ("unloaded", "loading", "loaded", "sleeping", "evicting", "failed", "missing")
RUNNING: frozenset[str] = frozenset({"loading", "loaded", "sleeping", "evicting"})
CHANGING: frozenset[str] = frozenset({"loading", "evicting"})


@dataclass(frozen=True, slots=True)
class ModelState:
    """One configured model as the planner sees it."""

    name: str
    status: Status
    in_flight: int = 0  # requests holding a reservation
    waiting: int = 0  # requests in the gate's queues for it
    oldest_wait_s: float = 0.0  # how long the oldest of them has waited
    pinned: bool = False
    asked: bool = False  # an operator asked to load it
    may_load: bool = True  # False: failed and not due for a retry, or autoload is off
    idle_s: float = math.inf
    cold_start_s: float = 0.0

    @property
    def running(self) -> bool:
        return self.status in RUNNING

    @property
    def wanted(self) -> bool:
        if not self.may_load or self.status not in ("unloaded", "failed", "sleeping"):
            return False
        if self.status == "sleeping":
            return self.waiting > 0 or self.asked
        return self.asked or self.pinned or self.waiting > 0


@dataclass(frozen=True, slots=True)
class Plan:
    """Load `load` now, after evicting `evict` when set; `blocked` says why a wanted model waits."""

    load: str | None = None
    evict: str | None = None
    why: str = ""  # what wants `load`: "operator", "pinned", "3 waiting"
    blocked: str = ""
    waiting_for: str | None = None  # the wanted model that `blocked` is about
    wake: bool = False  # `load` is a sleeping model to wake in place


def why_not_evictable(m: ModelState, *, operator: bool = False) -> str | None:
    """None when `m` may be evicted now, else the reason in a few words."""
    if m.status not in ("loaded", "sleeping"):
        return f"{m.name} {m.status}"
    if m.pinned:
        return f"{m.name} pinned"
    if m.in_flight:
        return f"{m.name} busy ({m.in_flight} in flight)"
    if m.waiting:
        return f"{m.name} has {m.waiting} waiting"
    if not operator and m.idle_s < m.cold_start_s:
        return f"{m.name} idle {m.idle_s:.1f}s < cold start {m.cold_start_s:.1f}s"
    return None


def _order(m: ModelState) -> tuple[int, int, float, str]:
    return (0 if m.asked else 1, 0 if m.pinned else 1, -m.oldest_wait_s, m.name)


def _reason(m: ModelState) -> str:
    if m.asked:
        return "operator"
    if m.waiting:
        return f"{m.waiting} waiting"
    return "pinned"


def plan(models: Sequence[ModelState], max_loaded: int, held: Sequence[str] = ()) -> Plan:
    """What to do now (see the module docstring for the rules); ``held``: the models running
    on the router that the gate does not serve."""
    if any(m.status in CHANGING for m in models):
        return Plan()  # R1
    wanted = sorted((m for m in models if m.wanted), key=_order)
    if not wanted:
        return Plan()
    first = wanted[0]
    if first.status == "sleeping":
        return Plan(load=first.name, why=_reason(first), wake=True)  # R3
    running = sum(1 for m in models if m.running) + len(held)
    if max_loaded <= 0 or running < max_loaded:
        return Plan(load=first.name, why=_reason(first))  # R4
    candidates = [m for m in models if why_not_evictable(m, operator=first.asked) is None]
    if candidates:
        victim = min(candidates, key=lambda m: (-m.idle_s, m.name))  # R5
        if running - 1 < max_loaded:
            return Plan(load=first.name, evict=victim.name, why=_reason(first))
        # More running than the limit (lowered, or loaded behind the gate): make room first.
        return Plan(evict=victim.name, why=_reason(first), waiting_for=first.name)
    reasons = [r for m in models if m.running and (r := why_not_evictable(m, operator=first.asked))]
    reasons += [f"{name} loaded, not served by the gate" for name in held]
    return Plan(blocked=f"models_max {max_loaded}: " + ", ".join(reasons), waiting_for=first.name)


def check_plan(models: Sequence[ModelState], max_loaded: int, p: Plan, held: Sequence[str] = ()) -> None:
    """Raise AssertionError unless `p` keeps I1-I4 for `models`."""
    by_name = {m.name: m for m in models}
    if any(m.status in CHANGING for m in models):
        assert p.load is None and p.evict is None, "I4 a change is under way"
        return
    running = sum(1 for m in models if m.running) + len(held)
    if p.evict is not None:
        victim = by_name[p.evict]
        assert victim.in_flight == 0 and victim.waiting == 0 and not victim.pinned, "I1 victim busy or pinned"
        assert victim.status in ("loaded", "sleeping"), "I1 victim not loaded"
        assert any(m.wanted for m in models), "I2 an eviction is always for a wanted model"
        assert max_loaded > 0 and running >= max_loaded, "I2 evicted with a free place"
    if p.load is not None:
        target = by_name[p.load]
        assert target.wanted, "I2 loads only a wanted model"
        if not p.wake and max_loaded > 0:
            assert running - (1 if p.evict else 0) + 1 <= max_loaded, "I3 more running than models_max"
