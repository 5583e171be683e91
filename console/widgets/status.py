"""The status line: refresh interval, render state, filter, reaped reservations, console errors.

How long a tick takes is for `?` (help), not for the operator's status line."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static


def _rows(widget: Static, text: Text) -> int:
    """The lines `text` takes in `widget`, its wrapping included (a header that wraps onto a
    second line needs a second row: counting only its newlines left the header's overrides
    cut off at 120 columns until the terminal was resized)."""
    width = widget.size.width
    if text.no_wrap or width <= 0:
        return text.plain.count("\n") + 1
    return len(text.wrap(widget.app.console, width))


def show_text(widget: Static, text: Text) -> None:
    """Update a Static only when its text changed, and re-lay out only when its line count did."""
    old = widget.content
    if isinstance(old, Text) and old == text:
        return
    layout = not isinstance(old, Text) or _rows(widget, old) != _rows(widget, text)
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
        error: str | None = None,
        reaped: int = 0,
    ) -> None:
        line = Text()
        line.append(f" refresh {interval_s:g}s", "bold")
        if paused:
            line.append("  rendering paused (space resumes; the gate keeps collecting)", "bold blue")
        if filter_text:
            line.append(f"  filter '{filter_text}'", "bold cyan")
        if reaped:
            line.append(f"  reaped {reaped}", "yellow")
        if error:
            line.append(f"  console error: {error}", "bold red")
        show_text(self, line)
