"""``Journal``: the group-commit writer, its fault handling and retention.

Write side
    ``Journal.add(row)`` never blocks and never raises: the row goes into a bounded
    buffer and the call returns a future that resolves ``True`` once the transaction
    holding the row has committed, ``False`` when the row was dropped (buffer full, bad
    row, the write failed, or the journal is closed). One writer task wakes as soon as
    rows are pending, writes everything pending (up to ``max_batch``) in ONE transaction
    (``executemany`` per table, all in one call on the connection's thread), resolves the futures and loops: under light load a row
    commits within a millisecond or two, under heavy load the batches grow by themselves.

    Faults (disk full, read-only file or directory, database locked past
    ``busy_timeout``, I/O errors, the directory gone) never reach the caller: the failed
    batch's rows are counted as dropped (their futures resolve ``False``), ``last_error``
    is recorded, the connection is thrown away and reopened with backoff (0.5 s doubling
    to 5 s), so writing resumes by itself once the fault is removed. While the writer is
    failing, rows keep queueing up to ``max_pending``; beyond it they are dropped at once.
    A row waiting through a fault resolves at the next attempt, so a caller that must not
    wait that long bounds its wait (``asyncio.timeout`` around ``asyncio.shield(fut)``).

    ``add`` must be called from the event loop the journal was opened in.

Retention
    ``apply_retention()`` deletes rows older than ``retention_days`` from the three
    tables, in chunks, in the writer's connection between batches (so it never holds the
    write lock for long). The journal runs it once at open and hourly by itself.

Files
    The file is created with mode 0600 before SQLite touches it (SQLite gives the
    ``-wal``/``-shm`` files the same mode; they are chmod'ed too).

Read side
    ``JournalQueries`` (``queries``) on the journal's own read-only connection, opened
    here on first use and reopened after an error.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
import os
import sqlite3
import stat
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import aiosqlite

from gate.journal.queries import JournalQueries
from gate.journal.rows import _INSERT, _TABLE_OF, _TABLE_OF_NAME, Row
from gate.journal.schema import (
    MIGRATIONS,
    SCHEMA_VERSION,
    TABLES,
    JournalError,
    JournalVersionError,
    _newer_message,
    migrate_sync,
)

log = logging.getLogger("gate.journal")

# Errors that mean "this row's data cannot be stored", not "the disk is in trouble".
_DATA_ERRORS = (
    AttributeError,  # a malformed row (e.g. not a ClassSample in a sample's classes)
    sqlite3.IntegrityError,
    sqlite3.InterfaceError,
    sqlite3.ProgrammingError,
    OverflowError,
    TypeError,
    ValueError,
)


@dataclasses.dataclass(frozen=True, slots=True)
class JournalHealth:
    ok: bool  # the last write (or open) attempt succeeded, and the journal is open
    failing: bool  # the last write (or open) attempt failed (kept after close: did the last rows land?)
    dropped: int  # rows dropped since open (buffer full, failed writes, bad rows, closed)
    written: int  # rows committed since open
    pending: int  # rows accepted but not yet resolved
    last_error: str | None  # the most recent fault, kept after recovery
    path: str


@dataclasses.dataclass(slots=True)
class _RetentionJob:
    cutoff: float
    future: asyncio.Future[dict[str, int]] | None
    tables: list[str]
    deleted: dict[str, int]


def private_file(path: str) -> None:
    """Create ``path`` with mode 0600 if it does not exist; tighten it if it does."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
    except FileExistsError:
        _tighten(path)
    else:
        os.close(fd)


def _tighten(path: str) -> None:
    try:
        st = os.stat(path)
        if stat.S_ISREG(st.st_mode) and st.st_mode & 0o077:
            os.chmod(path, stat.S_IMODE(st.st_mode) & 0o600)
    except OSError:
        pass


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"


