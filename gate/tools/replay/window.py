"""Reading a journal window for replay, and fitting the backend model from it.

`load_window` opens the journal read-only and refuses, with a message that says why, a
window that cannot be replayed: a journal older than schema v4 (no arrival-measured TTFT, no
drop counts), a file without a table or column replay reads (`READS`), a window with rows written before the v4 migration, a window in which the
writer dropped rows, no ``config_in_force`` row before the window (a gate older than replay
wrote it), or no decisions at all. What a window does not show becomes a note (`Window.notes`):
its start moved to the gate's start, the work queued or running at its start (replayed first
as its uncounted `lead`), a journal a gate is still writing. The backend model takes the
capacity the gate learned (its ``capacity_learned`` audit row: slots, layout, llama-server's
KV pool) over the config's ``kv`` and ``token_budget``.
"""

from __future__ import annotations

import heapq
import json
import math
import sqlite3
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gate.config.schema import Config, ConfigError
from gate.config.thresholds import CONFIG_IN_FORCE, config_from_thresholds
from gate.data.records import CAPACITY_LEARNED
from gate.journal.schema import JournalError
from gate.ops.lock import holder
from gate.tools.replay.engine import (
    CORE_REASONS,
    REPLAYED_ACTIONS,
    Arrival,
    BackendFit,
    Change,
    budget_held_at,
    controller_state_at,
    in_force_at_start,
    in_force_from_start,
)

#: the schema version whose columns replay reads (decisions.ttft_arrival_ms, samples.journal_dropped)
REPLAY_SCHEMA = 4
_DISPATCHED = ("admitted", "cancelled", "failed")


class ReplayError(JournalError):
    """This window cannot be replayed (the message says why and what to do)."""


@dataclass(frozen=True, slots=True)
class Window:
    path: str
    since: float  # epoch seconds
    until: float
    backend: str
    #: the thresholds in force at the window's start: the gate's (`started`) with the changes
    #: between its start and the window applied (`in_force_at_start`); what a proposal is
    #: compared with, the what-if's form shows and slo_attainment is judged against
    config: Config
    config_digest: str  # the gate's start config's (its config_in_force row's note)
    arrivals: tuple[Arrival, ...]
    changes: tuple[Change, ...]
    fit: BackendFit
    budget_curve: tuple[tuple[float, int], ...]  # (seconds from since, recorded budget) per sample
    #: what the reader of the answer must know about the window (its start moved, work in
    #: flight at its start, a journal still being written): said above the table and in JSON
    notes: tuple[str, ...] = ()
    #: the arrivals before the window (``at`` < 0) replayed first and not counted: the work
    #: queued or running at its start, and what arrived beside it (a warm-up), so that the
    #: replay meets the window's first arrivals with the slots and queue the gate had
    lead: tuple[Arrival, ...] = ()
    #: llama-server's KV pool as the journal records it (its capacity_learned row); None: not
    #: recorded (then `fit.ceiling` is an estimate, and no proposal is warned against it)
    pool: int | None = None
    #: the thresholds the gate that wrote the window started with (its config_in_force row): the
    #: engine starts from these and replays the changes before the window (``at`` <= 0) at its
    #: start; None: the same as `config` (no threshold moved between the gate's start and the window)
    started: Config | None = None

    @property
    def start_config(self) -> Config:
        """The gate's start thresholds (`started`, else `config`)."""
        return self.config if self.started is None else self.started

    @property
    def first_arrival_s(self) -> float:
        """Seconds from `since` to the window's first arrival (0: none)."""
        return min((a.at for a in self.arrivals), default=0.0)

    @property
    def config_at_end(self) -> Config:
        """The thresholds in force at the window's end: `config` with the changes in it applied."""
        return in_force_at_start(self.start_config, self.changes, self.first_arrival_s, upto=math.inf)

    def held_budget(self, *, at_end: bool = False) -> int | None:
        """The working budget held by hand at the window's start (`at_end`: its end), frozen or
        static: the budget the journal sampled there, else the last one set by hand; None while
        the controller moves it (`budget_held_at`)."""
        held, hand = budget_held_at(self.start_config, self.changes, self.first_arrival_s, upto=math.inf if at_end else None)
        if not held:
            return None
        sampled = [b for t, b in self.budget_curve if t >= 0]
        return (sampled[-1] if at_end else sampled[0]) if sampled else hand

    def controller_state(self, *, at_end: bool = False) -> str:
        """The controller as the replay ran it at the window's start (`at_end`: its end):
        "static", "frozen" or "adaptive" (`controller_state_at`)."""
        return controller_state_at(self.start_config, self.changes, self.first_arrival_s, upto=math.inf if at_end else None)

    def in_window(self, change: Change) -> bool:
        """A change made in the window, not in force from its start (`in_force_from_start`); the
        first arrival (a walk of the arrivals) is looked at only for a `restored` row in it."""
        return change.at > 0 and (change.action != "restored" or not in_force_from_start(change, self.first_arrival_s))

    @property
    def lead_s(self) -> float:
        """Seconds replayed before the window (0: none)."""
        return -min((a.at for a in self.lead), default=0.0)

    @property
    def duration_s(self) -> float:
        return max(1e-9, self.until - self.since)


def _connect(path: str) -> sqlite3.Connection:
    from gate.journal.export import check_version

    if not Path(path).exists():
        raise ReplayError(f"{path}: no such journal file")
    if not Path(path).is_file():
        raise ReplayError(f"{path}: not a file")
    try:
        conn = sqlite3.connect(Path(path).absolute().as_uri() + "?mode=ro", uri=True)
        conn.row_factory = sqlite3.Row
        (version,) = conn.execute("PRAGMA user_version").fetchone()
    except sqlite3.Error as exc:
        raise ReplayError(f"{path}: not a readable journal ({exc})") from None
    problem = check_version(path, version, "replay")  # one rule for every reader: not a journal, or too new
    if problem is None and version < REPLAY_SCHEMA:
        problem = (
            f"{path}: journal schema v{version} predates replay (v{REPLAY_SCHEMA} added decisions.ttft_arrival_ms and "
            "samples.journal_dropped); open it once with this tokengate to migrate it, and replay windows recorded after that"
        )
    if problem is None:
        problem = _missing_columns(conn, path)
    if problem is not None:
        conn.close()
        raise ReplayError(problem)
    return conn


