"""The console lowers its own CPU priority, never the gate's (console/priority.py).

Each case runs in a child process in a session of its own, so the test runner's priority
and its session's group stay as they are.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MINE = os.getpriority(os.PRIO_PROCESS, 0)  # what a child starts with

CHILD = textwrap.dedent(
    """
    import json, os, sys, threading
    from console.priority import CONSOLE_NICE, autogroup_nice, lower_priority

    started = threading.Event(); done = threading.Event()
    def early():  # a thread that exists before the console lowers its priority
        started.set(); done.wait()
    t = threading.Thread(target=early); t.start(); started.wait()
    gate = {"same": os.getpid(), "other": int(sys.argv[1])}[sys.argv[2]]
    group_before = autogroup_nice()
    restore = lower_priority([gate], environ=json.loads(sys.argv[3]))
    later = []
    t2 = threading.Thread(target=lambda: later.append(os.getpriority(os.PRIO_PROCESS, 0))); t2.start(); t2.join()
    out = {
        "main": os.getpriority(os.PRIO_PROCESS, 0), "early": os.getpriority(os.PRIO_PROCESS, t.native_id),
        "later": later[0], "group_before": group_before, "group_during": autogroup_nice(),
    }
    restore()
    out["group_after"] = autogroup_nice()
    done.set(); t.join()
    print(json.dumps(out))
    """
)


def run_child(where: str, environ: dict[str, str] | None = None) -> dict:
    gate = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)  # a gate's session
    try:
        out = subprocess.run(
            [sys.executable, "-c", CHILD, str(gate.pid), where, json.dumps(environ or {})],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            start_new_session=True,
        )
    finally:
        gate.kill()
        gate.wait()
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_every_console_thread_is_niced_and_its_session_group_left_alone():
    got = run_child("other")
    assert got["main"] == got["early"] == got["later"] == max(MINE, 10)
    assert got["group_during"] == got["group_after"] == got["group_before"]  # the other sessions' peer, still


def test_asked_to_the_session_group_is_niced_while_the_gate_is_elsewhere_and_given_back():
    got = run_child("other", {"TOKENGATE_CONSOLE_SESSION_NICE": "10", "TOKENGATE_CONSOLE_NICE": "5"})
    assert got["main"] == got["early"] == got["later"] == max(MINE, 5)
    if got["group_before"] is not None:  # a kernel with autogroup (not every container has it)
        assert got["group_before"] == 0 and got["group_during"] == 10
        assert got["group_after"] == 0  # given back at exit: the session's other processes keep theirs


def test_a_gate_in_the_consoles_own_session_keeps_its_group_priority():
    got = run_child("same", {"TOKENGATE_CONSOLE_SESSION_NICE": "10"})
    assert got["main"] == got["early"] == got["later"] == max(MINE, 10)
    assert got["group_during"] == got["group_before"]  # lowering the group would lower the gate too


def test_nice_0_leaves_the_console_as_it_was():
    got = run_child("other", {"TOKENGATE_CONSOLE_NICE": "0"})
    assert got["main"] == got["early"] == got["later"] == MINE


def test_the_console_draws_at_most_30_frames_a_second_unless_told_otherwise():
    """Textual reads TEXTUAL_FPS once, at its first import: in a fresh process, as a console starts."""
    probe = "from console.run import limit_frames; limit_frames(); import textual.constants as c; print(c.MAX_FPS)"
    env = {k: v for k, v in os.environ.items() if k != "TEXTUAL_FPS"}
    run = lambda e: subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=e, capture_output=True, text=True, check=True)  # noqa: E731
    assert run(env).stdout.strip() == "30"
    assert run({**env, "TEXTUAL_FPS": "12"}).stdout.strip() == "12"  # the user's choice stands
