"""The gate's own event-loop delay: how late a callback runs, p99 and max over the last minute.

Whatever stalls the gate (a long synchronous step on its loop, a garbage collection, the
process starved of CPU by a neighbour) delays every request by the same amount, so one
number shows it: `tokengate_event_loop_lag_seconds{quantile="0.99"}` in /metrics.

`LagWindow` is the arithmetic, with no clock of its own (every method takes `now`):
samples of (when, lag) over a sliding window. A probe that wakes every `interval_s`
sees a stall of L seconds only once, as one late wake-up; but every moment of that
stall was delayed too, by L, L - interval, L - 2 * interval, ... (what HdrHistogram
calls correcting for coordinated omission). Those moments are added as samples, so a
quantile is over *time*, not over wake-ups: a 7 s stall in a minute is ~12% of the
minute, and p99 reads ~6.4 s rather than the 0.04% one wake-up in 2,400 would make it.

`LoopLagMonitor` is the probe: a task on the gate's loop that sleeps `interval_s`,
measures how late it woke, and logs a warning for a stall of STALL_WARN_S or more (at
most one a minute). Its cost: 40 wake-ups a second of a few microseconds each.

A gate starved of CPU by other work on the host (on 2 cores: a console, a build, a test
suite) is not stalled: its loop runs often, in short slices, and the lag reads tens of ms
while requests queue for seconds (measured: loop lag p99 24-74 ms, request p99 0.4-13 s,
the gate on a CPU 18-40% of the time and runnable but waiting 57-88%). `cpu_seconds()`
reads that from the kernel (`/proc/self/task/*/schedstat`): the gate's threads' time on a
CPU and time ready to run but waiting for one; /metrics has both as
`tokengate_cpu_seconds_total{state="running"|"waiting"}`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from gate.observe.gcpause import GcPauses

log = logging.getLogger("tokengate.observe.looplag")

INTERVAL_S = 0.025
WINDOW_S = 60.0
STALL_WARN_S = 0.5
QUANTILES = (0.5, 0.99, 1.0)


class LagWindow:
    """Loop-lag samples over the last `window_s` seconds, each standing for `interval_s` of time."""

    def __init__(self, interval_s: float = INTERVAL_S, window_s: float = WINDOW_S) -> None:
        self.interval_s = interval_s
        self.window_s = window_s
        self._samples: deque[tuple[float, float]] = deque()
        #: cumulative since start (a Prometheus summary's _count and _sum)
        self.count = 0
        self.total_s = 0.0
        self._cap = math.ceil(window_s / interval_s) + 1  # a stall longer than the window: the window's worth

    def record(self, now: float, lag_s: float) -> None:
        """The probe woke `lag_s` late at `now`: that sample, and the moments of the stall behind it."""
        lag_s = max(0.0, lag_s)
        # The moments the probe did not see: k intervals into the stall, a callback waited lag - k * interval.
        behind = min(int(lag_s / self.interval_s), self._cap)
        for k in range(behind, 0, -1):
            self._add(now - k * self.interval_s, lag_s - k * self.interval_s)
        self._add(now, lag_s)
        self._trim(now)

    def _add(self, at: float, lag_s: float) -> None:
        self._samples.append((at, lag_s))
        self.count += 1
        self.total_s += lag_s

    def _trim(self, now: float) -> None:
        cutoff = now - self.window_s
        while self._samples and self._samples[0][0] < cutoff:
            self._samples.popleft()

    def quantiles(self, now: float, qs: tuple[float, ...] = QUANTILES) -> dict[float, float]:
        """{q: lag} over the window (nearest rank; 1.0 is the longest); 0.0 with no samples yet."""
        self._trim(now)
        lags = sorted(lag for _, lag in self._samples)
        if not lags:
            return dict.fromkeys(qs, 0.0)
        return {q: lags[min(len(lags) - 1, max(0, math.ceil(q * len(lags)) - 1))] for q in qs}

    def __len__(self) -> int:
        return len(self._samples)


class LoopLagMonitor:
    """Measures the running loop's delay into a LagWindow until cancelled."""

    def __init__(
        self,
        interval_s: float = INTERVAL_S,
        window_s: float = WINDOW_S,
        *,
        clock: Callable[[], float] = time.monotonic,
        gc_pauses: GcPauses | None = None,
    ) -> None:
        self.window = LagWindow(interval_s, window_s)
        self.clock = clock
        #: the collector's pauses (same clock): a stall's warning says how much of it they were
        self.gc_pauses = gc_pauses
        self._warned_at = -math.inf

    def quantiles(self) -> dict[float, float]:
        return self.window.quantiles(self.clock())

    async def run(self) -> None:
        interval = self.window.interval_s
        while True:
            due = self.clock() + interval
            await asyncio.sleep(interval)
            now = self.clock()
            lag = now - due
            self.window.record(now, lag)
            if lag >= STALL_WARN_S and now - self._warned_at >= 60.0:
                self._warned_at = now
                log.warning("the gate's event loop stalled %.2f s (every request waited as long)%s", lag, self._cause(due, now))

    def _cause(self, due: float, now: float) -> str:
        """What the collector's pauses account for of a stall from ``due`` to ``now``."""
        if self.gc_pauses is None:
            return ""
        seconds, generation = self.gc_pauses.within(due, now)
        if generation < 0:
            return "; no garbage collection ran meanwhile"
        return f"; {seconds:.2f} s of it in garbage collection (generation {generation})"


def cpu_seconds() -> tuple[float, float] | None:
    """(on a CPU, runnable but waiting for one), seconds since start, over this process's
    threads; None where the kernel does not say (no /proc, no schedstat)."""
    running = waiting = 0
    try:
        tasks = list(Path("/proc/self/task").iterdir())
    except OSError:
        return None
    for task in tasks:
        try:
            fields = (task / "schedstat").read_text().split()
        except OSError:
            continue  # a thread that just ended
        running, waiting = running + int(fields[0]), waiting + int(fields[1])
    return running / 1e9, waiting / 1e9
