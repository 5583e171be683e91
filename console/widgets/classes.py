"""The classes table: one keyed row per class, updated cell by cell.

Its cursor row is "the selected class" that `p` (pause), `d` (drain) and `t`
(retune) act on. Narrower than NARROW_BELOW columns it drops the static
columns (priority, paused, reserved, limit, in-flight; "waits on" says PAUSED), narrower
than TINY_BELOW the rates too, so that load, waiting and latency stay visible.
"wait p95" is the time in the gate's own queue, every outcome (a refusal after waiting
included); "TTFT p95/obj" is the first token from arrival, that wait included (what the
class's clients saw), against the class's objective in force (its ttft_objective_ms, else the
SLO): a trial's column read "117/2,000" in green, llama-server's time from dispatch against
[budget] slo_ttft_p95_ms, while clients saw 1.9 s, and still "/2,000" after interactive's
objective was retuned to 1,500 (the capacity panel's p95 is that controller's kind of signal,
named so); "met" is the share
of the last minute's arrivals whose first token came within their objective from arrival
(the class's ttft_objective_ms, else the SLO, shown after it: "82%/2s"), refusals counted as
misses; "waits on" says
what keeps the oldest waiter waiting.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.text import Text
from textual import events
from textual.markup import escape
from textual.widgets import DataTable
from textual.widgets.data_table import CellDoesNotExist, RowDoesNotExist

from console.styles import WARN_BADGE, ttft_style
from console.widgets.borders import set_border_text
from gate.data.snapshot import ClassView, GateSnapshot

WARN_MARK = "bold yellow"

LABELS: dict[str, str] = {
    "name": "class",
    "prio": "prio",
    "paused": "paused",
    "reserved": "resv",
    "limit": "limit",
    "in_flight": "in-flight",
    "queued": "queued",
    "oldest": "oldest",
    "wait": "wait p95",
    "adm": "adm/m",
    "ref": "ref/m",
    "p95": "TTFT p95/obj",
    "met": "met/obj",
    "binds": "waits on",
}
FULL = tuple(LABELS)
NARROW = ("name", "queued", "oldest", "wait", "adm", "ref", "p95", "met", "binds")
TINY = ("name", "queued", "oldest", "wait", "p95", "met", "binds")
NARROW_BELOW = 128
TINY_BELOW = 94


def sync_row(table: DataTable, cache: dict[str, dict[str, Any]], key: str, cells: Mapping[str, Any], columns: Sequence[str]) -> None:
    """Add the row `key`, or update only the shown cells that changed (`cache` holds every cell)."""
    old = cache.get(key)
    if old is None:
        table.add_row(*(cells[c] for c in columns), key=key)
    else:
        for col in columns:
            if old.get(col) != cells[col]:
                try:
                    # update_width: a column keeps its header's width otherwise ("116" shows as "11")
                    table.update_cell(key, col, cells[col], update_width=True)
                except (CellDoesNotExist, RowDoesNotExist):
                    pass
    cache[key] = dict(cells)


def drop_stale(table: DataTable, cache: dict[str, Any], keep: set[str]) -> None:
    """Remove the rows whose key is no longer in `keep`."""
    for key in [k for k in cache if k not in keep]:
        try:
            table.remove_row(key)
        except RowDoesNotExist:
            pass
        del cache[key]


def _wait(s: float | None, timeout_s: float) -> Text:
    if s is None:
        return Text("")
    style = "green" if s < 0.5 * timeout_s else "yellow" if s < 0.9 * timeout_s else "bold red"
    return Text(f"{s:.1f}s", style=style)


def class_cells(c: ClassView, slo_ms: float) -> dict[str, Any]:
    """`slo_ms`: [budget] slo_ttft_p95_ms, the objective of a class without its own (a gate
    that does not say the one in force)."""
    queued_style = "bold red" if c.queued >= c.queue_depth else "yellow" if c.queued else ""
    p95 = "n/a" if c.p95_ttft_arrival_ms is None else f"{c.p95_ttft_arrival_ms:,.0f}"
    objective = c.ttft_objective_ms if c.ttft_objective_ms is not None else slo_ms
    return {
        "name": Text(c.name, style="bold"),
        "prio": c.priority,
        "paused": Text("PAUSED", style=WARN_BADGE) if c.paused else Text(""),
        "reserved": _reserved(c),
        "limit": "-" if c.limit_tokens is None else c.limit_tokens,
        "in_flight": c.in_flight,
        "queued": Text(f"{c.queued}/{c.queue_depth}", style=queued_style),
        "oldest": _wait(c.oldest_wait_s, c.queue_timeout_s),
        "adm": c.admitted_per_min,
        "ref": Text(str(c.refused_per_min), style="bold red" if c.refused_per_min else ""),
        "p95": Text(f"{p95}/{objective:,.0f}", style=ttft_style(c.p95_ttft_arrival_ms, objective)),
        "wait": _wait_ms(c.p95_queue_ms, c.queue_timeout_s),
        "met": _met(c.met, c.judged, c.ttft_objective_ms, c.first_token_ms if c.objective_below_ttft else None),
        # What binds now: PAUSED whatever else (the queue is held), else why the oldest waits.
        "binds": Text("PAUSED", style=WARN_BADGE) if c.paused else Text(c.waiting_on, style="yellow"),
    }


def _reserved(c: ClassView) -> Text:
    """reserved_tokens, and what is in force when a small pool scaled it down (R0): "1024→512"."""
    if c.reserved_in_force is None or c.reserved_in_force == c.reserved_tokens:
        return Text(str(c.reserved_tokens))
    return Text(f"{c.reserved_tokens}→{c.reserved_in_force}", style="yellow")


def _met(met: int, judged: int, objective_ms: float | None = None, first_token_ms: float | None = None) -> Text:
    """The share of last minute's arrivals that met their objective, refusals counted as misses,
    and the objective ("82%/2s"): which one a class is judged by is not otherwise shown.
    `first_token_ms`: the objective is below the first token llama-server delivers now, shown
    after it ("13%/1.5s<2.3s"; the capacity panel says what that means)."""
    objective = "" if objective_ms is None else f"/{_seconds(objective_ms)}"
    if not judged:
        text = Text(f"-{objective}", style="dim")
    else:
        share = met / judged
        text = Text(f"{100 * share:.0f}%{objective}", style="green" if share >= 0.95 else "yellow" if share >= 0.8 else "bold red")
    if first_token_ms is not None:
        text.append(f"<{_seconds(first_token_ms)}", WARN_MARK)
    return text


def _seconds(ms: float) -> str:
    """An objective as it is read: 632ms, 2s, 2.5s."""
    return f"{ms:.0f}ms" if ms < 1000 else f"{ms / 1000:g}s"


def _wait_ms(ms: float | None, timeout_s: float) -> Text:
    """p95 time in the gate's queue: the wait TTFT (measured from dispatch) does not show."""
    if ms is None:
        return Text("-", style="dim")
    return _wait(ms / 1000, timeout_s) if ms >= 100 else Text(f"{ms:.0f}ms", style="green")


