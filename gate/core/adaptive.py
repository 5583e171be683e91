"""The budget controller: moves the token budget from upstream latency.

Pure: no clock, no I/O, no asyncio; ``now`` (seconds, monotonic) comes from
the caller. Like Netflix concurrency-limits' ``Limit``, it only computes a
number; the admission ledger reads ``budget`` and enforces it.

Signals are *upstream* latencies measured from dispatch: time to first token
(TTFT) and, when its SLO is set, time per output token (TPOT). Time spent in
the gate's own queue must never be fed in: it grows when the budget shrinks,
so it would drive the budget down in a loop.

Each ``tick``: drop samples older than ``window_s``; a signal with at least
``min_samples`` values in the window is *ready*; its p95 (nearest rank) is
smoothed by an EWMA (``smoothing`` = weight of the newest p95). Then

- close: budget x ``decrease`` when any ready signal's smoothed p95 exceeds
  ``close_above`` x its SLO;
- open: budget x ``increase`` when every configured signal is ready and its
  smoothed p95 is below ``open_below`` x its SLO, and the caller says there
  is demand (see ``has_demand``), so the budget does not grow while traffic,
  not the budget, is what holds throughput back;
- reopen on few samples: while no signal is ready, budget x ``increase`` when
  there is demand, the budget is below the ceiling, and every configured signal
  has samples in the window, each one of them below ``open_below`` x its SLO
  (the largest of a few samples stands in for their p95, never below it). A
  trial's overload closed the budget to its floor; traffic then fell to batch
  alone, served one request per ``aging_s`` by its turn, 4-6 samples a window:
  it never reached ``min_samples`` again and the budget stayed at the floor for
  14 minutes with every slot idle, refusing batch;
- otherwise hold.

A move changes the integer budget by at least one token (x1.1 of a small
budget would otherwise round back to itself) and is clamped to the bounds.

Invariants (checked by ``check_invariants`` after every step in the tests):

1. ``min_tokens <= budget <= ceiling_tokens`` (effective bounds: a ceiling
   lowered below the configured minimum pulls the minimum down with it,
   because the backend's physical capacity wins).
2. ``tick`` never moves the budget within ``cooldown_s`` of the previous move
   of any kind (open, close, manual, ceiling_changed).
3. ``tick`` never moves while frozen, never closes while no signal has
   ``min_samples`` in the window, and opens with fewer only as "reopen on few
   samples" says: never blind (no sample), never on one sample at or over
   ``open_below`` x its SLO.
4. ``tick`` opens only with demand; every returned ``Move`` changes the
   budget (a move that would be clamped back to the same value is None),
   except ``set_budget``, which always returns its ``Move`` for the audit log.
5. A smoothed p95 exists only while its signal is ready; when a signal drops
   below ``min_samples`` its smoothing restarts, so a stale p95 from an
   earlier busy period never drives a move.
6. The sample window holds at most ``max_samples`` samples, in time order.
7. An operator's budget (set by hand, frozen, or a fixed one) is what is asked: when the
   bounds clamp it (a llama-server restarted with a smaller pool) and then allow it again,
   it comes back (``asked``). A trial froze 1,200 on a 2,048 pool, restarted the server at
   1,024 and again at 2,048: the budget stayed at 1,024 for good while the console said 1,200.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from enum import StrEnum

__all__ = [
    "BudgetController",
    "Cause",
    "ControllerSettings",
    "Move",
    "has_demand",
    "p95",
    "percentile_nearest_rank",
]


def percentile_nearest_rank(values: Iterable[float], pct: int) -> float:
    """Nearest-rank percentile: the smallest value with at least ``pct``% of values <= it."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("percentile of no values")
    if not 0 < pct <= 100:
        raise ValueError(f"pct must be in (0, 100], got {pct!r}")
    # rank = ceil(pct/100 * n), in integers: 0.95 * 20 in floats is not exactly 19.
    rank = -(-pct * len(ordered) // 100)
    return ordered[rank - 1]


def p95(values: Iterable[float]) -> float:
    """Nearest-rank 95th percentile (with 20 values, the 19th smallest)."""
    return percentile_nearest_rank(values, 95)


def has_demand(queued: int, in_flight_tokens: int, budget: int, fraction: float = 0.8) -> bool:
    """DESIGN.md's demand test: a queue is waiting, or in-flight tokens fill ``fraction`` of the budget."""
    return queued > 0 or in_flight_tokens >= fraction * budget


class Cause(StrEnum):
    """Why the budget moved; the values are the journal's and audit log's strings."""

    OPEN = "open"
    CLOSE = "close"
    MANUAL = "manual"
    CEILING_CHANGED = "ceiling_changed"


#: the samples the controller's window keeps at most (a config's min_samples must fit in it)
MAX_SAMPLES = 10_000


@dataclass(frozen=True, slots=True)
class ControllerSettings:
    """Tuning of the controller; SLOs in seconds, bounds in KV tokens."""

    min_tokens: int
    ceiling_tokens: int
    slo_ttft_p95_s: float
    slo_tpot_p95_s: float | None = None
    window_s: float = 30.0
    min_samples: int = 20
    cooldown_s: float = 5.0
    increase: float = 1.1
    decrease: float = 0.8
    open_below: float = 0.7
    close_above: float = 1.2
    smoothing: float = 0.5
    max_samples: int = MAX_SAMPLES

    def __post_init__(self) -> None:
        problems: list[str] = []
        if self.min_tokens < 1:
            problems.append(f"min_tokens must be >= 1, got {self.min_tokens}")
        # A ceiling below min_tokens is allowed: it is the backend's physical
        # capacity, which config cannot overrule; the minimum follows it (inv. 1).
        if self.ceiling_tokens < 1:
            problems.append(f"ceiling_tokens must be >= 1, got {self.ceiling_tokens}")
        if not _positive(self.slo_ttft_p95_s):
            problems.append(f"slo_ttft_p95_s must be > 0, got {self.slo_ttft_p95_s}")
        if self.slo_tpot_p95_s is not None and not _positive(self.slo_tpot_p95_s):
            problems.append(f"slo_tpot_p95_s must be > 0 or None, got {self.slo_tpot_p95_s}")
        if not _positive(self.window_s):
            problems.append(f"window_s must be > 0, got {self.window_s}")
        if self.min_samples < 1:
            problems.append(f"min_samples must be >= 1, got {self.min_samples}")
        if not (self.cooldown_s >= 0 and math.isfinite(self.cooldown_s)):
            problems.append(f"cooldown_s must be >= 0, got {self.cooldown_s}")
        if not (self.increase > 1 and math.isfinite(self.increase)):
            problems.append(f"increase must be > 1, got {self.increase}")
        if not 0 < self.decrease < 1:
            problems.append(f"decrease must be in (0, 1), got {self.decrease}")
        if not (_positive(self.open_below) and self.open_below <= self.close_above):
            problems.append(f"open_below ({self.open_below}) must be > 0 and <= close_above ({self.close_above})")
        if not _positive(self.close_above):
            problems.append(f"close_above must be > 0, got {self.close_above}")
        if not 0 < self.smoothing <= 1:
            problems.append(f"smoothing must be in (0, 1], got {self.smoothing}")
        if self.max_samples < self.min_samples:
            problems.append(f"max_samples ({self.max_samples}) must be >= min_samples ({self.min_samples})")
        if problems:
            raise ValueError("; ".join(problems))


def _positive(x: float) -> bool:
    return x > 0 and math.isfinite(x)


@dataclass(frozen=True, slots=True)
class Move:
    """One change of the budget, for the samples table and the audit log."""

    ts: float
    old_budget: int
    new_budget: int
    cause: Cause
    # Smoothed p95s at the moment of the move; None when the signal was not ready.
    p95_ttft_s: float | None
    p95_tpot_s: float | None
    # Samples in the window at the moment of the move.
    samples: int
    # A reopen on few samples (no p95 yet): the largest TTFT of the window, below open_below x SLO.
    largest_ttft_s: float | None = None


class BudgetController:
    """AIMD-style controller of the in-flight token budget, driven by upstream p95 latency."""

    def __init__(self, settings: ControllerSettings, initial_budget: int | None = None) -> None:
        self._settings = settings
        self._min_tokens = settings.min_tokens
        self._ceiling = settings.ceiling_tokens
        # Starting at the ceiling never admits more than llama-server itself
        # could hold; the controller only tightens it when latency says so.
        start = settings.ceiling_tokens if initial_budget is None else initial_budget
        self._budget = self._clamp(start)
        #: the budget an operator's word holds (7): set by hand, frozen at, or fixed; the bounds
        #: clamp it, and it comes back when they allow it. Unused while the controller moves.
        self._asked = int(start)
        # (ts, ttft_s, tpot_s); deque maxlen keeps memory bounded at any rate.
        self._window: deque[tuple[float, float | None, float | None]] = deque(maxlen=settings.max_samples)
        self._smoothed_ttft: float | None = None
        self._smoothed_tpot: float | None = None
        self._last_move_ts = -math.inf
        self._frozen = False
        self._listeners: list[Callable[[int], None]] = []

    # -- reading -----------------------------------------------------------

    @property
    def settings(self) -> ControllerSettings:
        return self._settings

    @property
    def budget(self) -> int:
        return self._budget

    @property
    def min_tokens(self) -> int:
        """Effective minimum: the configured one, unless the ceiling is lower."""
        return min(self._min_tokens, self._ceiling)

    @property
    def ceiling_tokens(self) -> int:
        return self._ceiling

    @property
    def frozen(self) -> bool:
        return self._frozen

    @property
    def asked(self) -> int | None:
        """An operator's budget, before the bounds clamp it (7); None while the controller moves."""
        return None if self.elastic else self._asked

    @property
    def elastic(self) -> bool:
        """Does this controller move the budget by itself (so the budget is an estimate the
        aged may stretch, E1)? An operator's budget, fixed or frozen, is a limit."""
        return not self._frozen

    @property
    def p95_ttft_s(self) -> float | None:
        """Smoothed p95 TTFT as of the last tick; None while too few samples."""
        return self._smoothed_ttft

    @property
    def p95_tpot_s(self) -> float | None:
        """Smoothed p95 TPOT as of the last tick; None while too few samples."""
        return self._smoothed_tpot

    @property
    def samples(self) -> int:
        """Samples in the window as of the last observe or tick."""
        return len(self._window)

    @property
    def last_move_ts(self) -> float:
        """When the budget last moved (any cause); -inf if never."""
        return self._last_move_ts

    # -- signals -----------------------------------------------------------

    def observe(self, now: float, ttft_s: float | None, tpot_s: float | None) -> None:
        """Record one upstream latency sample; None parts (no measurement) are ignored."""
        for name, value in (("ttft_s", ttft_s), ("tpot_s", tpot_s)):
            if value is not None and not (value >= 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be finite and >= 0, got {value!r}")
        if ttft_s is None and tpot_s is None:
            return
        # Keep the window in time order so pruning from the left is enough (inv. 6).
        ts = now if not self._window else max(now, self._window[-1][0])
        self._window.append((ts, ttft_s, tpot_s))
        self._prune(now)

    def _prune(self, now: float) -> None:
        horizon = now - self._settings.window_s
        window = self._window
        while window and window[0][0] <= horizon:
            window.popleft()

    def tick(self, now: float, demand: bool) -> Move | None:
        """Update the smoothed p95s and maybe move the budget; None when it holds."""
        s = self._settings
        self._prune(now)
        ttft = [t for _, t, _ in self._window if t is not None]
        tpot = [t for _, _, t in self._window if t is not None]
        ttft_ready = len(ttft) >= s.min_samples
        # TPOT is smoothed for display even without its SLO; it only steers with one.
        tpot_ready = len(tpot) >= s.min_samples
        # Restart smoothing when a signal is not ready (inv. 5).
        self._smoothed_ttft = self._smooth(self._smoothed_ttft, ttft) if ttft_ready else None
        self._smoothed_tpot = self._smooth(self._smoothed_tpot, tpot) if tpot_ready else None
        if not self.elastic or now - self._last_move_ts < s.cooldown_s:
            return None
        if not (ttft_ready or tpot_ready):
            if (
                demand
                and self._budget < self._ceiling
                and self._all_under(ttft, s.slo_ttft_p95_s)
                and (s.slo_tpot_p95_s is None or self._all_under(tpot, s.slo_tpot_p95_s))
            ):
                target = max(self._budget + 1, math.floor(self._budget * s.increase))
                return self._move_to(now, target, Cause.OPEN, largest_ttft_s=max(ttft))
            return None

        if self._over(self._smoothed_ttft, s.slo_ttft_p95_s) or self._over(self._smoothed_tpot, s.slo_tpot_p95_s):
            # Shrink by at least one token so repeated overload always reaches the minimum.
            target = min(self._budget - 1, math.floor(self._budget * s.decrease))
            return self._move_to(now, target, Cause.CLOSE)
        if (
            demand
            and self._under(self._smoothed_ttft, s.slo_ttft_p95_s)
            and (s.slo_tpot_p95_s is None or self._under(self._smoothed_tpot, s.slo_tpot_p95_s))
        ):
            target = max(self._budget + 1, math.floor(self._budget * s.increase))
            return self._move_to(now, target, Cause.OPEN)
        return None

    def _smooth(self, previous: float | None, values: list[float]) -> float:
        latest = p95(values)
        if previous is None:
            return latest
        w = self._settings.smoothing
        return w * latest + (1.0 - w) * previous

    def _over(self, smoothed: float | None, slo: float | None) -> bool:
        return smoothed is not None and slo is not None and smoothed > self._settings.close_above * slo

    def _all_under(self, values: list[float], slo: float) -> bool:
        """Reopen on few samples: some, and the largest below open_below x `slo`."""
        return bool(values) and max(values) < self._settings.open_below * slo

    def _under(self, smoothed: float | None, slo: float) -> bool:
        # Not ready counts as "not under": the controller never opens blind.
        return smoothed is not None and smoothed < self._settings.open_below * slo

    # -- operator and backend ----------------------------------------------

    def on_change(self, listener: Callable[[int], None]) -> None:
        """Call ``listener(new_budget)`` after every move, whatever its cause.

        The one place a new budget reaches whoever enforces it (concurrency-limits'
        ``notifyOnChange``): callers never copy "read the budget, push it, wake the queue".
        """
        self._listeners.append(listener)

    def freeze(self) -> None:
        """Stop the controller's own moves; manual and ceiling changes still apply."""
        if not self._frozen:
            self._asked = self._budget  # frozen where it stands: what a ceiling change brings back (7)
        self._frozen = True

    def unfreeze(self) -> None:
        """Let ``tick`` move the budget again."""
        self._frozen = False

    def set_budget(self, now: float, tokens: int) -> Move:
        """Set the budget by hand (clamped); always returns the Move and starts the cool-down."""
        old = self._budget
        self._asked = int(tokens)
        self._budget = self._clamp(tokens)
        self._last_move_ts = now
        return self._record(now, old, Cause.MANUAL)

    def set_ceiling(self, now: float, ceiling_tokens: int, min_tokens: int | None = None, *, reseat: bool = False) -> Move | None:
        """The backend's capacity changed; clamp the budget into the new bounds. `min_tokens`:
        the floor that follows from the new ceiling (an auto floor is a share of it), if it moved.
        `reseat`: a new llama-server (restarted with another -c, a router's model loaded): the
        budget starts again at the ceiling, as at the gate's start, unless an operator's budget
        holds (static, or frozen). A trial: the budget left at the old pool's 1,024, which was the
        new pool's floor and interactive's reservation, so batch was refused with every slot idle."""
        if ceiling_tokens < 1:
            raise ValueError(f"ceiling_tokens must be >= 1, got {ceiling_tokens}")
        if min_tokens is not None:
            if min_tokens < 1:
                raise ValueError(f"min_tokens must be >= 1, got {min_tokens}")
            self._min_tokens = min_tokens
        self._ceiling = ceiling_tokens
        if self.elastic:
            return self._move_to(now, ceiling_tokens if reseat else self._budget, Cause.CEILING_CHANGED)
        return self._move_to(now, self._asked, Cause.CEILING_CHANGED)  # clamped, or back (7)

    def set_tuning(self, settings: ControllerSettings) -> None:
        """The operator retuned [budget]: the objectives, the window, the samples it needs, the
        cool-down and the factors; the next tick uses them (the bounds: `set_bounds`)."""
        self._settings = replace(
            self._settings,
            slo_ttft_p95_s=settings.slo_ttft_p95_s,
            slo_tpot_p95_s=settings.slo_tpot_p95_s,
            window_s=settings.window_s,
            min_samples=settings.min_samples,
            cooldown_s=settings.cooldown_s,
            increase=settings.increase,
            decrease=settings.decrease,
        )

    def set_bounds(self, now: float, min_tokens: int, ceiling_tokens: int | None = None) -> Move | None:
        """The operator retuned the bounds; clamp the budget into them (cause manual)."""
        if min_tokens < 1:
            raise ValueError(f"min_tokens must be >= 1, got {min_tokens}")
        if ceiling_tokens is not None:
            if ceiling_tokens < 1:
                raise ValueError(f"ceiling_tokens must be >= 1, got {ceiling_tokens}")
            self._ceiling = ceiling_tokens
        self._min_tokens = min_tokens
        return self._move_to(now, self._budget if self.elastic else self._asked, Cause.MANUAL)

    # -- internals -----------------------------------------------------------

    def _clamp(self, tokens: int) -> int:
        return max(self.min_tokens, min(self._ceiling, int(tokens)))

    def _move_to(self, now: float, target: int, cause: Cause, *, largest_ttft_s: float | None = None) -> Move | None:
        new = self._clamp(target)
        if new == self._budget:
            return None
        old = self._budget
        self._budget = new
        self._last_move_ts = now
        return self._record(now, old, cause, largest_ttft_s)

    def _record(self, now: float, old: int, cause: Cause, largest_ttft_s: float | None = None) -> Move:
        for listener in self._listeners:
            listener(self._budget)
        return Move(
            ts=now,
            old_budget=old,
            new_budget=self._budget,
            cause=cause,
            p95_ttft_s=self._smoothed_ttft,
            p95_tpot_s=self._smoothed_tpot,
            samples=len(self._window),
            largest_ttft_s=largest_ttft_s,
        )

    def check_invariants(self) -> None:
        """Raise AssertionError if invariant 1 or 6 does not hold."""
        if not self.min_tokens <= self._budget <= self._ceiling:
            raise AssertionError(f"budget {self._budget} outside [{self.min_tokens}, {self._ceiling}]")
        if len(self._window) > self._settings.max_samples:
            raise AssertionError(f"window holds {len(self._window)} samples")
        stamps = [ts for ts, _, _ in self._window]
        if stamps != sorted(stamps):
            raise AssertionError("window out of time order")


class FixedBudget(BudgetController):
    """The operator's budget (``[budget] mode = "static"``) behind the controller's interface.

    It measures like the controller (the p95s the console shows) and takes manual, ceiling and
    bound changes, but never moves by itself and is never elastic: chosen once, at build time,
    instead of a mode flag checked wherever the budget is read.
    """

    @property
    def elastic(self) -> bool:
        return False


def controller_for(mode: str, settings: ControllerSettings, start: int | None = None) -> BudgetController:
    """The budget's owner for ``[budget] mode``: the adaptive controller, or the fixed budget."""
    kind = BudgetController if mode == "adaptive" else FixedBudget
    return kind(settings) if start is None else kind(settings, start)
