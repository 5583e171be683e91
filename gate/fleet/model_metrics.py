"""Router-mode metrics: one collector on the gate's registry, read from the model fleets per scrape.

Series (labels are configured names only: a backend, one of its `models`, a status of
gate/core/model_plan.py, a reroute cause):

  tokengate_model_status{backend, model, status}          1 for the model's current status
  tokengate_model_load_seconds{backend, model}            its last measured load time
  tokengate_model_loads_total{backend, model}             loads the gate saw complete
  tokengate_model_failures_total{backend, model}          child processes that exited with an error
  tokengate_model_evictions_total{backend, model}         evictions the gate chose
  tokengate_model_requests_in_flight{backend, model}      reservations held (one slot each)
  tokengate_model_queue_depth{backend, model}             requests waiting in the gate for it
  tokengate_model_reroutes_total{from_model, to_model, why}  answered by a fallback (why:
                                                           saturated | loading | refused)

Per-model budgets, slots and llama-server's own queue are in the backend series already,
under the unit's name ("backend/model").
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gate.core.model_plan import STATUSES

REROUTE_CAUSES = ("saturated", "loading", "refused")
_ALL_STATUSES = (*STATUSES, "unknown")


class ModelMetrics:
    """The collector; `rerouted` counts one request answered by a fallback model."""

    def __init__(self, registry: CollectorRegistry, fleets: Callable[[], Iterable[Any]], models: Iterable[str]) -> None:
        self._fleets = fleets
        self._models = frozenset(models)
        self._reroutes: dict[tuple[str, str, str], int] = {}
        registry.register(self)

    def _label(self, model: str | None) -> str:
        return model if model in self._models else "other"

    def rerouted(self, from_model: str | None, to_model: str | None, why: str) -> None:
        key = (self._label(from_model), self._label(to_model), why if why in REROUTE_CAUSES else "other")
        self._reroutes[key] = self._reroutes.get(key, 0) + 1

    def describe(self) -> Iterator[Metric]:
        return iter(())  # no fixed series before router mode is seen

    def collect(self) -> Iterator[Metric]:
        labels = ["backend", "model"]
        status = GaugeMetricFamily("tokengate_model_status", "1 for each router-mode model's current status.", labels=[*labels, "status"])
        load = GaugeMetricFamily("tokengate_model_load_seconds", "The model's last measured load time (router mode).", labels=labels)
        loads = CounterMetricFamily("tokengate_model_loads", "Model loads the gate saw complete (router mode).", labels=labels)
        failures = CounterMetricFamily(
            "tokengate_model_failures", "Model processes that exited with an error (router mode).", labels=labels
        )
        evictions = CounterMetricFamily(
            "tokengate_model_evictions", "Models the gate evicted to load another (router mode).", labels=labels
        )
        in_flight = GaugeMetricFamily("tokengate_model_requests_in_flight", "Requests holding a reservation on the model.", labels=labels)
        queued = GaugeMetricFamily("tokengate_model_queue_depth", "Requests waiting in the gate for the model.", labels=labels)
        seen = False
        for fleet in self._fleets():
            for view in fleet.views({}):
                seen = True
                key = [view.backend, view.name]
                for s in _ALL_STATUSES:
                    status.add_metric([*key, s], 1.0 if view.status == s else 0.0)
                if view.last_load_s is not None:
                    load.add_metric(key, view.last_load_s)
                loads.add_metric(key, view.loads)
                failures.add_metric(key, view.failures)
                evictions.add_metric(key, view.evictions)
                in_flight.add_metric(key, view.slots_busy)
                queued.add_metric(key, view.queued)
        reroutes = CounterMetricFamily(
            "tokengate_model_reroutes", "Requests answered by a fallback model, by cause.", labels=["from_model", "to_model", "why"]
        )
        for (src, dst, why), n in sorted(self._reroutes.items()):
            reroutes.add_metric([src, dst, why], n)
        if seen:
            yield from (status, load, loads, failures, evictions, in_flight, queued)
        if self._reroutes:
            yield reroutes
