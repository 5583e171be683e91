"""`m`: the models of a llama-server router, with load / unload / pin (router mode).

The rows are the main view's models panel, kept current by the app's ticks (the view goes on
behind this dialog). Each action asks first (focus on No) and goes to the gate as one
`ModelAction` command through the app, which toasts the result; the gate audits it. A
read-only console shows the rows without the action keys.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static

from console.screens.confirm import ConfirmScreen
from console.widgets.models import ModelsTable, title
from gate.data.commands import ModelAction
from gate.data.snapshot import GateSnapshot, ModelView

#: action -> (dialog title, what it does), for the confirmation
EFFECTS = {
    "load": "Load {m}? {why}Its requests wait in the gate until it is loaded.",
    "unload": "Unload {m}? Its process stops and its memory is freed; its next request loads it again "
    "(requests for it then wait for the load).",
    "pin": "Pin {m}? A pinned model is loaded if it is not, and never evicted for another model.",
    "unpin": "Unpin {m}? It may then be evicted for another model once idle.",
}


class ModelsScreen(ModalScreen[None]):
    """The models table; `l` load, `u` unload, `p` pin/unpin the selected model."""

    BINDINGS = [
        Binding("l", "act('load')", "load"),
        Binding("u", "act('unload')", "unload"),
        Binding("p", "act('pin')", "pin/unpin"),
        Binding("escape,m,q", "close", "close"),
    ]

    def __init__(self, snap: GateSnapshot, send: Callable[[ModelAction], Awaitable[object]], *, read_only: bool = False) -> None:
        super().__init__(classes="dialog-screen")
        self.snap = snap
        self.send = send
        self.read_only = read_only

    def compose(self) -> ComposeResult:
        with Vertical(id="models-dialog", classes="dialog"):
            yield Static(title(self.snap.models, read_only=self.read_only), id="models-title", classes="dialog-title")
            yield ModelsTable(id="models-table")
            hint = "read-only: no actions  |  esc closes" if self.read_only else "l load  u unload  p pin/unpin  |  esc closes"
            yield Static(hint, classes="dialog-hint")

    def on_mount(self) -> None:
        table = self.query_one(ModelsTable)
        table.update_models(self.snap.models)
        table.focus()

    def update_snapshot(self, snap: GateSnapshot) -> None:
        """Called by the app every tick while this dialog is open."""
        self.snap = snap
        self.query_one("#models-title", Static).update(title(snap.models, read_only=self.read_only))
        self.query_one(ModelsTable).update_models(snap.models)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return not (action == "act" and self.read_only)

    def _selected(self) -> ModelView | None:
        name = self.query_one(ModelsTable).selected_model
        return next((m for m in self.snap.models if m.name == name), None)

    def action_act(self, action: str) -> None:
        model = self._selected()
        if model is None:
            return
        if action == "pin" and model.pinned:
            action = "unpin"
        why = ""
        if action == "load":
            loaded = sum(1 for m in self.snap.models if m.status in ("loaded", "sleeping", "loading", "evicting"))
            if model.models_max and loaded >= model.models_max:
                why = f"{loaded} of at most {model.models_max} loaded: the least recently used idle model is evicted. "

        async def answered(yes: bool | None) -> None:
            if yes:
                await self.send(ModelAction(model.name, action))

        self.app.push_screen(
            ConfirmScreen(
                f"{action.capitalize()} {model.name}?", EFFECTS[action].format(m=model.name, why=why), yes_label=action.capitalize()
            ),
            answered,
        )

    def action_close(self) -> None:
        self.dismiss(None)
