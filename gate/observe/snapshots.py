"""The snapshot builder: the gate's state now, as one immutable `GateSnapshot` for consoles.

Reads the backends, the recorder and the values the caller passes (the operator state, the
gate's life); computes nothing twice per snapshot and never blocks. A snapshot costs the same
at 10 and at 1,000 requests per second: it carries at most `max_decisions` new decisions.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gate.backend.pool import Backend, BackendPool
from gate.backend.telemetry import BackendTelemetry
from gate.config import Config
from gate.core.admission import RESERVED_SHARE_MAX
from gate.core.rollup import Rollup
from gate.data.snapshot import (
    BackendView,
    ClassView,
    ControllerView,
    DenialView,
    GateSnapshot,
    GpuReading,
    JournalView,
    Label,
    SlotView,
)
from gate.observe.recorder import Recorder, class_totals


@dataclass(frozen=True, slots=True)
class GateState:
    """What the snapshot shows of the gate itself, from the owners of each value."""

    label: Label
    listen: str
    operator: str
    gate_id: str
    paused: frozenset[str]
    frozen: bool
    shutting_down: bool
    requests_in_flight: int
    drain_grace_s: float
    shared: str
    gpu: GpuReading | None
    overrides: tuple[str, ...] = ()  # the operator's runtime changes in force (gate/ops/overrides.py)
    overrides_not_kept: str = ""  # why they are not in their file for a restart ("": kept)
    config_path: str = ""  # the file the gate was started from, resolved ("": not known)


class BypassWatch:
    """Slots llama-server reports busy beyond the gate's own requests (traffic that bypassed the
    gate), as seen on two telemetry reads in a row. One read raced the gate's own releases: a
    /slots answer written just before a stream's end, read just after the gate let its slot go,
    showed "+1 bypassing the gate" with nothing else connected (a trial: 3 of 60 frames). A
    client that really bypasses the gate holds a slot across reads."""

    def __init__(self) -> None:
        self._excess: dict[str, tuple[float, int]] = {}  # backend -> (the read's time, its excess)
        self.slots: dict[str, int] = {}  # backend -> the excess of both of its last two reads

    def read(self, latest: Mapping[str, BackendTelemetry], units: Iterable[Backend]) -> None:
        """A telemetry round: each backend's excess now, against the gate's slots now."""
        for b in units:
            tel = latest.get(b.name)
            if tel is None or tel.stale or b.state != "ready" or tel.busy_slots is None:
                self._excess.pop(b.name, None)
                self.slots.pop(b.name, None)
                continue
            last = self._excess.get(b.name)
            if last is not None and last[0] == tel.ts:
                continue  # no new read of this backend
            excess = max(0, tel.busy_slots - (b.admission.ledger.slots if b.admission else 0))
            self._excess[b.name] = (tel.ts, excess)
            self.slots[b.name] = min(excess, last[1]) if last is not None else 0


def build_snapshot(
    state: GateState,
    config: Config,
    backends: BackendPool,
    recorder: Recorder,
    telemetry: Mapping[str, BackendTelemetry],
    *,
    bypass: Mapping[str, int] | None = None,
    decisions_after: int = 0,
    max_decisions: int = 200,
) -> GateSnapshot:
    """`bypass`: `BypassWatch.slots` (none: nothing is said to bypass the gate)."""
    now = recorder.clock()
    rollup = recorder.rollup
    counts = rollup.counts(now, 60)
    units = tuple(backends)
    views = tuple(_backend_view(b, telemetry.get(b.name), (bypass or {}).get(b.name, 0)) for b in units)
    totals = class_totals(units, (c.name for c in config.classes))
    classes = []
    for c in config.classes:
        oldest, waiting_on = _oldest_wait(units, c.name, now)
        met, judged = rollup.met_share(now, c.name)
        classes.append(
            ClassView(
                name=c.name,
                priority=c.priority,
                paused=c.name in state.paused,
                reserved_tokens=c.reserved_tokens,
                limit_tokens=c.limit_tokens,
                queue_depth=c.queue_depth,
                queue_timeout_s=c.queue_timeout_s,
                default_max_tokens=c.default_max_tokens,
                max_tokens_cap=c.max_tokens_cap,
                in_flight=totals[c.name].in_flight,
                queued=totals[c.name].queued,
                oldest_wait_s=oldest,
                admitted_per_min=sum(n for (cls, o, _), n in counts.items() if cls == c.name and o == "admitted"),
                refused_per_min=sum(n for (cls, o, _), n in counts.items() if cls == c.name and o == "refused"),
                p95_ttft_ms=rollup.p95_ttft_ms(now, c.name),
                p95_ttft_arrival_ms=rollup.p95_ttft_arrival_ms(now, c.name),
                p95_queue_ms=rollup.p95_queue_ms(now, c.name),
                waiting_on=waiting_on,
                met=met,
                judged=judged,
                ttft_objective_ms=config.objective_ms(c.name),
                own_ttft_objective_ms=c.ttft_objective_ms,
                reserved_in_force=min((a.reserved(c.name) for b in units if (a := b.admission) is not None), default=None),
                **_first_token_view(config, units, rollup, c.name, now),
            )
        )
    journal = None
    if recorder.journal is not None:
        h = recorder.journal.health
        journal = JournalView(h.ok, h.path, h.written, h.dropped, h.pending, h.last_error)
    return GateSnapshot(
        ts=time.time(),
        label=state.label,
        listen=state.listen,
        operator=state.operator,
        backends=views,
        classes=tuple(classes),
        controller=dataclasses.replace(
            _controller_view(units, config, state.frozen),
            p95_ttft_ms_1m=max((c.p95_ttft_ms for c in classes if c.p95_ttft_ms is not None), default=None),
            frozen_by=_frozen_by(recorder) if state.frozen else "",
        ),
        gpu=state.gpu,
        denials=tuple(DenialView(reason, cls, *n) for (reason, cls), n in rollup.denials(now).items()),
        decisions=tuple(recorder.records.since(decisions_after, max_decisions)),
        audit=tuple(recorder.recent_audit)[-50:],
        journal=journal,
        reaped=sum(b.gatekeeper.reaped for b in units if b.gatekeeper),
        shutting_down=state.shutting_down,
        gate_id=state.gate_id,
        decisions_seq=recorder.records.total,
        requests_in_flight=state.requests_in_flight,
        drain_grace_s=state.drain_grace_s,
        shared=state.shared,
        overrides=state.overrides,
        overrides_not_kept=state.overrides_not_kept,
        config_path=state.config_path,
        models=tuple(v for fleet in backends.fleets for v in fleet.views(dict(telemetry))),
    )


#: first tokens a median needs before the gate compares an objective with it
MIN_FIRST_TOKENS = 5
#: how far back a class's own first tokens count: the minute the p95 beside it reads (a slow
#: class falls back to every class's recent median). Its samples are sorted at each snapshot:
#: up to 256 a second per class are kept (gate/core/rollup.py), 15,360 a minute at any rate,
#: where five minutes were 76,800 a class at 1,000 req/s
FIRST_TOKEN_WINDOW_S = 60


def first_token_now(rollup: Rollup, units: Iterable[Backend], cls: str, now: float) -> tuple[float | None, str]:
    """The first-token time from dispatch class `cls` gets now, in ms, and what it is the median
    of: its own first tokens over FIRST_TOKEN_WINDOW_S when there are MIN_FIRST_TOKENS of them,
    else the smallest of the backends' medians of their last first tokens, every class (the
    prefill model's `recent_ttft`). (None, "") when neither has enough. Both exist already: the
    console's snapshot and /health read them, the request path does nothing more."""
    median, n = rollup.median_ttft_ms(now, cls, FIRST_TOKEN_WINDOW_S)
    if median is not None and n >= MIN_FIRST_TOKENS:
        return median, f"median from dispatch of its last {n} first tokens"
    recent = [
        r * 1000
        for b in units
        if (gk := b.gatekeeper) is not None and gk.prefill.points >= MIN_FIRST_TOKENS and (r := gk.prefill.recent_ttft()) is not None
    ]
    if recent:
        return min(recent), "median from dispatch, every class"
    return None, ""