class ClassesTable(DataTable):
    """Priority, pause state, shares, load and latency per class."""

    def __init__(self, **kwargs) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)
        self._cells: dict[str, dict[str, Any]] = {}
        self.columns_shown: tuple[str, ...] = FULL
        self._add_columns()

    def _add_columns(self) -> None:
        for key in self.columns_shown:
            self.add_column(LABELS[key], key=key)

    def on_resize(self, event: events.Resize) -> None:
        width = event.size.width
        wanted = TINY if width < TINY_BELOW else NARROW if width < NARROW_BELOW else FULL
        if wanted != self.columns_shown:
            self.columns_shown = wanted
            self._rebuild()

    def _rebuild(self) -> None:
        selected = self.selected_class
        self.clear(columns=True)
        self._add_columns()
        for key, cells in self._cells.items():
            self.add_row(*(cells[c] for c in self.columns_shown), key=key)
        if selected is not None:
            self.select_class(selected)

    @property
    def selected_class(self) -> str | None:
        """The class under the cursor (None while the table is empty)."""
        if not self.row_count:
            return None
        try:
            row_key, _ = self.coordinate_to_cell_key(self.cursor_coordinate)
        except CellDoesNotExist:
            return None
        return row_key.value

    def select_class(self, name: str) -> None:
        try:
            self.move_cursor(row=self.get_row_index(name))
        except RowDoesNotExist:
            pass

    def update_snapshot(self, snap: GateSnapshot) -> None:
        slo = snap.controller.slo_ttft_ms
        for c in snap.classes:
            sync_row(self, self._cells, c.name, class_cells(c, slo), self.columns_shown)
        drop_stale(self, self._cells, {c.name for c in snap.classes})
        below = [c.name for c in snap.classes if c.objective_below_ttft]
        # the met column's "<2.3s", named: the capacity panel has the whole sentence
        set_border_text(
            self, "" if not below else f"[bold yellow]! objective < first token now: {escape(', '.join(below))}[/] (see capacity)"
        )
