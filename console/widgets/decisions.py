"""The decision tail: the newest decisions, newest at the bottom, with a `/` filter.

"TTFT ms" is the time to first token from the request's arrival (its queue wait included), as
the client measures it and as the classes table's "met" judges it.

Rows are keyed by request id and end time (`_row_key`) and appended as they arrive; the table drops its
oldest rows back to MAX_ROWS once it grows SLACK rows past it (a view scrolled
back keeps its rows in view). A tick adds at most MAX_NEW_ROWS_PER_TICK rows
(its newest): at hundreds of requests per second nobody reads every row; the
filter searches the last MAX_RECORDS decisions the console received (the review
screen, `r`, has the whole journal). The table is a `TailTable`, not a
`DataTable`: each row is rendered once (why, with the measurement, in
console/widgets/tail_table.py).
"""

from __future__ import annotations

import time
from collections import OrderedDict

from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import Input

from console.styles import OUTCOME, http_status_style
from console.widgets.borders import set_border_text
from console.widgets.inputs import InOrderInput
from console.widgets.tail_table import GAP, Cell, TailTable
from gate.core.reasons import CLIENT_DISCONNECT, Reason
from gate.data.records import DecisionRecord
from gate.data.snapshot import GateSnapshot

LABELS: dict[str, str] = {
    "time": "ended",
    "cls": "class",
    "tenant": "tenant",
    "outcome": "outcome",
    "reason": "reason",
    "status": "http",
    "tokens": "prompt+max",
    "queue": "queue ms",
    "ttft": "TTFT ms",
}
FULL = tuple(LABELS)
# Narrow: the reason whole (as wide as the longest reason code), the http status left out
# (each reason has one status, gate/core/reasons.py), one space between columns: it fits 80x24.
NARROW = ("time", "cls", "tenant", "outcome", "reason", "ttft")
NARROW_WIDTHS = {"cls": 11, "tenant": 10, "reason": max(len(r) for r in (*Reason, CLIENT_DISCONNECT))}
NARROW_GAP = 1
NARROW_BELOW = 100


def _ms(value: float | None) -> str:
    return "" if value is None else f"{value:,.0f}"


def ended_at(r: DecisionRecord) -> float:
    """When the request ended: `ts` is its arrival, `duration_ms` how long it took from there."""
    return r.ts + (r.duration_ms or 0.0) / 1000.0


def decision_cells(r: DecisionRecord) -> dict[str, str]:
    """The row as plain strings (what the filter matches against)."""
    prompt = "?" if r.prompt_tokens is None else str(r.prompt_tokens)
    max_tokens = "?" if r.max_tokens is None else str(r.max_tokens)
    return {
        # Rows come in as requests end, so the time shown is the end (arrival + duration):
        # the column then reads in order, top to bottom.
        "time": time.strftime("%H:%M:%S", time.localtime(ended_at(r))),
        "cls": r.cls or "-",
        "tenant": r.tenant or "-",
        "outcome": r.outcome,
        "reason": r.reason,
        "status": str(r.http_status),
        "tokens": f"{prompt}+{max_tokens}",
        "queue": _ms(r.queue_ms),
        # From arrival, as the client saw it and as "met" judges it: the journal's ttft_ms counts
        # from dispatch (the controller's signal) and read 1,943 beside a client's 3,434 for a
        # request that had waited 1,482 ms (#25; the narrow table shows no queue column at all).
        # A journal written before ttft_arrival_ms existed has only the dispatch figure.
        "ttft": _ms(r.ttft_arrival_ms if r.ttft_arrival_ms is not None else r.ttft_ms),
    }


def _row_key(r: DecisionRecord) -> str:
    """One decision's row: its request id and when it ended. A client's X-Request-Id names its
    request, and a client may send one id again (a retry, a fixed header): keyed by the id alone,
    every decision after the first under it was taken for one already shown and never appeared."""
    return f"{r.request_id} {r.ts!r}"


def _styled(cells: dict[str, str], columns: tuple[str, ...]) -> list[Cell]:
    out: list[Cell] = []
    for c in columns:
        value = cells[c]
        if c == "outcome":
            out.append((value, OUTCOME.get(value, "")))
        elif c == "status":
            status = int(value) if value.isdigit() else 0
            out.append((value, http_status_style(status)))
        else:
            out.append((value, ""))  # plain text, never markup: tenant names are client-chosen
    return out


class FilterClosed(Message):
    """The filter input is done (enter or esc): the app moves focus back."""


class FilterChanged(Message):
    """The filter text changed (the app shows it in the status line)."""


