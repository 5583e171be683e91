"""The console's what-if in a child process: the window and every engine run stay out of the
console's process (gate/tools/replay/workers.py says why: a replay on the console's thread
took the GIL from the console's loop for the whole run, and could not be stopped)."""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import os
import pickle
import sys
import threading
from collections.abc import Iterator
from typing import Any

from gate.tools.replay.report import proposal_from_set, run_replay
from gate.tools.replay.window import ReplayError, Window, load_window
from gate.tools.replay.workers import Scenario, lower, quiet_worker


def light(window: Window) -> Window:
    """`window` without its arrivals (what the console's screen keeps: its config, fit, notes)."""
    return dataclasses.replace(window, arrivals=(), lead=())


def _serve(conn: Any, parent: int, path: str, since: float | None, until: float | None, backend: str | None) -> None:
    """The child: answers ("load",) with (the light window, the number of arrivals) and
    ("replay", text) with run_replay's answer for that proposal text ("" = calibration only),
    until the pipe closes."""
    quiet_worker(parent)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)  # the console draws on the terminal this process inherited
    os.dup2(devnull, 2)
    window: Window | None = None
    kept: dict[str, Scenario] = {}  # the replay at the recorded thresholds, once per window
    while True:
        try:
            op, *args = conn.recv()
        except (EOFError, OSError):
            return  # the console closed the screen, or ended
        try:
            if window is None:
                window = load_window(path, since, until, backend)
            if op == "load":
                answer: Any = (light(window), len(window.arrivals))
            else:
                (text,) = args
                proposals = [proposal_from_set(text, window.config)] if text else []
                answer = run_replay(window, proposals, kept=kept)
            reply: tuple[bool, Any] = (True, answer)
        except Exception as e:  # said on the screen, as an error in the console's own process would be
            reply = (False, e)
        try:
            conn.send(reply)
        except (pickle.PicklingError, TypeError, AttributeError):
            conn.send((False, ReplayError(f"{type(reply[1]).__name__}: {reply[1]}")))


@contextlib.contextmanager
def _stderr_with_a_file() -> Iterator[None]:
    """sys.stderr as the process started with it, while a child starts: multiprocessing's
    resource tracker (started with the first spawned child) passes sys.stderr's descriptor to
    its process, and Textual's capture of stderr has none ("bad value(s) in fds_to_keep")."""
    try:
        has_one = sys.stderr.fileno() >= 0
    except (AttributeError, OSError, ValueError):
        has_one = False
    if has_one or sys.__stderr__ is None:
        yield
        return
    captured, sys.stderr = sys.stderr, sys.__stderr__
    try:
        yield
    finally:
        sys.stderr = captured


class ReplayCancelled(ReplayError):
    """The replay was stopped before it answered (a newer one was asked for, or the screen closed)."""


class ReplayProcess:
    """One journal window, loaded and replayed in a child process (see the module docstring).
    Calls block (the console makes them on a worker thread) and run one at a time; `cancel`
    stops the one running from any thread, and the next call starts a fresh child."""

    def __init__(self, path: str, since: float | None, until: float | None, backend: str | None = None) -> None:
        self._ask = (path, since, until, backend)
        self._lock = threading.Lock()
        self._process: Any = None
        self._conn: Any = None
        self._cancelled = False

    def load(self) -> tuple[Window, int]:
        """The window without its arrivals, and how many arrivals it has."""
        window, count = self._call("load")
        # a child started after a cancel replays the same window, not one a live journal grew
        self._ask = (self._ask[0], self._ask[1], window.until, self._ask[3])
        return window, count

    def replay(self, text: str) -> dict[str, Any]:
        """run_replay's answer for the proposal `text` (KEY=VALUE,...; "" = calibration only)."""
        answer: dict[str, Any] = self._call("replay", text)
        return answer

    def cancel(self) -> None:
        """Stop the call running, if one is (it raises ReplayCancelled)."""
        process = self._process
        if process is not None:
            self._cancelled = True
            process.terminate()

    def close(self) -> None:
        """Stop the child (the screen closed)."""
        self.cancel()
        with self._lock:
            self._stop()

    def _call(self, *message: Any) -> Any:
        with self._lock:
            if self._process is None:
                self._start()
            self._cancelled = False
            try:
                self._conn.send(message)
                ok, value = self._conn.recv()
            except (EOFError, OSError) as e:
                cancelled = self._cancelled
                self._stop()
                if cancelled:
                    raise ReplayCancelled("the replay was stopped") from e
                raise ReplayError("the replay process ended before it answered (out of memory?)") from e
        if not ok:
            raise value
        return value

    def _start(self) -> None:
        context = multiprocessing.get_context("spawn")  # not fork: the console's process has threads
        ours, theirs = context.Pipe()
        process = context.Process(target=_serve, args=(theirs, os.getpid(), *self._ask), name="tokengate-replay", daemon=True)
        try:
            with _stderr_with_a_file():
                process.start()
        finally:
            theirs.close()
        if process.pid is not None:
            lower(process.pid)
        self._process, self._conn = process, ours

    def _stop(self) -> None:
        if self._conn is not None:
            self._conn.close()
        if self._process is not None:
            self._process.terminate()
            self._process.join(timeout=5)
        self._process = self._conn = None
