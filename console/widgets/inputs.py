"""Text fields whose keys land in the order they were typed, however fast they come.

Textual's Input and TextArea insert a printable key in their own key handler, but their
editing keys (backspace, delete, end, the arrows, ctrl+u, ...) are bindings, and a non-priority
binding runs only once the key event has bubbled back up to the app, one message queue per
ancestor. Keys read in one burst (a paste, `tmux send-keys BSpace BSpace BSpace 3 0 0 0`, typing
ahead over a laggy SSH link) are all queued at the app before the first of them bubbles back,
so every character was inserted before any backspace ran: a trial's "slo" became "3000" and
then "3" (the three backspaces deleted the zeros), and a retune nearly saved a TTFT objective
of 3 ms (Textual issue #6605, open in 8.2.8). Here a field runs its own bindings in its key
handler, where the characters are inserted, so each key takes effect before the next is read.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from textual import events
from textual.widget import Widget
from textual.widgets import Input, TextArea


async def run_own_binding(widget: Widget, event: events.Key) -> bool:
    """Run `widget`'s own non-priority binding for `event` now (priority ones ran at the app
    before the key reached the widget); True when one ran and the key is used up."""
    if event.is_printable:
        return False  # the widget's handler inserts it
    for binding in widget._bindings.key_to_bindings.get(event.key, ()):
        # what the app does with the key once it bubbles up: the focused widget's bindings
        # are the first of its chain, tried in order, the first whose action runs wins
        if not binding.priority and await widget.app.run_action(binding.action, widget):
            event.stop()
            event.prevent_default()
            return True
    return False


async def _in_order(widget: Input | TextArea, event: events.Key, insert: Callable[[events.Key], Awaitable[None]]) -> None:
    """`widget`'s key handler: its own binding now, else its own handler (`insert`)."""
    if await run_own_binding(widget, event):
        widget._restart_blink()
        return
    await insert(event)


class InOrderInput(Input):
    """An Input whose editing keys run in the order typed, among the characters."""

    async def _on_key(self, event: events.Key) -> None:
        await _in_order(self, event, super()._on_key)


class InOrderTextArea(TextArea):
    """A TextArea whose editing keys run in the order typed, among the characters."""

    async def _on_key(self, event: events.Key) -> None:
        await _in_order(self, event, super()._on_key)
