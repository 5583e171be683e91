"""While the embedded gate drains after `q`: how many requests it still waits for, how long at most.

The gate refuses new requests (503 shutting_down) and gives those in flight its grace
period; this screen polls the gate's snapshots (the control socket stays open until the
drain ends) and the app exits when the gate has gone. Nothing to answer: esc does nothing,
the drain cannot be undone.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static


def drain_progress(waiting: int, left_s: float) -> str:
    """``waiting for 5 requests, 12 s left`` (the grace period's remainder)."""
    plural = "request" if waiting == 1 else "requests"
    if waiting <= 0:
        return "no request left in flight: the gate is closing"
    return f"waiting for {waiting} {plural}, {max(0.0, left_s):.0f} s left"


class StoppingScreen(ModalScreen[None]):
    """Shows the drain's progress; the app updates it with `show(waiting, left_s)`."""

    BINDINGS = []  # no keys: the drain cannot be interrupted from here

    def __init__(self, grace_s: float) -> None:
        super().__init__(classes="dialog-screen")
        self.grace_s = grace_s
        self.progress = Static("", id="stopping-progress", markup=False)

    def compose(self) -> ComposeResult:
        with Vertical(id="stopping-dialog", classes="dialog"):
            yield Static("Stopping the gate", classes="dialog-title")
            yield Static(
                f"New requests get 503 shutting_down; those in flight get up to {self.grace_s:g} s to finish, "
                "then they are cut and the journal is flushed.",
                markup=False,
            )
            yield self.progress

    def show(self, waiting: int, left_s: float) -> None:
        self.progress.update(drain_progress(waiting, left_s))
