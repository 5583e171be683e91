"""Per-second rollups of finished requests: rates, denials by window, p95 TTFT (pure).

The console asks "what happened in the last 1/5/15 minutes" every second; a
bucket per second keeps that O(window) and memory bounded at any request rate.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

WINDOWS_S = (60, 300, 900)
_TTFT_PER_BUCKET = 256  # enough for a p95 per class per second, bounded at any rate


@dataclass(slots=True)
class _Bucket:
    second: int
    outcomes: Counter[tuple[str, str, str]] = field(default_factory=Counter)  # (cls, outcome, reason)
    ttft_ms: dict[str, list[float]] = field(default_factory=dict)  # from dispatch
    ttft_arrival_ms: dict[str, list[float]] = field(default_factory=dict)  # from arrival: what the client saw
    queue_ms: dict[str, list[float]] = field(default_factory=dict)
    judged: Counter[str] = field(default_factory=Counter)  # arrivals judged against their objective
    met: Counter[str] = field(default_factory=Counter)  # of those, first token within it


class Rollup:
    """Counts by (class, outcome, reason) and TTFT samples, bucketed by second."""

    def __init__(self, horizon_s: int = max(WINDOWS_S)) -> None:
        self.horizon_s = horizon_s
        self._buckets: deque[_Bucket] = deque()

    def add(
        self,
        now: float,
        cls: str,
        outcome: str,
        reason: str,
        ttft_ms: float | None = None,
        queue_ms: float | None = None,
        met: bool | None = None,
        ttft_arrival_ms: float | None = None,
    ) -> None:
        """`ttft_ms`: the first token from dispatch (llama-server's latency, the controller's
        signal); `ttft_arrival_ms`: from arrival, the queue wait included (what the client saw).
        `queue_ms`: time spent waiting in the gate's queue, whatever the outcome (a queue
        timeout waited longest of all). `met`: whether the arrival met its objective (a
        refusal did not); None: not judged (the client's own error or cancel)."""
        bucket = self._bucket(int(now))
        bucket.outcomes[(cls, outcome, reason)] += 1
        if met is not None:
            bucket.judged[cls] += 1
            bucket.met[cls] += met
        for value, per_class in ((ttft_ms, bucket.ttft_ms), (ttft_arrival_ms, bucket.ttft_arrival_ms), (queue_ms, bucket.queue_ms)):
            if value is not None:
                samples = per_class.setdefault(cls, [])
                if len(samples) < _TTFT_PER_BUCKET:
                    samples.append(value)

    def counts(self, now: float, window_s: int) -> Counter[tuple[str, str, str]]:
        total: Counter[tuple[str, str, str]] = Counter()
        for b in self._within(now, window_s):
            total.update(b.outcomes)
        return total

    def denials(self, now: float) -> dict[tuple[str, str], tuple[int, ...]]:
        """(reason, class) -> refusals in each of WINDOWS_S, for every pair seen in the horizon."""
        per_window = [self.counts(now, w) for w in WINDOWS_S]
        keys = {(reason, cls) for (cls, outcome, reason) in per_window[-1] if outcome == "refused"}
        return {
            key: tuple(sum(n for (c, o, r), n in counts.items() if o == "refused" and (r, c) == key) for counts in per_window)
            for key in sorted(keys)
        }

    def p95_ttft_ms(self, now: float, cls: str, window_s: int = 60) -> float | None:
        """p95 first token of `cls` from dispatch (the controller's kind of signal)."""
        return _p95(v for b in self._within(now, window_s) for v in b.ttft_ms.get(cls, ()))

    def p95_ttft_arrival_ms(self, now: float, cls: str, window_s: int = 60) -> float | None:
        """p95 first token of `cls` from arrival, its queue wait included: what its clients saw."""
        return _p95(v for b in self._within(now, window_s) for v in b.ttft_arrival_ms.get(cls, ()))

    def median_ttft_ms(self, now: float, cls: str, window_s: int = 60) -> tuple[float | None, int]:
        """The median first-token time (from dispatch) of `cls` in the window, and how many
        first tokens it is taken over (None with none)."""
        values = sorted(v for b in self._within(now, window_s) for v in b.ttft_ms.get(cls, ()))
        return (values[len(values) // 2] if values else None), len(values)

    def p95_queue_ms(self, now: float, cls: str, window_s: int = 60) -> float | None:
        return _p95(v for b in self._within(now, window_s) for v in b.queue_ms.get(cls, ()))

    def met_share(self, now: float, cls: str, window_s: int = 60) -> tuple[int, int]:
        """(met, judged) arrivals of `cls` in the window: refusals count as misses."""
        met = judged = 0
        for b in self._within(now, window_s):
            met += b.met.get(cls, 0)
            judged += b.judged.get(cls, 0)
        return met, judged

    def _bucket(self, second: int) -> _Bucket:
        if not self._buckets or self._buckets[-1].second < second:
            self._buckets.append(_Bucket(second))
            while self._buckets and self._buckets[0].second <= second - self.horizon_s:
                self._buckets.popleft()
        if self._buckets[-1].second == second:
            return self._buckets[-1]
        # A late record for an earlier second (clock jitter): count it in the newest bucket.
        return self._buckets[-1]

    def _within(self, now: float, window_s: int) -> Iterator[_Bucket]:
        start = int(now) - window_s
        return (b for b in self._buckets if b.second > start)


def _p95(samples: Iterable[float]) -> float | None:
    values: list[float] = sorted(samples)
    if not values:
        return None
    return values[max(0, math.ceil(0.95 * len(values)) - 1)]
