"""A yes/no dialog for actions that hurt (drain, quit while serving): focus starts on No. A
message longer than the screen allows scrolls (up/down, page up/down) above the buttons."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Static


class ConfirmScreen(ModalScreen[bool]):
    """Dismisses with True only for Yes (button or `y`); enter on the default No says no."""

    # A long message scrolls between the title and the buttons, which stay on screen: the
    # what-if's confirmation (warnings, what the replay ran, what the gate runs now) pushed them
    # past the bottom edge at 80x24
    DEFAULT_CSS = """
    ConfirmScreen #confirm-body {
        height: auto;
        max-height: 60vh;
        scrollbar-size-vertical: 1;
    }
    """

    BINDINGS = [
        Binding("y", "answer(True)", "yes"),
        Binding("n,escape", "answer(False)", "no"),
        Binding("left,right,tab,shift+tab", "toggle_focus", "switch", show=False),
        Binding("up", "scroll_message(-1)", "scroll", show=False),
        Binding("down", "scroll_message(1)", "scroll", show=False),
        Binding("pageup", "scroll_message(-10)", "scroll", show=False),
        Binding("pagedown", "scroll_message(10)", "scroll", show=False),
    ]

    def __init__(self, title: str, message: str, *, yes_label: str = "Yes", no_label: str = "No") -> None:
        super().__init__(classes="dialog-screen")
        self.title_text = title
        self.message = message
        self.yes_label = yes_label
        self.no_label = no_label

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm-dialog", classes="dialog"):
            yield Static(self.title_text, id="confirm-title", classes="dialog-title")
            with VerticalScroll(id="confirm-body", can_focus=False):
                yield Static(self.message, id="confirm-message", markup=False)
            with Horizontal(id="confirm-buttons", classes="dialog-buttons"):
                yield Button(self.yes_label, id="yes", variant="error")
                yield Button(self.no_label, id="no", variant="primary")

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)

    def action_scroll_message(self, lines: int) -> None:
        self.query_one("#confirm-body", VerticalScroll).scroll_relative(y=lines, animate=False)

    def action_toggle_focus(self) -> None:
        other = "#yes" if self.focused is not None and self.focused.id == "no" else "#no"
        self.query_one(other, Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(event.button.id == "yes")
