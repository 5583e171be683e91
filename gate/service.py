"""One gate: config in, HTTP server, backends, counters and loops wired together.

`GateService.start()` runs inside an existing event loop (the console embeds it);
`stop()` stops admitting, lets in-flight requests finish within a grace period,
then closes everything.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import hashlib
import logging
import os
import socket
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import httpx
import uvicorn

from gate.core.adaptive import has_demand
from gate.core.admission import TenantPolicy
from gate.backend.pool import Backend, BackendPool
from gate.http.clientguard import guarded_protocol
from gate.config import Config, ConfigError
from gate.observe.metrics import GateMetrics
from gate.fleet.model_metrics import ModelMetrics
from gate.core.ratelimit import RateLimiter, TenantLimits
from gate.fleet.sharedlimits import Flip, SharedState, local_share
from gate import __version__
from gate.ops.control import Control, Operator
from gate.ops.control_socket import ControlServer
from gate.ops.lock import JournalLock, new_gate_id
from gate.backend.gatekeeper import Ticket
from gate.backend.netio import client_transports
from gate.journal import Journal
from gate.data.records import AuditRecord, AuditSource, ClassSample, DecisionRecord, RecentDecisions, SampleRecord
from gate.core.rollup import Rollup
from gate.data.snapshot import BackendView, ClassView, ControllerView, DenialView, GateSnapshot, JournalView, Label, SlotView
from gate.http.server import build_app
from gate.http.tenants import TenantDirectory
from gate.observe.gpu import GpuMonitor
from gate.backend.kvsize import kv_bytes_per_token
from gate.backend.telemetry import TelemetryPoller, backend_triples
from gate.backend.tokens import TokenCounter
from gate.backend.upstream import RelayStats


class _EmbeddedServer(uvicorn.Server):
    """uvicorn without its own signal handlers: the host process owns signals."""

    @contextlib.contextmanager
    def capture_signals(self):
        yield


class GateService:
    """Everything one gate needs, started and stopped as a unit."""

    def __init__(
        self,
        config: Config,
        *,
        environ: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        probe_interval_s: float = 1.0,
        transport: httpx.AsyncBaseTransport | None = None,
        journal_path: str | None = None,
    ) -> None:
        environ = os.environ if environ is None else environ
        self.config = config
        self.clock = clock
        self.log = logging.getLogger("tokengate.service")
        self.shutting_down = False
        self.probe_interval_s = probe_interval_s
        self.tenants = TenantDirectory.from_config(config, environ)
        tenant_cfg = {t.name: t for t in config.tenants}
        # Shorter than llama-server's own 5 s keep-alive, so a pooled connection is
        # never reused in the instant the server closes it.
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=256, keepalive_expiry=2.0)
        mounts: dict[str, httpx.AsyncBaseTransport] = {}
        if transport is None:  # else a test seam (httpx.MockTransport)
            transport, mounts = client_transports(limits)
        self.client = httpx.AsyncClient(
            transport=transport, mounts=mounts, timeout=httpx.Timeout(connect=5.0, read=None, write=30.0, pool=30.0)
        )
        self.tokens = TokenCounter(self.client)
        #: tenant limits shared through Redis ([shared]); None when off. Under its fail_open
        #: policy the gate's own limits below run at 1/N (`_local_share`).
        self.shared: Any = None
        self.ratelimit = RateLimiter(
            lambda name: TenantLimits(
                self._local_share(tenant_cfg[name].requests_per_minute), self._local_share(tenant_cfg[name].tokens_per_minute)
            )
            if name in tenant_cfg
            else TenantLimits(None, None)
        )
        self.metrics = GateMetrics()
        self.metrics.register_classes([c.name for c in config.classes])
        self.metrics.register_models(m for b in config.backends for m in b.models)
        self.records = RecentDecisions()
        self.backends = BackendPool(
            config.backends,
            self.client,
            classes=config.classes,
            tenant_policy=lambda name: TenantPolicy(tenant_cfg[name].weight, self._local_share(tenant_cfg[name].max_tokens_in_flight))
            if name in tenant_cfg
            else TenantPolicy(),
            environ=environ,
            budget=config.budget,
            clock=clock,
            on_created=self._adopt_backend,
            on_model_event=self._model_event,
        )
        self.backends.on_units = self._units_changed
        self.model_metrics = ModelMetrics(
            self.metrics.registry, lambda: self.backends.fleets, (m for b in config.backends for m in b.models)
        )
        self.recent_audit: deque[AuditRecord] = deque(maxlen=1000)
        self.rollup = Rollup()
        self.label: Label = "LIVE"
        self.operator = Operator.from_environ(environ)
        # Filled by the telemetry and GPU loops once wired; None/empty means "not polled".
        self.telemetry: dict[str, Any] = {}
        self.gpu_reading: Any = None
        self.journal: Journal | None = None
        self.journal_path = journal_path or config.gate.journal
        self.gate_id = new_gate_id()
        self.lock = JournalLock(self.journal_path)
        if config.shared.enabled:
            from gate.fleet.sharedlimits.client import SharedLimits  # imports redis: only when asked for

            self.shared = SharedLimits(
                config.shared, self.gate_id, on_flip=self._shared_flipped, on_policy=self.metrics.shared_policy,
                on_wait=self.metrics.shared_wait,
            )
        #: called with every audit row (consoles attached over the socket toast them)
        self.audit_listeners: list[Callable[[AuditRecord], None]] = []
        self.control = Control(self)  # owns the operator state (paused classes, freeze)
        socket_path = config.gate.control_socket_path() if journal_path is None or config.gate.control_socket else None
        self.control_server = None if socket_path is None else ControlServer(socket_path, self, group=config.gate.control_socket_group)
        self.drain_grace_s = 30.0
        #: set by whoever runs the gate until told to stop (serve): called with the reason
        self.stop_requested: Callable[[str], None] | None = None
        self.telemetry_poller = TelemetryPoller(self.client, backend_triples(self.backends.backends), interval_s=probe_interval_s)
        self.gpu = GpuMonitor()
        self.app = build_app(self)
        self._server: _EmbeddedServer | None = None
        self._tasks: list[asyncio.Task] = []
        self._background: set[asyncio.Task] = set()
        self.port: int | None = None
        self.host = config.gate.listen_host

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def start(self, *, port: int | None = None) -> None:
        """Lock and open the journal, probe backends once, start the loops, the HTTP server and
        the control socket; returns once it listens.

        Raises JournalLocked when another gate holds the journal and SocketInUse when a live
        gate answers on the control socket (the CLI turns both into exit 2).
        """
        try:
            self.lock.acquire(self.gate_id)
        except OSError as exc:  # no directory, a read-only disk: the journal will say so loudly too
            self.log.warning("cannot lock the journal %s (%s): running without the one-gate-per-journal guard", self.journal_path, exc)
        try:
            await self._start(port)
        except BaseException:
            await self._close_resources()
            raise
        self._lifecycle(
            "started", None, __version__,
            f"listen {self.url}; config {config_digest(self.config)}; journal {self.journal_path}; "
            f"control socket {self.control_server.path if self.control_server else 'none'}",
        )

    async def _start(self, port: int | None) -> None:
        if self.control_server is not None:
            self.control_server.claim()  # before anything listens: a live gate there is a refusal
        self.journal = await Journal.open(self.journal_path, on_drop=self.metrics.journal_dropped)
        if self.shared is not None:
            await self.shared.start()  # Redis out of reach is not fatal: the failure policy applies
        await self.backends.probe_all()
        self._tasks = [
            asyncio.create_task(self.backends.run(self.probe_interval_s), name="tokengate-probe"),
            asyncio.create_task(self._housekeeping(), name="tokengate-housekeeping"),
            asyncio.create_task(self.telemetry_poller.run(self._on_telemetry), name="tokengate-telemetry"),
            asyncio.create_task(self._gpu_loop(), name="tokengate-gpu"),
        ]
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY on accepted connections only
        # when the listening socket says so, and without it every keep-alive response
        # waits ~40 ms for the client's delayed ACK (Nagle).
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.config.gate.listen_port if port is None else port))
        sock.setblocking(False)
        self.port = sock.getsockname()[1]
        uv_config = uvicorn.Config(
            self.app, interface="asgi3", log_level="warning", lifespan="off", access_log=False, timeout_graceful_shutdown=5,
            http=guarded_protocol(self.config.gate.header_timeout_s),  # slow clients: gate/http/clientguard.py
        )
        self._server = _EmbeddedServer(uv_config)
        self._tasks.append(asyncio.create_task(self._server.serve(sockets=[sock]), name="tokengate-http"))
        while not self._server.started:
            if self._tasks[-1].done():
                self._tasks[-1].result()  # surface why the server did not start
            await asyncio.sleep(0.01)
        if self.control_server is not None:
            await self.control_server.start()
        self.log.info("tokengate listening on %s", self.url)

    async def stop(self, grace_s: float | None = None, *, why: str = "stop requested") -> None:
        """Refuse new work (503 shutting_down), wait for in-flight requests, then close.

        `why` (a signal, a hang-up, an operator) goes into the audit rows "stopping" and
        "stopped"; the journal is flushed and the journal lock let go last.
        """
        grace_s = self.drain_grace_s if grace_s is None else grace_s
        if not self.shutting_down:
            self.shutting_down = True
            busy = self.in_flight_requests()
            self._lifecycle("stopping", None, None, f"{why}; {busy} requests in flight or queued, grace {grace_s:g} s")
        deadline = self.clock() + grace_s
        while self.in_flight_requests() and self.clock() < deadline:
            await asyncio.sleep(0.05)
        left = self.in_flight_requests()
        if left:
            self.log.warning("stopping with %d requests still in flight after %.0fs grace", left, grace_s)
        if self.control_server is not None:
            await self.control_server.close()
        if self._server is not None:
            self._server.should_exit = True
        for task in self._tasks:
            if task.get_name() != "tokengate-http":
                task.cancel()
        for task in self._background:
            task.cancel()  # each releases its ticket in `finally`
        await asyncio.gather(*self._tasks, *self._background, return_exceptions=True)
        while self._background:  # releases started by requests the server cut meanwhile
            await asyncio.gather(*tuple(self._background), return_exceptions=True)
        for backend in self.backends:
            if backend.gatekeeper is not None:
                backend.gatekeeper.close()
        await asyncio.to_thread(self.gpu.close)
        self._lifecycle("stopped", None, None, f"{why}; {left} requests cut at the end of the grace period" if left else why)
        await self._close_resources()

    async def _close_resources(self) -> None:
        await self.client.aclose()
        if self.shared is not None:
            await self.shared.stop()  # hands back what is held, leaves the gate count
        if self.journal is not None:
            await self.journal.close()  # flushes every pending row
        self.lock.release()

    def _lifecycle(self, action: str, old: str | None, new: str | None, note: str) -> None:
        self.audit_gate(action, note, new_value=new, old_value=old)

    def audit_gate(
        self, action: str, note: str, *, operator: Operator | None = None, source: AuditSource = "gate",
        old_value: str | None = None, new_value: str | None = None,
    ) -> None:
        """An audit row about the gate itself: started, stopping, stopped, reload_refused."""
        op = operator or self.operator
        self.audit(
            AuditRecord(
                ts=time.time(), operator=op.name, origin=op.origin, source=source, action=action, target="gate",
                old_value=old_value, new_value=new_value, note=note,
            )
        )

    def _local_share(self, limit: int | None) -> int | None:
        """A tenant limit as this gate enforces it: whole, or 1/N under [shared] fail_open."""
        return limit if self.shared is None else local_share(limit, self.shared.divisor)

    @property
    def shared_state(self) -> SharedState:
        return "off" if self.shared is None else self.shared.state

    def _shared_flipped(self, flip: Flip) -> None:
        """The shared limits changed state: gauge, audit row (the console toasts it)."""
        self.metrics.set_shared(fallback=flip.new in ("fail_open", "fail_closed"), gates=flip.gates)
        if flip.new == "fail_open":
            effect = f"each tenant limit runs locally at 1/{flip.gates} (N = {flip.gates} gates seen)"
        elif flip.new == "fail_closed":
            effect = "limited tenants get 429 shared_limit_unavailable"
        else:
            effect = "tenant limits are shared through Redis again"
        self.audit_gate("shared_limits", f"{flip.why}; {effect}", old_value=flip.old, new_value=flip.new)

    def in_flight_requests(self) -> int:
        """Requests holding a reservation or waiting in a queue, over all backends."""
        total = 0
        for backend in self.backends:
            if backend.admission is not None:
                total += len(backend.admission.ledger) + backend.admission.waiting()
        return total

    def release_when_slot_frees(
        self, backend: Backend, ticket: Ticket, timeout_s: float = 3.0, *, then: Callable[[], None] | None = None
    ) -> None:
        """Release `ticket` once llama-server shows one busy slot fewer than the gate holds; then call `then`."""
        task = asyncio.get_running_loop().create_task(self._release_when_slot_frees(backend, ticket, timeout_s, then))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _release_when_slot_frees(
        self, backend: Backend, ticket: Ticket, timeout_s: float, then: Callable[[], None] | None = None
    ) -> None:
        deadline = self.clock() + timeout_s
        try:
            while self.clock() < deadline and backend.admission is not None:
                try:
                    response = await self.client.get(backend.url + "/slots" + backend.query, headers=backend.auth_headers(), timeout=1.0)
                    slots = response.json() if response.status_code == 200 else None
                except (httpx.HTTPError, ValueError):
                    slots = None
                if not isinstance(slots, list):
                    break  # /slots is off or the backend is gone: nothing to wait for
                busy = sum(1 for s in slots if isinstance(s, dict) and s.get("is_processing"))
                if busy < len(backend.admission.ledger):  # the ledger still counts this ticket
                    break
                await asyncio.sleep(0.05)
        finally:
            if backend.gatekeeper is not None:
                backend.gatekeeper.release(ticket)
            if then is not None:
                then()

    def _adopt_backend(self, backend: Backend) -> None:
        self.control.adopt(backend)  # operator state (paused classes, freeze) carries over

    def _units_changed(self) -> None:
        """Router mode turned a backend into model units: poll each model's /slots and /metrics."""
        self.telemetry_poller.set_backends(backend_triples(self.backends.backends))

    def _model_event(self, action: str, target: str, old: str | None, new: str | None, note: str) -> None:
        """Router mode: a load, an eviction or a failure the gate saw or chose, audited."""
        self.audit(
            AuditRecord(
                ts=time.time(), operator="tokengate", origin="local", source="gate", action=action, target=target,
                old_value=old, new_value=new, note=note,
            )
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
        self.log.info(
            "audit %s@%s %s %s %s: %s -> %s %s", record.operator, record.origin, record.source,
            record.action, record.target, record.old_value, record.new_value, record.note,
        )

    def record(
        self, record: DecisionRecord, *, model: str | None, queued_s: float | None, ttft_s: float | None,
        ttft_total_s: float | None = None, tpot_s: float | None = None,
    ) -> asyncio.Future[bool] | None:
        """One finished request: journal, in-memory tail and metrics; the future resolves at commit."""
        committed = self.journal.add(record) if self.journal is not None else None
        self.records.add(record)
        self.rollup.add(self.clock(), record.cls, record.outcome, record.reason, record.ttft_ms, record.queue_ms)
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
        if fut is None or fut.done() or self.journal is None or not self.journal.health.ok:
            return
        try:
            async with asyncio.timeout(timeout_s):
                await asyncio.shield(fut)  # a timeout must not cancel the journal's future
        except TimeoutError:
            self.log.warning("journal commit took over %.1fs; answering the client anyway", timeout_s)

    def write_samples(self) -> None:
        """One samples row per backend: what the review screen charts."""
        if self.journal is None:
            return
        now = self.clock()
        counts = self.rollup.counts(now, 1)
        admitted = sum(n for (_, o, _), n in counts.items() if o == "admitted")
        refused = sum(n for (_, o, _), n in counts.items() if o == "refused")
        gpu_used = gpu_total = None
        if self.gpu_reading is not None and self.gpu_reading.devices:
            gpu_used = sum(d.used_bytes for d in self.gpu_reading.devices)
            gpu_total = sum(d.total_bytes for d in self.gpu_reading.devices)
        for b in self.backends:
            adm, c = b.admission, b.controller
            classes = tuple(
                ClassSample(name, adm.ledger.class_tokens(name), len(adm.queue(name))) for name in adm.class_names
            ) if adm else ()
            self.journal.add(
                SampleRecord(
                    ts=time.time(), backend=b.name, budget=adm.budget if adm and b.capacity else None,
                    in_flight=adm.ledger.in_flight if adm else 0, queued=adm.waiting() if adm else 0,
                    slots_busy=len(adm.ledger) if adm else None, slots_total=b.capacity.slots if b.capacity else None,
                    gpu_used_bytes=gpu_used, gpu_total_bytes=gpu_total,
                    p95_ttft_ms=None if c is None or c.p95_ttft_s is None else c.p95_ttft_s * 1000,
                    p95_tpot_ms=None if c is None or c.p95_tpot_s is None else c.p95_tpot_s * 1000,
                    admitted=admitted, refused=refused, classes=classes, gate_id=self.gate_id,
                )
            )

    def refresh_metrics(self) -> None:
        """Gauges from current state (cheap; called per scrape and per second)."""
        m = self.metrics
        in_flight = {c.name: 0 for c in self.config.classes}
        queued = dict(in_flight)
        budget = effective = 0
        drain_s = 0.0
        now = self.clock()
        for b in self.backends:
            adm = b.admission
            m.set_backend(b.name, up=b.state == "ready", busy=len(adm.ledger) if adm else 0, total=b.capacity.slots if b.capacity else 0)
            self._refresh_inference_gauges(b)
            if adm is None:
                continue
            if b.capacity is not None:  # a router's model before its first load has none yet
                budget += adm.budget
                effective += adm.effective_budget
            queued_tokens = 0
            for cls in adm.class_names:
                in_flight[cls] += adm.ledger.class_tokens(cls)
                queued[cls] += len(adm.queue(cls))
                queued_tokens += adm.queue(cls).tokens
            rate = adm.drain_rate.rate(now)
            if queued_tokens:
                drain_s = max(drain_s, queued_tokens / rate if rate > 0 else float("inf"))
        for cls in in_flight:
            m.set_class_state(cls, in_flight=in_flight[cls], queued=queued[cls])
        m.set_budget(budget, effective)
        m.set_drain_seconds(drain_s if drain_s != float("inf") else 3600.0)
        m.set_slo_ttft(self.config.budget.slo_ttft_p95_ms / 1000)
        if self.shared is not None:
            m.set_shared(fallback=self.shared.health.degraded, gates=self.shared.health.gates)

    def refresh_inference_gauges(self) -> None:
        """Only the inference-gateway gauges (GET /metrics/inference)."""
        for b in self.backends:
            self._refresh_inference_gauges(b)

    def _refresh_inference_gauges(self, b: Backend) -> None:
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

    def observe_success(self, backend: Backend, stats: RelayStats) -> None:
        """Feed a completed request's upstream latencies to the controller."""
        now = self.clock()
        tpot = None
        if stats.first_token_at is not None and stats.completion_tokens and stats.completion_tokens > 1:
            tpot = (now - stats.first_token_at) / (stats.completion_tokens - 1)
        if backend.controller is not None:
            backend.controller.observe(now, stats.ttft_s, tpot)

    def tick_controllers(self) -> None:
        """One adaptive step per backend: move the budget when upstream latency says so."""
        if self.config.budget.mode != "adaptive":
            return
        now = self.clock()
        for b in self.backends:
            if b.controller is None or b.admission is None:
                continue
            adm = b.admission
            move = b.controller.tick(now, has_demand(adm.waiting(), adm.ledger.in_flight, adm.budget))
            if move is None:
                continue  # a move was pushed to admission by the controller's listener
            ttft = "n/a" if move.p95_ttft_s is None else f"{move.p95_ttft_s * 1000:.0f} ms"
            self.audit(
                AuditRecord(
                    ts=time.time(), operator="controller", origin="local", source="controller",
                    action=f"budget_{move.cause}", target=f"backend:{b.name}", old_value=str(move.old_budget),
                    new_value=str(move.new_budget),
                    note=f"p95 TTFT {ttft} vs SLO {self.config.budget.slo_ttft_p95_ms:g} ms over {move.samples} samples",
                )
            )

    def snapshot(self, decisions_after: int = 0, max_decisions: int = 200) -> GateSnapshot:
        """Everything the console shows, as one immutable value.

        Decisions: at most `max_decisions` of those finished after sequence number
        `decisions_after` (the console passes the last `decisions_seq` it saw), so a
        snapshot costs the same at 10 and at 1,000 requests per second.
        """
        now = self.clock()
        config = self.config
        counts = self.rollup.counts(now, 60)
        backends = []
        for b in self.backends:
            adm, cap, tel = b.admission, b.capacity, self.telemetry.get(b.name)
            backends.append(
                BackendView(
                    name=b.name, url=b.url, state=b.state, detail=b.detail, kv=b.config.kv,
                    slots_busy=len(adm.ledger) if adm else 0,
                    slots_total=cap.slots if cap else None,
                    slot_context=cap.slot_context if cap else None,
                    ceiling=cap.ceiling if cap else None,
                    budget=adm.budget if adm else None,
                    in_flight=adm.ledger.in_flight if adm else 0,
                    prefilling=adm.ledger.prefilling if adm else 0,
                    queued=adm.waiting() if adm else 0,
                    slots=None if tel is None or tel.slots is None else tuple(
                        SlotView(s.id, s.n_ctx, s.processing, s.n_prompt_tokens, s.n_decoded) for s in tel.slots
                    ),
                    decode_tps=None if tel is None else tel.decode_tps,
                    requests_deferred=None if tel is None else tel.requests_deferred,
                    kv_bytes_per_token=b.kv_bytes_per_token,
                    stretched_to=adm.stretched_to if adm else None,
                    **_prefill_view(b),
                )
            )
        classes = []
        for c in config.classes:
            in_flight = queued = 0
            oldest: float | None = None
            waiting_on = ""
            for b in self.backends:
                if b.admission is None:
                    continue
                q = b.admission.queue(c.name)
                in_flight += b.admission.ledger.class_tokens(c.name)
                queued += len(q)
                enq = q.oldest_enqueued_at()
                if enq is not None and now - enq >= (oldest or 0.0):
                    oldest = now - enq
                    waiting_on = b.admission.waiting_on(c.name)
                    if b.fleet is not None and not b.fleet.loaded(b) and waiting_on:
                        waiting_on = f"model {b.fleet.info[b.model].status}"
            classes.append(
                ClassView(
                    name=c.name, priority=c.priority, paused=c.name in self.control.paused,
                    reserved_tokens=c.reserved_tokens, limit_tokens=c.limit_tokens, queue_depth=c.queue_depth,
                    queue_timeout_s=c.queue_timeout_s, default_max_tokens=c.default_max_tokens,
                    max_tokens_cap=c.max_tokens_cap, in_flight=in_flight, queued=queued, oldest_wait_s=oldest,
                    admitted_per_min=sum(n for (cls, o, _), n in counts.items() if cls == c.name and o == "admitted"),
                    refused_per_min=sum(n for (cls, o, _), n in counts.items() if cls == c.name and o == "refused"),
                    p95_ttft_ms=self.rollup.p95_ttft_ms(now, c.name),
                    p95_queue_ms=self.rollup.p95_queue_ms(now, c.name), waiting_on=waiting_on,
                )
            )
        controllers = [b.controller for b in self.backends if b.controller is not None]
        ttfts = [c.p95_ttft_s for c in controllers if c.p95_ttft_s is not None]
        tpots = [c.p95_tpot_s for c in controllers if c.p95_tpot_s is not None]
        budgets = [b.admission.budget for b in self.backends if b.admission is not None and b.capacity is not None]
        ceilings = [b.capacity.ceiling for b in self.backends if b.capacity is not None]
        controller = ControllerView(
            mode=config.budget.mode, frozen=self.control.frozen, budget=sum(budgets) if budgets else None,
            min_tokens=config.budget.min_tokens, ceiling=sum(ceilings) if ceilings else None,
            p95_ttft_ms=max(ttfts) * 1000 if ttfts else None, p95_tpot_ms=max(tpots) * 1000 if tpots else None,
            slo_ttft_ms=config.budget.slo_ttft_p95_ms, slo_tpot_ms=config.budget.slo_tpot_p95_ms,
        )
        denials = tuple(DenialView(reason, cls, *n) for (reason, cls), n in self.rollup.denials(now).items())
        journal = None
        if self.journal is not None:
            h = self.journal.health
            journal = JournalView(h.ok, h.path, h.written, h.dropped, h.pending, h.last_error)
        return GateSnapshot(
            ts=time.time(), label=self.label, listen=f"{self.host}:{self.port}", operator=self.operator.name,
            backends=tuple(backends), classes=tuple(classes), controller=controller, gpu=self.gpu_reading,
            denials=denials, decisions=tuple(self.records.since(decisions_after, max_decisions)),
            audit=tuple(self.recent_audit)[-50:],
            journal=journal, reaped=sum(b.gatekeeper.reaped for b in self.backends if b.gatekeeper),
            shutting_down=self.shutting_down, gate_id=self.gate_id, decisions_seq=self.records.total,
            requests_in_flight=self.in_flight_requests(), drain_grace_s=self.drain_grace_s,
            shared=self.shared_state,
            models=tuple(v for fleet in self.backends.fleets for v in fleet.views(self.telemetry)),
        )

    def _on_telemetry(self, latest: dict[str, Any]) -> None:
        self.telemetry = dict(latest)

    async def _gpu_loop(self, interval_s: float = 2.0) -> None:
        """NVML in a worker thread every 2 s; absent NVML reads as n/a, never an error."""
        while True:
            reading = await self.gpu.read_async()
            self.gpu_reading = reading
            if reading.unavailable:
                self.metrics.clear_gpu()
            for d in reading.devices:
                self.metrics.set_gpu(str(d.index), used=d.used_bytes, total=d.total_bytes)
            for b in self.backends:
                if b.kv_bytes_per_token is None and b.props.get("model_path"):
                    # Reading the GGUF header blocks (file I/O): a thread, once per backend.
                    b.kv_bytes_per_token = await asyncio.to_thread(kv_bytes_per_token, b.props["model_path"]) or 0
            await asyncio.sleep(interval_s)

    async def _housekeeping(self) -> None:
        """Once a second: adapt budgets, reap leaked reservations, forget idle rate buckets, refresh gauges."""
        while True:
            await asyncio.sleep(1.0)
            self.tick_controllers()
            for b in self.backends:
                if b.gatekeeper is not None:
                    reaped = b.gatekeeper.reap()
                    if reaped:
                        self.metrics.reaped(len(reaped))
            self.ratelimit.forget_idle(self.clock(), 600.0)
            self.refresh_metrics()
            self.write_samples()


def config_digest(config: Config) -> str:
    """A short digest of the effective config (frozen dataclasses have a stable repr)."""
    return "sha256:" + hashlib.sha256(repr(config).encode()).hexdigest()[:16]


def reload_config(gate: GateService, config_path: str | None, *, operator: Operator, source: AuditSource = "signal") -> bool:
    """Re-read the config file and apply it; a refusal changes nothing and is audited with its reason."""
    from gate.config import load_config
    from gate.ops.control import ControlError

    if config_path is None:
        gate.log.warning("reload: no --config file to re-read")
        gate.audit_gate("reload_refused", "no --config file to re-read", operator=operator, source=source)
        return False
    try:
        new_config = load_config(config_path)
        results = gate.control.reload(new_config, operator=operator, source=source, note=f"{config_path} {config_digest(new_config)}")
    except (ConfigError, ControlError) as exc:
        gate.log.error("reload refused, nothing changed: %s", exc)
        gate.audit_gate("reload_refused", f"{config_path}: {exc}", operator=operator, source=source)
        return False
    gate.log.info("reloaded %s (%d changes audited)", config_path, len(results))
    return True


async def serve_until_signalled(
    config: Config, *, config_path: str | None = None, grace_s: float = 30.0, demo: bool = False, seed: int = 7,
) -> int:
    """Run a gate until SIGTERM/SIGINT (then drain gracefully); SIGHUP re-reads the config.

    `demo`: the gate in front of the built-in simulator with synthetic traffic (what
    `tokengate console --demo` runs in its gate process). A console that started this
    process may also stop it through the control socket (`gate.control_socket`, op stop).
    """
    import signal

    simulator = traffic = None
    if demo:
        from gate.tools.demo import DEMO_SIMULATOR, demo_config
        from gate.tools.simulator import serve_simulator

        simulator = await serve_simulator(DEMO_SIMULATOR(seed), port=0)
        config = demo_config(config if config_path else None, simulator.url)
    gate = GateService(config)
    gate.drain_grace_s = grace_s
    if demo:
        from gate.tools.demo import dress_demo_gate

        dress_demo_gate(gate, DEMO_SIMULATOR(seed))  # SIMULATED label, GPU and model size
    stop = asyncio.Event()
    why: list[str] = []

    def stop_because(reason: str) -> None:
        why.append(reason)
        stop.set()

    gate.stop_requested = stop_because
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop_because, f"signal {sig.name}")
    loop.add_signal_handler(signal.SIGHUP, lambda: reload_config(gate, config_path, operator=gate.operator))
    try:
        await gate.start(port=0 if demo else None)  # the demo never fights a real gate for its port
    except BaseException:
        if simulator is not None:
            await simulator.stop()
        raise
    for b in gate.backends:
        gate.log.info("backend %s at %s: %s (%s)", b.name, b.url, b.state, b.detail)
    if gate.control_server is not None:
        gate.log.info("control socket %s (attach: tokengate console --attach %s)", gate.control_server.path, gate.control_server.path)
    if demo:
        from gate.tools.demo import demo_traffic

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


def _prefill_view(b: Backend) -> dict[str, Any]:
    """The measured prefill rate and the prefill cap in force, for the console."""
    gk = b.gatekeeper
    if gk is None:
        return {}
    configured = gk.admission.capacity.max_prefill_tokens
    cap = gk.admission.prefill_cap_auto if configured is None else (configured or None)
    return {"prefill_tok_s": gk.prefill.rate, "prefill_cap": cap, "prefill_cap_auto": configured is None}
