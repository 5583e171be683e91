"""The gate's garbage-collection pauses: how long, of which generation, and when.

A collection runs on the gate's loop thread and stops it: every request waits as long. The
loop-lag gauge (:mod:`.looplag`) shows such a stall but not its cause; this says how much of
it was the collector. CPython calls every function in ``gc.callbacks`` at the start and the
end of each collection; `GcPauses.on_gc` times the pair (two clock reads, ~1 us).

Why it matters here: a full (generation 2) collection walks every tracked object outside
the frozen set. `tokengate serve` freezes what start-up allocated (``gc.freeze()``), so
only what the gate made since is walked; a gate run inside a bigger process (the test
suite's: ~341k objects tracked) paused 0.55-0.73 s per full collection.

What it exposes (``tokengate_gc_pause_seconds`` in /metrics, per generation): the pauses'
count and total since start, and the longest within the last minute; and `within`, the
collector's share of a given stretch of time, which the loop-lag warning quotes.
"""

from __future__ import annotations

import gc
import time
from collections import deque
from collections.abc import Callable
from typing import Any

__all__ = ["GENERATIONS", "GcPauses"]

WINDOW_S = 60.0
GENERATIONS = (0, 1, 2)


class GcPauses:
    """Times the collections of this process while installed (``install``/``uninstall``)."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic, window_s: float = WINDOW_S, keep: int = 4096) -> None:
        self.clock = clock
        self.window_s = window_s
        #: per generation, since install: collections and their seconds
        self.count = [0, 0, 0]
        self.total_s = [0.0, 0.0, 0.0]
        #: per generation, (ended at, seconds) of its latest pauses, the newest last; bounded
        #: each on its own, so the many young collections never push out a full one
        self.recent: tuple[deque[tuple[float, float]], ...] = tuple(deque(maxlen=keep) for _ in GENERATIONS)
        self._started: float | None = None

    def install(self) -> None:
        if self.on_gc not in gc.callbacks:
            gc.callbacks.append(self.on_gc)

    def uninstall(self) -> None:
        if self.on_gc in gc.callbacks:
            gc.callbacks.remove(self.on_gc)

    def on_gc(self, phase: str, info: dict[str, Any]) -> None:
        """The ``gc.callbacks`` hook: ``phase`` is "start" or "stop"."""
        now = self.clock()
        if phase == "start":
            self._started = now
            return
        if self._started is None:
            return  # installed during a collection
        seconds, self._started = max(0.0, now - self._started), None
        generation = min(2, max(0, int(info.get("generation", 0))))
        self.count[generation] += 1
        self.total_s[generation] += seconds
        self.recent[generation].append((now, seconds))

    def longest(self, generation: int, now: float | None = None) -> float:
        """The longest pause of ``generation`` that ended within the last window (0.0: none)."""
        cutoff = (self.clock() if now is None else now) - self.window_s
        return max((s for end, s in self.recent[generation] if end >= cutoff), default=0.0)

    def within(self, start: float, end: float) -> tuple[float, int]:
        """(seconds of collection between ``start`` and ``end``, the deepest generation among them;
        -1 when none): how much of a stall of the loop the collector was."""
        seconds, deepest = 0.0, -1
        for generation in GENERATIONS:
            for ended, s in reversed(self.recent[generation]):
                if ended < start:
                    break
                if ended <= end:
                    seconds += min(s, ended - start)
                    deepest = generation
        return seconds, deepest
