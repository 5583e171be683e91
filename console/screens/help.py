"""`?`: the keys this console answers to (only those that exist in this mode) and what the colours mean."""

from __future__ import annotations

from collections.abc import Sequence

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

LEGEND = (
    ("p95 TTFT", "green below 0.7 x SLO, yellow up to the SLO, red above it"),
    ("deferred", "llama-server's own queue: the gate keeps it at 0; red otherwise"),
    ("bars", "green < 70%, yellow < 90%, red above (GPU: nvitop's 10/80%)"),
    ("header", "READ-ONLY: no actions; PAUSED: rendering stopped, the gate still collects"),
    ("KV reserved", "tokens in flight x KV bytes per token (GGUF header; n/a when the model file is not on this host) against the pool"),
    (
        "waits on",
        "what keeps a class's oldest request waiting: slots, token budget, reservations, class limit, tenant quota, prefill limit, priority, PAUSED",
    ),
    (
        "wait p95",
        "time in the gate's own queue, refusals after waiting included (TTFT p95 is measured from dispatch: it does not include it)",
    ),
    ("met", "last minute's arrivals whose first token came within the objective from arrival; refusals count as misses"),
)


class HelpScreen(ModalScreen[None]):
    """Lists (key, description) pairs handed in by the app."""

    BINDINGS = [Binding("escape,question_mark,q", "close", "close")]

    def __init__(
        self,
        keys: Sequence[tuple[str, str]],
        *,
        read_only: bool = False,
        about: Sequence[tuple[str, str]] = (),
    ) -> None:
        super().__init__(classes="dialog-screen")
        self.keys = list(keys)
        self.about = list(about)  # (name, value): the journal's path, the console's own tick time
        self.read_only = read_only

    def compose(self) -> ComposeResult:
        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold cyan", no_wrap=True)
        table.add_column()
        for key, description in self.keys:
            table.add_row(key, description)
        legend = Table.grid(padding=(0, 2))
        legend.add_column(style="bold", no_wrap=True)
        legend.add_column()
        for name, meaning in LEGEND:
            legend.add_row(name, meaning)
        with Vertical(id="help-dialog", classes="dialog"):
            title = "Keys" + ("  (READ-ONLY: actions are turned off)" if self.read_only else "")
            yield Static(title, classes="dialog-title")
            with VerticalScroll(id="help-body"):
                yield Static(table, id="help-keys")
                yield Static(Text("\nColours", style="bold"))
                yield Static(legend, id="help-legend")
                if self.about:
                    about = Table.grid(padding=(0, 2))
                    about.add_column(style="bold", no_wrap=True)
                    about.add_column()
                    for name, value in self.about:
                        about.add_row(name, Text(value))
                    yield Static(Text("\nThis console", style="bold"))
                    yield Static(about, id="help-about")
            yield Static("esc, ? or q closes", classes="dialog-hint")

    def action_close(self) -> None:
        self.dismiss(None)
