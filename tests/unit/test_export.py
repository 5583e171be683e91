"""gate.export and `tokengate log`: table, JSON Lines and CSV from a real journal file."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import os
import sqlite3
import time
from pathlib import Path

import pytest

from gate.cli import main
from gate.journal import SCHEMA_VERSION, Journal
from gate.journal.export import ExportError, export, iso, parse_since
from gate.journal.queries import DecisionFilters
from gate.journal.reader import JournalReader, export_decisions_csv
from tests.unit.test_journal import audit, decision, sample

NOW = float(int(time.time()))


@pytest.fixture
def journal(tmp_path: Path) -> Path:
    """Decisions at now-3h, now-90min, now-10min; one audit row; two samples."""
    path = tmp_path / "tokengate.db"

    async def fill() -> None:
        j = await Journal.open(path)
        try:
            rows = [
                decision(1, ts=NOW - 3 * 3600, tenant="alice", cls="interactive"),
                decision(
                    2,
                    ts=NOW - 90 * 60,
                    tenant='bob, "the" builder',
                    cls="batch",
                    outcome="refused",
                    reason="queue_full",
                    http_status=429,
                    prompt_tokens=None,
                    queue_ms=None,
                    ttft_ms=None,
                    completion_tokens=None,
                    stream=False,
                ),
                decision(3, ts=NOW - 10 * 60, tenant="carol", cls="interactive"),
                audit(1, ts=NOW - 60),
                sample(1, ts=NOW - 30),
                sample(2, ts=NOW - 29),
            ]
            assert all(await asyncio.gather(*(j.add(r) for r in rows)))
        finally:
            await j.close()

    asyncio.run(fill())
    return path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_json_lines(journal: Path) -> None:
    buf = io.StringIO()
    assert export(str(journal), buf, kind="decisions", fmt="json") == 3
    lines = buf.getvalue().splitlines()
    rows = [json.loads(line) for line in lines]
    assert [r["request_id"] for r in rows] == ["req-1", "req-2", "req-3"]
    first = rows[0]
    assert first["ts"] == NOW - 3 * 3600 and isinstance(first["ts"], float)
    assert first["ts_iso"] == iso(NOW - 3 * 3600) and first["ts_iso"].endswith("Z")
    assert first["class"] == "interactive" and first["stream"] is True
    assert list(first)[:4] == ["id", "ts", "ts_iso", "request_id"]
    assert rows[1]["prompt_tokens"] is None and rows[1]["stream"] is False
    assert rows[1]["tenant"] == 'bob, "the" builder'


def test_csv_parses_with_header(journal: Path) -> None:
    buf = io.StringIO()
    export(str(journal), buf, kind="decisions", fmt="csv")
    rows = list(csv.DictReader(io.StringIO(buf.getvalue())))
    assert len(rows) == 3
    assert rows[0]["ts"] == iso(NOW - 3 * 3600)
    assert rows[1]["tenant"] == 'bob, "the" builder'  # quoting survives
    assert rows[1]["prompt_tokens"] == "" and rows[1]["stream"] == "false"
    assert rows[1]["class"] == "batch" and rows[1]["reason"] == "queue_full"
    assert list(rows[0])[:3] == ["id", "ts", "request_id"]


def test_table_is_aligned(journal: Path) -> None:
    buf = io.StringIO()
    export(str(journal), buf, kind="decisions", fmt="table")
    lines = buf.getvalue().splitlines()
    assert len(lines) == 4
    assert lines[0].split()[:4] == ["id", "ts", "request_id", "tenant"]
    # every row's class column starts where the header's does
    col = lines[0].index("class")
    assert all(line[col:].startswith(("class", "interactive", "batch")) for line in lines)
    assert iso(NOW - 90 * 60) in lines[2]


def test_the_tables_first_token_columns_say_which_time_they_count_from(journal: Path) -> None:
    """The journal's ttft_ms counts from dispatch; the console's "TTFT ms" from arrival (a trial
    read one beside the other for one request: 89 against ~400). CSV keeps the journal's names."""
    buf = io.StringIO()
    export(str(journal), buf, kind="decisions", fmt="table")
    header = buf.getvalue().splitlines()[0].split()
    assert "ttft_ms(dispatch)" in header and "ttft_arrival_ms(arrival)" in header and "ttft_ms" not in header
    buf = io.StringIO()
    export(str(journal), buf, kind="decisions", fmt="csv")
    assert {"ttft_ms", "ttft_arrival_ms"} <= set(next(csv.reader(io.StringIO(buf.getvalue()))))


