"""The journal's read side for people: the review screen's reader, its filters, its CSV export.

* :class:`JournalReader`: a read-only (``file:...?mode=ro`` + ``query_only``) aiosqlite
  connection with the journal's read queries (the same SQL as ``gate.journal.Journal``'s
  read side, so a page and a count mean the same thing) plus the review's own: the
  journal's time bounds, samples bucketed in SQL for the chart, audit rows capped.
  ``Journal.open`` cannot be used here: it creates, migrates and applies retention
  (deletes), and review must never write.
* :class:`DecisionFilters`: the one decision-filter type, used by the queries, the export
  and the review screen.
* :func:`check_journal`: the synchronous open check (``gate.journal.export``'s read-only
  opening), for the CLI to fail fast with exit code 1 and a clear message.
* :func:`export_decisions_csv`: every decision matching the filters and range, streamed to
  CSV with ``gate.journal.export``'s CSV writer (same columns and formatting as
  ``tokengate log --format csv``); blocking, run it in a thread.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiosqlite

from gate.journal import COLUMNS, DecisionFilters, JournalQueries, time_where
from gate.journal.export import FETCH, ExportError, check_version, open_read_only, parse_since, window_moments, write_csv
from gate.journal.queries import FILTER_FIELDS, selects
from gate.journal.schema import present_columns, select_list

__all__ = [
    "FILTER_FIELDS",
    "parse_since",  # `--since`'s and the review's `since=` terms: one reading of "10m" or an ISO time
    "window_moments",  # ... and of a time-of-day end before its start (on the start's day)
    "DecisionFilters",
    "JournalReader",
    "default_export_name",
    "ReviewError",
    "SeriesPoint",
    "check_journal",
    "export_decisions_csv",
]


class ReviewError(Exception):
    """The journal cannot be reviewed (the message names the file)."""


@dataclass(frozen=True, slots=True)
class SeriesPoint:
    """One chart point for one time bucket: budget averaged and in-flight the peak, each
    per backend then summed over backends; p95 TTFT the worst sample of any backend."""

    ts: float
    budget: float | None
    in_flight: float | None
    p95_ttft_ms: float | None


def check_journal(path: str | os.PathLike[str]) -> None:
    """Raise :class:`ReviewError` unless ``path`` is a journal this tokengate can read."""
    path = os.fspath(path)
    try:
        conn = open_read_only(path)
    except ExportError as e:
        raise ReviewError(str(e)) from None
    try:
        conn.execute("SELECT 1 FROM decisions LIMIT 0")
        conn.execute("SELECT 1 FROM audit LIMIT 0")
        conn.execute("SELECT 1 FROM samples LIMIT 0")
    except sqlite3.Error as e:
        raise ReviewError(f"{path}: not a readable tokengate journal: {e}") from None
    finally:
        conn.close()


class JournalReader(JournalQueries):
    """Read-only access to a journal for the review screen. ``await JournalReader.open(path)``,
    always ``await close()``. Reads run on aiosqlite's thread, never on the event loop."""

    def __init__(self, path: str, conn: aiosqlite.Connection) -> None:
        self.path = path
        self._conn = conn

    @classmethod
    async def open(cls, path: str | os.PathLike[str], *, busy_timeout_ms: int = 5000) -> JournalReader:
        path = os.fspath(path)
        if not os.path.exists(path):
            raise ReviewError(f"{path}: journal file not found (the demo writes tokengate-demo.db; pass --journal FILE)")
        if not os.path.isfile(path):
            raise ReviewError(f"{path}: not a file")
        uri = Path(path).absolute().as_uri() + "?mode=ro"
        try:
            conn = await aiosqlite.connect(uri, uri=True, timeout=busy_timeout_ms / 1000.0)
        except sqlite3.Error as e:
            raise ReviewError(f"{path}: cannot read the journal: {e}") from None
        try:
            conn.row_factory = sqlite3.Row
            await conn.execute("PRAGMA query_only = 1")
            await conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
            (version,) = list(await conn.execute_fetchall("PRAGMA user_version"))[0]
            problem = check_version(path, version, "review")
            if problem is not None:
                raise ReviewError(problem)
            present: dict[str, set[str]] = {}
            for table in ("decisions", "audit", "samples"):
                await conn.execute_fetchall(f"SELECT 1 FROM {table} LIMIT 0")
                present[table] = {row[1] for row in await conn.execute_fetchall(f"PRAGMA table_info({table})")}
        except ReviewError:
            await _close_quietly(conn)
            raise
        except sqlite3.Error as e:
            await _close_quietly(conn)
            raise ReviewError(f"{path}: cannot read the journal: {e}") from None
        except BaseException:
            await _close_quietly(conn)
            raise
        reader = cls(path, conn)
        reader._selects = selects(present)  # an older journal (a gate of an older tokengate writes it): its columns
        return reader

    async def close(self) -> None:
        await _close_quietly(self._conn)

    async def _fetch(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        return list(await self._conn.execute_fetchall(sql, params))

    # -- the journal's read queries (same SQL as gate.journal.Journal) ------------------

    # -- the review's own ------------------------------------------------------------

    async def bounds(self) -> tuple[float | None, float | None]:
        """(oldest ts, newest ts) over decisions, audit and samples; (None, None) if empty."""
        lo: float | None = None
        hi: float | None = None
        for table in ("decisions", "audit", "samples"):
            # two separate aggregates: each is one index probe on (ts)
            (mn,) = (await self._fetch(f"SELECT MIN(ts) FROM {table}"))[0]
            (mx,) = (await self._fetch(f"SELECT MAX(ts) FROM {table}"))[0]
            if mn is not None:
                lo = mn if lo is None else min(lo, mn)
            if mx is not None:
                hi = mx if hi is None else max(hi, mx)
        return lo, hi

    async def last_decision_ts(self) -> float | None:
        """The newest decision's ts (its arrival); None without decisions. Not ``bounds()``'s
        newest: a gate writes samples (one a second) and audit rows after its last request."""
        (mx,) = (await self._fetch("SELECT MAX(ts) FROM decisions"))[0]
        return None if mx is None else float(mx)

    async def count_audit(self, since_ts: float | None = None, until_ts: float | None = None) -> int:
        clauses, params = time_where(since_ts, until_ts)
        sql = "SELECT COUNT(*) FROM audit" + (" WHERE " + " AND ".join(clauses) if clauses else "")
        return int((await self._fetch(sql, params))[0][0])

    async def audit_marks(self, since_ts: float, until_ts: float, *, buckets: int = 200) -> list[tuple[float, str]]:
        """(ts, action) of audit rows in [since_ts, until_ts) for the chart: at most one per
        time bucket (an operator's change before the controller's moves), oldest first."""
        width = max((until_ts - since_ts) / max(1, buckets), 1e-6)
        # SQLite: with a single max() the bare columns come from the row holding the maximum
        sql = """
            SELECT ts, action, MAX((source != 'controller') * 1e15 + ts) FROM audit
            WHERE ts >= ? AND ts < ?
            GROUP BY CAST((ts - ?) / ? AS INTEGER) ORDER BY ts
        """
        rows = await self._fetch(sql, (since_ts, until_ts, since_ts, width))
        return [(float(r[0]), str(r[1])) for r in rows]

    async def sample_series(self, since_ts: float, until_ts: float, *, buckets: int = 600) -> list[SeriesPoint]:
        """Samples in [since_ts, until_ts) averaged into at most ``buckets`` time buckets,
        in SQL (a day of per-second samples never leaves SQLite as 86,400 rows). Per
        bucket: per backend the average budget and the peak in-flight, summed over
        backends; p95 TTFT the maximum (peaks stay visible); the point's time is the
        bucket's mean sample time."""
        width = max((until_ts - since_ts) / max(1, buckets), 1e-6)
        sql = """
            SELECT AVG(t), SUM(bud), SUM(inf), MAX(p95) FROM (
                SELECT CAST((ts - ?) / ? AS INTEGER) AS b, backend,
                       AVG(ts) AS t, AVG(budget) AS bud, MAX(in_flight) AS inf, MAX(p95_ttft_ms) AS p95
                FROM samples WHERE ts >= ? AND ts < ?
                GROUP BY b, backend
            ) GROUP BY b ORDER BY b
        """
        rows = await self._fetch(sql, (since_ts, width, since_ts, until_ts))
        return [SeriesPoint(float(r[0]), r[1], r[2], r[3]) for r in rows]


async def _close_quietly(conn: aiosqlite.Connection) -> None:
    with contextlib.suppress(Exception):
        await conn.close()


# ------------------------------------------------------------------------------------------
# CSV export


def export_decisions_csv(
    journal_path: str | os.PathLike[str],
    out_path: str | os.PathLike[str],
    filters: DecisionFilters,
    *,
    cancelled: Callable[[], bool] | None = None,
) -> int:
    """Write every decision matching ``filters`` (oldest first) to ``out_path`` as CSV, in
    ``tokengate log --format csv``'s columns and formatting; returns the row count.

    Blocking and streamed (``fetchmany``), on its own read-only connection: run it in a
    thread. Writes ``out_path + ".part"`` and renames it at the end, so a failed or
    cancelled export never leaves a truncated file under the final name.
    """
    journal_path = os.fspath(journal_path)
    out_path = os.fspath(out_path)
    try:
        conn = open_read_only(journal_path)
    except ExportError as e:
        raise ReviewError(str(e)) from None
    part = out_path + ".part"
    try:
        columns = ["id", *COLUMNS["decisions"]]
        clauses, params = filters.where()
        sql = "SELECT " + select_list("decisions", present_columns(conn, "decisions")) + " FROM decisions"
        if clauses:
            sql += " WHERE " + " AND ".join(clauses)
        sql += " ORDER BY ts, id"
        cursor = conn.execute(sql, params)

        def rows() -> Iterator[tuple[Any, ...]]:
            try:
                while True:
                    if cancelled is not None and cancelled():
                        raise ReviewError("export cancelled")
                    chunk = cursor.fetchmany(FETCH)
                    if not chunk:
                        return
                    yield from chunk
            finally:
                cursor.close()

        # As private as the journal it comes from (0600): tenant names and request sizes.
        fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with open(fd, "w", newline="", encoding="utf-8") as out:
            n = write_csv(columns, rows(), out)
        os.replace(part, out_path)
        return n
    except sqlite3.Error as e:
        raise ReviewError(f"{journal_path}: reading decisions failed: {e}") from None
    finally:
        conn.close()
        with contextlib.suppress(OSError):
            os.unlink(part)


def default_export_name(now: float | None = None) -> str:
    """``tokengate-review-20250131-140000.csv`` (local time of the export)."""
    return time.strftime("tokengate-review-%Y%m%d-%H%M%S.csv", time.localtime(now))
