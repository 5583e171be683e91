"""The composition root: one gate built from its config, started and stopped as a unit.

`GateService` builds each layer and hands each one the few things it needs (the request
path gets `RequestPorts`, consoles see the gate as a `ConsoleHost`, `Control` owns the
config and operator state); it holds no behaviour of its own beyond starting, stopping and
the once-a-second housekeeping. `start()` runs inside an existing event loop; `stop()` stops
admitting, lets in-flight requests finish within a grace period, then closes everything.
Nothing in gate/ imports this module but the entry points (`gate/cli.py`, `gate/serve.py`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import httpx

from gate import __version__
from gate.backend.gatekeeper import Ticket
from gate.backend.kvsize import learn_kv_sizes
from gate.backend.netio import upstream_client
from gate.backend.pool import Backend, BackendPool, controller_moves, observe_upstream, release_when_slot_frees
from gate.backend.rate_window import RateWindows
from gate.backend.telemetry import BackendTelemetry, TelemetryPoller, backend_triples
from gate.backend.tokens import TokenCounter
from gate.backend.upstream import RelayStats
from gate.config import Config, config_digest
from gate.config.thresholds import CONFIG_IN_FORCE, thresholds_json
from gate.core.ratelimit import RateLimiter
from gate.core.reasons import Reason
from gate.data.commands import Operator
from gate.data.records import AuditRecord, AuditSource, DecisionRecord
from gate.data.snapshot import GateSnapshot, GpuReading, Label
from gate.fleet.model_metrics import ModelMetrics
from gate.fleet.router_mode import ModelFleet
from gate.fleet.sharedlimits import Flip, SharedState, local_share
from gate.http.ports import RequestPorts
from gate.http.server import HttpServer, build_app
from gate.http.tenants import TenantDirectory, TenantQuotas
from gate.journal import Journal
from gate.observe.gcpause import GcPauses
from gate.observe.gpu import GpuMonitor, GpuSource, read_gpu
from gate.observe.looplag import LoopLagMonitor, cpu_seconds
from gate.observe.metrics import GateMetrics
from gate.observe.recorder import Recorder
from gate.observe.snapshots import BypassWatch, GateState, build_snapshot
from gate.ops.control import Control
from gate.ops.control_socket import ControlServer
from gate.ops.lock import JournalLock, new_gate_id

if TYPE_CHECKING:
    from gate.fleet.sharedlimits.client import SharedLimits


#: a bypassed backend is said in the log at most this often (a bypass that comes and goes would
#: log on every telemetry read)
BYPASS_LOG_S = 300.0


class GateService:
    """Everything one gate needs, built, started and stopped as a unit."""

    def __init__(
        self,
        config: Config,
        *,
        environ: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        probe_interval_s: float = 1.0,
        transport: httpx.AsyncBaseTransport | None = None,
        journal_path: str | None = None,
        label: Label = "LIVE",
        gpu: GpuSource | None = None,
        kv_bytes_per_token: int | None = None,
    ) -> None:
        environ = os.environ if environ is None else environ
        self.clock, self.label, self.probe_interval_s = clock, label, probe_interval_s
        self.log = logging.getLogger("tokengate.service")
        self.shutting_down = False
        self.tenants = TenantDirectory.from_config(config, environ)
        quotas = TenantQuotas(config, self._local_share)
        self.client = upstream_client(transport)
        self.tokens = TokenCounter(self.client)
        self.gate_id = new_gate_id()
        #: the config file this gate was started from, resolved (`tokengate serve` sets it; a reload
        #: re-reads it): `tokengate config set` on another file sharing its journal is told so
        self.config_path = ""
        self.metrics = GateMetrics()
        self.metrics.register_classes([c.name for c in config.classes])
        self.metrics.register_models(m for b in config.backends for m in b.models)
        self.recorder = Recorder(self.metrics, gate_id=self.gate_id, clock=clock)
        #: the gate's own event-loop delay (tokengate_event_loop_lag_seconds): a stall shows, whatever its cause
        #: and the collector's pauses (tokengate_gc_pause_seconds), which that delay's warning quotes
        self.gc_pauses = GcPauses()
        self.loop_lag = LoopLagMonitor(gc_pauses=self.gc_pauses)
        self.metrics.register_loop_lag(
            self.loop_lag.quantiles,
            lambda: (self.loop_lag.window.count, self.loop_lag.window.total_s),
            cpu_seconds,
            self.gc_pauses,
        )
        self.operator = Operator.from_environ(environ)
        #: tenant limits shared through Redis ([shared]); None when off. Under its fail_open
        #: policy the gate's own limits below run at 1/N (`_local_share`).
        self.shared: SharedLimits | None = None
        if config.shared.enabled:
            from gate.fleet.sharedlimits.client import SharedLimits  # imports redis: only when asked for

            self.shared = SharedLimits(
                config.shared,
                self.gate_id,
                on_flip=self._shared_flipped,
                on_policy=self.metrics.shared_policy,
                on_wait=self.metrics.shared_wait,
                on_expired=self.metrics.shared_expired,
                on_gates=lambda old, new: self.recorder.shared_gates_counted(old, new, self.operator),
            )
        self.ratelimit = RateLimiter(quotas.limits)
        self.backends = BackendPool(
            config.backends,
            self.client,
            classes=config.classes,
            environ=environ,
            budget=config.budget,
            clock=clock,
            tenant_policy=quotas.policy,
            on_created=lambda backend: self.control.adopt(backend),  # operator state carries over
            on_model_event=self._model_event,
            fleet_factory=ModelFleet,
            kv_bytes_per_token=kv_bytes_per_token,
        )
        self.backends.on_units = self._units_changed
        self.backends.on_budget_move = lambda b, move: self.recorder.budget_moved(
            b.name, move, self.config.budget.slo_ttft_p95_ms, asked=b.controller.asked if b.controller else None
        )
        self.backends.on_state = lambda b, old, new: self.recorder.backend_changed(b.name, old, new, b.detail, self.operator)
        self.backends.on_capacity = lambda b: self.recorder.capacity_learned(
            b.name,
            b.capacity,
            b.layout.kv if b.layout else None,
            f"{b.layout.source}: {b.layout.detail}" if b.layout else "no layout",
            self.operator,
            chat_template_tokens=b.chat_template_tokens,
        )
        self.backends.measure_template = lambda b: self.tokens.chat_template_tokens(b.url, b.auth_headers())
        self.model_metrics = ModelMetrics(
            self.metrics.registry, lambda: self.backends.fleets, (m for b in config.backends for m in b.models)
        )
        #: the config and the operator state (paused classes, freeze) have one owner
        self.control = Control(config, self.backends, clock=clock, audit=self.audit)
        # Filled by the telemetry and GPU loops once wired; empty/None means "not polled".
        self.telemetry: dict[str, BackendTelemetry] = {}
        self.bypass = BypassWatch()  # slots busy on llama-server beyond the gate's, on two reads in a row
        self._bypass_said: dict[str, float] = {}  # backend -> when the log last said it was bypassed
        self.gpu_reading: GpuReading | None = None
        self.gpu: GpuSource = gpu if gpu is not None else GpuMonitor()
        self.journal_path = journal_path or config.gate.journal
        self.lock = JournalLock(self.journal_path)
        socket_path = config.gate.control_socket_path() if journal_path is None or config.gate.control_socket else None
        self.control_server = None if socket_path is None else ControlServer(socket_path, self, group=config.gate.control_socket_group)
        self.drain_grace_s = 30.0
        #: set by whoever runs the gate until told to stop (serve): called with the reason
        self.stop_requested: Callable[[str], None] | None = None
        #: the telemetry's reads of llama-server's /metrics, pieces of a scraper's throughput window
        self.rate_windows = RateWindows()
        self.telemetry_poller = TelemetryPoller(
            self.client, backend_triples(self.backends.backends), interval_s=probe_interval_s, windows=self.rate_windows
        )
        self.http = HttpServer(
            build_app(
                RequestPorts(
                    current_config=lambda: self.control.config,
                    is_shutting_down=lambda: self.shutting_down,
                    clock=clock,
                    log=self.log,
                    client=self.client,
                    backends=self.backends,
                    tenants=self.tenants,
                    tokens=self.tokens,
                    ratelimit=self.ratelimit,
                    shared=self.shared,
                    recorder=self.recorder,
                    metrics=self.metrics,
                    model_metrics=self.model_metrics,
                    observe_success=self.observe_success,
                    release_when_slot_frees=self.release_when_slot_frees,
                    refresh_metrics=self.refresh_metrics,
                    refresh_inference_gauges=self.refresh_inference_gauges,
                    rate_windows=self.rate_windows,
                    bypass_slots=lambda: self.bypass.slots,
                )
            ),
            header_timeout_s=config.gate.header_timeout_s,
        )
        self._tasks: list[asyncio.Task[Any]] = []
        self._background: set[asyncio.Task[None]] = set()
        self.port: int | None = None
        self._file_digest = config_digest(config)  # the config file's, before any override is restored
        self.host = config.gate.listen_host

    # What the recorder and the control own, under the names consoles, tests and tools read.
    config = property(lambda self: self.control.config)
    records = property(lambda self: self.recorder.records)
    recent_audit = property(lambda self: self.recorder.recent_audit)
    rollup = property(lambda self: self.recorder.rollup)
    journal = property(lambda self: self.recorder.journal)
    audit_listeners = property(lambda self: self.recorder.audit_listeners)
    app = property(lambda self: self.http.app)

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
            for task in self._tasks:  # loops started before the failure: never left unretrieved
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            self._tasks = []
            await self._close_resources()
            raise
        # The file's digest, as config_in_force says; the restored retunes' digest beside it (a
        # trial read two digests for one unchanged file, across a restart that restored them)
        in_force = config_digest(self.config)
        config = self._file_digest if in_force == self._file_digest else f"{self._file_digest} with restored overrides ({in_force})"
        self.audit_gate(
            "started",
            f"listen {self.url}; config {config}; journal {self.journal_path}; "
            f"control socket {self.control_server.path if self.control_server else 'none'}",
            new_value=__version__,
        )

    async def _start(self, port: int | None) -> None:
        if self.control_server is not None:
            self.control_server.claim()  # before anything listens: a live gate there is a refusal
        self.recorder.journal = await Journal.open(self.journal_path, on_drop=self.metrics.journal_dropped)
        self.recorder.journal.on_new_file = self._journal_anew
        await self.recorder.resume(self.operator, self.config.objective_ms)  # the last 15 minutes, and how the last gate ended
        # What `tokengate replay` starts from: the file's thresholds, before any override is restored
        # (each restored override is its own audit row after this one).
        self._file_digest = config_digest(self.config)
        self.audit_gate(CONFIG_IN_FORCE, self._file_digest, new_value=thresholds_json(self.config))
        if self.shared is not None:
            # N as the journal last counted it, should Redis be out of reach now: a restart
            # during an outage must not take each tenant's whole limit on every gate
            remembered = await self.recorder.remembered_gates()
            if remembered is not None:
                self.shared.health.remember(remembered)
            await self.shared.start()  # Redis out of reach is not fatal: the failure policy applies
        await self.backends.probe_all()
        self.control.keep_beside(self.journal_path, operator=self.operator)  # before it listens
        self._tasks = [
            asyncio.create_task(self.backends.run(self.probe_interval_s), name="tokengate-probe"),
            asyncio.create_task(self._housekeeping(), name="tokengate-housekeeping"),
            asyncio.create_task(self.telemetry_poller.run(self._on_telemetry), name="tokengate-telemetry"),
            asyncio.create_task(self._gpu_loop(), name="tokengate-gpu"),
            asyncio.create_task(self.loop_lag.run(), name="tokengate-looplag"),
        ]
        self.gc_pauses.install()
        # `port` (tests: 0) replaces the first address's port; the other addresses keep theirs.
        self.port = await self.http.start(
            self.host, self.config.gate.listen_port if port is None else port, also=self.config.gate.listen_addresses[1:]
        )
        assert self.http.task is not None
        self._tasks.append(self.http.task)
        if self.control_server is not None:
            await self.control_server.start()
        self.log.info("tokengate listening on %s", ", ".join([self.url, *(f"http://{a}" for a in self.http.also_bound)]))
        if self.tenants.keyed:  # who may call: said where the operator looks first
            self.log.info("no [[tenants]]: clients present the backends' own API key (api_key_env), as llama-server asks for it")

    async def stop(self, grace_s: float | None = None, *, why: str = "stop requested") -> None:
        """Refuse new work (503 shutting_down), wait for in-flight requests, then close.

        `why` (a signal, a hang-up, an operator) goes into the audit rows "stopping" and
        "stopped"; the journal is flushed and the journal lock let go last.
        """
        grace_s = self.drain_grace_s if grace_s is None else grace_s
        if not self.shutting_down:
            self.shutting_down = True
            busy = self.in_flight_requests()
            self.audit_gate("stopping", f"{why}; {busy} requests in flight or queued, grace {grace_s:g} s")
            # A paused class's waiters cannot run before the gate goes: refused now, not held for
            # the whole grace and then cut (a trial's 7 waited 30 s more, 47-53 s in all)
            for backend in self.backends:
                for cls in sorted(self.control.paused):
                    if backend.gatekeeper is not None and cls in backend.gatekeeper.admission.class_names:
                        backend.gatekeeper.refuse_queued(
                            Reason.SHUTTING_DOWN,
                            f"the gate is shutting down and class {cls!r} is paused: retry against another instance",
                            1.0,
                            classes=(cls,),
                        )
        deadline = self.clock() + grace_s
        while self.in_flight_requests() and self.clock() < deadline:
            await asyncio.sleep(0.05)
        left = self.in_flight_requests()
        if left:
            self.log.warning("stopping with %d requests still in flight after %.0fs grace", left, grace_s)
        if self.control_server is not None:
            await self.control_server.close()
        self.http.stop(cut=bool(left))
        for task in self._tasks:
            if task.get_name() != "tokengate-http":
                task.cancel()
        for bg in self._background:
            bg.cancel()  # each releases its ticket in `finally`
        await asyncio.gather(*self._tasks, *self._background, return_exceptions=True)
        self.gc_pauses.uninstall()
        while self._background:  # releases started by requests the server cut meanwhile
            await asyncio.gather(*tuple(self._background), return_exceptions=True)
        for backend in self.backends:
            if backend.gatekeeper is not None:
                backend.gatekeeper.close()
        await asyncio.to_thread(self.gpu.close)
        self.audit_gate("stopped", f"{why}; {left} requests cut at the end of the grace period" if left else why)
        await self._close_resources()

    async def _close_resources(self) -> None:
        await self.client.aclose()
        if self.shared is not None:
            await self.shared.stop()  # hands back what is held, leaves the gate count
        if self.recorder.journal is not None:
            dropped_before = self.recorder.journal.health.dropped
            await self.recorder.journal.close()  # flushes every pending row
            health = self.recorder.journal.health
            # `ok` is False once closed: it said this on every clean stop (CI's log, 2026-12-06).
            if health.failing or health.dropped > dropped_before:  # no 'stopped' row for the next gate
                self.log.warning(
                    "journal %s: this run's last rows, 'stopped' among them, could not be written (%s; %d rows dropped "
                    "this run): the next gate will report an unclean end for this clean stop",
                    health.path,
                    health.last_error,
                    health.dropped,
                )
        self.lock.release()

    # ---- audit and decisions (the recorder's) -----------------------------------------

    def audit(self, record: AuditRecord) -> None:
        self.recorder.audit(record)

    def _journal_anew(self) -> None:
        """The journal file was deleted under the gate and started anew: what it runs under goes
        there again, or `tokengate replay` refuses every window of the new file (no
        config_in_force row before it)."""
        in_force = self.control.config
        self.audit_gate(
            CONFIG_IN_FORCE,
            f"{config_digest(in_force)}; the journal file was deleted and started anew (thresholds in force now)",
            new_value=thresholds_json(in_force),
        )

    def audit_gate(
        self,
        action: str,
        note: str,
        *,
        operator: Operator | None = None,
        source: AuditSource = "gate",
        old_value: str | None = None,
        new_value: str | None = None,
    ) -> None:
        """An audit row about the gate itself: started, stopping, stopped, reload_refused."""
        self.recorder.audit_event(
            action,
            "gate",
            note,
            operator=operator or self.operator,
            source=source,
            old_value=old_value,
            new_value=new_value,
        )

    def record(self, record: DecisionRecord, **kw: Any) -> asyncio.Future[bool] | None:
        return self.recorder.record(record, **kw)

    def _model_event(self, action: str, target: str, old: str | None, new: str | None, note: str) -> None:
        """Router mode: a load, an eviction or a failure the gate saw or chose, audited."""
        self.recorder.audit_event(action, target, note, operator=Operator("tokengate", "local"), old_value=old, new_value=new)

    # ---- shared limits ---------------------------------------------------------------

    def _local_share(self, limit: int | None) -> int | None:
        """A tenant limit as this gate enforces it: whole, or 1/N under [shared] fail_open."""
        return limit if self.shared is None else local_share(limit, self.shared.divisor)

    @property
    def shared_state(self) -> SharedState:
        return "off" if self.shared is None else self.shared.state

    def _shared_flipped(self, flip: Flip) -> None:
        self.recorder.shared_flipped(flip, self.operator)

    # ---- what the request path and the consoles are handed --------------------------------

    def in_flight_requests(self) -> int:
        return self.backends.requests_in_flight()

    def release_when_slot_frees(
        self, backend: Backend, ticket: Ticket, timeout_s: float = 3.0, *, then: Callable[[], None] | None = None, ran: bool = True
    ) -> None:
        """Release `ticket` once llama-server shows its slot free (a background task the stop waits
        for); `ran` False: withdraw it then (gate.backend.pool.release_when_slot_frees)."""
        task = asyncio.get_running_loop().create_task(
            release_when_slot_frees(backend, ticket, timeout_s=timeout_s, clock=self.clock, then=then, ran=ran)
        )
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def observe_success(self, backend: Backend, stats: RelayStats) -> None:
        observe_upstream(backend, stats, self.clock())

    def snapshot(self, decisions_after: int = 0, max_decisions: int = 200) -> GateSnapshot:
        """Everything the console shows, as one immutable value (gate/observe/snapshots.py)."""
        state = GateState(
            label=self.label,
            listen=f"{self.host}:{self.port}",
            operator=self.operator.name,
            gate_id=self.gate_id,
            config_path=self.config_path,
            paused=frozenset(self.control.paused),
            frozen=self.control.frozen,
            shutting_down=self.shutting_down,
            overrides=self.control.overrides.lines(),
            overrides_not_kept=self.control.keep_error or "",
            requests_in_flight=self.in_flight_requests(),
            drain_grace_s=self.drain_grace_s,
            shared=self.shared_state,
            gpu=self.gpu_reading,
        )
        return build_snapshot(
            state,
            self.config,
            self.backends,
            self.recorder,
            self.telemetry,
            bypass=self.bypass.slots,
            decisions_after=decisions_after,
            max_decisions=max_decisions,
        )

    def refresh_metrics(self) -> None:
        self.recorder.refresh_metrics(self.backends, (c.name for c in self.config.classes), self.config.budget.slo_ttft_p95_ms / 1000)
        if self.shared is not None:
            self.metrics.set_shared(fallback=self.shared.health.degraded, gates=self.shared.health.gates)
        # said in the log only, a console that cannot attach or a retune a restart would revert
        # went unseen by whoever watches the alerts (a crash trial, 2026-12-06)
        if self.control_server is not None and self.control_server.opened:
            self.metrics.set_channel("control_socket", self.control_server.listening)
        if self.control.overrides_path is not None:
            self.metrics.set_channel("overrides", self.control.keep_error is None)
        control = self.control
        self.metrics.set_operator_state(
            (c.name for c in self.config.classes), paused=control.paused, frozen=control.frozen, overrides=len(control.overrides.lines())
        )

    def refresh_inference_gauges(self) -> None:
        for b in self.backends:
            self.recorder.refresh_inference_gauge(b)

    # ---- the loops --------------------------------------------------------------------

    def tick_controllers(self) -> None:
        """One step per backend's budget owner (a fixed budget never moves); each move is audited."""
        for b, move in controller_moves(self.backends, self.clock()):
            self.recorder.budget_moved(b.name, move, self.config.budget.slo_ttft_p95_ms)

    def write_samples(self) -> None:
        self.recorder.write_samples(self.backends, self.gpu_reading)

    def _units_changed(self) -> None:
        """Router mode turned a backend into model units: poll each model's /slots and /metrics."""
        self.telemetry_poller.set_backends(backend_triples(self.backends.backends))

    def _on_telemetry(self, latest: dict[str, BackendTelemetry]) -> None:
        self.telemetry = dict(latest)
        before = dict(self.bypass.slots)
        self.bypass.read(self.telemetry, self.backends)
        # Said where an on-call looks without a console: two gates in front of one llama-server
        # each saw the other's requests only as slow slots (a trial: gate B's TTFT p95 31.7 s
        # against its 2 s objective, and neither said a word).
        now = self.clock()
        for name, slots in self.bypass.slots.items():
            if slots and not before.get(name) and now - self._bypass_said.get(name, -math.inf) >= BYPASS_LOG_S:
                self._bypass_said[name] = now
                self.log.warning(
                    "backend %s: llama-server runs %d request(s) this gate did not send (a client or another gate "
                    "bypassing it): they hold slots and KV the gate counts as free, so its waits and first tokens run "
                    "long; send every client through one gate",
                    name,
                    slots,
                )

    async def _gpu_loop(self, interval_s: float = 2.0) -> None:
        """NVML in a worker thread every 2 s (absent NVML reads as n/a, never an error); and
        once per backend, the model's KV bytes per token from its GGUF header."""
        while True:
            self.gpu_reading = await read_gpu(self.gpu, self.metrics)
            await learn_kv_sizes(self.backends)
            await asyncio.sleep(interval_s)

    async def _housekeeping(self) -> None:
        """Once a second: adapt budgets, reap leaked reservations, forget idle rate buckets, refresh gauges."""
        while True:
            await asyncio.sleep(1.0)
            try:
                self.tick_controllers()
            except Exception:  # noqa: BLE001 - the reaper below must go on
                # Raised here, it ended this loop for good and silently: no reaping, no samples,
                # no gauges (a retune of [budget] increase = 1e308 overflowed the controller)
                self.log.exception("adaptive controller step failed; the budget holds")
            reaped = self.backends.reap()
            if reaped:
                self.metrics.reaped(reaped)
            self.ratelimit.forget_idle(self.clock(), 600.0)
            self.refresh_metrics()
            self.write_samples()
            try:  # their files deleted under the running gate: the lock, overrides and socket again
                self.lock.keep()
                self.control.rewrite_if_gone()
                if self.control_server is not None:
                    await self.control_server.rebind_if_gone()
            except Exception:  # noqa: BLE001 - housekeeping must go on
                self.log.exception("journal lock or control socket: taking it again failed")
