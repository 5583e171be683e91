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
- Label values are bounded: a class, model or reason label is a configured class
  (`register_classes`), a configured model (`register_models`), a `Reason` (or
  "ok", "client_disconnect", "server_cancelled"), or "" (not known: refused before
  identification, no model given); anything else is "other". The `model` label
  used to copy the client's field: 300 refusals with random 20 kB model names grew
  /metrics from 16 kB to 12.4 MB. So the series count is at most
  (classes + 2) x (models + 2) x (reasons + 2) per counter.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from gate import __version__
from gate.reasons import CLIENT_DISCONNECT, SERVER_CANCELLED, Reason

OUTCOMES = ("admitted", "refused", "shed", "cancelled", "failed")
OK_REASON = "ok"
OTHER = "other"  # every label value that is not a configured name
_REASONS = frozenset({*(r.value for r in Reason), OK_REASON, CLIENT_DISCONNECT, SERVER_CANCELLED})
TOKEN_COUNT_SOURCES = ("exact", "estimate")
SHARED_POLICIES = ("fail_open", "fail_closed")
# 0.1 ms .. 100 ms: a reservation is one round trip to a Redis nearby, cut at wait_ms (20 ms)
SHARED_WAIT_BUCKETS = (
    0.0001, 0.0002, 0.0003, 0.0005, 0.00075, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1,
)  # fmt: skip

# 1 ms .. 120 s
QUEUE_WAIT_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0,
)  # fmt: skip
# 10 ms .. 60 s
TTFT_BUCKETS = (
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0,
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
        self._queue_depth = Gauge(
            "tokengate_queue_depth", "Requests waiting in the queue.", ["class"], registry=r
        )
        self._queue_wait = Histogram(
            "tokengate_queue_wait_seconds",
            "Time a request waited before admission.",
            ["class"],
            buckets=QUEUE_WAIT_BUCKETS,
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
            "Estimated seconds to drain the current queue (autoscaling signal).",
            registry=r,
        )
        self._backend_up = Gauge(
            "tokengate_backend_up", "1 when the backend is ready, else 0.", ["backend"], registry=r
        )
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
        self._reaped = Counter(
            "tokengate_reaped", "Reservations reclaimed by the reaper.", registry=r
        )
        self._token_count = Counter(
            "tokengate_token_count",
            "Prompt token counts by source (exact|estimate).",
            ["source"],
            registry=r,
        )
        # [shared]: tenant limits across gates through Redis (gate/sharedlimits/).
        self._shared_fallback = Gauge(
            "tokengate_shared_limit_fallback",
            "1 while the [shared] failure policy applies (Redis out of reach or slow), else 0.",
            registry=r,
        )
        self._shared_gates = Gauge(
            "tokengate_shared_gates",
            "Gates seen on the shared Redis at the last lease renewal (fail_open's N).",
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
        self._shared_wait = Histogram(
            "tokengate_shared_limit_wait_seconds",
            "Time admission waited on Redis for one reservation (at most [shared] wait_ms).",
            buckets=SHARED_WAIT_BUCKETS,
            registry=r,
        )
        self._info = Info("tokengate", "tokengate build information.", registry=r)
        self._info.info({"version": version})
        for source in TOKEN_COUNT_SOURCES:
            self._token_count.labels(source=source)

    # -- setup ---------------------------------------------------------------

    def register_classes(self, names: Iterable[str]) -> None:
        """Create the per-class series at 0 so they exist before traffic; only these are labels."""
        for name in names:
            cls = str(name)
            self._classes.add(cls)
            self._in_flight.labels(cls)
            self._queue_depth.labels(cls)
            self._queue_wait.labels(cls)
            self._ttft.labels(cls)
            self._duration.labels(cls)
            self._decisions.labels(cls, "admitted", OK_REASON)

    def register_models(self, names: Iterable[str]) -> None:
        """The model names (from the config) that may appear as the `model` label."""
        self._models.update(str(n) for n in names)

    def _cls(self, cls: str) -> str:
        return cls if cls in self._classes else OTHER

    # -- events --------------------------------------------------------------

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

    def queue_wait(self, cls: str, seconds: float) -> None:
        self._series(self._queue_wait, self._cls(str(cls))).observe(max(0.0, seconds))

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

    def journal_dropped(self, n: int = 1) -> None:
        self._journal_dropped.inc(n)

    def reaped(self, n: int = 1) -> None:
        self._reaped.inc(n)

    def shared_wait(self, seconds: float) -> None:
        """How long one admission waited on Redis."""
        self._shared_wait.observe(max(0.0, seconds))

    def shared_policy(self, policy: str) -> None:
        """One request decided by the [shared] failure policy."""
        self._series(self._shared_policy, policy if policy in SHARED_POLICIES else OTHER).inc()

    # -- state ---------------------------------------------------------------

    def set_class_state(self, cls: str, *, in_flight: int, queued: int) -> None:
        self._in_flight.labels(self._cls(str(cls))).set(in_flight)
        self._queue_depth.labels(self._cls(str(cls))).set(queued)

    def set_budget(self, tokens: int) -> None:
        """The gate's whole budget; with several backends, pass their sum."""
        self._budget.set(tokens)

    def set_drain_seconds(self, s: float) -> None:
        self._drain.set(s)

    def set_backend(self, name: str, *, up: bool, busy: int, total: int) -> None:
        name = str(name)
        self._backend_up.labels(name).set(1 if up else 0)
        self._backend_slots.labels(name, "busy").set(busy)
        self._backend_slots.labels(name, "idle").set(max(0, total - busy))

    def set_shared(self, *, fallback: bool, gates: int) -> None:
        self._shared_fallback.set(1 if fallback else 0)
        self._shared_gates.set(gates)

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
