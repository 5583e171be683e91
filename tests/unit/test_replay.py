"""tokengate replay: the engine (pure, deterministic), the window checks, calibration, the CLI.

Property tests (hypothesis), numbered:
  R1. determinism: the same journal window and proposal give the same answer;
  R2. a proposal equal to the recorded thresholds reproduces the replayed scenario exactly;
  R3. every arrival of the window gets exactly one outcome, and the core's refusals only
      carry the core's reasons.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import sqlite3
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gate.cli import main
from gate.config import EXAMPLE_CONFIG, parse_config
from gate.config.thresholds import config_from_thresholds, thresholds_json
from gate.journal.schema import MIGRATIONS
from gate.tools.replay import (
    BackendFit,
    ReplayError,
    budget_lines,
    load_window,
    proposal_from_set,
    replay,
    run_replay,
    to_json,
    to_table,
)
from gate.tools.replay.engine import CORE_REASONS
from gate.tools.replay.synthetic import SMALL_FIT, recorded_by_model, synthetic_arrivals, write_journal

CONFIG = parse_config(EXAMPLE_CONFIG)
FIT = SMALL_FIT


def _journal(tmp: Path, n: int = 300, duration: float = 60.0, seed: int = 1, config=CONFIG, name: str = "") -> str:
    arrivals = synthetic_arrivals(n, duration, seed=seed)
    _, outcomes = recorded_by_model(config, FIT, arrivals)
    path = str(tmp / f"{name or 'j'}{seed}.db")
    write_journal(path, config, FIT, arrivals, outcomes)
    return path


def test_thresholds_round_trip_and_carry_no_secrets() -> None:
    text = thresholds_json(CONFIG)
    assert "api_key" not in text and "url" not in text
    back = config_from_thresholds(text)
    assert back.budget == CONFIG.budget and back.classes == CONFIG.classes


def test_thresholds_of_a_gate_with_tenants_read_back(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A trial's fleet gates had [[tenants]] with api_key_env; `tokengate replay --journal` on
    their journal answered only "<config_in_force>: tenants[0]: a tenant needs exactly one of
    api_key_sha256 or api_key_env": the row keeps no credential (rightly), and reading it back
    validated it as a file. The tenants come back with a key nobody holds."""
    config = parse_config(
        EXAMPLE_CONFIG
        + '\n[[tenants]]\nname = "team-a"\napi_key_env = "KEY_A"\nmax_tokens_in_flight = 600\n'
        + '\n[[tenants]]\nname = "team-b"\napi_key_sha256 = "'
        + "ab" * 32
        + '"\nweight = 2.0\n'
    )
    text = thresholds_json(config)
    assert "api_key" not in text and "KEY_A" not in text and "ab" * 32 not in text
    back = config_from_thresholds(text)
    assert [(t.name, t.max_tokens_in_flight, t.weight) for t in back.tenants] == [("team-a", 600, 1.0), ("team-b", None, 2.0)]
    assert all(t.api_key_env is None and t.api_key_sha256 for t in back.tenants)
    path = _journal(tmp_path, n=40, duration=10.0, config=config)
    assert main(["replay", "--journal", path, "--set", "budget.min_tokens=1024"]) == 0, capsys.readouterr().err


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000), n=st.integers(1, 150), rate=st.floats(0.5, 20.0))
def test_r1_r3_deterministic_and_complete(seed: int, n: int, rate: float) -> None:
    arrivals = synthetic_arrivals(n, n / rate, seed=seed)
    a = replay(CONFIG, FIT, arrivals, until=n / rate + 1)
    b = replay(CONFIG, FIT, arrivals, until=n / rate + 1)
    assert a == b  # R1
    assert set(a) == {x.id for x in arrivals}  # R3
    assert all(o.admitted or o.reason in CORE_REASONS or o.reason == "still_waiting" for o in a.values())


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 1000))
def test_r2_equal_proposal_reproduces_replayed(tmp_path: Path, seed: int) -> None:
    window = load_window(_journal(tmp_path, n=120, duration=20.0, seed=seed))
    same = proposal_from_set(f"budget.min_tokens={window.config.budget.min_tokens}", window.config)
    assert same.pinned == frozenset()
    answer = run_replay(window, [same])
    assert answer["scenarios"][2]["classes"] == answer["scenarios"][1]["classes"]  # R2
    assert run_replay(window, [same]) == answer  # R1 on the whole answer


def test_calibration_of_a_model_made_journal_is_close(tmp_path: Path) -> None:
    """A journal recorded by the model itself: the fit recovers it and the replay matches."""
    window = load_window(_journal(tmp_path, n=400, duration=60.0))
    assert window.fit.slots == 4 and window.fit.ceiling == 2048
    # Decode time at the occupancy the window had (its slots mostly full): the split between
    # "alone" and "per busy slot" is loosely determined when few requests ran alone (with the
    # TTFT objective refusing early, 0.0151 + 0.0022/slot was fitted for 0.010 + 0.004).
    assert abs(window.fit.tpot_s(4) - FIT.tpot_s(4)) < 0.1 * FIT.tpot_s(4)
    answer = run_replay(window)
    cal = answer["calibration"]
    for cls in ("interactive", "batch"):
        assert cal[f"{cls}.admitted"]["error"] <= 0.25, cal[f"{cls}.admitted"]
    assert answer["scenarios"][0]["name"] == "recorded" and answer["scenarios"][1]["name"] == "replayed"


def test_a_smaller_budget_moves_the_right_way(tmp_path: Path) -> None:
    # A load the slots mostly serve (at 10/s most batch requests miss the 2 s objective anyway,
    # refused early at any budget, and the budget changes little)
    window = load_window(_journal(tmp_path, n=150, duration=30.0))
    small = proposal_from_set("budget.mode=static,budget.min_tokens=1100,backend.token_budget=1100", window.config)
    answer = run_replay(window, [small])
    rep, prop = answer["scenarios"][1]["classes"], answer["scenarios"][2]["classes"]
    assert sum(c["admitted"] for c in prop.values()) < sum(c["admitted"] for c in rep.values())
    assert "backend.token_budget" in answer["scenarios"][2]["changes"]


