"""The fleet screen: one row per attached gate; Enter opens that gate's full console.

Rows come from `console.fleet.FleetRow` (the fleet polls each gate's snapshot); the screen
only draws them. A gate that cannot be reached keeps its row and says why: in the row's last
column, and whole, wrapped, under the table for the row the cursor is on (at 120 columns the
column cut "no control socket here (is `tokengate serve` running ...)" to "no control so…").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from console.fleet import FleetRow
from console.styles import SHARED, ttft_style
from console.widgets.classes import drop_stale, sync_row

COLUMNS: dict[str, str] = {
    "name": "gate",
    "state": "state",
    "host": "host",
    "listen": "listen",
    "backends": "backends",
    "budget": "budget",
    "in_flight": "in flight",
    "queued": "queued",
    "denials": "ref/m",
    "p95": "TTFT p95/obj",
    "shared": "shared",
    "note": "",
}


def _n(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def row_cells(row: FleetRow) -> dict[str, Any]:
    ok = row.state == "ok"
    p95 = "n/a" if row.p95_ttft_ms is None else f"{row.p95_ttft_ms:,.0f}"
    return {
        "name": Text(row.name, style="bold"),
        "state": Text(row.state, style="green" if ok else "bold red" if row.state == "down" else "yellow"),
        "host": row.host,
        "listen": row.listen,
        "backends": Text("")
        if row.backends is None
        else Text(f"{row.ready}/{row.backends} ready", style="" if row.ready == row.backends else "bold red"),
        "budget": _n(row.budget),
        "in_flight": "-" if row.in_flight is None else f"{row.in_flight:,} tok, {row.running} req",
        "queued": Text(_n(row.queued), style="yellow" if row.queued else ""),
        "denials": Text(_n(row.denials_per_min), style="bold red" if row.denials_per_min else ""),
        "p95": Text("-")
        if row.slo_ttft_ms is None
        else Text(
            f"{p95}/{row.slo_ttft_ms:,.0f} ms{f' {row.ttft_class}' if row.ttft_class else ''}",
            style=ttft_style(row.p95_ttft_ms, row.slo_ttft_ms),
        ),
        "shared": Text(row.shared, style=SHARED.get(row.shared, "")),
        "note": Text(row.note, style="red"),
    }


class FleetTable(DataTable):
    """One keyed row per gate (the key is the gate's name), updated cell by cell."""

    def __init__(self, **kwargs) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)
        self._cells: dict[str, dict[str, Any]] = {}
        self.notes: dict[str, str] = {}  # each gate's note, whole
        for key, label in COLUMNS.items():
            self.add_column(label, key=key)

    def show(self, rows: Sequence[FleetRow]) -> None:
        self.notes = {row.name: row.note for row in rows}
        for row in rows:
            sync_row(self, self._cells, row.name, row_cells(row), tuple(COLUMNS))
        drop_stale(self, self._cells, {r.name for r in rows})

    @property
    def selected_gate(self) -> str | None:
        if self.row_count == 0:
            return None
        try:
            return str(self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value)
        except Exception:  # noqa: BLE001 - no cursor row yet
            return None


class FleetScreen(Screen[None]):
    """The fleet's rows; Enter (or a click) opens the selected gate's full console."""

    DEFAULT_CSS = """
    #fleet-table { height: 1fr; }
    #fleet-note { height: auto; color: $error; }
    """
    BINDINGS = [
        Binding("enter", "open", "open gate"),
        Binding("q", "quit_fleet", "quit"),
        Binding("ctrl+c", "quit_fleet", "quit", show=False),
    ]

    def __init__(self, title: str) -> None:
        super().__init__(id="fleet-screen")
        self.title_text = title

    def compose(self) -> ComposeResult:
        yield Static(self.title_text, id="fleet-title")
        self.table = FleetTable(id="fleet-table")
        yield self.table
        self.note = Static("", id="fleet-note", markup=False)
        yield self.note
        yield Static("enter: open the gate's console (q there comes back here)  q: quit", id="fleet-hint")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.table.focus()

    def show(self, rows: Sequence[FleetRow]) -> None:
        self.table.show(rows)
        self._show_note()

    def _show_note(self) -> None:
        """The note of the gate under the cursor, whole (the table's column cuts it)."""
        gate = self.table.selected_gate
        note = self.table.notes.get(gate, "") if gate is not None else ""
        self.note.update(f"{gate}: {note}" if note else "")

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        event.stop()
        self._show_note()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        self.app.call_later(self.app.open_gate, str(event.row_key.value))  # type: ignore[attr-defined]

    async def action_open(self) -> None:
        gate = self.table.selected_gate
        if gate is not None:
            await self.app.open_gate(gate)  # type: ignore[attr-defined]

    def action_quit_fleet(self) -> None:
        self.app.exit()
