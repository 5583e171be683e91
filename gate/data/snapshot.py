"""GateSnapshot: one immutable picture of the gate per tick, all the console reads.

Widgets render snapshots and never reach into gate internals; building one is
cheap (no I/O) and happens on the gate's loop. A snapshot is plain data: over
the control socket it travels as JSON (`gate.wire`), versioned by
SNAPSHOT_VERSION, and the same console renders it whichever way it came.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from gate.data.records import AuditRecord, DecisionRecord

SNAPSHOT_VERSION = 1
GIB = 1024**3

Label = Literal["LIVE", "SIMULATED", "REVIEW"]


@dataclass(frozen=True, slots=True)
class GpuProcess:
    pid: int
    used_bytes: int | None  # None: NVML does not know (e.g. WDDM, or not permitted)
    name: str = ""  # when the gate knows what it is (the demo's simulated llama-server)


@dataclass(frozen=True, slots=True)
class GpuDevice:
    index: int
    name: str
    used_bytes: int
    total_bytes: int
    reserved_bytes: int | None  # memory info v2 only (driver-reserved); None with v1
    utilization_pct: int | None  # None: not supported on this device
    processes: tuple[GpuProcess, ...]


@dataclass(frozen=True, slots=True)
class GpuReading:
    devices: tuple[GpuDevice, ...]
    unavailable: str | None  # why there are no numbers; when set, devices == ()

    @classmethod
    def failed(cls, reason: str) -> GpuReading:
        return cls(devices=(), unavailable=reason)


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
    metrics_off: bool = False  # llama-server answers /metrics 501 (no --metrics): deferred and rates n/a
    kv_bytes_per_token: int | None = None
    prefill_tok_s: float | None = None  # measured prompt tokens/s (None until measured)
    prefill_cap: int | None = None  # prompt tokens that may prefill at once (None: no cap)
    prefill_cap_auto: bool = False  # the cap is automatic (from measurements; None until measured), not configured
    #: TTFT protection (#25): "" = in force on the fitted prefill model; else why it is
    #: partial or off ("measured TTFT", "no first token yet", "no hold times yet")
    ttft_guard: str = ""
    # The budget an aged request was let in at, above the controller's, while it runs (E3); None: none.
    stretched_to: int | None = None
    #: llama-server's /slots and /metrics could not be read lately: slots, decode rate and
    #: deferred are the last values read, old (telemetry_error says why)
    telemetry_stale: bool = False
    telemetry_error: str | None = None
    #: slots llama-server reports busy beyond the gate's own requests: traffic that bypassed it
    bypass_slots: int = 0
    kv_source: str = ""  # how `kv` was learned: server | process | config | assumed
    kv_detail: str = ""
    #: what the capacity contradicts (config kv, min_tokens or reservations above the ceiling)
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ModelView:
    """One model of a llama-server in router mode (its capacity unit is `unit` in `backends`)."""

    backend: str  # the router backend's name
    name: str
    unit: str  # "backend/model": its BackendView and telemetry name
    status: str  # unknown | unloaded | loading | loaded | sleeping | evicting | failed | missing
    detail: str
    pinned: bool
    slots_busy: int  # requests in flight (one slot each)
    slots_total: int | None  # while loaded
    slot_context: int | None
    in_flight: int  # tokens
    queued: int
    last_load_s: float | None
    loads: int
    evictions: int
    failures: int
    idle_s: float | None  # None while requests are in flight
    models_max: int  # the router's --models-max (0: no limit)
    requests_deferred: int | None = None  # llama-server's own queue for this model: must stay 0


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
    p95_ttft_ms: float | None  # first token from dispatch, last minute (the controller's kind of signal)
    p95_queue_ms: float | None = None  # time in the gate's queue, last minute, every outcome
    waiting_on: str = ""  # what keeps its oldest waiter waiting now ("slots 4/4 busy", "paused", ...)
    #: arrivals of the last minute that met their first-token objective (from arrival, queue
    #: included), and those judged: refusals count as misses, client errors and cancels not at all
    met: int = 0
    judged: int = 0
    #: what "met" is judged by: the class's ttft_objective_ms, else [budget] slo_ttft_p95_ms
    ttft_objective_ms: float | None = None
    #: the class's own ttft_objective_ms (None: it is held to [budget] slo_ttft_p95_ms)
    own_ttft_objective_ms: float | None = None
    #: its reservation in force, the smallest of the backends' (R0: reserved_tokens scaled down
    #: where the reservations add up to more than half a backend's ceiling); None: no core yet
    reserved_in_force: int | None = None
    #: the first-token time from dispatch the class gets now: the median of its own over the last
    #: minutes, else of llama-server's last first tokens, every class (None: too few to say)
    first_token_ms: float | None = None
    #: its objective is below first_token_ms, in plain words ("" when it is not): admitted
    #: requests miss it even with no wait in the queue, whatever admission does
    objective_below_ttft: str = ""
    #: p95 first token from arrival, last minute, its queue wait included: what its clients saw,
    #: the figure its objective (ttft_objective_ms) is about (None: no first token, or an older gate)
    p95_ttft_arrival_ms: float | None = None


@dataclass(frozen=True, slots=True)
class ControllerView:
    mode: str  # adaptive | static
    frozen: bool
    budget: int | None  # summed over backends
    min_tokens: int
    ceiling: int | None
    p95_ttft_ms: float | None  # the controller's input: smoothed, None until it has min_samples
    p95_tpot_ms: float | None
    slo_ttft_ms: float
    slo_tpot_ms: float | None
    #: the worst class's p95 TTFT from dispatch over the last minute: the kind of signal the
    #: adaptive controller closes on, against slo_ttft_ms (the classes table shows each class's
    #: from arrival, against its own objective)
    p95_ttft_ms_1m: float | None = None
    samples: int = 0  # the controller's samples in its window
    min_samples: int = 0  # what it needs before it moves
    #: [budget] min_tokens is 0: the floor shown is the auto one (a share of the ceiling, at
    #: least the reservations in force), which binds no reservation
    min_tokens_auto: bool = False
    #: the most the classes' reservations may add up to on the smallest backend (R0: half its
    #: ceiling); beyond it they are scaled down there, in proportion. None: no capacity known
    reserved_max: int | None = None
    #: while frozen, who froze it, as the audit says ("by alice", "kept from the last run");
    #: "" when not frozen or the row is no longer in the recent audit
    frozen_by: str = ""


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
    gpu: GpuReading | None
    denials: tuple[DenialView, ...]
    decisions: tuple[DecisionRecord, ...]  # newest last; only those after the asked-for sequence number
    audit: tuple[AuditRecord, ...]  # newest last
    journal: JournalView | None
    reaped: int
    shutting_down: bool
    gate_id: str = ""
    decisions_seq: int = 0  # decisions finished since the gate started: ask for those after it next time
    requests_in_flight: int = 0  # holding a reservation or waiting in a queue
    drain_grace_s: float = 0.0  # how long a stop lets in-flight requests finish
    #: tenant limits shared through Redis: off | ok | fail_open | fail_closed (the policy applies)
    shared: str = "off"
    models: tuple[ModelView, ...] = ()  # router mode only: every configured model
    #: the operator's runtime changes in force over the config file (restored at a restart;
    #: dropped with the drop_overrides command or `tokengate overrides drop`)
    overrides: tuple[str, ...] = ()
    #: why the overrides in force are not in their file (a full or read-only disk): a restart
    #: would revert them; "" when kept (the gate retries the write every second)
    overrides_not_kept: str = ""
    #: the config file the gate was started from and its reload (SIGHUP) re-reads, resolved; ""
    #: when not known (a gate before this field, or one started without a file)
    config_path: str = ""

    @property
    def budget(self) -> int | None:
        return self.controller.budget

    @property
    def in_flight(self) -> int:
        return sum(b.in_flight for b in self.backends)

    @property
    def queued(self) -> int:
        return sum(c.queued for c in self.classes)


def _gib(n: int) -> str:
    return f"{n / GIB:.1f}"


def format_reading(reading: GpuReading, labels: Mapping[int, str] | None = None) -> list[str]:
    """Console lines: ``"n/a: <reason>"`` or one line per device, e.g.
    ``"GPU0 NVIDIA H200  61.2/139.8 GiB  44%"``.

    ``labels`` maps PIDs to names (e.g. the llama-server processes); each
    matching compute process gets an indented line with its own memory.
    """
    if reading.unavailable is not None:
        return [f"n/a: {reading.unavailable}"]
    lines: list[str] = []
    for dev in reading.devices:
        util = "n/a" if dev.utilization_pct is None else f"{dev.utilization_pct}%"
        lines.append(f"GPU{dev.index} {dev.name}  {_gib(dev.used_bytes)}/{_gib(dev.total_bytes)} GiB  {util}")
        for proc in dev.processes:
            label = labels.get(proc.pid) if labels else None
            label = label or proc.name
            if label:
                used = "n/a" if proc.used_bytes is None else f"{_gib(proc.used_bytes)} GiB"
                lines.append(f"  {label} (pid {proc.pid})  {used}")
    return lines
