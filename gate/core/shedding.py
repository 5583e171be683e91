"""When a running request is overrunning, judged by its progress (pure).

The old rule, "older than shed_factor x a duration learned from finished
requests", shed healthy requests at full occupancy: the rate was learned while
few slots were busy, and with every slot busy each slot decodes slower (real
llama-server, -np 8, 8 concurrent 300-token requests: all 8 shed). Shed
requests never fed back, so the estimate stayed stale. Now a request is
overrunning only when

1. **it makes no progress**: no token for ``stall_s`` (before the first token:
   ``stall_s`` since dispatch), or
2. **it runs far beyond the backend's CURRENT rate**: older than ``factor`` x
   (its own time to first token + max_tokens / the per-slot decode rate the
   backend delivers right now, at the current occupancy).

Rule 2 uses :class:`DecodeMeter`, fed by every running stream of the backend
(this one included), so requests that merely share busy slots slow down
together with the rate that judges them and are never shed. Without a
measurement (nothing streamed in the last window) only rule 1 applies.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from gate.core.reasons import Reason


@dataclass(slots=True)
class DecodeMeter:
    """A backend's per-slot decode rate over the last ``window_s``: tokens / slot-seconds.

    Slot-seconds integrate the number of decoding streams over time, so the rate
    stays right while streams come and go: 8 streams at r tok/s of which 7 end
    still read r, not 8r (tokens / window / streams now would say 8r and shed the
    last one).
    """

    window_s: float = 5.0
    min_tokens: int = 8  # fewer tokens than this in the window say nothing about the rate
    min_slot_s: float = 0.5  # nor does less decoding time than this (one burst is not a rate)
    decoding: int = 0  # streams between their first token and their end
    _events: deque[tuple[float, int, float]] = field(default_factory=deque)  # (t, tokens, slot-seconds)
    _tokens: int = 0
    _slot_s: float = 0.0
    _pending_s: float = 0.0  # slot-seconds since the last event
    _last: float | None = None

    def start(self, now: float) -> None:
        """A stream delivered its first token."""
        self._advance(now)
        self.decoding += 1

    def stop(self, now: float) -> None:
        """A stream that `start`ed ended (any way)."""
        self._advance(now)
        self.decoding = max(0, self.decoding - 1)

    def add(self, now: float, tokens: int) -> None:
        """`tokens` arrived on one stream at `now`."""
        self._advance(now)
        if tokens > 0:
            self._events.append((now, tokens, self._pending_s))
            self._tokens += tokens
            self._slot_s += self._pending_s
            self._pending_s = 0.0
        self._trim(now)

    def per_slot_tps(self, now: float) -> float | None:
        """Tokens per second one busy slot gets now, or None when too little streamed lately."""
        self._advance(now)
        self._trim(now)
        slot_s = self._slot_s + self._pending_s
        if self._tokens < self.min_tokens or slot_s < self.min_slot_s:
            return None
        return self._tokens / slot_s

    def _advance(self, now: float) -> None:
        if self._last is not None and now > self._last:
            self._pending_s += self.decoding * (now - self._last)
        self._last = now if self._last is None else max(self._last, now)

    def _trim(self, now: float) -> None:
        events = self._events
        while events and events[0][0] < now - self.window_s:
            _, tokens, slot_s = events.popleft()
            self._tokens -= tokens
            self._slot_s -= slot_s


@dataclass(frozen=True, slots=True)
class Deadline:
    """When a running request is to be cut, and why."""

    at: float
    reason: Reason
    message: str


def next_deadline(
    *,
    dispatched_at: float,
    first_token_at: float | None,
    last_token_at: float | None,
    max_tokens: int,
    per_slot_tps: float | None,
    factor: float,
    stall_s: float,
    timeout_s: float,
    blind: bool = False,
) -> Deadline:
    """The earliest of: no progress for stall_s, far past the current rate, request_timeout_s.

    `blind`: a plain (non-streamed) upstream call, whose tokens cannot be watched: it is
    judged by the clock alone, against stall_s for its first token plus max_tokens at the
    current per-slot rate, times the factor.
    """
    if blind:
        best = Deadline(dispatched_at + timeout_s, Reason.UPSTREAM_TIMEOUT, f"no complete answer within request_timeout_s={timeout_s:g}")
        if per_slot_tps:
            expected = stall_s + max_tokens / per_slot_tps
            at = dispatched_at + factor * expected
            if at < best.at:
                best = Deadline(
                    at,
                    Reason.SHED_OVERRUN,
                    f"a plain upstream call ran past {factor:g} x the {expected:.1f} s the current decode rate allows",
                )
        return best
    last = last_token_at if last_token_at is not None else dispatched_at
    waiting = "a token" if first_token_at is not None else "the first token"
    best = Deadline(last + stall_s, Reason.SHED_OVERRUN, f"no progress: {waiting} did not come within {stall_s:g} s")
    if first_token_at is not None and per_slot_tps:
        expected = (first_token_at - dispatched_at) + max_tokens / per_slot_tps
        at = dispatched_at + factor * expected
        if at < best.at:
            best = Deadline(
                at,
                Reason.SHED_OVERRUN,
                f"ran past {factor:g} x the {expected:.1f} s the backend's current decode rate predicts",
            )
    timeout_at = dispatched_at + timeout_s
    if timeout_at < best.at:
        best = Deadline(timeout_at, Reason.UPSTREAM_TIMEOUT, f"no complete answer within request_timeout_s={timeout_s:g}")
    return best