#: the columns replay reads, per table (a journal of schema v4 has them all)
READS: dict[str, tuple[str, ...]] = {
    "decisions": (
        "id", "ts", "request_id", "tenant", "class", "backend", "endpoint", "stream", "prompt_tokens", "max_tokens",
        "reserved_tokens", "outcome", "reason", "queue_ms", "ttft_ms", "duration_ms", "completion_tokens", "ttft_arrival_ms",
    ),
    "audit": ("id", "ts", "action", "target", "new_value", "note"),
    "samples": ("ts", "backend", "budget", "slots_total", "journal_dropped", "gate_id"),
}  # fmt: skip


def _missing_columns(conn: sqlite3.Connection, path: str) -> str | None:
    """Why a file that claims the schema lacks what replay reads (a table, columns): said up front,
    naming them (a decisions table without ttft_arrival_ms read "IndexError: No item with that key")."""
    try:
        for table, wanted in READS.items():
            have = {str(r[1]) for r in conn.execute(f"PRAGMA table_info({table})")}
            if not have:
                return f"{path}: this journal has no {table} table: not a journal this version wrote, or damaged"
            missing = [c for c in wanted if c not in have]
            if missing:
                return f"{path}: this journal's {table} table lacks {', '.join(missing)}: not a journal this version wrote, or damaged"
    except sqlite3.Error as exc:
        return f"{path}: not a readable journal ({exc})"
    return None


def load_window(path: str, since: float | None = None, until: float | None = None, backend: str | None = None) -> Window:
    conn = _connect(path)
    try:
        return _load(conn, path, since, until, backend)
    except sqlite3.Error as exc:  # a table or column missing in a file that claims the schema, a damaged page
        raise ReplayError(f"{path}: cannot read the window ({exc}): the journal is damaged or not one tokengate wrote") from None
    finally:
        conn.close()


