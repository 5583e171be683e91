"""The demo: the built-in simulator, synthetic traffic and a policy that shows every panel.

`tokengate console --demo` (and `tokengate serve --demo`) run a gate in front of a
simulated llama-server with interactive and batch traffic; the screen says SIMULATED.
"""

from __future__ import annotations

import dataclasses

from gate.config import BackendConfig, Config, parse_config
from gate.simulator import SimulatorConfig
from gate.traffic import TrafficGenerator

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


def DEMO_SIMULATOR(seed: int = 7) -> SimulatorConfig:
    # Twice the simulated A10G's speed and traffic near its capacity, with a burst
    # every minute: overload comes and goes, so every panel has something to say.
    return SimulatorConfig(slots=4, ctx=8192, kv="unified", seed=seed, speed=2.0)


def demo_traffic(gate_url: str, seed: int = 7) -> TrafficGenerator:
    return TrafficGenerator(gate_url, seed=seed, rate_interactive=0.8, rate_batch=0.15)