def test_samples_and_audit(journal: Path) -> None:
    buf = io.StringIO()
    assert export(str(journal), buf, kind="samples", fmt="json") == 2
    first = json.loads(buf.getvalue().splitlines()[0])
    assert first["classes"] == [
        {"cls": "interactive", "in_flight": 2000, "queued": 0},
        {"cls": "batch", "in_flight": 1000, "queued": 2},
    ]
    buf = io.StringIO()
    export(str(journal), buf, kind="samples", fmt="csv")
    rows = list(csv.DictReader(io.StringIO(buf.getvalue())))
    assert json.loads(rows[0]["classes"])[1]["cls"] == "batch"
    buf = io.StringIO()
    assert export(str(journal), buf, kind="audit", fmt="table") == 1
    assert "set_budget" in buf.getvalue()


def test_since_filters(journal: Path) -> None:
    buf = io.StringIO()
    assert export(str(journal), buf, fmt="json", since_ts=parse_since("2h", NOW)) == 2
    buf = io.StringIO()
    assert export(str(journal), buf, fmt="json", since_ts=parse_since("15m", NOW)) == 1


def test_parse_since() -> None:
    assert parse_since("30s", 1000.0) == 970.0
    assert parse_since("15m", 10_000.0) == 10_000.0 - 900
    assert parse_since("2h", 10_000.0) == 10_000.0 - 7200
    assert parse_since("7d", 1e6) == 1e6 - 7 * 86400
    assert parse_since("1.5h", 10_000.0) == 10_000.0 - 5400
    assert parse_since("2025-01-31T14:00:00Z", 0) == 1738332000.0
    assert parse_since("2025-01-31T14:00:00", 0) == 1738332000.0  # naive = UTC
    assert parse_since("2025-01-31T15:00:00+01:00", 0) == 1738332000.0
    with pytest.raises(ValueError, match="duration"):
        parse_since("yesterday", 0)


def test_epoch_milliseconds_are_refused_with_a_hint() -> None:
    # 1796501645000 (milliseconds, as many tools print a time) read as seconds is the year
    # 58898: `tokengate replay --since` crashed on it ("tokengate: error: ValueError: year 58898
    # is out of range", exit 1) and `tokengate log` printed "(no rows)", exit 0 (a user's trial)
    assert parse_since("1796501645", 0) == 1796501645.0
    assert parse_since("1796501645.5", 0) == 1796501645.5
    with pytest.raises(ValueError, match=r"milliseconds\? 1796501645000 ms is 1796501645 s"):
        parse_since("1796501645000", 0)
    with pytest.raises(ValueError, match="milliseconds"):
        parse_since("1796501645000000", 0)  # microseconds: the same answer, not a crash


@pytest.mark.parametrize("command", ["log", "replay"])
def test_log_and_replay_refuse_epoch_milliseconds_as_a_usage_error(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gate.cli import main

    assert main([command, "--journal", str(tmp_path / "any.db"), "--since", "1796501645000"]) == 2
    err = capsys.readouterr().err
    assert "milliseconds" in err and "Traceback" not in err and "ValueError" not in err


@pytest.mark.parametrize("command", ["log", "replay"])
def test_a_minus_duration_after_since_reads_as_ago_not_as_an_option(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], journal: Path
) -> None:
    # `--since -5m` (a trial's guess) was argparse's "expected one argument", exit 2
    from gate.cli import main

    assert parse_since("-15m", 10_000.0) == parse_since("15m", 10_000.0)
    assert main([command, "--journal", str(journal), "--since", "-5m", "--until", "-1s"]) in (0, 1)
    assert "expected one argument" not in capsys.readouterr().err


def test_a_time_of_day_is_utc_today_or_yesterday_when_later_than_now() -> None:
    """`--since 21:10` was refused by `tokengate log` and `tokengate replay` while the console's
    review read `since=23:01` (a trial); now one reading serves all three."""
    from console.screens.review import FilterError, parse_when

    now = 1796594014.0  # 2026-12-06T21:53:34Z
    assert parse_since("21:10", now) == 1796591400.0  # 2026-12-06T21:10:00Z
    assert parse_since("21:10:30", now) == 1796591430.0
    assert parse_since("9:05", now) == 1796547900.0  # 2026-12-06T09:05:00Z
    assert parse_since("23:01", now) == 1796598060.0 - 86400  # later than now: yesterday's
    assert parse_since("21:53:34", now) == now  # now itself is today's
    for text in ("21:10", "23:01", "00:00:01"):
        assert parse_when(text, now) == parse_since(text, now)  # the review's reading is the same
    for bad in ("24:00", "21:60", "21:10:61"):
        with pytest.raises(ValueError, match="not a time of day"):
            parse_since(bad, now)
        with pytest.raises(FilterError, match="not a time of day"):
            parse_when(bad, now)


