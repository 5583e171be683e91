"""The demo: the built-in simulator, synthetic traffic and a policy that shows every panel.

`tokengate console --demo` (and `tokengate serve --demo`) run a gate in front of a
simulated llama-server with interactive and batch traffic; the screen says SIMULATED.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Callable
from typing import Any

from gate.config import BackendConfig, Config, parse_config
from gate.data.snapshot import GIB, GpuDevice, GpuProcess, GpuReading
from gate.tools.simulator import SimulatorConfig
from gate.tools.traffic import TrafficGenerator

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


def listen_set_in(config_path: str | None) -> bool:
    """Does the file at `config_path` set `[gate] listen`? The demo then listens there, as the
    user wrote it; otherwise on a free port, so as never to fight a real gate for the default
    8081 (a trial's `serve --demo --config demo.toml` with listen set bound a random port)."""
    if config_path is None:
        return False
    try:
        with open(config_path, "rb") as f:
            data = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError):
        return False  # load_config has read it already: not reached
    gate = data.get("gate")
    return isinstance(gate, dict) and "listen" in gate


def DEMO_SIMULATOR(seed: int = 7) -> SimulatorConfig:
    # Twice the simulated A10G's speed and traffic near its capacity, with a burst
    # every minute: overload comes and goes, so every panel has something to say.
    return SimulatorConfig(slots=4, ctx=8192, kv="unified", seed=seed, speed=2.0)


def demo_traffic(gate_url: str, seed: int = 7) -> TrafficGenerator:
    return TrafficGenerator(gate_url, seed=seed, rate_interactive=0.8, rate_batch=0.15)


#: KV cache bytes per token of the model the demo simulates (an 8B Llama-3-class model:
#: 32 layers x 8 KV heads x 128 dims x (K + V) x 2 bytes, f16; what gate/backend/kvsize.py reads
#: from a real GGUF header)
DEMO_KV_BYTES_PER_TOKEN = 32 * 8 * 128 * 2 * 2
DEMO_GPU_NAME = "SIMULATED NVIDIA A10G"
_DEMO_GPU_TOTAL = 23_028 * 2**20  # what NVML reports for a 24 GB A10G
_DEMO_WEIGHTS = int(4.6 * GIB)  # an 8B model at Q4_K_M
_DEMO_COMPUTE = int(0.6 * GIB)  # llama.cpp's compute buffers
_DEMO_OTHER = int(0.4 * GIB)  # CUDA context, other processes


class SimulatedGpu:
    """The demo's GPU, in GpuMonitor's place (`read`, `read_async`, `close`): a device named
    SIMULATED, with what llama-server would hold on it (weights, the whole KV pool, which it
    allocates at start, compute buffers) as the simulator's process. On a real host NVML
    stays the source (gate/observe/gpu.py); this never runs outside --demo."""

    def __init__(self, pool_tokens: int, busy_fraction: Callable[[], float] = lambda: 0.0) -> None:
        self.pool_tokens = pool_tokens
        self.busy_fraction = busy_fraction

    def read(self) -> GpuReading:
        server = _DEMO_WEIGHTS + self.pool_tokens * DEMO_KV_BYTES_PER_TOKEN + _DEMO_COMPUTE
        busy = min(max(self.busy_fraction(), 0.0), 1.0)
        device = GpuDevice(
            index=0,
            name=DEMO_GPU_NAME,
            used_bytes=server + _DEMO_OTHER,
            total_bytes=_DEMO_GPU_TOTAL,
            reserved_bytes=None,
            utilization_pct=round(20 + 75 * busy),
            processes=(GpuProcess(os.getpid(), server, name="llama-server (simulated)"),),
        )
        return GpuReading(devices=(device,), unavailable=None)

    async def read_async(self, timeout_s: float | None = None) -> GpuReading:
        return self.read()

    def close(self, timeout_s: float = 1.0) -> None:
        pass


def demo_parts(sim: SimulatorConfig, busy_slots: Callable[[], int]) -> dict[str, Any]:
    """What makes a gate the demo's, as GateService's keyword arguments: the SIMULATED label,
    the simulated GPU (busy as the simulator's slots are) and the simulated model's KV bytes
    per token, as its GGUF header would say (`tokengate serve --demo`, the screenshots)."""
    return {
        "label": "SIMULATED",
        "gpu": SimulatedGpu(sim.ctx, lambda: busy_slots() / sim.slots),
        "kv_bytes_per_token": DEMO_KV_BYTES_PER_TOKEN,
    }


def dress_demo_gate(gate: Any, sim: SimulatorConfig) -> None:
    """The demo's parts on a gate built without them (tests that build their own gate); the
    GPU reads the gate's own ledger, as no simulator is at hand."""

    def busy() -> int:
        return sum(len(b.admission.ledger) for b in gate.backends if b.admission is not None)

    parts = demo_parts(sim, busy)
    gate.label, gate.gpu = parts["label"], parts["gpu"]
    for b in gate.backends:
        b.kv_bytes_per_token = parts["kv_bytes_per_token"]
