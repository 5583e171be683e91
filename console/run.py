"""`tokengate console`: the Textual app with the gate embedded, or attached to a running gate.

Embedded: the console starts the gate as a child process (`tokengate serve`, see
GateProcess) and attaches to it through its control socket, exactly as `--attach`
does; quitting or a hang-up (SIGHUP, an SSH drop without tmux) drains the gate as
SIGTERM does. Attached: the console talks to a running `tokengate serve`; quitting
or a hang-up ends only the console.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from console.priority import lower_priority
from gate.config import Config
from gate.journal.writer import private_file
from gate.ops.link import GateLink


class ConsoleExit(Exception):
    """The console could not start; the message says why (exit code 2)."""


def _log_beside(journal: str) -> None:
    # Logging to the terminal would tear the screen: keep warnings in a file beside the journal,
    # private as the journal is (0600: it names backends, tenants, refused reloads)
    path = str(Path(journal).with_suffix(".log")) if journal != ":memory:" else None
    if path is not None:
        private_file(path)
    logging.basicConfig(
        filename=path,
        level=logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


# After a hang-up the terminal may be gone: Textual's output thread dies on the first write
# that fails (EIO) and its shutdown then waits forever to hand that thread its last frames
# (seen: a console alive 20 minutes after `tmux kill-server`, blocked in WriterThread.stop).
# A console told to end by a signal is gone within this many seconds, whatever Textual does.
SIGNAL_EXIT_S = 5.0


def _on_hangup(app, loop: asyncio.AbstractEventLoop, on_signal: Callable[[str], None] | None = None) -> Callable[[], None]:
    """SIGHUP/SIGTERM: end the app as `q` would, and remember why (the gate's audit row).

    `on_signal(why)` runs first (the embedded console starts draining its gate at once, with
    the reason, before Textual gets a chance to hang on a dead terminal); a watchdog thread
    ends the process SIGNAL_EXIT_S later if the app has not finished by then.
    """
    watchdog: list[threading.Timer] = []
    whys: dict[int, str] = {signal.SIGHUP: "hang-up (SIGHUP)", signal.SIGTERM: "signal SIGTERM"}

    def ended_by(why: str) -> None:  # on the event loop
        app.ended_by_signal = True
        if on_signal is not None:
            on_signal(why)
        _end(app, why)

    def handler(signum: int, _frame) -> None:
        # A plain signal handler, not the loop's: it runs even while the loop is blocked
        # (in Textual's output queue, say), so the watchdog always starts.
        why = whys[signum]
        if not watchdog:
            timer = threading.Timer(SIGNAL_EXIT_S, _exit_now, args=(why,))
            timer.daemon = True
            timer.start()
            watchdog.append(timer)
        loop.call_soon_threadsafe(ended_by, why)

    before = {sig: signal.signal(sig, handler) for sig in whys}

    def remove() -> None:
        for sig, old in before.items():
            signal.signal(sig, old)
        for timer in watchdog:
            timer.cancel()

    return remove


def _exit_now(why: str) -> None:
    logging.getLogger("tokengate.console").warning(
        "%s: the console did not finish within %.0f s (a terminal that is gone); exiting", why, SIGNAL_EXIT_S
    )
    logging.shutdown()
    os._exit(0)


def _freeze_gc() -> None:
    import gc

    gc.collect()
    gc.freeze()


def _end(app, why: str) -> None:
    app.exit_why = why
    app.ended_by_signal = True
    app.exit()


#: frames a second the console draws at most (Textual's own default is 60): what a console
#: can spend on the screen stays bounded however fast keys, the wheel or snapshots come
CONSOLE_FPS = 30


def limit_frames(environ: dict[str, str] | None = None) -> None:
    """TEXTUAL_FPS, which Textual reads once when first imported, unless the user set it."""
    (os.environ if environ is None else environ).setdefault("TEXTUAL_FPS", str(CONSOLE_FPS))


async def _run_app(link: GateLink, *, read_only: bool, on_signal: Callable[[str], None] | None = None, **view: Any):
    """`view`: what a reattached console keeps of the last one (TokengateApp's `select`, `interval_s`)."""
    limit_frames()
    from console.app import TokengateApp  # Textual only when the console runs

    return await _run(TokengateApp(link, read_only=read_only, **view), on_signal, gate_pids=[link.info.pid] if link.info.pid else None)


async def _run(app, on_signal: Callable[[str], None] | None = None, *, gate_pids: list[int] | None = None):
    # The console gives way to the gate for the CPU (console/priority.py); the embedded
    # console's gate child was started before this, at normal priority.
    restore_priority = lower_priority(gate_pids)
    # Once the first frames are up (3 s), what start-up built (Textual, the widget tree) lives as
    # long as the console: out of the way of every later full collection (a full collection
    # of the console's heap took 60-90 ms, gc.callbacks at 200 req/s), which delays a key press.
    freeze = asyncio.get_running_loop().call_later(3.0, _freeze_gc)
    remove = _on_hangup(app, asyncio.get_running_loop(), on_signal)
    try:
        # A hung-up terminal fails writes with EIO while Textual restores it: nothing to restore.
        with contextlib.suppress(OSError):
            await app.run_async()
    finally:
        freeze.cancel()
        remove()
        restore_priority()
    return app


def run_apart(app) -> None:
    """An app with no gate (`tokengate review`), run as the console is: SIGTERM and SIGHUP end
    it as q does, and the terminal is given back (a `kill` of a review left the terminal in
    its screen, raw, until `reset`: a trial)."""
    limit_frames()
    asyncio.run(_run(app))


async def attach_console(path: str, *, read_only: bool = False) -> int:
    """`tokengate console --attach`: the console on a gate that is already running."""
    from gate.ops.link import LinkLost, SocketLink

    try:
        link = await SocketLink.connect(path, read_only=read_only)
    except LinkLost as exc:
        raise ConsoleExit(str(exc)) from None
    _log_beside(link.info.journal)
    view: dict[str, Any] = {}
    while True:
        try:
            app = await _run_app(link, read_only=read_only, **view)
        finally:
            await link.close()
        if not app.lost:
            return 0
        # The console that comes back keeps the selected class and the refresh rate: after a
        # restart the cursor went back to the top row, and `p` meant for batch paused interactive.
        view = {"select": app.selected_at_loss, "interval_s": app.interval_s}
        # The gate went away under us: a restart (systemd's Restart=on-failure, a deploy) is
        # the usual reason, so wait for it to come back on the same socket rather than exit.
        sys.stderr.write(f"tokengate console: {app.lost}\n")
        relinked = await _reconnect(path, read_only=read_only, within_s=RECONNECT_S)
        if relinked is None:
            sys.stderr.write(f"tokengate console: no gate came back on {path} within {RECONNECT_S:g} s\n")
            return 1
        sys.stderr.write(f"tokengate console: reconnected to {path} (gate {relinked.info.gate_id})\n")
        link = relinked


#: how long an attached console waits for its gate to come back after losing it
RECONNECT_S = 60.0


async def _reconnect(path: str, *, read_only: bool, within_s: float) -> Any:
    """The link to a gate on `path` once one answers again, or None after `within_s`."""
    from gate.ops.link import LinkLost, SocketLink

    sys.stderr.write(f"tokengate console: waiting up to {within_s:g} s for a gate on {path} (Ctrl-C to stop)\n")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while loop.time() < deadline:
        try:
            return await SocketLink.connect(path, read_only=read_only)
        except (LinkLost, OSError):
            await asyncio.sleep(0.5)
    return None


async def attach_fleet(gates: list[tuple[str, str]], *, read_only: bool = False) -> int:
    """`tokengate console --attach A --attach B ...` (or `--attach --config F` with [[fleet]]):
    a row per gate, Enter for one gate's console. `gates`: (name or "", control socket)."""
    import os
    import tempfile

    limit_frames()
    from console.fleet import fleet_entries
    from console.fleet_app import FleetConsoleApp

    try:
        entries = fleet_entries(gates)
    except ValueError as exc:
        raise ConsoleExit(str(exc)) from None
    # No journal of its own: warnings go to a file, never onto the screen.
    _log_beside(str(Path(tempfile.gettempdir()) / f"tokengate-fleet-{os.getuid()}.db"))
    app = await _run(FleetConsoleApp(entries, read_only=read_only))
    return 0 if app.return_code in (None, 0) else app.return_code


async def run_console(
    config: Config,
    *,
    config_path: str | None = None,
    demo: bool = False,
    read_only: bool = False,
    seed: int = 7,
) -> int:
    """The embedded console: start the gate as a process of its own (`tokengate serve`, for
    --demo with the simulator and synthetic traffic), attach to it, and stop it (drain) when
    the console ends. A gate already running on the same config: attach read-only when asked
    for --read-only, else refuse (exit 2) with the way to attach."""
    from gate.ops.control_socket import is_live
    from gate.tools.demo import demo_config

    if demo:
        config = demo_config(config if config_path else None, "http://127.0.0.1:0")
    socket_path = config.gate.control_socket_path()
    if socket_path is None:
        raise ConsoleExit("the embedded console needs a control socket: set [gate] journal to a file or [gate] control_socket")
    if read_only and not demo:
        # one look, and never a start: a read-only console only watches. Looked at twice (is it
        # live? then again below), a gate that stopped between the two looks (a restart) let it
        # fall through and start a gate of its own, which took the journal's lock from the one
        # being restarted (a trial)
        if not is_live(socket_path):
            raise ConsoleExit(
                f"--read-only only watches a running gate, and none runs on this config (control socket "
                f"{socket_path}); start one with `tokengate serve --config {config_path or 'FILE'}`"
            )
        return await attach_console(socket_path, read_only=True)
    if is_live(socket_path):
        if read_only:  # --demo --read-only beside a demo gate already running: watch it
            return await attach_console(socket_path, read_only=True)
        raise ConsoleExit(
            f"a gate already runs on this config (control socket {socket_path}); watch or steer it with "
            f"`tokengate console --attach {socket_path}` (add --read-only to only watch)"
        )
    log_path = _log_path(config.gate.journal)
    journal = _where(config.gate.journal)
    _say(
        f"tokengate: journal {journal} (read it with `tokengate log --journal {journal}` or `tokengate review --journal {journal}`); log {_where(log_path)}"
    )
    gate = await GateProcess.start(config_path, socket_path, log_path, demo=demo, seed=seed)
    why = "operator quit"
    lost = None
    try:
        link = await gate.attach(read_only=read_only)
        _log_beside(config.gate.journal)

        def drain_now(why: str) -> None:  # a hang-up: start the drain before Textual shuts down
            asyncio.get_running_loop().create_task(gate.stop(link, why))

        try:
            app = await _run_app(link, read_only=read_only, on_signal=drain_now)
            why, lost = app.exit_why, app.lost
        finally:
            await gate.stop(link, why)
    finally:
        await gate.wait_or_kill()
        _say(f"tokengate: the journal is {journal}")
    if lost:
        sys.stderr.write(f"tokengate console: {lost} (its log: {log_path})\n")
        return 1
    return 0


def _where(path: str) -> str:
    return path if path == ":memory:" else str(Path(path).absolute())


def _say(line: str) -> None:
    with contextlib.suppress(OSError):
        sys.stderr.write(line + "\n")
        sys.stderr.flush()


def _log_path(journal: str) -> str:
    return str(Path(journal if journal != ":memory:" else "tokengate.db").with_suffix(".log"))


class GateProcess:
    """The embedded console's gate: `tokengate serve` as a child process.

    A process of its own, not a thread: the console's rendering then shares neither
    the gate's event loop nor its interpreter lock nor its garbage collector (a full
    collection of the console's widgets paused a gate thread for 60-90 ms, measured
    with gc.callbacks at 200 req/s), and the kernel schedules the two apart. The child
    runs in its own session (a terminal hang-up reaches only the console), logs beside
    the journal, and is told by the kernel to drain (SIGTERM) if the console dies
    without stopping it (PR_SET_PDEATHSIG).
    """

    def __init__(self, proc: asyncio.subprocess.Process, socket_path: str, log_path: str, grace_s: float) -> None:
        self.stopping: asyncio.Task | None = None
        self.proc = proc
        self.socket_path = socket_path
        self.log_path = log_path
        self.grace_s = grace_s

    @classmethod
    async def start(
        cls, config_path: str | None, socket_path: str, log_path: str, *, demo: bool, seed: int, grace_s: float = 10.0
    ) -> GateProcess:
        import os

        from gate.ops.control_socket import is_live

        args = [sys.executable, "-m", "gate.cli", "serve", "--grace", f"{grace_s:g}", "--log-level", "warning"]
        if config_path:
            args += ["--config", config_path]
        if demo:
            args += ["--demo", "--seed", str(seed)]
        env = {**os.environ, "TOKENGATE_PARENT_PID": str(os.getpid())}
        start_at = Path(log_path).stat().st_size if Path(log_path).exists() else 0
        private_file(log_path)  # 0600, as the journal beside it
        log = open(log_path, "ab")  # noqa: SIM115 - the child's stderr, for as long as it runs
        try:
            proc = await asyncio.create_subprocess_exec(
                *args,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=env,
                start_new_session=True,
            )
        finally:
            log.close()
        gate = cls(proc, socket_path, log_path, grace_s)
        while not is_live(socket_path):
            if proc.returncode is not None:
                raise ConsoleExit(gate._log_since(start_at) or f"the gate exited with code {proc.returncode}")
            try:
                async with asyncio.timeout(0.05):
                    await proc.wait()
            except TimeoutError:
                pass
        return gate

    def _log_since(self, offset: int) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(offset)
                text = f.read().decode(errors="replace").strip()
        except OSError:
            return ""
        lines = [line.removeprefix("tokengate serve: ") for line in text.splitlines() if line.strip()]
        return lines[-1] if lines else ""

    async def attach(self, *, read_only: bool) -> GateLink:
        from gate.ops.link import SocketLink

        return await SocketLink.connect(self.socket_path, read_only=read_only, embedded=True)

    async def stop(self, link: GateLink, why: str) -> None:
        """Drain the gate: through the socket with the reason (audited), else with SIGTERM.
        Once: a second call waits for the first."""
        if self.stopping is None:
            self.stopping = asyncio.ensure_future(self._stop(link, why))
        await asyncio.shield(self.stopping)

    async def _stop(self, link: GateLink, why: str) -> None:
        from gate.ops.link import SocketLink

        try:
            if isinstance(link, SocketLink):
                async with asyncio.timeout(2.0):
                    await link.stop_gate(why)
            else:
                raise ConnectionError
        except Exception:  # noqa: BLE001 - the socket is gone: a signal does the same, without the reason
            if self.proc.returncode is None:
                self.proc.send_signal(signal.SIGTERM)
        finally:
            await link.close()

    async def wait_or_kill(self) -> None:
        """Wait out the drain (the grace period and a margin), then SIGKILL."""
        if self.proc.returncode is None:
            with contextlib.suppress(OSError):
                sys.stderr.write(f"tokengate: stopping the gate (in-flight requests get up to {self.grace_s:g} s)...\n")
                sys.stderr.flush()
        try:
            async with asyncio.timeout(self.grace_s + 15.0):
                await self.proc.wait()
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()