def objective_gap(objective_ms: float | None, first_token_ms: float | None, basis: str) -> str:
    """Why no admission policy can meet the objective, or "" when it is not below the first
    token llama-server delivers now (a newcomer that fits is admitted and misses it anyway)."""
    if not objective_ms or first_token_ms is None or objective_ms >= first_token_ms:
        return ""
    return (
        f"objective {_duration(objective_ms)} < llama-server's first token now {_duration(first_token_ms)} ({basis}): "
        "admitted requests miss it whatever the queue does; raise it or add capacity"
    )


def objective_gaps(config: Config, units: Iterable[Backend], recorder: Recorder) -> dict[str, dict[str, Any]]:
    """/health's `objective_below_ttft`: per class whose objective is below its first token now."""
    now = recorder.clock()
    units = tuple(units)
    out: dict[str, dict[str, Any]] = {}
    for c in config.classes:
        view = _first_token_view(config, units, recorder.rollup, c.name, now)
        if view["objective_below_ttft"]:
            out[c.name] = {
                "objective_ms": config.objective_ms(c.name),
                "first_token_ms": round(view["first_token_ms"], 1),
                "note": view["objective_below_ttft"],
            }
    return out


class ObjectiveGapsMemo:
    """objective_gaps for /health, worked out at most once a second of the recorder's clock (or
    at once when the config changes: a retune is seen by the next probe). A probe reads an answer
    at most a second old. Each computation sorts up to 15,360 first tokens a class: 3.9 ms a
    class on this 2-core host (timeit, 60 s of 256 a second, the host busy), so a probe every
    50 ms with two busy classes would take ~16% of the event loop."""

    def __init__(self) -> None:
        self._key: tuple[int, Config] | None = None
        self._answer: dict[str, dict[str, Any]] = {}

    def __call__(self, config: Config, units: Iterable[Backend], recorder: Recorder) -> dict[str, dict[str, Any]]:
        key = (int(recorder.clock()), config)
        if self._key is None or self._key[0] != key[0] or self._key[1] is not config:
            self._answer, self._key = objective_gaps(config, units, recorder), key
        return self._answer


