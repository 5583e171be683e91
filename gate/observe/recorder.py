"""The recorder: where every finished request, audit row and per-second sample goes.

One object owns the in-memory tail (`records`, `recent_audit`), the rollups the console and
the samples read, the journal writer and the Prometheus gauges fed from them. The request
path calls `record` and `committed`; the operator layer calls `audit`; the housekeeping loop
calls `write_samples` and `refresh_metrics`. The per-class in-flight and queued sums are
computed once here (`class_totals`), for the samples, the gauges and the snapshot alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from gate.backend.pool import Backend, BackendPool
from gate.core.adaptive import Cause, Move
from gate.core.rollup import Rollup
from gate.data.commands import Operator
from gate.data.records import (
    CAPACITY_LEARNED,
    SHARED_GATES,
    AuditRecord,
    AuditSource,
    ClassSample,
    DecisionRecord,
    RecentDecisions,
    SampleRecord,
)
from gate.data.snapshot import GpuReading
from gate.fleet.sharedlimits import Flip, gates_phrase
from gate.journal import Journal
from gate.observe.metrics import GateMetrics

log = logging.getLogger("tokengate.service")


#: refusals that are the gate's (overload, limits, shutdown): misses. A client's own errors
#: (400, 401, 413) and cancels say nothing about service and are not judged.
_MISSED_STATUS = frozenset({429, 500, 502, 503, 504})


def judge(record: DecisionRecord, ttft_total_s: float | None, objective_ms: float | None) -> bool | None:
    """Did this arrival meet its objective? None: not judged. An admitted request without a
    first-token time (embeddings, rerank, a plain Messages or Responses answer: nothing dates
    its first token) is not judged: counted as a miss, five plain /v1/messages answered in
    70-110 ms read "met 0%" in a user's trial (2026-12-05)."""
    if objective_ms is None or not record.cls:
        return None
    if record.outcome == "admitted":
        return None if ttft_total_s is None else ttft_total_s * 1000 <= objective_ms
    if record.outcome == "cancelled":
        return None
    return False if record.outcome == "failed" or record.http_status in _MISSED_STATUS else None


def audit_change(old: str | None, new: str | None) -> str:
    """An audit row's change as its log line says it: "old -> new " ("(none)" for a side not
    set), nothing when neither is (every stop and start read "gate: None -> None signal SIGTERM")."""
    if old is None and new is None:
        return ""
    return f"{'(none)' if old is None else old} -> {'(none)' if new is None else new} "


@dataclass(frozen=True, slots=True)
class ClassTotals:
    """One class over every backend: tokens in flight, requests queued."""

    in_flight: int = 0
    queued: int = 0


def class_totals(backends: Iterable[Backend], classes: Iterable[str]) -> dict[str, ClassTotals]:
    """Per class, summed over the backends that have a core: the one place these sums are made."""
    totals = {c: [0, 0] for c in classes}
    for b in backends:
        adm = b.admission
        if adm is None:
            continue
        for cls in adm.class_names:
            t = totals.setdefault(cls, [0, 0])
            t[0] += adm.ledger.class_tokens(cls)
            t[1] += len(adm.queue(cls))
    return {c: ClassTotals(*t) for c, t in totals.items()}