class DecisionTail(Vertical):
    """Recent decisions with a substring filter over every column (esc clears it)."""

    MAX_ROWS = 300
    SLACK = 100
    #: decisions the filter searches (and counts): ~100 s at 20 req/s
    MAX_RECORDS = 2000
    #: at most this many of a tick's newest decisions become rows (all stay filterable)
    MAX_NEW_ROWS_PER_TICK = 50
    BINDINGS = [Binding("escape", "clear_filter", "clear filter", show=False)]

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.filter_text = ""
        self._records: OrderedDict[str, tuple[dict[str, str], str]] = OrderedDict()
        self._matching = 0  # records that match the filter
        self.columns_shown: tuple[str, ...] = FULL
        self.input = InOrderInput(placeholder="filter: substring of any column; enter keeps it, esc clears", id="decision-filter")
        self.input.display = False
        self.table = TailTable(id="decision-table")
        self._set_columns()

    def _set_columns(self) -> None:
        narrow = self.columns_shown == NARROW
        self.table.set_columns(
            [(key, LABELS[key], NARROW_WIDTHS.get(key) if narrow else None) for key in self.columns_shown],
            gap=NARROW_GAP if narrow else GAP,
        )

    def on_resize(self, event: events.Resize) -> None:
        wanted = NARROW if event.size.width < NARROW_BELOW else FULL
        if wanted != self.columns_shown:
            self.columns_shown = wanted
            self._set_columns()
            self._rebuild()
            self.follow()

    def compose(self) -> ComposeResult:
        yield self.input
        yield self.table

    # ---- data ----------------------------------------------------------------

    def update_snapshot(self, snap: GateSnapshot) -> None:
        new = [(key, r) for r in snap.decisions if (key := _row_key(r)) not in self._records]
        if not new:
            return
        table = self.table  # follows by itself while its newest row is in view
        matching: list[tuple[str, dict[str, str]]] = []
        for key, r in new:
            cells = decision_cells(r)
            haystack = " ".join(cells.values()).lower()
            self._records[key] = (cells, haystack)
            if self._matches(haystack):
                self._matching += 1
                if key not in table:
                    matching.append((key, cells))
        table.add_rows((rid, _styled(cells, self.columns_shown)) for rid, cells in matching[-self.MAX_NEW_ROWS_PER_TICK :])
        while len(self._records) > self.MAX_RECORDS:
            _, (_, haystack) = self._records.popitem(last=False)
            self._matching -= self._matches(haystack)
        if table.row_count > self.MAX_ROWS + self.SLACK:
            table.drop_oldest(table.row_count - self.MAX_ROWS)
        self._subtitle()

    def _matches(self, haystack: str) -> bool:
        return not self.filter_text or self.filter_text in haystack

    def _rebuild(self) -> None:
        table = self.table
        table.clear()
        rows = [(rid, cells) for rid, (cells, hay) in self._records.items() if self._matches(hay)]
        self._matching = len(rows)
        table.add_rows((rid, _styled(cells, self.columns_shown)) for rid, cells in rows[-self.MAX_ROWS :])

    def on_tail_table_following_changed(self, event: TailTable.FollowingChanged) -> None:
        event.stop()
        self._subtitle()

    @property
    def following(self) -> bool:
        """True while the newest row is in view (new rows then keep it in view)."""
        return self.table.following

    def follow(self) -> None:
        """Show the newest rows, and keep showing them as rows arrive."""
        self.table.scroll_to_newest()
        self._subtitle()

    def _subtitle(self) -> None:
        shown = self.table.row_count
        if self.filter_text:
            text = f"filter '{self.filter_text}': {self._matching:,} of the last {len(self._records):,} decisions"
            if shown < self._matching:
                text += f", the newest {shown:,} shown"
        else:
            text = f"{shown} rows"
        if not self.following:
            text = f"scrolled back, not following: G shows the newest | {text}"
        set_border_text(self, text)

    @property
    def visible_request_ids(self) -> list[str]:
        return [key.rpartition(" ")[0] for key in self.table.row_keys]

    @property
    def visible_rows(self) -> list[str]:
        """The rows' keys in the table (`_row_key`), oldest first."""
        return self.table.row_keys

    # ---- filter ----------------------------------------------------------------

    def set_filter(self, text: str) -> None:
        text = text.strip().lower()
        if text == self.filter_text:
            return
        self.filter_text = text
        self._rebuild()
        self.follow()
        self._subtitle()
        self.post_message(FilterChanged())

    def open_filter(self) -> None:
        self.input.display = True
        self.input.focus()

    def action_clear_filter(self) -> None:
        self.input.value = ""
        self.input.display = False
        self.set_filter("")
        self.post_message(FilterClosed())

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input is self.input:
            event.stop()
            self.set_filter(event.value)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input is self.input:
            event.stop()
            if not self.filter_text:
                self.input.display = False
            self.post_message(FilterClosed())