@pytest.mark.parametrize("command", ["log", "replay"])
def test_log_and_replay_take_a_time_of_day(command: str, capsys: pytest.CaptureFixture[str], journal: Path) -> None:
    today = time.strftime("%H:%M:%S", time.gmtime(time.time() - 1))  # a second ago: today
    code = main([command, "--journal", str(journal), "--since", today])
    err = capsys.readouterr().err
    assert code in (0, 1) and "is not a moment" not in err and "invalid" not in err, err  # 1: replay's empty window
    assert main([command, "--journal", str(journal), "--since", "25:00"]) == 2
    assert "not a time of day" in capsys.readouterr().err
    main([command, "--help"])
    assert "time of day" in " ".join(capsys.readouterr().out.split())  # however the help wraps


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope.db"
    with pytest.raises(ExportError, match="nope.db: journal file not found"):
        export(str(missing), io.StringIO())
    assert not missing.exists()  # read-only: never created


def test_not_a_journal_and_newer_journal(tmp_path: Path) -> None:
    other = tmp_path / "other.db"
    sqlite3.connect(other).close()
    with pytest.raises(ExportError, match="not a tokengate journal"):
        export(str(other), io.StringIO())
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(ExportError, match="garbage.db"):
        export(str(garbage), io.StringIO())
    newer = tmp_path / "newer.db"
    conn = sqlite3.connect(newer)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(ExportError, match="newer"):
        export(str(newer), io.StringIO())


def test_export_never_writes(journal: Path) -> None:
    content, mtime = journal.read_bytes(), os.stat(journal).st_mtime_ns
    export(str(journal), io.StringIO(), fmt="csv")
    assert journal.read_bytes() == content and os.stat(journal).st_mtime_ns == mtime
    # SQLite may create its (empty) coordination files for a WAL journal: private too
    for suffix in ("-wal", "-shm"):
        side = Path(f"{journal}{suffix}")
        if side.exists():
            assert side.stat().st_mode & 0o077 == 0
    wal = Path(f"{journal}-wal")
    assert not wal.exists() or wal.stat().st_size == 0


# ------------------------------------------------------------------------------------------
# The CLI


def test_cli_log_json(journal: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "log", "--journal", str(journal), "--format", "json")
    assert code == 0, err
    assert [json.loads(line)["request_id"] for line in out.splitlines()] == ["req-1", "req-2", "req-3"]


