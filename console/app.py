"""The operator console: one Textual app in front of one gate, reached through a GateLink.

It renders only from `link.snapshot()` (one per tick, handed to the live view,
console/screens/main.py's MainScreen, which hands it to every widget's
`update_snapshot`) and changes the gate only with `link.command(...)`: one
command per action, validated whole and applied atomically by the gate, which
writes the audit rows; the console shows a toast. The link is a `tokengate serve`
through its control socket: the embedded console's own child (console/run.py
GateProcess) or a running one (`--attach`); tests and the screenshot generator use a
gate on this event loop (gate.ops.link.InProcessLink). Audit rows
from other consoles arrive through `link.subscribe` and are toasted too.

The work per tick is bounded whatever the request rate: one snapshot, at most
200 new decisions in it (`GateSnapshot.decisions` holds only those not yet
seen), at most DecisionTail.MAX_NEW_ROWS_PER_TICK of them become table rows.

The app keeps the link, the snapshot loop (with the chart's history), the gate's
actions and the app-wide keys (quit, `:`); the live view (its panels, layout, keys,
`?` and the palette's commands) is MainScreen, the default screen. Dialogs cover
the view without stopping it; only the review screen (a full screen) does. The
keys and what each does are in console/keys.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from textual import events
from textual.app import App, SystemCommand
from textual.command import CommandPalette
from textual.screen import ModalScreen, Screen
from textual.timer import Timer

from console.commands import GateCommands
from console.keys import APP_BINDINGS, HELP, key_help
from console.screens.confirm import ConfirmScreen
from console.screens.main import CHART_POINTS, CHART_WINDOW_S, MainScreen
from console.screens.models import ModelsScreen
from console.screens.retune import RetuneChanges, RetuneScreen
from console.screens.stopping import StoppingScreen
from console.widgets.budget_chart import BudgetChart
from console.widgets.classes import ClassesTable
from console.widgets.decisions import DecisionTail
from console.widgets.denials import DenialsTable
from console.widgets.gpu import GpuPanel
from console.widgets.header import GateHeader
from console.widgets.models import ModelsPanel
from console.widgets.slots import SlotsPanel
from console.widgets.status import StatusBar
from gate.data.commands import ActionResult, Command, CommandError, Drain, Freeze, ModelAction, Pause, describe
from gate.data.records import AuditRecord
from gate.data.snapshot import GateSnapshot
from gate.ops.link import ANSWER_WAIT_S, GateLink, LinkLost, NoAnswer

__all__ = ["CHART_POINTS", "CHART_WINDOW_S", "TOASTED_SOURCES", "TokengateApp", "mark_label"]

#: refresh intervals `+`/`-` step through (seconds)
INTERVALS: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0, 5.0, 10.0)
MIN_INTERVAL_S, MAX_INTERVAL_S = INTERVALS[0], INTERVALS[-1]
#: audit sources whose rows are toasted when another console (or a signal) made them
TOASTED_SOURCES = frozenset({"console", "cli", "signal", "config", "gate", "api"})


def mark_label(a: AuditRecord) -> str:
    """A budget-curve mark's short label: who moved what (set 6144, ctl 8192, freeze)."""
    if a.action == "set_budget":
        return f"set {a.new_value}"
    if a.action.startswith("budget_"):
        return f"ctl {a.new_value}"
    return a.action.removesuffix("_class")


