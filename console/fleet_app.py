"""The fleet console: a row per attached gate, and Enter for one gate's full console.

`FleetConsoleApp` is the live console (`TokengateApp`) with the fleet screen on top of it.
The fleet screen polls every gate through its own read-only link (console/fleet.py). Enter
opens the selected gate: the console connects a link of its own to that gate (with the
console's read-only flag), composes a fresh live view for it and uncovers it; `q` there
closes that link and brings the fleet back, and a gate that goes away does the same with a
toast. In the live view every toast, dialog and the retune form name the gate they act on.
Audit rows of the other gates (another console's pause, a reload) are toasted with their
gate's name, from the fleet's links.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable, Sequence

from textual.compose import compose

from console.app import TokengateApp
from console.fleet import Fleet, FleetEntry, FleetGate
from console.keys import KEY_HELP, TOASTED_SOURCES
from console.screens.fleet import FleetScreen
from gate.data.commands import ActionResult, Command, CommandError, describe
from gate.data.records import AuditRecord
from gate.data.snapshot import GateSnapshot
from gate.ops.link import GateInfo, GateLink, LinkLost, SocketLink

#: how long opening a gate may take before the console says it cannot
OPEN_TIMEOUT_S = 5.0


class _NoGate:
    """The live view's link while no gate is open (the fleet screen covers the view)."""

    def __init__(self, read_only: bool) -> None:
        self.info = GateInfo(
            gate_id="",
            label="LIVE",
            listen="",
            journal="",
            operator="",
            origin="local",
            read_only=read_only,
            embedded=False,
            drain_grace_s=0.0,
            where="",
        )

    async def snapshot(self) -> GateSnapshot:
        raise LinkLost("no gate is open")

    async def command(self, command: Command) -> list[ActionResult]:
        raise CommandError("no gate is open")

    def subscribe(self, listener: Callable[[AuditRecord], None]) -> None:
        pass

    async def stop_gate(self, why: str) -> None:
        raise CommandError("no gate is open")

    async def close(self) -> None:
        pass


def _socket_connect(path: str, read_only: bool) -> Awaitable[GateLink]:
    return SocketLink.connect(path, read_only=read_only)


