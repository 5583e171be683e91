"""`tokengate console`: the gate and the Textual app in one process and one event loop."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from gate.config import BackendConfig, Config, parse_config
from gate.service import GateService

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


async def run_console(config: Config, *, demo: bool = False, read_only: bool = False, seed: int = 7, user_config: bool = False) -> int:
    """Start the gate (and, for --demo, the simulator and synthetic traffic), run the app, stop all."""
    from console.app import TokengateApp  # Textual only when the console runs

    # Logging to the terminal would tear the screen: keep warnings in a file beside the journal.
    logging.basicConfig(
        filename=str(Path(config.gate.journal).with_suffix(".log")) if config.gate.journal != ":memory:" else None,
        level=logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    simulator = traffic = None
    port = None
    if demo:
        from gate.simulator import SimulatorConfig, serve_simulator
        from gate.traffic import TrafficGenerator

        # Twice the simulated A10G's speed and traffic near its capacity, with a burst
        # every minute: overload comes and goes, so every panel has something to say.
        simulator = await serve_simulator(SimulatorConfig(slots=4, ctx=8192, kv="unified", seed=seed, speed=2.0), port=0)
        config = demo_config(config if user_config else None, simulator.url)
        port = 0  # the demo never fights a real gate for its port
    gate = GateService(config)
    gate.label = "SIMULATED" if demo else "LIVE"
    try:
        await gate.start(port=port)
        if demo:
            traffic = TrafficGenerator(gate.url, seed=seed, rate_interactive=0.8, rate_batch=0.15)
            await traffic.start()
        app = TokengateApp(gate, read_only=read_only)
        await app.run_async()
    finally:
        if traffic is not None:
            await traffic.stop()
        await gate.stop(grace_s=10.0)
        if simulator is not None:
            await simulator.stop()
    return 0