def _first_token_view(config: Config, units: tuple[Backend, ...], rollup: Rollup, cls: str, now: float) -> dict[str, Any]:
    first, basis = first_token_now(rollup, units, cls, now)
    return {"first_token_ms": first, "objective_below_ttft": objective_gap(config.objective_ms(cls), first, basis)}


def _duration(ms: float) -> str:
    """1 ms, 850 ms, 2.3 s: as an operator reads an objective."""
    return f"{ms:.0f} ms" if ms < 1000 else f"{ms / 1000:.3g} s"


def _backend_view(b: Backend, tel: BackendTelemetry | None, bypass: int = 0) -> BackendView:
    adm, cap = b.admission, b.capacity
    return BackendView(
        name=b.name,
        url=b.url,
        state=b.state,
        detail=b.detail,
        kv=b.layout.kv if b.layout else b.config.kv,
        kv_source=b.layout.source if b.layout else "",
        kv_detail=b.layout.detail if b.layout else "",
        warnings=b.warnings,
        # A backend that is down has no live telemetry, whatever the poller still holds.
        telemetry_stale=tel is not None and (tel.stale or b.state != "ready"),
        telemetry_error=None if tel is None else (tel.error or (None if b.state == "ready" else f"backend {b.state}")),
        bypass_slots=0 if tel is None or tel.stale or b.state != "ready" else bypass,
        slots_busy=adm.ledger.slots if adm else 0,
        slots_total=cap.slots if cap else None,
        slot_context=cap.slot_context if cap else None,
        ceiling=cap.ceiling if cap else None,
        # (a router's model before its first load has no capacity: its provisional 2^30 budget
        # is no figure to show; a trial's line read "budget 1,073,741,824/n/a")
        budget=adm.budget if adm and cap else None,
        in_flight=adm.ledger.in_flight if adm else 0,
        prefilling=adm.ledger.prefilling if adm else 0,
        queued=adm.waiting() if adm else 0,
        slots=None
        if tel is None or tel.slots is None
        else tuple(SlotView(s.id, s.n_ctx, s.processing, s.n_prompt_tokens, s.n_decoded) for s in tel.slots),
        decode_tps=None if tel is None else tel.decode_tps,
        requests_deferred=None if tel is None else tel.requests_deferred,
        metrics_off=tel is not None and "/metrics" in tel.off,
        kv_bytes_per_token=b.kv_bytes_per_token,
        stretched_to=adm.stretched_to if adm else None,
        **_prefill_view(b),
    )