class _OnMain:
    """One of the live view's widgets or its layout state, read through the app: callers
    that hold the app (tests, the screenshots, the fleet console) reach `app.decisions`."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, app: Any, owner: type | None = None) -> Any:
        return self if app is None else getattr(app.main, self.name)


class TokengateApp(App[None]):
    """The live console for one GateService (see the module docstring)."""

    CSS_PATH = "app.tcss"
    TITLE = "tokengate"
    COMMAND_PALETTE_BINDING = ":"
    COMMANDS = App.COMMANDS | {GateCommands}
    BINDINGS = list(APP_BINDINGS)

    header: GateHeader = _OnMain()  # type: ignore[assignment]
    slots: SlotsPanel = _OnMain()  # type: ignore[assignment]
    gpu: GpuPanel = _OnMain()  # type: ignore[assignment]
    models: ModelsPanel = _OnMain()  # type: ignore[assignment]
    class_table: ClassesTable = _OnMain()  # type: ignore[assignment]
    denials: DenialsTable = _OnMain()  # type: ignore[assignment]
    chart: BudgetChart = _OnMain()  # type: ignore[assignment]
    decisions: DecisionTail = _OnMain()  # type: ignore[assignment]
    status: StatusBar = _OnMain()  # type: ignore[assignment]
    tabs = _OnMain()
    body = _OnMain()
    too_small = _OnMain()
    compact: bool = _OnMain()  # type: ignore[assignment]

    def __init__(
        self,
        link: GateLink,
        *,
        read_only: bool = False,
        interval_s: float = 1.0,
        clock: Callable[[], float] = time.time,
        select: str | None = None,
    ) -> None:
        super().__init__()
        self.link = link
        #: the class to put the cursor on once the gate's snapshot lists it: the one selected
        #: before the gate restarted, so `p`/`d`/`t` act on the class the operator chose
        self._reselect = select
        #: the class under the cursor when the gate went away (the next console's `select`)
        self.selected_at_loss: str | None = None
        self.read_only = read_only or link.info.read_only
        self.interval_s = min(max(float(interval_s), MIN_INTERVAL_S), 3600.0)
        self.clock = clock
        #: the live view; read-only, its gate-action keys are not bound at all
        self.main = MainScreen(self, read_only=read_only)
        #: (ts, budget, in_flight, p95 TTFT ms), appended every tick, paused or not
        self.history: deque[tuple[float, int | None, int, float | None]] = deque(maxlen=int(CHART_WINDOW_S / MIN_INTERVAL_S))
        self.last_snapshot: GateSnapshot | None = None
        self.last_snapshot_at: float | None = None  # wall clock of the last snapshot received
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
        self._timer: Timer | None = None
        #: the drain's progress screen, once `q` asked the embedded gate to stop
        self.stopping: StoppingScreen | None = None
        self._stop_deadline = 0.0

    def get_default_screen(self) -> Screen:
        return self.main

    def on_mount(self) -> None:
        self.link.subscribe(self._on_audit)
        self._timer = self.set_interval(self.interval_s, self.tick, name="tokengate-tick")
        self.call_later(self.tick)

    def on_resize(self, event: events.Resize) -> None:
        # The live view follows the terminal even while the review screen covers it.
        self.main.apply_layout(event.size.width, event.size.height)

    def _show_pane(self, pane: str) -> None:
        self.main._show_pane(pane)

    # ---- ticking and rendering -----------------------------------------------------

    def _main_active(self) -> bool:
        """True when the live view is on top (the command palette over it does not count)."""
        return len([s for s in self.screen_stack if not isinstance(s, CommandPalette)]) <= 1

    async def _fetch(self) -> GateSnapshot | None:
        """One snapshot from the link (the gate's own loop does the work); None on failure."""
        try:
            # A gate whose process is stopped or whose loop is stuck never answers: the view's
            # clock stood still with nothing said, and every action waited behind it (a trial
            # SIGSTOPped the gate: 30 s of an unchanged screen)
            async with asyncio.timeout(ANSWER_WAIT_S):
                snap = await self.link.snapshot()
        except TimeoutError:
            shown = f", from {time.strftime('%H:%M:%S', time.localtime(self.last_snapshot_at))}" if self.last_snapshot_at else ""
            self._console_error(
                f"the gate has not answered for {ANSWER_WAIT_S:.0f} s (is its process stopped or stuck?): the view shows its last snapshot{shown}"
            )
            return None
        except LinkLost as exc:
            self.gate_lost(str(exc))
            return None
        except Exception as exc:  # noqa: BLE001 - the console must outlive a bad snapshot
            self._console_error(f"snapshot failed: {type(exc).__name__}: {exc}")
            return None
        snap = dataclasses.replace(snap, operator=self.link.info.operator)
        self.last_error = None  # shown until a tick goes through cleanly
        self.last_snapshot = snap
        self.last_snapshot_at = time.time()
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
            with contextlib.suppress(Exception):  # a view never mounted has no selection
                self.selected_at_loss = self.main.class_table.selected_class
            self.exit(return_code=1)

    def render_snapshot(self, snap: GateSnapshot) -> None:
        snap = dataclasses.replace(snap, decisions=tuple(self._unseen))
        self._unseen.clear()
        self.renders += 1
        with self.batch_update():
            for message in self.main.show_snapshot(snap):
                self._console_error(message)
            if self._reselect is not None and any(c.name == self._reselect for c in snap.classes):
                self.main.class_table.select_class(self._reselect)
                self._reselect = None
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

    def _show_status(self) -> None:
        self.main.show_status()

    def _console_error(self, message: str) -> None:
        if message != self.last_error:
            self.log.error(message)
        self.last_error = message
        try:
            self._show_status()
        except Exception:  # noqa: BLE001 - before mount
            pass

    # ---- keys and the palette ------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "quit" and isinstance(self.screen, ModalScreen):
            return False  # answer the dialog first (the footer then stops offering q)
        return True

    def key_help(self) -> list[tuple[str, str]]:
        """(key, what it does) for every key the live view answers to: its own, then the
        app-wide ones (read-only lists fewer)."""
        return key_help([*self.main._bindings, *self._bindings])

    def palette_commands(self) -> list[tuple[str, str, Callable[[], Any]]]:
        """(name, help, callback) for the `:` palette: the live view's commands (no gate
        actions when read-only), or only Quit over another screen."""
        if not self._main_active():
            return [("Quit", HELP["quit"], self.action_quit)]
        return self.main.palette_commands()

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
        cls = cls or self.main.class_table.selected_class
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
        except NoAnswer as exc:  # neither applied nor refused: sent, unanswered
            self.notify(str(exc), title=self._named("no answer"), severity="warning", markup=False, timeout=15)
            return []
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
        cls = cls or self.main.class_table.selected_class
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
        self.main.header.set_paused(self.render_paused)
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

    def action_review(self) -> None:
        from console.screens.review import ReviewScreen
        from console.screens.whatif import READ_ONLY

        slo = self.last_snapshot.controller.slo_ttft_ms if self.last_snapshot is not None else None
        apply = None if self.read_only else self.apply_command
        screen = ReviewScreen(
            self.link.info.journal,
            slo_ttft_ms=slo,
            apply=apply,
            live=self._fetch,
            no_apply=READ_ONLY if self.read_only else "",
        )
        self.push_screen(screen, lambda _error: self._after_review())

    async def apply_command(self, command: Command) -> list[str]:
        """The review's what-if applies its proposal here: one command, audited as any."""
        return [r.message for r in await self.send(command)]

    def _after_review(self) -> None:
        self.call_later(self.refresh_view)

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