def test_changes_are_named_as_the_set_that_made_them(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # A trial's `--set backend.token_budget=800 --format json` answered "changes":
    # ["backends.token_budget"]: a script matching its own --set key against it missed it
    path = _journal(tmp_path, n=80, duration=10.0)
    args = ["replay", "--journal", path, "--format", "json", "--set", "backend.token_budget=800"]
    assert main([*args, "--set", "backend.token_budget=2048,classes.batch.queue_depth=3"]) == 0
    scenarios = json.loads(capsys.readouterr().out)["scenarios"]
    assert scenarios[2]["changes"] == ["backend.token_budget"]
    assert scenarios[3]["changes"] == ["backend.token_budget", "classes.batch.queue_depth"]
    # a key given at its value in force is named as given in its note too (it read
    # "backend.token_budget=1800,...: backends.token_budget=1800 is the value in force ...")
    held = parse_config(EXAMPLE_CONFIG.replace("# token_budget = 16384", "token_budget = 1800"))
    path = _journal(tmp_path, n=80, duration=10.0, config=held, name="held")
    assert main(["replay", "--journal", path, "--format", "json", "--set", "backend.token_budget=1800,classes.batch.queue_depth=3"]) == 0
    notes = json.loads(capsys.readouterr().out)["notes"]
    assert any(n.startswith("backend.token_budget=1800,classes.batch.queue_depth=3: backend.token_budget=1800 is the value") for n in notes)
    assert not any("backends." in n for n in notes), notes


def test_json_answer_shape(tmp_path: Path) -> None:
    window = load_window(_journal(tmp_path, n=100, duration=20.0))
    answer = json.loads(to_json(run_replay(window, [proposal_from_set("classes.batch.reserved_tokens=0", window.config)])))
    names = [s["name"] for s in answer["scenarios"]]
    assert names == ["recorded", "replayed", "classes.batch.reserved_tokens=0"]
    for s in answer["scenarios"]:
        assert isinstance(s["untrusted"], list)
        for figs in s["classes"].values():
            for key in ("admitted", "refused", "queue_wait_p95_ms", "ttft_p95_ms", "slo_attainment", "tokens_per_s"):
                assert key in figs
            assert figs["slo_attainment"] is None or 0 <= figs["slo_attainment"] <= 1


def test_untrusted_figures_are_marked_in_every_column(tmp_path: Path) -> None:
    path = _journal(tmp_path, n=200, duration=20.0)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("UPDATE decisions SET queue_ms = queue_ms * 5 WHERE class = 'interactive' AND outcome = 'admitted'")
    conn.close()
    answer = run_replay(load_window(path), [proposal_from_set("budget.min_tokens=1024", CONFIG)])
    assert "interactive.queue_wait_p95_ms" in answer["scenarios"][1]["untrusted"]
    line = next(ln for ln in to_table(answer).splitlines() if "interactive" in ln and "queue_wait_p95_ms" in ln)
    assert line.count("?") == 2  # replayed and the proposal


def test_refuses_a_journal_before_v4(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path, isolation_level=None)
    for step in MIGRATIONS[:3]:
        for stmt in step:
            conn.execute(stmt)
    conn.execute("PRAGMA user_version = 3")
    conn.close()
    with pytest.raises(ReplayError, match="schema v3 predates replay"):
        load_window(str(path))


@pytest.mark.parametrize(
    ("tamper", "said"),
    [
        # rows written before the v4 migration (no arrival-measured TTFT)
        (
            "UPDATE decisions SET ttft_arrival_ms = NULL WHERE id = (SELECT min(id) FROM decisions WHERE ttft_ms IS NOT NULL)",
            "before the v4 migration",
        ),
        ("UPDATE samples SET journal_dropped = 3 WHERE id > 5", "dropped 3 rows"),  # the writer dropped rows
        ("DELETE FROM audit", "config_in_force"),  # no thresholds in force
        # user_version says v4 but a column replay reads is gone (a hand-made or damaged file):
        # a one-line refusal, not a traceback from SQLite
        ("ALTER TABLE samples DROP COLUMN journal_dropped", "samples table lacks journal_dropped: not a journal this version wrote"),
        # a decisions column gone read "IndexError: No item with that key" (exit 1, a user's trial)
        ("ALTER TABLE decisions DROP COLUMN ttft_arrival_ms", "decisions table lacks ttft_arrival_ms: not a journal this version wrote"),
        ("ALTER TABLE decisions DROP COLUMN completion_tokens", "decisions table lacks completion_tokens: .* or damaged"),
        ("DROP TABLE samples", "has no samples table"),
        # a damaged thresholds row said only "JSONDecodeError: Expecting property name ...", and
        # `{}` replayed the built-in defaults without a word (a trial, 2026-12-07)
        ("UPDATE audit SET new_value = '{not json' WHERE action = 'config_in_force'", "config_in_force row at .* is not valid JSON"),
        ("UPDATE audit SET new_value = '{}' WHERE action = 'config_in_force'", "config_in_force row at .* holds no budget and no classes"),
        ("UPDATE audit SET new_value = '[1]' WHERE action = 'config_in_force'", "holds no budget and no classes"),
    ],
)
def test_refuses_a_window_it_cannot_replay_and_says_why(tmp_path: Path, tamper: str, said: str) -> None:
    path = _journal(tmp_path, n=50, duration=10.0)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(tamper)
    conn.close()
    with pytest.raises(ReplayError, match=said):
        load_window(path)


def test_a_journal_without_a_column_replay_reads_is_refused_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _journal(tmp_path, n=20, duration=5.0)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("ALTER TABLE decisions DROP COLUMN ttft_arrival_ms")
    conn.execute("ALTER TABLE decisions DROP COLUMN completion_tokens")
    conn.close()
    assert main(["replay", "--journal", path]) == 1  # as every other journal replay cannot read
    err = capsys.readouterr().err
    assert err.startswith("tokengate replay: cannot replay: ") and err.count("\n") == 1
    assert "decisions table lacks completion_tokens, ttft_arrival_ms" in err and "IndexError" not in err


def test_cli_json_and_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _journal(tmp_path, n=80, duration=10.0)
    assert main(["replay", "--journal", path, "--set", "budget.min_tokens=1024", "--format", "json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert [s["name"] for s in answer["scenarios"]][-1] == "budget.min_tokens=1024"
    assert main(["replay", "--journal", path, "--set", "classes.nosuch.priority=1"]) == 2
    assert "no class 'nosuch'" in capsys.readouterr().err
    assert main(["replay", "--journal", str(tmp_path / "missing.db")]) == 1
    assert "cannot replay" in capsys.readouterr().err


def test_a_config_without_journal_names_the_journal_its_gate_writes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`tokengate log --config F` and `tokengate review --config F` read F's [gate] journal; a
    trial's `tokengate replay --config F` (a proposal here) answered only "tokengate.db: no such
    journal file". The error now names F's journal and the command that replays it."""
    path = _journal(tmp_path, n=40, duration=5.0)
    config = tmp_path / "gate.toml"
    config.write_text(f'[gate]\njournal = "{path}"\n')
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert main(["replay", "--config", str(config)]) == 1
    said = capsys.readouterr().err
    assert "cannot replay: tokengate.db: no such journal file" in said
    assert f"--config is a proposal here, not where the journal is: {config}'s gate writes {path}" in said
    assert f"tokengate replay --journal {path}" in said
    # given a journal, --config stays a proposal: no hint
    assert main(["replay", "--journal", str(tmp_path / "missing.db"), "--config", str(config)]) == 1
    assert "is a proposal here" not in capsys.readouterr().err


def test_help_explains() -> None:
    out = io.StringIO()
    from contextlib import redirect_stdout

    with redirect_stdout(out), pytest.raises(SystemExit):
        from gate.cli import build_parser

        build_parser().parse_args(["replay", "--help"])
    text = out.getvalue()
    assert "calibration" in text and "--set" in text and "untrusted" in text
    # a trial's batch read queue_wait_p95_ms 0.1 while 15 of its requests waited ~1.5 s and were
    # refused: the waits are the admitted requests', and the help says so
    assert "queue wait (of the admitted requests" in " ".join(text.split())


def test_fit_dataclass_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        FIT.slots = 2  # type: ignore[misc]


def test_log_aiperf_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`tokengate log --format aiperf`: aiperf's mooncake_trace lines, ms from the first arrival."""
    path = _journal(tmp_path, n=30, duration=5.0)
    assert main(["log", "--journal", path, "--format", "aiperf"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    conn = sqlite3.connect(path)
    rows = conn.execute("SELECT ts, prompt_tokens, completion_tokens, max_tokens FROM decisions ORDER BY ts, id").fetchall()
    assert len(lines) == len(rows) == 30
    assert lines[0]["timestamp"] == 0 and all(a["timestamp"] <= b["timestamp"] for a, b in zip(lines, lines[1:]))
    for line, (ts, prompt, done, max_tokens) in zip(lines, rows):
        assert set(line) == {"timestamp", "input_length", "output_length"}
        assert line["timestamp"] == round((ts - rows[0][0]) * 1000)
        assert line["input_length"] == prompt and line["output_length"] == (done if done is not None else max_tokens)
    assert main(["log", "--journal", path, "--format", "aiperf", "--kind", "audit"]) == 2  # a usage error
    assert "--kind decisions" in capsys.readouterr().err


def test_each_scenario_carries_its_budget_curve(tmp_path: Path) -> None:
    """The recorded budget per sample, and each replay's working budget at its start and each move."""
    window = load_window(_journal(tmp_path, n=300, duration=30.0))
    static = proposal_from_set("budget.mode=static,budget.min_tokens=1100,backend.token_budget=1100", window.config)
    tight = proposal_from_set("budget.slo_ttft_p95_ms=100,budget.min_tokens=1024", window.config)
    recorded, replayed, proposed, closing = (s["budget_curve"] for s in run_replay(window, [static, tight])["scenarios"])
    assert [b for _, b in recorded] == [2048]  # the synthetic journal's samples: the ceiling throughout
    assert replayed == [[0.0, 2048]]  # the adaptive controller starts at the ceiling and met its SLO
    assert proposed == [[0.0, 1100]]  # a static budget never moves
    # a 100 ms objective closes the budget, down to its floor, in moves at increasing times
    assert closing[0] == [0.0, 2048] and len(closing) > 2 and closing[-1][1] == 1024
    assert all(a[0] < b[0] for a, b in zip(closing, closing[1:], strict=False))


# ---- the window as an engineer asks for it (a user's trial, 2026-12-05) -------------------


def _shift_config_row(path: str, to: float) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("UPDATE audit SET ts = ? WHERE action = 'config_in_force'", (to,))
    conn.close()


def test_a_window_from_before_the_gate_started_starts_when_it_did(tmp_path: Path) -> None:
    # `--since 15m` on a journal younger than 15 minutes: the window starts at the gate's start
    # (its config_in_force row) and says so; the decisions before it are left out and counted.
    path = _journal(tmp_path, n=80, duration=10.0)
    first = sqlite3.connect(path).execute("SELECT min(ts) FROM decisions").fetchone()[0]
    _shift_config_row(path, first + 2.0)
    (before,) = sqlite3.connect(path).execute("SELECT count(*) FROM decisions WHERE ts < ?", (first + 2.0,)).fetchone()
    window = load_window(path, since=first - 600.0)
    assert window.since == first + 2.0
    assert min(a.at for a in window.arrivals) >= 0.0
    assert any(f"{before} decisions before it are left out" in n for n in window.notes)
    assert "when the gate that wrote the journal started" in to_table(run_replay(window))
    # a window that starts after the row has no such note
    assert not any("gate that wrote" in n for n in load_window(path, since=first + 3.0).notes)


def test_what_is_not_a_journal_is_said_plainly(tmp_path: Path) -> None:
    other = tmp_path / "other.db"
    sqlite3.connect(other).execute("CREATE TABLE foo (x)").connection.commit()
    (tmp_path / "empty.db").write_bytes(b"")
    for path in (other, tmp_path / "empty.db"):
        with pytest.raises(ReplayError, match="not a tokengate journal") as info:
            load_window(str(path))
        assert "migrate" not in str(info.value)  # never advice to write into someone else's file
    (tmp_path / "adir.db").mkdir()
    with pytest.raises(ReplayError, match="not a file"):
        load_window(str(tmp_path / "adir.db"))


def test_a_window_outside_the_journal_says_which_end(tmp_path: Path) -> None:
    path = _journal(tmp_path, n=40, duration=10.0)
    lo, hi = sqlite3.connect(path).execute("SELECT min(ts), max(ts) FROM decisions").fetchone()
    with pytest.raises(ReplayError, match="no decisions after --since 2027-.*the journal's last is at 2027-"):
        load_window(path, since=hi + 60.0)
    with pytest.raises(ReplayError, match="no decisions before --until .*the journal's first is at"):
        load_window(path, until=lo - 60.0)
    with pytest.raises(ReplayError, match=r"--until \(.*Z\) must be after --since \(.*Z\)"):
        load_window(path, since=lo + 5.0, until=lo + 1.0)


def test_work_queued_or_running_at_the_windows_start_is_noted(tmp_path: Path) -> None:
    path = _journal(tmp_path, n=200, duration=20.0)
    conn = sqlite3.connect(path)
    conn.row_factory = sqlite3.Row
    ran = conn.execute("SELECT ts, duration_ms FROM decisions WHERE outcome = 'admitted' ORDER BY ts LIMIT 1 OFFSET 50").fetchone()
    cut = ran["ts"] + ran["duration_ms"] / 2000.0  # halfway through that request
    (running,) = conn.execute(
        "SELECT count(*) FROM decisions WHERE ts < ? AND outcome = 'admitted' AND ts + duration_ms / 1000.0 > ?", (cut, cut)
    ).fetchone()
    assert running >= 1
    notes = load_window(path, since=cut).notes
    lead = f"{running} requests that arrived before the window" if running > 1 else "1 request that arrived before the window"
    assert any(n.startswith(lead) for n in notes), notes
    assert not any("arrived before the window" in n for n in load_window(path).notes)  # from the first decision: none


def test_one_request_at_the_windows_start_is_one_request_in_the_note(tmp_path: Path) -> None:
    """A trial's note read "1 requests that arrived before the window were still queued or
    running ... (with the 1 arrivals since then ...)"."""
    path = _journal(tmp_path, n=200, duration=20.0)
    conn = sqlite3.connect(path)
    carried = "SELECT count(*) FROM decisions WHERE ts < :cut AND outcome = 'admitted' AND ts + duration_ms / 1000.0 > :cut"
    cuts = [ts + 1e-4 for (ts,) in conn.execute("SELECT ts FROM decisions WHERE outcome = 'admitted' ORDER BY ts")]
    cut = next(c for c in cuts if conn.execute(carried, {"cut": c}).fetchone()[0] == 1)
    notes = load_window(path, since=cut).notes
    (said,) = [n for n in notes if "before the window" in n]
    assert said.startswith("1 request that arrived before the window was still queued or running at its start"), said
    assert "(with the 1 arrival since then, not counted in the figures)" in said, said


def test_a_journal_a_gate_is_writing_is_noted_when_requests_were_running_at_the_window_s_end(tmp_path: Path) -> None:
    """A trial: "a gate is writing this journal ... requests still running are not in the window
    yet" of a window at whose end nothing was in flight: said only when the sample at the
    window's end and the gate's latest both show work."""
    import time

    from gate.ops.lock import JournalLock

    path = _journal(tmp_path, n=40, duration=10.0)
    conn = sqlite3.connect(path, isolation_level=None)
    for table in ("decisions", "audit", "samples"):
        conn.execute(f"UPDATE {table} SET ts = ts - ? ", (1_800_000_000.0 - time.time() + 5.0,))
    conn.close()
    assert not any("is writing this journal" in n for n in load_window(path).notes)  # a file nobody writes
    lock = JournalLock(path)
    lock.acquire("host:1:test")

    def said() -> list[str]:
        return [n for n in load_window(path).notes if "a gate is writing this journal" in n]

    try:
        assert said() == []  # the samples show nothing in flight or queued: nothing can be missing
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("UPDATE samples SET in_flight = 700, queued = 1")
        conn.close()
        (note,) = said()
        assert "(pid" in note and "700 tokens were in flight and 1 request queued at the window's end" in note, note
        assert "requests still running are not in the window yet" in note and "--until" in note, note
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("UPDATE samples SET in_flight = 0, queued = 0 WHERE ts = (SELECT max(ts) FROM samples)")
        conn.close()
        assert said() == []  # running at the window's end, ended since: journaled
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("DELETE FROM samples")
        conn.close()
        (note,) = said()  # no sample to tell: said, as it cannot be ruled out
        assert "no sample at the window's end says whether any request was running then" in note, note
    finally:
        lock.release()


def test_proposals_the_replay_cannot_honour_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for text, said in (
        ("budget.min_tokens=1024,,budget.mode=static", "an empty item"),
        ("classes.batch.queue_depth=1,classes.batch.queue_depth=200", "given twice"),
        ("default_class=batch", "keeps the class it was given"),
        ("backend.url=http://x", "backend model reads backend.token_budget"),
        ("nope.key=1", "give budget.KEY"),
    ):
        with pytest.raises(ValueError, match=said):
            proposal_from_set(text, CONFIG)
    assert proposal_from_set("backends.token_budget=4096", CONFIG).pinned == {"backends.token_budget"}  # as `changes` names it
    path = _journal(tmp_path, n=40, duration=10.0)
    assert main(["replay", "--journal", path, "--set", "budget.mode=static", "--set", "budget.mode=static"]) == 2
    assert "proposal given twice: budget.mode=static" in capsys.readouterr().err
    renamed = tmp_path / "renamed.toml"
    renamed.write_text(EXAMPLE_CONFIG.replace("[classes.batch]", "[classes.bulk]"))
    assert main(["replay", "--journal", path, "--config", str(renamed)]) == 2
    assert "has no class 'batch'" in capsys.readouterr().err
    assert main(["replay", "--journal", path, "--config", str(tmp_path / "nope.toml")]) == 2
    assert capsys.readouterr().err.startswith("tokengate replay: error: ")
    for moment in ("nan", "inf", "-5"):
        assert main(["replay", "--journal", path, f"--since={moment}"]) == 2
        assert "is not a moment" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("first", "second", "said"),
    [
        # the same proposal, spaced otherwise: two JSON scenarios a script could not tell apart
        (
            ["--set", "classes.batch.queue_depth=1"],
            ["--set", " classes.batch.queue_depth = 1 "],
            "proposal given twice: classes.batch.queue_depth=1",
        ),
        # the same keys in another order
        (
            ["--set", "budget.aging_s=3,classes.batch.queue_depth=1"],
            ["--set", "classes.batch.queue_depth=1,budget.aging_s=3"],
            "propose the same thresholds",
        ),
        # one file by two paths
        (["--config", "{same}"], ["--config", "{same_by_another_path}"], "propose the same thresholds"),
    ],
)
def test_two_proposals_of_the_same_thresholds_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], first, second, said) -> None:
    path = _journal(tmp_path, n=40, duration=10.0)
    same = tmp_path / "same.toml"
    same.write_text(EXAMPLE_CONFIG.replace("aging_s = 5.0", "aging_s = 3.0"))
    assert "aging_s = 3.0" in same.read_text()
    paths = {"{same}": str(same), "{same_by_another_path}": f"{tmp_path}/./same.toml"}
    args = [paths.get(a, a) for a in first + second]
    assert main(["replay", "--journal", path, *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tokengate replay: error: ") and said in err, err
    # a proposal alone, spaced otherwise, is named by its items as read
    assert main(["replay", "--journal", path, "--format", "json", *[paths.get(a, a) for a in second]]) == 0
    names = [s["name"] for s in json.loads(capsys.readouterr().out)["scenarios"]]
    assert names[2] == {"--set": " ".join(second[1].split()).replace(" = ", "=").strip(), "--config": paths.get(second[1])}[second[0]]


def test_a_config_that_adds_a_class_replays_and_says_what_the_class_changes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A trial's candidate file with one more class could not be replayed at all: "classes.extra.
    default_max_tokens cannot be replayed ... keep it as recorded (=None)", whatever it set."""
    path = _journal(tmp_path, n=40, duration=10.0)
    extra = tmp_path / "extra.toml"
    extra.write_text(EXAMPLE_CONFIG + "\n[classes.extra]\npriority = 1\ndefault_max_tokens = 64\n")
    assert main(["config", "check", str(extra)]) == 0
    capsys.readouterr()
    assert main(["replay", "--journal", path, "--format", "json", "--config", str(extra)]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert any("its class 'extra' is not in the recorded thresholds" in n for n in answer["notes"]), answer["notes"]
    # a recorded class's default still cannot be replayed
    changed = tmp_path / "changed.toml"
    changed.write_text(extra.read_text().replace("default_max_tokens = 512", "default_max_tokens = 7", 1))
    assert main(["replay", "--journal", path, "--config", str(changed)]) == 2
    assert "classes.batch.default_max_tokens cannot be replayed" in capsys.readouterr().err


def test_damaged_rows_the_replay_reads_around_are_said(tmp_path: Path) -> None:
    """A capacity_learned row that does not read was called "a gate older than this one wrote
    it"; decisions of a class no thresholds name kept their outcome unsaid (a trial, 2026-12-07)."""
    path = _journal(tmp_path, n=60, duration=10.0)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(
        "INSERT INTO audit (ts, operator, origin, source, action, target, old_value, new_value, note) VALUES (?, 'g', 'local', 'gate', "
        "'capacity_learned', 'backend:default', NULL, 'garbage', '')",
        (1_800_000_000.0 - 1.0,),
    )
    conn.execute("UPDATE decisions SET class = 'ghost' WHERE id IN (SELECT id FROM decisions ORDER BY id LIMIT 3)")
    conn.close()
    notes = " | ".join(load_window(path).notes)
    assert "capacity_learned row of backend 'default' does not read as llama-server's capacity (damaged)" in notes, notes
    assert "decisions of 'ghost', a class the thresholds in force do not have, keep their recorded outcome" in notes, notes


def test_the_fit_models_the_layout_the_gate_learned(tmp_path: Path) -> None:
    from gate.data.records import CAPACITY_LEARNED

    path = _journal(tmp_path, n=40, duration=10.0)
    assert CONFIG.backends[0].kv == "auto"
    window = load_window(path)
    assert window.fit.kv == "unified" and any("KV layout the gate learned is not in the journal" in n for n in window.fit.notes)
    conn = sqlite3.connect(path, isolation_level=None)
    value = json.dumps({"slots": 4, "kv": "split", "slot_context": 512, "ceiling": 2048})
    conn.execute(
        "INSERT INTO audit (ts, operator, origin, source, action, target, old_value, new_value, note) VALUES (?, 'g', 'local', 'gate', ?, "
        "'backend:default', NULL, ?, '')",
        (1_800_000_000.0 - 1.0, CAPACITY_LEARNED, value),
    )
    conn.close()
    fit = load_window(path).fit
    assert (fit.kv, fit.slots, fit.slot_context) == ("split", 4, 512)
    assert not any("KV layout" in n for n in fit.notes)
    # the pool is the learned one, not the highest working budget sampled (an operator's cut to
    # 600, the controller at 660: the window replayed a 2,048-token pool as 660 before)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("UPDATE samples SET budget = 660")
    conn.close()
    fit = load_window(path).fit
    assert fit.ceiling == 2048 and not any("pool size" in n for n in fit.notes)


def test_log_aiperf_trace_per_class_stays_in_step(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # aiperf sends one set of headers to every request: one trace per class, replayed each with
    # its X-Tokengate-Class, must share one time zero (the first arrival of every class).
    path = _journal(tmp_path, n=60, duration=5.0)
    conn = sqlite3.connect(path)
    first = conn.execute("SELECT min(ts) FROM decisions").fetchone()[0]
    traces = {}
    for cls in ("interactive", "batch"):
        assert main(["log", "--journal", path, "--format", "aiperf", "--class", cls]) == 0
        traces[cls] = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
        rows = conn.execute('SELECT ts FROM decisions WHERE "class" = ? ORDER BY ts, id', (cls,)).fetchall()
        assert [t["timestamp"] for t in traces[cls]] == [round((ts - first) * 1000) for (ts,) in rows]
    assert len(traces["interactive"]) + len(traces["batch"]) == 60
    assert min(traces["interactive"][0]["timestamp"], traces["batch"][0]["timestamp"]) == 0
    assert main(["log", "--journal", path, "--class", "batch", "--format", "csv"]) == 0
    assert {r.split(",")[4] for r in capsys.readouterr().out.splitlines()[1:]} == {"batch"}
    assert main(["log", "--journal", path, "--class", "batch", "--kind", "audit"]) == 2  # a usage error
    assert "--class selects decisions" in capsys.readouterr().err


def test_a_window_cut_mid_burst_replays_its_lead_first(tmp_path: Path) -> None:
    # A window that starts while the slots are full and the queues hold work: the replay runs
    # the arrivals from the first request still queued or running at the start (its lead), so
    # the window's first arrivals meet what the gate had; the lead is not counted. Without the
    # lead the replay met them with idle slots and admitted 8-11 more of them (the negative
    # control below); with it, 0-4 off what the model recorded.
    path = _journal(tmp_path, n=600, duration=20.0, seed=3)
    lo, hi = sqlite3.connect(path).execute("SELECT min(ts), max(ts) FROM decisions").fetchone()
    for frac in (0.3, 0.5, 0.7):
        window = load_window(path, since=lo + (hi - lo) * frac)
        assert window.lead and all(a.at < 0 for a in window.lead) and window.lead_s > 0

        def off(w: object) -> int:
            answer = run_replay(w)  # type: ignore[arg-type]
            rec, rep = answer["scenarios"][0]["classes"], answer["scenarios"][1]["classes"]
            assert {c: f["arrivals"] for c, f in rep.items()} == {c: f["arrivals"] for c, f in rec.items()}  # the lead not counted
            assert sum(f["arrivals"] for f in rec.values()) == len(window.arrivals)
            return sum(abs(rec[c]["admitted"] - rep[c]["admitted"]) for c in rec)

        with_lead, without = off(window), off(dataclasses.replace(window, lead=()))
        assert with_lead < without, (frac, with_lead, without)
        assert any(f"the replay starts {window.lead_s:.1f} s earlier" in n for n in window.notes)


# ---- a proposal keeps the operator's other moves (a user's trial, 2026-12-05) ---------------


def test_a_proposal_replays_every_recorded_change_but_its_own_keys() -> None:
    from gate.tools.replay.engine import Change

    arrivals = synthetic_arrivals(200, 20.0, seed=5)
    changes = [
        Change(5.0, "set_budget", "backend:default", "1500"),  # the operator's hand cut
        Change(8.0, "set_budget_settings", "budget", "min_tokens=1024, slo_ttft_p95_ms=1500"),
        Change(9.0, "set_class", "class:batch", "queue_depth=4, reserved_tokens=0"),
    ]

    def curve(pinned: frozenset[str]) -> list[tuple[float, int]]:
        out: list[tuple[float, int]] = []
        replay(CONFIG, FIT, arrivals, changes, until=21.0, pinned=pinned, budget_curve=out)
        return out

    recorded = curve(frozenset())
    assert (5.0, 1500) in recorded
    # proposing the objective, or batch's reservation, keeps the hand cut (it was dropped before)
    assert (5.0, 1500) in curve(frozenset({"budget.slo_ttft_p95_ms"}))
    assert (5.0, 1500) in curve(frozenset({"classes.batch.reserved_tokens"}))
    # proposing the ceiling replaces it
    assert all(at != 5.0 for at, _ in curve(frozenset({"backends.token_budget"})))


def test_a_recorded_retune_loses_only_the_proposed_keys() -> None:
    from gate.tools.replay.engine import Change, unpinned

    retune = Change(9.0, "set_class", "class:batch", "queue_depth=4, reserved_tokens=0")
    assert unpinned(retune, frozenset({"classes.batch.reserved_tokens"})) == dataclasses.replace(retune, new_value="queue_depth=4")
    assert unpinned(retune, frozenset({"classes.batch.reserved_tokens", "classes.batch.queue_depth"})) is None
    assert unpinned(retune, frozenset({"classes.interactive.queue_depth"})) == retune
    budget = Change(8.0, "set_budget_settings", "budget", "min_tokens=1024, slo_ttft_p95_ms=1500")
    assert unpinned(budget, frozenset({"budget.min_tokens"})) == dataclasses.replace(budget, new_value="slo_ttft_p95_ms=1500")


def test_tokens_per_s_is_over_the_time_the_requests_ran_not_a_sliver_of_it(tmp_path: Path) -> None:
    # One request whose window is a single instant (a journal of one decision) read
    # 33,554,432 tokens/s; a 30 ms window around a request that ran at 150 tokens/s read 2,133.
    path = _journal(tmp_path, n=1, duration=1.0)
    window = load_window(path)
    (a,) = window.arrivals
    assert a.completion_tokens and a.duration_ms
    answer = run_replay(window, [])
    recorded = answer["scenarios"][0]["classes"][a.cls]["tokens_per_s"]
    assert recorded == pytest.approx(a.completion_tokens / (a.at + a.duration_ms / 1000.0), rel=0.01)


def _audit(conn: sqlite3.Connection, *rows: tuple[float, str, str, str, str]) -> None:
    """Audit rows (ts, source, action, target, new_value) by operator 'op'."""
    for r in rows:
        conn.execute(
            "INSERT INTO audit (ts, operator, origin, source, action, target, old_value, new_value, note) VALUES (?, 'op', 'local', ?, ?, ?, NULL, ?, '')",
            r,
        )


def _audit_after_first(path: str, *rows: tuple[float, str, str, str, str]) -> None:
    """Audit rows as `_audit` writes them, each `ts` counted from the journal's first decision."""
    conn = sqlite3.connect(path, isolation_level=None)
    first = conn.execute("SELECT min(ts) FROM decisions").fetchone()[0]
    _audit(conn, *((first + r[0], *r[1:]) for r in rows))
    conn.close()


def test_recorded_changes_counts_the_operators_moves_in_the_window_only(tmp_path: Path) -> None:
    # a gate's start, its learned capacity and what was in force before the window are not
    # changes the engineer made in it (a window with none read "8 recorded changes")
    path = _journal(tmp_path, n=60, duration=10.0)
    conn = sqlite3.connect(path, isolation_level=None)
    first = conn.execute("SELECT min(ts) FROM decisions").fetchone()[0]
    _audit(conn, (first + 1.0, "gate", "started", "gate", ""), (first + 1.5, "gate", "capacity_learned", "backend:default", '{"slots": 4}'))
    _audit(
        conn,
        (first + 2.0, "console", "pause_class", "class:batch", "True"),
        (first + 3.0, "console", "resume_class", "class:batch", "False"),
    )
    conn.close()
    answer = run_replay(load_window(path), [])
    assert answer["recorded_changes"] == 2 and answer["restored_changes"] == 0
    assert "2 operator changes in the window" in to_table(answer) and "restored" not in to_table(answer)
    assert "1 operator change in the window" in to_table({**answer, "recorded_changes": 1})
    # a restarted gate putting its kept overrides back is not an operator's change (a trial's
    # header counted two restarts' `restored` rows, and a note called them "the operator's")
    conn = sqlite3.connect(path, isolation_level=None)
    _audit(conn, (first + 4.0, "gate", "restored", "classes.batch.queue_depth", "3"))
    conn.close()
    window = load_window(path)
    answer = run_replay(
        window, [proposal_from_set(f"classes.batch.queue_depth={window.config.class_by_name('batch').queue_depth}", window.config)]
    )
    assert answer["recorded_changes"] == 2 and answer["restored_changes"] == 1
    assert "2 operator changes in the window (and 1 kept override restored at a gate's start)" in to_table(answer)
    (pins,) = [n for n in answer["notes"] if "pins nothing" in n]
    assert "the recorded change of it in the window (at +" in pins and " s restored at a gate's start)" in pins


def test_an_objective_moved_in_the_window_is_said_with_the_bar_attainment_keeps(tmp_path: Path) -> None:
    # a trial's operator moved the SLO from 2 s to 3 s mid-incident; every column judged
    # attainment against the 2 s in force at the start, and nothing said so
    path = _journal(tmp_path, n=60, duration=10.0)
    _audit_after_first(path, (2.0, "console", "pause_class", "class:batch", "True"))
    assert not any("TTFT objective moved" in n for n in run_replay(load_window(path), [])["notes"])
    _audit_after_first(path, (3.0, "console", "set_budget_settings", "budget", "slo_ttft_p95_ms=3000"))
    window = load_window(path)
    (note,) = [n for n in run_replay(window, [])["notes"] if "TTFT objective moved" in n]
    assert "set_budget_settings budget" in note and f"{window.config.budget.slo_ttft_p95_ms:.0f} ms" in note
    # every class with an objective of its own: the SLO is no class's bar, and moving it moves
    # none (a trial's note fired on such a retune); a class objective's retune still does
    own = parse_config(
        EXAMPLE_CONFIG.replace("[classes.batch]", "[classes.batch]\nttft_objective_ms = 15000").replace(
            "[classes.interactive]", "[classes.interactive]\nttft_objective_ms = 6000"
        )
    )
    path = _journal(tmp_path, n=60, duration=10.0, config=own, name="own")
    _audit_after_first(path, (3.0, "console", "set_budget_settings", "budget", "slo_ttft_p95_ms=3000"))
    assert not any("TTFT objective moved" in n for n in run_replay(load_window(path), [])["notes"])
    _audit_after_first(path, (4.0, "console", "set_class", "class:batch", "ttft_objective_ms=9000"))
    (note,) = [n for n in run_replay(load_window(path), [])["notes"] if "TTFT objective moved" in n]
    assert "set_class class:batch" in note and "set_budget_settings" not in note and "batch 15000 ms" in note


def test_a_replayed_budget_that_parts_from_the_recorded_one_is_said_and_marked(tmp_path: Path) -> None:
    """A trial's gate closed its budget 2,048 -> 1,310 on a p95 TTFT over the SLO; the replay's
    backend model (a TTFT line without a tail) never closed it, and every [budget] proposal read
    "no change" beside figures called trusted. The budget curve is calibrated too: its mean."""
    path = _journal(tmp_path, n=120, duration=20.0)
    window = load_window(path)
    proposals = [
        proposal_from_set("budget.slo_ttft_p95_ms=4000", window.config),
        proposal_from_set("classes.batch.queue_depth=3", window.config),
    ]
    answer = run_replay(window, proposals)
    cal = answer["budget_calibration"]
    assert cal["trusted"] and cal["error"] == 0.0 and cal["recorded_mean"] == cal["replayed_mean"]
    assert not any("does not follow the recorded one" in n for n in answer["notes"]) and " ?" not in to_table(answer)
    # the gate's controller closed the budget to ~half for the window's second half (as recorded)
    conn = sqlite3.connect(path, isolation_level=None)
    (first, last) = conn.execute("SELECT min(ts), max(ts) FROM decisions").fetchone()
    conn.execute("UPDATE samples SET budget = budget / 2 WHERE ts > ?", ((first + last) / 2,))
    conn.close()
    window = load_window(path)
    answer = run_replay(window, proposals)
    cal = answer["budget_calibration"]
    assert not cal["trusted"] and cal["error"] > 0.2 and cal["recorded_mean"] < cal["replayed_mean"]
    (said,) = [n for n in answer["notes"] if "does not follow the recorded one" in n]
    assert f"{cal['recorded_mean']:,.0f} recorded, {cal['replayed_mean']:,.0f} replayed" in said
    # the proposal on [budget] is said to be no prediction; the one on a queue is not
    assert "budget.slo_ttft_p95_ms=4000: moves the budget or its controller, which this window's replay does not follow" in " ".join(
        answer["notes"]
    )
    assert not any(n.startswith("classes.batch.queue_depth=3: moves the budget") for n in answer["notes"])
    curves = budget_lines(answer)
    assert not curves[0].endswith("?") and all(line.endswith(" ?") for line in curves[1:])


def test_budget_lines_tell_two_proposals_on_one_key_apart() -> None:
    answer = {
        "duration_s": 10,
        "scenarios": [
            {"name": "recorded", "budget_curve": [[0, 1000]]},
            {"name": "classes.interactive.ttft_objective_ms=1500", "budget_curve": [[0, 1000]]},
            {"name": "classes.interactive.ttft_objective_ms=2500", "budget_curve": [[0, 1000]]},
        ],
    }
    labels = [line.split()[1] for line in budget_lines(answer)]
    assert len(set(labels)) == 3 and labels[1].endswith("ms=1500") and labels[2].endswith("ms=2500")


def test_changes_between_the_gate_s_start_and_the_window_are_named_in_a_note(tmp_path: Path) -> None:
    """A trial's window came after a SIGHUP reload (SLO 2000 -> 3000, a queue 64 -> 32): the
    replay's header said "config sha256:..., 0 operator changes in the window" and the what-if
    form's lines the gate's start values, as if they had been in force; nothing said the
    thresholds at the window's start were others."""
    path = _journal(tmp_path, n=60, duration=10.0)
    conn = sqlite3.connect(path, isolation_level=None)
    first = conn.execute("SELECT min(ts) FROM decisions").fetchone()[0]
    _audit(
        conn,
        (first + 1.0, "signal", "reload", "classes.batch.queue_depth", "16"),
        (first + 1.5, "console", "pause_class", "class:batch", "True"),
    )
    _audit(conn, (first + 6.0, "console", "resume_class", "class:batch", "False"))
    conn.close()
    window = load_window(path, since=first + 3.0)
    (said,) = [n for n in window.notes if "between the gate's start" in n]
    assert "2 changes" in said and "reload classes.batch.queue_depth" in said and "pause_class class:batch" in said
    assert "resume_class" not in said  # in the window: counted as an operator change in it
    # a trial: --set and the what-if's lines were compared with the gate's start, not with these
    assert "compared with the thresholds in force at the window's start, these changes included" in said
    assert "KEY=VALUE at that value changes nothing, another value pins KEY over them" in said
    assert not [n for n in load_window(path).notes if "between the gate's start" in n]  # from the gate's start: none


def test_a_window_that_ends_before_it_starts_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _journal(tmp_path, n=20, duration=5.0)
    assert main(["replay", "--journal", path, "--since", "2026-12-02T03:10Z", "--until", "2026-12-02T03:00Z"]) == 2
    said = capsys.readouterr().err
    # the moments as read, so `--since 10m --until 15m` (meant as "15 minutes long") says why
    assert "--until must be after --since: the window would run from 2026-12-02T03:10:00.000Z to 2026-12-02T03:00:00.000Z" in said
    assert "a duration is a moment that long ago" in said
    assert main(["replay", "--journal", path, "--since", "10m", "--until", "15m"]) == 2
    assert "a duration is a moment that long ago, not the window's length" in capsys.readouterr().err


def test_log_until_bounds_an_incidents_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from gate.journal.export import iso

    path = _journal(tmp_path, n=60, duration=6.0)
    conn = sqlite3.connect(path)
    stamps = [ts for (ts,) in conn.execute("SELECT ts FROM decisions ORDER BY ts")]
    since, until = stamps[10], stamps[40]
    inside = sum(1 for ts in stamps if since <= ts < until)
    assert main(["log", "--journal", path, "--format", "aiperf", "--since", iso(since), "--until", iso(until)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == inside and 0 < inside < len(stamps)
    assert main(["log", "--journal", path, "--since", iso(until), "--until", iso(since)]) == 2
    assert f"--until must be after --since: the window would run from {iso(until)} to {iso(since)}" in capsys.readouterr().err


def test_log_of_a_class_with_no_decisions_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _journal(tmp_path, n=20, duration=5.0)
    assert main(["log", "--journal", path, "--class", "nosuch", "--format", "aiperf"]) == 0
    out = capsys.readouterr()
    assert out.out == "" and "no decisions of class 'nosuch'" in out.err
    # a class the journal has never seen is named as such, with the ones it has (a typo at 3 a.m.)
    classes = sorted({c for (c,) in sqlite3.connect(path).execute("SELECT DISTINCT class FROM decisions") if c})
    assert f"the journal has no class 'nosuch' (its classes: {', '.join(classes)})" in out.err


def test_log_of_an_empty_window_as_a_trace_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _journal(tmp_path, n=20, duration=5.0)
    assert main(["log", "--journal", path, "--since", "2090-01-01T00:00Z", "--format", "aiperf"]) == 0
    out = capsys.readouterr()
    assert out.out == "" and "no decisions rows in the selection" in out.err


def test_the_proposals_columns_follow_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # --config scenarios were listed after every --set one, whatever the order given
    path = _journal(tmp_path, n=40, duration=10.0)
    other = tmp_path / "other.toml"
    other.write_text(EXAMPLE_CONFIG.replace("queue_depth = 64", "queue_depth = 8", 1))
    args = ["replay", "--journal", path, "--format", "json", "--config", str(other), "--set", "budget.min_tokens=1024"]
    assert main(args) == 0
    names = [s["name"] for s in json.loads(capsys.readouterr().out)["scenarios"]]
    assert names[:2] == ["recorded", "replayed"] and names[3] == "budget.min_tokens=1024" and "other.toml" in names[2]


def test_a_config_whose_backend_has_another_name_says_which_one_stands_for_the_replayed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # its first backend was taken, silently (a trial's file named it "gpu0")
    path = _journal(tmp_path, n=40, duration=10.0)
    recorded = load_window(path).backend
    other = tmp_path / "other.toml"
    other.write_text(EXAMPLE_CONFIG.replace(f'name = "{recorded}"', 'name = "gpu0"', 1))
    assert main(["replay", "--journal", path, "--format", "json", "--config", str(other)]) == 0
    notes = json.loads(capsys.readouterr().out)["notes"]
    assert any(f"has no backend {recorded!r}" in n and "'gpu0'" in n for n in notes), notes
    same = tmp_path / "same.toml"
    same.write_text(EXAMPLE_CONFIG)
    assert main(["replay", "--journal", path, "--format", "json", "--config", str(same)]) == 0
    assert not any("has no backend" in n for n in json.loads(capsys.readouterr().out)["notes"])


def test_a_proposal_config_check_would_warn_about_says_so(tmp_path: Path) -> None:
    # a reservation above the pool replays as every batch arrival refused: said, not presented
    # as a prediction alone (a trial's classes.interactive.reserved_tokens=5000 on 2,048)
    window = load_window(_journal(tmp_path, n=60, duration=10.0))
    over = proposal_from_set(f"classes.interactive.reserved_tokens={window.fit.ceiling + 1000}", window.config)
    fine = proposal_from_set("classes.batch.queue_depth=3", window.config)
    answer = run_replay(window, [over, fine])
    warned, quiet = answer["scenarios"][2], answer["scenarios"][3]
    assert warned["warnings"] and all("reserved" in w or "exceed" in w or "reserv" in w for w in warned["warnings"]), warned["warnings"]
    assert quiet["warnings"] == []
    assert any(n.startswith(over.name + ": ") for n in answer["notes"])
    assert over.name + ": " in to_table(answer)


def test_a_proposal_s_warnings_are_every_one_config_check_gives_its_thresholds(tmp_path: Path) -> None:
    """The replay's proposal warnings were `capacity_warnings` alone: a limit_tokens at the
    class's default_max_tokens replayed as 63 batch arrivals refused 400 context_length_exceeded,
    and an objective of 20 ms (seconds meant?) as every waiter refused, with nothing said, where
    `config check` warns of both (gate/config/checks.py)."""
    from gate.config.checks import limit_warnings, objective_warnings

    window = load_window(_journal(tmp_path, n=60, duration=10.0))
    limit = proposal_from_set("classes.batch.limit_tokens=512", window.config)
    objective = proposal_from_set("budget.slo_ttft_p95_ms=20", window.config)
    answer = run_replay(window, [limit, objective])
    assert answer["scenarios"][2]["warnings"] == limit_warnings(limit.config) != []
    assert answer["scenarios"][3]["warnings"] == objective_warnings(objective.config) != []
    assert "a request of class 'batch' without max_tokens holds its prompt and 512 tokens" in to_table(answer)


# ---- a window across a gate restart (a user's trial: a real gate restarted, SIGKILLed) -------


def _decision_times(path: str) -> list[float]:
    return [ts for (ts,) in sqlite3.connect(path).execute("SELECT ts FROM decisions ORDER BY ts")]


def _besides_the_template(err: str) -> str:
    """`tokengate log --format aiperf`'s stderr without its line on the chat template (the
    synthetic journals' chat requests have no capacity_learned row that says its size)."""
    return "".join(line for line in err.splitlines(keepends=True) if "chat template" not in line)


def _two_processes(path: str, at: float, first: tuple[str, int], second: tuple[str, int]) -> None:
    """The samples before `at` written by one gate process, the rest by another, each with its
    own `journal_dropped` counter (a per-process count: a restart starts it at 0 again)."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("UPDATE samples SET gate_id = ?, journal_dropped = ? WHERE ts < ?", (*first, at))
    conn.execute("UPDATE samples SET gate_id = ?, journal_dropped = ? WHERE ts >= ?", (*second, at))
    conn.close()


def test_dropped_rows_are_counted_within_each_gate_process(tmp_path: Path) -> None:
    path = _journal(tmp_path, n=80, duration=10.0)
    stamps = _decision_times(path)
    mid = stamps[len(stamps) // 2]
    # the first gate had dropped 5 rows before the window; the second starts its count at 0:
    # no row was dropped in the window (it was refused as "dropped 5 rows" across the restart)
    _two_processes(path, mid, ("host:1:a", 5), ("host:2:b", 0))
    assert load_window(path).arrivals
    # a rise within the second process is a drop in the window
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("UPDATE samples SET journal_dropped = 2 WHERE gate_id = 'host:2:b' AND ts >= ?", (mid + 2.0,))
    conn.close()
    with pytest.raises(ReplayError, match="dropped 2 rows during the window"):
        load_window(path)
    # a process that started in the window (its config_in_force row) counts from 0: 4 dropped
    # before its first sample
    _two_processes(path, mid, ("host:1:a", 5), ("host:2:b", 4))
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(
        "INSERT INTO audit (ts, operator, origin, source, action, target, old_value, new_value, note, gate_id) "
        "SELECT ?, operator, origin, source, action, target, old_value, new_value, note, 'host:2:b' FROM audit WHERE action = 'config_in_force'",
        (mid - 0.5,),
    )
    conn.close()
    with pytest.raises(ReplayError, match="dropped 4 rows during the window"):
        load_window(path)
    assert load_window(path, since=mid + 3.0).arrivals  # a window after its start: its 4 came before


def _learned_row(path: str, value: dict[str, object], at: float = 1_800_000_000.0 - 0.5) -> None:
    from gate.data.records import CAPACITY_LEARNED

    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(
        "INSERT INTO audit (ts, operator, origin, source, action, target, old_value, new_value, note) VALUES (?, 'g', 'local', 'gate', ?, "
        "'backend:default', NULL, ?, '')",
        (at, CAPACITY_LEARNED, json.dumps(value)),
    )
    conn.close()


def test_the_pool_is_llama_servers_not_the_configured_token_budget(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # A user's trial: token_budget = 1400 on llama-server -c 2048 -np 4 -kvu. Replay said "unified
    # pool of 1400 tokens", warned a proposal of 2000 was above that pool, and replayed a --config
    # without token_budget at 1,400 where a gate would have used the pool, 2,048.
    config = parse_config(EXAMPLE_CONFIG.replace('kv = "auto"', 'kv = "auto"\ntoken_budget = 1400'))
    path = _journal(tmp_path, 60, 10.0, seed=2, config=config, name="budget1400-")
    # without a capacity_learned row the pool is unknown: said, and nothing warned against it
    window = load_window(path)
    assert window.pool is None and window.fit.ceiling == 1400
    assert any("KV pool is not in the journal" in n for n in window.fit.notes)
    # (2,048: at 2,000 the example's interactive 1,024 is more than half, scaled and warned, R0)
    answer = run_replay(window, [proposal_from_set("backend.token_budget=2048", window.config)])
    assert answer["scenarios"][2]["warnings"] == []
    # a gate before this one wrote the learned capacity without the pool: it follows from the layout
    for value in (
        {"slots": 4, "kv": "unified", "slot_context": 2048, "ceiling": 1400},
        {"slots": 4, "kv": "unified", "slot_context": 2048, "ceiling": 1400, "pool": 2048},  # as the gate writes it now
    ):
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("DELETE FROM audit WHERE action = 'capacity_learned'")
        conn.close()
        _learned_row(path, value)
        window = load_window(path)
        assert window.pool == 2048 and window.fit.ceiling == 2048, value
        assert not any("pool" in n for n in window.fit.notes)
        under, over = (proposal_from_set(f"backend.token_budget={n}", window.config) for n in (2048, 3000))
        answer = run_replay(window, [under, over])
        assert "unified pool of 2048 tokens" in to_table(answer)
        assert answer["scenarios"][2]["warnings"] == []  # 2,048 fits the 2,048-token pool
        assert any("above llama-server's KV pool of 2048" in w for w in answer["scenarios"][3]["warnings"])
        # the recorded thresholds replay at their 1,400; a config without token_budget at the pool
        assert answer["scenarios"][1]["budget_curve"][0] == [0.0, 1400]
        other = tmp_path / "no-budget.toml"
        other.write_text(EXAMPLE_CONFIG)
        assert main(["replay", "--journal", path, "--config", str(other), "--format", "json"]) == 0
        assert json.loads(capsys.readouterr().out)["scenarios"][2]["budget_curve"][0] == [0.0, 2048]


def test_a_capacity_change_within_the_window_is_said(tmp_path: Path) -> None:
    # A user's trial of R0 restarted llama-server under the gate with another -c: the replay
    # models one capacity per window, and said nothing of the rest of the window's pool
    start = 1_800_000_000.0
    path = _journal(tmp_path, n=40, duration=10.0)
    split4 = {"slots": 4, "kv": "split", "slot_context": 512, "ceiling": 2048}
    _learned_row(path, split4, at=start - 0.5)
    _learned_row(path, split4, at=start + 2.0)  # the same capacity learned again: nothing to say
    _learned_row(path, {"slots": 2, "kv": "split", "slot_context": 512, "ceiling": 1024}, at=start + 5.0)
    window = load_window(path)
    (note,) = [n for n in window.notes if "capacity changed within the window" in n]
    assert "at 08:00:05 (to 2 slots of 512, split KV, pool 1024)" in note
    assert "replayed on 4 slots of 512, split KV, pool 2048" in note
    assert note.endswith("(--until / --since 2027-01-15T08:00:05Z)")  # a moment replay reads
    assert "capacity changed" in to_table(run_replay(window, []))
    # the window after it replays the new capacity and has nothing to say
    after = load_window(path, since=start + 5.5)
    assert after.fit.slots == 2 and not any("capacity changed" in n for n in after.notes)


async def test_the_gate_records_llama_servers_pool_beside_its_ceiling(tmp_path: Path) -> None:
    # the capacity_learned row's `ceiling` is the configured token_budget when there is one: the
    # gate now records the pool too, which replay models (a real journal, read back by replay)
    from gate.core.admission import Capacity
    from gate.data.commands import Operator
    from gate.journal import Journal
    from gate.observe.metrics import GateMetrics
    from gate.observe.recorder import Recorder

    path = tmp_path / "gate.db"
    recorder = Recorder(GateMetrics(), gate_id="host:1:t", clock=lambda: 0.0)
    recorder.journal = await Journal.open(path)
    try:
        recorder.capacity_learned("default", Capacity(4, 2048, 1400, pool=2048), "unified", "props", Operator("t", "local"))
        recorder.capacity_learned("default", Capacity(4, 512, 2048), "split", "props", Operator("t", "local"))
    finally:
        await recorder.journal.close()
    rows = sqlite3.connect(path).execute("SELECT new_value, note FROM audit WHERE action = 'capacity_learned' ORDER BY id").fetchall()
    (first, note), (second, _) = ((json.loads(v), n) for v, n in rows)
    assert (first["ceiling"], first["pool"]) == (1400, 2048) and note.endswith("ceiling 1400, pool 2048")
    assert (second["ceiling"], second["pool"]) == (2048, 2048)


def _restart_row(path: str, ts: float, config: object, gate_id: str = "host:2:b") -> None:
    from gate.config import config_digest

    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(
        "INSERT INTO audit (ts, operator, origin, source, action, target, old_value, new_value, note, gate_id) "
        "VALUES (?, 'tokengate', 'local', 'gate', 'config_in_force', 'gate', NULL, ?, ?, ?)",
        (ts, thresholds_json(config), config_digest(config), gate_id),  # type: ignore[arg-type]
    )
    conn.close()


#: what a second gate started with in the restart tests: a static budget of 300 tokens
SMALL = parse_config(
    EXAMPLE_CONFIG.replace('kv = "auto"', 'kv = "auto"\ntoken_budget = 300').replace('mode = "adaptive"', 'mode = "static"')
)


def test_a_window_across_a_gate_restart_replays_each_part_under_its_gate(tmp_path: Path) -> None:
    # A user's trial: a window spanning a restart was replayed whole under the first gate's
    # thresholds, and nothing said so. The second gate here runs a static budget of 300 tokens.
    from gate.config import config_digest
    from gate.config.thresholds import CONFIG_IN_FORCE
    from gate.tools.replay import Change

    start = 1_800_000_000.0
    arrivals = synthetic_arrivals(240, 20.0, seed=4)
    restart = Change(10.0, CONFIG_IN_FORCE, "gate", thresholds_json(SMALL))
    outcomes = replay(CONFIG, FIT, arrivals, [restart], until=21.0)
    path = str(tmp_path / "restart.db")
    write_journal(path, CONFIG, FIT, arrivals, outcomes, start=start)
    _restart_row(path, start + 10.0, SMALL)
    window = load_window(path)
    hms = __import__("time").strftime("%H:%M:%S", __import__("time").gmtime(start + 10.0))
    said = [n for n in window.notes if n.startswith(f"the window spans a gate restart at {hms} ")]
    assert said and f"(config {config_digest(CONFIG)} -> {config_digest(SMALL)})" in said[0], window.notes
    answer = run_replay(window)
    assert f"note: the window spans a gate restart at {hms}" in to_table(answer)
    replayed = answer["scenarios"][1]["budget_curve"]
    assert replayed == [[0.0, 2048], [round(start + 10.0 - window.since, 3), 300]]  # each gate's budget

    def off(w: object) -> int:
        a = run_replay(w)  # type: ignore[arg-type]
        rec, rep = a["scenarios"][0]["classes"], a["scenarios"][1]["classes"]
        return sum(abs(rec[c]["admitted"] - rep[c]["admitted"]) for c in rec)

    # replayed under the first gate's thresholds throughout (as before), the second half is far off
    # (5 admissions off with the restart, 23 without it)
    assert off(window) * 3 < off(dataclasses.replace(window, changes=())), (off(window), off(dataclasses.replace(window, changes=())))
    # a proposal's own key keeps its proposed value across the restart; the rest is the new gate's
    roomy = proposal_from_set("backend.token_budget=2048", window.config)
    curve = run_replay(window, [roomy])["scenarios"][2]["budget_curve"]
    assert all(b == 2048 for _, b in curve), curve


def test_a_restart_ends_the_old_gates_pauses_unless_the_new_one_restored_them() -> None:
    from gate.config.thresholds import CONFIG_IN_FORCE
    from gate.tools.replay import Change

    arrivals = [a for a in synthetic_arrivals(200, 20.0, seed=6) if a.cls == "batch"]
    later = {a.id for a in arrivals if a.at > 10.5}
    paused = Change(2.0, "pause_class", "class:batch", "True")
    restart = Change(10.0, CONFIG_IN_FORCE, "gate", thresholds_json(CONFIG))
    restored = Change(10.2, "restored", "class:batch", "paused")
    ended = replay(CONFIG, FIT, arrivals, [paused, restart], until=21.0)
    assert later and all(ended[i].reason != "class_paused" for i in later)
    kept = replay(CONFIG, FIT, arrivals, [paused, restart, restored], until=21.0)
    assert all(kept[i].reason == "class_paused" for i in later)
    # a restart's budget starts again at what its config says (an operator's hand cut ends)
    curve: list[tuple[float, int]] = []
    replay(CONFIG, FIT, arrivals, [Change(2.0, "set_budget", "backend:default", "1500"), restart], until=21.0, budget_curve=curve)
    assert (2.0, 1500) in curve and curve[-1] == (10.0, 2048)


def test_dropping_the_overrides_ends_a_pause_and_a_retune_and_goes_back_to_the_file() -> None:
    # `tokengate overrides drop` ends every pause and retune (gate.ops.control.drop_overrides):
    # the replay kept them in force (a trial: batch admitted 62 replayed as 0, 188 class_paused)
    from gate.tools.replay import Change

    arrivals = [a for a in synthetic_arrivals(200, 20.0, seed=6) if a.cls == "batch"]
    later = {a.id for a in arrivals if a.at > 10.5}
    dropped = Change(10.0, "overrides_dropped", "overrides", None)
    paused = Change(2.0, "pause_class", "class:batch", "True")
    kept = replay(CONFIG, FIT, arrivals, [paused], until=21.0)
    assert later and all(kept[i].reason == "class_paused" for i in later)
    ended = replay(CONFIG, FIT, arrivals, [paused, dropped], until=21.0)
    assert all(ended[i].reason != "class_paused" for i in later) and any(ended[i].admitted for i in later)
    # a retune ends with it: batch's queue as deep as the file says again
    shallow = Change(2.0, "set_class", "class:batch", "queue_depth=1")
    full = replay(CONFIG, FIT, arrivals, [shallow], until=21.0)
    back = replay(CONFIG, FIT, arrivals, [shallow, dropped], until=21.0)
    assert sum(back[i].reason == "queue_full" for i in later) < sum(full[i].reason == "queue_full" for i in later)
    # a static budget set by hand goes back to the ceiling, as the live gate's drop sets it
    static = dataclasses.replace(CONFIG, budget=dataclasses.replace(CONFIG.budget, mode="static"))
    curve: list[tuple[float, int]] = []
    replay(static, FIT, arrivals, [Change(2.0, "set_budget", "backend:default", "1500"), dropped], until=21.0, budget_curve=curve)
    assert (2.0, 1500) in curve and curve[-1] == (10.0, 2048), curve
    # and an adaptive one set by hand and frozen: the live gate's drop puts it at the ceiling too
    curve = []
    held = [Change(1.0, "freeze", "controller", "True"), Change(2.0, "set_budget", "backend:default", "1500"), dropped]
    replay(CONFIG, FIT, arrivals, held, until=21.0, budget_curve=curve)
    assert (2.0, 1500) in curve and (10.0, 2048) in curve, curve


def test_a_window_with_a_killed_gate_says_requests_in_flight_then_are_missing(tmp_path: Path) -> None:
    # After a SIGKILL the next gate writes `unclean_end`; the requests in flight at the kill
    # are in no decision row. A user's trial: the replay said nothing of it.
    path = _journal(tmp_path, n=80, duration=10.0)
    lo, hi = sqlite3.connect(path).execute("SELECT min(ts), max(ts) FROM decisions").fetchone()
    (last,) = (
        sqlite3.connect(path)
        .execute(  # the killed gate's last row: a sample, or a request's end
            "SELECT max((SELECT max(ts) FROM samples), (SELECT max(ts + duration_ms / 1000.0) FROM decisions))"
        )
        .fetchone()
    )
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(
        "INSERT INTO audit (ts, operator, origin, source, action, target, old_value, new_value, note) "
        "VALUES (?, 'tokengate', 'local', 'gate', 'unclean_end', 'gate', NULL, NULL, 'the previous gate ended without stopped')",
        (last + 30.0,),
    )
    conn.close()
    hms = __import__("time").strftime("%H:%M:%S", __import__("time").gmtime(last))
    for window in (load_window(path), load_window(path, since=lo + 2.0, until=hi - 1.0)):  # holds it, or ends seconds before
        said = [n for n in window.notes if n.startswith(f"the gate was killed at/after {hms} ")]
        assert said and "requests in flight then were never journaled; counts may be short" in said[0], window.notes
    assert not any("killed" in n for n in load_window(path, until=lo + 1.0).notes)  # long before it: nothing lost


def _unclassed(path: str, *rows: tuple[float, str, str, str, str, str, int]) -> None:
    """Decision rows without a class: (ts, request_id, backend, endpoint, outcome, reason, status)."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.executemany(
        "INSERT INTO decisions (ts, request_id, tenant, class, backend, endpoint, stream, reserved_tokens, outcome, reason, "
        "http_status, duration_ms) VALUES (?, ?, '', '', ?, ?, 0, 0, ?, ?, ?, 0.1)",
        rows,
    )
    conn.close()


def test_decisions_without_a_class_are_counted_out_loud(tmp_path: Path) -> None:
    # A SIGTERM's 38 `shutting_down` 503s have no class: left out of every figure, and now said so.
    path = _journal(tmp_path, n=60, duration=10.0)
    lo, hi = sqlite3.connect(path).execute("SELECT min(ts), max(ts) FROM decisions").fetchone()
    chat = "/v1/chat/completions"
    _unclassed(path, *((hi - 0.5 + i / 100.0, f"s{i}", "", chat, "refused", "shutting_down", 503) for i in range(38)))
    _unclassed(path, (lo + 1.0, "k1", "", chat, "refused", "invalid_api_key", 401))
    window = load_window(path)
    assert "39 decisions without a class (shutting_down 38, invalid_api_key 1) are left out of every figure" in " ".join(window.notes)
    answer = run_replay(window)
    assert sum(f["arrivals"] for f in answer["scenarios"][0]["classes"].values()) == 60
    assert not any("without a class" in n for n in load_window(path, until=lo + 0.5).notes)


def test_a_proposed_max_tokens_cap_refuses_the_arrivals_over_it_as_the_gate_does(tmp_path: Path) -> None:
    # A user's trial: classes.batch.max_tokens_cap=40 changed nothing in the replay, where the
    # gate answers a request over its class's cap 400 (gate/http/intake.py: invalid_request).
    config = parse_config(EXAMPLE_CONFIG.replace("default_max_tokens = 512", "default_max_tokens = 32"))
    path = _journal(tmp_path, 120, 15.0, seed=1, config=config, name="cap-")
    window = load_window(path)
    over = sum(1 for a in window.arrivals if a.cls == "batch" and a.max_tokens > 40)
    assert over > 0
    answer = run_replay(window, [proposal_from_set("classes.batch.max_tokens_cap=40", window.config)])
    refused = answer["scenarios"][2]["classes"]["batch"]["refused"]
    assert refused.get("invalid_request") == over, refused
    assert "invalid_request" not in answer["scenarios"][1]["classes"]["batch"]["refused"]  # the recorded cap: none over it
    # a cap below the recorded default needs another default: refused, and said why
    with pytest.raises(ValueError, match="default_max_tokens cannot be replayed.*a max_tokens_cap below it cannot be replayed either"):
        proposal_from_set("classes.batch.max_tokens_cap=20,classes.batch.default_max_tokens=20", window.config)
    # ... and the cap alone below it says so at once: a trial's first answer was the config
    # check's "classes.batch.default_max_tokens: must be at most max_tokens_cap (20), got 32",
    # which sends the engineer to lower the default, which is refused in turn
    with pytest.raises(
        ValueError, match=r"max_tokens_cap of 20 for class batch is below its recorded default_max_tokens \(32\).*cannot be replayed"
    ):
        proposal_from_set("classes.batch.max_tokens_cap=20", window.config)


def test_default_max_tokens_cannot_be_replayed_and_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The journal holds each request's max_tokens as the gate reserved it, not whether the
    # client sent one: a proposed default changed nothing, silently (a user's trial).
    with pytest.raises(
        ValueError,
        match=r"classes.batch.default_max_tokens cannot be replayed: .*keep it as recorded \(classes.batch.default_max_tokens=512\)",
    ):
        proposal_from_set("classes.batch.default_max_tokens=40", CONFIG)
    assert proposal_from_set("classes.batch.default_max_tokens=512", CONFIG).pinned == frozenset()  # as recorded: fine
    path = _journal(tmp_path, n=30, duration=5.0)
    assert main(["replay", "--journal", path, "--set", "classes.batch.default_max_tokens=40"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "tokengate replay: error: classes.batch.default_max_tokens=40: classes.batch.default_max_tokens cannot be replayed"
    )
    assert err.count("\n") == 1
    other = tmp_path / "other.toml"
    other.write_text(EXAMPLE_CONFIG.replace("default_max_tokens = 512", "default_max_tokens = 40"))
    assert main(["replay", "--journal", path, "--config", str(other)]) == 2
    assert "classes.batch.default_max_tokens cannot be replayed" in capsys.readouterr().err


def test_the_table_reads_as_english(tmp_path: Path) -> None:
    # A user's trial read "not a prediction (1 figures)", "only 0 completed requests", and an
    # error of "0%" beside two "-" (here every arrival was rate-limited: kept as recorded, nothing ran).
    path = _journal(tmp_path, n=12, duration=5.0)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(
        "UPDATE decisions SET outcome = 'refused', reason = 'rate_limited', http_status = 429, completion_tokens = NULL, "
        "ttft_ms = NULL, queue_ms = NULL, ttft_arrival_ms = NULL"
    )
    conn.close()
    window = load_window(path)
    assert "no completed requests: the backend model uses defaults" in window.fit.notes
    answer = run_replay(window)
    table = to_table(answer)
    line = next(ln for ln in table.splitlines() if ln.startswith("batch") and "ttft_p95_ms" in ln)
    assert line.split()[2:] == ["-", "-", "-"], line
    answer["scenarios"][1]["untrusted"] = ["batch.admitted"]
    assert "not a prediction (1 figure)" in to_table(answer)
    answer["scenarios"][1]["untrusted"] = ["batch.admitted", "interactive.admitted"]
    assert "not a prediction (2 figures)" in to_table(answer)


def test_log_and_replay_read_a_moment_alike(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # `tokengate log` refused the epoch seconds `replay` accepts and prints in its JSON
    path = _journal(tmp_path, n=40, duration=6.0)
    stamps = _decision_times(path)
    since, until = stamps[10], stamps[30]
    assert main(["replay", "--journal", path, "--format", "json", "--since", repr(since), "--until", repr(until)]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert main(["log", "--journal", path, "--format", "aiperf", "--since", repr(answer["since"]), "--until", repr(answer["until"])]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 20
    for command in ("log", "replay"):
        assert main([command, "--journal", path, "--since", "yesterday"]) == 2
        err = capsys.readouterr().err
        assert "'yesterday' is not a moment: give a duration ago (30s, 15m, 2h, 7d), a time of day (21:10" in err
        assert "an ISO-8601 time" in err and "epoch seconds" in err


def test_log_aiperf_says_what_it_leaves_out(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # decisions without token counts (refused before the prompt was counted) were dropped from
    # the trace silently: a window of only those printed nothing, exit 0
    path = _journal(tmp_path, n=20, duration=5.0)
    stamps = _decision_times(path)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("UPDATE decisions SET prompt_tokens = NULL, max_tokens = NULL, completion_tokens = NULL WHERE ts >= ?", (stamps[15],))
    conn.close()
    assert main(["log", "--journal", path, "--format", "aiperf", "--since", repr(stamps[15])]) == 0
    out = capsys.readouterr()
    assert out.out == "" and _besides_the_template(out.err).count("\n") == 1
    assert "tokengate log: 5 decisions without a prompt token count (or any output length) are left out of the trace" in out.err
    assert main(["log", "--journal", path, "--format", "aiperf"]) == 0
    out = capsys.readouterr()
    assert len(out.out.splitlines()) == 15 and "5 decisions without a prompt token count" in out.err
    assert main(["log", "--journal", path, "--format", "aiperf", "--until", repr(stamps[15])]) == 0
    assert _besides_the_template(capsys.readouterr().err) == ""  # nothing left out: nothing said


def test_the_replayed_controller_never_goes_below_the_classes_reservations_as_the_gate_s():
    """With min_tokens 0 (auto) the gate's floor is a quarter of the ceiling and never below the
    classes' reservations (gate.backend.pool passes them); the replay passed none, and its
    controller went down to 512 of a 2,048 pool where the gate stops at the reservations."""
    text = EXAMPLE_CONFIG.replace("slo_ttft_p95_ms = 2000.0", "slo_ttft_p95_ms = 1.0")  # always over: the budget falls
    config = parse_config(text)
    config = dataclasses.replace(config, budget=dataclasses.replace(config.budget, min_tokens=0, mode="adaptive", cooldown_s=0.0))
    reserved = sum(c.reserved_tokens for c in config.classes)
    assert FIT.ceiling // 4 < reserved < FIT.ceiling  # the case: the reservations are the floor
    curve: list[tuple[float, int]] = []
    replay(config, FIT, synthetic_arrivals(300, 30.0, seed=3), until=31.0, budget_curve=curve)
    assert min(b for _, b in curve) == reserved, curve


def test_a_backend_with_no_decisions_is_refused_naming_the_ones_the_window_has(tmp_path: Path) -> None:
    path = _journal(tmp_path, n=20, duration=5.0)
    with pytest.raises(ReplayError, match=r"no decisions for backend 'nope' in the window \(the window's backends: default\)"):
        load_window(path, backend="nope")


def test_a_backend_with_no_decisions_is_refused_also_beside_decisions_without_a_backend(tmp_path: Path) -> None:
    """A trial's window held 23 `shutting_down` 503s of a gate restart (refused before they
    reached a backend: backend ''): `--backend nope` then replayed those alone, and printed an
    empty table (exit 0) with "no completed requests" and "a gate older than this one wrote it"."""
    path = _journal(tmp_path, n=20, duration=5.0)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(
        "INSERT INTO decisions (ts, request_id, tenant, class, backend, endpoint, stream, reserved_tokens, outcome, reason, "
        "http_status, duration_ms) SELECT ts + 0.001, request_id || 'x', tenant, '', '', endpoint, stream, 0, 'refused', "
        "'shutting_down', 503, 0.1 "
        "FROM decisions ORDER BY ts LIMIT 3"
    )
    conn.close()
    with pytest.raises(ReplayError, match=r"no decisions for backend 'nope' in the window \(the window's backends: default\)"):
        load_window(path, backend="nope")
    assert load_window(path, backend="default").backend == "default"


def test_a_set_key_at_its_recorded_value_says_the_operators_change_of_it_still_replays(tmp_path: Path) -> None:
    # A proposal pins only the keys whose value differs from the recorded config, so after an
    # operator's retune of interactive's queue from 8 to 12, `--set classes.interactive.queue_depth=8`
    # ("what if I had kept 8?") replayed the retune to 12 and printed the replayed column again
    # with nothing said (a user's trial): it is documented, and now it is said.
    from gate.tools.replay.engine import Change

    window = load_window(_journal(tmp_path, n=120, duration=20.0))
    depth = next(c.queue_depth for c in window.config.classes if c.name == "interactive")
    retune = Change(5.0, "set_class", "class:interactive", f"queue_depth={depth + 4}")
    window = dataclasses.replace(window, changes=(*window.changes, retune))
    same = proposal_from_set(f"classes.interactive.queue_depth={depth}", window.config)
    other = proposal_from_set(f"classes.interactive.queue_depth={depth + 1}", window.config)
    untouched = proposal_from_set(f"classes.batch.queue_depth={depth}", window.config)
    answer = run_replay(window, [same, other, untouched])
    replayed, *columns = answer["scenarios"][1:]
    assert columns[0]["classes"] == replayed["classes"]  # as documented: the replayed column
    said = [n for n in answer["notes"] if "is the value in force at the window's start" in n]
    assert len(said) == 1, answer["notes"]
    assert said[0].startswith(f"classes.interactive.queue_depth={depth} is the value in force at the window's start, so it pins nothing")
    assert "+5.0 s" in said[0] and "replayed as recorded" in said[0]


def test_forwarded_requests_are_not_called_refusals(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A user's journal (3 chat requests, a GET /props, a GET of an unknown path, both forwarded
    outside admission) replayed with "2 decisions without a class (ok 2) are left out of every
    figure: the gate refused them before it classified them", and `log --format aiperf` said
    "3 decisions ... left out of the trace: refused before the gate counted the prompt": nothing
    was refused. Forwarded rows (outcome forwarded, no class, nothing counted) are named as such."""
    path = _journal(tmp_path, n=20, duration=5.0)
    lo = sqlite3.connect(path).execute("SELECT min(ts) FROM decisions").fetchone()[0]
    _unclassed(
        path,
        (lo + 1.0, "f1", "default", "GET /props", "forwarded", "ok", 200),
        (lo + 1.5, "f2", "default", "GET /nonexistent", "forwarded", "ok", 404),
        (lo + 2.0, "r1", "default", "/v1/chat/completions", "refused", "shutting_down", 503),
    )
    notes = " ".join(load_window(path).notes)
    assert "2 forwarded requests (routes outside admission" in notes, notes
    assert "1 decision without a class (shutting_down 1) is left out of every figure" in notes, notes
    assert "ok 2" not in notes
    assert main(["log", "--journal", path, "--format", "aiperf"]) == 0
    err = capsys.readouterr().err
    assert "3 decisions without a prompt token count (or any output length) are left out of the trace" in err, err
    assert "2 forwarded outside admission" in err and "1 refused before the gate counted the prompt" in err, err


def test_a_proposed_kv_layout_is_refused_or_said_not_replayed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--set backend.kv=split` was accepted as a key "the replay's backend model reads", and its
    column equalled the replayed one: the model runs on the layout the gate learned from
    llama-server (a gate does too: a learned layout overrides the file's kv), and never reads a
    proposal's kv (a trial's what-if of a split cache changed nothing, and nothing said so)."""
    path = _journal(tmp_path, n=40, duration=10.0)
    window = load_window(path)
    with pytest.raises(ValueError, match=r"backend\.kv.*not replayed.*layout"):
        proposal_from_set("backend.kv=split", window.config)
    with pytest.raises(ValueError, match=r"reads backend\.token_budget, backend\.max_prefill_tokens, backend\.prefill_yield_tokens$"):
        proposal_from_set("backend.url=http://x", window.config)
    other = tmp_path / "split.toml"
    other.write_text(EXAMPLE_CONFIG.replace('kv = "auto"', 'kv = "split"', 1))
    assert main(["replay", "--journal", path, "--format", "json", "--config", str(other)]) == 0
    notes = json.loads(capsys.readouterr().out)["notes"]
    assert any("split.toml" in n and 'kv = "split" is not replayed' in n for n in notes), notes
    same = tmp_path / "same.toml"
    same.write_text(EXAMPLE_CONFIG)
    assert main(["replay", "--journal", path, "--format", "json", "--config", str(same)]) == 0
    assert not any("is not replayed" in n for n in json.loads(capsys.readouterr().out)["notes"])


def test_log_aiperf_says_how_many_input_lengths_are_the_gates_estimates(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A trial's incident trace: 745 of its 872 lines carried the prompt size of a request refused
    at arrival before llama-server counted it (token_count_source = estimate: its bytes / 3,
    scaled), as `input_length`, and nothing said so: the performance team took them as counts."""
    path = _journal(tmp_path, n=20, duration=5.0)
    stamps = _decision_times(path)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("UPDATE decisions SET token_count_source = 'estimate' WHERE ts >= ?", (stamps[14],))
    conn.close()
    assert main(["log", "--journal", path, "--format", "aiperf"]) == 0
    out = capsys.readouterr()
    assert len(out.out.splitlines()) == 20 and _besides_the_template(out.err).count("\n") == 1
    assert "tokengate log: 6 of the 20 input_length values are the gate's estimates" in out.err
    assert main(["log", "--journal", path, "--format", "aiperf", "--until", repr(stamps[14])]) == 0
    assert _besides_the_template(capsys.readouterr().err) == ""  # every one counted: nothing said


def test_a_window_starting_just_before_a_gate_start_does_not_claim_a_lead_it_cannot_replay(tmp_path: Path) -> None:
    """A trial's window began 4.7 s before its gate's restart (the old gate draining): the
    thresholds in force are the new gate's (a config_in_force row up to 5 s after --since), and
    the old gate's 3 requests still running at --since arrived before it, so the lead (which
    starts no earlier than the thresholds) held none of them. The note read "3 requests ... were
    still queued or running at its start: the replay starts -0.0 s earlier (with the 0 arrivals
    since then ...) so that they hold their slots"."""
    start = 1_800_000_000.0
    arrivals = synthetic_arrivals(240, 20.0, seed=4)
    outcomes = replay(CONFIG, FIT, arrivals, until=21.0)
    path = str(tmp_path / "restart.db")
    write_journal(path, CONFIG, FIT, arrivals, outcomes, start=start)
    _restart_row(path, start + 10.0, CONFIG)
    window = load_window(path, since=start + 7.0)
    assert not window.lead
    assert not any("s earlier" in n for n in window.notes), window.notes
    said = [n for n in window.notes if "before the gate whose thresholds it replays started" in n]
    assert said and said[0].startswith("the window starts 3.0 s before") and "not replayed" in said[0], window.notes


def test_the_aiperf_commands_given_keep_each_traces_time_zero() -> None:
    """A trial replayed two per-class traces with the README's command: aiperf 0.13 shifts a
    fixed schedule to start at its first timestamp unless told a start offset (its log:
    "zero_ms=166, auto_offset=True"), so the interactive trace, 166 ms into the window, started
    at aiperf's 0 and the classes were not in step as the README said."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    commands = [line for line in readme.splitlines() if "--custom-dataset-type mooncake_trace --fixed-schedule" in line]
    assert commands and all("--fixed-schedule-start-offset 0" in line for line in commands), commands
    assert "--fixed-schedule-start-offset 0" in " ".join(readme[readme.index("one trace per class (`tokengate log") :].split()[:80])


def test_an_error_too_large_to_mean_a_percentage_reads_over_999_percent(tmp_path: Path) -> None:
    """A trial's gate never queued (every request started or was refused at arrival: a queue
    wait of 0.1 ms each), the replay queued some: its table read "queue_wait_p95_ms  0.100
    1129?  112930%", a number that looks like a bug. The table says ">999%"; the JSON keeps the
    ratio (and the figure stays untrusted)."""
    path = _journal(tmp_path, n=200, duration=20.0)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("UPDATE decisions SET queue_ms = 0.1 WHERE class = 'interactive' AND outcome = 'admitted'")
    conn.close()
    answer = run_replay(load_window(path))
    cal = answer["calibration"]["interactive.queue_wait_p95_ms"]
    assert cal["recorded"] == 0.1 and cal["error"] > 9.995, cal
    line = next(ln for ln in to_table(answer).splitlines() if "interactive" in ln and "queue_wait_p95_ms" in ln)
    assert line.split()[-1] == ">999%", line
    assert "interactive.queue_wait_p95_ms" in answer["scenarios"][1]["untrusted"]


def test_a_proposal_that_moves_the_objective_says_its_attainment_has_another_yardstick(tmp_path: Path) -> None:
    """slo_attainment is judged against each scenario's own objective: a trial's what-if of
    budget.slo_ttft_p95_ms=3000 read interactive attainment 0.731 -> 0.864, partly because the
    bar moved from 2 s to 3 s, and nothing beside the table said the columns used two bars."""
    window = load_window(_journal(tmp_path, n=100, duration=20.0))
    moved = proposal_from_set("budget.slo_ttft_p95_ms=3000", window.config)
    same = proposal_from_set("classes.batch.queue_depth=4", window.config)
    answer = run_replay(window, [moved, same])
    said = [n for n in answer["notes"] if "slo_attainment" in n]
    assert len(said) == 1 and said[0].startswith("budget.slo_ttft_p95_ms=3000: its slo_attainment is judged against"), said
    assert "3000 ms" in said[0] and "2000 ms" in said[0]
    assert answer["scenarios"][2]["classes"]["interactive"]["slo_objective_ms"] == 3000.0


def test_a_recorded_retune_of_a_class_s_ttft_objective_is_replayed() -> None:
    """The live retune sets a class's own ttft_objective_ms (and "slo": None hands it back): the
    replay applies both as the gate did, so a loosened objective refuses fewer as late."""
    from gate.tools.replay.engine import Change

    arrivals = synthetic_arrivals(300, 20.0, seed=7)

    def refused_late(changes: list[Change]) -> int:
        outcomes = replay(CONFIG, FIT, arrivals, changes, until=21.0)
        return sum(1 for a in arrivals if a.cls == "batch" and not outcomes[a.id].admitted and outcomes[a.id].reason == "queue_timeout")

    loose = [Change(0.5, "set_class", "class:batch", "ttft_objective_ms=60000")]
    handed_back = [*loose, Change(1.0, "set_class", "class:batch", "ttft_objective_ms=None")]
    held = refused_late([])  # batch held to the example's 2 s SLO
    assert refused_late(loose) < held / 2  # 17 of 83 against 79 (seed 7)
    assert refused_late(handed_back) == held


def test_a_recorded_retune_of_the_controller_s_tuning_is_replayed() -> None:
    """The running gate applies every [budget] tuning key at once (its controller took only the
    SLOs until a restart): the replay does too, or its budget curve parts from the gate's."""
    from gate.tools.replay.engine import Change

    arrivals = synthetic_arrivals(400, 40.0, seed=5)

    def curve(extra: str) -> list[tuple[float, int]]:
        out: list[tuple[float, int]] = []
        changes = [Change(0.5, "set_budget_settings", "budget", f"slo_ttft_p95_ms=10{extra}")]
        replay(CONFIG, FIT, arrivals, changes, until=41.0, budget_curve=out)
        return out

    assert curve("")[:3] == [(0.0, 2048), (6.0, 1638), (11.0, 1310)]  # x0.8 a step
    assert curve(", decrease=0.5") == [(0.0, 2048), (6.0, 1024)]  # x0.5, to the floor at once


def test_a_request_id_a_client_reused_is_replayed_as_the_separate_requests_it_was(tmp_path: Path) -> None:
    """The gate takes a client's X-Request-Id as the request id, so a journal may hold one id on
    many requests (a client that sends the same header each time, or a retry beside its first
    try). Each row is its own arrival: keyed by the id, the replay crashed ("already holds a
    reservation") on two at once, and the recorded column counted one outcome per id."""
    path = _journal(tmp_path, n=120, duration=20.0, seed=3)
    fresh = run_replay(load_window(path))
    conn = sqlite3.connect(path)
    admitted = dict(conn.execute("SELECT class, count(*) FROM decisions WHERE outcome = 'admitted' GROUP BY class").fetchall())
    conn.execute("UPDATE decisions SET request_id = 'same-id'")
    conn.commit()
    conn.close()
    window = load_window(path)
    assert len({a.id for a in window.arrivals}) == len(window.arrivals) == 120
    answer = run_replay(window)
    recorded, replayed = answer["scenarios"][0]["classes"], answer["scenarios"][1]["classes"]
    assert {c: f["admitted"] for c, f in recorded.items() if f["admitted"]} == admitted
    assert replayed == fresh["scenarios"][1]["classes"]
    assert recorded == fresh["scenarios"][0]["classes"]


# ---- a drain in the window (a post-incident trial, 2026-12-06) -------------------------------


def test_a_recorded_drain_refuses_the_replayed_queue_and_each_arrival_keeps_an_outcome() -> None:
    # A drain replayed over a queue refused its waiters in the core but gave them no outcome:
    # `tokengate replay` of a journal with a drain mid-burst failed with KeyError: '<request id>'.
    from gate.tools.replay.engine import Change

    arrivals = synthetic_arrivals(300, 10.0, seed=3)
    paused = [Change(2.0, "pause_class", "class:interactive", "True"), Change(6.0, "drain_class", "class:interactive", "0")]
    outs = replay(CONFIG, FIT, arrivals, paused, until=11.0)
    assert set(outs) == {a.id for a in arrivals}
    drained = [o for o in outs.values() if o.reason == "drained"]
    assert drained and not any(o.admitted for o in drained)


def test_a_journal_whose_gate_never_stopped_and_nobody_holds_is_noted(tmp_path: Path) -> None:
    # A copy of a journal a gate was writing (cp tokengate.db, without its -wal), or a gate killed
    # with none after it: no `stopped` row, no lock holder. A trial's copy lacked the last 52
    # decisions, and the replay said nothing.
    path = _journal(tmp_path, n=40, duration=10.0)
    conn = sqlite3.connect(path, isolation_level=None)
    (first,) = conn.execute("SELECT min(ts) FROM decisions").fetchone()
    _audit(conn, (first - 1.0, "gate", "started", "gate", "0.1.0"))
    conn.close()
    said = "without its gate's 'stopped' row and no gate holds it"
    assert any(said in n for n in load_window(path).notes)
    # a window that ends well before the journal does lost nothing to it
    assert not any(said in n for n in load_window(path, until=first + 2.0).notes)
    conn = sqlite3.connect(path, isolation_level=None)
    (last,) = conn.execute("SELECT max(ts) FROM decisions").fetchone()
    _audit(conn, (last + 30.0, "gate", "stopped", "gate", ""))
    conn.close()
    assert not any(said in n for n in load_window(path).notes)  # it stopped cleanly


def test_the_backend_model_line_counts_one_request_in_the_singular() -> None:
    # a trial's window with one completed request read "... per busy slot (1 requests)"
    from gate.tools.replay.report import model_line

    one = dataclasses.replace(FIT, points=1)
    assert model_line(dataclasses.asdict(one)).endswith("per busy slot (1 request)")
    assert model_line(dataclasses.asdict(dataclasses.replace(FIT, points=32))).endswith("per busy slot (32 requests)")


def test_an_until_past_the_journals_last_decision_ends_the_window_just_after_it(tmp_path: Path) -> None:
    """A trial's `--until 2027-01-01T00:00Z` (a typo'd or future moment) replayed a window of
    2.2e6 s: tokens_per_s 0.000 recorded and replayed with a 0% error, and the budget curve one
    column wide. The time after the last decision holds no arrival; it ends the window just after
    that decision, as the review's what-if does and as no --until does, and a note says so."""
    path = _journal(tmp_path, n=80, duration=10.0)
    lo, hi = sqlite3.connect(path).execute("SELECT min(ts), max(ts) FROM decisions").fetchone()
    plain = load_window(path, since=lo + 1.0)
    late = load_window(path, since=lo + 1.0, until=hi + 30 * 86400.0)
    assert late.until == plain.until and late.duration_s == plain.duration_s
    (said,) = [n for n in late.notes if "after the journal's last decision" in n]
    assert "the window ends just after it" in said
    assert not any("after the journal's last decision" in n for n in plain.notes)
    a, b = run_replay(plain, []), run_replay(late, [])
    for cls, figs in a["scenarios"][0]["classes"].items():
        assert figs["tokens_per_s"] > 0
        assert b["scenarios"][0]["classes"][cls]["tokens_per_s"] == figs["tokens_per_s"]


def test_a_config_with_another_default_class_says_it_is_not_replayed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--set default_class=batch` is refused (each arrival keeps its recorded class); a trial's
    `--config` whose default_class was batch replayed silently as if it had changed something
    (its `changes` listed default_class, its column equalled the replayed one)."""
    path = _journal(tmp_path, n=40, duration=10.0)
    other = tmp_path / "batch-default.toml"
    other.write_text(EXAMPLE_CONFIG.replace('default_class = "interactive"', 'default_class = "batch"', 1))
    assert 'default_class = "batch"' in other.read_text()
    assert main(["replay", "--journal", path, "--format", "json", "--config", str(other)]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert any("batch-default.toml" in n and "default_class" in n and "keeps the class it was recorded with" in n for n in answer["notes"])
    assert "default_class" not in answer["scenarios"][2]["changes"]
    same = tmp_path / "same.toml"
    same.write_text(EXAMPLE_CONFIG)
    assert main(["replay", "--journal", path, "--format", "json", "--config", str(same)]) == 0
    assert not any("default_class" in n for n in json.loads(capsys.readouterr().out)["notes"])


def test_failed_requests_are_labelled_failed_never_refused(tmp_path: Path) -> None:
    """A user's trial read the table's `refused upstream_error` as requests the gate refused,
    where the backend had failed them. A request journaled `failed` was admitted, then broke: the
    table's row is `failed REASON` and the JSON's `failed` map counts it (beside `admitted`, which
    still does); `refused` keeps its meaning (a backend's own 4xx or 501 is a refusal, as journaled)."""
    path = _journal(tmp_path, n=60, duration=20.0)
    with sqlite3.connect(path) as conn:
        ids = [r[0] for r in conn.execute("SELECT id FROM decisions WHERE outcome = 'admitted' AND class = 'interactive' LIMIT 3")]
        conn.execute(
            f"UPDATE decisions SET outcome = 'failed', reason = 'upstream_error', http_status = 500 WHERE id IN ({','.join('?' * len(ids))})",
            ids,
        )
        one = conn.execute("SELECT id FROM decisions WHERE outcome = 'admitted' AND class = 'interactive' LIMIT 1").fetchone()[0]
        conn.execute("UPDATE decisions SET outcome = 'refused', reason = 'upstream_error', http_status = 501 WHERE id = ?", (one,))
    window = load_window(path)
    answer = run_replay(window, [])
    recorded, replayed = (json.loads(to_json(answer))["scenarios"][i]["classes"]["interactive"] for i in (0, 1))
    assert recorded["failed"] == replayed["failed"] == {"upstream_error": 3}
    assert recorded["refused"].get("upstream_error") == 1  # the 501: the backend refused it
    assert recorded["admitted"] == recorded["arrivals"] - sum(recorded["refused"].values())  # the failed were admitted
    table = to_table(answer)
    failed_rows = [line.split() for line in table.splitlines() if line.startswith("interactive") and " failed " in line]
    assert failed_rows == [["interactive", "failed", "upstream_error", "3", "3", "0%"]], table
    refused_rows = [line.split() for line in table.splitlines() if line.startswith("interactive") and " refused " in line]
    assert ["interactive", "refused", "upstream_error", "1", "1", "0%"] in refused_rows, table


def test_a_class_objective_set_to_slo_goes_back_to_the_budget_slo_as_in_the_live_retune_form() -> None:
    """The live retune form writes `slo` for a class held to [budget] slo_ttft_p95_ms; the
    what-if and --set wanted `none` ("must be a number, got string", a trial)."""
    own = parse_config(EXAMPLE_CONFIG.replace("[classes.interactive]", "[classes.interactive]\nttft_objective_ms = 6000"))
    assert own.class_by_name("interactive").ttft_objective_ms == 6000
    for word in ("slo", "SLO", "none"):
        p = proposal_from_set(f"classes.interactive.ttft_objective_ms={word}", own)
        assert p.config.class_by_name("interactive").ttft_objective_ms is None
        assert p.config.objective_ms("interactive") == own.budget.slo_ttft_p95_ms
    with pytest.raises(ValueError, match="at most a day"):
        proposal_from_set("budget.slo_ttft_p95_ms=1e308", own)  # it stopped at OverflowError in the engine
    with pytest.raises(ValueError):
        proposal_from_set("classes.interactive.queue_depth=slo", own)  # `slo` means the SLO for an objective only


# ---- a user's trial: thresholds retuned before the window (findings 1 and 3)


def _retuned_before(tmp_path: Path, *rows: tuple[float, str, str, str, str], name: str = "before") -> tuple[str, float]:
    """A journal with audit rows `rows` (ts from its first decision), and a moment 3 s after its
    first decision (a window's start after them)."""
    path = _journal(tmp_path, n=200, duration=20.0, name=name)
    _audit_after_first(path, *rows)
    first = _decision_times(path)[0]
    return path, first + 3.0


def test_a_proposal_is_compared_with_the_thresholds_in_force_at_the_windows_start(tmp_path: Path) -> None:
    """A trial: interactive's queue_depth retuned 64 -> 1 before the window; `--set
    classes.interactive.queue_depth=64` ("what if I had not retuned?") was compared with the
    gate's start config (64), pinned nothing and replayed the retune: "changes": [], the column
    the replayed one, nothing said. It pins 64 over the retune now, and a --set of the value in
    force (1) says that it changes nothing."""
    path, since = _retuned_before(tmp_path, (1.0, "console", "set_class", "class:interactive", "queue_depth=1"))
    window = load_window(path, since=since)
    assert window.config.class_by_name("interactive").queue_depth == 1  # in force at the window's start
    assert window.start_config.class_by_name("interactive").queue_depth == 64  # the gate's start
    undone = proposal_from_set("classes.interactive.queue_depth=64", window.config)
    kept = proposal_from_set("classes.interactive.queue_depth=1", window.config)
    assert undone.pinned == frozenset({"classes.interactive.queue_depth"}) and not kept.pinned
    answer = run_replay(window, [undone, kept])
    replayed, col_undone, col_kept = answer["scenarios"][1:]
    assert col_undone["changes"] == ["classes.interactive.queue_depth"] and col_kept["changes"] == []
    assert col_undone["classes"] != replayed["classes"] and col_kept["classes"] == replayed["classes"]
    # "what if I had not retuned" is the window replayed without the retune
    without = dataclasses.replace(
        window, config=window.start_config, started=None, changes=tuple(c for c in window.changes if c.action != "set_class")
    )
    assert col_undone["classes"] == run_replay(without)["scenarios"][1]["classes"]
    (said,) = [n for n in answer["notes"] if n.endswith("so it changes nothing")]
    assert said == (
        "classes.interactive.queue_depth=1 is the value in force at the window's start (the gate started with 64: "
        "a change before the window set it), so it changes nothing"
    ), said
    assert not any(n.startswith("classes.interactive.queue_depth=64") for n in answer["notes"]), answer["notes"]


def test_a_proposal_pins_its_key_over_what_a_restarted_gate_restored_before_the_window(tmp_path: Path) -> None:
    # the same across a gate restart before the window: the new gate put the retune back (its
    # `restored` row), and a --set of the file's value changed nothing
    path, since = _retuned_before(tmp_path, (1.5, "gate", "restored", "classes.interactive.queue_depth", "1"), name="restarted")
    _restart_row(path, _decision_times(path)[0] + 1.0, CONFIG)
    window = load_window(path, since=since)
    assert (
        window.config.class_by_name("interactive").queue_depth == 1 and window.start_config.class_by_name("interactive").queue_depth == 64
    )
    undone = proposal_from_set("classes.interactive.queue_depth=64", window.config)
    answer = run_replay(window, [undone])
    assert answer["scenarios"][2]["changes"] == ["classes.interactive.queue_depth"]
    assert answer["scenarios"][2]["classes"] != answer["scenarios"][1]["classes"]


def test_a_window_begun_in_a_restarts_gap_starts_with_the_overrides_the_new_gate_restored(tmp_path: Path) -> None:
    """A trial's --since fell between the old gate's stop and the new gate's start: the window's
    thresholds were the new gate's bare file, though every request in it met the retune the new
    gate restored at its start (its `restored` row, before any decision)."""
    path = _journal(tmp_path, n=200, duration=20.0, name="gap")
    times = _decision_times(path)
    since = times[100] + 1e-4
    gap = times[101] - since
    _restart_row(path, since + gap / 3, CONFIG)
    conn = sqlite3.connect(path, isolation_level=None)
    _audit(conn, (since + 2 * gap / 3, "gate", "restored", "classes.interactive.queue_depth", "1"))
    conn.close()
    window = load_window(path, since=since)
    assert window.config.class_by_name("interactive").queue_depth == 1, window.config.class_by_name("interactive")
    (said,) = [
        n
        for n in run_replay(window, [proposal_from_set("classes.interactive.queue_depth=1", window.config)], jobs=1)["notes"]
        if n.endswith("so it changes nothing")
    ]
    assert said.startswith("classes.interactive.queue_depth=1 is the value in force at the window's start"), said


def test_the_thresholds_at_the_windows_end_follow_its_changes_and_restarts(tmp_path: Path) -> None:
    """`Window.config_at_end`: what the what-if's apply compares the running gate with (a change
    in the window is replayed as recorded: the gate running it does not differ from the replay)."""
    path = _journal(tmp_path, n=200, duration=20.0, name="end")
    first = _decision_times(path)[0]
    _audit_after_first(path, (8.0, "console", "set_class", "class:interactive", "queue_depth=3"))
    window = load_window(path, since=first + 5.0)
    assert window.config.class_by_name("interactive").queue_depth == 64
    assert window.config_at_end.class_by_name("interactive").queue_depth == 3
    _restart_row(path, first + 12.0, SMALL)  # a restart after it: the new gate's file
    window = load_window(path, since=first + 5.0)
    assert window.config_at_end.class_by_name("interactive").queue_depth == SMALL.class_by_name("interactive").queue_depth
    assert window.config_at_end.budget.mode == "static"


def test_a_budget_held_by_hand_at_the_windows_start_is_the_forms_token_budget(tmp_path: Path) -> None:
    """A trial froze the controller and set 1200 by hand before the window: the what-if form
    showed backend.token_budget at the pool (2048), and the apply's confirmation said
    "backend.token_budget 1200 (replayed with 2048)" of a replay that ran at 1200."""
    from gate.tools.replay import Change
    from gate.tools.replay.engine import budget_held_at
    from gate.tools.replay.report import settable

    adaptive = CONFIG
    assert adaptive.budget.mode == "adaptive"
    set_1200 = Change(-5.0, "set_budget", "backend:default", "1200")
    freeze = Change(-4.0, "freeze", "controller", "True")
    assert budget_held_at(adaptive, [set_1200]) == (False, None)  # the controller moves it on
    assert budget_held_at(adaptive, [set_1200, freeze]) == (True, None)  # held where the controller left it
    assert budget_held_at(adaptive, [freeze, set_1200]) == (True, 1200)
    unfreeze = Change(3.0, "unfreeze", "controller", "False")
    assert budget_held_at(adaptive, [freeze, set_1200, unfreeze]) == (True, 1200)  # in the window: not at its start
    assert budget_held_at(adaptive, [freeze, set_1200, unfreeze], upto=math.inf) == (False, None)
    restart = Change(6.0, "config_in_force", "gate", thresholds_json(SMALL))  # static: held at its budget
    assert budget_held_at(adaptive, [freeze, set_1200, restart], upto=math.inf) == (True, None)
    assert budget_held_at(adaptive, [freeze, set_1200, Change(-1.0, "overrides_dropped", "overrides", None)]) == (False, None)
    # the controller's state as the what-if's apply compares it with the gate's
    from gate.tools.replay.engine import controller_state_at

    assert controller_state_at(adaptive, [set_1200]) == "adaptive" and controller_state_at(SMALL, []) == "static"
    assert controller_state_at(adaptive, [freeze, set_1200, unfreeze]) == "frozen"
    assert controller_state_at(adaptive, [freeze, set_1200, unfreeze], upto=math.inf) == "adaptive"
    assert controller_state_at(adaptive, [freeze, restart], upto=math.inf) == "static"

    path, since = _retuned_before(
        tmp_path, (1.0, "console", "freeze", "controller", "True"), (1.2, "console", "set_budget", "backend:default", "1200"), name="hand"
    )
    window = load_window(path, since=since)
    held = window.held_budget()
    assert held is not None and held == [b for t, b in window.budget_curve if t >= 0][0]
    assert ("backend.token_budget", str(held)) in settable(window.config, window.fit.ceiling, held)
    assert window.controller_state() == window.controller_state(at_end=True) == "frozen"


def test_the_thresholds_in_force_at_the_start_are_what_the_engine_has_there() -> None:
    """`in_force_at_start` folds the changes before the window as the engine applies them at its
    start: replaying the gate's start config with them is replaying the folded config without them."""
    from gate.tools.replay import Change
    from gate.tools.replay.engine import in_force_at_start

    arrivals = synthetic_arrivals(200, 20.0, seed=5)
    before = [
        Change(-9.0, "reload", "classes.batch.queue_depth", "2"),
        Change(-8.0, "set_class", "class:interactive", "queue_depth=3, queue_timeout_s=2.5"),
        Change(-7.0, "set_budget_settings", "budget", "slo_ttft_p95_ms=1500"),
        Change(-6.0, "overrides_dropped", "overrides", None),  # back to the file: the reload stays
        Change(-5.0, "set_class", "class:interactive", "queue_depth=5"),
        Change(-4.0, "restored", "budget.aging_s", "2"),
    ]
    folded = in_force_at_start(CONFIG, before)
    assert folded.class_by_name("batch").queue_depth == 2 and folded.class_by_name("interactive").queue_depth == 5
    assert folded.class_by_name("interactive").queue_timeout_s == CONFIG.class_by_name("interactive").queue_timeout_s  # dropped
    assert folded.budget.slo_ttft_p95_ms == CONFIG.budget.slo_ttft_p95_ms and folded.budget.aging_s == 2
    assert replay(CONFIG, FIT, arrivals, before, until=21.0) == replay(folded, FIT, arrivals, [], until=21.0)


def test_two_proposals_are_refused_as_no_change_only_when_they_change_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # a trial's two proposals at the gate's start values of keys retuned before the window were
    # refused as "the same thresholds": both were silently no change
    path, since = _retuned_before(
        tmp_path,
        (1.0, "console", "set_class", "class:interactive", "queue_depth=1"),
        (1.2, "console", "set_class", "class:batch", "queue_depth=2"),
    )
    window = ["replay", "--journal", path, "--since", str(since), "--format", "json"]
    assert main([*window, "--set", "classes.interactive.queue_depth=64", "--set", "classes.batch.queue_depth=256"]) == 0
    scenarios = json.loads(capsys.readouterr().out)["scenarios"]
    assert [s["changes"] for s in scenarios[2:]] == [["classes.interactive.queue_depth"], ["classes.batch.queue_depth"]]
    assert main([*window, "--set", "classes.interactive.queue_depth=1", "--set", "classes.batch.queue_depth=2"]) == 2
    err = capsys.readouterr().err
    assert "classes.interactive.queue_depth=1 and classes.batch.queue_depth=2 both change nothing" in err, err


def test_slo_attainment_is_judged_against_the_objective_in_force_at_the_windows_start(tmp_path: Path) -> None:
    """A trial: the SLO (the bar of classes without their own objective) was retuned from 2 s to
    0.5 s before the window; slo_attainment, and the objective the answer shows, were the gate's
    start 2 s. It is the 0.5 s in force at the window's start now, in the recorded and replayed
    columns alike, and a note says which bar that is beside the gate's start one."""
    path, since = _retuned_before(tmp_path, (1.0, "console", "set_budget_settings", "budget", "slo_ttft_p95_ms=500"), name="slo")
    window = load_window(path, since=since)
    back = proposal_from_set("budget.slo_ttft_p95_ms=2000", window.config)  # the gate's start SLO: a proposal
    answer = run_replay(window, [back])
    recorded, replayed, proposed = answer["scenarios"][:3]
    for cls in ("interactive", "batch"):
        assert recorded["classes"][cls]["slo_objective_ms"] == replayed["classes"][cls]["slo_objective_ms"] == 500.0
        assert proposed["classes"][cls]["slo_objective_ms"] == 2000.0
        mine = [a for a in window.arrivals if a.cls == cls]
        met = sum(1 for a in mine if a.outcome not in ("refused", "shed") and a.ttft_arrival_ms is not None and a.ttft_arrival_ms <= 500.0)
        assert recorded["classes"][cls]["slo_attainment"] == round(met / len(mine), 4)
    assert (
        recorded["classes"]["interactive"]["slo_attainment"]
        < run_replay(load_window(path))["scenarios"][0]["classes"]["interactive"]["slo_attainment"]
    )
    (said,) = [n for n in answer["notes"] if "TTFT objective was changed" in n]
    assert said == (
        "a TTFT objective was changed between the gate's start and the window: slo_attainment is judged against the "
        "objectives in force at the window's start, batch 500 ms (the gate started with 2000 ms), interactive 500 ms "
        "(the gate started with 2000 ms), in every column"
    ), said
    (bar,) = [n for n in answer["notes"] if "its own TTFT objectives" in n]
    assert "2000 ms (recorded, replayed: 500 ms, in force at the window's start)" in bar, bar
    # from the gate's start, nothing was in force before the window: no such note
    assert not any("TTFT objective was changed" in n for n in run_replay(load_window(path))["notes"])


def _fit_rows(prompts: list[int], ttft_ms: list[float]) -> list[dict[str, object]]:
    """Completed requests one after another (each alone on the backend), as fit_backend reads them."""
    return [
        {"ts": 10.0 * i, "outcome": "admitted", "queue_ms": 0.0, "ttft_ms": t, "duration_ms": t + 200.0, "completion_tokens": 5,
         "prompt_tokens": p, "reserved_tokens": p + 5}
        for i, (p, t) in enumerate(zip(prompts, ttft_ms, strict=True))
    ]  # fmt: skip


def test_the_prefill_fit_note_says_why_each_fallback_happened() -> None:
    """A trial's note read "prefill rate not separable (prompt sizes barely vary)" where the
    prompts varied 53-474 tokens: the fit had come out with a negative slope. Each fallback says
    its own reason now."""
    from gate.tools.replay import fit_backend

    samples = [{"slots_total": 4, "budget": 2048}]

    def note(prompts: list[int], ttft_ms: list[float]) -> str:
        fit = fit_backend(_fit_rows(prompts, ttft_ms), samples, CONFIG, 0.0)  # type: ignore[arg-type]
        (said,) = [n for n in fit.notes if n.startswith("prefill rate not separable")]
        return said

    varied = [53 + 22 * i for i in range(20)][:-1] + [474]
    falling = note(varied, [400.0 - 0.5 * p for p in varied])  # TTFT falls as the prompt grows
    assert "barely vary" not in falling and "53-474 prompt tokens" in falling, falling
    assert "TTFT did not grow with the prompt: the fitted slope is -500.00 ms per 1,000 tokens" in falling, falling
    below = note(varied, [p - 40.0 for p in varied])  # a line that would start below 0 ms
    assert "over 53-474 prompt tokens prefilling at dispatch, the fit's TTFT base came out negative (-40 ms)" in below, below
    same = note([100 + i for i in range(20)], [50.0 + i for i in range(20)])
    assert "the prompt tokens prefilling at each dispatch barely vary: 100-119, under 64 apart" in same, same
    few = note([53, 200, 474, 90, 300], [60.0, 90.0, 150.0, 70.0, 110.0])
    assert "only 5 completed requests: 8 are needed to separate a prefill rate" in few, few
    # a line that rises with the prompt is fitted: no note
    fit = fit_backend(_fit_rows(varied, [20.0 + 0.5 * p for p in varied]), samples, CONFIG, 0.0)  # type: ignore[arg-type]
    assert fit.prefill_tps == pytest.approx(2000.0) and not any("prefill rate" in n for n in fit.notes)


def test_a_time_of_day_until_before_since_is_read_on_since_s_day(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trial at 13:45: `--since 13:43:05 --until 13:50` read --until as yesterday's (a time of
    day later than now is yesterday's: a rule meant for --since) and was refused, "the window
    would run from 2026-12-07T13:43:05 to 2026-12-06T13:50:00 (a duration is ...)". It is read
    on --since's day, and trimmed to the last decision as the README promises."""
    start = 1_800_000_000.0  # 2027-01-15T08:00:00Z
    arrivals = synthetic_arrivals(60, 20.0, seed=2)
    _, outcomes = recorded_by_model(CONFIG, FIT, arrivals)
    path = str(tmp_path / "today.db")
    write_journal(path, CONFIG, FIT, arrivals, outcomes, start=start)
    now = start + 60.0  # 08:01:00
    monkeypatch.setattr("time.time", lambda: now)
    assert main(["replay", "--journal", path, "--since", "08:00:05", "--until", "08:05", "--format", "json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["since"] == start + 5.0 and answer["until"] < start + 25.0
    assert any("is after the journal's last decision" in n for n in answer["notes"]), answer["notes"]
    assert main(["log", "--journal", path, "--since", "08:00:05", "--until", "08:05", "--format", "json"]) == 0
    assert capsys.readouterr().out.count("\n") > 10
    # an --until that is not after --since even on its day: the hint is the rule for times of day
    assert main(["replay", "--journal", path, "--since", "08:00:05", "--until", "07:30"]) == 2
    err = capsys.readouterr().err
    assert "the window would run from 2027-01-15T08:00:05.000Z to 2027-01-15T07:30:00.000Z" in err, err
    assert "an --until time of day that would fall before --since is read on --since's day" in err and "a duration" not in err, err
    from gate.journal.export import parse_since, window_moments

    since, until = parse_since("08:00:05", now), parse_since("08:05", now)
    assert until == start + 300.0 - 86400.0  # alone, a time of day later than now is yesterday's
    assert window_moments(since, until) == (start + 5.0, start + 300.0)
    # across midnight: 23:50 is yesterday's (later than now), 00:10 today's, after it: as read
    assert window_moments(parse_since("23:50", now), parse_since("00:10", now)) == (start - 8 * 3600 - 600, start - 8 * 3600 + 600)


def journal_at_0800(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A journal of 20 s from 2027-01-15 08:00:00 UTC, read at 08:01:00 (the clock pinned)."""
    start = 1_800_000_000.0  # 2027-01-15T08:00:00Z
    arrivals = synthetic_arrivals(60, 20.0, seed=2)
    _, outcomes = recorded_by_model(CONFIG, FIT, arrivals)
    path = str(tmp_path / "today.db")
    write_journal(path, CONFIG, FIT, arrivals, outcomes, start=start)
    monkeypatch.setattr("time.time", lambda: start + 60.0)  # 08:01:00 UTC
    return path


def test_a_time_of_day_read_as_yesterday_is_said_so_where_the_window_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trial: `--since 19:30 --until 19:31` given before 19:30 UTC (a local 19:3x) was read as
    yesterday's, as documented, and the error printed "2026-12-06T19:31" without saying it was
    taken as yesterday, nor that a time of day is UTC."""
    path = journal_at_0800(tmp_path, monkeypatch)
    assert main(["replay", "--journal", path, "--since", "08:30", "--until", "08:31"]) == 1
    err = capsys.readouterr().err
    assert "no decisions before --until 2027-01-14T08:31:00.000Z" in err, err
    said = (
        "tokengate replay: --since 08:30 and --until 08:31 were read as yesterday's (2027-01-14): a time of day is UTC, "
        "and one later than now (08:01:00 UTC) is yesterday's; give an ISO-8601 time for another day"
    )
    assert said in err, err
    # one of them: --until alone ...
    assert main(["replay", "--journal", path, "--since", "2027-01-14T08:00Z", "--until", "08:31"]) == 1
    assert "tokengate replay: --until 08:31 was read as yesterday's (2027-01-14)" in capsys.readouterr().err
    # ... and an --until moved onto --since's day is not (here today's: no decision after 08:30)
    assert main(["replay", "--journal", path, "--since", "2027-01-15T08:30Z", "--until", "08:31"]) == 1
    assert "yesterday" not in capsys.readouterr().err
    assert main(["replay", "--journal", path, "--since", "07:59", "--until", "08:31", "--format", "json"]) == 0
    assert "yesterday" not in capsys.readouterr().err
    # log: an empty selection says it too
    assert main(["log", "--journal", path, "--since", "08:30", "--until", "08:31", "--format", "json"]) == 0
    assert "tokengate log: --since 08:30 and --until 08:31 were read as yesterday's (2027-01-14)" in capsys.readouterr().err


def test_a_number_with_a_leading_zero_is_said_to_be_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A trial's `--set classes.batch.queue_depth=05` read "must be an integer, got string "05""."""
    path = _journal(tmp_path, n=20, duration=5.0)
    assert main(["replay", "--journal", path, "--set", "classes.batch.queue_depth=05"]) == 2
    err = capsys.readouterr().err
    assert 'must be an integer, got "05", a number with a leading zero, which TOML does not allow: write 5' in err, err
    config = tmp_path / "gate.toml"
    config.write_text(EXAMPLE_CONFIG)
    assert main(["config", "set", str(config), "budget.slo_ttft_p95_ms=-02.5"]) == 2
    assert 'got "-02.5", a number with a leading zero, which TOML does not allow: write -2.5' in capsys.readouterr().err
    assert config.read_text() == EXAMPLE_CONFIG


def test_the_error_near_zero_is_one_rule_for_every_kind_of_figure(tmp_path: Path) -> None:
    """A trial: queue_wait_p50_ms 0.100 -> 0.000 read 10% (0.1 ms over a 1 ms floor) beside
    0 -> 8 refusals at 800% (over a 1-request floor), and asked "denominator floored at 1?". The
    floor of each kind is four steps of noise (2.5 ms, 1 request, 0.01 of attainment, 1 token/s),
    so one step off zero is the 25% bound and two are over it, for every kind; each calibration
    entry names its floor, and the table says how the error is taken."""
    from gate.tools.replay import calibration, untrusted

    rec = {
        "c": {
            "queue_wait_p50_ms": 0.1,
            "ttft_p50_ms": 0.0,
            "slo_attainment": 0.0,
            "tokens_per_s": 0.0,
            "admitted": 0,
            "refused": {"queue_full": 0, "queue_timeout": 0},
        }
    }
    rep = {"c": {"queue_wait_p50_ms": 0.0, "ttft_p50_ms": 5.0, "slo_attainment": 0.01, "tokens_per_s": 1.0, "admitted": 1,
                 "refused": {"queue_full": 8, "queue_timeout": 1}}}  # fmt: skip
    cal = calibration(rec, rep)
    assert cal["c.queue_wait_p50_ms"]["error"] == 0.01 and cal["c.queue_wait_p50_ms"]["floor"] == 10.0
    assert cal["c.refused.queue_full"]["error"] == 2.0 and cal["c.refused.queue_full"]["floor"] == 4.0
    # one step of noise off zero: the bound, trusted; two steps: over it, for each kind alike
    assert [cal[f"c.{k}"]["error"] for k in ("admitted", "refused.queue_timeout", "slo_attainment", "tokens_per_s")] == [0.25] * 4
    assert cal["c.ttft_p50_ms"]["error"] == 0.5 and untrusted(cal) == ["c.refused.queue_full", "c.ttft_p50_ms"]
    answer = run_replay(load_window(_journal(tmp_path, n=40, duration=10.0)))
    assert all(v["floor"] in (10.0, 4.0, 0.04) for v in answer["calibration"].values())
    legend = "error = |replayed - recorded| / max(|recorded|, floor); floors 10 ms, 4 requests, 0.04 of attainment, 4 tokens/s"
    assert legend in to_table(answer)


def test_a_ttft_percentile_is_untrusted_with_its_queue_wait() -> None:
    """A trial: interactive ttft_p50_ms predicted 1,322 ms without '?' (the gate then measured
    545), built on a queue_wait_p50_ms of 1,111 marked '?' at 38%. TTFT is taken from arrival,
    so it holds the wait: marked with it, at the same percentile only, in `untrusted`, the
    table's '?' and its dimmed rows."""
    from gate.tools.replay import calibration, table_cells, untrusted

    rec = {"interactive": {"queue_wait_p50_ms": 800.0, "queue_wait_p95_ms": 1000.0, "ttft_p50_ms": 1200.0, "ttft_p95_ms": 1500.0}}
    # the wait's p50 38% off; the TTFT's p50 only 10% (its prefill part fitted well), the p95s close
    rep = {"interactive": {"queue_wait_p50_ms": 1104.0, "queue_wait_p95_ms": 1010.0, "ttft_p50_ms": 1320.0, "ttft_p95_ms": 1510.0}}
    cal = calibration(rec, rep)
    assert cal["interactive.ttft_p50_ms"]["error"] == 0.1
    assert untrusted(cal) == ["interactive.queue_wait_p50_ms", "interactive.ttft_p50_ms"]
    answer = {"scenarios": [{"classes": rec}, {"classes": rep, "untrusted": untrusted(cal)}], "calibration": cal}
    marked = {cells[1]: (cells[3], dim) for cells, dim in table_cells(answer)[1] if cells[1] != "admitted"}
    assert marked["ttft_p50_ms"] == ("1320?", True) and marked["ttft_p95_ms"] == ("1510", False), marked


def test_the_bound_is_judged_on_the_error_as_shown() -> None:
    """A trial's table: "batch admitted 4 3 25%" unmarked, "batch slo_attainment 0.067 0.050?
    25%" marked: 0.017 / 0.067 is 25.4%, over the bound, shown as 25%. The bound is judged on
    the percent shown, so one shown error is marked one way, in the table and in `untrusted`."""
    from gate.tools.replay import calibration, table_cells, untrusted
    from gate.tools.replay.report import budget_calibration

    rec = {"batch": {"admitted": 4, "slo_attainment": 0.067, "ttft_p50_ms": 1000.0, "tokens_per_s": 100.0, "refused": {}}}
    # 25.4% (shown 25%), 25.5% (shown 26%), 24.5% (shown 24%: as the table printed it, half to even)
    rep = {"batch": {"admitted": 3, "slo_attainment": 0.05, "ttft_p50_ms": 1255.0, "tokens_per_s": 124.5, "refused": {}}}
    cal = calibration(rec, rep)
    answer = {"scenarios": [{"classes": rec}, {"classes": rep, "untrusted": untrusted(cal)}], "calibration": cal}
    shown = {cells[1]: (cells[4], cells[3].endswith("?"), dim) for cells, dim in table_cells(answer)[1]}
    assert shown == {
        "admitted": ("25%", False, False),
        "slo_attainment": ("25%", False, False),
        "ttft_p50_ms": ("26%", True, True),
        "tokens_per_s": ("24%", False, False),
        **{f: ("-", False, False) for f in ("queue_wait_p50_ms", "queue_wait_p95_ms", "ttft_p95_ms")},
    }, shown
    assert untrusted(cal) == ["batch.ttft_p50_ms"]
    # every shown percent around the bound: marked exactly when it reads over 25%
    for i in range(2300, 2800):
        cal = calibration({"c": {"admitted": 10000}}, {"c": {"admitted": 10000 + i}})
        answer = {
            "scenarios": [{"classes": {"c": {"admitted": 10000}}}, {"classes": {"c": {"admitted": 10000 + i}}, "untrusted": untrusted(cal)}]
        }
        cells, marked = table_cells({**answer, "calibration": cal})[1][0]
        assert marked == (int(cells[4].rstrip("%")) > 25), (i, cells)
    # the budget curve's mean is trusted by the same rule
    assert budget_calibration([[0, 1000]], [[0, 1254]], 10.0)["trusted"]
    assert not budget_calibration([[0, 1000]], [[0, 1255]], 10.0)["trusted"]


def test_an_estimated_prompt_too_long_for_a_slot_is_not_replayed_as_too_long(tmp_path: Path) -> None:
    """A trial's overload window: most refusals came at arrival, before llama-server counted
    the prompt, so the journal holds the gate's estimate, which can exceed what the request
    really was. Replayed as it stands, 8 batch requests recorded as queue_timeout were refused
    context_length_exceeded and the figures moved (untrusted 800%). An estimate not refused for
    its size is taken as the most that fits a slot, and a note says how many prompts are
    estimates. Negative control: with the same rows marked exact, the replay keeps the sizes."""
    path = _journal(tmp_path, n=60, duration=10.0)
    slot = load_window(path).fit.slot_context
    conn = sqlite3.connect(path, isolation_level=None)
    ids = [r[0] for r in conn.execute("SELECT id FROM decisions WHERE reason != 'context_length_exceeded' ORDER BY ts LIMIT 5")]
    marks = ",".join(map(str, ids))
    conn.execute(f"UPDATE decisions SET prompt_tokens = ? + 100, token_count_source = 'estimate' WHERE id IN ({marks})", (slot,))
    conn.close()
    window = load_window(path)
    longest = {a.prompt_tokens + a.max_tokens for a in window.arrivals if a.through_core}
    assert max(longest) <= slot, (max(longest), slot)
    said = [n for n in window.notes if "refused before llama-server counted them" in n]
    assert said and "5 of these estimates would not fit a slot" in said[0], window.notes
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(f"UPDATE decisions SET token_count_source = 'exact' WHERE id IN ({marks})")
    conn.close()
    exact = load_window(path)
    assert sum(1 for a in exact.arrivals if a.prompt_tokens == slot + 100) == 5  # counted: as recorded
    assert not any("refused before llama-server counted them" in n for n in exact.notes)


def test_a_paused_class_is_refused_as_paused_whatever_its_size_as_the_gate_refuses_it_before_its_count() -> None:
    # A what-if trial: live, a batch request that would never fit a budget of 900 got 503
    # class_paused (the gate asks before the count, the prompt as 0); replayed it was
    # context_length_exceeded, and a proposal moved class_paused 21 -> 14 and that 0 -> 7.
    from gate.tools.replay import Change

    arrivals = [
        dataclasses.replace(a, prompt_tokens=250, max_tokens=100) for a in synthetic_arrivals(200, 20.0, seed=6) if a.cls == "batch"
    ][:20]
    unpaused = replay(SMALL, FIT, arrivals, [], until=21.0)
    assert {unpaused[a.id].reason for a in arrivals} == {"context_length_exceeded"}  # 350 never fits batch's reach under 300
    paused = replay(SMALL, FIT, arrivals, [Change(0.0, "pause_class", "class:batch", "True")], until=21.0)
    assert {paused[a.id].reason for a in arrivals} == {"class_paused"}  # was context_length_exceeded


def test_a_time_of_day_read_as_yesterday_is_said_so_when_the_window_replays(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trial at 22:45 UTC: `--since 23:50` was yesterday's 23:50, before the gate's start, so the
    window started there; the only word was the note that it starts at the gate's start, nothing
    that 23:50 had been read as yesterday's."""
    path = journal_at_0800(tmp_path, monkeypatch)
    assert main(["replay", "--journal", path, "--since", "08:30", "--format", "json"]) == 0
    out, err = capsys.readouterr()
    assert any("when the gate that wrote the journal started" in n for n in json.loads(out)["notes"])
    assert "tokengate replay: --since 08:30 was read as yesterday's (2027-01-14): a time of day is UTC, and one later " in err, err
    assert main(["replay", "--journal", path, "--since", "07:59", "--format", "json"]) == 0
    assert "yesterday" not in capsys.readouterr().err


@pytest.mark.parametrize(
    ("moment", "said"),
    [
        ("2026-13-45T00:00Z", "month 13 is not 1 to 12"),
        ("2026-02-30", "day 30 is not in 2026-02 (1 to 28)"),
        ("2026-12-01T24:10Z", "hour 24 is not 0 to 23"),
        ("2026-12-01T23:60", "minute 60 is not 0 to 59"),
    ],
)
def test_a_date_out_of_range_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str], moment: str, said: str) -> None:
    # a trial's `--since 2026-13-45T00:00Z` read only "is not a moment" and the forms, its own among them
    assert main(["replay", "--journal", str(tmp_path / "none.db"), "--since", moment]) == 2
    err = capsys.readouterr().err
    assert f"{moment!r} is not a moment: {said}; give a duration ago" in err, err
