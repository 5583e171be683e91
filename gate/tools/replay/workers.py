"""Replays in worker processes: the engine's runs side by side (here), and the console's
what-if off the console's process (gate/tools/replay/isolated.py).

Two reasons to leave the caller's process:

- **Speed** (#24). The engine is one CPU-bound Python loop per scenario; a window replayed at
  the recorded thresholds and under 5 proposals is 6 independent runs (127 s one after another
  for 100,000 decisions on this project's 2-core VM). :func:`in_workers` runs them on up to
  `jobs` spawned processes, each given the window once (pickled, ~12 MB and ~0.9 s for 100,000
  arrivals), and returns their figures in the order asked: the engine is deterministic, so the
  answer is the one a run in this process gives.
- **The console is a window, never a load.** The what-if ran the engine on a thread of the
  console's process: it held the GIL for the whole run, and the console's own loop (its keys,
  its snapshots) waited for it at every wake-up (measured, an asyncio loop's 2 ms sleeps
  overshot by 0.2 ms at p50 before, and by 5.4 ms p50 / 10.6 ms p99 / 78 ms at most during a
  22 s engine run on a thread beside it); and a thread cannot be stopped, so a replay a newer
  ctrl+r superseded ran out unseen, minutes of CPU on the gate's host. The gate itself is
  another process (console/run.py GateProcess). :class:`ReplayProcess`
  (gate/tools/replay/isolated.py) keeps the window and every engine run in one child process
  that a newer replay or the screen's closing stops; the console's thread only waits on a pipe
  and gets the light window (no arrivals) and the answer.

Worker processes run at nice 10 (a replay started on a gate's host yields the CPU to the gate
and llama-server), ignore SIGINT (the command that started them stops them), exit within a
second of their parent, and the console's child writes nothing to the terminal the console
draws on.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import pickle
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
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


def quiet_worker(parent: int) -> None:
    """A worker's first act: nice 10 (see below), Ctrl-C left to the command that started it,
    and an exit of its own once `parent` (the pid that started it) is gone: a `kill` of the
    command alone (systemd's KillMode=process, the OOM killer) left its workers running out
    their minutes-long runs, then blocked on their pipe for good (a trial)."""
    lower(0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_exit_with, args=(parent,), name="exit-with-parent", daemon=True).start()


def _exit_with(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(1)  # the parent is gone: nobody reads what this process would answer


def lower(pid: int) -> None:
    """Nice 10 for `pid` (0: this process), whatever it was below that. The parent lowers a
    worker as soon as it is started too: its interpreter's start and imports ran at the
    parent's priority for ~0.5-1 s before its own call (a trial)."""
    with contextlib.suppress(OSError):
        if os.getpriority(os.PRIO_PROCESS, pid) < NICE:
            os.setpriority(os.PRIO_PROCESS, pid, NICE)


@contextlib.contextmanager
def ctrl_c_held_for_children() -> Iterator[None]:
    """Workers started inside are born with SIGINT blocked (the signal mask survives fork and
    exec, and Python leaves it alone), so a Ctrl-C while they import is not a traceback from
    each of them (a trial); this process gets it once they have started (it was pending, not
    lost: ignoring it instead lost a Ctrl-C pressed while a worker read its window). From the
    main thread only: threads started inside (the pool's) keep the mask, so the signal waits
    for this thread."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def _adopt(parent: int, blob: bytes) -> None:
    global _window
    quiet_worker(parent)
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
        initargs=(os.getpid(), blob),
    )
    try:
        with ctrl_c_held_for_children():
            answers = pool.map(partial(_run_adopted, fn), runs)  # starts the workers
        for process in _workers(pool):
            lower(process.pid)
        done = list(answers)
    except BrokenProcessPool as e:
        raise ReplayError(f"a replay worker process ended before it answered ({e}); --jobs 1 replays in this process") from e
    except BaseException:
        # Ctrl-C, or a run's error: the other runs are not waited for (a worker's run is
        # minutes long). Stopped, then joined here: joined at the interpreter's exit instead,
        # a second Ctrl-C there printed a traceback from `threading._shutdown` (a trial)
        for process in _workers(pool):
            process.terminate()
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    return done


def _workers(pool: ProcessPoolExecutor) -> list[Any]:
    """The pool's processes (a private attribute of CPython's executor: none if it goes)."""
    return list((getattr(pool, "_processes", None) or {}).values())
