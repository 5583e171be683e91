"""The operator console: one Textual app in front of one gate, reached through a GateLink.

It renders only from `link.snapshot()` (one per tick, handed to every widget's
`update_snapshot`) and changes the gate only with `link.command(...)`: one
command per action, validated whole and applied atomically by the gate, which
writes the audit rows; the console shows a toast. The link is the gate in this
process (the embedded console; the gate then runs on its own thread's loop) or
a running `tokengate serve` through its control socket (`--attach`). Audit rows
from other consoles arrive through `link.subscribe` and are toasted too.

The work per tick is bounded whatever the request rate: one snapshot, at most
200 new decisions in it (`GateSnapshot.decisions` holds only those not yet
seen), at most DecisionTail.MAX_NEW_ROWS_PER_TICK of them become table rows.

Layout: everything at once on a big terminal (a 2x3 grid); below
WIDE_MIN_COLS x WIDE_MIN_ROWS a compact stack (capacity lines, classes table,
and tabs for denials / budget chart / decision tail). `on_resize` toggles the
`compact` CSS class on #body; console/app.tcss does the rest. Below MIN_COLS x
MIN_ROWS the body gives way to "terminal too small: need 80x24". Dialogs cover
the view without stopping it; only the review screen (a full screen) does.

The bindings, `?`'s descriptions and the `:` palette's commands are in console/keys.py.
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from textual import events, on
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding, BindingsMap
from textual.command import CommandPalette
from textual.containers import Container
from textual.screen import ModalScreen, Screen
from textual.widgets import Footer, Static, Tab, Tabs

from console.commands import GateCommands
from console.keys import (
    GATE_ACTIONS,
    MAIN_ONLY,
    PANES,
    TOASTED_SOURCES,
    app_bindings,
    key_help,
    mark_label,
    palette_commands,
)
from console.screens.confirm import ConfirmScreen
from console.screens.help import HelpScreen
from console.screens.models import ModelsScreen
from console.screens.retune import RetuneChanges, RetuneScreen
from console.screens.stopping import StoppingScreen
from console.widgets.budget_chart import BudgetChart
from console.widgets.classes import ClassesTable
from console.widgets.decisions import DecisionTail, FilterChanged, FilterClosed
from console.widgets.denials import DenialsTable
from console.widgets.gpu import GpuPanel
from console.widgets.header import GateHeader
from console.widgets.models import ModelsPanel
from console.widgets.slots import SlotsPanel
from console.widgets.status import StatusBar
from gate.data.commands import ActionResult, Command, CommandError, Drain, Freeze, ModelAction, Pause, describe
from gate.data.records import AuditRecord
from gate.data.snapshot import GateSnapshot
from gate.ops.link import GateLink, LinkLost

#: refresh intervals `+`/`-` step through (seconds)
INTERVALS: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0, 5.0, 10.0)
MIN_INTERVAL_S, MAX_INTERVAL_S = INTERVALS[0], INTERVALS[-1]
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


class TokengateApp(App[None]):
    """The live console for one GateService (see the module docstring)."""

    CSS_PATH = "app.tcss"
    TITLE = "tokengate"
    COMMAND_PALETTE_BINDING = ":"
    COMMANDS = App.COMMANDS | {GateCommands}
    BINDINGS = app_bindings()

    def __init__(
        self,
        link: GateLink,
        *,
        read_only: bool = False,
        interval_s: float = 1.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__()
        self.link = link
        self.read_only = read_only or link.info.read_only
        self.interval_s = min(max(float(interval_s), MIN_INTERVAL_S), 3600.0)
        self.clock = clock
        if read_only:
            # Absent, not disabled: the footer and `?` don't list them; pressed, they say why
            # nothing happens (a hidden binding to a toast), rather than being silently ignored.
            keys = {
                key: kept or [Binding(key, "read_only_notice", show=False)]
                for key, bindings in self._bindings.key_to_bindings.items()
                if (kept := [b for b in bindings if b.action not in GATE_ACTIONS]) or bindings
            }
            self._bindings = BindingsMap.from_keys(keys)
        #: (ts, budget, in_flight, p95 TTFT ms), appended every tick, paused or not
        #: (when, what) the chart last drew: see _update_chart
        self._chart_drawn: tuple[float, tuple] | None = None
        self.history: deque[tuple[float, int | None, int, float | None]] = deque(maxlen=int(CHART_WINDOW_S / MIN_INTERVAL_S))
        self.last_snapshot: GateSnapshot | None = None
        #: decisions that came while the view was paused or covered: rendered with the next view
        self._unseen: deque = deque(maxlen=200)
        #: (action, target, old, new) of this console's own results: not toasted twice
        self._own: deque[tuple[str, str, str | None, str | None]] = deque(maxlen=64)
        self._commands_in_flight = 0
        self._early: list[AuditRecord] = []
        #: why the console ended (for the gate's "stopping" audit row when embedded)
        self.exit_why = "operator quit"
        self.ended_by_signal = False  # a hang-up or SIGTERM: the gate going away is expected
        self.lost: str | None = None  # set when the gate went away
        self._ticking = False
        self.render_paused = False
        self.ticks = 0
        self.renders = 0
        self.tick_ms: float | None = None
        self.last_error: str | None = None
        self.compact = False
        self._timer = None
        self._grid_rows = ""
        #: the drain's progress screen, once `q` asked the embedded gate to stop
        self.stopping: StoppingScreen | None = None
        self._stop_deadline = 0.0

    # ---- layout ----------------------------------------------------------------

    def compose(self) -> ComposeResult:
        # Built here, not in __init__: DataTable columns need the running app.
        info = self.link.info
        self.header = GateHeader(
            id="header",
            clock=self.clock,
            read_only=self.read_only,
            attached="" if info.embedded else info.where,
        )
        self.slots = SlotsPanel(id="slots")
        self.gpu = GpuPanel(id="gpu")
        self.models = ModelsPanel(id="models")  # router mode only; hidden otherwise
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

    def on_mount(self) -> None:
        self._setup_view()
        self._timer = self.set_interval(self.interval_s, self.tick, name="tokengate-tick")
        self.call_later(self.tick)

    def _setup_view(self) -> None:
        """What a freshly composed view needs (the fleet console composes one per opened gate)."""
        self.slots.border_title = "capacity"
        self.gpu.border_title = "GPU"
        self.class_table.border_title = "classes"
        self.denials.border_title = "denials"
        self.chart.border_title = "budget (10 min)"
        self.decisions.border_title = "decisions"
        self._show_pane("decisions", sync_tabs=False)
        self.apply_layout(self.size.width, self.size.height)
        self.class_table.focus()
        self.link.subscribe(self._on_audit)

    def on_resize(self, event: events.Resize) -> None:
        self.apply_layout(event.size.width, event.size.height)

    def apply_layout(self, width: int, height: int) -> None:
        """Compact below WIDE_MIN_COLS x WIDE_MIN_ROWS: summary lines, classes, tabbed panes."""
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

    # ---- ticking and rendering -----------------------------------------------------

    def _main_active(self) -> bool:
        """True when the live view is on top (the command palette over it does not count)."""
        return len([s for s in self.screen_stack if not isinstance(s, CommandPalette)]) <= 1

    async def _fetch(self) -> GateSnapshot | None:
        """One snapshot from the link (the gate's own loop does the work); None on failure."""
        try:
            snap = await self.link.snapshot()
        except LinkLost as exc:
            self.gate_lost(str(exc))
            return None
        except Exception as exc:  # noqa: BLE001 - the console must outlive a bad snapshot
            self._console_error(f"snapshot failed: {type(exc).__name__}: {exc}")
            return None
        snap = dataclasses.replace(snap, operator=self.link.info.operator)
        self.last_error = None  # shown until a tick goes through cleanly
        self.last_snapshot = snap
        self._unseen.extend(snap.decisions)
        return snap

    def _covered(self) -> bool:
        """A full screen (review) hides the live view; a dialog does not: the view behind
        a retune, drain or quit dialog goes on updating, clock included."""
        return any(not isinstance(s, ModalScreen) for s in self.screen_stack[1:])

    async def tick(self) -> None:
        """One snapshot: into the chart history always; onto the widgets unless paused or covered."""
        if self._ticking:
            return  # the last one is still on its way: skip, never pile up
        self._ticking = True
        try:
            started = time.perf_counter()
            snap = await self._fetch()
            if snap is None:
                return
            self.ticks += 1
            self.history.append((self.clock(), snap.controller.budget, snap.in_flight, snap.controller.p95_ttft_ms))
            if self.render_paused or self._covered():
                return
            self.render_snapshot(snap)
            self.tick_ms = (time.perf_counter() - started) * 1000
            self._show_status()
        finally:
            self._ticking = False

    async def refresh_view(self) -> None:
        """Render a fresh snapshot now (after an action), unless rendering is paused."""
        if self.render_paused:
            return
        snap = await self._fetch()
        if snap is None:
            return
        self.render_snapshot(snap)
        self._show_status()

    def gate_lost(self, message: str) -> None:
        """The gate went away (attached): say so and end the console."""
        if self.stopping is not None or self.ended_by_signal:
            self.exit()  # we asked it to stop
            return
        if self.lost is None:
            self.lost = message
            self.exit(return_code=1)

    def render_snapshot(self, snap: GateSnapshot) -> None:
        snap = dataclasses.replace(snap, decisions=tuple(self._unseen))
        self._unseen.clear()
        self.renders += 1
        self._size_middle_row(snap)
        with self.batch_update():
            for widget in (self.header, self.slots, self.gpu, self.models, self.class_table, self.denials, self.decisions):
                try:
                    widget.update_snapshot(snap)
                except Exception as exc:  # noqa: BLE001 - one broken panel must not blank the others
                    self._console_error(f"{widget.id}: {type(exc).__name__}: {exc}")
            try:
                self._update_chart(snap)
            except Exception as exc:  # noqa: BLE001
                self._console_error(f"chart: {type(exc).__name__}: {exc}")
            dialog = self.screen
            if isinstance(dialog, ModelsScreen):  # the models dialog shows the same rows, live
                dialog.update_snapshot(snap)

    def chart_series(self, snap: GateSnapshot) -> dict[str, Any]:
        """The last CHART_WINDOW_S of history, at most CHART_POINTS points, plus audit marks."""
        now = self.clock()
        points = [p for p in self.history if p[0] >= now - CHART_WINDOW_S]
        if len(points) > CHART_POINTS:
            step = len(points) / CHART_POINTS
            points = [points[int(i * step)] for i in range(CHART_POINTS - 1)] + [points[-1]]
        recent = [a for a in snap.audit if a.ts >= now - CHART_WINDOW_S]
        marks = [(a.ts, mark_label(a)) for a in recent]
        by_hand = [a for a in recent if a.action == "set_budget" and a.source != "controller" and (a.new_value or "").isdigit()]
        return dict(
            times=[p[0] for p in points],
            budget=[p[1] for p in points],
            in_flight=[p[2] for p in points],
            p95_ttft_ms=[p[3] for p in points],
            slo_ttft_ms=snap.controller.slo_ttft_ms,
            marks=marks,
            now=now,
            window_s=CHART_WINDOW_S,
            hand_set=(by_hand[-1].ts, float(by_hand[-1].new_value)) if by_hand else None,  # type: ignore[arg-type]
        )

    def _update_chart(self, snap: GateSnapshot) -> None:
        """Draw the chart when that shows something new: plotext draws in Python (~15 ms a draw
        at 160x48, half the console's CPU once the decision tail stopped re-rendering), and
        each second moves the 10-minute curve by a fraction of one braille dot. So: at once
        when a mark, the hand-set budget, the SLO or the newest budget changed; otherwise once
        a dot's worth of time has passed; never while the chart is hidden behind its tab."""
        if not self.chart.display:
            self._chart_drawn = None  # drawn on the first tick it shows
            return
        series = self.chart_series(snap)
        what = (series["marks"], series["hand_set"], series["slo_ttft_ms"], series["budget"][-1:])
        now = self.clock()
        if self._chart_drawn is not None:
            drawn_at, drawn = self._chart_drawn
            if what == drawn and now - drawn_at < self.chart.seconds_per_dot(CHART_WINDOW_S):
                return
        self.chart.set_series(**series)
        self._chart_drawn = (now, what)

    def _show_status(self) -> None:
        snap = self.last_snapshot
        self.status.show(
            interval_s=self.interval_s,
            paused=self.render_paused,
            filter_text=self.decisions.filter_text,
            error=self.last_error,
            reaped=snap.reaped if snap is not None else 0,
        )

    def _console_error(self, message: str) -> None:
        if message != self.last_error:
            self.log.error(message)
        self.last_error = message
        try:
            self._show_status()
        except Exception:  # noqa: BLE001 - before mount
            pass

    # ---- bindings ----------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in GATE_ACTIONS and self.read_only:
            return False
        if action in MAIN_ONLY and not self._main_active():
            return False
        if action == "show_pane" and not self.compact:
            return False  # every pane is on screen: the footer does not offer the tab keys
        if action == "quit" and isinstance(self.screen, ModalScreen):
            return False  # answer the dialog first (the footer then stops offering q)
        return True

    def key_help(self) -> list[tuple[str, str]]:
        """(key, what it does) for every binding this console has (read-only lists fewer)."""
        return key_help(self._bindings)

    def palette_commands(self) -> list[tuple[str, str, Callable[[], Any]]]:
        """(name, help, callback) for the `:` palette; no gate actions when read-only."""
        return palette_commands(self)

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        # Textual's own "Quit" would skip the in-flight confirmation; ours is in GateCommands.
        for command in super().get_system_commands(screen):
            if command.title != "Quit":
                yield command

    # ---- gate actions ------------------------------------------------------------

    #: the gate's name in a fleet console ("" when the console has one gate): every toast and
    #: dialog about an action then names the gate it acts on
    gate_name = ""

    def _named(self, title: str) -> str:
        """A toast's or dialog's title, naming the gate in a fleet console."""
        return f"{self.gate_name}: {title}" if self.gate_name else title

    def _on_gate(self) -> str:
        return f" on gate {self.gate_name}" if self.gate_name else ""

    def _selected(self, cls: str | None) -> str | None:
        cls = cls or self.class_table.selected_class
        if cls is None:
            self.notify("no class selected", severity="warning", markup=False)
        return cls

    def action_read_only_notice(self) -> None:
        self.notify(
            "read-only console: retune, pause, drain and freeze are off here; attach without --read-only to act",
            severity="warning",
            markup=False,
        )

    def _gate_action_allowed(self) -> bool:
        return not self.read_only and self._main_active()

    def _class_view(self, cls: str):
        snap = self.last_snapshot
        return next((c for c in snap.classes if c.name == cls), None) if snap is not None else None

    async def send(self, command: Command) -> list[ActionResult]:
        """One command through the link: applied whole or refused (raises CommandError)."""
        self._commands_in_flight += 1
        try:
            results = await self.link.command(command)
        finally:
            self._commands_in_flight -= 1
        self._own.extend((r.action, r.target, r.old_value, r.new_value) for r in results)
        early, self._early = self._early, []
        for record in early:
            self._on_audit(record)
        return results

    async def run_command(self, command: Command) -> list[ActionResult]:
        """Send a command; toast the result (or the refusal, as an error); re-render."""
        try:
            results = await self.send(command)
        except CommandError as exc:
            self.notify(str(exc), title=self._named("refused"), severity="error", markup=False)
            return []
        except LinkLost as exc:
            self.gate_lost(str(exc))
            return []
        if results:
            self.notify("\n".join(r.message for r in results), title=self._named(self.link.info.operator), markup=False)
        await self.refresh_view()
        return results

    def _on_audit(self, record: AuditRecord) -> None:
        """An audit row from the gate: toast what another console (or a signal) changed."""
        if record.source not in TOASTED_SOURCES:
            return  # the controller's moves show on the budget curve, not as toasts
        if self._commands_in_flight:
            self._early.append(record)  # maybe this console's own: decided once the answer is in
            return
        key = (record.action, record.target, record.old_value, record.new_value)
        if key in self._own:
            self._own.remove(key)
            return
        what = describe(record.action, record.target, record.old_value, record.new_value)
        note = f" ({record.note})" if record.note else ""
        self.notify(f"{what}{note}", title=self._named(f"{record.operator}@{record.origin}"), markup=False)

    async def action_pause_class(self, cls: str | None = None) -> None:
        if not self._gate_action_allowed() or (cls := self._selected(cls)) is None:
            return
        await self.refresh_view()
        view = self._class_view(cls)
        pause = not (view is not None and view.paused)
        busy = (view.in_flight + view.queued + view.admitted_per_min) if view is not None else 0
        if not pause or not busy:
            await self.run_command(Pause(cls, pause))
            return

        async def answered(yes: bool | None) -> None:
            if yes:
                await self.run_command(Pause(cls, True))

        # Like drain: pausing a class that carries traffic turns its users away; ask (focus on No).
        self.push_screen(
            ConfirmScreen(
                f"Pause {cls}{self._on_gate()}?",
                f"{cls}{self._on_gate()} carries traffic: {view.admitted_per_min} admitted in the last minute, "
                f"{view.in_flight} tokens in flight, {view.queued} queued. Paused, its new requests get "
                f"503 class_paused and its queue waits until resumed (p again).",
                yes_label="Pause",
            ),
            answered,
        )

    async def action_freeze(self) -> None:
        if not self._gate_action_allowed():
            return
        snap = self.last_snapshot
        await self.run_command(Freeze(not (snap is not None and snap.controller.frozen)))

    async def action_drain_class(self, cls: str | None = None) -> None:
        if not self._gate_action_allowed() or (cls := self._selected(cls)) is None:
            return
        await self.refresh_view()
        view = self._class_view(cls)
        if view is None:
            self.notify(f"unknown class {cls!r}", title=self._named("refused"), severity="error", markup=False)
            return
        waiting = view.queued
        if waiting == 0:
            self.notify(f"{cls}: nothing queued, nothing to drain", title=self.gate_name, severity="warning", markup=False)
            return

        async def answered(yes: bool | None) -> None:
            if yes:
                await self.run_command(Drain(cls))

        plural = "request" if waiting == 1 else "requests"
        self.push_screen(
            ConfirmScreen(
                f"Drain {cls}{self._on_gate()}?",
                f"Drain {cls}{self._on_gate()}: {waiting} queued {plural} will be refused with 503 drained.",
                yes_label="Drain",
            ),
            answered,
        )

    async def action_retune(self, cls: str | None = None) -> None:
        if not self._gate_action_allowed():
            return
        cls = cls or self.class_table.selected_class
        await self.refresh_view()
        snap = self.last_snapshot
        if snap is None:
            return

        async def done(messages: list[str] | None) -> None:
            if messages:
                self.notify("\n".join(messages), title=self._named(f"{self.link.info.operator}: retuned"), markup=False)
            elif messages is not None:
                self.notify("nothing changed", title=self.gate_name, markup=False)
            await self.refresh_view()

        self.push_screen(RetuneScreen(snap, cls, self.apply_retune, gate=self.gate_name), done)

    async def apply_retune(self, changes: RetuneChanges) -> list[str]:
        """Budget, [budget] settings and the class's settings as ONE command: all or nothing.

        The gate validates the whole change before applying any of it; a refusal
        (CommandError, shown in the form) leaves every value as it was.
        """
        results = await self.send(changes.command())
        return [r.message for r in results]

    async def action_models(self) -> None:
        """Router mode: the models dialog (load, unload, pin); says so when there is no router."""
        if not self._main_active():
            return
        await self.refresh_view()
        snap = self.last_snapshot
        if snap is None or not snap.models:
            self.notify("no llama-server in router mode behind this gate: no models to manage", severity="warning", markup=False)
            return

        async def send(command: ModelAction) -> object:
            return await self.run_command(command)

        self.push_screen(ModelsScreen(snap, send, read_only=self.read_only))

    # ---- view actions ------------------------------------------------------------

    async def action_toggle_render(self) -> None:
        self.render_paused = not self.render_paused
        self.header.set_paused(self.render_paused)
        if not self.render_paused:
            await self.refresh_view()
        self._show_status()

    def _set_interval(self, interval_s: float) -> None:
        self.interval_s = interval_s
        if self._timer is not None:
            self._timer.stop()
        self._timer = self.set_interval(interval_s, self.tick, name="tokengate-tick")
        self._show_status()
        self.notify(f"refresh every {interval_s:g} s", timeout=2, markup=False)

    def action_faster(self) -> None:
        faster = [i for i in INTERVALS if i < self.interval_s]
        self._set_interval(faster[-1] if faster else MIN_INTERVAL_S)

    def action_slower(self) -> None:
        slower = [i for i in INTERVALS if i > self.interval_s]
        self._set_interval(slower[0] if slower else MAX_INTERVAL_S)

    def action_filter(self) -> None:
        self._show_pane("decisions")
        self.decisions.open_filter()

    def action_show_pane(self, pane: str) -> None:
        if pane in PANES:
            self._show_pane(pane)

    def action_follow(self) -> None:
        self._show_pane("decisions")
        self.decisions.follow()

    @on(FilterClosed)
    def _filter_closed(self) -> None:
        self.class_table.focus()
        self._show_status()

    @on(FilterChanged)
    def _filter_changed(self) -> None:
        self._show_status()

    def action_help(self) -> None:
        about = [("journal", self.link.info.journal or "none (in memory)")]
        if self.tick_ms is not None:
            about.append(("console tick", f"{self.tick_ms:.1f} ms to fetch and render one snapshot"))
        self.push_screen(HelpScreen(self.key_help(), read_only=self.read_only, about=about))

    def action_review(self) -> None:
        from console.screens.review import ReviewScreen

        slo = self.last_snapshot.controller.slo_ttft_ms if self.last_snapshot is not None else None
        self.push_screen(ReviewScreen(self.link.info.journal, slo_ttft_ms=slo), lambda _error: self.call_later(self.refresh_view))

    async def action_quit(self) -> None:
        """Attached: detach (the gate goes on). Embedded: quit, asking first while requests are
        in flight or queued (the gate stops with the console)."""
        if not self.link.info.embedded:
            self.exit()
            return
        snap = await self._fetch()
        busy = snap.requests_in_flight if snap is not None else 0
        if not busy:
            self.exit()
            return

        async def answered(yes: bool | None) -> None:
            if yes:
                await self.stop_gate_and_exit()

        plural = "request is" if busy == 1 else "requests are"
        grace = self.link.info.drain_grace_s
        self.push_screen(
            ConfirmScreen(
                "Quit tokengate?",
                f"{busy} {plural} in flight or queued. Quitting stops the gate: it refuses new "
                f"requests (503 shutting_down) and lets those finish: this may take up to {grace:g} s "
                "(the screen shows how many are left).",
                yes_label="Quit",
            ),
            answered,
        )

    async def stop_gate_and_exit(self) -> None:
        """Ask the embedded gate to drain, show its progress until it has gone, then exit."""
        stop = getattr(self.link, "stop_gate", None)
        if stop is None:
            self.exit()
            return
        try:
            await stop(self.exit_why)
        except Exception:  # noqa: BLE001 - no drain to watch: the caller (console.run) stops it
            self.exit()
            return
        self.stopping = StoppingScreen(self.link.info.drain_grace_s)
        self._stop_deadline = time.monotonic() + self.link.info.drain_grace_s
        self.push_screen(self.stopping)
        self.set_interval(0.5, self._poll_stop, name="tokengate-stopping")
        await self._poll_stop()

    async def _poll_stop(self) -> None:
        try:
            snap = await self.link.snapshot()
        except Exception:  # noqa: BLE001 - LinkLost: the gate has gone, as asked
            self.exit()
            return
        if self.stopping is not None:
            self.stopping.show(snap.requests_in_flight, self._stop_deadline - time.monotonic())