def _load(conn: sqlite3.Connection, path: str, since: float | None, until: float | None, backend: str | None) -> Window:
    from gate.journal.export import iso

    lo, hi = conn.execute("SELECT min(ts), max(ts) FROM decisions").fetchone()
    if lo is None:
        raise ReplayError(f"{path}: the journal holds no decisions")
    if since is not None and until is not None and until <= since:
        raise ReplayError(f"{path}: --until ({iso(until)}) must be after --since ({iso(since)})")
    if since is not None and since > hi:
        raise ReplayError(f"{path}: no decisions after --since {iso(since)}: the journal's last is at {iso(hi)}")
    if until is not None and until <= lo:
        raise ReplayError(f"{path}: no decisions before --until {iso(until)}: the journal's first is at {iso(lo)}")
    since = lo if since is None else since
    notes: list[str] = []
    asked_until = hi + 1e-6 if until is None else until
    if until is not None and until > hi + 1e-6:
        # no arrival after the last decision: the time after it only diluted tokens/s (a trial's
        # --until 2027-01-01 replayed 2.2e6 s: tokens/s 0.000 in every column); it ends where the
        # review's what-if ends a range past it, and where no --until ends. The notes on what the
        # window does not show (a gate killed, requests still running) still look to the moment asked.
        notes.append(
            f"--until {iso(until)} is after the journal's last decision ({iso(hi)}): the window ends just after it, "
            "as without --until (there is no arrival after it to replay; its empty time would only dilute tokens/s)"
        )
    until = min(asked_until, hi + 1e-6)
    if backend is None:
        row = conn.execute(
            "SELECT backend, count(*) n FROM decisions WHERE ts >= ? AND ts < ? AND backend != '' GROUP BY backend ORDER BY n DESC LIMIT 1",
            (since, until),
        ).fetchone()
        if row is None:
            raise ReplayError(f"{path}: no decisions reached a backend between {iso(since)} and {iso(until)}")
        backend = str(row["backend"])
    cfg_row = conn.execute(
        "SELECT ts, note, new_value FROM audit WHERE action = ? AND ts <= ? ORDER BY ts DESC LIMIT 1", (CONFIG_IN_FORCE, since + 5.0)
    ).fetchone()
    if cfg_row is None:
        # The window starts before the gate that wrote the journal did (`--since 15m` on a
        # younger journal): it starts with that gate's first config_in_force row instead.
        cfg_row = conn.execute(
            "SELECT ts, note, new_value FROM audit WHERE action = ? AND ts > ? AND ts < ? ORDER BY ts LIMIT 1",
            (CONFIG_IN_FORCE, since, until),
        ).fetchone()
        if cfg_row is not None:
            (before,) = conn.execute("SELECT count(*) FROM decisions WHERE ts >= ? AND ts < ?", (since, cfg_row["ts"])).fetchone()
            left_out = f"; {before} decisions before it are left out (the thresholds then are unknown)" if before else ""
            notes.append(f"the window starts at {iso(cfg_row['ts'])}, when the gate that wrote the journal started{left_out}")
            since = float(cfg_row["ts"])
    if cfg_row is None:
        raise ReplayError(
            f"{path}: no {CONFIG_IN_FORCE} audit row before the window: the gate that wrote it predates replay, "
            "so the thresholds in force are unknown"
        )
    config = _config_of(path, cfg_row, f"at {iso(cfg_row['ts'])}")
    names = {c.name for c in config.classes}
    rows = conn.execute(
        'SELECT * FROM decisions WHERE ts >= ? AND ts < ? AND (backend = ? OR backend = "") ORDER BY ts, id', (since, until, backend)
    ).fetchall()
    # (decisions without a backend, a restart's shutting_down 503s, are no sign of this one: a
    # trial's `--backend nope` replayed them alone, an empty table with exit 0)
    if not any(r["backend"] == backend for r in rows):
        there = [
            r[0]
            for r in conn.execute(
                "SELECT DISTINCT backend FROM decisions WHERE ts >= ? AND ts < ? AND backend != '' ORDER BY 1", (since, until)
            )
        ]
        seen = f" (the window's backends: {', '.join(there)})" if there else ""
        raise ReplayError(f"{path}: no decisions for backend {backend!r} in the window{seen}")
    old = sum(1 for r in rows if r["ttft_ms"] is not None and r["ttft_arrival_ms"] is None)
    if old:
        raise ReplayError(
            f"{path}: {old} decisions of the window were written before the v{REPLAY_SCHEMA} migration (no arrival-measured TTFT); "
            "choose a window recorded after it (--since)"
        )
    samples = conn.execute(
        "SELECT ts, budget, slots_total, journal_dropped, gate_id FROM samples WHERE backend = ? AND ts >= ? AND ts <= ? ORDER BY ts, id",
        (backend, since - 2.0, until + 2.0),
    ).fetchall()
    dropped = _dropped(conn, samples, since - 2.0)
    if dropped:
        raise ReplayError(
            f"{path}: the journal writer dropped {dropped} rows during the window (full buffer or failing disk): "
            "its decisions are incomplete, a replay would undercount the load"
        )
    changes: list[Change] = []
    later: set[str] = set()  # the classes of a gate restarted in the window
    digest = str(cfg_row["note"])
    for r in conn.execute(
        "SELECT ts, action, target, new_value, note FROM audit WHERE ts > ? AND ts < ? ORDER BY ts, id", (cfg_row["ts"], until)
    ):
        value = r["new_value"]
        if r["action"] == CONFIG_IN_FORCE:
            # A gate restarted in the window: from then on its thresholds (a user's trial replayed
            # a window across a restart under the first gate's, and said nothing)
            value, note, digest = _restart(path, r, backend, names, digest)
            notes.append(note)
            later |= set(json.loads(value).get("classes", {}))
        changes.append(Change(r["ts"] - since, r["action"], r["target"], value))
    arrivals = tuple(_arrival(r, since, names) for r in rows if r["class"])
    strangers = sorted({a.cls for a in arrivals} - names - later)
    if strangers:
        # (a damaged journal's decisions of a class no thresholds name kept their outcome unsaid)
        notes.append(
            f"decisions of {', '.join(repr(c) for c in strangers)}, a class the thresholds in force do not have, keep their "
            "recorded outcome (the replay cannot admit them under thresholds it does not know)"
        )
    learned = conn.execute(
        "SELECT new_value FROM audit WHERE action = ? AND target = ? AND ts <= ? ORDER BY ts <= ? DESC, "
        "CASE WHEN ts <= ? THEN -ts ELSE ts END LIMIT 1",
        (CAPACITY_LEARNED, f"backend:{backend}", until, since, since),
    ).fetchone()  # the last learned at the window's start, else the first learned in it
    learned_value = _learned(learned["new_value"]) if learned else None
    if learned and learned_value is None:
        notes.append(
            f"the {CAPACITY_LEARNED} row of backend {backend!r} does not read as llama-server's capacity (damaged): "
            "the slots, pool and KV layout are taken from the samples and the config instead"
        )
    fit = fit_backend(rows, samples, config, since, learned_value)
    arrivals, estimated_notes = _estimated_prompts(arrivals, [r for r in rows if r["class"]], fit.slot_context)
    notes += estimated_notes
    notes += _capacity_moves(changes, backend, learned_value, since)
    curve = tuple((s["ts"] - since, s["budget"]) for s in samples if s["budget"] is not None and since <= s["ts"] < until)
    notes += _changed_before(changes, since, float(cfg_row["ts"]), str(cfg_row["note"]))
    lead, arrivals = _distinct_ids(_lead(conn, backend, since, float(cfg_row["ts"]), names), arrivals)
    notes += _open_ends(conn, path, backend, since, asked_until, lead, float(cfg_row["ts"]))
    notes += _losses(conn, backend, since, asked_until, rows)
    in_force = in_force_at_start(config, changes, min((a.at for a in arrivals), default=0.0))
    return Window(
        path,
        since,
        until,
        backend,
        in_force,
        str(cfg_row["note"]),
        arrivals,
        tuple(changes),
        fit,
        curve,
        tuple(notes),
        lead,
        learned_pool(learned_value),
        None if in_force == config else config,
    )


def _thresholds_of_row(path: str, row: sqlite3.Row, where: str) -> dict[str, Any]:
    """A config_in_force row's thresholds, or a ReplayError naming the row (a damaged row said
    only "JSONDecodeError: Expecting property name ...", and a row of `{}` replayed the built-in
    defaults with no word, every figure then far off: a trial, 2026-12-07)."""
    try:
        data = json.loads(row["new_value"] or "")
    except ValueError as exc:
        raise ReplayError(
            f"{path}: the {CONFIG_IN_FORCE} row {where} is not valid JSON ({exc}): the thresholds in force are unknown"
        ) from None
    missing = [k for k in ("budget", "classes") if not (isinstance(data, dict) and isinstance(data.get(k), dict) and data[k])]
    if missing:
        raise ReplayError(
            f"{path}: the {CONFIG_IN_FORCE} row {where} holds no {' and no '.join(missing)}: the thresholds in force are unknown "
            "(a gate writes every class and its [budget] there; the row was damaged)"
        )
    return data


def _config_of(path: str, row: sqlite3.Row, where: str) -> Config:
    data = _thresholds_of_row(path, row, where)
    try:
        return config_from_thresholds(json.dumps(data))
    except (ValueError, TypeError, AttributeError, ConfigError) as exc:
        raise ReplayError(f"{path}: the {CONFIG_IN_FORCE} row {where} does not read as thresholds ({exc})") from None


