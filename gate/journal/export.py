"""``tokengate log``: stream journal rows out as a table, JSON Lines or CSV.

Synchronous on purpose (a CLI): a plain ``sqlite3`` cursor read with ``fetchmany``, so a
journal of millions of rows exports in bounded memory. The journal is opened read-only
(``file:...?mode=ro``): exporting never writes to it, and it can run while the gate is
writing (WAL readers do not block the writer).

Columns are the journal's column names (``class``, not the record field ``cls``), plus
``id``; the table's header says which time a first-token column counts from (``TABLE_HEADERS``). ``ts`` is printed as ISO-8601 UTC in table and CSV; JSON keeps the raw float
(seconds since the epoch) and adds ``ts_iso``. A sample's ``classes`` is a JSON array
(JSON output) or its compact JSON text (CSV, table).

``aiperf`` (decisions only): a trace that NVIDIA aiperf replays against a staging gate with
``--custom-dataset-type mooncake_trace --fixed-schedule``: one JSON line per recorded arrival
that carried a prompt count, ``{"timestamp": ms since the first, "input_length": prompt
tokens, "output_length": tokens it really generated, else its max_tokens}``. No prompt text
exists in the journal: aiperf synthesizes text of that length. A chat request's input_length is
its count less the chat template's tokens (`ChatTemplates`: the server templates aiperf's text
again), as the gate measured them on its backend; said on stderr, as is a journal that does not
say them. The class and tenant are not
in the trace (aiperf sends one set of headers to every request): every class's arrivals are
replayed as the class those headers name.
"""

from __future__ import annotations

import bisect
import csv
import json
import math
import os
import re
import sqlite3
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from gate.data.endpoints import lookup
from gate.data.records import CAPACITY_LEARNED
from gate.journal import COLUMNS, SCHEMA_VERSION
from gate.journal.schema import present_columns, select_list

KINDS = ("decisions", "audit", "samples")
FORMATS = ("table", "json", "csv", "aiperf")
FETCH = 1000  # rows per fetchmany
TABLE_PAGE = 200  # rows buffered to size the table's columns
#: a longer cell does not size its column: it pushes the rest of its own row right (the audit's
#: config_in_force value, the whole config as JSON, padded every row ~1,000 columns wide)
TABLE_CELL_MAX = 60

_RELATIVE = re.compile(r"^\s*-?\s*(\d+(?:\.\d+)?)\s*([smhd])\s*$", re.IGNORECASE)  # "-15m" is 15m ago too
_TIME_OF_DAY = re.compile(r"^\s*(\d{1,2}):(\d{2})(?::(\d{2}))?\s*$")  # 21:10, 21:10:30 (UTC)
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_LAST_EPOCH_S = 253402300799.0  # 9999-12-31T23:59:59Z, the last moment a datetime holds


class TimeOfDay(float):
    """A moment read from a time of day (``21:10``): `parse_since` gives one, so that the window's
    end can be read against its start (`window_moments`); with the text given, and whether it was
    read as yesterday's (later than `now`, the moment it was read at), for `yesterday_note`."""

    text: str
    yesterday: bool
    now: float

    def __new__(cls, value: float, text: str = "", *, yesterday: bool = False, now: float = 0.0) -> TimeOfDay:
        moment = super().__new__(cls, value)
        moment.text, moment.yesterday, moment.now = text, yesterday, now
        return moment


class ExportError(Exception):
    """The journal cannot be exported (the message names the file)."""


