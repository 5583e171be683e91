"""The console gives way to the gate for the CPU.

The gate at 200 req/s uses about half of one core (measured on the 2-vCPU VM), and when
it gets less than it needs, requests queue up: over a 20 s run the queue reached seconds.
The console's own work is bounded per second whatever the request rate (one snapshot a
tick, at most 200 decisions in it, at most 50 new rows: 3-6% of a core at 200 and at
300 req/s), and it yields the CPU:

* every thread of the console process gets nice TOKENGATE_CONSOLE_NICE (default 10;
  threads started later, such as Textual's writer, inherit it). That orders the console
  after the gate wherever they share a scheduling group: one shell session (`tokengate
  serve &` and the console), or one systemd session scope (the embedded console's gate).
* Linux's autogroup (`/proc/sys/kernel/sched_autogroup_enabled`, on where no cgroup
  manager groups processes, as on this VM) first shares the CPU equally between
  sessions, whatever the nice values inside them: a console in a tmux pane and a gate in a
  session of its own compete as equals there (two busy loops on one CPU in two sessions,
  one at nice 19: 50% / 50%). TOKENGATE_CONSOLE_SESSION_NICE=N (default 0: leave it) gives
  the console's session group nice N too (with N = 10: 87% / 13%), unless a gate it watches
  is in that same session, and gives the old value back at exit. Not the default: that
  group then yields to every other session on the host, not only to the gate's, and under
  other people's work the console answered keys 4-8 times later (space -> screen at 200
  req/s, load average 5-6: p50 163-300 ms against 35-56 ms at 0), while the gate's latency
  followed the host's load whatever the console's group did (bench/console_impact.py).

The gate itself is never touched: the embedded console starts its gate child (a session
of its own, normal priority) before it lowers its own priority.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

CONSOLE_NICE = 10
AUTOGROUP = Path("/proc/self/autogroup")


def _nice(environ: Mapping[str, str], name: str, default: int) -> int:
    try:
        return min(19, max(0, int(environ.get(name, default))))
    except ValueError:
        return default


def lower_priority(
    gate_pids: Iterable[int] | None,
    nice: int | None = None,
    session_nice: int | None = None,
    environ: Mapping[str, str] = os.environ,
) -> Callable[[], None]:
    """Lower this process's CPU priority (see the module docstring): its threads to `nice`
    (default TOKENGATE_CONSOLE_NICE or 10), its session group to `session_nice` (default
    TOKENGATE_CONSOLE_SESSION_NICE or 0: left alone). Returns what undoes the part that
    outlives the process (the session group's nice). `gate_pids`: the gates this console
    watches (None: not known; the session group is then left alone)."""
    nice = _nice(environ, "TOKENGATE_CONSOLE_NICE", CONSOLE_NICE) if nice is None else nice
    session_nice = _nice(environ, "TOKENGATE_CONSOLE_SESSION_NICE", 0) if session_nice is None else session_nice
    if nice > 0:
        for tid in _threads():
            with contextlib.suppress(OSError):  # a thread that just ended
                if os.getpriority(os.PRIO_PROCESS, tid) < nice:
                    os.setpriority(os.PRIO_PROCESS, tid, nice)
    if session_nice <= 0 or gate_pids is None or any(_same_session(pid) for pid in gate_pids):
        return lambda: None
    before = autogroup_nice()
    if before is None or before >= session_nice or not _set_autogroup_nice(session_nice):
        return lambda: None

    def restore() -> None:
        _set_autogroup_nice(before, tries=5)

    return restore


def autogroup_nice() -> int | None:
    """The nice value of this process's session group; None without autogroup."""
    try:
        return int(AUTOGROUP.read_text().split("nice")[-1])  # "/autogroup-3 nice 0"
    except (OSError, ValueError):
        return None


def _set_autogroup_nice(nice: int, *, tries: int = 1) -> bool:
    for attempt in range(tries):
        try:
            AUTOGROUP.write_text(str(nice))
            return True
        except BlockingIOError:  # EAGAIN: the kernel takes one such change every 0.1 s, host-wide
            if attempt + 1 < tries:
                time.sleep(0.11)
        except OSError:  # no autogroup, or not permitted
            return False
    return False


def _same_session(pid: int) -> bool:
    try:
        return os.getsid(pid) == os.getsid(0)
    except OSError:
        return False  # gone, or not ours to ask: not in our session either way that matters


def _threads() -> list[int]:
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return [0]  # no /proc: this thread
