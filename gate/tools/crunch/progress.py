"""Progress (stderr): the sweep's progress bar and one line per finished cell."""

from __future__ import annotations

import time
from typing import TextIO

from gate.tools.crunch.plan import CellResult
from gate.tools.crunch.report import cell_line


class Progress:
    """A progress bar redrawn with \\r on a terminal, and one line per finished cell."""

    def __init__(self, stream: TextIO | None, total: int, *, width: int = 28) -> None:
        self.stream = stream
        self.total = max(total, 1)
        self.done = 0
        self.width = width
        self.tty = bool(stream is not None and getattr(stream, "isatty", lambda: False)())
        self._label = ""
        self._dirty = False
        self._cell_tokens = 0
        self._cell_expected = 0
        self._drawn_at = 0.0

    def note(self, text: str) -> None:
        if self.stream is None:
            return
        self._clear()
        self.stream.write(text + "\n")
        self.stream.flush()

    def cell_started(self, label: str, *, expected_tokens: int = 0) -> None:
        self._label = label
        self._cell_tokens, self._cell_expected = 0, expected_tokens
        self._draw()

    def token(self) -> None:
        """One generated token of the running cell: a cell of long requests moves the bar
        between its requests' ends too (it sat still for minutes), redrawn at most 5 times a second."""
        self._cell_tokens += 1
        now = time.monotonic()
        if now - self._drawn_at >= 0.2:
            self._draw()

    def advance(self, n: int = 1) -> None:
        self.done += n
        self._draw()

    def cell_finished(self, result: CellResult) -> None:
        """Each finished cell gets a line (above the bar on a terminal)."""
        if self.stream is None:
            return
        self._clear()
        self.stream.write(f"[{self.done}/{self.total}] {cell_line(result)}\n")
        self.stream.flush()
        self._draw()

    def close(self) -> None:
        self._clear()

    def _draw(self) -> None:
        if self.stream is None or not self.tty:
            return
        filled = int(self.width * min(self.done, self.total) / self.total)
        bar = "#" * filled + "-" * (self.width - filled)
        cell = ""
        if self._cell_expected:
            share = min(1.0, self._cell_tokens / self._cell_expected)
            cell = f" ({100 * share:.0f}% of its {self._cell_expected:,} tokens)"
        self.stream.write(f"\rcrunch [{bar}] {self.done}/{self.total} requests  {self._label}{cell}\x1b[K")
        self.stream.flush()
        self._drawn_at = time.monotonic()
        self._dirty = True

    def _clear(self) -> None:
        if self.stream is not None and self.tty and self._dirty:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self._dirty = False
