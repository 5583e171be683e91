"""The live console's keys: its bindings, what `?` says about each, the `:` palette's
commands, and the short labels of the budget curve's marks.

Kept out of console/app.py so that the app holds the view and its actions only.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from textual.binding import Binding, BindingsMap

from gate.data.records import AuditRecord

if TYPE_CHECKING:
    from console.app import TokengateApp

#: actions that change the gate: absent in --read-only
GATE_ACTIONS = frozenset({"retune", "pause_class", "drain_class", "freeze"})
#: actions that only make sense on the live view (not under the review screen)
MAIN_ONLY = GATE_ACTIONS | {"review", "toggle_render", "faster", "slower", "filter", "follow", "show_pane", "help", "models"}

PANES = ("denials", "chart", "decisions")

#: key -> what `?` says about it (descriptions for the footer stay short)
KEY_HELP: dict[str, str] = {
    "retune": "retune budget, SLO and the selected class",
    "pause_class": "pause/resume the selected class (503 class_paused)",
    "drain_class": "drain the selected class's queue (asks; 503 drained)",
    "freeze": "freeze/unfreeze the adaptive controller",
    "review": "review the journal (read-only)",
    "models": "router mode: the models (load, unload, pin/unpin; each asks first)",
    "filter": "filter the decision tail (enter keeps, esc clears)",
    "follow": "decision tail: jump to the newest row and follow new ones",
    "toggle_render": "pause/resume rendering (the gate goes on)",
    "faster": "refresh faster (down to 0.25 s)",
    "slower": "refresh slower (up to 10 s)",
    "command_palette": "command palette: every action by name",
    "show_pane": "small terminal: 1 denials, 2 budget chart, 3 decisions (the tabs)",
    "help": "this help",
    "quit": "quit; asks while requests are in flight (stops the gate); attached: detach, the gate goes on",
}
#: audit sources whose rows are toasted when another console (or a signal) made them
TOASTED_SOURCES = frozenset({"console", "signal", "config", "gate", "api"})


#: the compact layout's tab keys, one footer entry: "1 2 3 tabs"
TABS = Binding.Group("tabs", compact=True)


def _gate_bindings() -> list[Binding]:
    return [
        Binding("t", "retune", "retune"),
        Binding("p", "pause_class", "pause"),
        Binding("d", "drain_class", "drain"),
        Binding("f", "freeze", "freeze"),
    ]


def mark_label(a: AuditRecord) -> str:
    """A budget-curve mark's short label: who moved what (set 6144, ctl 8192, freeze)."""
    if a.action == "set_budget":
        return f"set {a.new_value}"
    if a.action.startswith("budget_"):
        return f"ctl {a.new_value}"
    return a.action.removesuffix("_class")


def app_bindings() -> list[Binding]:
    return [
        *_gate_bindings(),
        Binding("r", "review", "review"),
        # router mode only; not in the footer (room at 80 columns), `?` lists it
        Binding("m", "models", "models", show=False),
        Binding("slash", "filter", "filter", key_display="/"),
        Binding("G", "follow", "newest", show=False, key_display="G"),
        # not in the footer (room for the tab keys at 80 columns); `?` lists it
        Binding("space", "toggle_render", "view", show=False, key_display="space"),
        Binding("plus", "faster", "faster", show=False, key_display="+"),
        Binding("minus", "slower", "slower", show=False, key_display="-"),
        # Not a priority binding (Textual's default is): ':' must stay typeable in inputs.
        Binding("colon", "command_palette", "palette", show=False, key_display=":"),
        # compact layout: one key per tab (shown in the footer only there)
        Binding("1", "show_pane('denials')", "denials", key_display="1", group=TABS),
        Binding("2", "show_pane('chart')", "budget", key_display="2", group=TABS),
        Binding("3", "show_pane('decisions')", "decisions", key_display="3", group=TABS),
        Binding("question_mark", "help", "help", key_display="?"),
        Binding("q", "quit", "quit"),
        # ctrl+c asks like q (Textual's default only toasts "press ctrl+q")
        Binding("ctrl+c", "quit", "quit", show=False),
    ]


def key_help(bindings: BindingsMap) -> list[tuple[str, str]]:
    """(key, what it does) for every binding a console has (read-only lists fewer)."""
    keys: dict[str, list[str]] = {}
    for _key, binding in bindings:
        action = binding.action.split("(", 1)[0]
        if action in KEY_HELP:
            keys.setdefault(action, []).append(binding.key_display or binding.key)
    rows = [(", ".join(sorted(keys[action], key=len)), KEY_HELP[action]) for action in KEY_HELP if action in keys]
    rows.append(("up/down", "select a class (the row p, d and t act on)"))
    rows.append(("tab, pgup/pgdn", "to the decision tail and back through it (G follows again)"))
    rows.append(("esc", "clear the filter / close a dialog"))
    return rows


def palette_commands(app: TokengateApp) -> list[tuple[str, str, Callable[[], Any]]]:
    """(name, help, callback) for the `:` palette; no gate actions when read-only."""
    self = app  # the body reads as one of the app's own methods
    commands: list[tuple[str, str, Callable[[], Any]]] = []
    if not self._main_active():
        return [("Quit", KEY_HELP["quit"], self.action_quit)]
    snap = self.last_snapshot
    if not self.read_only:
        selected = self.class_table.selected_class
        commands.append(("Retune", KEY_HELP["retune"] + (f" (selected: {selected})" if selected else ""), self.action_retune))
        for c in snap.classes if snap is not None else ():
            verb = "Resume" if c.paused else "Pause"
            commands.append((f"{verb} class {c.name}", f"{verb.lower()} admission for {c.name}", partial(self.action_pause_class, c.name)))
            queued = f"{c.queued} request" + ("" if c.queued == 1 else "s")
            commands.append(
                (f"Drain class {c.name}", f"refuse the {queued} queued in {c.name} (asks first)", partial(self.action_drain_class, c.name))
            )
            commands.append((f"Retune class {c.name}", f"retune {c.name} and the budget", partial(self.action_retune, c.name)))
        frozen = snap is not None and snap.controller.frozen
        commands.append(("Unfreeze controller" if frozen else "Freeze controller", KEY_HELP["freeze"], self.action_freeze))
    if snap is not None and snap.models:
        commands.append(("Models", KEY_HELP["models"], self.action_models))
    commands += [
        ("Review journal", KEY_HELP["review"], self.action_review),
        ("Filter decisions", KEY_HELP["filter"], self.action_filter),
        ("Resume rendering" if self.render_paused else "Pause rendering", KEY_HELP["toggle_render"], self.action_toggle_render),
        ("Refresh faster", KEY_HELP["faster"], self.action_faster),
        ("Refresh slower", KEY_HELP["slower"], self.action_slower),
        ("Help", "list the keys", self.action_help),
        ("Quit", KEY_HELP["quit"], self.action_quit),
    ]
    return commands
