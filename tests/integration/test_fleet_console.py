"""The fleet console against REAL gates: two `tokengate serve --demo` processes (each in front of
its built-in simulator, with synthetic traffic), each with its control socket, and a third socket
where nothing listens. The console is driven by Textual's Pilot, its links are real sockets.

* a row per gate with that gate's own figures; the unreachable one says why (and will not open);
* Enter opens one gate's full console; every toast and dialog of an action names that gate,
  and the action lands on that gate only;
* q goes back to the fleet; another console's action on a gate is toasted with the gate's name;
* a gate that dies while open brings the fleet back with a toast, its row says down; q quits.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from contextlib import asynccontextmanager
from pathlib import Path

from console.fleet import fleet_entries
from console.fleet_app import FleetConsoleApp
from console.screens.confirm import ConfirmScreen
from console.screens.fleet import FleetScreen
from console.screens.retune import RetuneScreen
from gate.data.commands import Pause
from gate.ops.control_socket import is_live
from gate.ops.link import SocketLink
from tests.integration.gate_harness import terminate, wait_until

SIZE = (170, 48)


@asynccontextmanager
async def demo_gate(directory: Path):
    """`tokengate serve --demo` in its own directory (its journal and socket land there)."""
    directory.mkdir()
    log = open(directory / "serve.log", "ab")  # noqa: SIM115 - the child's output while it runs
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gate.cli",
        "serve",
        "--demo",
        "--grace",
        "1",
        stdin=asyncio.subprocess.DEVNULL,
        stdout=log,
        stderr=log,
        cwd=directory,
    )
    sock = str(directory / "tokengate-demo.sock")
    try:
        await wait_until(lambda: proc.returncode is not None or is_live(sock), timeout_s=60, interval_s=0.05)
        assert proc.returncode is None, (directory / "serve.log").read_text()
        yield proc, sock
    finally:
        log.close()
        if proc.returncode is None:
            await terminate(proc)


async def until(pilot, predicate, timeout_s: float = 30.0) -> None:
    """Let the app run until `predicate()` holds (the fleet polls its gates once a tick)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():
        assert loop.time() < deadline, "condition not met in time"
        await pilot.pause(0.05)


def toasts(app) -> list[tuple[str, str]]:
    return [(n.title, n.message) for n in app._notifications]


