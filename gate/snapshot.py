"""GateSnapshot: one immutable picture of the gate per tick, all the console reads.

Widgets render snapshots and never reach into gate internals; building one is
cheap (no I/O) and happens on the gate's loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from gate.records import AuditRecord, DecisionRecord

Label = Literal["LIVE", "SIMULATED", "REVIEW"]


@dataclass(frozen=True, slots=True)
class SlotView:
    id: int
    n_ctx: int
    processing: bool
    n_prompt_tokens: int | None
    n_decoded: int | None


@dataclass(frozen=True, slots=True)
class BackendView:
    name: str
    url: str
    state: str  # ready | loading | down
    detail: str
    kv: str
    slots_busy: int  # reservations the gate holds (one per slot)
    slots_total: int | None
    slot_context: int | None
    ceiling: int | None
    budget: int | None
    in_flight: int
    prefilling: int
    queued: int
    slots: tuple[SlotView, ...] | None  # llama-server's own /slots, when polled
    decode_tps: float | None
    requests_deferred: int | None  # llama-server's own queue: must stay 0
    kv_bytes_per_token: int | None = None


@dataclass(frozen=True, slots=True)
class ClassView:
    name: str
    priority: int
    paused: bool
    reserved_tokens: int
    limit_tokens: int | None
    queue_depth: int
    queue_timeout_s: float
    default_max_tokens: int
    max_tokens_cap: int
    in_flight: int
    queued: int
    oldest_wait_s: float | None
    admitted_per_min: int
    refused_per_min: int
    p95_ttft_ms: float | None


@dataclass(frozen=True, slots=True)
class ControllerView:
    mode: str  # adaptive | static
    frozen: bool
    budget: int | None  # summed over backends
    min_tokens: int
    ceiling: int | None
    p95_ttft_ms: float | None
    p95_tpot_ms: float | None
    slo_ttft_ms: float
    slo_tpot_ms: float | None


@dataclass(frozen=True, slots=True)
class DenialView:
    reason: str
    cls: str
    last_1m: int
    last_5m: int
    last_15m: int


@dataclass(frozen=True, slots=True)
class JournalView:
    ok: bool
    path: str
    written: int
    dropped: int
    pending: int
    last_error: str | None


@dataclass(frozen=True, slots=True)
class GateSnapshot:
    ts: float  # wall clock
    label: Label
    listen: str
    operator: str
    backends: tuple[BackendView, ...]
    classes: tuple[ClassView, ...]
    controller: ControllerView
    gpu: Any  # gate.gpu.GpuReading (kept untyped here so snapshot never imports NVML code)
    denials: tuple[DenialView, ...]
    decisions: tuple[DecisionRecord, ...]  # newest last
    audit: tuple[AuditRecord, ...]  # newest last
    journal: JournalView | None
    reaped: int
    shutting_down: bool

    @property
    def budget(self) -> int | None:
        return self.controller.budget

    @property
    def in_flight(self) -> int:
        return sum(b.in_flight for b in self.backends)

    @property
    def queued(self) -> int:
        return sum(c.queued for c in self.classes)
