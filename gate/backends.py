"""Backends: readiness, capacity from llama-server's own /props, and model routing.

Each backend gets its admission core (and gatekeeper) once its capacity is
known: slots from `total_slots`, per-slot context from
`default_generation_settings.n_ctx`, and the KV mode from config (llama-server
does not say which it runs).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

from gate.admission import Admission, Capacity, ClassPolicy, TenantPolicy
from gate.adaptive import BudgetController, ControllerSettings
from gate.config import BackendConfig, BudgetConfig
from gate.gatekeeper import Gatekeeper
from gate.shedding import DecodeMeter
from gate.prefill import PrefillModel
from gate.upstream import Upstream

log = logging.getLogger("tokengate.backends")

BackendState = Literal["ready", "loading", "down"]


def capacity_from_props(props: Mapping[str, Any], config: BackendConfig) -> Capacity:
    """The physical limits of a llama-server from its /props and the configured KV mode."""
    slots = props.get("total_slots")
    n_ctx = (props.get("default_generation_settings") or {}).get("n_ctx")
    if not isinstance(slots, int) or slots < 1 or not isinstance(n_ctx, int) or n_ctx < 1:
        raise ValueError(f"/props lacks total_slots/default_generation_settings.n_ctx: {slots!r}, {n_ctx!r}")
    # Unified: every slot reports the whole shared pool. Split: each slot owns n_ctx.
    ceiling = n_ctx if config.kv == "unified" else slots * n_ctx
    if config.token_budget is not None:
        ceiling = config.token_budget
    return Capacity(
        slots=slots, slot_context=n_ctx, ceiling=ceiling, max_prefill_tokens=config.max_prefill_tokens,
        prefill_yield_tokens=config.prefill_yield_tokens or None,
    )


@dataclass(slots=True)
class Backend:
    """One llama-server: its state, capacity and the gatekeeper guarding it."""

    config: BackendConfig
    upstream: Upstream
    auth_token: str | None = None
    state: BackendState = "down"
    detail: str = "not probed yet"
    capacity: Capacity | None = None
    gatekeeper: Gatekeeper | None = None
    props: dict[str, Any] = field(default_factory=dict)
    decode: DecodeMeter = field(default_factory=DecodeMeter)  # the current per-slot rate, for shedding
    controller: BudgetController | None = None
    kv_bytes_per_token: int | None = None  # from the model's GGUF header, when local

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def url(self) -> str:
        return self.config.url

    @property
    def admission(self) -> Admission | None:
        return None if self.gatekeeper is None else self.gatekeeper.admission

    def auth_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.auth_token}"} if self.auth_token else {}


def controller_settings(budget: BudgetConfig, ceiling: int) -> ControllerSettings:
    """The controller's tuning from `[budget]` and the backend's ceiling."""
    return ControllerSettings(
        min_tokens=min(budget.min_tokens, ceiling),
        ceiling_tokens=ceiling,
        slo_ttft_p95_s=budget.slo_ttft_p95_ms / 1000,
        slo_tpot_p95_s=None if budget.slo_tpot_p95_ms is None else budget.slo_tpot_p95_ms / 1000,
        window_s=budget.window_s,
        min_samples=budget.min_samples,
        cooldown_s=budget.cooldown_s,
        increase=budget.increase,
        decrease=budget.decrease,
    )


class BackendPool:
    """All backends, routing by model name, and the probe loop that keeps their state."""

    def __init__(
        self,
        configs: Iterable[BackendConfig],
        client: httpx.AsyncClient,
        *,
        classes: Iterable[ClassPolicy],
        tenant_policy: Callable[[str], TenantPolicy],
        environ: Mapping[str, str],
        budget: BudgetConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[], None] | None = None,
        on_created: Callable[[Backend], None] | None = None,
        probe_timeout_s: float = 2.0,
    ) -> None:
        self._client = client
        self._budget = budget or BudgetConfig()
        self._clock = clock
        self._classes = tuple(classes)
        self._tenant_policy = tenant_policy
        self._on_change = on_change
        self._on_created = on_created
        self._timeout = probe_timeout_s
        self.backends: tuple[Backend, ...] = tuple(
            Backend(c, Upstream(client, c.url), environ.get(c.api_key_env) if c.api_key_env else None) for c in configs
        )

    def __iter__(self):
        return iter(self.backends)

    def set_budget_config(self, budget: BudgetConfig) -> None:
        """Controllers created from now on use these settings (live ones are retuned by control)."""
        self._budget = budget

    def set_classes(self, classes: Iterable[ClassPolicy]) -> None:
        self._classes = tuple(classes)

    def route(self, model: str | None) -> Backend | None:
        """Declared models first; an absent model goes to the first backend; else a catch-all."""
        if model is None:
            return self.backends[0]
        for b in self.backends:
            if model in b.config.models:
                return b
        return next((b for b in self.backends if not b.config.models), None)

    def by_name(self, name: str) -> Backend | None:
        return next((b for b in self.backends if b.name == name), None)

    @property
    def any_ready(self) -> bool:
        return any(b.state == "ready" for b in self.backends)

    async def probe_all(self) -> None:
        await asyncio.gather(*(self.probe(b) for b in self.backends))

    async def probe(self, backend: Backend) -> None:
        """One health check (and /props when ready); never raises."""
        before = (backend.state, backend.capacity)
        try:
            health = await self._client.get(backend.url + "/health", headers=backend.auth_headers(), timeout=self._timeout)
            if health.status_code == 503:
                backend.state, backend.detail = "loading", "llama-server is loading the model"
            elif health.status_code != 200:
                backend.state, backend.detail = "down", f"/health answered {health.status_code}"
            else:
                props = await self._client.get(backend.url + "/props", headers=backend.auth_headers(), timeout=self._timeout)
                props.raise_for_status()
                backend.props = props.json()
                self._apply_capacity(backend, capacity_from_props(backend.props, backend.config))
                backend.state, backend.detail = "ready", "ok"
        except (httpx.HTTPError, ValueError) as exc:
            backend.state, backend.detail = "down", f"{type(exc).__name__}: {exc}"[:200]
        if (backend.state, backend.capacity) != before:
            log.info("backend %s: %s (%s) capacity=%s", backend.name, backend.state, backend.detail, backend.capacity)
            if backend.gatekeeper is not None:
                backend.gatekeeper.advance()
            if self._on_change is not None:
                self._on_change()

    def _apply_capacity(self, backend: Backend, capacity: Capacity) -> None:
        if backend.gatekeeper is None:
            backend.controller = BudgetController(controller_settings(self._budget, capacity.ceiling))
            prefill = PrefillModel()
            admission = Admission(
                self._classes, capacity, budget=backend.controller.budget, tenant_policy=self._tenant_policy,
                aging_s=self._budget.aging_s or None,
                expected_ttft=lambda r, prefilling: prefill.expected_ttft(r.prompt_tokens, prefilling),
            )
            gatekeeper = backend.gatekeeper = Gatekeeper(
                admission, clock=self._clock, prefill=prefill, slo_ttft_s=self._budget.slo_ttft_p95_ms / 1000.0
            )

            def budget_changed(budget: int) -> None:
                admission.set_budget(budget)
                gatekeeper.advance()

            backend.controller.on_change(budget_changed)
            if self._on_created is not None:
                self._on_created(backend)  # operator state (paused classes, freeze) carries over
        elif backend.capacity != capacity:
            backend.gatekeeper.admission.set_capacity(capacity)
            if backend.controller is not None:
                backend.controller.set_ceiling(self._clock(), capacity.ceiling)  # pushes a clamped budget
        backend.capacity = capacity

    async def run(self, interval_s: float = 1.0) -> None:
        """Probe every backend forever; a down backend costs one refused connect per interval."""
        while True:
            await self.probe_all()
            await asyncio.sleep(interval_s)