def parse_since(text: str, now: float) -> float:
    """``30s``, ``15m``, ``2h``, ``7d`` (before ``now``), a time of day ``21:10`` or ``21:10:30``
    (UTC: that day of ``now``, or the day before when later than ``now``), an ISO-8601 timestamp
    (naive = UTC) or epoch seconds (as ``--format json`` and replay's JSON print them) -> seconds
    since the epoch. The one reading of a moment for `tokengate log`, `tokengate replay` and the
    review's ``since=``/``until=`` (log refused the epoch seconds that replay accepted and printed;
    the review read ``23:01`` where both commands refused it, a trial). ``now`` is the present for
    the commands, the journal's newest row for the review. Raises ``ValueError`` with a readable
    message."""
    forms = (
        "give a duration ago (30s, 15m, 2h, 7d), a time of day (21:10, 21:10:30 UTC), "
        "an ISO-8601 time (2025-01-31T14:00:00Z) or epoch seconds (1738332000.5)"
    )
    try:
        value = float(text)
    except ValueError:
        pass
    else:
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{text!r} is not a moment: {forms}")
        if value > _LAST_EPOCH_S:
            # past the year 9999: milliseconds (or finer), as many tools print a time; read as
            # seconds it crashed the ISO formatting of replay's messages and selected no rows in log
            raise ValueError(
                f"{text!r} is not a moment: epoch seconds past the year 9999 (milliseconds? "
                f"{text.strip()} ms is {value / 1000:.10g} s); {forms}"
            )
        return value
    m = _RELATIVE.match(text)
    if m:
        return now - float(m.group(1)) * _UNIT_S[m.group(2).lower()]
    m = _TIME_OF_DAY.match(text)
    if m:
        try:
            at = datetime.fromtimestamp(now, UTC).replace(
                hour=int(m.group(1)), minute=int(m.group(2)), second=int(m.group(3) or 0), microsecond=0
            )
        except ValueError:
            raise ValueError(f"{text!r} is not a time of day (00:00 to 23:59:59): {forms}") from None
        ts = at.timestamp()
        return TimeOfDay(ts - 86400.0 if ts > now else ts, text.strip(), yesterday=ts > now, now=now)
    try:
        dt = datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ValueError(f"{text!r} is not a moment: {forms}") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


def moment_arg(text: str) -> float:
    """`parse_since` as an argparse ``type`` (--since, --until of log and replay), from now."""
    import argparse
    import time

    try:
        return parse_since(text, time.time())
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def iso(ts: float | None) -> str:
    """Seconds since the epoch -> ``2025-01-31T14:00:00.123Z``."""
    if ts is None:
        return ""
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds")[:-6] + "Z"


_DAY_S = 86400.0


def window_moments(since: float | None, until: float | None) -> tuple[float | None, float | None]:
    """--since and --until (or the review's since=/until=) as a window reads them, as plain floats:
    a time of day is today's, or yesterday's when later than now, a rule for the window's start; a
    time-of-day end that this puts at or before the start is read on the start's day (UTC) instead. A trial's
    `--since 13:43:05 --until 13:50`, a few minutes before 13:50, read --until as yesterday's and
    was refused ("the window would run from 2026-12-07T13:43:05 to 2026-12-06T13:50:00"); now it
    ends at 13:50 today, which a reader then trims to its last decision."""
    plain = (None if since is None else float(since), None if until is None else float(until))
    if since is None or until is None or until > since or not isinstance(until, TimeOfDay):
        return plain
    return plain[0], math.floor(since / _DAY_S) * _DAY_S + until % _DAY_S


def yesterday_note(since: float | None, until: float | None, until_flag: str = "--until") -> str:
    """Which times of day of a window were read as yesterday's (later than now: documented, but
    a trial's error printed "2026-12-06T19:31" for a `--until 19:31` and did not say so, nor that
    the times are UTC, a local time given being the likely cause); "" when none was. An
    --until moved onto --since's day (`window_moments`) is on that day, said with --since.
    `until_flag`: "until=" for the review's filter (its start is then "since=")."""
    flag = "--since" if until_flag == "--until" else "since="
    read: list[tuple[str, TimeOfDay]] = [(flag, since)] if isinstance(since, TimeOfDay) and since.yesterday else []
    if isinstance(until, TimeOfDay) and until.yesterday and window_moments(since, until)[1] == float(until):
        read.append((until_flag, until))
    if not read:
        return ""
    moment = read[0][1]
    day = datetime.fromtimestamp(moment, UTC).strftime("%Y-%m-%d")
    now = datetime.fromtimestamp(moment.now, UTC).strftime("%H:%M:%S")
    return (
        f"{' and '.join(f'{f} {t.text}' for f, t in read)} {'was' if len(read) == 1 else 'were'} read as yesterday's ({day}): "
        f"a time of day is UTC, and one later than now ({now} UTC) is yesterday's; give an ISO-8601 time for another day"
    )


