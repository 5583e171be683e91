"""Replays in worker processes (gate/tools/replay/workers.py, isolated.py): the same answer as
in the caller's process, the console's window kept out of its process, and a worker's death
or a stop said plainly. Real spawned processes, a real journal."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import gate.tools.replay.report as report
from gate.cli import main
from gate.config import EXAMPLE_CONFIG, parse_config
from gate.tools.replay import ReplayCancelled, ReplayError, ReplayProcess, load_window, proposal_from_set, run_replay, workers
from gate.tools.replay.synthetic import SMALL_FIT, recorded_by_model, synthetic_arrivals, write_journal
from gate.tools.replay.workers import WORKERS_FROM, default_jobs, in_workers

CONFIG = parse_config(EXAMPLE_CONFIG)
ROOT = Path(__file__).resolve().parents[2]  # where `tests.unit` imports from
PROPOSALS = ("classes.interactive.queue_depth=1", "classes.batch.queue_depth=2", "budget.min_tokens=1024,budget.slo_ttft_p95_ms=500")


@pytest.fixture(scope="module")
def journal(tmp_path_factory: pytest.TempPathFactory) -> str:
    arrivals = synthetic_arrivals(400, 60.0, seed=5)
    _, outcomes = recorded_by_model(CONFIG, SMALL_FIT, arrivals)
    path = str(tmp_path_factory.mktemp("workers") / "j.db")
    write_journal(path, CONFIG, SMALL_FIT, arrivals, outcomes)
    return path


def test_the_answer_on_workers_is_the_answer_here(journal: str) -> None:
    window = load_window(journal)
    proposals = [proposal_from_set(text, window.config) for text in PROPOSALS]
    here = run_replay(window, proposals, jobs=1)
    assert json.dumps(run_replay(window, proposals, jobs=2)) == json.dumps(here)
    assert json.dumps(run_replay(window, proposals, jobs=8)) == json.dumps(here)  # more jobs than runs
    # and the proposals moved something (the comparison is not of four copies of one column)
    assert len({json.dumps(s["classes"]) for s in here["scenarios"][1:]}) == 4


def test_the_replay_at_the_recorded_thresholds_is_kept_between_answers(journal: str, monkeypatch: pytest.MonkeyPatch) -> None:
    window = load_window(journal)
    proposal = proposal_from_set(PROPOSALS[1], window.config)
    runs: list[object] = []
    real = report._run

    def counted(*args: object) -> object:
        runs.append(args[1])
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(report, "_run", counted)
    kept: dict = {}
    first = run_replay(window, [], kept=kept)
    assert len(runs) == 1 and "replayed" in kept
    second = run_replay(window, [proposal], kept=kept)
    assert len(runs) == 2 and runs[1] is proposal.config  # one engine run: the proposal's
    assert json.dumps(second) == json.dumps(run_replay(window, [proposal]))
    assert json.dumps(first) == json.dumps(run_replay(window, []))
    # an answer's figures are its own: changing one does not change the kept replay
    second["scenarios"][1]["classes"].clear()
    assert run_replay(window, [], kept=kept)["scenarios"][1]["classes"]


def _dies(window: object, config: object, pinned: object) -> object:
    os._exit(3)  # a worker killed (out of memory, kill -9) before it answers


def test_a_worker_that_dies_is_said_not_waited_for(journal: str) -> None:
    window = load_window(journal)
    with pytest.raises(ReplayError, match="ended before it answered.*--jobs 1"):
        in_workers(_dies, window, [(window.config, frozenset()), (window.config, frozenset())], 2)


def _how_it_runs(window: object, config: object, pinned: object) -> object:
    return os.getpriority(os.PRIO_PROCESS, 0), signal.getsignal(signal.SIGINT) == signal.SIG_IGN, os.getppid()


def test_workers_run_below_the_gate_and_leave_ctrl_c_to_the_command(journal: str) -> None:
    window = load_window(journal)
    runs = [(window.config, frozenset())] * 2
    for nice, ignores_ctrl_c, parent in in_workers(_how_it_runs, window, runs, 2):  # type: ignore[arg-type]
        assert nice >= 10 and ignores_ctrl_c and parent == os.getpid()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # this process's own is back


def _busy(window: object, config: object, pinned: object) -> object:
    # one write, atomic on a pipe: print() wrote the pid and its newline apart, and two workers'
    # lines interleaved under load ("12345678", then "\n": int() failed, a CI-like run)
    os.write(sys.stdout.fileno(), f"{os.getpid()}\n".encode())
    time.sleep(600)  # a run minutes long
    return None


ORPHANS = """
import sys
from gate.tools.replay import load_window
from gate.tools.replay.workers import in_workers
from tests.unit.test_replay_workers import _busy
window = load_window(sys.argv[1])
in_workers(_busy, window, [(window.config, frozenset())] * 2, 2)
"""


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"  # a zombie nobody reaps (PID 1 in a container)
    except FileNotFoundError:
        return True


def test_workers_exit_when_the_command_is_killed(journal: str) -> None:
    # `kill` of `tokengate replay` alone (systemd's KillMode=process, the OOM killer): its
    # workers ran out their runs, then blocked on their pipe for good (a trial)
    command = subprocess.Popen([sys.executable, "-c", ORPHANS, journal], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert command.stdout is not None
        workers = [int(command.stdout.readline()), int(command.stdout.readline())]  # both busy
        assert not any(_gone(pid) for pid in workers)
    finally:
        command.kill()
        command.wait()
    deadline = time.monotonic() + 20
    while not all(_gone(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [pid for pid in workers if not _gone(pid)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"workers {left} outlived the command"


def test_small_replays_stay_in_this_process_and_large_ones_use_the_cpus() -> None:
    assert default_jobs(6, 100) == 1
    assert default_jobs(1, 10 * WORKERS_FROM) == 1  # one scenario: nothing to run side by side
    many = default_jobs(6, 100_000)
    assert 1 <= many <= 6 and many == min(6, len(os.sched_getaffinity(0)))


def test_the_console_process_holds_a_light_window_and_gets_the_same_answer(journal: str) -> None:
    window = load_window(journal)
    process = ReplayProcess(journal, None, None)
    try:
        light, count = process.load()
        assert light.arrivals == () and count == len(window.arrivals)
        assert (light.config, light.fit, light.notes, light.since, light.until) == (
            window.config,
            window.fit,
            window.notes,
            window.since,
            window.until,
        )
        assert json.dumps(process.replay("")) == json.dumps(run_replay(window))
        proposal = proposal_from_set(PROPOSALS[0], window.config)
        assert json.dumps(process.replay(PROPOSALS[0])) == json.dumps(run_replay(window, [proposal]))
        # a proposal the child cannot read: its error, as proposal_from_set words it here
        with pytest.raises(ValueError, match="no class 'nosuch'"):
            process.replay("classes.nosuch.priority=1")
        child = process._process
        assert child is not None and child.is_alive()
    finally:
        process.close()
    assert not child.is_alive()


def test_a_stopped_replay_says_so_and_the_next_one_starts_afresh(journal: str) -> None:
    import threading

    process = ReplayProcess(journal, None, None)
    try:
        process.load()
        first = process._process
        errors: list[BaseException] = []

        def replay() -> None:
            try:
                process.replay(PROPOSALS[2])
            except BaseException as e:
                errors.append(e)

        thread = threading.Thread(target=replay)
        thread.start()
        while not process._lock.locked():
            pass  # the call is in flight
        process.cancel()
        thread.join(30)
        assert len(errors) == 1 and isinstance(errors[0], ReplayCancelled), errors
        assert not first.is_alive()
        answer = process.replay("")  # a fresh child, the same window
        assert process._process is not first
        assert answer["scenarios"][1]["name"] == "replayed"
    finally:
        process.close()


def test_a_window_the_child_cannot_load_is_its_replay_error(tmp_path: Path) -> None:
    process = ReplayProcess(str(tmp_path / "missing.db"), None, None)
    try:
        with pytest.raises(ReplayError, match="no such journal file"):
            process.load()
    finally:
        process.close()


def test_cli_jobs(journal: str, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["replay", "--journal", journal, "--format", "json"]
    for text in PROPOSALS:
        args += ["--set", text]
    assert main([*args, "--jobs", "1"]) == 0
    here = capsys.readouterr().out
    assert main([*args, "--jobs", "2"]) == 0
    assert capsys.readouterr().out == here
    assert main([*args, "--jobs", "0"]) == 2  # a usage error
    assert "--jobs: must be a whole number of processes, 1 or more, got '0'" in capsys.readouterr().err


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_long_replay_says_what_it_does_on_a_terminal_and_only_there(journal: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # a minute or more with nothing on the screen reads as a hang; the line goes to stderr, so
    # that --format json stays one JSON document, and not to a pipe or a file
    from gate.tools.replay import cli

    monkeypatch.setattr(workers, "WORKERS_FROM", 1000)  # this journal's 400 arrivals x 4 scenarios: "long"
    args = ["replay", "--journal", journal, "--format", "json", "--jobs", "1"]
    for text in PROPOSALS:
        args += ["--set", text]
    parsed = _parser().parse_args(args)
    out, err = io.StringIO(), _Terminal()
    assert cli.cmd_replay(parsed, out, err) == 0
    assert err.getvalue() == "tokengate replay: replaying 400 arrivals x 4 scenarios in this process (--jobs 1) ...\n"
    json.loads(out.getvalue())
    out, err = io.StringIO(), io.StringIO()
    assert cli.cmd_replay(parsed, out, err) == 0
    assert err.getvalue() == ""


def _parser():
    from gate.cli import build_parser

    return build_parser()
