"""Enter on a review row: every field of that journal row, full width, nothing cut."""

from __future__ import annotations

from collections.abc import Sequence

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static


class RecordScreen(ModalScreen[None]):
    """(field, value) pairs of one row; esc, enter or q closes."""

    DEFAULT_CSS = """
    RecordScreen {
        align: center middle;
    }
    RecordScreen #record-dialog {
        width: 100;
        max-width: 100%;
        height: auto;
        max-height: 100%;
        border: thick $accent;
        background: $surface;
        padding: 0 1;
    }
    RecordScreen #record-body {
        height: auto;
        max-height: 80vh;
    }
    RecordScreen .dialog-title {
        text-style: bold;
        width: 100%;
        content-align: center middle;
    }
    """
    BINDINGS = [Binding("escape,enter,q", "close", "close")]

    def __init__(self, title: str, fields: Sequence[tuple[str, str]]) -> None:
        super().__init__(classes="dialog-screen")
        self.title_text = title
        self.fields = list(fields)

    def compose(self) -> ComposeResult:
        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="bold", no_wrap=True)
        grid.add_column(overflow="fold")
        for name, value in self.fields:
            grid.add_row(name, Text(value))  # literal: tenants and notes are free text
        with Vertical(id="record-dialog", classes="dialog"):
            yield Static(self.title_text, classes="dialog-title")
            with VerticalScroll(id="record-body"):
                yield Static(grid, id="record-fields")
            yield Static("esc, enter or q closes", classes="dialog-hint")

    def action_close(self) -> None:
        self.dismiss(None)