def _restart(path: str, row: sqlite3.Row, backend: str, classes: set[str], before: str) -> tuple[str, str, str]:
    """A config_in_force row inside the window (a gate restarted): its thresholds with the
    replayed backend first (the one the engine reads), the note that says so, its digest."""
    when = _hms(row["ts"])
    data = _thresholds_of_row(path, row, f"of the gate restart at {when}")
    try:
        data["backends"] = [b for b in data.get("backends", []) if b.get("name") == backend] or data.get("backends", [])[:1]
        config_from_thresholds(json.dumps(data))
    except (ValueError, TypeError, AttributeError, ConfigError) as exc:
        raise ReplayError(f"{path}: the {CONFIG_IN_FORCE} row of the gate restart at {when} does not read as thresholds ({exc})") from None
    digest = str(row["note"])
    change = f"config {before} -> {digest}" if digest != before else f"config {digest}, unchanged"
    note = (
        f"the window spans a gate restart at {when} ({change}): from then on the replay applies the new gate's thresholds "
        "(its file's, then each override it restored), its budget starts again at what that config says, and the old "
        "gate's pauses, drains and freeze end; requests queued or running then carry over"
    )
    added = sorted(set(data.get("classes", {})) - classes)
    if added:
        note += f"; the arrivals of {', '.join(added)} (classes it added) keep their recorded outcome"
    return json.dumps(data, sort_keys=True, separators=(",", ":")), note, digest


def _dropped(conn: sqlite3.Connection, samples: list[sqlite3.Row], first: float) -> int:
    """The rows the writer dropped in the samples' stretch: `journal_dropped` counts per gate
    process from 0 (a restart starts it again), so the rises within each process (its gate_id),
    from 0 for a process that started in the stretch (its config_in_force row). Across processes a window after a restart
    read as "dropped 5 rows" when the first gate had dropped 5 before it (a user's trial)."""
    total = 0
    by_gate: dict[str, list[int]] = {}
    for s in samples:
        by_gate.setdefault(str(s["gate_id"]), []).append(int(s["journal_dropped"] or 0))
    for gate, counts in by_gate.items():
        (started,) = conn.execute(
            "SELECT count(*) FROM audit WHERE action = ? AND gate_id = ? AND gate_id != '' AND ts >= ?", (CONFIG_IN_FORCE, gate, first)
        ).fetchone()
        previous = 0 if started else counts[0]  # a process that started in the stretch counted from 0
        for n in counts:
            total += max(0, n - previous)  # a fall: another process under the same (empty) id
            previous = n
    return total


#: the longest warm-up replayed before a window (its requests were queued or running at its start)
LEAD_MAX_S = 600.0


def _carried(conn: sqlite3.Connection, backend: str, since: float) -> list[sqlite3.Row]:
    """The requests that arrived before `since` (within LEAD_MAX_S) and were queued or running then."""
    return conn.execute(
        "SELECT ts FROM decisions WHERE backend = ? AND ts < ? AND ts >= ? AND outcome IN (?, ?, ?) "
        "AND ts + duration_ms / 1000.0 > ? ORDER BY ts",
        (backend, since, since - LEAD_MAX_S, *_DISPATCHED, since),
    ).fetchall()


def _lead(conn: sqlite3.Connection, backend: str, since: float, config_ts: float, classes: set[str]) -> tuple[Arrival, ...]:
    """Every arrival from the first one still queued or running at `since` (not before the
    thresholds in force were recorded) up to `since`: replayed first, not counted."""
    carried = _carried(conn, backend, since)
    if not carried:
        return ()
    start = max(float(carried[0]["ts"]), config_ts)
    rows = conn.execute(
        'SELECT * FROM decisions WHERE ts >= ? AND ts < ? AND (backend = ? OR backend = "") ORDER BY ts, id', (start, since, backend)
    ).fetchall()
    return tuple(_arrival(r, since, classes) for r in rows if r["class"])


def _open_ends(
    conn: sqlite3.Connection, path: str, backend: str, since: float, until: float, lead: tuple[Arrival, ...], config_ts: float
) -> list[str]:
    """Work the window's arrivals do not show: requests that arrived before it and were queued
    or running at its start (replayed first, from the earliest of them: `lead`; not those that
    arrived before the thresholds in force were, `config_ts`: a gate before it ran them), and,
    in a journal a gate is writing now (it holds the journal's lock), requests still running (a
    decision is journaled when its request ends), when the samples show any (`_still_running`)."""
    from gate.journal.export import iso

    notes = []
    running = _carried(conn, backend, since)
    carried = sum(1 for r in running if r["ts"] >= config_ts)
    if len(running) > carried:
        # a window starting up to 5 s before a gate's start replays that gate's thresholds; the
        # gate before it still ran these (a trial's note read "the replay starts -0.0 s earlier
        # (with the 0 arrivals since then ...) so that they hold their slots")
        gone = len(running) - carried
        notes.append(
            f"the window starts {config_ts - since:.1f} s before the gate whose thresholds it replays started "
            f"({iso(config_ts)}): {gone} request{'' if gone == 1 else 's'} the gate before it still ran then "
            f"{'is' if gone == 1 else 'are'} not replayed"
        )
    if carried:
        lead_s = -min((a.at for a in lead), default=0.0)
        one = carried == 1
        notes.append(
            f"{carried} request{'' if one else 's'} that arrived before the window {'was' if one else 'were'} still queued "
            f"or running at its start: the replay starts {lead_s:.1f} s earlier (with the {len(lead)} "
            f"arrival{'' if len(lead) == 1 else 's'} since then, not counted in the figures) so that "
            f"{'it holds its slot' if one else 'they hold their slots'} at the window's start"
        )
    writer = holder(path)
    (longest,) = conn.execute("SELECT max(duration_ms) FROM decisions WHERE backend = ? AND ts >= ?", (backend, since - 3600.0)).fetchone()
    longest_s = (longest or 0.0) / 1000.0
    if writer is not None and until > time.time() - longest_s - 1.0:
        still = _still_running(conn, backend, until)
        if still:
            notes.append(
                f"a gate is writing this journal ({writer}) and journals a request when it ends; {still}: requests still "
                f"running are not in the window yet; for a complete window give --until a moment at least the longest request "
                f"ago ({longest_s:.0f} s)"
            )
    elif writer is None:
        notes += _never_stopped(conn, until, longest_s)
    return notes


