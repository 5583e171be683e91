"""Prometheus exposition: every series of DESIGN.md "Metrics (Prometheus)".

`GateMetrics` owns its own `CollectorRegistry` (never the process-wide default),
so two gates, or two tests, in one process never collide. Its methods are small
setters with no I/O; `render()` produces the `/metrics` body.

Conventions:
- Label values are plain `str`; a `Reason` (a `StrEnum`) passes as its value.
- `decision()` is called once per request, at its end (the same moment as the
  journal's decision row). A successful request has reason "" in the journal;
  here it is labelled `reason="ok"` so that no series carries an empty label.
- `admission_control_denials_total` counts only outcome "refused" (the name and
  meaning operators already alert on); shed/cancelled/failed are only in
  `tokengate_decisions_total`.
- `tokengate_token_budget` has no label: with several backends the caller sets
  the sum of their budgets.
- `register_classes()` creates the per-class children at 0 before any traffic,
  because alerts on absent series behave poorly.
- The inference-gateway gauges (`tokengate_num_requests_waiting`, `..._running`,
  `tokengate_kv_cache_usage_ratio`, each {backend, model}) are the model-server protocol
  of the Kubernetes Gateway API Inference Extension: its endpoint picker reads them
  instead of vLLM's `vllm:num_requests_waiting`, `vllm:num_requests_running` and
  `vllm:kv_cache_usage_perc` (deploy/kubernetes/). `model` is the backend's first
  configured model (llama-server serves one; the others are aliases), or "".
- Label values are bounded: a class, model or reason label is a configured class
  (`register_classes`), a configured model (`register_models`), a `Reason` (or
  "ok", "client_disconnect"), or "" (not known: refused before
  identification, no model given); anything else is "other". The `model` label
  used to copy the client's field: 300 refusals with random 20 kB model names grew
  /metrics from 16 kB to 12.4 MB. So the series count is at most
  (classes + 2) x (models + 2) x (reasons + 2) per counter.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client.core import Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from gate import __version__
from gate.core.reasons import CLIENT_DISCONNECT, Reason
from gate.data.endpoints import PREFLIGHT, ROUTES, UI_ASSET
from gate.observe.gcpause import GENERATIONS, GcPauses

OUTCOMES = ("admitted", "refused", "shed", "cancelled", "failed", "forwarded")
OK_REASON = "ok"
OTHER = "other"  # every label value that is not a configured name
_REASONS = frozenset({*(r.value for r in Reason), OK_REASON, CLIENT_DISCONNECT})
TOKEN_COUNT_SOURCES = ("exact", "estimate")
#: what became of a request forwarded beside its count ([gate] forward_beside_count)
BESIDE_RESULTS = ("settled", "grown", "over_bound", "taken_back")
#: the only route labels: llama-server's routes (gate/data/endpoints.py), its UI assets, preflights
ROUTE_NAMES = frozenset({*(r.name for r in ROUTES), UI_ASSET.name, PREFLIGHT.name})
#: what an endpoint picker routes on: GET /metrics/inference serves only these (it scrapes often)
INFERENCE_METRICS = ("tokengate_num_requests_waiting", "tokengate_num_requests_running", "tokengate_kv_cache_usage_ratio")
SHARED_POLICIES = ("fail_open", "fail_closed")
# 0.1 ms .. 100 ms: a reservation is one round trip to a Redis nearby, cut at wait_ms (100 ms by default)
SHARED_WAIT_BUCKETS = (
    0.0001, 0.0002, 0.0003, 0.0005, 0.00075, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1,
)  # fmt: skip

# 0.5 ms .. 1 s (the wait is bounded at 1 s): a row commits in a millisecond or two when the
# writer thread gets the CPU
COMMIT_WAIT_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0)

# 1 ms .. 120 s
QUEUE_WAIT_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0,
)  # fmt: skip
# 10 ms .. 60 s
TTFT_BUCKETS = (
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0,
)  # fmt: skip
# vLLM's time-to-first-token buckets (1 ms .. 2560 s), so SLO attainment reads the same way,
# and 2 s: the default objective ([budget] slo_ttft_p95_ms), which a share of `le` over the
# count could not read without it (a trial)
SLO_TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
# vLLM's time-per-output-token buckets (10 ms .. 80 s)
TPOT_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
# 50 ms .. 600 s
DURATION_BUCKETS = (
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0,
)  # fmt: skip


class GateMetrics:
    """The gate's metrics on a private registry."""

    def __init__(self, *, version: str = __version__) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._series_cache: dict[tuple[Any, tuple[str, ...]], Any] = {}
        self._classes: set[str] = {""}
        self._models: set[str] = {""}
        r = self.registry
        self._denials = Counter(
            "admission_control_denials",
            "Requests refused by admission control.",
            ["model", "reason", "priority_class"],
            registry=r,
        )
        self._decisions = Counter(
            "tokengate_decisions",
            "Requests by class, final outcome and reason (reason 'ok' on success).",
            ["class", "outcome", "reason"],
            registry=r,
        )
        self._in_flight = Gauge(
            "tokengate_tokens_in_flight",
            "Tokens reserved by admitted, unfinished requests.",
            ["class"],
            registry=r,
        )
        self._budget = Gauge(
            "tokengate_token_budget",
            "Current token budget (sum over backends).",
            registry=r,
        )
        self._budget_effective = Gauge(
            "tokengate_token_budget_effective",
            "Token budget in force (sum over backends): the budget, or the budget an aged request "
            "was let in at while it runs above the adaptive controller's.",
            registry=r,
        )
        self._forwarded = Counter(
            "tokengate_forwarded",
            "Requests relayed to llama-server without admission (gate/data/endpoints.py), by route "
            "(the route table's names, 'other' for a path it does not list) and status class.",
            ["route", "status"],
            registry=r,
        )
        self._queue_depth = Gauge("tokengate_queue_depth", "Requests waiting in the queue.", ["class"], registry=r)
        self._queue_wait = Histogram(
            "tokengate_queue_wait_seconds",
            "Time a request waited in the gate's queue, by class and final outcome: every admitted request "
            "(0 when admitted at once) and every one that waited in a queue before it ended (queue_timeout, "
            "drained, cancelled while queued); a refusal at once (never-fits, queue_full, rate limits, "
            "a paused class) never queued and is not observed (tokengate_decisions_total counts it).",
            ["class", "outcome"],
            buckets=QUEUE_WAIT_BUCKETS,
            registry=r,
        )
        # Per class and final outcome: SLO attainment is the share of a class's requests
        # whose first token came within the objective, read straight from /metrics
        # (tokengate_ttft_seconds_bucket{le=SLO} over tokengate_decisions_total).
        self._ttft_outcome = Histogram(
            "tokengate_ttft_seconds",
            "Time to first token from the request's arrival at the gate (queue wait included), by class and final outcome.",
            ["class", "outcome"],
            buckets=SLO_TTFT_BUCKETS,
            registry=r,
        )
        self._tpot = Histogram(
            "tokengate_tpot_seconds",
            "Time per output token after the first, by class and final outcome.",
            ["class", "outcome"],
            buckets=TPOT_BUCKETS,
            registry=r,
        )
        self._ttft = Histogram(
            "tokengate_upstream_ttft_seconds",
            "Upstream time to first token.",
            ["class"],
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self._duration = Histogram(
            "tokengate_request_duration_seconds",
            "Whole request duration, queueing included.",
            ["class"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self._drain = Gauge(
            "tokengate_queue_drain_seconds",
            "Estimated seconds to drain the current queue at the rate requests finished lately (autoscaling "
            "signal); 3600 while requests wait and none finished lately to measure a rate (a stuck backend reads so).",
            registry=r,
        )
        self._backend_up = Gauge("tokengate_backend_up", "1 when the backend is ready, else 0.", ["backend"], registry=r)
        self._backend_slots = Gauge(
            "tokengate_backend_slots",
            "llama-server slots by state (busy|idle).",
            ["backend", "state"],
            registry=r,
        )
        self._gpu_memory = Gauge(
            "tokengate_gpu_memory_bytes",
            "GPU memory by kind (used|total).",
            ["gpu", "kind"],
            registry=r,
        )
        self._journal_dropped = Counter(
            "tokengate_journal_dropped",
            "Journal rows dropped (full buffer or failing disk).",
            registry=r,
        )
        self._reaped = Counter("tokengate_reaped", "Reservations reclaimed by the reaper.", registry=r)
        self._beside = Counter(
            "tokengate_forward_beside_count",
            "Requests forwarded while llama-server counted them, by what the count did: settled (the "
            "reservation shrank to it), grown (over the bound, and admitted where the bound stood), "
            "over_bound (taken back, then admitted, queued or refused as counted: llama-server "
            "prefilled for nothing), taken_back (count failed or client gone).",
            ["result"],
            registry=r,
        )
        self._token_count = Counter(
            "tokengate_token_count",
            "Prompt token counts by source (exact|estimate).",
            ["source"],
            registry=r,
        )
        # The inference-gateway protocol: per backend, what an endpoint picker routes on.
        self._ig_waiting = Gauge(
            "tokengate_num_requests_waiting",
            "Requests waiting in the gate's queue for this backend (vLLM: num_requests_waiting).",
            ["backend", "model"],
            registry=r,
        )
        self._ig_running = Gauge(
            "tokengate_num_requests_running",
            "Requests dispatched to this backend and not finished (vLLM: num_requests_running).",
            ["backend", "model"],
            registry=r,
        )
        self._ig_kv = Gauge(
            "tokengate_kv_cache_usage_ratio",
            "Tokens reserved in flight / the backend's KV pool, 0..1; 1 while it is not ready (vLLM: kv_cache_usage_perc).",
            ["backend", "model"],
            registry=r,
        )
        self._slo_ttft = Gauge(
            "tokengate_slo_ttft_seconds",
            "The p95 time-to-first-token objective ([budget] slo_ttft_p95_ms), for alerts.",
            registry=r,
        )
        self._objective = Gauge(
            "tokengate_ttft_objective_seconds",
            "Each class's time-to-first-token objective from arrival, the one the gate refuses by and "
            "`met` is judged against: its ttft_objective_ms, else [budget] slo_ttft_p95_ms.",
            ["class"],
            registry=r,
        )
        self._reserved = Gauge(
            "tokengate_class_reserved_tokens",
            "Each class's reservation in force, summed over backends: its reserved_tokens, or less on a "
            "backend where the reservations add up to more than half the ceiling (scaled down, R0).",
            ["class"],
            registry=r,
        )
        # [shared]: tenant limits across gates through Redis (gate/fleet/sharedlimits/).
        self._shared_fallback = Gauge(
            "tokengate_shared_limit_fallback",
            "1 while the [shared] failure policy applies (Redis slow, refusing the connection or the gate's credentials: /health says which), else 0.",
            registry=r,
        )
        self._shared_gates = Gauge(
            "tokengate_shared_gates",
            "Gates seen on the shared Redis, the most within 3 renewal intervals (fail_open's N).",
            registry=r,
        )
        self._shared_policy = Counter(
            "tokengate_shared_limit_policy",
            "Requests decided by the [shared] failure policy instead of Redis.",
            ["policy"],
            registry=r,
        )
        for policy in SHARED_POLICIES:
            self._shared_policy.labels(policy)
        self._shared_expired = Counter(
            "tokengate_shared_leases_expired_held",
            "Leases that expired on Redis while this gate still held them (its renewals came later than a lease "
            "lives: a stalled event loop, or Redis out of reach): meanwhile other gates could admit past a tenant's quota.",
            registry=r,
        )
        self._shared_wait = Histogram(
            "tokengate_shared_limit_wait_seconds",
            "Time admission waited on Redis for one reservation ([shared] wait_ms bounds Redis's part; the gate's own loop lag adds to it).",
            buckets=SHARED_WAIT_BUCKETS,
            registry=r,
        )
        self._channel = Gauge(
            "tokengate_operator_channel_up",
            "0 while consoles cannot attach (control_socket) or retunes are not kept for a restart (overrides).",
            ["channel"],
            registry=r,
        )
        # An operator's pause or freeze outlives the incident (kept for restarts): without these
        # only the console's header showed it, never a dashboard or an alert (an ops trial).
        self._paused = Gauge(
            "tokengate_class_paused",
            "1 while the operator has paused this class (new requests get 503 class_paused).",
            ["class"],
            registry=r,
        )
        self._frozen = Gauge(
            "tokengate_controller_frozen",
            "1 while the operator has frozen the adaptive controller (the budget stays where it was set).",
            registry=r,
        )
        self._overrides = Gauge(
            "tokengate_operator_overrides",
            "Runtime changes in force that differ from the config file (retunes, hand budgets, pauses, the freeze): "
            "`tokengate overrides` lists them.",
            registry=r,
        )
        self._commit_wait = Histogram(
            "tokengate_journal_commit_wait_seconds",
            "Time an answer's last bytes waited for its decision row's commit (DESIGN.md 5; bounded at 1 s): "
            "the journal's writer thread short of CPU or the disk slow shows here, not in the loop lag.",
            buckets=COMMIT_WAIT_BUCKETS,
            registry=r,
        )
        self._info = Info("tokengate", "tokengate build information.", registry=r)
        self._info.info({"version": version})
        for source in TOKEN_COUNT_SOURCES:
            self._token_count.labels(source=source)
        for result in BESIDE_RESULTS:
            self._beside.labels(result=result)

    # -- setup ---------------------------------------------------------------

    def register_classes(self, names: Iterable[str]) -> None:
        """Create the per-class series at 0 so they exist before traffic; only these are labels."""
        for name in names:
            cls = str(name)
            self._classes.add(cls)
            self._in_flight.labels(cls)
            self._queue_depth.labels(cls)
            self._queue_wait.labels(cls, "admitted")
            self._ttft_outcome.labels(cls, "admitted")
            self._tpot.labels(cls, "admitted")
            self._ttft.labels(cls)
            self._duration.labels(cls)
            self._decisions.labels(cls, "admitted", OK_REASON)

    def register_loop_lag(
        self,
        quantiles: Callable[[], dict[float, float]],
        totals: Callable[[], tuple[int, float]],
        cpu: Callable[[], tuple[float, float] | None] | None = None,
        gc_pauses: GcPauses | None = None,
    ) -> None:
        """`tokengate_event_loop_lag_seconds`, a summary read at each scrape: `quantiles()` gives
        {q: seconds} over the last minute (gate/observe/looplag.py), `totals()` (count, sum) since start;
        `tokengate_cpu_seconds_total{state}` from `cpu()`: (running, waiting) seconds; and
        `tokengate_gc_pause_seconds{generation}` from `gc_pauses` (gate/observe/gcpause.py)."""
        self.registry.register(_LoopLagCollector(quantiles, totals, cpu, gc_pauses))

    def register_models(self, names: Iterable[str]) -> None:
        """The model names (from the config) that may appear as the `model` label."""
        self._models.update(str(n) for n in names)

    def _cls(self, cls: str) -> str:
        return cls if cls in self._classes else OTHER

    # -- events --------------------------------------------------------------

    def forwarded(self, route: str, status: int) -> None:
        """One request relayed without admission; `route` is a route table name or "other"."""
        klass = f"{status // 100}xx" if 100 <= status <= 599 else OTHER
        if route not in ROUTE_NAMES:
            route = OTHER
        self._series(self._forwarded, route, klass).inc()

    def decision(self, *, cls: str, outcome: str, reason: str, model: str) -> None:
        """Record one request's final outcome; refusals also count as denials."""
        outcome = str(outcome)
        if outcome not in OUTCOMES:
            raise ValueError(f"unknown outcome {outcome!r}; expected one of {OUTCOMES}")
        label = str(reason) or OK_REASON
        if label not in _REASONS:
            label = OTHER
        cls = self._cls(str(cls))
        self._series(self._decisions, cls, outcome, label).inc()
        if outcome == "refused":
            model = str(model or "")
            self._series(self._denials, model if model in self._models else OTHER, label, cls).inc()

    def queue_wait(self, cls: str, seconds: float, outcome: str = "admitted") -> None:
        self._series(self._queue_wait, self._cls(str(cls)), _outcome(outcome)).observe(max(0.0, seconds))

    def ttft_total(self, cls: str, seconds: float, outcome: str) -> None:
        """Arrival to first token, as the client saw it."""
        self._series(self._ttft_outcome, self._cls(str(cls)), _outcome(outcome)).observe(max(0.0, seconds))

    def tpot(self, cls: str, seconds: float, outcome: str) -> None:
        self._series(self._tpot, self._cls(str(cls)), _outcome(outcome)).observe(max(0.0, seconds))

    def ttft(self, cls: str, seconds: float) -> None:
        self._series(self._ttft, self._cls(str(cls))).observe(max(0.0, seconds))

    def duration(self, cls: str, seconds: float) -> None:
        self._series(self._duration, self._cls(str(cls))).observe(max(0.0, seconds))

    def _series(self, metric: Any, *labels: str) -> Any:
        """One labelled series, cached: `labels()` validates and locks on every call."""
        key = (metric, labels)
        child = self._series_cache.get(key)
        if child is None:
            child = self._series_cache[key] = metric.labels(*labels)
        return child

    def token_count(self, source: str) -> None:
        source = str(source)
        if source not in TOKEN_COUNT_SOURCES:
            raise ValueError(f"unknown token count source {source!r}")
        self._series(self._token_count, source).inc()

    def beside(self, result: str) -> None:
        """One request forwarded beside its count, and what the count did (BESIDE_RESULTS)."""
        if result not in BESIDE_RESULTS:
            raise ValueError(f"unknown forward-beside-count result {result!r}")
        self._series(self._beside, result).inc()

    def journal_dropped(self, n: int = 1) -> None:
        self._journal_dropped.inc(n)

    def reaped(self, n: int = 1) -> None:
        self._reaped.inc(n)

    def commit_wait(self, seconds: float) -> None:
        """How long one answer's last bytes waited for the journal's commit."""
        self._commit_wait.observe(max(0.0, seconds))

    def shared_wait(self, seconds: float) -> None:
        """How long one admission waited on Redis."""
        self._shared_wait.observe(max(0.0, seconds))

    def shared_expired(self, count: int) -> None:
        """`count` leases expired on Redis while this gate held them."""
        self._shared_expired.inc(count)

    def shared_policy(self, policy: str) -> None:
        """One request decided by the [shared] failure policy."""
        self._series(self._shared_policy, policy if policy in SHARED_POLICIES else OTHER).inc()

    # -- state ---------------------------------------------------------------

    def set_class_state(self, cls: str, *, in_flight: int, queued: int) -> None:
        self._in_flight.labels(self._cls(str(cls))).set(in_flight)
        self._queue_depth.labels(self._cls(str(cls))).set(queued)

    def set_budget(self, tokens: int, effective: int | None = None) -> None:
        """The gate's whole budget and the one in force (a stretch: `Admission.effective_budget`);
        with several backends, pass their sums."""
        self._budget.set(tokens)
        self._budget_effective.set(tokens if effective is None else effective)

    def set_drain_seconds(self, s: float) -> None:
        self._drain.set(s)

    def set_backend(self, name: str, *, up: bool, busy: int, total: int) -> None:
        name = str(name)
        self._backend_up.labels(name).set(1 if up else 0)
        self._backend_slots.labels(name, "busy").set(busy)
        self._backend_slots.labels(name, "idle").set(max(0, total - busy))

    def set_inference(self, backend: str, model: str, *, waiting: int, running: int, kv_usage: float) -> None:
        """The inference-gateway gauges of one backend (its name and model come from the config)."""
        labels = (str(backend), str(model))
        self._series(self._ig_waiting, *labels).set(waiting)
        self._series(self._ig_running, *labels).set(running)
        self._series(self._ig_kv, *labels).set(min(1.0, max(0.0, kv_usage)))

    def set_slo_ttft(self, seconds: float) -> None:
        self._slo_ttft.set(seconds)

    def set_ttft_objective(self, cls: str, seconds: float) -> None:
        self._objective.labels(self._cls(str(cls))).set(seconds)

    def set_class_reserved(self, cls: str, tokens: int) -> None:
        self._reserved.labels(self._cls(str(cls))).set(tokens)

    def set_shared(self, *, fallback: bool, gates: int) -> None:
        self._shared_fallback.set(1 if fallback else 0)
        self._shared_gates.set(gates)

    def set_channel(self, channel: str, up: bool) -> None:
        self._channel.labels(channel=channel).set(1 if up else 0)

    def set_operator_state(self, classes: Iterable[str], *, paused: Iterable[str], frozen: bool, overrides: int) -> None:
        """The operator's state in force: each configured class paused or not, the controller's
        freeze, and how many overrides differ from the file."""
        held = set(paused)
        names = {self._cls(str(c)) for c in classes}
        for name in names:
            self._paused.labels(name).set(1 if name in held else 0)
        self._frozen.set(1 if frozen else 0)
        self._overrides.set(overrides)

    def set_gpu(self, gpu: str, *, used: int, total: int) -> None:
        self._gpu_memory.labels(str(gpu), "used").set(used)
        self._gpu_memory.labels(str(gpu), "total").set(total)

    def clear_gpu(self) -> None:
        """Drop every GPU series (e.g. NVML became unavailable)."""
        self._gpu_memory.clear()

    # -- exposition ----------------------------------------------------------

    def render(self) -> tuple[bytes, str]:
        """The `/metrics` body and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST

    def render_inference(self) -> tuple[bytes, str]:
        """The `/metrics/inference` body: the three inference-gateway gauges only. An endpoint
        picker scrapes every 50 ms by default; the whole registry takes ~1.7 ms to render."""
        return generate_latest(self.registry.restricted_registry(INFERENCE_METRICS)), CONTENT_TYPE_LATEST


class _LoopLagCollector:
    """The gate's event-loop delay as a Prometheus summary (quantile 1 is the longest stall)."""

    NAME = "tokengate_event_loop_lag_seconds"

    CPU = "tokengate_cpu_seconds"
    CPU_DOC = (
        "Seconds the gate's threads spent on a CPU (running) and ready to run but waiting for one "
        "(waiting: starved by other work on the host), from the kernel's schedstat."
    )

    GC = "tokengate_gc_pause_seconds"
    GC_DOC = (
        "The garbage collector's pauses of the gate's loop, per generation: count and seconds since start, "
        "quantile 1 the longest within the last minute (a generation-2 pause of seconds stalls every request)."
    )

    def __init__(
        self,
        quantiles: Callable[[], dict[float, float]],
        totals: Callable[[], tuple[int, float]],
        cpu: Callable[[], tuple[float, float] | None] | None,
        gc_pauses: GcPauses | None = None,
    ) -> None:
        self._quantiles = quantiles
        self._totals = totals
        self._cpu = cpu
        self._gc = gc_pauses

    def describe(self) -> list[Metric]:
        return [
            Metric(self.NAME, self._doc(), "summary"),
            Metric(self.CPU, self.CPU_DOC, "counter"),
            Metric(self.GC, self.GC_DOC, "summary"),
        ]

    @staticmethod
    def _doc() -> str:
        return (
            "How late the gate's event loop ran a callback that was due, over the last minute "
            "(quantile 1: the longest stall); every request waits as long."
        )

    def collect(self) -> Iterable[Metric]:
        metric = Metric(self.NAME, self._doc(), "summary")
        for q, seconds in self._quantiles().items():
            metric.add_sample(self.NAME, {"quantile": f"{q:g}"}, seconds)
        count, total = self._totals()
        metric.add_sample(self.NAME + "_count", {}, count)
        metric.add_sample(self.NAME + "_sum", {}, total)
        yield metric
        cpu_s = self._cpu() if self._cpu is not None else None
        if cpu_s is not None:
            cpu = Metric(self.CPU, self.CPU_DOC, "counter")
            for state, value in zip(("running", "waiting"), cpu_s):
                cpu.add_sample(self.CPU + "_total", {"state": state}, value)
            yield cpu
        if self._gc is not None:
            pauses = Metric(self.GC, self.GC_DOC, "summary")
            now = self._gc.clock()
            for g in GENERATIONS:
                labels = {"generation": str(g)}
                pauses.add_sample(self.GC, {**labels, "quantile": "1"}, self._gc.longest(g, now))
                pauses.add_sample(self.GC + "_count", labels, self._gc.count[g])
                pauses.add_sample(self.GC + "_sum", labels, self._gc.total_s[g])
            yield pauses


def _outcome(outcome: str) -> str:
    outcome = str(outcome)
    return outcome if outcome in OUTCOMES else OTHER