class Recorder:
    """Decision rows, audit rows and samples: journaled, kept for the console, counted."""

    def __init__(self, metrics: GateMetrics, *, gate_id: str, clock: Callable[[], float]) -> None:
        self.metrics = metrics
        self.gate_id = gate_id
        self.clock = clock
        self.journal: Journal | None = None
        self.records = RecentDecisions()
        self.recent_audit: deque[AuditRecord] = deque(maxlen=1000)
        self.rollup = Rollup()
        #: called with every audit row (consoles attached over the socket toast them)
        self.audit_listeners: list[Callable[[AuditRecord], None]] = []

    # ---- audit ----------------------------------------------------------------

    async def resume(self, operator: Operator, objective_ms: Callable[[str], float | None] | None = None) -> None:
        """At start: the console's view from the journal's last 15 minutes, and an audit row
        `unclean_end` when the previous gate on this journal never wrote `stopped`.
        `objective_ms`: each class's first-token objective, to judge the history's arrivals by."""
        await self.seed_from_journal(objective_ms=objective_ms)
        unclean = await self.previous_end()
        if unclean:
            log.warning("%s", unclean)
            self.audit_event("unclean_end", "gate", unclean, operator=operator)

    def backend_changed(self, backend: str, old: str, new: str, detail: str, operator: Operator) -> None:
        """A backend became ready or stopped being: an audit row (a crash marks the review's chart)."""
        self.audit_event(
            "backend_up" if new == "ready" else "backend_down",
            f"backend:{backend}",
            "ready" if new == "ready" else detail,
            operator=operator,
            old_value=old,
            new_value=new,
        )

    def capacity_learned(
        self, backend: str, capacity: Any, kv: str | None, how: str, operator: Operator, *, chat_template_tokens: int | None = None
    ) -> None:
        """A ready backend's capacity, learned or changed: an audit row in the journal (not in
        the console's list of changes: nobody changed anything) whose value `tokengate replay`
        reads for its backend model (slots, KV layout, context per slot, llama-server's KV pool:
        `ceiling` is the configured token_budget when there is one, `pool` what the server holds),
        and `tokengate log --format aiperf` its ``chat_template_tokens``: what the chat template adds
        to a chat's prompt count (null: not measured; absent in rows of gates before it was kept)."""
        pool = capacity.ceiling if getattr(capacity, "pool", None) is None else capacity.pool
        value = {
            "slots": capacity.slots,
            "kv": kv,
            "slot_context": capacity.slot_context,
            "ceiling": capacity.ceiling,
            "pool": pool,
            "chat_template_tokens": chat_template_tokens,
        }
        slots = f"{capacity.slots} slot{'' if capacity.slots == 1 else 's'}"
        note = f"{slots} of {capacity.slot_context} tokens, {kv or 'unknown'} KV ({how}), ceiling {capacity.ceiling}" + (
            "" if pool == capacity.ceiling else f", pool {pool}"
        )
        if chat_template_tokens is not None:
            note += f", chat template {chat_template_tokens} tokens"
        self._journal_only(CAPACITY_LEARNED, f"backend:{backend}", None, json.dumps(value, sort_keys=True), note, operator)

    def _journal_only(self, action: str, target: str, old: str | None, new: str, note: str, operator: Operator) -> None:
        """An audit row of what the gate learned, for the journal only: not in the console's
        list of changes (nobody changed anything)."""
        if self.journal is not None:
            self.journal.add(
                AuditRecord(
                    ts=time.time(),
                    operator=operator.name,
                    origin=operator.origin,
                    source="gate",
                    action=action,
                    target=target,
                    old_value=old,
                    new_value=new,
                    note=note,
                    gate_id=self.gate_id,
                )
            )

    async def seed_from_journal(
        self, window_s: float = 900.0, *, limit: int = 20_000, objective_ms: Callable[[str], float | None] | None = None
    ) -> int:
        """Start the live view from the journal's recent history, not empty: the decisions of
        the last `window_s` (the rollups' horizon: denials, rates, p95s, the tail, and whether
        each arrival met its class's objective, by `objective_ms`) and the recent audit rows,
        as a restarted gate's console should show them. How many decisions."""
        from gate.journal.rows import decision_from_row

        if self.journal is None:
            return 0
        wall, mono = time.time(), self.clock()
        try:
            rows = await self.journal.decisions_page(limit=limit, since_ts=wall - window_s)
            audit = await self.journal.audit_rows(since_ts=wall - window_s, limit=self.recent_audit.maxlen)
        except Exception as exc:  # noqa: BLE001 - a history we cannot read is no reason not to start
            log.warning("journal history not read (%s): the console starts empty", exc)
            return 0
        records = sorted((decision_from_row(r) for r in rows), key=lambda r: r.ts + (r.duration_ms or 0) / 1000)
        for r in records:
            ended = r.ts + (r.duration_ms or 0) / 1000
            self.records.add(r)
            # Judged as `record` judges it: without it the restarted console read "met 100%"
            # (its own few arrivals) beside the last gate's minute of refusals in "ref/m".
            total_s = None if r.ttft_arrival_ms is None else r.ttft_arrival_ms / 1000
            met = judge(r, total_s, objective_ms(r.cls)) if objective_ms is not None and r.cls else None
            self.rollup.add(
                mono - max(0.0, wall - ended), r.cls, r.outcome, r.reason, r.ttft_ms, r.queue_ms, met=met, ttft_arrival_ms=r.ttft_arrival_ms
            )
        fields = {f.name for f in dataclasses.fields(AuditRecord)}
        for a in audit:
            self.recent_audit.append(AuditRecord(**{k: v for k, v in a.items() if k in fields}))
        return len(records)

    async def previous_end(self) -> str | None:
        """How the previous gate on this journal ended, when not cleanly: a note for the audit
        row `unclean_end` (its last life row was `started` or `stopping`, never `stopped`)."""
        if self.journal is None:
            return None
        try:
            rows = await self.journal.audit_rows(limit=500)
        except Exception:  # noqa: BLE001
            return None
        life = [r for r in rows if r.get("target") == "gate" and r.get("action") in ("started", "stopping", "stopped")]
        if not life or life[-1]["action"] == "stopped" or life[-1].get("gate_id") == self.gate_id:
            return None
        last = life[-1]
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(last["ts"]))
        dropped = 0
        if last.get("gate_id"):  # its journal failing at the end drops `stopped` with the rest
            with contextlib.suppress(Exception):
                mine = [r for r in await self.journal.samples(since_ts=last["ts"], limit=50) if r.get("gate_id") == last["gate_id"]]
                dropped = max((int(r.get("journal_dropped") or 0) for r in mine), default=0)
        if dropped:
            return (
                f"the previous gate {last.get('gate_id')} left no 'stopped' row, and its journal was dropping rows "
                f"({dropped} rows by its last sample): it may have stopped cleanly with that row dropped, or been "
                f"killed; its last life row: {last['action']} at {when}"
            )
        return (
            f"the previous gate {last.get('gate_id') or '?'} ended without 'stopped' (killed or crashed); "
            f"its last life row: {last['action']} at {when}"
        )

    def audit(self, record: AuditRecord) -> None:
        """One operator or controller change: kept for the console, journaled, told to listeners."""
        if not record.gate_id:
            record = dataclasses.replace(record, gate_id=self.gate_id)
        self.recent_audit.append(record)
        if self.journal is not None:
            self.journal.add(record)
        for listener in tuple(self.audit_listeners):
            listener(record)
        log.info(
            "audit %s@%s %s %s %s: %s%s",
            record.operator,
            record.origin,
            record.source,
            record.action,
            record.target,
            audit_change(record.old_value, record.new_value),
            record.note,
        )

    def audit_event(
        self,
        action: str,
        target: str,
        note: str,
        *,
        operator: Operator,
        source: AuditSource = "gate",
        old_value: str | None = None,
        new_value: str | None = None,
    ) -> None:
        """An audit row the gate writes about itself (its life, a model, a controller move)."""
        self.audit(
            AuditRecord(
                ts=time.time(),
                operator=operator.name,
                origin=operator.origin,
                source=source,
                action=action,
                target=target,
                old_value=old_value,
                new_value=new_value,
                note=note,
            )
        )

    def budget_moved(self, backend: str, move: Move, slo_ttft_ms: float, *, asked: int | None = None) -> None:
        """The controller moved a backend's budget: an audit row (source=controller). `asked`:
        an operator's budget (set by hand, frozen, fixed) the move clamps or brings back."""
        ttft = "n/a" if move.p95_ttft_s is None else f"{move.p95_ttft_s * 1000:.0f} ms"
        why = f"p95 TTFT {ttft} vs SLO {slo_ttft_ms:g} ms over {move.samples} samples"
        if move.cause == Cause.CEILING_CHANGED:
            why = "llama-server's capacity changed (restarted with another pool)"
            if asked is not None and asked != move.new_budget:
                why += f": the operator's budget of {asked} is outside the bounds now; {move.new_budget} in force until they allow {asked} again"
            elif asked is not None:
                why += f": the operator's budget of {asked} is in force again"
        elif move.largest_ttft_s is not None:  # reopened on few samples (gate/core/adaptive.py)
            why = (
                f"largest TTFT {move.largest_ttft_s * 1000:.0f} ms vs SLO {slo_ttft_ms:g} ms over {move.samples} "
                f"sample{'' if move.samples == 1 else 's'}, too few for a p95: "
                f"{'it is' if move.samples == 1 else 'every one'} well under it, so the budget reopens"
            )
        self.audit_event(
            f"budget_{move.cause}",
            f"backend:{backend}",
            why,
            operator=Operator("controller", "local"),
            source="controller",
            old_value=str(move.old_budget),
            new_value=str(move.new_budget),
        )

    def shared_gates_counted(self, old: int | None, new: int, operator: Operator) -> None:
        """The gates counted on Redis changed (old None: the first count since start): the log,
        and an audit row in the journal only (nobody changed anything), which a gate started
        while Redis is out of reach reads back (:meth:`remembered_gates`)."""
        note = f"{new} {'gate shares' if new == 1 else 'gates share'} the tenant limits through Redis" + (
            "" if old is None else f" ({old} before)"
        )
        log.info("shared limits: %s", note)
        self._journal_only(SHARED_GATES, "gate", None if old is None else str(old), str(new), note, operator)

    async def remembered_gates(self) -> int | None:
        """N as this journal last recorded it (:meth:`shared_gates_counted`), or None."""
        if self.journal is None:
            return None
        try:
            row = await self.journal.last_audit(SHARED_GATES)
            return int(row["new_value"]) if row else None
        except Exception:  # noqa: BLE001 (a journal that cannot be read: N is not remembered)
            return None

    def shared_flipped(self, flip: Flip, operator: Operator) -> None:
        """The shared tenant limits changed state: the gauge, and an audit row (consoles toast it)."""
        self.metrics.set_shared(fallback=flip.new in ("fail_open", "fail_closed"), gates=flip.gates)
        if flip.new == "fail_open":
            effect = f"each tenant limit runs locally at 1/{flip.gates} ({gates_phrase(flip.gates, flip.known)})"
        elif flip.new == "fail_closed":
            effect = "limited tenants get 429 shared_limit_unavailable"
        else:
            effect = "tenant limits are shared through Redis again"
        self.audit_event("shared_limits", "gate", f"{flip.why}; {effect}", operator=operator, old_value=flip.old, new_value=flip.new)

    # ---- decisions ------------------------------------------------------------

    def record(
        self,
        record: DecisionRecord,
        *,
        model: str | None,
        queued_s: float | None,
        ttft_s: float | None,
        ttft_total_s: float | None = None,
        tpot_s: float | None = None,
        objective_ms: float | None = None,
    ) -> asyncio.Future[bool] | None:
        """One finished request: journal, in-memory tail and metrics; the future resolves at commit.

        `objective_ms`: the first-token objective the arrival is judged by (from arrival, queue
        included); it met it only if admitted with its first token in time."""
        committed = self.journal.add(record) if self.journal is not None else None
        self.records.add(record)
        self.rollup.add(
            self.clock(),
            record.cls,
            record.outcome,
            record.reason,
            record.ttft_ms,
            record.queue_ms,
            met=judge(record, ttft_total_s, objective_ms),
            ttft_arrival_ms=record.ttft_arrival_ms,
        )
        m = self.metrics
        m.decision(cls=record.cls, outcome=record.outcome, reason=record.reason, model=model or "")
        if record.token_count_source is not None:
            m.token_count(record.token_count_source)
        if record.cls:
            if queued_s is not None:
                m.queue_wait(record.cls, queued_s, record.outcome)
            if ttft_s is not None:
                m.ttft(record.cls, ttft_s)
            if ttft_total_s is not None:
                m.ttft_total(record.cls, ttft_total_s, record.outcome)
            if tpot_s is not None:
                m.tpot(record.cls, tpot_s, record.outcome)
            m.duration(record.cls, record.duration_ms / 1000)
        return committed

    async def committed(self, fut: asyncio.Future[bool] | None, timeout_s: float = 1.0) -> None:
        """Wait for a decision row's commit before the client's last bytes (bounded; never while failing)."""
        if fut is None or self.journal is None or not self.journal.health.ok:
            return
        if fut.done():
            self.metrics.commit_wait(0.0)
            return
        began = time.monotonic()
        try:
            async with asyncio.timeout(timeout_s):
                await asyncio.shield(fut)  # a timeout must not cancel the journal's future
        except TimeoutError:
            log.warning("journal commit took over %.1fs; answering the client anyway", timeout_s)
        self.metrics.commit_wait(time.monotonic() - began)  # #26: a slow answer the loop lag did not show

    # ---- once a second --------------------------------------------------------

    def write_samples(self, backends: BackendPool, gpu: GpuReading | None) -> None:
        """One samples row per backend: what the review screen charts."""
        if self.journal is None:
            return
        counts = self.rollup.counts(self.clock(), 1)
        admitted = sum(n for (_, o, _), n in counts.items() if o == "admitted")
        refused = sum(n for (_, o, _), n in counts.items() if o == "refused")
        gpu_used = gpu_total = None
        if gpu is not None and gpu.devices:
            gpu_used = sum(d.used_bytes for d in gpu.devices)
            gpu_total = sum(d.total_bytes for d in gpu.devices)
        for b in backends:
            adm, c = b.admission, b.controller
            classes = (
                tuple(ClassSample(name, t.in_flight, t.queued) for name, t in class_totals((b,), adm.class_names).items()) if adm else ()
            )
            self.journal.add(
                SampleRecord(
                    ts=time.time(),
                    backend=b.name,
                    budget=adm.budget if adm and b.capacity else None,
                    in_flight=adm.ledger.in_flight if adm else 0,
                    queued=adm.waiting() if adm else 0,
                    slots_busy=len(adm.ledger) if adm else None,
                    slots_total=b.capacity.slots if b.capacity else None,
                    gpu_used_bytes=gpu_used,
                    gpu_total_bytes=gpu_total,
                    p95_ttft_ms=None if c is None or c.p95_ttft_s is None else c.p95_ttft_s * 1000,
                    p95_tpot_ms=None if c is None or c.p95_tpot_s is None else c.p95_tpot_s * 1000,
                    admitted=admitted,
                    refused=refused,
                    classes=classes,
                    gate_id=self.gate_id,
                    journal_dropped=self.journal.health.dropped,
                )
            )

    def refresh_metrics(self, backends: BackendPool, classes: Iterable[str], slo_ttft_s: float) -> None:
        """Gauges from current state (cheap; called per scrape and per second)."""
        m = self.metrics
        budget = effective = 0
        drain_s = 0.0
        now = self.clock()
        for b in backends:
            adm = b.admission
            m.set_backend(b.name, up=b.state == "ready", busy=adm.ledger.slots if adm else 0, total=b.capacity.slots if b.capacity else 0)
            self.refresh_inference_gauge(b)
            if adm is None:
                continue
            if b.capacity is not None:  # a router's model before its first load has none yet
                budget += adm.budget
                effective += adm.effective_budget
            queued_tokens = sum(adm.queue(cls).tokens for cls in adm.class_names)
            rate = adm.drain_rate.rate(now)
            if queued_tokens:
                drain_s = max(drain_s, queued_tokens / rate if rate > 0 else float("inf"))
        totals = class_totals(backends, classes)
        for cls, t in totals.items():
            m.set_class_state(cls, in_flight=t.in_flight, queued=t.queued)
        m.set_budget(budget, effective)
        m.set_drain_seconds(drain_s if drain_s != float("inf") else 3600.0)
        m.set_slo_ttft(slo_ttft_s)
        # The objective each class is refused by and judged against (its own, else the SLO):
        # tokengate_slo_ttft_seconds alone named the SLO, not a class's own objective.
        objectives = {cls: slo_ttft_s for cls in totals}
        for b in backends:
            if b.admission is not None:
                for cls in b.admission.class_names:
                    ms = b.admission.objective_ms(cls)
                    if ms:
                        objectives[cls] = ms / 1000
        for cls, seconds in objectives.items():
            m.set_ttft_objective(cls, seconds)
        # the reservations in force: R0's scaling was only in a warning's words (a user's trial)
        reserved = dict.fromkeys(totals, 0)
        for b in backends:
            if b.admission is not None and b.capacity is not None:
                for cls in b.admission.class_names:
                    reserved[cls] = reserved.get(cls, 0) + b.admission.reserved(cls)
        for cls, tokens in reserved.items():
            m.set_class_reserved(cls, tokens)

    def refresh_inference_gauge(self, b: Backend) -> None:
        """The inference-gateway protocol's three gauges for one backend, from the gate's own state:
        its queue, its dispatched requests, its ledger against the KV pool (the ceiling). A backend
        that is not ready reads as full, so an endpoint picker sends its traffic elsewhere."""
        adm = b.admission
        model = b.config.models[0] if b.config.models else ""
        if adm is None:
            self.metrics.set_inference(b.name, model, waiting=0, running=0, kv_usage=1.0)
            return
        usage = adm.ledger.in_flight / adm.capacity.ceiling if b.state == "ready" else 1.0
        self.metrics.set_inference(b.name, model, waiting=adm.waiting(), running=len(adm.ledger), kv_usage=usage)