def window_order_error(since: float | None, until: float | None) -> str | None:
    """The usage error of a --since/--until pair whose end is not after its start, with both
    moments resolved (`window_moments`): `--since 10m --until 15m` (read as "15 minutes long") is
    a window that ends before it starts, and a bare "--until must be after --since" did not say why."""
    of_day = isinstance(until, TimeOfDay)
    given_since, given_until = since, until
    since, until = window_moments(since, until)
    if since is None or until is None or until > since:
        return None
    if of_day:
        # (the hint spoke of durations only, where the trial had given two times of day)
        why = (
            "a time of day is UTC, today's or yesterday's when later than now, and an --until time of day "
            "that would fall before --since is read on --since's day: this one is not after --since even "
            "there; for a window across midnight give --until as an ISO time (2026-12-08T00:30Z)"
        )
    else:
        why = "a duration is a moment that long ago, not the window's length: --since 20m --until 5m is the 15 minutes that ended 5 minutes ago"
    said = yesterday_note(given_since, given_until)
    return f"--until must be after --since: the window would run from {iso(since)} to {iso(until)} ({why})" + (f"; {said}" if said else "")


DEFAULT_JOURNAL = "tokengate.db"
DEMO_JOURNAL = "tokengate-demo.db"  # what `tokengate console --demo` writes (gate/tools/demo.py)


def find_journal(given: str | None, cwd: str = ".") -> tuple[str, str | None]:
    """The journal to read and a note for stderr (or None).

    Given a path, that path. Else tokengate.db in the working directory, or, when only the
    demo's journal is there, the demo's (with a note saying so: an engineer who just ran
    the demo looks for its journal with a bare `tokengate log`).
    """
    if given:
        return given, None
    default, demo = os.path.join(cwd, DEFAULT_JOURNAL), os.path.join(cwd, DEMO_JOURNAL)
    if not os.path.exists(default) and os.path.exists(demo):
        shown = os.path.relpath(demo) if cwd == "." else demo
        return shown, f"{DEFAULT_JOURNAL} not found here; reading the demo's journal {shown}"
    return (DEFAULT_JOURNAL if cwd == "." else default), None


def open_read_only(path: str) -> sqlite3.Connection:
    if not os.path.exists(path):
        raise ExportError(
            f"{path}: journal file not found (a gate writes it where [gate] journal says, "
            f"default {DEFAULT_JOURNAL} in its working directory; the demo writes {DEMO_JOURNAL}; "
            "pass --journal FILE)"
        )
    if not os.path.isfile(path):
        raise ExportError(f"{path}: not a file")
    uri = Path(path).absolute().as_uri() + "?mode=ro"
    try:
        conn = sqlite3.connect(uri, uri=True, isolation_level=None)
        conn.execute("PRAGMA query_only = 1")
        conn.execute("PRAGMA busy_timeout = 5000")
        (version,) = conn.execute("PRAGMA user_version").fetchone()
    except sqlite3.Error as e:
        raise ExportError(f"{path}: cannot read the journal: {e}") from e
    problem = check_version(path, version, "export")
    if problem is not None:
        conn.close()
        raise ExportError(problem)
    return conn


def check_version(path: str, version: int, verb: str) -> str | None:
    """Why a journal of schema `version` cannot be read (None when it can): one rule for every reader."""
    if version > SCHEMA_VERSION:
        return (
            f"{path}: journal schema version {version} is newer than this tokengate understands "
            f"(up to {SCHEMA_VERSION}); {verb} it with a newer tokengate"
        )
    if version < 1:
        return f"{path}: not a tokengate journal (schema version {version})"
    return None


