"""What the request path needs, and nothing more: handed to it by the composition root.

The proxy, the routes and the fallback routing read these few things; they never see the
service that built them. `config` and `shutting_down` are read through callables because
their owners change them while requests run (a reload, a drain).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import httpx

from gate.backend.pool import Backend, BackendPool
from gate.backend.rate_window import RateWindows
from gate.backend.tokens import TokenCounter
from gate.backend.upstream import RelayStats
from gate.config import Config
from gate.core.ratelimit import RateLimiter
from gate.fleet.model_metrics import ModelMetrics
from gate.http.tenants import TenantDirectory
from gate.observe.metrics import GateMetrics
from gate.observe.recorder import Recorder

if TYPE_CHECKING:
    from gate.fleet.sharedlimits.client import SharedLimits  # imports redis: only when [shared] is set


@dataclass(frozen=True, slots=True)
class RequestPorts:
    current_config: Callable[[], Config]
    is_shutting_down: Callable[[], bool]
    clock: Callable[[], float]
    log: logging.Logger
    client: httpx.AsyncClient
    backends: BackendPool
    tenants: TenantDirectory
    tokens: TokenCounter
    ratelimit: RateLimiter
    shared: SharedLimits | None
    recorder: Recorder
    metrics: GateMetrics
    model_metrics: ModelMetrics
    #: a completed request's upstream latencies, for the backend's budget controller
    observe_success: Callable[[Backend, RelayStats], None]
    #: release a ticket once llama-server shows its slot free (a cancelled request)
    release_when_slot_frees: Callable[..., None]
    #: gauges from current state, per scrape
    refresh_metrics: Callable[[], None]
    refresh_inference_gauges: Callable[[], None]
    #: llama-server's throughput gauges over a scraper's window, shared with the telemetry poller
    rate_windows: RateWindows
    #: backend -> slots llama-server runs beyond the gate's own on two reads in a row (BypassWatch)
    bypass_slots: Callable[[], Mapping[str, int]]

    @property
    def config(self) -> Config:
        return self.current_config()

    @property
    def shutting_down(self) -> bool:
        return self.is_shutting_down()
