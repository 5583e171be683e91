"""`tokengate serve`: one gate run until a signal, as systemd (or the embedded console) runs it.

SIGTERM/SIGINT drain gracefully; SIGHUP re-reads the config (`Control.reload_file`, audited
whether applied or refused). A console that started this process may stop it through the
control socket (op stop). Imported only by `gate/cli.py`.
"""

from __future__ import annotations

import asyncio
import gc
import os
import signal
from collections.abc import Callable

from gate.backend.pool import describe_state
from gate.config import Config
from gate.service import GateService

#: What the kernel sends a gate whose embedded console died (PR_SET_PDEATHSIG, set by the CLI).
#: Not SIGTERM: the audit said "signal SIGTERM" and a review went looking for who ran kill.
CONSOLE_GONE = signal.SIGUSR2


async def serve_until_signalled(
    config: Config,
    *,
    config_path: str | None = None,
    grace_s: float = 30.0,
    demo: bool = False,
    seed: int = 7,
    held_hangup: Callable[[], bool] | None = None,
    console_pid: int | None = None,
) -> int:
    """Run a gate until SIGTERM/SIGINT (then drain gracefully); SIGHUP re-reads the config.

    `demo`: the gate in front of the built-in simulator with synthetic traffic (what
    `tokengate console --demo` runs in its gate process).
    `held_hangup`: whether a SIGHUP came before the loop's handler (the CLI holds them while
    it starts); if so, the file is re-read once the gate runs.
    `console_pid`: the embedded console that started this gate; CONSOLE_GONE drains it.
    """
    simulator = traffic = None
    extras = {}
    listen_given = False
    if demo:
        from gate.tools.demo import DEMO_SIMULATOR, demo_config, demo_parts, listen_set_in
        from gate.tools.simulator import serve_simulator

        listen_given = listen_set_in(config_path)  # a [gate] listen the file sets is honoured

        sim = DEMO_SIMULATOR(seed)
        simulator = await serve_simulator(sim, port=0)
        config = demo_config(config if config_path else None, simulator.url)
        extras = demo_parts(sim, lambda: simulator.runtime.core.busy_slots)  # SIMULATED label, GPU, model size
    gate = GateService(config, **extras)
    gate.drain_grace_s = grace_s
    gate.config_path = os.path.realpath(config_path) if config_path else ""
    stop = asyncio.Event()
    why: list[str] = []

    def stop_because(reason: str) -> None:
        why.append(reason)
        stop.set()

    gate.stop_requested = stop_because
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop_because, f"signal {sig.name}")
    loop.add_signal_handler(signal.SIGHUP, lambda: gate.control.reload_file(config_path, operator=gate.operator))
    if console_pid is not None:

        def console_gone() -> None:
            # The kernel sends it also when only a thread of the console ends (the gate is
            # handed to another of its threads, the same pid): the console lives on then.
            if os.getppid() != console_pid:
                stop_because(f"console gone: the console that started this gate (pid {console_pid}) ended (killed or crashed)")

        loop.add_signal_handler(CONSOLE_GONE, console_gone)
    try:
        # the demo never fights a real gate for its port: a free one, unless the file says where
        await gate.start(port=0 if demo and not listen_given else None)
    except BaseException:
        if simulator is not None:
            await simulator.stop()
        raise
    if held_hangup is not None and held_hangup():
        gate.log.info("SIGHUP while starting: re-reading %s now", config_path)
        gate.control.reload_file(config_path, operator=gate.operator)
    for b in gate.backends:
        gate.log.info("backend %s at %s: %s", b.name, b.url, describe_state(b))
    if gate.control_server is not None and gate.control_server.listening:
        gate.log.info("control socket %s (attach: tokengate console --attach %s)", gate.control_server.path, gate.control_server.path)
    if demo:
        from gate.tools.demo import demo_traffic

        if listen_given:
            gate.log.info("demo: listening on %s, the [gate] listen of %s", gate.url, config_path)
        else:
            gate.log.info("demo: listening on %s, a free port (set [gate] listen in --config to choose one)", gate.url)

        traffic = demo_traffic(gate.url, seed)
        await traffic.start()
    # What start-up allocated (modules, config, the app) lives as long as the process:
    # keep it out of every later full collection, which otherwise pause the loop.
    gc.freeze()
    await stop.wait()
    gate.log.info("%s: refusing new requests, draining for up to %.0fs", why[0], grace_s)
    if traffic is not None:
        await traffic.stop()
    await gate.stop(grace_s, why=why[0])
    if simulator is not None:
        await simulator.stop()
    return 0
