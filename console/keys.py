"""The console's keys, each with what it does written once: the binding's ``tooltip``.

The footer shows a binding's short ``description`` (and its tooltip on hover); `?` lists
the tooltips (:func:`key_help`) and the `:` palette reuses them (:data:`HELP`). Two sets:
the live view's (:data:`MAIN_BINDINGS`, bound on console.screens.main.MainScreen, so no
other screen answers to them) and the app-wide ones (:data:`APP_BINDINGS`: the palette and
quit, on TokengateApp). Plain data and functions of it: nothing here knows the app.
"""

from __future__ import annotations

from collections.abc import Iterable

from textual.binding import Binding, BindingsMap

#: actions that change the gate: absent in --read-only
GATE_ACTIONS = frozenset({"retune", "pause_class", "drain_class", "freeze"})

#: the compact layout's tab keys, one footer entry: "1 2 3 tabs"
TABS = Binding.Group("tabs", compact=True)
_TABS_HELP = "small terminal: 1 denials, 2 budget chart, 3 decisions (the tabs)"

#: the live view's keys (MainScreen's), in the footer's order
MAIN_BINDINGS: tuple[Binding, ...] = (
    Binding("t", "retune", "retune", tooltip="retune budget, SLO and the selected class"),
    Binding("p", "pause_class", "pause", tooltip="pause/resume the selected class (503 class_paused)"),
    Binding("d", "drain_class", "drain", tooltip="drain the selected class's queue (asks; 503 drained)"),
    Binding("f", "freeze", "freeze", tooltip="freeze/unfreeze the adaptive controller"),
    Binding(
        "r",
        "review",
        "review",
        # (a trial's `?` said only "read-only", and nobody found the what-if or its apply)
        tooltip="review the journal; w there: what-if, ctrl+t applies it",
    ),
    # router mode only; not in the footer (room at 80 columns), `?` lists it
    Binding("m", "models", "models", show=False, tooltip="router mode: the models (load, unload, pin/unpin; each asks first)"),
    Binding("slash", "filter", "filter", key_display="/", tooltip="filter the decision tail (enter keeps, esc clears)"),
    Binding("G", "follow", "newest", show=False, key_display="G", tooltip="decision tail: jump to the newest row and follow new ones"),
    # not in the footer (room for the tab keys at 80 columns); `?` lists it
    Binding("space", "toggle_render", "view", show=False, key_display="space", tooltip="pause/resume rendering (the gate goes on)"),
    Binding("plus", "faster", "faster", show=False, key_display="+", tooltip="refresh faster (down to 0.25 s)"),
    Binding("minus", "slower", "slower", show=False, key_display="-", tooltip="refresh slower (up to 10 s)"),
    # compact layout: one key per tab (shown in the footer only there)
    Binding("1", "show_pane('denials')", "denials", key_display="1", group=TABS, tooltip=_TABS_HELP),
    Binding("2", "show_pane('chart')", "budget", key_display="2", group=TABS, tooltip=_TABS_HELP),
    Binding("3", "show_pane('decisions')", "decisions", key_display="3", group=TABS, tooltip=_TABS_HELP),
    Binding("question_mark", "help", "help", key_display="?", tooltip="this help"),
    # esc clears a kept filter from wherever the focus is (it went back to the classes table on
    # enter, and esc did nothing there); `?` lists it with the dialogs' esc, below
    Binding("escape", "clear_filter", "clear filter", show=False),
)

#: keys every screen answers to (TokengateApp's); a screen's own q (a dialog's, the review's) comes first
APP_BINDINGS: tuple[Binding, ...] = (
    # Not a priority binding (Textual's default is): ':' must stay typeable in inputs.
    Binding("colon", "command_palette", "palette", show=False, key_display=":", tooltip="command palette: every action by name"),
    Binding("q", "quit", "quit", tooltip="quit; asks while requests are in flight (stops the gate); attached: detach, the gate goes on"),
    # ctrl+c asks like q (Textual's default only toasts "press ctrl+q")
    Binding("ctrl+c", "quit", "quit", show=False),
)


def _action(binding: Binding) -> str:
    return binding.action.split("(", 1)[0]


#: action -> what it does (the tooltips above), for the palette's help lines
HELP: dict[str, str] = {_action(b): b.tooltip for b in MAIN_BINDINGS + APP_BINDINGS if b.tooltip}

#: what `?` adds: keys that are not bindings of the console's own
_MORE_HELP = (
    ("up/down", "select a class (the row p, d and t act on)"),
    ("tab, pgup/pgdn", "to the decision tail and back through it (G follows again)"),
    ("esc", "clear the filter / close a dialog"),
)


def without_gate_actions(bindings: BindingsMap) -> BindingsMap:
    """Read-only: the same bindings less the gate actions (absent, not disabled: the footer
    and `?` don't list them); pressed, a gate action's key says why nothing happens (a hidden
    binding to a toast), rather than being silently ignored."""
    return BindingsMap.from_keys(
        {
            key: kept or [Binding(key, "app.read_only_notice", show=False)]
            for key, found in bindings.key_to_bindings.items()
            if (kept := [b for b in found if b.action.removeprefix("app.") not in GATE_ACTIONS]) or found
        }
    )


def key_help(bindings: Iterable[tuple[str, Binding]]) -> list[tuple[str, str]]:
    """(keys, what they do) for every action the given bindings have that has a tooltip, in
    the order of the tables above; an action's keys together (q, ctrl+q, ctrl+c): read-only
    lists fewer."""
    keys: dict[str, list[str]] = {}
    for _key, binding in bindings:
        action = _action(binding)
        if action in HELP:
            keys.setdefault(action, []).append(binding.key_display or binding.key)
    order = list(HELP)
    rows = [(", ".join(sorted(dict.fromkeys(keys[a]), key=len)), HELP[a]) for a in sorted(keys, key=order.index)]
    return rows + list(_MORE_HELP)


def action_key(bindings: BindingsMap, action: str) -> str | None:
    """The key bound to `action` (None where none is: a read-only console's gate actions)."""
    for key, found in bindings.key_to_bindings.items():
        if any(_action(b) == action for b in found):
            return key
    return None
