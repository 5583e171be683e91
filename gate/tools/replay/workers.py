"""Replays in worker processes: the engine's runs side by side (here), and the console's
what-if off the console's process (gate/tools/replay/isolated.py).

Two reasons to leave the caller's process:

- **Speed** (#24). The engine is one CPU-bound Python loop per scenario; a window replayed at
  the recorded thresholds and under 5 proposals is 6 independent runs (127 s one after another
  for 100,000 decisions on this project's 2-core VM). :func:`in_workers` runs them on up to
  `jobs` spawned processes, each given the window once (pickled, ~12 MB and ~0.9 s for 100,000
  arrivals), and returns their figures in the order asked: the engine is deterministic, so the
  answer is the one a run in this process gives.
- **The console is a window, never a load.** The embedded console runs the gate on a thread
  of its own process. A replay on another thread of that process holds the GIL for seconds to
  minutes, and the gate's loop waits for it at every wake-up: measured, an asyncio loop's
  2 ms sleeps overshot by 0.2 ms at p50 before and 5.4 ms p50 / 10.6 ms p99 / 78 ms at most
  during a 22 s engine run on a thread beside it. :class:`ReplayProcess` keeps the window and
  every engine run in one child process; the console's thread only waits on a pipe and gets
  the light window (no arrivals) and the answer.

Worker processes run at nice 10 (a replay started on a gate's host yields the CPU to the gate
and llama-server), ignore SIGINT (the command that started them stops them), and the
console's child writes nothing to the terminal the console draws on.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import pickle
import signal
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from functools import partial
from typing import Any

from gate.config.schema import Config
from gate.tools.replay.window import ReplayError, Window

#: one engine run's answer: its figures per class and its budget curve (what a worker sends back)
Scenario = tuple[dict[str, dict[str, Any]], list[list[float]]]
#: what a worker runs: gate.tools.replay.report's scenario (passed in: report imports this module)
Run = Callable[[Window, Config, frozenset[str]], Scenario]

#: the workers' niceness: below the gate and llama-server on a shared host
NICE = 10

_window: Window | None = None  # a worker's window (in_workers' initializer sets it)


#: below this many arrivals x scenarios a replay stays in the caller's process: starting a
#: worker (a new interpreter, the window pickled to it) costs ~0.5-1 s, more than the engine
#: takes for a small window (5,000 arrivals x 4 scenarios: 2.9 s here, 2.1 s on 2 workers)
WORKERS_FROM = 20_000


def default_jobs(scenarios: int, arrivals: int) -> int:
    """One worker per CPU this process may run on, at most one per scenario; 1 (this
    process) for a small replay."""
    if scenarios * arrivals < WORKERS_FROM:
        return 1
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, scenarios))


def quiet_worker() -> None:
    with contextlib.suppress(OSError):
        os.nice(NICE)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _adopt(blob: bytes) -> None:
    global _window
    quiet_worker()
    _window = pickle.loads(blob)


def _run_adopted(fn: Run, run: tuple[Config, frozenset[str]]) -> Scenario:
    assert _window is not None, "in_workers' initializer sets the window"
    return fn(_window, *run)


def in_workers(fn: Run, window: Window, runs: Sequence[tuple[Config, frozenset[str]]], jobs: int) -> list[Scenario]:
    """`fn` of `window` and each of `runs` (a config and the keys it pins) on up to `jobs`
    spawned worker processes; their figures and budget curves in the order of `runs`."""
    blob = pickle.dumps(window, protocol=pickle.HIGHEST_PROTOCOL)  # once, not once per run
    pool = ProcessPoolExecutor(
        max_workers=max(1, min(jobs, len(runs))),
        mp_context=multiprocessing.get_context("spawn"),  # not fork: the caller may have threads (the console)
        initializer=_adopt,
        initargs=(blob,),
    )
    try:
        done = list(pool.map(partial(_run_adopted, fn), runs))
    except BrokenProcessPool as e:
        raise ReplayError(f"a replay worker process ended before it answered ({e}); --jobs 1 replays in this process") from e
    except BaseException:
        # Ctrl-C, or a run's error: the other runs are not waited for (a worker's run is minutes long)
        for process in list(getattr(pool, "_processes", {}).values()):
            process.terminate()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    return done