def _oldest_wait(units: Iterable[Backend], cls: str, now: float) -> tuple[float | None, str]:
    """The class's longest wait over the backends, and what that waiter waits on."""
    oldest: float | None = None
    waiting_on = ""
    for b in units:
        if b.admission is None:
            continue
        enq = b.admission.queue(cls).oldest_enqueued_at()
        if enq is not None and now - enq >= (oldest or 0.0):
            oldest = now - enq
            waiting_on = b.admission.waiting_on(cls)
            if b.fleet is not None and b.model is not None and not b.fleet.loaded(b) and waiting_on:
                waiting_on = f"model {b.fleet.info[b.model].status}"
    return oldest, waiting_on


def _controller_view(units: tuple[Backend, ...], config: Config, frozen: bool) -> ControllerView:
    controllers = [b.controller for b in units if b.controller is not None]
    ttfts = [c.p95_ttft_s for c in controllers if c.p95_ttft_s is not None]
    tpots = [c.p95_tpot_s for c in controllers if c.p95_tpot_s is not None]
    budgets = [b.admission.budget for b in units if b.admission is not None and b.capacity is not None]
    ceilings = [b.capacity.ceiling for b in units if b.capacity is not None]
    # the floor in force: clamped to each backend's ceiling (the backend's warnings say so); a
    # router's model not loaded yet has no capacity, and its provisional controller's floor (a
    # quarter of 2^30) is nothing in force (a trial's header read [268,436,480..4,096])
    floors = [b.controller for b in units if b.controller is not None and b.capacity is not None]
    return ControllerView(
        mode=config.budget.mode,
        frozen=frozen,
        budget=sum(budgets) if budgets else None,
        min_tokens=sum(c.min_tokens for c in floors) if floors else config.budget.min_tokens,
        ceiling=sum(ceilings) if ceilings else None,
        p95_ttft_ms=max(ttfts) * 1000 if ttfts else None,
        p95_tpot_ms=max(tpots) * 1000 if tpots else None,
        slo_ttft_ms=config.budget.slo_ttft_p95_ms,
        slo_tpot_ms=config.budget.slo_tpot_p95_ms,
        samples=max((c.samples for c in controllers), default=0),
        min_samples=config.budget.min_samples,
        min_tokens_auto=not config.budget.min_tokens,
        reserved_max=min((int(c * RESERVED_SHARE_MAX) for c in ceilings), default=None),
    )


def _frozen_by(recorder: Recorder) -> str:
    """Who froze the controller: the newest freeze in the recent audit (searched only while frozen)."""
    for r in reversed(recorder.recent_audit):
        if r.target != "controller":
            continue
        if r.action == "freeze":
            return f"by {r.operator}"
        if r.action == "restored" and r.new_value == "frozen":
            return "kept from the last run"
        if r.action == "unfreeze":
            break
    return ""


def _prefill_view(b: Backend) -> dict[str, Any]:
    """The measured prefill rate and the prefill cap in force, for the console."""
    gk = b.gatekeeper
    if gk is None:
        return {}
    configured = gk.admission.capacity.max_prefill_tokens
    cap = gk.admission.prefill_cap_auto if configured is None else (configured or None)
    return {"prefill_tok_s": gk.prefill.rate, "prefill_cap": cap, "prefill_cap_auto": configured is None, "ttft_guard": ttft_guard(gk)}


def ttft_guard(gk: Any) -> str:
    """Whether early refusals against the TTFT objectives are in force, and on what (#25)."""
    missing = []
    if gk.admission.holds.mean_s is None:
        missing.append("no hold times yet")
    source = gk.prefill.source
    if source == "":
        missing.append("no first token yet")
    elif source == "measured":
        missing.append("measured TTFT (no prefill fit)")
    return ", ".join(missing)
