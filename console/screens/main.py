"""The live view: the panels of one gate, their layout, their keys and the `:` palette's commands.

`MainScreen` is the console's default screen (the bottom of the stack). It owns the live
view's bindings (console/keys.py's MAIN_BINDINGS, each with its help as the tooltip, so the
footer and `?` read one text), so only this screen answers to them: the review screen, the
dialogs and the palette need no filtering of "main-only" keys. Read-only, the gate actions
are not bound at all (absent, not disabled).

It renders what the app hands it (`show_snapshot`, once a tick) and reads the rest of the
app's state through :class:`LiveConsole`: the app keeps the link, the snapshot loop and the
app-wide keys (quit, palette); the gate's actions and the loop's (pause rendering, refresh
faster/slower) are the app's too, since they change what it holds, and this screen's keys
ask for them.

Layout: everything at once on a big terminal (a 2x3 grid); below WIDE_MIN_COLS x
WIDE_MIN_ROWS a compact stack (capacity lines, classes table, and tabs for denials / budget
chart / decision tail). `apply_layout` toggles the `compact` CSS class on #body;
console/app.tcss does the rest. Below MIN_COLS x MIN_ROWS the body gives way to "terminal
too small: need 80x24".
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, Protocol

from textual import on
from textual.app import ComposeResult
from textual.command import CommandPalette
from textual.compose import compose
from textual.containers import Container
from textual.screen import Screen
from textual.widgets import Footer, Static, Tab, Tabs

from console.keys import HELP, MAIN_BINDINGS, action_key, without_gate_actions
from console.screens.help import HelpScreen
from console.widgets.budget_chart import BudgetChart
from console.widgets.classes import ClassesTable
from console.widgets.decisions import DecisionTail, FilterChanged, FilterClosed
from console.widgets.denials import DenialsTable
from console.widgets.gpu import GpuPanel
from console.widgets.header import GateHeader
from console.widgets.models import ModelsPanel
from console.widgets.slots import SlotsPanel
from console.widgets.status import StatusBar
from gate.data.snapshot import GateSnapshot
from gate.ops.link import GateLink

#: what the budget chart shows
CHART_WINDOW_S = 600.0
CHART_POINTS = 600
#: below this the compact layout is used
WIDE_MIN_COLS = 150
WIDE_MIN_ROWS = 40
#: the most rows the classes/denials row of the wide grid takes
MIDDLE_MAX_ROWS = 12
#: the most model rows the models panel shows before it scrolls
MODELS_MAX_ROWS = 6
#: below this the panels would be cut: the console says so instead
MIN_COLS = 80
MIN_ROWS = 24

PANES = ("denials", "chart", "decisions")

Command = tuple[str, str, Callable[[], Any]]


class LiveConsole(Protocol):
    """What the live view reads of the app around it (console.app.TokengateApp): the state
    of the last tick and the actions that change the gate or the loop. A protocol, so that
    this module need not import the app (the app imports it)."""

    link: GateLink
    read_only: bool
    clock: Callable[[], float]
    last_snapshot: GateSnapshot | None
    last_error: str | None
    render_paused: bool
    interval_s: float
    tick_ms: float | None

    def chart_series(self, snap: GateSnapshot) -> dict[str, Any]: ...
    def key_help(self) -> list[tuple[str, str]]: ...
    async def action_retune(self, cls: str | None = None) -> None: ...
    async def action_pause_class(self, cls: str | None = None) -> None: ...
    async def action_drain_class(self, cls: str | None = None) -> None: ...
    async def action_freeze(self) -> None: ...
    async def action_models(self) -> None: ...
    def action_review(self) -> None: ...
    async def action_toggle_render(self) -> None: ...
    def action_faster(self) -> None: ...
    def action_slower(self) -> None: ...
    async def action_quit(self) -> None: ...


class MainScreen(Screen[None]):
    """The live view of one gate (see the module docstring)."""

    BINDINGS = list(MAIN_BINDINGS)

    def __init__(self, console: LiveConsole, *, read_only: bool = False) -> None:
        super().__init__()
        self.console = console
        if read_only:
            self._bindings = without_gate_actions(self._bindings)
        self.compact = False
        self._grid_rows = ""
        #: (when, what) the chart last drew: see _update_chart
        self._chart_drawn: tuple[float, tuple] | None = None
        self._composed = False

    # ---- layout ----------------------------------------------------------------

    def compose(self) -> ComposeResult:
        # Built here, not in __init__: DataTable columns need the running app.
        info = self.console.link.info
        self.header = GateHeader(
            id="header",
            clock=self.console.clock,
            read_only=self.console.read_only,
            attached="" if info.embedded else info.where,
        )
        self.slots = SlotsPanel(id="slots", unfreeze_key=action_key(self._bindings, "freeze"))
        self.gpu = GpuPanel(id="gpu")
        self.models = ModelsPanel(id="models", read_only=self.console.read_only)  # router mode only; hidden otherwise
        self.class_table = ClassesTable(id="classes")
        self.tabs = Tabs(
            Tab("1 denials", id="tab-denials"),
            Tab("2 budget", id="tab-chart"),
            Tab("3 decisions", id="tab-decisions"),
            id="tabs",
            active="tab-decisions",
        )
        self.denials = DenialsTable(id="denials", classes="pane")
        self.chart = BudgetChart(id="chart", classes="pane")
        self.decisions = DecisionTail(id="decisions", classes="pane")
        self.status = StatusBar(id="status")
        yield self.header
        self.body = Container(id="body")
        with self.body:
            yield self.slots
            yield self.gpu
            yield self.models
            yield self.class_table
            yield self.tabs
            yield self.denials
            yield self.decisions  # wide grid: decisions left, chart right of the last row
            yield self.chart
        yield self.status
        self.too_small = Static("", id="too-small")
        yield self.too_small
        yield Footer(compact=True)
        self._composed = True

    def on_mount(self) -> None:
        self._setup_view()

    def _setup_view(self) -> None:
        """What a freshly composed view needs."""
        self.slots.border_title = "capacity"
        self.gpu.border_title = "GPU"
        self.class_table.border_title = "classes"
        self.denials.border_title = "denials"
        self.chart.border_title = "budget (10 min)"
        self.decisions.border_title = "decisions"
        self._show_pane("decisions", sync_tabs=False)
        self.apply_layout(self.app.size.width, self.app.size.height)
        self.class_table.focus()

    async def rebuild(self) -> None:
        """Compose the view anew (the fleet console, for another gate: no rows of the last one kept)."""
        async with self.batch():
            await self.query("*").exclude(".-textual-system").remove()
            await self.mount_all(compose(self))
        self.compact = False
        self._grid_rows = ""
        self._chart_drawn = None
        self._setup_view()

    def apply_layout(self, width: int, height: int) -> None:
        """Compact below WIDE_MIN_COLS x WIDE_MIN_ROWS: summary lines, classes, tabbed panes."""
        if not self._composed:
            return  # the app's first resize comes before the view exists: on_mount lays it out
        compact = width < WIDE_MIN_COLS or height < WIDE_MIN_ROWS
        self.body.set_class(compact, "compact")
        small = width < MIN_COLS or height < MIN_ROWS
        self.body.display = self.status.display = not small
        self.too_small.display = small
        if small:
            self.too_small.update(f"terminal too small: {width}x{height}\nneed {MIN_COLS}x{MIN_ROWS} (the gate goes on; q quits)")
        if compact != self.compact:
            self.compact = compact
            self.refresh_bindings()  # the tab keys show in the footer only when compact
            self.slots.set_compact(compact)
            self.gpu.set_compact(compact)

    def _size_middle_row(self, snap: GateSnapshot) -> None:
        """Wide grid: the classes/denials row fits its rows (a DataTable under `auto` does not)."""
        rows = max(len(snap.classes), min(len(snap.denials), MIDDLE_MAX_ROWS), 3)
        grid_rows = f"auto {min(rows, MIDDLE_MAX_ROWS) + 3} 1fr"  # + header row + border
        if snap.models:  # router mode: the models panel spans both columns under capacity and GPU
            grid_rows = f"auto {min(len(snap.models), MODELS_MAX_ROWS) + 3} " + grid_rows.split(" ", 1)[1]
        if grid_rows != self._grid_rows:
            self._grid_rows = grid_rows
            self.body.styles.grid_rows = grid_rows

    def _show_pane(self, pane: str, *, sync_tabs: bool = True) -> None:
        for name in PANES:
            getattr(self, name).set_class(name == pane, "-active")
        if sync_tabs and self.tabs.active != f"tab-{pane}":
            self.tabs.active = f"tab-{pane}"

    @on(Tabs.TabActivated, "#tabs")
    def _tab_activated(self, event: Tabs.TabActivated) -> None:
        if event.tab.id:
            self._show_pane(event.tab.id.removeprefix("tab-"), sync_tabs=False)

    # ---- rendering ---------------------------------------------------------------

    def show_snapshot(self, snap: GateSnapshot) -> list[str]:
        """Every panel from one snapshot; returns what failed, a message a panel (one broken
        panel must not blank the others)."""
        errors: list[str] = []
        self._size_middle_row(snap)
        for widget in (self.header, self.slots, self.gpu, self.models, self.class_table, self.denials, self.decisions):
            try:
                widget.update_snapshot(snap)
            except Exception as exc:  # noqa: BLE001
                errors.append(f"{widget.id}: {type(exc).__name__}: {exc}")
        try:
            self._update_chart(snap)
        except Exception as exc:  # noqa: BLE001
            errors.append(f"chart: {type(exc).__name__}: {exc}")
        return errors

    def _update_chart(self, snap: GateSnapshot) -> None:
        """Draw the chart when that shows something new: plotext draws in Python (~15 ms a draw
        at 160x48, half the console's CPU once the decision tail stopped re-rendering), and
        each second moves the 10-minute curve by a fraction of one braille dot. So: at once
        when a mark, the hand-set budget, the SLO or the newest budget changed; otherwise once
        a dot's worth of time has passed; never while the chart is hidden behind its tab."""
        if not self.chart.display:
            self._chart_drawn = None  # drawn on the first tick it shows
            return
        series = self.console.chart_series(snap)
        what = (series["marks"], series["hand_set"], series["slo_ttft_ms"], series["budget"][-1:])
        now = self.console.clock()
        if self._chart_drawn is not None:
            drawn_at, drawn = self._chart_drawn
            if what == drawn and now - drawn_at < self.chart.seconds_per_dot(CHART_WINDOW_S):
                return
        self.chart.set_series(**series)
        self._chart_drawn = (now, what)

    def show_status(self) -> None:
        console = self.console
        snap = console.last_snapshot
        self.status.show(
            interval_s=console.interval_s,
            paused=console.render_paused,
            filter_text=self.decisions.filter_text,
            error=console.last_error,
            reaped=snap.reaped if snap is not None else 0,
        )

    # ---- keys and the palette -------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        top = self.app.screen
        if top is not self and not isinstance(top, CommandPalette):
            # Covered by a dialog (the keys go to it, never here): this screen's footer, seen
            # behind the dialog, offers none of them.
            return False
        if action == "show_pane" and not self.compact:
            return False  # every pane is on screen: the footer does not offer the tab keys
        return True

    def palette_commands(self) -> list[Command]:
        """(name, help, callback) for the `:` palette; no gate actions when read-only."""
        console = self.console
        commands: list[Command] = []
        snap = console.last_snapshot
        if not console.read_only:
            selected = self.class_table.selected_class
            commands.append(("Retune", HELP["retune"] + (f" (selected: {selected})" if selected else ""), console.action_retune))
            for c in snap.classes if snap is not None else ():
                verb = "Resume" if c.paused else "Pause"
                commands.append(
                    (f"{verb} class {c.name}", f"{verb.lower()} admission for {c.name}", partial(console.action_pause_class, c.name))
                )
                queued = f"{c.queued} request" + ("" if c.queued == 1 else "s")
                commands.append(
                    (
                        f"Drain class {c.name}",
                        f"refuse the {queued} queued in {c.name} (asks first)",
                        partial(console.action_drain_class, c.name),
                    )
                )
                commands.append((f"Retune class {c.name}", f"retune {c.name} and the budget", partial(console.action_retune, c.name)))
            frozen = snap is not None and snap.controller.frozen
            commands.append(("Unfreeze controller" if frozen else "Freeze controller", HELP["freeze"], console.action_freeze))
        if snap is not None and snap.models:
            commands.append(("Models", HELP["models"], console.action_models))
        commands += [
            ("Review journal", HELP["review"], console.action_review),
            ("Filter decisions", HELP["filter"], self.action_filter),
            ("Resume rendering" if console.render_paused else "Pause rendering", HELP["toggle_render"], console.action_toggle_render),
            ("Refresh faster", HELP["faster"], console.action_faster),
            ("Refresh slower", HELP["slower"], console.action_slower),
            ("Help", "list the keys", self.action_help),
            ("Quit", HELP["quit"], console.action_quit),
        ]
        return commands

    # ---- the view's own actions ----------------------------------------------------

    def action_filter(self) -> None:
        self._show_pane("decisions")
        self.decisions.open_filter()

    def action_show_pane(self, pane: str) -> None:
        if pane in PANES:
            self._show_pane(pane)

    def action_follow(self) -> None:
        self._show_pane("decisions")
        self.decisions.follow()

    def action_clear_filter(self) -> None:
        if self.decisions.filter_text or self.decisions.input.display:
            self.decisions.action_clear_filter()

    @on(FilterClosed)
    def _filter_closed(self) -> None:
        self.class_table.focus()
        self.show_status()

    @on(FilterChanged)
    def _filter_changed(self) -> None:
        self.show_status()

    def action_help(self) -> None:
        console = self.console
        about = [("journal", console.link.info.journal or "none (in memory)")]
        if console.tick_ms is not None:
            about.append(("console tick", f"{console.tick_ms:.1f} ms to fetch and render one snapshot"))
        self.app.push_screen(HelpScreen(console.key_help(), read_only=console.read_only, about=about))

    # ---- the app's actions, asked for by this view's keys ------------------------------
    # They change the gate (through the link) or the snapshot loop, both the app's.

    async def action_retune(self) -> None:
        await self.console.action_retune()

    async def action_pause_class(self) -> None:
        await self.console.action_pause_class()

    async def action_drain_class(self) -> None:
        await self.console.action_drain_class()

    async def action_freeze(self) -> None:
        await self.console.action_freeze()

    async def action_models(self) -> None:
        await self.console.action_models()

    def action_review(self) -> None:
        self.console.action_review()

    async def action_toggle_render(self) -> None:
        await self.console.action_toggle_render()

    def action_faster(self) -> None:
        self.console.action_faster()

    def action_slower(self) -> None:
        self.console.action_slower()