def _still_running(conn: sqlite3.Connection, backend: str, until: float) -> str:
    """In a journal a gate is writing: the work in flight or queued at the window's end (the first
    sample at or after it) that the gate's latest sample still shows, in words; "" when either
    sample shows none (nothing of the window can be missing: a request running at its end that
    has ended since is journaled). The note said "requests still running are not in the window
    yet" of every recent window, also when nothing was in flight (a trial). Without a sample to
    tell (a gate that has written none yet), it cannot be ruled out: said so."""
    query = "SELECT ts, in_flight, queued FROM samples WHERE backend = ? AND ts >= ? ORDER BY ts LIMIT 1"
    end = conn.execute(query, (backend, until)).fetchone()
    last = conn.execute("SELECT ts, in_flight, queued FROM samples WHERE backend = ? ORDER BY ts DESC LIMIT 1", (backend,)).fetchone()
    if end is None:
        end = last if last is not None and last["ts"] >= until - 2.0 else None  # the window ends at the gate's present
    if end is None:
        return "no sample at the window's end says whether any request was running then"
    if not (end["in_flight"] or end["queued"]) or not (last["in_flight"] or last["queued"]):
        return ""
    queued = f" and {end['queued']} request{'' if end['queued'] == 1 else 's'} queued" if end["queued"] else ""
    return (
        f"{end['in_flight']:,} tokens were in flight{queued} at the window's end (the sample at {_hms(end['ts'])}), and its "
        f"latest sample ({_hms(last['ts'])}) still shows work"
    )


def _never_stopped(conn: sqlite3.Connection, until: float, longest_s: float) -> list[str]:
    """A journal whose last gate never wrote `stopped` and that no gate holds, read up to its
    end: that gate was killed with no gate after it (no `unclean_end` row tells), or the file is
    a copy of a journal a gate was writing. A post-incident trial copied tokengate.db off a
    running gate without its -wal: the copy lacked the last 52 decisions, and nothing said so."""
    life = conn.execute(
        "SELECT action FROM audit WHERE target = 'gate' AND action IN ('started', 'stopping', 'stopped') ORDER BY ts DESC, id DESC LIMIT 1"
    ).fetchone()
    if life is None or life["action"] == "stopped":
        return []
    (last,) = conn.execute(
        "SELECT max(t) FROM (SELECT max(ts) t FROM samples UNION ALL SELECT max(ts) FROM audit "
        "UNION ALL SELECT max(ts + coalesce(duration_ms, 0) / 1000.0) FROM decisions)"
    ).fetchone()
    if last is None or until + max(KILL_SLACK_S, longest_s) < last:
        return []  # the window ends well before the journal does: nothing it holds was cut off
    return [
        f"the journal ends at {_hms(last)} without its gate's 'stopped' row and no gate holds it: that gate was killed "
        "(requests in flight then were never journaled), or this is a copy of a journal a gate was writing (requests "
        "running then are not in it, and a copy without its -wal file lacks the rows since the last checkpoint: copy "
        "it with sqlite3's .backup); counts near its end may be short"
    ]


#: the audit row a gate writes at start when the gate before it on the journal never wrote
#: `stopped` (killed or crashed: gate/observe/recorder.py)
UNCLEAN_END = "unclean_end"
#: "a few seconds": a window that ends this close before a kill still loses requests to it
KILL_SLACK_S = 5.0


def _losses(conn: sqlite3.Connection, backend: str, since: float, until: float, rows: list[sqlite3.Row]) -> list[str]:
    """What the window's figures leave out: the requests in flight when a gate was killed (a
    request is journaled when it ends: those never were), and the decisions without a class
    (refused before the gate classified them: a stopping gate's 503s, a bad key). A user's
    trial SIGKILLed a gate and SIGTERMed another, and the replay flagged neither."""
    from collections import Counter

    notes = []
    (longest,) = conn.execute(
        "SELECT max(duration_ms) FROM decisions WHERE backend = ? AND ts >= ? AND ts < ?", (backend, since - 3600.0, until)
    ).fetchone()
    slack = max(KILL_SLACK_S, (longest or 0.0) / 1000.0)
    for (ended,) in conn.execute("SELECT ts FROM audit WHERE action = ? AND ts > ? ORDER BY ts", (UNCLEAN_END, since)).fetchall():
        # the kill: after the killed gate's last row (a sample a second, an audit row, a request's end)
        (last,) = conn.execute(
            "SELECT max(t) FROM (SELECT max(ts) t FROM samples WHERE ts < ? UNION ALL SELECT max(ts) FROM audit WHERE ts < ? "
            "UNION ALL SELECT max(ts + duration_ms / 1000.0) FROM decisions WHERE ts < ?)",
            (ended, ended, ended),
        ).fetchone()
        killed = float(last if last is not None else ended)
        if since <= killed < until + slack:
            notes.append(
                f"the gate was killed at/after {_hms(killed)} (its last journaled row; the next gate, started at {_hms(ended)}, "
                "found no 'stopped'): requests in flight then were never journaled; counts may be short"
            )
            break
    forwarded = sum(1 for r in rows if not r["class"] and r["outcome"] == "forwarded")
    if forwarded:  # /props, /slots, the web UI...: journaled, never admitted, nothing refused
        notes.append(
            f"{forwarded} forwarded request{'' if forwarded == 1 else 's'} (routes outside admission: /props, /slots, "
            "the web UI, ...) left out of every figure"
        )
    unclassed = Counter(str(r["reason"]) for r in rows if not r["class"] and r["outcome"] != "forwarded")
    if unclassed:
        n = sum(unclassed.values())
        each = ", ".join(f"{reason} {k}" for reason, k in sorted(unclassed.items(), key=lambda x: (-x[1], x[0])))
        notes.append(
            f"{n} decision{'' if n == 1 else 's'} without a class ({each}) {'is' if n == 1 else 'are'} left out of every figure: "
            "the gate refused them before it classified them (a stopping gate's shutting_down, a bad key, a bad body)"
        )
    return notes