def _rows(
    conn: sqlite3.Connection, kind: str, since_ts: float | None, path: str, cls: str | None = None, until_ts: float | None = None
) -> tuple[list[str], Iterator[tuple[Any, ...]]]:
    columns = ["id", *COLUMNS[kind]]
    try:
        sql = "SELECT " + select_list(kind, present_columns(conn, kind)) + f" FROM {kind}"
    except sqlite3.Error as e:
        raise ExportError(f"{path}: cannot read {kind}: {e}") from e
    params: list[Any] = []
    where = []
    if since_ts is not None:
        where.append("ts >= ?")
        params.append(since_ts)
    if until_ts is not None:
        where.append("ts < ?")
        params.append(until_ts)
    if cls is not None:
        where.append('"class" = ?')
        params.append(cls)
    if where:
        sql += " WHERE " + " AND ".join(where)
    # By the time the rows are about (a decision's ts is its arrival; rows are written as
    # requests end, so id order is end order): `--since 10m` reads in the order of its ts.
    sql += " ORDER BY ts, id"
    try:
        cursor = conn.execute(sql, params)
    except sqlite3.Error as e:
        raise ExportError(f"{path}: cannot read {kind}: {e}") from e

    def stream() -> Iterator[tuple[Any, ...]]:
        try:
            while True:
                chunk = cursor.fetchmany(FETCH)
                if not chunk:
                    return
                yield from chunk
        except sqlite3.Error as e:
            raise ExportError(f"{path}: reading {kind} failed: {e}") from e
        finally:
            cursor.close()

    return columns, stream()


