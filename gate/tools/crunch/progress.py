"""Progress (stderr): the sweep's progress bar and one line per finished cell."""

from __future__ import annotations

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

    def note(self, text: str) -> None:
        if self.stream is None:
            return
        self._clear()
        self.stream.write(text + "\n")
        self.stream.flush()

    def cell_started(self, label: str) -> None:
        self._label = label
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
        self.stream.write(f"\rcrunch [{bar}] {self.done}/{self.total} requests  {self._label}\x1b[K")
        self.stream.flush()
        self._dirty = True

    def _clear(self) -> None:
        if self.stream is not None and self.tty and self._dirty:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self._dirty = False
