"""gate.journal: the SQLite journal on real files (tmp_path), faults included.

The suite runs as root, and root ignores permission bits, so "read-only" is never
simulated with chmod. Faults that really fail as root:
  * the directory is missing (open, and every reconnect, fail) until it is created;
  * another connection holds the write lock (SQLITE_BUSY past busy_timeout);
  * the file-size limit (RLIMIT_FSIZE, which binds root too) is 0 in a child process:
    every write fails with EFBIG as on a full disk, until the limit is lifted;
  * a 64 KiB tmpfs filled up (skipped when mounting is not permitted);
  * an immutable file (`chattr +i`, skipped where chattr does not work).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import aiosqlite
import pytest

from gate.data.records import AuditRecord, ClassSample, DecisionRecord, SampleRecord
from gate.journal import (
    SCHEMA_VERSION,
    Journal,
    JournalError,
    JournalVersionError,
    decision_from_row,
    sample_from_row,
)
from tests.tmpfs import tmpfs

REPO = Path(__file__).resolve().parents[2]
T0 = float(int(time.time())) - 3600.0  # recent: the retention pass at open keeps these


def decision(i: int = 0, *, ts: float | None = None, **kw: object) -> DecisionRecord:
    values: dict[str, object] = dict(
        ts=T0 + i if ts is None else ts,
        request_id=f"req-{i}",
        tenant="alice",
        cls="interactive",
        backend="default",
        endpoint="/v1/chat/completions",
        stream=True,
        prompt_tokens=120,
        token_count_source="exact",
        max_tokens=256,
        reserved_tokens=376,
        outcome="admitted",
        reason="ok",
        http_status=200,
        queue_ms=1.5,
        ttft_ms=42.0,
        duration_ms=900.0,
        completion_tokens=200,
        budget_at_decision=8192,
        in_flight_at_decision=1024,
    )
    values.update(kw)
    return DecisionRecord(**values)  # type: ignore[arg-type]


def audit(i: int = 0, *, ts: float | None = None) -> AuditRecord:
    return AuditRecord(
        ts=T0 + i if ts is None else ts,
        operator="oncall",
        origin="10.0.0.7",
        source="console",
        action="set_budget",
        target="backend:default",
        old_value="8192",
        new_value="6144",
        note=f"note {i}",
    )


def sample(i: int = 0, *, ts: float | None = None, backend: str = "default") -> SampleRecord:
    return SampleRecord(
        ts=T0 + i if ts is None else ts,
        backend=backend,
        budget=8192,
        in_flight=3000,
        queued=2,
        slots_busy=3,
        slots_total=4,
        gpu_used_bytes=10_000_000_000,
        gpu_total_bytes=80_000_000_000,
        p95_ttft_ms=180.5,
        p95_tpot_ms=None,
        admitted=12,
        refused=1,
        classes=(ClassSample("interactive", 2000, 0), ClassSample("batch", 1000, 2)),
    )


async def eventually(predicate, timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def count(path: Path, table: str = "decisions") -> int:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
    finally:
        conn.close()


FAST = dict(backoff_s=(0.05, 0.2), busy_timeout_ms=100)


# ------------------------------------------------------------------------------------------
# Basics


async def test_rows_of_each_kind_commit_and_read_back(tmp_path: Path) -> None:
    j = await Journal.open(tmp_path / "j.db")
    try:
        d, a, s = decision(1), audit(2), sample(3)
        assert await asyncio.gather(j.add(d), j.add(a), j.add(s)) == [True, True, True]

        [row] = await j.decisions_page()
        assert decision_from_row(row) == d
        assert row["cls"] == "interactive" and row["stream"] is True and isinstance(row["id"], int)

        [arow] = await j.audit_rows()
        assert AuditRecord(**{k: v for k, v in arow.items() if k != "id"}) == a

        [srow] = await j.samples(None, None)
        assert sample_from_row(srow) == s
        assert srow["classes"] == [
            {"cls": "interactive", "in_flight": 2000, "queued": 0},
            {"cls": "batch", "in_flight": 1000, "queued": 2},
        ]
        h = j.health
        assert (h.ok, h.written, h.dropped, h.pending, h.last_error) == (True, 3, 0, 0, None)
        assert h.path == str(tmp_path / "j.db")
    finally:
        await j.close()

    # on disk: the column is called "class"; classes is compact JSON text
    conn = sqlite3.connect(tmp_path / "j.db")
    try:
        assert conn.execute('SELECT "class" FROM decisions').fetchone() == ("interactive",)
        (classes,) = conn.execute("SELECT classes FROM samples").fetchone()
        assert classes == ('[{"cls":"interactive","in_flight":2000,"queued":0},{"cls":"batch","in_flight":1000,"queued":2}]')
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
        assert {
            "decisions_ts",
            "decisions_class_ts",
            "decisions_outcome_ts",
            "decisions_tenant_ts",
            "audit_ts",
            "samples_ts",
        } <= tables
    finally:
        conn.close()


async def test_a_clean_close_leaves_every_row_in_the_file_itself_not_in_the_wal(tmp_path: Path) -> None:
    """An operator copies tokengate.db after a stop: with the read-only reader closed last, the
    WAL stayed beside it holding the rows (a trial's copy had 416 of 444 decisions)."""
    path = tmp_path / "j.db"
    j = await Journal.open(path)
    try:
        assert all(await asyncio.gather(*(j.add(decision(i)) for i in range(50))))
        assert len(await j.decisions_page()) == 50  # the reader is open too
    finally:
        await j.close()
    wal = Path(str(path) + "-wal")
    assert not wal.exists() or wal.stat().st_size == 0
    copy = tmp_path / "copy.db"
    copy.write_bytes(path.read_bytes())  # the file alone
    conn = sqlite3.connect(copy)
    try:
        assert conn.execute("SELECT count(*) FROM decisions").fetchone() == (50,)
    finally:
        conn.close()


async def test_future_resolves_after_commit_visible_from_another_connection(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    j = await Journal.open(path)
    try:
        other = sqlite3.connect(path)
        try:
            for i in range(20):
                fut = j.add(decision(i))
                assert not fut.done()  # never resolved before the writer ran
                assert await fut is True
                # at this very moment, with no further await, another connection sees it
                got = other.execute("SELECT request_id FROM decisions WHERE request_id = ?", (f"req-{i}",))
                assert got.fetchone() == (f"req-{i}",)
        finally:
            other.close()
    finally:
        await j.close()


async def test_file_mode_0600_wal_and_user_version(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    old = os.umask(0)  # even with a permissive umask
    try:
        j = await Journal.open(path)
    finally:
        os.umask(old)
    try:
        assert await j.add(decision()) is True
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        for suffix in ("-wal", "-shm"):
            if os.path.exists(f"{path}{suffix}"):
                assert stat.S_IMODE(os.stat(f"{path}{suffix}").st_mode) == 0o600
        conn = sqlite3.connect(path)
        try:
            assert conn.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
            assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        finally:
            conn.close()
    finally:
        await j.close()


async def test_existing_loose_file_mode_is_tightened(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    path.touch()
    os.chmod(path, 0o644)
    j = await Journal.open(path)
    await j.close()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


async def test_newer_schema_version_is_refused_clearly(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(JournalVersionError) as e:
        await Journal.open(path)
    message = str(e.value)
    assert str(path) in message and "newer" in message and str(SCHEMA_VERSION + 1) in message


async def test_reopen_keeps_rows_and_does_not_migrate_again(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    async with await Journal.open(path) as j:
        assert await j.add(decision(1)) is True
    async with await Journal.open(path) as j:
        assert await j.add(decision(2)) is True
        assert await j.count_decisions() == 2


async def test_strict_open_raises_on_unusable_path(tmp_path: Path) -> None:
    with pytest.raises(JournalError, match="missing"):
        await Journal.open(tmp_path / "missing" / "j.db", strict=True)


# ------------------------------------------------------------------------------------------
# Group commit, buffer, bad rows, close


async def test_group_commit_batches_many_rows_in_few_transactions(tmp_path: Path) -> None:
    j = await Journal.open(tmp_path / "j.db", max_batch=1000)
    try:
        before = j.transactions
        futures = [j.add(decision(i)) for i in range(5000)]
        assert j.health.pending == 5000
        assert all(await asyncio.gather(*futures))
        assert j.transactions - before <= 10  # 5000 rows, max_batch 1000: ~5 transactions
        assert j.transactions - before < 5000
        assert j.health.written == 5000
        assert await j.count_decisions() == 5000
    finally:
        await j.close()


async def test_mixed_kinds_share_one_transaction(tmp_path: Path) -> None:
    j = await Journal.open(tmp_path / "j.db")
    try:
        await asyncio.sleep(0.05)  # let the open-time retention run pass
        before = j.transactions
        futures = [j.add(decision(1)), j.add(audit(1)), j.add(sample(1))]
        assert all(await asyncio.gather(*futures))
        assert j.transactions - before == 1
    finally:
        await j.close()


async def test_a_batch_of_every_kind_is_one_call_on_the_connections_thread(tmp_path: Path, monkeypatch) -> None:
    """BEGIN, each table's rows and COMMIT go to aiosqlite's thread together: one hop (one
    future, one wake-up of the gate's loop) per batch, not 2 + one per table. This also
    fails if an aiosqlite upgrade drops the private ``_execute`` the writer relies on."""
    j = await Journal.open(tmp_path / "j.db")
    try:
        await asyncio.sleep(0.05)  # let the open-time retention run pass
        calls = 0
        real = aiosqlite.Connection._execute

        async def counting(self, fn, *args, **kwargs):
            nonlocal calls
            calls += 1
            return await real(self, fn, *args, **kwargs)

        monkeypatch.setattr(aiosqlite.Connection, "_execute", counting)
        before = j.transactions
        futures = [j.add(row) for i in range(50) for row in (decision(i), audit(i), sample(i))]
        assert all(await asyncio.gather(*futures))
        assert j.transactions - before == calls == 1
        assert await j.count_decisions() == 50
    finally:
        await j.close()


async def test_buffer_full_drops_at_once_and_counts(tmp_path: Path) -> None:
    dropped: list[int] = []
    j = await Journal.open(tmp_path / "j.db", max_pending=10, on_drop=dropped.append)
    try:
        futures = [j.add(decision(i)) for i in range(25)]  # no await: the writer cannot run
        assert [f.done() for f in futures] == [False] * 10 + [True] * 15
        assert all(f.result() is False for f in futures[10:])
        assert j.health.dropped == 15 and sum(dropped) == 15
        assert all(await asyncio.gather(*futures[:10]))
        assert j.health.written == 10
    finally:
        await j.close()


async def test_bad_row_is_dropped_alone_and_never_raises(tmp_path: Path) -> None:
    j = await Journal.open(tmp_path / "j.db")
    try:
        bad_sample = dataclasses.replace(sample(1), classes=("not a class sample",))
        null_tenant = decision(2, tenant=None)  # NOT NULL column
        f_not_a_row = j.add("not a row")  # type: ignore[arg-type]
        assert f_not_a_row.done() and f_not_a_row.result() is False
        futures = [j.add(decision(1)), j.add(bad_sample), j.add(null_tenant), j.add(decision(3))]
        assert await asyncio.gather(*futures) == [True, False, False, True]
        assert j.health.ok and j.health.dropped == 3
        assert await j.count_decisions() == 2
    finally:
        await j.close()


async def test_close_flushes_pending_rows(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    j = await Journal.open(path)
    futures = [j.add(decision(i)) for i in range(3000)]
    await j.close()
    assert all(f.done() and f.result() is True for f in futures)
    assert count(path) == 3000
    late = j.add(decision(9999))  # after close: dropped, never raised
    assert late.done() and late.result() is False
    assert j.health.ok is False
    await j.close()  # idempotent


async def test_close_is_bounded_when_the_disk_keeps_failing(tmp_path: Path) -> None:
    path = tmp_path / "gone" / "j.db"
    j = await Journal.open(path, **FAST)
    futures = [j.add(decision(i)) for i in range(10)]
    t = time.monotonic()
    await j.close(timeout=1.0)
    assert time.monotonic() - t < 3.0
    assert all(f.done() and f.result() is False for f in futures)
    assert j.health.dropped == 10


# ------------------------------------------------------------------------------------------
# Faults (see the module docstring for why these and not chmod)


async def test_missing_directory_fails_then_resumes_when_created(tmp_path: Path) -> None:
    directory = tmp_path / "journal-dir"
    path = directory / "j.db"
    dropped: list[int] = []
    j = await Journal.open(path, on_drop=dropped.append, **FAST)
    try:
        assert j.health.ok is False and j.health.last_error
        futures = [j.add(decision(i)) for i in range(5)]
        assert await asyncio.gather(*futures) == [False] * 5
        h = j.health
        assert h.ok is False and h.dropped == 5 and sum(dropped) == 5
        assert "FileNotFoundError" in (h.last_error or "") or "unable to open" in (h.last_error or "")

        directory.mkdir()
        await eventually(lambda: j.health.ok, what="the writer to reopen the journal")
        assert await j.add(decision(100)) is True
        assert j.health.ok is True and j.health.written == 1
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    finally:
        await j.close()
    assert count(path) == 1


async def test_journal_file_deleted_while_running_is_written_anew_not_into_the_void(tmp_path: Path, caplog) -> None:
    """A trial: `rm tokengate.db*` under a running gate; every row after it went into the
    unlinked inode (no error, dropped 0) and vanished with the process: `tokengate log` on the
    path showed nothing for the rest of the run. The writer notices and starts a new file."""
    path = tmp_path / "j.db"
    j = await Journal.open(path)
    anew: list[str] = []
    j.on_new_file = lambda: anew.append("new")  # the gate writes its config_in_force row there again
    try:
        assert await j.add(decision(0)) is True
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{path}{suffix}")
        with caplog.at_level("ERROR", logger="gate.journal"):
            assert await j.add(decision(1)) is True
        assert path.exists(), "the rows after the deletion went into the deleted file"
        assert count(path) == 1
        assert "deleted" in caplog.text and anew == ["new"]
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        # replaced by another file (a restore from backup): the new file is written, not the old inode
        other = tmp_path / "other.db"
        shutil.copy(path, other)
        os.replace(other, path)
        with caplog.at_level("ERROR", logger="gate.journal"):
            assert await j.add(decision(2)) is True
        assert count(path) == 2
        assert "replaced" in caplog.text
    finally:
        await j.close()


async def test_directory_replaced_by_a_file_fails_then_resumes(tmp_path: Path) -> None:
    directory = tmp_path / "d"
    directory.write_text("not a directory")
    j = await Journal.open(directory / "j.db", **FAST)
    try:
        assert await j.add(decision(1)) is False
        assert j.health.ok is False
        directory.unlink()
        directory.mkdir()
        await eventually(lambda: j.health.ok, what="recovery")
        assert await j.add(decision(2)) is True
    finally:
        await j.close()


async def test_database_locked_drops_then_resumes(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    j = await Journal.open(path, **FAST)
    try:
        assert await j.add(decision(0)) is True
        locker = sqlite3.connect(path, isolation_level=None)
        locker.execute("BEGIN EXCLUSIVE")  # another process holds the write lock
        try:
            futures = [j.add(decision(i)) for i in range(1, 4)]
            assert await asyncio.gather(*futures) == [False] * 3
            h = j.health
            assert h.ok is False and h.dropped == 3 and "locked" in (h.last_error or "")
        finally:
            locker.execute("ROLLBACK")
            locker.close()
        await eventually(lambda: j.health.ok or j.health.pending == 0, what="the lock to clear")
        assert await j.add(decision(10)) is True
        assert j.health.ok is True
        assert j.health.last_error is not None  # the last fault stays visible
        assert await j.count_decisions() == 2
    finally:
        await j.close()


async def test_rows_keep_queueing_while_failing_and_beyond_max_pending_drop(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    j = await Journal.open(path, max_pending=20, backoff_s=(1.0, 1.0), busy_timeout_ms=50)
    try:
        locker = sqlite3.connect(path, isolation_level=None)
        locker.execute("BEGIN EXCLUSIVE")
        try:
            assert await j.add(decision(0)) is False  # the write fails, backoff 1 s starts
            futures = [j.add(decision(i)) for i in range(1, 31)]
            assert sum(f.done() for f in futures) == 10  # beyond max_pending: dropped at once
            assert j.health.pending == 20
        finally:
            locker.execute("ROLLBACK")
            locker.close()
        # the lock is gone before the retry: the 20 queued rows are written
        assert (await asyncio.gather(*futures)).count(True) == 20
    finally:
        await j.close()


_FSIZE_CHILD = textwrap.dedent(
    """
    import asyncio, json, resource, signal, sys, time
    sys.path.insert(0, {repo!r})
    from gate.journal import Journal
    from tests.unit.test_journal import decision

    async def main():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of a kill
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        j = await Journal.open({path!r}, backoff_s=(0.05, 0.2))
        out = {{"before": await j.add(decision(0))}}
        resource.setrlimit(resource.RLIMIT_FSIZE, (0, hard))  # binds root too: writes fail
        out["during"] = [await j.add(decision(i)) for i in range(1, 4)]
        h = j.health
        out["during_ok"], out["during_dropped"], out["error"] = h.ok, h.dropped, h.last_error
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        deadline = time.monotonic() + 10
        after = False
        while not after and time.monotonic() < deadline:
            after = await j.add(decision(100))
            if not after:
                await asyncio.sleep(0.05)
        out["after"], out["after_ok"] = after, j.health.ok
        await j.close()
        print(json.dumps(out))

    asyncio.run(main())
    """
)


def test_file_size_limit_fails_writes_then_resumes(tmp_path: Path) -> None:
    """A write that fails like a full disk, as root, without mount: RLIMIT_FSIZE = 0."""
    path = tmp_path / "j.db"
    code = _FSIZE_CHILD.format(repo=str(REPO), path=str(path))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["before"] is True
    assert out["during"] == [False, False, False]
    assert out["during_ok"] is False and out["during_dropped"] == 3
    assert out["error"]
    assert out["after"] is True and out["after_ok"] is True
    assert count(path) == 2


async def test_full_disk_on_a_tiny_tmpfs_drops_then_resumes(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "small", "512k") as small:
        path = small / "j.db"
        j = await Journal.open(path, **FAST)
        try:
            assert await j.add(decision(0)) is True
            filler = small / "filler"
            fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
            try:  # fill the file system to the last byte
                for chunk in (65536, 4096, 512, 1):
                    with contextlib.suppress(OSError):
                        while True:
                            os.write(fd, b"\0" * chunk)
            finally:
                os.close(fd)
            results = []
            for i in range(1, 200):  # big enough to need new pages
                results.append(await j.add(decision(i, request_id="x" * 2000)))
                if not j.health.ok:
                    break
            assert results[-1] is False and j.health.ok is False and j.health.dropped >= 1
            assert j.health.last_error and ("full" in j.health.last_error or "disk" in j.health.last_error)

            filler.unlink()
            await eventually(lambda: j.health.ok or j.health.pending == 0, what="retry")
            ok = False
            deadline = time.monotonic() + 10
            while not ok and time.monotonic() < deadline:
                ok = await j.add(decision(1000))
            assert ok and j.health.ok
        finally:
            await j.close()


async def test_immutable_file_fails_then_resumes(tmp_path: Path) -> None:
    if shutil.which("chattr") is None:
        pytest.skip("no chattr")
    path = tmp_path / "j.db"
    async with await Journal.open(path) as j:
        assert await j.add(decision(0)) is True
    proc = subprocess.run(["chattr", "+i", str(path)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"chattr +i does not work here: {proc.stderr.strip()}")
    try:
        j = await Journal.open(path, **FAST)
        try:
            assert await j.add(decision(1)) is False
            assert j.health.ok is False
        finally:
            subprocess.run(["chattr", "-i", str(path)], check=True)
        await eventually(lambda: j.health.ok, what="recovery after chattr -i")
        assert await j.add(decision(2)) is True
        await j.close()
    finally:
        subprocess.run(["chattr", "-i", str(path)], capture_output=True)
    assert count(path) == 2


# ------------------------------------------------------------------------------------------
# Retention


async def test_retention_deletes_only_old_rows(tmp_path: Path) -> None:
    now = T0 + 100 * 86400
    j = await Journal.open(tmp_path / "j.db", retention_days=14, clock=lambda: now)
    try:
        assert await j.apply_retention() == {"decisions": 0, "audit": 0, "samples": 0}  # after the pass at open
        old, new = now - 15 * 86400, now - 13 * 86400
        rows = [decision(1, ts=old), decision(2, ts=new), audit(ts=old), audit(ts=new), sample(ts=old), sample(ts=new)]
        assert all(await asyncio.gather(*(j.add(r) for r in rows)))
        deleted = await j.apply_retention()
        assert deleted == {"decisions": 1, "audit": 1, "samples": 1}
        assert [r["ts"] for r in await j.decisions_page()] == [new]
        assert [r["ts"] for r in await j.audit_rows()] == [new]
        assert [r["ts"] for r in await j.samples(None, None)] == [new]
        assert await j.apply_retention(now=now + 2 * 86400) == {"decisions": 1, "audit": 1, "samples": 1}
    finally:
        await j.close()


async def test_retention_runs_at_open_and_in_chunks(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    now = T0 + 100 * 86400
    async with await Journal.open(path, clock=lambda: now) as j:
        j.RETENTION_CHUNK = 100  # type: ignore[misc]
        await j.apply_retention()  # queued behind the pass at open: both are done after this
        rows = [decision(i, ts=now - 20 * 86400) for i in range(1050)] + [decision(5000, ts=now)]
        assert all(await asyncio.gather(*(j.add(r) for r in rows)))
        assert await j.apply_retention() == {"decisions": 1050, "audit": 0, "samples": 0}
        assert await j.count_decisions() == 1
        assert all(await asyncio.gather(*(j.add(decision(i, ts=now - 20 * 86400)) for i in range(10))))
    # reopened: the retention pass at open removes the old rows by itself
    async with await Journal.open(path, clock=lambda: now) as j:
        assert await j.apply_retention() == {"decisions": 0, "audit": 0, "samples": 0}  # queued after it
        assert await j.count_decisions() == 1


# ------------------------------------------------------------------------------------------
# Read side


async def test_decisions_page_filters_and_keyset_paging(tmp_path: Path) -> None:
    j = await Journal.open(tmp_path / "j.db")
    try:
        rows = []
        for i in range(50):
            rows.append(
                decision(
                    i,
                    cls="interactive" if i % 2 else "batch",
                    tenant=("alice", "bob", "carol")[i % 3],
                    outcome="refused" if i % 5 == 0 else "admitted",
                    reason="queue_full" if i % 5 == 0 else "ok",
                    http_status=429 if i % 5 == 0 else 200,
                )
            )
        assert all(await asyncio.gather(*(j.add(r) for r in rows)))

        newest = await j.decisions_page(limit=10)
        ids = [r["id"] for r in newest]
        assert ids == sorted(ids, reverse=True) and len(ids) == 10
        assert newest[0]["request_id"] == "req-49"

        # back through the whole journal, page by page, newest first, no gaps or repeats
        seen: list[int] = []
        page = await j.decisions_page(limit=7)
        while page:
            seen += [r["id"] for r in page]
            page = await j.decisions_page(limit=7, before_id=page[-1]["id"])
        assert seen == sorted(seen, reverse=True) and len(seen) == len(set(seen)) == 50

        # forward from an id: oldest first (tailing)
        fwd = await j.decisions_page(after_id=seen[-1], limit=5)
        assert [r["id"] for r in fwd] == sorted(seen)[1:6]
        assert await j.decisions_page(after_id=max(seen)) == []
        between = await j.decisions_page(after_id=seen[-1], before_id=seen[-1] + 4)
        assert [r["id"] for r in between] == [seen[-1] + 3, seen[-1] + 2, seen[-1] + 1]

        refused = await j.decisions_page(outcome="refused", limit=100)
        assert {r["request_id"] for r in refused} == {f"req-{i}" for i in range(0, 50, 5)}
        assert await j.count_decisions(outcome="refused") == 10
        assert await j.count_decisions(reason="queue_full", cls="batch") == 5
        bob_batch = await j.decisions_page(cls="batch", tenant="bob", limit=100)
        assert {r["request_id"] for r in bob_batch} == {f"req-{i}" for i in range(50) if i % 2 == 0 and i % 3 == 1}
        assert await j.count_decisions(tenant=["alice", "carol"]) == 50 - sum(1 for i in range(50) if i % 3 == 1)
        window = await j.decisions_page(since_ts=T0 + 10, until_ts=T0 + 20, limit=100)
        assert sorted(r["request_id"] for r in window) == sorted(f"req-{i}" for i in range(10, 20))
        assert await j.count_decisions(since_ts=T0 + 10, until_ts=T0 + 20) == 10
        assert await j.count_decisions() == 50
    finally:
        await j.close()


async def test_paging_follows_time_even_across_a_clock_step(tmp_path: Path) -> None:
    j = await Journal.open(tmp_path / "j.db")
    try:
        # written in this order; the wall clock stepped back between rows 4 and 5
        stamps = [10, 11, 12, 13, 14, 8, 9, 15, 15, 16]
        assert all(await asyncio.gather(*(j.add(decision(i, ts=T0 + s)) for i, s in enumerate(stamps))))
        expected = [r["id"] for r in sorted(await j.decisions_page(limit=100), key=lambda r: (r["ts"], r["id"]), reverse=True)]
        assert [r["id"] for r in await j.decisions_page(limit=100)] == expected
        seen: list[int] = []
        page = await j.decisions_page(limit=3)
        while page:
            seen += [r["id"] for r in page]
            page = await j.decisions_page(limit=3, before_id=page[-1]["id"])
        assert seen == expected
        forward: list[int] = []
        page = await j.decisions_page(after_id=expected[-1], limit=3)
        while page:
            forward += [r["id"] for r in page]
            page = await j.decisions_page(after_id=page[-1]["id"], limit=3)
        assert forward == expected[::-1][1:]
        assert await j.decisions_page(before_id=10_000) == []  # a cursor that no longer exists
        assert len(await j.decisions_page(after_id=10_000, limit=100)) == 10
    finally:
        await j.close()


async def test_samples_and_audit_windows(tmp_path: Path) -> None:
    j = await Journal.open(tmp_path / "j.db")
    try:
        rows = [sample(i, backend="a" if i % 2 else "b") for i in range(20)] + [audit(i) for i in range(5)]
        assert all(await asyncio.gather(*(j.add(r) for r in rows)))
        got = await j.samples(T0 + 5, T0 + 15, backend="a")
        assert [r["ts"] for r in got] == [T0 + i for i in range(5, 15) if i % 2]
        last = await j.samples(None, None, limit=3)
        assert [r["ts"] for r in last] == [T0 + 17, T0 + 18, T0 + 19]
        assert [r["note"] for r in await j.audit_rows(T0 + 1, T0 + 3)] == ["note 1", "note 2"]
    finally:
        await j.close()


async def test_reads_do_not_wait_for_a_busy_writer(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    j = await Journal.open(path)
    try:
        assert all(await asyncio.gather(*(j.add(decision(i)) for i in range(100))))
        locker = sqlite3.connect(path, isolation_level=None)
        locker.execute("BEGIN IMMEDIATE")  # a writer holds the write lock (WAL: readers go on)
        locker.execute("INSERT INTO audit (ts, operator, origin, source, action, target) VALUES (1, 'x', 'local', 'console', 'a', 't')")
        try:
            t = time.monotonic()
            assert await j.count_decisions() == 100
            assert time.monotonic() - t < 0.5
        finally:
            locker.execute("ROLLBACK")
            locker.close()
    finally:
        await j.close()


async def test_in_memory_journal(tmp_path: Path) -> None:
    j = await Journal.open(":memory:")
    try:
        assert await j.add(decision(1)) is True
        assert await j.count_decisions() == 1
    finally:
        await j.close()


async def test_a_previous_gate_whose_journal_was_failing_is_not_called_killed_outright(tmp_path: Path) -> None:
    """A trial stopped a gate cleanly (SIGTERM) while its journal's disk was full: its
    `stopping`/`stopped` rows were dropped with the rest, and the next gate logged and audited
    "ended without 'stopped' (killed or crashed)": at an incident review, a crash that did not
    happen. The note now says the journal was dropping rows by then, so its end is unknown."""
    from gate.observe.metrics import GateMetrics
    from gate.observe.recorder import Recorder

    path = tmp_path / "j.db"
    j = await Journal.open(path)
    try:
        # the previous gate's start: its life row, as the gate writes it
        started = dataclasses.replace(
            audit(), source="gate", action="started", target="gate", old_value=None, new_value="0.1.0", gate_id="h:1:t"
        )
        assert await j.add(started) is True
        assert await j.add(dataclasses.replace(sample(1), gate_id="h:1:t", journal_dropped=7)) is True
        rec = Recorder(GateMetrics(), gate_id="h:2:t", clock=time.time)
        rec.journal = j
        note = await rec.previous_end()
        assert note is not None and "h:1:t" in note and "7 rows" in note and "dropping" in note
    finally:
        await j.close()


async def test_a_restarted_gate_judges_the_last_minutes_arrivals_as_the_gate_that_served_them(tmp_path: Path) -> None:
    """After a restart the classes table's adm/m and ref/m came from the journal's last minute,
    but `met` from the new gate's own arrivals only: "ref/m 26" beside "met 100%" for a
    minute, just when the on-call looks. Seeded history is judged as it was when served."""
    from gate.observe.metrics import GateMetrics
    from gate.observe.recorder import Recorder

    j = await Journal.open(tmp_path / "j.db")
    try:
        now = time.time()
        rows = [
            decision(1, ts=now - 20, ttft_arrival_ms=300.0),  # in time
            decision(2, ts=now - 15, ttft_arrival_ms=2500.0),  # late
            decision(3, ts=now - 10, outcome="refused", reason="queue_timeout", http_status=429, ttft_ms=None, duration_ms=5.0),
            decision(4, ts=now - 5, outcome="refused", reason="invalid_request", http_status=400, ttft_ms=None, duration_ms=5.0),
        ]
        for r in rows:
            assert await j.add(r) is True
        rec = Recorder(GateMetrics(), gate_id="h:2:t", clock=time.monotonic)
        rec.journal = j
        assert await rec.seed_from_journal(objective_ms=lambda cls: 2000.0) == 4
        # met: the 300 ms one; judged: both admitted and the 429 (a client's 400 is not judged)
        assert rec.rollup.met_share(time.monotonic(), "interactive") == (1, 3)
        # and the classes table's p95 is from arrival too, the restarted gate's as the last one's
        assert rec.rollup.p95_ttft_arrival_ms(time.monotonic(), "interactive") == 2500.0
    finally:
        await j.close()