def export(
    path: str,
    out: TextIO,
    *,
    kind: str = "decisions",
    fmt: str = "table",
    since_ts: float | None = None,
    cls: str | None = None,
    until_ts: float | None = None,
    notes: list[str] | None = None,
) -> int:
    """Write the ``kind`` rows of the journal at ``path`` to ``out``; returns the row count.
    `cls`: only the decisions of that class (an aiperf trace keeps the times of the whole
    selection: one trace per class, each replayed with its class's header and aiperf's
    ``--fixed-schedule-start-offset 0``, which keeps aiperf from shifting it to its first arrival, stay in step).
    `notes` gets what the reader should know beside the rows (decisions an aiperf trace leaves out)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if cls is not None and kind != "decisions":
        raise ExportError("--class selects decisions: use it with --kind decisions")
    if fmt == "aiperf" and kind != "decisions":
        raise ExportError("--format aiperf is a trace of requests: use it with --kind decisions")
    conn = open_read_only(path)
    rows: Iterator[tuple[Any, ...]] | None = None
    try:
        columns, rows = _rows(conn, kind, since_ts, path, cls, until_ts)
        if fmt == "aiperf":
            origin = _first_counted(conn, since_ts, path)
            left_out: list[int] = []
            estimated: list[int] = []
            templates = ChatTemplates(_learned_templates(conn, path))
            n = _write_aiperf(columns, rows, out, origin, left_out, estimated, templates)
            if notes is not None:
                notes.extend(templates.notes())
            if estimated and notes is not None:
                notes.append(
                    f"{estimated[0]} of the {n} input_length values are the gate's estimates, not counts (token_count_source = "
                    "estimate: refused at arrival before llama-server counted the prompt, sized from its JSON's bytes and the "
                    "backend's recent counts)"
                )
            if left_out and notes is not None:
                refused, forwarded = left_out
                k = refused + forwarded
                why = "refused before the gate counted the prompt (a bad key, a bad body, a stopping gate)"
                if forwarded:  # GET /props and the like: journaled, never admitted, nothing refused
                    why = f"{forwarded} forwarded outside admission (/props, /slots, the web UI, ...)" + (
                        f", {refused} {why}" if refused else ""
                    )
                notes.append(
                    f"{k} decision{'' if k == 1 else 's'} without a prompt token count (or any output length) "
                    f"{'is' if k == 1 else 'are'} left out of the trace: {why}, so nothing to send again"
                )
            return n
        writer = {"json": _write_json, "csv": write_csv, "table": _write_table}[fmt]
        return writer(columns, rows, out)
    finally:
        # A reader that went away (`| head`) leaves the row stream half read: close it (and
        # its cursor) while the connection is open, not later in the garbage collector,
        # which would print "Exception ignored ... Cannot operate on a closed database".
        if rows is not None:
            rows.close()  # type: ignore[attr-defined]
        conn.close()


# ------------------------------------------------------------------------------------------
# Formats


def _first_counted(conn: sqlite3.Connection, since_ts: float | None, path: str) -> float | None:
    """The first arrival a trace of the selection (every class) carries: its time zero."""
    try:
        (first,) = conn.execute(
            "SELECT min(ts) FROM decisions WHERE ts >= ? AND prompt_tokens IS NOT NULL AND "
            "(completion_tokens IS NOT NULL OR max_tokens IS NOT NULL)",
            (since_ts if since_ts is not None else float("-inf"),),
        ).fetchone()
    except sqlite3.Error as e:
        raise ExportError(f"{path}: cannot read decisions: {e}") from e
    return first


#: the admitted kinds whose prompt llama-server builds with the model's chat template
TEMPLATED_KINDS = frozenset({"chat", "messages", "responses"})


def _learned_templates(conn: sqlite3.Connection, path: str) -> dict[str, list[tuple[float, int | None, bool]]]:
    """Per backend, its capacity_learned rows in time order: (ts, the chat template's tokens,
    whether the row has the key at all: rows of gates before it was journaled do not)."""
    try:
        rows = conn.execute("SELECT ts, target, new_value FROM audit WHERE action = ? ORDER BY ts, id", (CAPACITY_LEARNED,)).fetchall()
    except sqlite3.Error as e:
        raise ExportError(f"{path}: cannot read audit: {e}") from e
    learned: dict[str, list[tuple[float, int | None, bool]]] = {}
    for ts, target, text in rows:
        try:
            value = json.loads(text or "")
        except ValueError:
            continue
        if not isinstance(value, dict) or not str(target).startswith("backend:"):
            continue
        tokens = value.get("chat_template_tokens")
        known = isinstance(tokens, int) and not isinstance(tokens, bool) and tokens >= 0
        learned.setdefault(str(target)[len("backend:") :], []).append((ts, tokens if known else None, "chat_template_tokens" in value))
    return learned


class ChatTemplates:
    """What a chat request's journaled prompt count holds of its backend's chat template, by the
    capacity_learned row in force at its arrival (the gate measures it on each start of
    llama-server: `TokenCounter.chat_template_tokens`), and what the trace did with it.

    llama-server counts a chat's prompt after its template (the test model's ChatML: 40 tokens
    around a 1-token "hello"); aiperf synthesizes input_length tokens of text and the server
    templates that again, so a trace of the counts as they are sent every chat prompt that much
    larger (a trial's re-run: +43%, and 2 -> 12 context_length_exceeded refusals in batch)."""

    def __init__(self, learned: dict[str, list[tuple[float, int | None, bool]]]) -> None:
        self._learned = learned
        self.taken: dict[tuple[str, int], int] = {}  # (backend, template tokens) -> lines
        self.kept = 0  # chat lines whose template's size the journal does not say
        self.kept_measured = False  # one of those had a row saying the gate could not measure it

    def tokens(self, backend: str, ts: float) -> tuple[int | None, bool]:
        """The template's tokens on `backend` at `ts` (the last row before it, else the first
        after: a window from before the journal's first start), and whether a row said so."""
        rows = self._learned.get(backend)
        if not rows:
            return None, False
        at = bisect.bisect_right(rows, ts, key=lambda r: r[0])
        row = rows[at - 1] if at else rows[0]
        return row[1], row[2]

    def input_length(self, backend: str, endpoint: str, ts: float, prompt: int) -> int:
        route = lookup("POST", endpoint)
        if route is None or route.kind not in TEMPLATED_KINDS:
            return prompt
        tokens, recorded = self.tokens(backend, ts)
        if tokens is None:
            self.kept += 1
            self.kept_measured = self.kept_measured or recorded
            return prompt
        self.taken[(backend, tokens)] = self.taken.get((backend, tokens), 0) + 1
        return prompt - tokens

    def notes(self) -> list[str]:
        out = []
        if self.taken:
            n = sum(self.taken.values())
            sizes = sorted({t for _, t in self.taken})
            if len(self.taken) == 1:
                ((backend, t),) = self.taken
                size = f"its {t} tokens, as the gate measured them on backend {backend}"
            else:
                size = "as the gate measured them: " + ", ".join(f"{t} on {b}" for b, t in sorted(self.taken))
            out.append(
                f"input_length of the {n} chat request{'' if n == 1 else 's'} is llama-server's prompt count less its chat "
                f"template ({size}; never below 1): aiperf sends input_length tokens of text and the server templates "
                f"them again" + ("" if len(sizes) == 1 else " (the template's size changed within the selection)")
            )
        if self.kept:
            why = (
                "the gate could not measure its size"
                if self.kept_measured
                else "this journal does not say its size (a gate before tokengate journaled it)"
            )
            k = self.kept
            out.append(
                f"input_length of {k} chat request{'' if k == 1 else 's'} includes llama-server's chat template: {why}, and "
                "aiperf's chat requests get the template again, so a re-run sends each of them that much larger. Measure it: "
                "the input_tokens of `curl -s $LLAMA/v1/chat/completions/input_tokens -d "
                """'{"messages":[{"role":"user","content":"hello"}]}'` less the number of tokens of `curl -s $LLAMA/tokenize -d """
                """'{"content":"hello","add_special":false}'`, and take it off each chat line's input_length"""
            )
        return out


def _write_aiperf(
    columns: Sequence[str],
    rows: Iterator[tuple[Any, ...]],
    out: TextIO,
    origin: float | None = None,
    left_out: list[int] | None = None,
    estimated: list[int] | None = None,
    templates: ChatTemplates | None = None,
) -> int:
    """The trace lines; `left_out` gets the counts of decisions without token counts, refused and
    forwarded, `estimated` the count of lines whose prompt size is the gate's estimate (none: not
    appended); `templates` takes each chat request's template off its prompt count (and keeps
    what it did, for the notes)."""
    at = {name: i for i, name in enumerate(columns)}
    ts, prompt, max_tokens, done = at["ts"], at["prompt_tokens"], at["max_tokens"], at["completion_tokens"]
    outcome, backend, endpoint = at["outcome"], at["backend"], at["endpoint"]
    source = at.get("token_count_source")
    first: float | None = origin
    n = skipped = forwarded = guessed = 0
    for row in rows:
        if row[prompt] is None or (row[done] is None and row[max_tokens] is None):
            # refused before its prompt was counted, or forwarded outside admission (GET /props):
            # nothing to send again (said, not silently)
            if row[outcome] == "forwarded":
                forwarded += 1
            else:
                skipped += 1
            continue
        first = row[ts] if first is None else first
        output = row[done] if row[done] is not None else row[max_tokens]
        size = row[prompt] if templates is None else templates.input_length(row[backend], row[endpoint], row[ts], row[prompt])
        line = {"timestamp": round((row[ts] - first) * 1000), "input_length": max(1, size), "output_length": max(1, output)}
        out.write(json.dumps(line, separators=(",", ":")) + "\n")
        n += 1
        guessed += source is not None and row[source] == "estimate"
    if (skipped or forwarded) and left_out is not None:
        left_out.extend((skipped, forwarded))
    if guessed and estimated is not None:
        estimated.append(guessed)
    return n


def _write_json(columns: Sequence[str], rows: Iterator[tuple[Any, ...]], out: TextIO) -> int:
    names = list(columns)
    ts_at = names.index("ts")
    stream_at = names.index("stream") if "stream" in names else -1
    classes_at = names.index("classes") if "classes" in names else -1
    keys = names[: ts_at + 1] + ["ts_iso"] + names[ts_at + 1 :]
    dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
    write = out.write
    n = 0
    for row in rows:
        values = list(row)
        if stream_at >= 0:
            values[stream_at] = bool(values[stream_at])
        if classes_at >= 0:
            try:
                values[classes_at] = json.loads(values[classes_at] or "[]")
            except ValueError:
                pass  # keep the text as stored
        values.insert(ts_at + 1, iso(values[ts_at]))
        write(dumps(dict(zip(keys, values))))
        write("\n")
        n += 1
    return n


def _text(column: str, value: Any) -> str:
    if value is None:
        return ""
    if column == "ts":
        return iso(value)
    if column == "stream":
        return "true" if value else "false"
    return str(value)


def write_csv(columns: Sequence[str], rows: Iterator[tuple[Any, ...]], out: TextIO) -> int:
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns)
    ts_at = list(columns).index("ts")
    stream_at = list(columns).index("stream") if "stream" in columns else -1
    n = 0
    for row in rows:
        values = list(row)
        values[ts_at] = iso(values[ts_at])
        if stream_at >= 0:
            values[stream_at] = "true" if values[stream_at] else "false"
        # milliseconds to a tenth, never 35338.87197700005 (a float's noise, not a measurement)
        values = [round(v, 3) if isinstance(v, float) and i != ts_at else v for i, v in enumerate(values)]
        writer.writerow(values)  # None -> "" (csv module)
        n += 1
    return n