def _changed_before(changes: list[Change], since: float, started: float, digest: str) -> list[str]:
    """What moved the thresholds between the gate's start (its config_in_force row) and the
    window: in force at the window's start, replayed before it, and not "in the window" (a
    trial's window after a SIGHUP reload read "0 operator changes in the window", and the
    what-if's lines, the gate's start values, as if they had been in force)."""
    before = [c for c in changes if c.at <= 0 and c.action in REPLAYED_ACTIONS]
    if not before:
        return []
    listed = ", ".join(f"{_hms(since + c.at)} {c.action} {c.target}" for c in before[:6])
    more = f" and {len(before) - 6} more" if len(before) > 6 else ""
    # the last clause: a trial's --set of a class's queue_depth at the gate's start value ("what if
    # I had not retuned it before the window?") was compared with the gate's start, pinned nothing
    # and replayed the retune: `changes` [], the column the replayed one, with nothing said
    return [
        f"{len(before)} change{'' if len(before) == 1 else 's'} between the gate's start ({_hms(started)}, config {digest}) "
        f"and the window {'is' if len(before) == 1 else 'are'} in force at its start (replayed before it): {listed}{more}; --set keys "
        "and the what-if's lines are compared with the thresholds in force at the window's start, these changes included: "
        "KEY=VALUE at that value changes nothing, another value pins KEY over them"
    ]


def _hms(ts: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(ts))


def _arrival(r: sqlite3.Row, since: float, classes: set[str]) -> Arrival:
    through = (
        r["class"] in classes
        and r["prompt_tokens"] is not None
        and r["max_tokens"] is not None
        and (r["outcome"] in _DISPATCHED or r["reason"] in CORE_REASONS)
    )
    ran = r["outcome"] in _DISPATCHED and r["completion_tokens"] is not None
    return Arrival(
        id=str(r["request_id"]) or f"row{r['id']}",
        at=r["ts"] - since,
        tenant=r["tenant"],
        cls=r["class"],
        prompt_tokens=int(r["prompt_tokens"] or 0),
        max_tokens=int(r["max_tokens"] or 0),
        completion_tokens=int(r["completion_tokens"]) if ran else None,
        through_core=through,
        outcome=r["outcome"],
        reason=r["reason"],
        queue_ms=r["queue_ms"],
        ttft_arrival_ms=r["ttft_arrival_ms"],
        stream=bool(r["stream"]),
        endpoint=r["endpoint"],
        duration_ms=r["duration_ms"] if ran else None,
    )


def _estimated_prompts(arrivals: tuple[Arrival, ...], rows: list[sqlite3.Row], slot_context: int) -> tuple[tuple[Arrival, ...], list[str]]:
    """A request refused before llama-server counted it (at arrival, under load) has an
    estimated prompt in the journal (its JSON bytes / 3 x what the backend's counts gave lately):
    the arrivals as replayed, and the notes saying how many. An estimate that would not fit a
    slot beside its max_tokens, on a request not refused for its size, is taken as the most
    that fits: its refusal says it was not too long, and replayed as too long it moved refusals
    from their recorded reason to context_length_exceeded (a trial: batch's queue_timeout 79 ->
    72 and context_length_exceeded 0 -> 8, untrusted)."""
    estimated = [r["token_count_source"] == "estimate" if "token_count_source" in r.keys() else False for r in rows]
    count = sum(1 for a, e in zip(arrivals, estimated, strict=True) if e and a.through_core)
    if not count:
        return arrivals, []
    out, fitted = [], 0
    for a, e in zip(arrivals, estimated, strict=True):
        if (
            e
            and a.through_core
            and a.reason != "context_length_exceeded"
            and a.prompt_tokens + a.max_tokens > slot_context >= a.max_tokens + 1
        ):
            a = replace(a, prompt_tokens=slot_context - a.max_tokens)
            fitted += 1
        out.append(a)
    shown = sum(1 for a in arrivals if a.through_core)
    note = (
        f"{count} of the {shown} arrivals replayed were refused before llama-server counted them: their prompt sizes are "
        "the gate's estimates, so figures that rest on them (refusals by reason above all) are less certain"
    )
    if fitted:
        note += (
            f"; {fitted} of these estimates would not fit a slot of {slot_context} tokens beside their max_tokens, though "
            "they were not refused for their size: each is taken as the most that fits"
        )
    return tuple(out), [note]


def _distinct_ids(*groups: tuple[Arrival, ...]) -> tuple[tuple[Arrival, ...], ...]:
    """`groups` with every arrival's id its own: the gate takes a client's X-Request-Id as the
    request id, so many rows may carry one (a client sending the same header each time, a retry
    beside its first try); the replay keys arrivals by id (two at once crashed it, and the
    recorded column counted one outcome per id). A repeat gets `#2`, `#3`, ... (the first keeps its id)."""
    seen: set[str] = set()
    tried: dict[str, int] = {}  # per repeated id, the last suffix given: one id on every row of a
    # 100,000-decision window is 100,000 renames, not 5e9 looks (counting up from #2 each time)
    out = []
    for group in groups:
        kept = []
        for a in group:
            if a.id in seen:
                n = tried.get(a.id, 1) + 1
                while f"{a.id}#{n}" in seen:
                    n += 1
                tried[a.id] = n
                a = replace(a, id=f"{a.id}#{n}")
            seen.add(a.id)
            kept.append(a)
        out.append(tuple(kept))
    return tuple(out)


def _lstsq(xs: list[list[float]], ys: list[float]) -> list[float] | None:
    """Ordinary least squares by the normal equations (Gauss-Jordan); None when singular."""
    n = len(xs[0])
    a = [[sum(x[i] * x[j] for x in xs) for j in range(n)] + [sum(x[i] * y for x, y in zip(xs, ys))] for i in range(n)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) < 1e-12:
            return None
        a[col], a[pivot] = a[pivot], a[col]
        for r in range(n):
            if r != col:
                f = a[r][col] / a[col][col]
                a[r] = [v - f * w for v, w in zip(a[r], a[col])]
    return [a[i][n] / a[i][i] for i in range(n)]


