"""`tokengate console`: the Textual app with the gate embedded, or attached to a running gate.

Embedded: the gate runs on its own thread's event loop (`gate.embedded.GateThread`),
the console in the main thread; quitting or a hang-up (SIGHUP, an SSH drop without
tmux) drains the gate as SIGTERM does. Attached: the console talks to a
`tokengate serve` through its control socket; quitting or a hang-up ends only the
console.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from gate.config import BackendConfig, Config, parse_config
from gate.link import GateLink

# The demo's own policy: an interactive class with a guaranteed share, a batch
# class that may borrow the rest, and an SLO the simulated A10G can just meet.
DEMO_CONFIG = """
default_class = "interactive"
[gate]
journal = "tokengate-demo.db"
[budget]
mode = "adaptive"
min_tokens = 2048
slo_ttft_p95_ms = 2500
window_s = 20
cooldown_s = 5
min_samples = 10
[classes.interactive]
priority = 10
reserved_tokens = 2048
queue_depth = 32
queue_timeout_s = 10
default_max_tokens = 128
max_tokens_cap = 1024
[classes.batch]
priority = 1
limit_tokens = 6144
queue_depth = 64
queue_timeout_s = 60
default_max_tokens = 512
max_tokens_cap = 1024
"""


def demo_config(base: Config | None, simulator_url: str) -> Config:
    """The user's config (or the demo's) with its backends pointed at the simulator."""
    config = base if base is not None else parse_config(DEMO_CONFIG, "<demo>")
    backend = BackendConfig(name="simulated", url=simulator_url, kv="unified")
    return dataclasses.replace(config, backends=(backend,))


class ConsoleExit(Exception):
    """The console could not start; the message says why (exit code 2)."""


def _log_beside(journal: str) -> None:
    # Logging to the terminal would tear the screen: keep warnings in a file beside the journal.
    logging.basicConfig(
        filename=str(Path(journal).with_suffix(".log")) if journal != ":memory:" else None,
        level=logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def _on_hangup(app, loop: asyncio.AbstractEventLoop) -> Callable[[], None]:
    """SIGHUP/SIGTERM: end the app as `q` would, and remember why (the gate's audit row)."""
    loop.add_signal_handler(signal.SIGHUP, lambda: _end(app, "hang-up (SIGHUP)"))
    loop.add_signal_handler(signal.SIGTERM, lambda: _end(app, "signal SIGTERM"))

    def remove() -> None:
        for sig in (signal.SIGHUP, signal.SIGTERM):
            loop.remove_signal_handler(sig)

    return remove


def _end(app, why: str) -> None:
    app.exit_why = why
    app.exit()


async def _run_app(link: GateLink, *, read_only: bool):
    from console.app import TokengateApp  # Textual only when the console runs

    app = TokengateApp(link, read_only=read_only)
    remove = _on_hangup(app, asyncio.get_running_loop())
    try:
        # A hung-up terminal fails writes with EIO while Textual restores it: nothing to restore.
        with contextlib.suppress(OSError):
            await app.run_async()
    finally:
        remove()
    return app


async def attach_console(path: str, *, read_only: bool = False) -> int:
    """`tokengate console --attach`: the console on a gate that is already running."""
    from gate.link import LinkLost, SocketLink

    try:
        link = await SocketLink.connect(path, read_only=read_only)
    except LinkLost as exc:
        raise ConsoleExit(str(exc)) from None
    _log_beside(link.info.journal)
    try:
        app = await _run_app(link, read_only=read_only)
    finally:
        await link.close()
    if app.lost:
        sys.stderr.write(f"tokengate console: the gate went away: {app.lost}\n")
        return 1
    return 0


async def run_console(config: Config, *, demo: bool = False, read_only: bool = False, seed: int = 7, user_config: bool = False) -> int:
    """Start the gate on its own thread (for --demo with the simulator and synthetic traffic),
    run the app in this one, then drain the gate. A running gate on the same config: attach
    read-only when asked for --read-only, else refuse (exit 2) with the way to attach."""
    from gate.control_socket import SocketInUse, is_live
    from gate.embedded import GateThread
    from gate.link import InProcessLink
    from gate.lock import JournalLocked
    from gate.service import GateService

    simulator = traffic = None
    if demo:
        config = demo_config(config if user_config else None, "http://127.0.0.1:0")  # the simulator's URL comes later
    socket_path = config.gate.control_socket_path()
    if socket_path is not None and is_live(socket_path):
        if read_only:
            return await attach_console(socket_path, read_only=True)
        raise ConsoleExit(
            f"a gate already runs on this config (control socket {socket_path}); watch or steer it with "
            f"`tokengate console --attach {socket_path}` (add --read-only to only watch)"
        )
    _log_beside(config.gate.journal)

    async def make_gate() -> GateService:
        nonlocal simulator, config
        if demo:
            from gate.simulator import SimulatorConfig, serve_simulator

            # Twice the simulated A10G's speed and traffic near its capacity, with a burst
            # every minute: overload comes and goes, so every panel has something to say.
            simulator = await serve_simulator(SimulatorConfig(slots=4, ctx=8192, kv="unified", seed=seed, speed=2.0), port=0)
            backend = dataclasses.replace(config.backends[0], url=simulator.url)
            config = dataclasses.replace(config, backends=(backend,))
        gate = GateService(config)
        gate.label = "SIMULATED" if demo else "LIVE"
        gate.drain_grace_s = 10.0
        return gate

    async def start_traffic(gate: GateService) -> None:
        nonlocal traffic
        if demo:
            from gate.traffic import TrafficGenerator

            traffic = TrafficGenerator(gate.url, seed=seed, rate_interactive=0.8, rate_batch=0.15)
            await traffic.start()

    async def stop_traffic(gate: GateService) -> None:
        if traffic is not None:
            await traffic.stop()

    async def stop_simulator() -> None:
        if simulator is not None:
            await simulator.stop()

    thread = GateThread(
        make_gate, port=0 if demo else None,  # the demo never fights a real gate for its port
        after_start=start_traffic, before_stop=stop_traffic, after_stop=stop_simulator,
    )
    try:
        gate = await asyncio.to_thread(thread.start)
    except (JournalLocked, SocketInUse) as exc:
        raise ConsoleExit(str(exc)) from None
    link = InProcessLink(gate, loop=thread.loop, read_only=read_only, embedded=True)
    why = "console quit"
    try:
        app = await _run_app(link, read_only=read_only)
        why = app.exit_why
    finally:
        await link.close()
        await asyncio.to_thread(thread.stop, why)
    return 0
