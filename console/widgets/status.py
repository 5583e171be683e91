"""The status line: refresh interval, render state, filter, and how long a tick took."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static


def show_text(widget: Static, text: Text) -> None:
    """Update a Static only when its text changed, and re-lay out only when its line count did."""
    old = widget.content
    if isinstance(old, Text) and old == text:
        return
    lines = text.plain.count("\n")
    layout = not isinstance(old, Text) or old.plain.count("\n") != lines
    widget.update(text, layout=layout)


class StatusBar(Static):
    """One line under the panels; the footer below it lists the keys."""

    def __init__(self, **kwargs) -> None:
        super().__init__("", **kwargs)

    def show(
        self,
        *,
        interval_s: float,
        paused: bool,
        filter_text: str = "",
        tick_ms: float | None = None,
        error: str | None = None,
        reaped: int = 0,
    ) -> None:
        line = Text()
        line.append(f" refresh {interval_s:g}s", "bold")
        if paused:
            line.append("  rendering paused (space resumes; the gate keeps collecting)", "bold blue")
        if filter_text:
            line.append(f"  filter '{filter_text}'", "bold cyan")
        if tick_ms is not None:
            line.append(f"  tick {tick_ms:.1f} ms", "dim")
        if reaped:
            line.append(f"  reaped {reaped}", "yellow")
        if error:
            line.append(f"  console error: {error}", "bold red")
        show_text(self, line)