def _prefill_ahead(ran: list[sqlite3.Row]) -> tuple[list[float], list[float]]:
    """Per request: the prompt tokens prefilling right after its dispatch (its own included) and
    the requests in flight then. Requests dispatched in one instant (one `advance`) all count, as
    the gatekeeper reads the ledger after the whole step (a first fit that counted only the
    earlier ones put 115 ms into a 20 ms TTFT base)."""
    spans = [
        (
            r["ts"] + r["queue_ms"] / 1000.0,
            r["ts"] + (r["queue_ms"] + r["ttft_ms"]) / 1000.0,
            r["ts"] + r["duration_ms"] / 1000.0,
            r["prompt_tokens"],
        )
        for r in ran
    ]
    order = sorted(range(len(spans)), key=lambda i: spans[i][0])
    prefilling: list[tuple[float, int]] = []  # heap of (first token at, prompt)
    running: list[float] = []  # heap of ends
    ahead_tokens = 0
    x, busy = [0.0] * len(spans), [1.0] * len(spans)
    k = 0
    while k < len(order):
        d = spans[order[k]][0]
        group = []
        while k < len(order) and spans[order[k]][0] - d <= 1e-6:
            group.append(order[k])
            k += 1
        while prefilling and prefilling[0][0] <= d:
            ahead_tokens -= heapq.heappop(prefilling)[1]
        while running and running[0] <= d:
            heapq.heappop(running)
        for i in group:
            heapq.heappush(prefilling, (spans[i][1], spans[i][3]))
            ahead_tokens += spans[i][3]
            heapq.heappush(running, spans[i][2])
        for i in group:
            x[i] = float(ahead_tokens)
            busy[i] = float(len(running))
    return x, busy


#: the fewest completed requests, and the least spread (tokens) of the prompt tokens prefilling
#: at dispatch, from which the fit separates a prefill rate
PREFILL_FIT_POINTS = 8
PREFILL_FIT_SPREAD = 64


def _prefill_not_fitted(points: int, prompts: list[float]) -> str:
    """Why no fit with a prompt term is tried (or "" when one is)."""
    if points < PREFILL_FIT_POINTS:
        return f"only {points} completed requests: {PREFILL_FIT_POINTS} are needed to separate a prefill rate"
    lo, hi = min(prompts), max(prompts)
    if hi - lo < PREFILL_FIT_SPREAD:
        return f"the prompt tokens prefilling at each dispatch barely vary: {lo:.0f}-{hi:.0f}, under {PREFILL_FIT_SPREAD} apart"
    return ""


def _prefill_rejected(sol: list[float] | None, prompts: list[float], with_busy: bool) -> str:
    """Why a fit of TTFT with a prompt term (`sol`: base, [per busy slot,] per prompt token) was
    not taken: the reason the note gives."""
    span = f"{min(prompts):.0f}-{max(prompts):.0f} prompt tokens prefilling at dispatch"
    if sol is None:
        return f"over {span}, the prompt sizes move with the busy slots: least squares cannot tell them apart"
    if sol[-1] <= 1e-7:
        return (
            f"over {span}, TTFT did not grow with the prompt: the fitted slope is "
            f"{sol[-1] * 1e6:+.2f} ms per 1,000 tokens{' (beside the busy slots)' if with_busy else ''}"
        )
    negative = "base" if sol[0] < 0 else "cost per busy slot"
    return f"over {span}, the fit's TTFT {negative} came out negative ({min(sol[:-1]) * 1000:.0f} ms)"


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2] if ordered else 0.0


def _learned(text: str | None) -> dict[str, Any] | None:
    """A capacity_learned row's value (None when it does not parse as one)."""
    try:
        value = json.loads(text or "")
    except ValueError:
        return None
    ok = isinstance(value, dict) and value.get("kv") in ("unified", "split")
    return value if ok and all(isinstance(value.get(k), int) and value[k] > 0 for k in ("slots", "slot_context")) else None


def _describe_learned(v: dict[str, Any]) -> str:
    return f"{v['slots']} slot{'' if v['slots'] == 1 else 's'} of {v['slot_context']}, {v['kv']} KV, pool {learned_pool(v)}"


def _capacity_moves(changes: list[Change], backend: str, used: dict[str, Any] | None, since: float) -> list[str]:
    """The window's capacity_learned rows that differ from the capacity replayed (llama-server
    restarted with another -c or -np under the gate): the replay models one capacity per window,
    and says so instead of replaying the rest of the window on a pool it no longer had."""
    if used is None:
        return []
    keys = ("slots", "slot_context", "kv")
    out = []
    for c in changes:
        if c.action != CAPACITY_LEARNED or c.target != f"backend:{backend}" or c.at <= 0:
            continue
        moved = _learned(c.new_value)
        if moved is None or (all(moved[k] == used[k] for k in keys) and learned_pool(moved) == learned_pool(used)):
            continue
        out.append(
            f"llama-server's capacity changed within the window at {_hms(since + c.at)} (to {_describe_learned(moved)}): "
            f"the whole window is replayed on {_describe_learned(used)}; replay the windows before and after it apart "
            f"(--until / --since {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(since + c.at))})"
        )
    return out


def learned_pool(learned: dict[str, Any] | None) -> int | None:
    """llama-server's KV pool from a capacity_learned value: its ``pool`` (written since the gate
    recorded it), else from the layout as `gate.backend.pool.capacity_from_props` sizes it (unified:
    every slot reports the whole pool; split: slots x each slot's context). Not its ``ceiling``:
    that is the configured token_budget when there is one. None: no learned capacity."""
    if learned is None:
        return None
    pool = learned.get("pool")
    if isinstance(pool, int) and pool > 0:
        return pool
    return int(learned["slot_context"]) if learned["kv"] == "unified" else int(learned["slots"] * learned["slot_context"])


