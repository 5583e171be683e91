"""Per-request names: request ids, and decoded header names shared between requests."""

from __future__ import annotations

import itertools
import os


class RequestIds:
    """Request ids shaped like uuid4().hex: a random per-process prefix and a counter.

    Unique within the process by construction, across processes by 64 random bits;
    os.urandom per request was a syscall and ~5% of a refused request's CPU.
    """

    def __init__(self) -> None:
        self._prefix = os.urandom(8).hex()
        self._next = itertools.count(1).__next__

    def __call__(self) -> str:
        return f"{self._prefix}{self._next():016x}"


class HeaderNames:
    """Decoded header names, one shared str per distinct name instead of one per request."""

    def __init__(self, limit: int = 512) -> None:
        self._known: dict[bytes, str] = {}
        self._limit = limit  # clients choose names: the table must not grow without bound

    def __call__(self, raw: bytes) -> str:
        name = self._known.get(raw)
        if name is None:
            name = raw.decode("latin-1").lower()
            if len(self._known) < self._limit:
                self._known[raw] = name
        return name