def test_cli_log_defaults_to_a_decisions_table_in_tokengate_db(
    journal: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(journal.parent)
    code, out, err = run(capsys, "log")
    assert code == 0, err
    assert out.splitlines()[0].split()[:2] == ["id", "ts"] and len(out.splitlines()) == 4


def test_cli_log_since_and_kind(journal: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "log", "--journal", str(journal), "--since", "2h", "--format", "csv")
    assert code == 0
    assert len(list(csv.DictReader(io.StringIO(out)))) == 2
    code, out, _ = run(capsys, "log", "--journal", str(journal), "--kind", "audit", "--format", "json")
    assert code == 0 and json.loads(out)["action"] == "set_budget"
    since = iso(NOW - 20 * 60)
    code, out, _ = run(capsys, "log", "--journal", str(journal), "--since", since, "--format", "json")
    assert code == 0 and len(out.splitlines()) == 1


def test_cli_log_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "missing.db"
    code, out, err = run(capsys, "log", "--journal", str(missing))
    assert code == 1
    assert out == ""
    assert str(missing) in err and "not found" in err


def test_cli_log_bad_since_is_a_usage_error(journal: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "log", "--journal", str(journal), "--since", "soon")
    assert code == 2
    assert "--since" in err and "duration" in err


def test_a_closed_pipe_is_quiet(journal: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`tokengate log | head`: the reader goes away; no "Exception ignored ... closed database"."""
    import gc
    import sys

    from gate.journal.export import export

    unraisable: list = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)

    class Head(io.StringIO):
        def write(self, text: str) -> int:
            if self.tell() > 0:
                raise BrokenPipeError(32, "Broken pipe")
            return super().write(text)

    with pytest.raises(BrokenPipeError):
        export(str(journal), Head(), fmt="json")
    gc.collect()
    assert unraisable == []


def test_cli_log_finds_the_demo_journal_and_says_so(
    journal: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    journal.rename(journal.parent / "tokengate-demo.db")
    monkeypatch.chdir(journal.parent)
    code, out, err = run(capsys, "log", "--kind", "audit")
    assert code == 0, err
    assert "set_budget" in out and "tokengate-demo.db" in err


def test_cli_log_without_any_journal_says_where_they_are(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "log", "--kind", "audit")
    assert code == 1
    assert "tokengate.db: journal file not found" in err and "tokengate-demo.db" in err and "--journal" in err


def test_decisions_come_in_the_order_of_their_ts_not_of_their_end(tmp_path: Path) -> None:
    # A long request that arrived first ends (and is written) last: its row id is larger.
    path = tmp_path / "tokengate.db"

    async def fill() -> None:
        j = await Journal.open(path)
        try:
            for r in (decision(1, ts=NOW - 5, tenant="short"), decision(2, ts=NOW - 60, tenant="long")):
                assert await j.add(r)
        finally:
            await j.close()

    asyncio.run(fill())
    buf = io.StringIO()
    export(str(path), buf, kind="decisions", fmt="json", since_ts=NOW - 600)
    rows = [json.loads(line) for line in buf.getvalue().splitlines()]
    assert [r["tenant"] for r in rows] == ["long", "short"]
    assert [r["ts"] for r in rows] == sorted(r["ts"] for r in rows)


def test_log_reads_the_configs_journal_and_csv_numbers_are_rounded(tmp_path: Path, capsys) -> None:
    path = tmp_path / "elsewhere.db"

    async def fill() -> None:
        j = await Journal.open(path)
        try:
            assert await j.add(decision(1, ts=NOW - 5, tenant="t", duration_ms=35338.87197700005))
        finally:
            await j.close()

    asyncio.run(fill())
    config = tmp_path / "tokengate.toml"
    config.write_text(f'[gate]\njournal = "{path}"\n')
    code, out, err = run(capsys, "log", "--config", str(config), "--format", "csv")
    assert code == 0, err
    rows = list(csv.DictReader(io.StringIO(out)))
    assert rows[0]["tenant"] == "t" and rows[0]["duration_ms"] == "35338.872"


def test_the_reviews_csv_export_is_as_private_as_the_journal(journal: Path, tmp_path: Path) -> None:
    import stat

    from gate.journal.reader import export_decisions_csv

    out = tmp_path / "export.csv"
    from gate.journal.reader import DecisionFilters

    export_decisions_csv(str(journal), str(out), DecisionFilters())
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o600


def test_a_journal_an_older_gate_still_writes_reads_its_new_columns_as_their_defaults(
    journal: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Readers never migrate: a v4 journal (a gate of the previous tokengate still writing it
    after an upgrade) reads `detail` as "" in `log`, the review screen and its CSV export,
    instead of "no such column"."""
    conn = sqlite3.connect(journal, isolation_level=None)
    conn.execute("ALTER TABLE decisions DROP COLUMN detail")
    conn.execute("PRAGMA user_version = 4")
    conn.close()
    code, out, err = run(capsys, "log", "--journal", str(journal), "--format", "json")
    assert code == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert len(rows) == 3 and all(r["detail"] == "" for r in rows)

    async def review() -> list[dict[str, object]]:
        reader = await JournalReader.open(journal)
        try:
            return await reader.decisions_page(limit=10)
        finally:
            await reader.close()

    assert [r["detail"] for r in asyncio.run(review())] == ["", "", ""]
    target = journal.parent / "out.csv"
    assert export_decisions_csv(journal, target, DecisionFilters()) == 3
    assert "detail" in target.read_text().splitlines()[0]


def test_one_long_audit_value_does_not_pad_every_row_of_the_table(tmp_path: Path) -> None:
    """Every gate's audit starts with config_in_force, whose new_value is the whole config as
    JSON (~900 characters for two classes and three tenants). The table sized its columns on
    it, so `tokengate log --kind audit` printed every row, a pause or a retune, ~1,000 columns
    wide with its note and gate_id off any screen. A long cell now pushes its own row right."""
    import dataclasses

    path = tmp_path / "tokengate.db"
    config = json.dumps({"classes": {f"c{i}": {"priority": i, "queue_depth": 64} for i in range(20)}})
    assert len(config) > 500
    start = dataclasses.replace(audit(1, ts=NOW - 60), source="gate", action="config_in_force", old_value=None, new_value=config)
    pause = dataclasses.replace(
        audit(2, ts=NOW - 30), action="pause_class", target="class:interactive", old_value="False", new_value="True", note="paused"
    )

    async def fill() -> None:
        j = await Journal.open(path)
        try:
            assert all(await asyncio.gather(*(j.add(r) for r in (start, pause))))
        finally:
            await j.close()

    asyncio.run(fill())
    buf = io.StringIO()
    assert export(str(path), buf, kind="audit", fmt="table") == 2
    header, first, second = buf.getvalue().splitlines()
    assert config in first
    assert len(second) < 200 and "paused" in second
    assert second.index("pause_class") == header.index("action")  # still aligned


# ---- an aiperf trace's chat requests, less the chat template (a user's trial) ----------------


def _aiperf(capsys: pytest.CaptureFixture[str], path: Path) -> tuple[list[int], str]:
    code, out, err = run(capsys, "log", "--journal", str(path), "--format", "aiperf")
    assert code == 0, err
    return [json.loads(line)["input_length"] for line in out.splitlines()], err


async def test_an_aiperf_trace_takes_the_chat_template_the_gate_measured_off_its_chat_prompts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A trial's re-run of an aiperf trace sent every chat prompt ~40 tokens larger (+43%, and
    batch's context_length_exceeded went 2 -> 12): input_length was llama-server's count, which
    holds the chat template, and the server templated aiperf's text of that length again. The
    gate now measures the template as it learns the capacity (the fake's: 40 tokens) and journals
    it; the trace takes it off templated requests' counts, never below 1, and says so."""
    from tests.fakes import GATE_CONFIG, gate_on_fake_llama

    path = tmp_path / "tokengate.db"
    async with gate_on_fake_llama(GATE_CONFIG, chat_template=40, journal=str(path)) as g:
        (backend,) = g.backends.backends
        assert backend.chat_template_tokens == 40
        at = time.time()
        rows = [
            decision(1, ts=at + 1, prompt_tokens=57),  # a chat: 17 tokens of text, 40 of template
            decision(2, ts=at + 2, prompt_tokens=17, endpoint="/v1/completions"),  # no template
            decision(3, ts=at + 3, prompt_tokens=40),  # nothing but the template (an empty message)
            decision(4, ts=at + 4, prompt_tokens=45, endpoint="/v1/messages"),  # templated too
        ]
        assert all(await asyncio.gather(*(g.recorder.journal.add(r) for r in rows)))
    (learned,) = sqlite3.connect(path).execute("SELECT new_value, note FROM audit WHERE action = 'capacity_learned'").fetchall()
    assert json.loads(learned[0])["chat_template_tokens"] == 40 and learned[1].endswith("chat template 40 tokens")
    lengths, err = _aiperf(capsys, path)
    assert lengths == [17, 17, 1, 5]
    assert err == (
        "tokengate log: input_length of the 3 chat requests is llama-server's prompt count less its chat template "
        "(its 40 tokens, as the gate measured them on backend default; never below 1): aiperf sends input_length tokens "
        "of text and the server templates them again\n"
    )


async def test_an_aiperf_trace_of_a_journal_without_the_templates_size_says_the_counts_hold_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a journal of a gate before the template was measured (its capacity_learned row without the
    # key), or of one whose backend gave no count: the counts are kept, and stderr says how to measure
    from tests.fakes import GATE_CONFIG, gate_on_fake_llama

    path = tmp_path / "tokengate.db"
    async with gate_on_fake_llama(GATE_CONFIG, journal=str(path)) as g:  # the fake counts nothing
        assert g.backends.backends[0].chat_template_tokens is None
        at = time.time()
        assert await g.recorder.journal.add(decision(1, ts=at + 1, prompt_tokens=57))
    lengths, err = _aiperf(capsys, path)
    assert lengths == [57]
    assert "input_length of 1 chat request includes llama-server's chat template: the gate could not measure its size" in err
    conn = sqlite3.connect(path, isolation_level=None)
    (value,) = conn.execute("SELECT new_value FROM audit WHERE action = 'capacity_learned'").fetchone()
    older = json.loads(value)
    del older["chat_template_tokens"]
    conn.execute("UPDATE audit SET new_value = ? WHERE action = 'capacity_learned'", (json.dumps(older),))
    conn.close()
    lengths, err = _aiperf(capsys, path)
    assert lengths == [57]
    assert "this journal does not say its size (a gate before tokengate journaled it)" in err
    assert "/v1/chat/completions/input_tokens" in err and '"add_special":false' in err  # how to measure it