def _write_groups(db: sqlite3.Connection, groups: dict[str, list[Row]]) -> None:
    """One transaction of the batch's rows, on the connection's thread; rolled back on any error."""
    db.execute("BEGIN IMMEDIATE")
    try:
        for table, rows in groups.items():
            db.executemany(_INSERT[table], map(_TABLE_OF_NAME[table], rows))  # rows become tuples here
        db.execute("COMMIT")
    except BaseException:
        with contextlib.suppress(Exception):
            db.execute("ROLLBACK")
        raise


def write_now(path: str, rows: Sequence[Row], *, busy_timeout_ms: int = 5000) -> None:
    """Write `rows` into the journal at `path` in one committed transaction, from a one-shot
    command with no gate running (`tokengate overrides drop` offline, which deleted the kept
    overrides with no trace before): created 0600 and brought to this schema as the gate's writer
    does. Raises (sqlite3.Error, OSError, JournalVersionError) rather than drop a row: the caller
    changes nothing it could not record."""
    if path == ":memory:":
        raise JournalError("no journal file to write to (:memory:)")
    private_file(path)
    db = sqlite3.connect(path, isolation_level=None, timeout=busy_timeout_ms / 1000.0)
    try:
        db.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
        db.execute("PRAGMA journal_mode = WAL")  # as the gate's writer keeps it (a no-op when it is)
        migrate_sync(db, path)
        groups: dict[str, list[Row]] = {}
        for row in rows:
            groups.setdefault(_TABLE_OF[type(row)][0], []).append(row)
        _write_groups(db, groups)
    finally:
        db.close()
    for suffix in ("-wal", "-shm"):
        _tighten(path + suffix)


async def _on_thread(conn: aiosqlite.Connection, fn: Callable[..., Any], *args: Any) -> Any:
    """Run ``fn(sqlite3_connection, *args)`` on aiosqlite's thread for ``conn``, in one call.

    aiosqlite 0.22 (pinned <0.23) queues work for its thread with ``_execute`` and holds the
    sqlite3 connection in ``_connection``; it has no public way to run several statements in
    one hop. tests/unit/test_journal.py checks both are still there.
    """

    def call() -> Any:
        db = conn._connection
        if db is None:
            raise sqlite3.OperationalError("the journal's connection is closed")
        return fn(db, *args)

    execute = getattr(conn, "_execute", None)
    if execute is None:  # not a data error: the batch must not be retried row by row and "work"
        raise JournalError("aiosqlite has no Connection._execute: this aiosqlite is not supported")
    return await execute(call)