def fit_backend(
    rows: list[sqlite3.Row], samples: list[sqlite3.Row], config: Config, since: float, learned: dict[str, Any] | None = None
) -> BackendFit:
    """Slots, pool layout, prefill rate and decode rate vs occupancy from the recorded requests;
    `learned`: the capacity the gate learned from llama-server (its capacity_learned row)."""
    notes: list[str] = []
    bcfg = config.backends[0]
    slots = max((s["slots_total"] for s in samples if s["slots_total"]), default=None)
    if learned is not None:
        slots = learned["slots"]
    if slots is None:
        slots = 4
        notes.append("slots not in the samples: assumed 4")
    # The pool: what the gate learned from llama-server (`learned_pool`), else the configured
    # token_budget, else the highest working budget sampled (the controller's budget, not the
    # pool: a window after an operator's cut to 600 replayed a 2,048-token pool as 660, a user's
    # trial, 2026-12-05). The configured token_budget went first until a trial's token_budget 1400
    # on a 2,048-token pool read "unified pool of 1400 tokens", and replayed a --config without
    # token_budget at 1,400 where a gate would have used 2,048.
    budgets = [s["budget"] for s in samples if s["budget"]]
    ceiling = learned_pool(learned)
    if ceiling is None and bcfg.token_budget is not None:
        ceiling = bcfg.token_budget
        notes.append(
            f"llama-server's KV pool is not in the journal (no capacity_learned row): taken as the configured token_budget "
            f"{ceiling}; a proposal without token_budget, or above it, is replayed on that pool, which may not be the real one"
        )
    if ceiling is None and budgets:
        ceiling = max(budgets)
        notes.append("pool size not in the journal (no capacity_learned row that reads): the highest working budget sampled")
    if ceiling is None:
        ceiling = max((r["reserved_tokens"] for r in rows), default=2048) or 2048
        notes.append("pool size not in the samples: the largest reservation")
    if learned is not None:
        kv, slot_context = learned["kv"], learned["slot_context"]  # what the gate learned from llama-server
    else:
        kv = "split" if bcfg.kv == "split" else "unified"
        slot_context = ceiling // slots if kv == "split" else ceiling
        if bcfg.kv == "auto":
            notes.append(f"the KV layout the gate learned is not in the journal (no capacity_learned row that reads): taken as {kv}")
    ran = [
        r
        for r in rows
        if r["outcome"] == "admitted"
        and r["ttft_ms"] is not None
        and r["queue_ms"] is not None
        and r["completion_tokens"]
        and r["prompt_tokens"] is not None
    ]
    if len(ran) < 3:
        done = "no completed requests" if not ran else f"only {len(ran)} completed request{'' if len(ran) == 1 else 's'}"
        notes.append(f"{done}: the backend model uses defaults")
        return BackendFit(slots, slot_context, ceiling, kv, notes=tuple(notes), points=len(ran))
    ttft = [r["ttft_ms"] / 1000.0 for r in ran]
    # As the gate's PrefillModel: x = the prompt plus the prompt tokens still prefilling when it was
    # dispatched (reconstructed: dispatched before it, first token after its dispatch); and the
    # requests in flight at its dispatch, itself included.
    prompts, at_dispatch = _prefill_ahead(ran)
    busy_ttft = at_dispatch
    # TTFT = base + per_busy * (busy - 1) + prompt / rate. A term enters only when its regressor
    # varies enough to be separated from the others (and comes out non-negative): with a burst
    # that keeps every slot busy, or prompts all of one size, least squares would extrapolate
    # noise (a first try fitted 219 s from four points that all had 4 busy slots).
    spread_busy = len(ran) >= PREFILL_FIT_POINTS and max(busy_ttft) - min(busy_ttft) >= 1.0
    spread_prompt = len(ran) >= PREFILL_FIT_POINTS and max(prompts) - min(prompts) >= PREFILL_FIT_SPREAD
    base, per_busy, rate = _median(ttft), 0.0, 1e9
    why = _prefill_not_fitted(len(ran), prompts)  # why no prompt term, when it is not tried
    for use_busy, use_prompt in ((spread_busy, spread_prompt), (False, spread_prompt), (spread_busy, False)):
        if not (use_busy or use_prompt):
            continue
        cols = [[1.0] + ([b - 1.0] if use_busy else []) + ([p] if use_prompt else []) for b, p in zip(busy_ttft, prompts)]
        sol = _lstsq(cols, ttft)
        if sol is not None and all(v >= 0 for v in sol) and (not use_prompt or sol[-1] > 1e-7):
            base = sol[0]
            per_busy = sol[1] if use_busy else 0.0
            rate = 1.0 / sol[-1] if use_prompt else 1e9
            break
        if use_prompt:
            why = _prefill_rejected(sol, prompts, use_busy)  # the last fit with a prompt term tried
    if rate >= 1e9:
        # each fallback says its own reason: a trial's note read "prompt sizes barely vary" where
        # they varied 53-474 tokens and the fitted slope was negative
        notes.append(f"prefill rate not separable ({why}): folded into the TTFT base")
    tp_x, tp_y = [], []
    # Decode time per token against the requests in flight at dispatch: what the engine's model
    # reads (the mean over the decode fitted 12% slow on a model-made journal).
    for r, b in zip(ran, busy_ttft):
        n = r["completion_tokens"]
        if n and n > 1:
            decode_s = (r["duration_ms"] - r["queue_ms"] - r["ttft_ms"]) / 1000.0
            if decode_s > 0:
                tp_x.append([1.0, b - 1.0])
                tp_y.append(decode_s / (n - 1))
    tpot_alone, tpot_busy = (_median(tp_y) if tp_y else 0.02), 0.0
    if len(tp_x) >= 8 and max(x[1] for x in tp_x) - min(x[1] for x in tp_x) >= 1.0:
        tsol = _lstsq(tp_x, tp_y)
        if tsol is not None and tsol[0] > 0 and tsol[1] >= 0:
            tpot_alone, tpot_busy = tsol
    else:
        notes.append(
            "occupancy barely varied in the window: decode speed is taken as independent of it "
            "(a proposal that changes concurrency is then predicted less well)"
        )
    return BackendFit(
        slots=slots,
        slot_context=slot_context,
        ceiling=ceiling,
        kv=kv,
        ttft_base_s=max(0.0, base),
        ttft_per_busy_s=max(0.0, per_busy),
        prefill_tps=rate,
        tpot_alone_s=max(1e-5, tpot_alone),
        tpot_per_busy_s=max(0.0, tpot_busy),
        points=len(ran),
        notes=tuple(notes),
    )