def _cell(column: str, value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and column != "ts":
        return f"{value:.1f}"
    return _text(column, value)


#: the table's header for a column whose name alone reads as another time: the journal's ttft_ms
#: counts from dispatch, while the console's and the review's "TTFT ms" (ttft_arrival_ms) count
#: from arrival (a trial read review's "ttft ms 89" beside the console's ~400 for one request).
#: CSV and JSON keep the journal's names: scripts read them.
TABLE_HEADERS = {"ttft_ms": "ttft_ms(dispatch)", "ttft_arrival_ms": "ttft_arrival_ms(arrival)"}


def _write_table(columns: Sequence[str], rows: Iterator[tuple[Any, ...]], out: TextIO) -> int:
    """Aligned columns, sized on the first page of rows (later wider cells, and cells longer
    than TABLE_CELL_MAX, just push right)."""
    page: list[list[str]] = []
    for row in rows:
        page.append([_cell(c, v) for c, v in zip(columns, row)])
        if len(page) >= TABLE_PAGE:
            break
    headers = [TABLE_HEADERS.get(c, c) for c in columns]
    widths = [len(h) for h in headers]
    for cells in page:
        for i, cell in enumerate(cells):
            if widths[i] < len(cell) <= TABLE_CELL_MAX:
                widths[i] = len(cell)
    numeric = [False] * len(columns)
    for i in range(len(columns)):
        numeric[i] = bool(page) and all(_numeric(cells[i]) for cells in page) and columns[i] != "ts"

    def line(cells: Sequence[str]) -> str:
        parts = [cell.rjust(widths[i]) if numeric[i] else cell.ljust(widths[i]) for i, cell in enumerate(cells)]
        return "  ".join(parts).rstrip() + "\n"

    out.write(line(headers))
    n = 0
    for cells in page:
        out.write(line(cells))
        n += 1
    for row in rows:
        out.write(line([_cell(c, v) for c, v in zip(columns, row)]))
        n += 1
    if n == 0:
        out.write("(no rows)\n")
    return n


def _numeric(cell: str) -> bool:
    if cell == "-":
        return True
    try:
        float(cell)
    except ValueError:
        return False
    return True