class Journal(JournalQueries):
    """The SQLite journal. Create with ``await Journal.open(path)``; always ``await close()``."""

    RETENTION_INTERVAL_S = 3600.0
    RETENTION_CHUNK = 5000

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        max_pending: int,
        max_batch: int,
        retention_days: float,
        clock: Callable[[], float],
        busy_timeout_ms: int,
        on_drop: Callable[[int], None] | None,
        close_timeout_s: float,
        backoff_s: tuple[float, float] = (0.5, 5.0),
    ) -> None:
        self.path = os.fspath(path)
        self._memory = self.path == ":memory:"
        if self._memory:  # a shared in-memory database, so the reader sees the writer's rows
            name = f"tokengate-{uuid.uuid4().hex}"
            self._write_target = f"file:{name}?mode=memory&cache=shared"
            self._read_target = self._write_target
        else:
            self._write_target = self.path
            self._read_target = Path(self.path).absolute().as_uri() + "?mode=ro"
        self.max_pending = max(1, int(max_pending))
        self.max_batch = max(1, int(max_batch))
        self.retention_days = float(retention_days)
        self.busy_timeout_ms = int(busy_timeout_ms)
        self.close_timeout_s = float(close_timeout_s)
        self.on_drop = on_drop
        #: called after the writer started a new file because the old one was deleted or
        #: replaced: the gate writes the rows that describe it (config_in_force) there again
        self.on_new_file: Callable[[], None] | None = None
        self.backoff_min_s, self.backoff_max_s = (float(b) for b in backoff_s)
        self._clock = clock
        self._loop = asyncio.get_running_loop()

        self._pending: collections.deque[tuple[Row, asyncio.Future[bool]]] = collections.deque()
        self._inflight: list[tuple[Row, asyncio.Future[bool]]] = []
        self._wake = asyncio.Event()
        self._kick = asyncio.Event()  # interrupts a backoff sleep (close)
        self._conn: aiosqlite.Connection | None = None
        self._rconn: aiosqlite.Connection | None = None
        #: (st_dev, st_ino) of the file the writer's connection has open: a file deleted or
        #: replaced under a running gate is noticed before the next batch, not written into the void
        self._file_id: tuple[int, int] | None = None
        self._rlock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None

        self._accepting = True
        self._stopping = False
        self._closed = False
        self._failing = False
        self._retry_at = 0.0
        self._backoff = self.backoff_min_s
        self._last_error: str | None = None
        self._dropped = 0
        self._written = 0
        #: committed write transactions (row batches); retention deletes are not counted
        self.transactions = 0
        self._retention_jobs: collections.deque[_RetentionJob] = collections.deque()
        self._next_retention = time.monotonic()  # open() queues the first pass; then hourly

    # -- lifecycle ---------------------------------------------------------------------

    @classmethod
    async def open(
        cls,
        path: str | os.PathLike[str],
        *,
        max_pending: int = 50_000,
        max_batch: int = 1000,
        retention_days: float = 14.0,
        clock: Callable[[], float] = time.time,
        busy_timeout_ms: int = 1000,
        on_drop: Callable[[int], None] | None = None,
        close_timeout_s: float = 5.0,
        backoff_s: tuple[float, float] = (0.5, 5.0),
        strict: bool = False,
    ) -> Journal:
        """Open (creating or migrating) the journal and start its writer.

        A journal of a newer schema version raises ``JournalVersionError``. Any other
        failure to open (missing directory, read-only file, ...) raises ``JournalError``
        when ``strict``; otherwise the journal starts unhealthy (``health.ok`` False,
        ``last_error`` set) and the writer keeps retrying with backoff.

        ``busy_timeout_ms``: how long a write waits for another process's lock before
        the batch counts as failed. ``backoff_s``: (first, longest) retry delay after a
        fault, doubling in between. ``on_drop(n)`` is called whenever n rows are dropped.
        """
        journal = cls(
            path,
            max_pending=max_pending,
            max_batch=max_batch,
            retention_days=retention_days,
            clock=clock,
            busy_timeout_ms=busy_timeout_ms,
            on_drop=on_drop,
            close_timeout_s=close_timeout_s,
            backoff_s=backoff_s,
        )
        try:
            await journal._connect_writer()
        except JournalVersionError:
            raise
        except Exception as e:  # noqa: BLE001 - any fault: degrade, or refuse when strict
            if strict:
                raise JournalError(f"{journal.path}: cannot open the journal: {_describe(e)}") from e
            journal._note_fault(e)
            log.warning("journal %s: cannot open, will retry: %s", journal.path, _describe(e))
        journal._schedule_retention()  # the pass at open, ahead of anything asked later
        journal._task = asyncio.get_running_loop().create_task(journal._run(), name=f"journal-writer:{journal.path}")
        return journal

    async def close(self, timeout: float | None = None) -> None:
        """Flush what is pending (bounded by ``timeout``, default ``close_timeout_s``), then
        close both connections. Rows still pending after the timeout are dropped."""
        if self._closed:
            return
        self._stopping = True
        self._wake.set()
        self._kick.set()
        timeout = self.close_timeout_s if timeout is None else timeout
        task = self._task
        if task is not None and not task.done():
            try:
                async with asyncio.timeout(timeout):
                    await asyncio.shield(task)
            except TimeoutError:
                log.warning("journal %s: flush timed out after %.1f s", self.path, timeout)
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
            except Exception:  # noqa: BLE001 - the writer never raises; be safe anyway
                log.exception("journal %s: writer failed", self.path)
        self._accepting = False
        self._drop(self._inflight)
        self._inflight = []
        self._drop(list(self._pending))
        self._pending.clear()
        for job in self._retention_jobs:
            if job.future is not None and not job.future.done():
                job.future.set_exception(JournalError(f"{self.path}: journal closed"))
        self._retention_jobs.clear()
        # The read-only reader first: SQLite folds the WAL into the file and deletes it when the
        # last connection closes, which a read-only one cannot do. Closed last, it left every
        # row of a clean stop in tokengate.db-wal (a user's trial copied tokengate.db alone
        # after a SIGTERM and had 416 of 444 decisions).
        rconn, self._rconn = self._rconn, None
        if rconn is not None:
            with contextlib.suppress(Exception):
                await rconn.close()
        await self._close_writer_conn(checkpoint=not self._memory)
        self._closed = True

    async def __aenter__(self) -> Journal:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- write side --------------------------------------------------------------------

    def add(self, row: Row) -> asyncio.Future[bool]:
        """Queue one row; never blocks, never raises. See the module docstring."""
        try:
            fut: asyncio.Future[bool] = self._loop.create_future()
        except Exception:  # noqa: BLE001 - the loop is closed: nothing can be awaited anyway
            fut = asyncio.Future(loop=self._loop)
            fut.set_result(False)
            self._count_dropped(1)
            return fut
        try:
            if not self._accepting or type(row) not in _TABLE_OF:
                if self._accepting:
                    log.warning("journal %s: not a journal row: %r", self.path, type(row))
                fut.set_result(False)
                self._count_dropped(1)
            elif len(self._pending) >= self.max_pending:
                fut.set_result(False)
                self._count_dropped(1)
            else:
                self._pending.append((row, fut))
                if not self._wake.is_set():
                    self._wake.set()
        except Exception:  # noqa: BLE001 - never raise into the request path
            if not fut.done():
                fut.set_result(False)
            self._count_dropped(1)
        return fut

    @property
    def health(self) -> JournalHealth:
        return JournalHealth(
            ok=not self._failing and not self._closed,
            failing=self._failing,
            dropped=self._dropped,
            written=self._written,
            pending=len(self._pending) + len(self._inflight),
            last_error=self._last_error,
            path=self.path,
        )

    async def apply_retention(self, now: float | None = None) -> dict[str, int]:
        """Delete rows older than ``retention_days`` (relative to ``now``, default the
        clock) from all three tables; returns the rows deleted per table. Runs in the
        writer's connection between batches; raises ``JournalError`` if it fails."""
        if self._stopping or self._closed:
            raise JournalError(f"{self.path}: journal closed")
        now = self._clock() if now is None else now
        fut: asyncio.Future[dict[str, int]] = self._loop.create_future()
        self._retention_jobs.append(_RetentionJob(now - self.retention_days * 86400.0, fut, list(TABLES), dict.fromkeys(TABLES, 0)))
        self._wake.set()
        return await fut

    # -- the writer --------------------------------------------------------------------

    def _has_work(self) -> bool:
        return bool(self._pending) or bool(self._retention_jobs)

    async def _run(self) -> None:
        while True:
            try:
                if await self._step():
                    return
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - the writer must survive anything
                log.exception("journal %s: writer error", self.path)
                self._note_fault(e)
                self._drop(self._inflight)
                self._inflight = []
                await self._close_writer_conn()

    async def _step(self) -> bool:
        """One turn of the writer; True when it is done (closing and nothing left)."""
        while True:
            if time.monotonic() >= self._next_retention and not self._stopping:
                self._schedule_retention()
            if self._has_work():
                break
            if self._stopping:
                self._accepting = False  # same step as the emptiness check: nothing sneaks in
                return True
            self._wake.clear()
            delay = self._next_retention - time.monotonic()
            if delay > 0:
                with contextlib.suppress(TimeoutError, asyncio.TimeoutError):
                    async with asyncio.timeout(delay):
                        await self._wake.wait()

        if self._stopping and not self._pending:
            # closing: abandon retention, nothing else to flush
            for job in self._retention_jobs:
                if job.future is not None and not job.future.done():
                    job.future.set_exception(JournalError(f"{self.path}: journal closed"))
            self._retention_jobs.clear()
            return False

        wait = self._retry_at - time.monotonic()
        if wait > 0:
            if self._stopping:
                wait = min(wait, 0.1)
            self._kick.clear()
            with contextlib.suppress(TimeoutError, asyncio.TimeoutError):
                async with asyncio.timeout(wait):
                    await self._kick.wait()

        n = min(len(self._pending), self.max_batch)
        batch = [self._pending.popleft() for _ in range(n)]
        self._inflight = batch
        try:
            anew = self._conn is not None and self._file_gone()
            if anew:
                await self._close_writer_conn()
                await self._drop_reader()
            if self._conn is None:
                await self._connect_writer()
            if anew and self.on_new_file is not None:
                try:
                    self.on_new_file()
                except Exception:  # noqa: BLE001 - a hook must not break the journal
                    log.exception("journal %s: on_new_file hook failed", self.path)
            if batch:
                await self._write(batch)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - a fault: drop this batch, back off, retry
            self._inflight = []
            self._drop(batch)
            self._note_fault(e)
            self._fail_retention_callers(e)
            await self._close_writer_conn()
            return False
        self._inflight = []
        self._recovered()

        if self._retention_jobs and not self._stopping:
            try:
                await self._retention_step()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001
                self._note_fault(e)
                self._fail_retention_callers(e)
                await self._close_writer_conn()
        return False

    async def _write(self, batch: list[tuple[Row, asyncio.Future[bool]]]) -> None:
        groups: dict[str, list[Row]] = {}
        owners: dict[str, list[asyncio.Future[bool]]] = {}
        for row, fut in batch:
            table = _TABLE_OF[type(row)][0]
            groups.setdefault(table, []).append(row)
            owners.setdefault(table, []).append(fut)
        conn = self._conn
        assert conn is not None
        try:
            # One hop to the connection's thread for the whole transaction, not one for BEGIN,
            # one per table and one for COMMIT: each hop is a future, a wake-up of this loop
            # and a thread switch, paid on the gate's loop for every batch.
            await _on_thread(conn, _write_groups, groups)
        except _DATA_ERRORS as e:
            log.warning("journal %s: a row could not be stored (%s); retrying row by row", self.path, _describe(e))
            await self._write_one_by_one(groups, owners)
            return
        self.transactions += 1
        self._written += len(batch)
        for _row, fut in batch:
            if not fut.done():
                fut.set_result(True)

    async def _write_one_by_one(self, groups: dict[str, list[Row]], owners: dict[str, list[asyncio.Future[bool]]]) -> None:
        """A batch held a row SQLite refused: store the others, drop only the bad ones."""
        conn = self._conn
        assert conn is not None
        stored: list[asyncio.Future[bool]] = []
        rejected: list[asyncio.Future[bool]] = []
        await conn.execute("BEGIN IMMEDIATE")
        try:
            for table, rows in groups.items():
                to_tuple = _TABLE_OF_NAME[table]
                for row, fut in zip(rows, owners[table], strict=True):
                    try:
                        values = to_tuple(row)
                        await conn.execute(_INSERT[table], values)
                    except _DATA_ERRORS:
                        rejected.append(fut)
                    else:
                        stored.append(fut)
            await conn.execute("COMMIT")
        except BaseException:
            await self._rollback()
            raise
        self.transactions += 1
        self._written += len(stored)
        for fut in stored:
            if not fut.done():
                fut.set_result(True)
        for fut in rejected:
            if not fut.done():
                fut.set_result(False)
        self._count_dropped(len(rejected))

    async def _rollback(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await self._conn.execute("ROLLBACK")

    async def _retention_step(self) -> None:
        job = self._retention_jobs[0]
        conn = self._conn
        assert conn is not None
        table = job.tables[0]
        cursor = await conn.execute(
            f"DELETE FROM {table} WHERE id IN (SELECT id FROM {table} WHERE ts < ? LIMIT ?)",
            (job.cutoff, self.RETENTION_CHUNK),
        )
        n = max(cursor.rowcount, 0)
        job.deleted[table] += n
        if n < self.RETENTION_CHUNK:
            job.tables.pop(0)
        if not job.tables:
            self._retention_jobs.popleft()
            if any(job.deleted.values()):
                log.info("journal %s: retention deleted %s", self.path, job.deleted)
            if job.future is not None and not job.future.done():
                job.future.set_result(dict(job.deleted))

    def _schedule_retention(self) -> None:
        """Queue the automatic pass (no caller waits on it) and plan the next one."""
        self._next_retention = time.monotonic() + self.RETENTION_INTERVAL_S
        cutoff = self._clock() - self.retention_days * 86400.0
        self._retention_jobs.append(_RetentionJob(cutoff, None, list(TABLES), dict.fromkeys(TABLES, 0)))

    def _fail_retention_callers(self, exc: BaseException) -> None:
        keep: collections.deque[_RetentionJob] = collections.deque()
        for job in self._retention_jobs:
            if job.future is None:
                keep.append(job)  # the hourly run: retried once writing works again
            elif not job.future.done():
                job.future.set_exception(JournalError(f"{self.path}: retention failed: {_describe(exc)}"))
        self._retention_jobs = keep

    async def _connect_writer(self) -> None:
        if not self._memory:
            private_file(self.path)
        conn = await aiosqlite.connect(
            self._write_target,
            isolation_level=None,
            timeout=self.busy_timeout_ms / 1000.0,
            uri=self._memory,
        )
        try:
            await conn.execute(f"PRAGMA busy_timeout = {self.busy_timeout_ms}")
            if not self._memory:
                cursor = await conn.execute("PRAGMA journal_mode = WAL")
                row = await cursor.fetchone()
                if row is None or str(row[0]).lower() != "wal":
                    log.warning("journal %s: WAL mode refused (journal_mode=%s)", self.path, row and row[0])
            await conn.execute("PRAGMA synchronous = NORMAL")
            await self._migrate(conn)
        except BaseException:
            with contextlib.suppress(Exception):
                await conn.close()
            raise
        if not self._memory:
            for suffix in ("-wal", "-shm"):
                _tighten(self.path + suffix)
            st = os.stat(self.path)
            self._file_id = (st.st_dev, st.st_ino)
        self._conn = conn

    def _file_gone(self) -> bool:
        """True (and said loudly) when the journal's path no longer names the file the writer
        has open: deleted (rows would go into an unlinked inode and vanish at exit) or replaced."""
        if self._memory or self._file_id is None:
            return False
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            what = "deleted"
        except OSError:
            return False  # the write itself will fail and say why
        else:
            if (st.st_dev, st.st_ino) == self._file_id:
                return False
            what = "replaced by another file"
        log.error(
            "journal %s: the file was %s while the gate ran; writing to a new journal at that path from now on "
            "(the rows the old file held are in it, not in the new one)",
            self.path,
            what,
        )
        return True

    async def _drop_reader(self) -> None:
        conn, self._rconn = self._rconn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()

    async def _migrate(self, conn: aiosqlite.Connection) -> None:
        cursor = await conn.execute("PRAGMA user_version")
        (version,) = await cursor.fetchone()  # type: ignore[misc]
        if version > SCHEMA_VERSION:
            raise JournalVersionError(_newer_message(self.path, version))
        if version == SCHEMA_VERSION:
            return
        await conn.execute("BEGIN IMMEDIATE")
        try:
            cursor = await conn.execute("PRAGMA user_version")  # another process may have won
            (version,) = await cursor.fetchone()  # type: ignore[misc]
            if version > SCHEMA_VERSION:
                raise JournalVersionError(_newer_message(self.path, version))
            for step in MIGRATIONS[version:]:
                for statement in step:
                    await conn.execute(statement)
            await conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            await conn.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(Exception):
                await conn.execute("ROLLBACK")
            raise
        if version < SCHEMA_VERSION:
            log.info("journal %s: schema v%d -> v%d", self.path, version, SCHEMA_VERSION)

    async def _close_writer_conn(self, *, checkpoint: bool = False) -> None:
        """Close the writer's connection; `checkpoint`: first fold the WAL into the file and
        truncate it (best effort: a reader in another process, such as a console reviewing the
        journal, may keep SQLite from deleting it at close)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            if checkpoint:
                with contextlib.suppress(Exception):
                    await conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            with contextlib.suppress(Exception):
                await conn.close()

    # -- bookkeeping -------------------------------------------------------------------

    def _note_fault(self, exc: BaseException) -> None:
        message = _describe(exc)
        if not self._failing or message != self._last_error:
            log.warning("journal %s: write failed (retrying in %.1f s): %s", self.path, self._backoff, message)
        self._failing = True
        self._last_error = message
        self._retry_at = time.monotonic() + self._backoff
        self._backoff = min(self._backoff * 2, self.backoff_max_s)

    def _recovered(self) -> None:
        if self._failing:
            log.warning("journal %s: writing again", self.path)
        self._failing = False
        self._retry_at = 0.0
        self._backoff = self.backoff_min_s

    def _drop(self, entries: Iterable[tuple[Row, asyncio.Future[bool]]]) -> None:
        n = 0
        for _row, fut in entries:
            n += 1
            if not fut.done():
                fut.set_result(False)
        self._count_dropped(n)

    def _count_dropped(self, n: int) -> None:
        if n <= 0:
            return
        self._dropped += n
        if self.on_drop is not None:
            try:
                self.on_drop(n)
            except Exception:  # noqa: BLE001 - a metrics hook must not break the journal
                log.exception("journal %s: on_drop hook failed", self.path)

    # -- read side ---------------------------------------------------------------------

    async def _reader(self) -> aiosqlite.Connection:
        if self._closed:
            raise JournalError(f"{self.path}: journal closed")
        if self._rconn is not None:
            return self._rconn
        async with self._rlock:
            if self._rconn is None:
                if not self._memory and not os.path.isfile(self.path):
                    raise JournalError(f"{self.path}: journal file not found")
                conn = await aiosqlite.connect(self._read_target, uri=True, timeout=self.busy_timeout_ms / 1000.0)
                try:
                    conn.row_factory = sqlite3.Row
                    await conn.execute(f"PRAGMA busy_timeout = {self.busy_timeout_ms}")
                    if self._memory:
                        await conn.execute("PRAGMA read_uncommitted = 1")
                    await conn.execute("PRAGMA query_only = 1")
                except BaseException:
                    with contextlib.suppress(Exception):
                        await conn.close()
                    raise
                self._rconn = conn
            return self._rconn

    async def _fetch(self, sql: str, params: Sequence[Any]) -> list[sqlite3.Row]:
        conn = await self._reader()
        try:
            return list(await conn.execute_fetchall(sql, params))
        except sqlite3.Error:
            # the file may have been replaced or removed: reopen on the next read
            if self._rconn is conn:
                self._rconn = None
                with contextlib.suppress(Exception):
                    await conn.close()
            raise
