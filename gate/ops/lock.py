"""One gate per journal: an exclusive lock held for the gate's whole life.

The lock is `flock` on `<journal>.lock`, which names its holder (pid, gate id) so
a second gate can say who is in the way. The kernel drops the lock when the
holder dies, SIGKILL included, so a stale lock file never blocks a restart.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import socket
import time

log = logging.getLogger("tokengate.lock")


class JournalLocked(Exception):
    """Another live gate holds this journal; the message names the file and the holder."""


def new_gate_id(started: float | None = None) -> str:
    """host:pid:start time (UTC, to the second): tells gates apart in merged journals."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if started is None else started))
    return f"{socket.gethostname()}:{os.getpid()}:{stamp}"


class JournalLock:
    """Held from `acquire` until `release` (or the process's death)."""

    def __init__(self, journal: str) -> None:
        self.journal = journal
        self.path = journal + ".lock"
        self._fd: int | None = None
        self._lost: str | None = None  # said once: another gate holds the lock file now

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self, gate_id: str) -> None:
        """Take the lock or raise JournalLocked naming the holder; no-op for ":memory:"."""
        if self.journal == ":memory:" or self._fd is not None:
            return
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read(fd)
                os.close(fd)
                raise JournalLocked(
                    f"{self.journal}: the journal is in use by another gate ({holder or 'holder unknown'}); "
                    "one gate per journal: stop that gate, attach to it with `tokengate console --attach`, "
                    "or give this one its own [gate] journal"
                ) from None
            except BaseException:
                os.close(fd)
                raise
            # The holder may have removed the file between our open and our lock:
            # then we locked an orphan inode, and must try again on the new file.
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()}, gate {gate_id}\n".encode())
        self._fd = fd

    def _ours(self) -> bool:
        """The lock file at `path` is the one this gate holds (not deleted, not replaced)."""
        assert self._fd is not None
        try:
            mine, there = os.fstat(self._fd), os.stat(self.path)
        except FileNotFoundError:
            return False
        return (mine.st_dev, mine.st_ino) == (there.st_dev, there.st_ino)

    def keep(self) -> bool:
        """Hold the lock again if its file was deleted or replaced under the running gate:
        without it a second gate started on this journal (a trial's did). False (said once)
        when another gate took it in between, or it cannot be taken again now."""
        if self._fd is None:
            return True
        try:
            if self._ours():
                return True
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError:
            return True  # a failing disk: the journal says so; retried next time
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read(fd) or "holder unknown"
            os.close(fd)
            if holder != self._lost:
                log.error(
                    "journal lock %s was deleted while this gate ran and another gate took it (%s): two gates write %s; stop one",
                    self.path,
                    holder,
                    self.journal,
                )
            self._lost = holder
            return False
        except BaseException:
            os.close(fd)
            raise
        line = _read(self._fd)
        os.ftruncate(fd, 0)
        os.write(fd, f"{line}\n".encode())
        os.close(self._fd)
        self._fd = fd
        self._lost = None
        log.warning("journal lock %s was deleted (or replaced) while the gate ran: taken again", self.path)
        return True

    def release(self) -> None:
        """Remove the lock file while still holding it (when it is still ours), then let go."""
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            if self._ours():
                os.unlink(self.path)
        os.close(self._fd)
        self._fd = None


def _read(fd: int) -> str:
    with contextlib.suppress(OSError):
        return os.pread(fd, 200, 0).decode(errors="replace").strip()
    return ""


def holder(journal: str) -> str | None:
    """Who holds `journal`'s lock now (its lock file's text), or None: nobody, or it cannot be
    told. Read from /proc/locks (Linux), not by trying the lock: a reader's momentary lock
    would refuse a gate starting at that instant."""
    path = journal + ".lock"
    try:
        st = os.stat(path)
        with open("/proc/locks", encoding="ascii", errors="replace") as f:
            locks = f.read().splitlines()
    except OSError:
        return None
    want = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in locks:
        fields = line.split()
        # "1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF" (a waiter's line has "->" after the number)
        if "FLOCK" in fields and any(f.lower() == want for f in fields):
            with contextlib.suppress(OSError), open(path, encoding="utf-8", errors="replace") as lock:
                return lock.read(200).strip() or "holder unknown"
            return "holder unknown"
    return None
