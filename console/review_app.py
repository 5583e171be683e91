"""``tokengate review``: the console over a journal file, read-only.

The reading (:class:`JournalReader`), the filters and the CSV export live in
``gate/journal/reader.py``; this is the App around :class:`console.screens.review.ReviewScreen`.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from textual.app import App

from console.screens.review import ReviewScreen
from gate.journal.reader import (
    DecisionFilters,
    JournalReader,
    ReviewError,
    SeriesPoint,
    check_journal,
    default_export_name,
    export_decisions_csv,
)

__all__ = [
    "DecisionFilters",
    "JournalReader",
    "ReviewApp",
    "ReviewError",
    "SeriesPoint",
    "check_journal",
    "default_export_name",
    "export_decisions_csv",
]


class ReviewApp(App[int]):
    """``tokengate review``: one :class:`ReviewScreen`; closing it quits. The return code is
    1 when the journal could not be opened, else 0."""

    TITLE = "tokengate review"
    #: the console's stylesheet: the review's dialogs (the what-if, the export's) drawn as in
    #: the console, not unstyled over the screen behind them
    CSS_PATH = "app.tcss"

    def __init__(
        self,
        journal_path: str | os.PathLike[str],
        *,
        slo_ttft_ms: float | None = None,
        clock: Callable[[], float] | None = None,
        export_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        super().__init__()
        self.journal_path = os.fspath(journal_path)
        self.slo_ttft_ms = slo_ttft_ms
        self.clock = clock
        self.export_dir = export_dir
        #: the open error shown by the screen, if any
        self.error: str | None = None

    def on_mount(self) -> None:
        screen = ReviewScreen(self.journal_path, slo_ttft_ms=self.slo_ttft_ms, clock=self.clock, export_dir=self.export_dir)
        self.push_screen(screen, self._review_closed)

    def _review_closed(self, error: str | None) -> None:
        self.error = error
        self.exit(1 if error else 0, return_code=1 if error else 0)
