"""Router mode: one model's capacity unit, the parts that need no llama-server call.

A unit is a `gate.backends.Backend` with `model` set; its admission core is held (no slots)
while the model is not loaded, gets the model's own capacity once it is, and refuses its
waiters when the model fails or turns out too small for them. gate/fleet/router_mode.py decides
when; these functions do it, and build what the console shows of a model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gate.backend.gatekeeper import Gatekeeper
from gate.core.admission import Capacity, Refuse
from gate.core.reasons import Reason
from gate.data.snapshot import ModelView

if TYPE_CHECKING:
    from gate.backend.pool import Backend, BackendState

#: a unit's backend state (header, /health) by model status: loaded is "ready"
UNIT_STATE: dict[str, BackendState] = {"unloaded": "unloaded", "sleeping": "sleeping", "failed": "down", "missing": "down"}


@dataclass(slots=True)
class ModelInfo:
    """What the gate knows of one model beyond its admission core."""

    status: str = "unknown"  # a model_plan.Status, or "unknown" before the first GET /models
    exit_code: int = 0
    capacity: Capacity | None = None  # from its /props, kept while it is not loaded
    load_started: float | None = None
    load_cause: str = ""
    last_load_s: float | None = None
    loads: int = 0
    failures: int = 0  # in a row
    failures_total: int = 0
    evictions: int = 0
    retry_at: float = 0.0  # failed: when the gate may load it again
    hold_off_until: float = 0.0  # a load call that did not go through: not again before this
    idle_since: float = 0.0
    asked: bool = False  # an operator asked to load it
    demanded: bool = False  # a request went to a fallback while it was not loaded: load it anyway
    since: float = 0.0  # when the current status began (gate clock)
    note: str = ""  # why it is evicting
    waking: bool = False


class ModelGatekeeper(Gatekeeper):
    """A unit's gatekeeper: `on_change` on every queue change, `on_release` after every release
    (the model's last use, for the least-recently-used choice)."""

    def __init__(
        self,
        admission: Any,
        *,
        clock: Callable[[], float],
        on_change: Callable[[], None],
        on_release: Callable[[], None],
        **kwargs: Any,
    ) -> None:
        super().__init__(admission, clock=clock, on_change=on_change, **kwargs)
        self._on_release = on_release

    def release(self, ticket: Any, *, ran: bool = True) -> bool:
        done = super().release(ticket, ran=ran)
        if done:
            self._on_release()
        return done


def held(cap: Capacity) -> Capacity:
    """A model that is not loaded has no slots: its requests queue, none is dispatched."""
    return dataclasses.replace(cap, slots=0)


def hold(unit: Backend) -> None:
    adm = unit.admission
    if adm is not None and unit.gatekeeper is not None and adm.capacity.slots:
        unit.gatekeeper.set_capacity(held(adm.capacity))


def set_capacity(unit: Backend, cap: Capacity, now: float, floor: int | None = None) -> None:
    """The model is loaded: its own capacity (and the controller's ceiling, and `floor`, the
    floor that follows from it) in force."""
    assert unit.admission is not None and unit.gatekeeper is not None
    ceiling_changed = unit.admission.capacity.ceiling != cap.ceiling
    unit.gatekeeper.set_capacity(cap)
    if ceiling_changed and unit.controller is not None:
        unit.controller.set_ceiling(now, cap.ceiling, floor, reseat=True)  # a model just loaded starts at its ceiling


def refuse_waiting(unit: Backend, reason: Reason, message: str, retry_after_s: float | None) -> None:
    """Every request waiting for the unit gets `reason` (its model failed or is gone)."""
    assert unit.gatekeeper is not None
    unit.gatekeeper.refuse_queued(reason, message, retry_after_s)


def refuse_unfit(unit: Backend, cap: Capacity) -> None:
    """Requests queued before the model's first load that its context can never hold: 400.
    Their prompts are estimates (a model not loaded cannot count), often twice the count: only
    what holds whatever the prompt is refused here (its max_tokens alone, with a 1-token
    prompt per task, too many tasks); the rest is counted at dispatch and judged then
    (proxy._recount; a trial's 290-token chat was refused here as 530 > 512)."""
    adm, keeper = unit.admission, unit.gatekeeper
    assert adm is not None and keeper is not None
    refusals = []
    for cls in adm.class_names:
        reach = adm.class_reach(cls, cap.ceiling)
        for waiting in list(adm.queue(cls)):
            request = waiting.request
            least = request.tasks * (1 + request.max_tokens)  # the smallest it could be: one prompt token a task
            if request.tasks > cap.slots or least > reach:
                why = f"request needs at least {least} tokens ({request.tasks} tasks) where model {unit.model!r} holds at most {min(cap.slot_context, reach)}"
            elif 1 + request.max_tokens > cap.slot_context:
                why = (
                    f"max_tokens {request.max_tokens} alone exceeds the {cap.slot_context}-token context of a slot of model {unit.model!r}"
                )
            else:
                continue
            adm.cancel(request.id)
            refusals.append(Refuse(request, Reason.CONTEXT_LENGTH_EXCEEDED, why))
    if refusals:
        keeper.refuse_waiting(refusals)


def model_view(
    backend: str,
    unit: Backend,
    info: ModelInfo,
    *,
    pinned: bool,
    blocked: str,
    models_max: int,
    now: float,
    telemetry: Any,
) -> ModelView:
    """What the console shows of one model."""
    adm, cap, model = unit.admission, unit.capacity, unit.model
    assert adm is not None and model is not None
    detail = unit.detail
    if info.status == "failed" and now < info.retry_at:
        detail = f"exit code {info.exit_code}; retry in {max(1, round(info.retry_at - now))} s"
    elif blocked and adm.waiting() and info.status in ("unloaded", "failed"):
        detail = f"waits: {blocked}"
    return ModelView(
        backend=backend,
        name=model,
        unit=unit.name,
        status=info.status,
        detail=detail,
        pinned=pinned,
        slots_busy=len(adm.ledger),
        slots_total=cap.slots if cap is not None and info.status == "loaded" else None,
        slot_context=cap.slot_context if cap is not None else None,
        in_flight=adm.ledger.in_flight,
        queued=adm.waiting(),
        last_load_s=info.last_load_s,
        loads=info.loads,
        evictions=info.evictions,
        failures=info.failures_total,
        idle_s=None if len(adm.ledger) else now - info.idle_since,
        models_max=models_max,
        requests_deferred=None if telemetry is None or telemetry.stale else telemetry.requests_deferred,
    )