class FleetConsoleApp(TokengateApp):
    """The fleet screen over the live view of whichever gate was opened last."""

    def __init__(
        self,
        entries: Sequence[FleetEntry],
        *,
        read_only: bool = False,
        interval_s: float = 1.0,
        clock: Callable[[], float] = time.time,
        connect: Callable[[str, bool], Awaitable[GateLink]] = _socket_connect,
    ) -> None:
        self._idle = _NoGate(read_only)
        super().__init__(self._idle, read_only=read_only, interval_s=interval_s, clock=clock)
        self.fleet_read_only = read_only
        self.fleet = Fleet(entries, on_audit=self._on_fleet_audit)
        self.opened: FleetGate | None = None
        self._connect = connect
        self._polling = False
        self._switching = False
        self.fleet_screen: FleetScreen | None = None  # made on mount (a screen needs the running app)

    def _title(self) -> str:
        n = len(self.fleet.gates)
        mode = "  READ-ONLY" if self.fleet_read_only else ""
        return f" tokengate fleet: {n} gate{'s' if n != 1 else ''}{mode}"

    def on_mount(self) -> None:
        super().on_mount()
        self.fleet_screen = FleetScreen(self._title())
        self.install_screen(self.fleet_screen, name="fleet")
        self.push_screen("fleet")
        self.set_interval(self.interval_s, self.poll_fleet, name="tokengate-fleet")
        self.call_later(self.poll_fleet)

    async def on_unmount(self) -> None:
        await self.fleet.close()

    # ---- the fleet ---------------------------------------------------------------

    @property
    def fleet_shown(self) -> bool:
        return self.fleet_screen is not None and self.screen is self.fleet_screen

    async def poll_fleet(self) -> None:
        """Every gate's snapshot into its row, while the fleet is on screen."""
        if self._polling or not self.fleet_shown:
            return
        self._polling = True
        try:
            rows = await self.fleet.poll()
            if self.fleet_shown:
                self.fleet_screen.show(rows)
        finally:
            self._polling = False

    def _on_fleet_audit(self, gate: str, record: AuditRecord) -> None:
        """Another console's (or a signal's) change on a gate whose console is not open here."""
        if record.source not in TOASTED_SOURCES or (self.opened is not None and self.opened.name == gate):
            return  # the open gate's own link toasts its rows (and knows this console's own)
        what = describe(record.action, record.target, record.old_value, record.new_value)
        note = f" ({record.note})" if record.note else ""
        self.notify(f"{what}{note}", title=f"{gate}: {record.operator}@{record.origin}", markup=False)

    # ---- opening and closing one gate ----------------------------------------------

    async def open_gate(self, name: str) -> None:
        """Connect to the gate, compose a fresh live view for it and uncover it."""
        gate = self.fleet.by_name(name)
        if gate is None or self.opened is not None or self._switching:
            return
        self._switching = True
        try:
            try:
                async with asyncio.timeout(OPEN_TIMEOUT_S):
                    link = await self._connect(gate.entry.socket, self.fleet_read_only)
            except (LinkLost, CommandError, OSError, TimeoutError) as exc:
                self.notify(str(exc) or type(exc).__name__, title=f"{name}: cannot open", severity="error", markup=False)
                return
            link.info = dataclasses.replace(link.info, where=f"gate {name} ({gate.entry.socket})")
            self.opened = gate
            self.gate_name = name
            self._use(link)
            await self._rebuild_view()
            await self.pop_screen()  # the gate's live view
            await self.refresh_view()
        finally:
            self._switching = False

    async def back_to_fleet(self, lost: str | None = None) -> None:
        """Close the open gate's link and show the fleet again."""
        if self.opened is None:
            return
        name, link = self.gate_name, self.link
        self.opened = None
        self.gate_name = ""
        self._use(self._idle)
        if lost:
            self.notify(lost, title=f"{name}: gate went away", severity="error", markup=False)
        while len(self.screen_stack) > 1:  # a dialog of that gate's goes with it
            await self.pop_screen()
        await self.push_screen("fleet")
        await link.close()
        await self.poll_fleet()

    def _use(self, link: GateLink) -> None:
        """The live view's link, and nothing of the previous gate's left in the view's state."""
        self.link = link
        self.read_only = self.fleet_read_only or link.info.read_only
        self.history.clear()
        self.last_snapshot = None
        self._unseen.clear()
        self._own.clear()
        self._early.clear()
        self.lost = None
        self.render_paused = False
        self.last_error = None
        self.tick_ms = None

    async def _rebuild_view(self) -> None:
        """Compose the live view anew under the fleet screen (widgets keep no other gate's rows)."""
        base = self.screen_stack[0]
        async with base.batch():
            await base.query("*").exclude(".-textual-system").remove()
            await base.mount_all(compose(self))
        self.compact = False
        self._grid_rows = ""
        self._setup_view()

    # ---- the live view's hooks -------------------------------------------------------

    async def tick(self) -> None:
        if self.opened is None or self._switching:
            return  # no gate open: the fleet screen polls for itself
        await super().tick()

    def gate_lost(self, message: str) -> None:
        """The open gate went away: back to the fleet, which says so (the console goes on)."""
        if self.opened is not None:
            self.call_later(self.back_to_fleet, message)

    def key_help(self) -> list[tuple[str, str]]:
        return [(k, "back to the fleet (this gate goes on)" if d == KEY_HELP["quit"] else d) for k, d in super().key_help()]

    async def action_quit(self) -> None:
        """In a gate's console: back to the fleet (that gate goes on). On the fleet: quit."""
        if self.opened is None or self.fleet_shown:
            self.exit()
            return
        await self.back_to_fleet()