async def test_fleet_rows_open_one_gate_name_it_in_every_action_and_come_back(tmp_path):
    async with demo_gate(tmp_path / "a") as (_, sock_a), demo_gate(tmp_path / "b") as (proc_b, sock_b):
        other = await SocketLink.connect(sock_a)  # another operator's console on gpu-a
        truth_b = await SocketLink.connect(sock_b, read_only=True)
        try:
            entries = fleet_entries([("gpu-a", sock_a), ("gpu-b", sock_b), ("", str(tmp_path / "gpu-c.sock"))])
            app = FleetConsoleApp(entries, interval_s=0.25)
            async with app.run_test(size=SIZE) as pilot:
                # ---- the fleet: a row per gate ----
                await until(pilot, lambda: all(g.polls >= 2 for g in app.fleet.gates[:2]) and app.fleet.gates[2].error)
                assert isinstance(app.screen, FleetScreen)
                rows = {r.name: r for r in app.fleet.rows}
                snap_b = await truth_b.snapshot()
                assert rows["gpu-b"].listen == snap_b.listen and rows["gpu-b"].host == snap_b.gate_id.split(":")[0]
                assert rows["gpu-b"].budget == snap_b.controller.budget and rows["gpu-b"].slo_ttft_ms == snap_b.controller.slo_ttft_ms
                assert rows["gpu-a"].listen != rows["gpu-b"].listen
                assert (rows["gpu-a"].state, rows["gpu-a"].shared, rows["gpu-a"].ready) == ("ok", "off", 1)
                assert rows["gpu-c"].state == "down" and "no control socket here" in rows["gpu-c"].note
                table = app.fleet_screen.table
                assert table.row_count == 3
                assert str(table.get_cell("gpu-c", "state")) == "down"

                # Enter on the gate that cannot be reached says so and stays on the fleet
                table.move_cursor(row=2)
                # its reason whole under the table, where the row's last column cuts it
                note = app.fleet_screen.note
                await until(pilot, lambda: str(note.render()) == f"gpu-c: {rows['gpu-c'].note}")
                await pilot.press("enter")
                await until(pilot, lambda: any(t == "gpu-c: cannot open" for t, _ in toasts(app)))
                assert isinstance(app.screen, FleetScreen) and app.opened is None

                # ---- another console pauses a class on gpu-a: the fleet says where ----
                await other.command(Pause("batch", True))
                heard = f"gpu-a: {other.info.operator}@{other.info.origin}"
                await until(pilot, lambda: any(t == heard and m.startswith("Paused batch") for t, m in toasts(app)))

                # ---- Enter on gpu-b opens its full console ----
                table.move_cursor(row=1)
                await pilot.press("enter")
                await until(pilot, lambda: app.opened is not None and app.last_snapshot is not None)
                assert app.opened.name == "gpu-b" and not isinstance(app.screen, FleetScreen)
                assert app.last_snapshot.gate_id == snap_b.gate_id
                assert app.header.attached == f"gate gpu-b ({sock_b})"

                # the retune form names the gate
                app.class_table.focus()
                app.class_table.select_class("interactive")
                await pilot.press("t")
                await until(pilot, lambda: isinstance(app.screen, RetuneScreen))
                assert "Retune gate gpu-b (class interactive)" in [str(w.render()) for w in app.screen.query(".dialog-title")]
                await pilot.press("escape")
                await until(pilot, lambda: not isinstance(app.screen, RetuneScreen))

                # pausing a class that carries traffic asks first, naming the gate; the toast names it too
                def busy() -> bool:
                    c = next(c for c in app.last_snapshot.classes if c.name == "interactive")
                    return c.in_flight + c.queued + c.admitted_per_min > 0

                await until(pilot, busy)
                await pilot.press("p")
                await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
                assert app.screen.title_text == "Pause interactive on gate gpu-b?"
                assert app.screen.message.startswith("interactive on gate gpu-b carries traffic")
                await pilot.press("y")
                await until(pilot, lambda: any(m.startswith("Paused interactive") for t, m in toasts(app) if t.startswith("gpu-b")))
                title = next(t for t, m in toasts(app) if m.startswith("Paused interactive") and t.startswith("gpu-b"))
                assert title == f"gpu-b: {app.link.info.operator}"
                # the action landed on gpu-b only
                assert next(c for c in (await truth_b.snapshot()).classes if c.name == "interactive").paused
                assert not next(c for c in (await other.snapshot()).classes if c.name == "interactive").paused

                # ---- q: back to the fleet, gpu-b goes on ----
                await pilot.press("q")
                await until(pilot, lambda: isinstance(app.screen, FleetScreen) and app.opened is None)
                assert app.gate_name == "" and proc_b.returncode is None

                # ---- gpu-b dies while open: back to the fleet, with a toast ----
                table.move_cursor(row=1)
                await pilot.press("enter")
                await until(pilot, lambda: app.opened is not None and app.last_snapshot is not None)
                proc_b.send_signal(signal.SIGKILL)
                await until(pilot, lambda: isinstance(app.screen, FleetScreen) and app.opened is None)
                await until(pilot, lambda: any(t == "gpu-b: gate went away" for t, _ in toasts(app)))
                await until(pilot, lambda: app.fleet.by_name("gpu-b").row.state == "down")

                # ---- q on the fleet quits ----
                await pilot.press("q")
                await until(pilot, lambda: app.return_code is not None)
            assert app.return_code == 0
        finally:
            await other.close()
            await truth_b.close()
