"""The replay engine (pure: no I/O, no clock; the same inputs give the same answer).

A discrete-event loop drives the gate's own admission core (`gate.core.admission`), budget
owner (`gate.core.adaptive`, as `gate.backend.pool` builds it) and prefill model
(`gate.core.prefill`) exactly as the async shell (`gate.backend.gatekeeper`) does, in front
of a request-level model of llama-server fitted from the same journal (`BackendFit`):

* a dispatched request holds one of `slots`; with ``k`` requests in flight after its
  dispatch and ``ahead`` prompt tokens already prefilling, its first token comes
  ``ttft_base_s + ttft_per_busy_s * (k - 1) + (prompt + ahead) / prefill_tps`` after dispatch;
* its other ``n - 1`` tokens take ``tpot_alone_s + tpot_per_busy_s * (k - 1)`` each (decode
  slows as occupancy grows: llama-server batches every slot's next token into one step);
* an arrival whose max_tokens is over its class's ``max_tokens_cap`` is refused at intake
  (``invalid_request``), as the gate answers it 400, before the core sees it;
* ``n`` is the completion tokens it really generated (recorded), or, for a request the
  recording refused, its class's median ratio of generated to max_tokens times its max_tokens.

Events at one instant run in a fixed order (audit changes, completions, first tokens,
arrivals, timers, controller ticks; then by sequence), so a replay is deterministic.

A gate restart inside the window (a ``config_in_force`` change: the new gate's thresholds)
applies as the new gate starts: its classes' settings and ``[budget]``, its ceiling, a budget
controller and prefill model started afresh at what its config says, every pause and the
freeze ended (a ``restored`` change after it puts back what the new gate restored). A
proposal's own keys keep their proposed value across it. The core's queue, ledger and
measured holds carry over (llama-server's slots are the same).
Arrivals the core never saw (refused before admission: rate limits, bad input, no backend)
keep their recorded outcome in every scenario.
"""

from __future__ import annotations

import dataclasses
import heapq
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gate.backend.pool import controller_settings, reserved_total
from gate.config.reader import config_from_dict
from gate.config.schema import BudgetConfig, ClassConfig, Config, ConfigError
from gate.config.thresholds import CONFIG_IN_FORCE, thresholds_of, without_credentials
from gate.core.adaptive import controller_for, has_demand
from gate.core.admission import Admission, Admit, Capacity, Queue, Refuse, Step, TenantPolicy
from gate.core.ledger import Request
from gate.core.prefill import PrefillModel
from gate.core.reasons import Reason

#: the reasons only the admission core gives: an arrival refused for another reason never
#: reached it, and keeps its recorded outcome in every scenario
CORE_REASONS = frozenset(
    {
        Reason.QUEUE_FULL.value,
        Reason.QUEUE_TIMEOUT.value,
        Reason.TOKEN_BUDGET_EXCEEDED.value,
        Reason.TENANT_QUOTA.value,
        Reason.CLASS_PAUSED.value,
        Reason.DRAINED.value,
        Reason.CONTEXT_LENGTH_EXCEEDED.value,
    }
)
#: the gate ticks its budget controller once a second (gate/service.py)
TICK_S = 1.0

# event kinds, in their order within one instant
_AUDIT, _DONE, _FIRST, _ARRIVE, _TIMER, _TICK = range(6)


@dataclass(frozen=True, slots=True)
class Arrival:
    """One recorded request, as replay needs it (times in seconds from the window's start)."""

    id: str
    at: float
    tenant: str
    cls: str
    prompt_tokens: int
    max_tokens: int
    completion_tokens: int | None  # what it really generated (None: it never ran)
    through_core: bool  # False: refused before admission; its outcome is kept as recorded
    outcome: str  # recorded
    reason: str  # recorded
    queue_ms: float | None = None  # recorded
    ttft_arrival_ms: float | None = None  # recorded, from arrival
    stream: bool = True
    endpoint: str = ""
    duration_ms: float | None = None  # recorded, arrival to the last token


@dataclass(frozen=True, slots=True)
class Change:
    """One recorded change to the thresholds (an audit row), at `at` seconds (<= 0: in force at the start)."""

    at: float
    action: str
    target: str
    new_value: str | None


@dataclass(frozen=True, slots=True)
class BackendFit:
    """llama-server as fitted from the journal (see the module docstring for the model)."""

    slots: int
    slot_context: int
    ceiling: int
    kv: str = "unified"
    ttft_base_s: float = 0.05
    ttft_per_busy_s: float = 0.0
    prefill_tps: float = 2000.0
    tpot_alone_s: float = 0.02
    tpot_per_busy_s: float = 0.0
    points: int = 0  # requests the fit rests on
    notes: tuple[str, ...] = ()

    def ttft_s(self, prompt: int, ahead: int, busy: int) -> float:
        return max(1e-4, self.ttft_base_s + self.ttft_per_busy_s * max(0, busy - 1) + (prompt + ahead) / self.prefill_tps)

    def tpot_s(self, busy: int) -> float:
        return max(1e-5, self.tpot_alone_s + self.tpot_per_busy_s * max(0, busy - 1))


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one arrival got in a scenario."""

    admitted: bool
    reason: str  # "ok" when admitted, else the refusal reason
    queue_ms: float | None
    ttft_arrival_ms: float | None
    completion_tokens: int
    duration_ms: float | None = None  # arrival to the last token
    #: admitted, then failed (the backend broke, timed out, answered 5xx): the recorded reason.
    #: The replay cannot predict a failure: an arrival it admits keeps the one recorded for it.
    failed: str | None = None


@dataclass(slots=True)
class _Live:
    arrival: Arrival
    dispatched_at: float
    ttft_s: float
    tokens: int
    ahead: int
    tpot_s: float


@dataclass(slots=True)
class _Run:
    """One scenario's mutable state."""

    config: Config
    fit: BackendFit
    arrivals: Sequence[Arrival]
    changes: Sequence[Change]
    until: float
    fill_ratio: Mapping[str, float]
    heap: list[tuple[float, int, int, Any]] = field(default_factory=list)
    seq: int = 0
    out: dict[str, Outcome] = field(default_factory=dict)
    live: dict[str, _Live] = field(default_factory=dict)
    timer_at: float = math.inf

    def push(self, at: float, kind: int, payload: Any) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (at, kind, self.seq, payload))


#: refusals of a request that never fits, decided before a pause: the gate, which asks before the
#: count, refuses a paused class's arrival as paused first. Asked only in a paused class: asked
#: of every such refusal (and token_budget_exceeded), a replay took 43% longer (6.3 s against
#: 4.4 s for 20,000 decisions) for a reason told at once either way (T1's queue_timeout of the
#: prompt as 0, where the gate's count would have said it never fits).
_BY_SIZE = frozenset({Reason.CONTEXT_LENGTH_EXCEEDED, Reason.INVALID_REQUEST, Reason.TENANT_QUOTA})


def _policy_for(config: Config) -> Any:
    tenants = {t.name: TenantPolicy(weight=t.weight, max_tokens_in_flight=t.max_tokens_in_flight) for t in config.tenants}
    default = TenantPolicy()
    return lambda name: tenants.get(name, default)


def _parse(text: str | None) -> Any:
    if text is None or text in ("None", "none"):  # "none" in the audit's k=v pairs since 2026-12-07
        return None
    if text in ("True", "true"):
        return True
    if text in ("False", "false"):
        return False
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _pairs(text: str | None) -> dict[str, Any]:
    """`k=v, k=v` (set_class / set_budget_settings audit values) into a dict."""
    out: dict[str, Any] = {}
    for part in (text or "").split(", "):
        key, sep, value = part.partition("=")
        if sep:
            out[key.strip()] = _parse(value.strip())
    return out


def replay(
    config: Config,
    fit: BackendFit,
    arrivals: Sequence[Arrival],
    changes: Sequence[Change] = (),
    *,
    until: float,
    pinned: frozenset[str] = frozenset(),
    budget_curve: list[tuple[float, int]] | None = None,
) -> dict[str, Outcome]:
    """Run `arrivals` through the core under `config` and the recorded `changes` (except those
    touching a key in `pinned`: a proposal's own keys); the outcome of each arrival by id.
    `budget_curve`, if given, gets (seconds, the working budget) at the start and at each move."""
    ratio = _fill_ratio(arrivals)
    kept = [u for c in changes if (u := unpinned(c, pinned)) is not None]
    run = _Run(config, fit, arrivals, kept, until, ratio)
    cap = _capacity(config, fit)
    # the classes' reservations raise the floor, as the gate's pool passes them (with min_tokens
    # 0 the replay's floor was a quarter of the ceiling where the gate's was the reservations)
    settings = controller_settings(config.budget, cap.ceiling, reserved_total(config.classes, cap.ceiling))
    controller = controller_for(config.budget.mode, settings)
    prefill = PrefillModel()
    adm = Admission(
        config.classes,
        cap,
        budget=controller.budget,
        tenant_policy=_policy_for(config),
        aging_s=config.budget.aging_s or None,
        keep_slots=config.budget.keep_slots,
        # as gate.backend.pool builds the core: the fitted prefill model, else the median
        # first-token time measured lately, and [budget] slo_ttft_p95_ms as the TTFT objective of
        # every class without its own (T1-T3; the replay had neither, so it refused nothing on a
        # TTFT objective that the gate refused on, since #25)
        expected_ttft=lambda r, prefilling: prefill.expected_or_recent(r.prompt_tokens, prefilling),
        first_token_spread=lambda chance: prefill.spread(chance),  # `prefill` is replaced at a restart
        # a line of the prompt's tokens with a rate > 0, or a median: never less for a longer prompt (#24)
        ttft_grows_with_prompt=True,
        default_ttft_objective_ms=config.budget.slo_ttft_p95_ms,
        budget_elastic=lambda: controller.elastic,
    )
    classes = {c.name: c for c in config.classes}
    # "file": the config file's thresholds (the proposal's keys at their value), what dropping
    # the runtime overrides goes back to; "config": those in force
    state: dict[str, Any] = {"config": config, "file": config, "slo_s": config.budget.slo_ttft_p95_ms / 1000.0}

    def dispatch(admit: Admit, now: float) -> None:
        a = by_id[admit.request.id]
        busy = len(adm.ledger)
        ahead = max(0, adm.ledger.prefilling - a.prompt_tokens)
        ttft = fit.ttft_s(a.prompt_tokens, ahead, busy)
        tokens = _tokens(a, run.fill_ratio)
        live = _Live(a, now, ttft, tokens, ahead, fit.tpot_s(busy))
        run.live[a.id] = live
        run.push(now + ttft, _FIRST, a.id)

    def refused(refusal: Refuse) -> None:
        run.out[refusal.request.id] = Outcome(False, refusal.reason.value, None, None, 0)

    def advance(now: float) -> None:
        if not adm.waiting():
            return  # nothing to expire, age or dispatch: the core's advance would change nothing
        step = adm.advance(now)
        for admit in step.admitted:
            dispatch(admit, now)
        for refusal in step.expired:
            refused(refusal)
        arm(now, step)

    def arm(now: float, step: Step | None = None) -> None:
        if not adm.waiting():
            return  # nothing waits: no deadline (the core's next_deadline walks every waiter)
        deadline = adm.next_deadline(now, after=step)  # nothing changed the core since `step`
        if deadline is not None and deadline < run.timer_at:
            run.timer_at = max(deadline, now)
            run.push(run.timer_at, _TIMER, None)

    def budget_moved(_budget: int) -> None:  # the pool's `controller.on_change(gatekeeper.set_budget)`
        adm.set_budget(controller.budget)
        if budget_curve is not None:
            budget_curve.append((current[0], adm.budget))
        advance(current[0])

    def restart(change: Change, now: float) -> None:
        """A new gate started with the thresholds of `change` (a config_in_force row): as
        `gate.backend.pool.apply_capacity` builds its core's settings, over the same core."""
        nonlocal controller, prefill
        new = restarted_config(change.new_value, config, pinned)
        if new is None:
            return
        _classes_back_to(new, adm, classes)
        for name in adm.class_names:
            adm.resume(name)  # the old gate's pauses end with it (a `restored` row puts one back)
        state["config"] = dataclasses.replace(state["config"], budget=new.budget)
        state["file"] = new  # the new gate's file (its restored overrides come as `restored` rows)
        _core_budget_keys(new.budget, adm, state)
        adm.set_capacity(_capacity(new, fit))
        controller = controller_for(new.budget.mode, controller_settings(new.budget, adm.capacity.ceiling, adm.reserved_total))
        controller.on_change(budget_moved)
        prefill = PrefillModel()
        adm.prefill_cap_auto = None
        adm.set_budget(controller.budget)
        if budget_curve is not None:
            budget_curve.append((now, adm.budget))
        advance(now)

    controller.on_change(budget_moved)
    current = [0.0]
    if budget_curve is not None:
        budget_curve.append((0.0, adm.budget))
    by_id = {a.id: a for a in arrivals}
    for a in arrivals:
        if a.through_core and a.cls in classes:
            run.push(a.at, _ARRIVE, a)
        else:
            run.out[a.id] = as_recorded(a)
    for c in run.changes:
        run.push(max(0.0, c.at), _AUDIT, c)
    ticks = int(until // TICK_S)
    for i in range(1, ticks + 1):
        run.push(i * TICK_S, _TICK, None)

    while run.heap:
        now, kind, _, payload = heapq.heappop(run.heap)
        current[0] = now
        if kind == _ARRIVE:
            a = payload
            if a.max_tokens > classes[a.cls].max_tokens_cap:
                # refused at intake, before the core, as gate/http/intake.py refuses it (400)
                run.out[a.id] = Outcome(False, Reason.INVALID_REQUEST.value, None, None, 0)
                continue
            req = Request(a.id, a.cls, a.tenant, a.prompt_tokens, a.max_tokens, now)
            decision = adm.offer(req, now)
            if isinstance(decision, Refuse) and decision.reason in _BY_SIZE and adm.queue(a.cls).paused:
                # The gate asks before its count (gate/http/proxy.py `_refuse_before_count`, the
                # prompt taken as 0): a paused class refuses before the size is known. Offered
                # whole, a window with batch paused under a smaller budget replayed class_paused
                # as context_length_exceeded (a trial). Asked only here (offer changed nothing):
                # asked of every arrival first, a replay took 37% longer (bench/replay_speed.py).
                early = adm.refuses_before_count(Request(a.id, a.cls, a.tenant, 0, a.max_tokens, now), now)
                if early is not None:
                    decision = early
            if isinstance(decision, Admit):
                dispatch(decision, now)
            elif isinstance(decision, Refuse):
                refused(decision)
            elif isinstance(decision, Queue):
                arm(now)
        elif kind == _FIRST:
            live = run.live[payload]
            held = adm.ledger.get(payload)
            if held is not None and held.prefilling:
                prefill.observe(live.arrival.prompt_tokens + live.ahead, live.ttft_s)
                adm.prefill_cap_auto = prefill.auto_prefill_cap(state["slo_s"])
            run.push(now + max(0, live.tokens - 1) * live.tpot_s, _DONE, payload)
            if adm.first_token(payload):
                advance(now)
        elif kind == _DONE:
            live = run.live.pop(payload)
            a = live.arrival
            queue_s = live.dispatched_at - a.at
            run.out[a.id] = Outcome(
                True, "ok", queue_s * 1000.0, (queue_s + live.ttft_s) * 1000.0, live.tokens, (now - a.at) * 1000.0, failed_reason(a)
            )
            adm.release(payload, now)
            controller.observe(now, live.ttft_s, live.tpot_s if live.tokens > 1 else None)
            advance(now)
        elif kind == _TIMER:
            if now >= run.timer_at:
                run.timer_at = math.inf
            advance(now)
        elif kind == _TICK:
            controller.tick(now, has_demand(adm.waiting(), adm.ledger.in_flight, adm.budget))
        elif payload.action == CONFIG_IN_FORCE:
            restart(payload, now)
        else:
            _apply(payload, now, adm, controller, classes, state, advance, refused)
    # Still waiting when everything else ended: the window closed on them (counted as refused).
    for cls in adm.class_names:
        for w in list(adm.queue(cls)):
            run.out.setdefault(w.request.id, Outcome(False, "still_waiting", None, None, 0))
    return run.out


def _capacity(config: Config, fit: BackendFit) -> Capacity:
    return Capacity(
        slots=fit.slots,
        slot_context=fit.slot_context,
        # A configured token_budget replaces the pool as the ceiling, as `capacity_from_props` does.
        ceiling=config.backends[0].token_budget or fit.ceiling,
        max_prefill_tokens=config.backends[0].max_prefill_tokens,
        prefill_yield_tokens=config.backends[0].prefill_yield_tokens or None,
    )


def restarted_config(text: str | None, scenario: Config, pinned: frozenset[str] = frozenset()) -> Config | None:
    """The thresholds a restarted gate runs with (a config_in_force value), but the keys a
    proposal sets (`pinned`, as `backends.K`, `budget.K`, `classes.C.K`) at their value in the
    proposal's `scenario`; None when the value does not read as thresholds."""
    try:
        data = json.loads(text or "")
        ours = thresholds_of(scenario)
        for key in pinned:
            head, _, rest = key.partition(".")
            if head == "budget":
                src, dst, name = ours["budget"], data.setdefault("budget", {}), rest
            elif head == "classes":
                cls, _, name = rest.partition(".")
                if cls not in ours["classes"] or cls not in data.get("classes", {}):
                    continue
                src, dst = ours["classes"][cls], data["classes"][cls]
            elif head == "backends" and ours["backends"] and data.get("backends"):
                src, dst, name = ours["backends"][0], data["backends"][0], rest
            else:
                continue
            if name in src:
                dst[name] = src[name]
            else:
                dst.pop(name, None)
        return config_from_dict(without_credentials(data), "<config_in_force>")
    except (ValueError, TypeError, AttributeError, KeyError, ConfigError):
        return None


#: the audit actions a replay applies (`_apply`; a gate restart, ``config_in_force``, is applied
#: too but is no operator's move); the others (started, capacity_learned, ...) say what
#: happened, not what the thresholds were
REPLAYED_ACTIONS = frozenset(
    {
        "pause_class",
        "resume_class",
        "drain_class",
        "freeze",
        "unfreeze",
        "set_budget",
        "restored",
        "set_class",
        "set_budget_settings",
        "reload",
        "overrides_dropped",
    }
)


def _apply(
    change: Change,
    now: float,
    adm: Admission,
    controller: Any,
    classes: dict[str, ClassConfig],
    state: dict[str, Any],
    advance: Any,
    refused: Any,
) -> None:
    """One recorded operator change, as `gate.ops.control` applied it."""
    action, target = change.action, change.target
    name = target.partition(":")[2]
    if action in ("pause_class", "resume_class") and name in classes:
        adm.pause(name) if action == "pause_class" else adm.resume(name)
    elif action == "drain_class" and name in classes:
        for refusal in adm.drain(name, now):  # its waiters' outcome: 503 drained
            refused(refusal)
    elif action in ("freeze", "unfreeze"):
        controller.freeze() if action == "freeze" else controller.unfreeze()
    elif action in ("set_budget", "restored") and target.startswith("backend:"):
        value = _parse(change.new_value)
        if isinstance(value, int):
            controller.set_budget(now, value)
    elif action == "restored" and target.startswith("class:") and name in classes:
        adm.pause(name) if change.new_value == "paused" else adm.resume(name)
    elif action == "restored" and target == "controller":
        controller.freeze() if change.new_value == "frozen" else controller.unfreeze()
    elif action == "set_class" and name in classes:
        _set_class(name, _pairs(change.new_value), adm, classes)
    elif action == "set_budget_settings":
        _set_budget_settings(_pairs(change.new_value), now, adm, controller, state)
    elif action in ("reload", "restored") and target.startswith("classes."):
        _, cls, key = target.split(".", 2)
        if cls in classes:
            _set_class(cls, {key: _parse(change.new_value)}, adm, classes)
            if action == "reload":  # the file says so from now on (what dropping the overrides goes back to)
                _set_file(state, cls, {key: _parse(change.new_value)})
    elif action in ("reload", "restored") and target.startswith("budget."):
        _set_budget_settings({target.split(".", 1)[1]: _parse(change.new_value)}, now, adm, controller, state)
        if action == "reload":
            _set_file(state, None, {target.split(".", 1)[1]: _parse(change.new_value)})
    elif action == "overrides_dropped":
        _drop_overrides(now, adm, controller, classes, state)
    advance(now)


def in_force_from_start(change: Change, first_arrival_s: float) -> bool:
    """Is `change` in force from the window's start: before it (``at`` <= 0), or an override a
    restarted gate restored before the window's first arrival (`in_force_at_start`)?"""
    return change.at <= 0 or (change.action == "restored" and change.at <= first_arrival_s)


def in_force_at_start(config: Config, changes: Sequence[Change], first_arrival_s: float = 0.0, *, upto: float | None = None) -> Config:
    """The thresholds in force at the window's start: `config` (the gate's, its config_in_force
    row) with the recorded threshold changes before the window (``at`` <= 0: retunes, reloads,
    overrides a restarted gate restored, a drop of the overrides) applied as `replay` applies them
    at its start (`_apply`). A proposal is compared with these, not with the gate's start: after
    a retune of queue_depth 6 -> 12 before the window, a trial's ``--set queue_depth=6`` ("what
    if I had not retuned?") pinned nothing and replayed 12. Pauses, drains, the freeze and a
    budget set by hand are the controller's and the queues' state, not thresholds: not here.

    `first_arrival_s`: the window's first arrival. The overrides a gate restored at its start
    (``restored`` rows) before it count too: a window begun in a restart's gap (the old gate
    gone, the new one not started) took the new gate's bare file as in force, though every
    request of the window met its restored overrides (a trial).

    `upto`: the changes up to that moment too (``float("inf")``: the thresholds in force at the
    window's end), a gate restarted in between included."""
    now, file = config, config
    for c in changes:
        if not (in_force_from_start(c, first_arrival_s) or (upto is not None and c.at <= upto)):
            continue
        action, target = c.action, c.target
        if action == CONFIG_IN_FORCE:  # a gate restarted (none before the window: its row starts it)
            new = restarted_config(c.new_value, config)
            if new is not None:
                now = file = dataclasses.replace(now, classes=new.classes, budget=new.budget)
        elif action == "set_class":
            now = _class_values(now, target.partition(":")[2], _pairs(c.new_value))
        elif action == "set_budget_settings":
            now = _budget_values(now, _pairs(c.new_value))
        elif action in ("reload", "restored") and target.startswith("classes.") and target.count(".") >= 2:
            _, cls, key = target.split(".", 2)
            now = _class_values(now, cls, {key: _parse(c.new_value)})
            if action == "reload":
                file = _class_values(file, cls, {key: _parse(c.new_value)})
        elif action in ("reload", "restored") and target.startswith("budget."):
            values = {target.split(".", 1)[1]: _parse(c.new_value)}
            now = _budget_values(now, values)
            if action == "reload":
                file = _budget_values(file, values)
        elif action == "overrides_dropped":
            now = dataclasses.replace(now, classes=file.classes, budget=file.budget)
    return now


def budget_held_at(
    config: Config, changes: Sequence[Change], first_arrival_s: float = 0.0, *, upto: float | None = None
) -> tuple[bool, int | None]:
    """Is the working budget held where it is at the window's start (`upto`: at that moment, as
    `in_force_at_start`): the controller frozen, or the mode static? With the last budget set by
    hand (or restored by a restarted gate) while it is, else None. The what-if's form shows a
    held budget as ``backend.token_budget``: it showed the pool, and the apply's confirmation
    said "backend.token_budget 1200 (replayed with 2048)" of a replay that had run at the hand
    budget of 1200 (a trial)."""
    state, budget = _controller_at(config, changes, first_arrival_s, upto)
    held = state != "adaptive"
    return held, budget if held else None


def controller_state_at(config: Config, changes: Sequence[Change], first_arrival_s: float = 0.0, *, upto: float | None = None) -> str:
    """The controller as the replay runs it at the window's start (`upto`: at that moment):
    "static" (the mode), "frozen" (an adaptive one, frozen) or "adaptive" (it moves the budget).
    The what-if's apply says when the gate's is not that one (a trial replayed a window with the
    controller adaptive, and applied to a gate whose controller was frozen by then, unsaid)."""
    return _controller_at(config, changes, first_arrival_s, upto)[0]


def _controller_at(config: Config, changes: Sequence[Change], first_arrival_s: float, upto: float | None) -> tuple[str, int | None]:
    """(`controller_state_at`'s state, the last budget set by hand while it is held, else None)."""
    mode, frozen, budget = config.budget.mode, False, None
    for c in changes:
        if not (in_force_from_start(c, first_arrival_s) or (upto is not None and c.at <= upto)):
            continue
        action, target = c.action, c.target
        if action == CONFIG_IN_FORCE:  # a new gate: its file's mode, no freeze, no hand budget (until restored)
            new = restarted_config(c.new_value, config)
            mode, frozen, budget = (new.budget.mode if new is not None else mode), False, None
        elif action in ("freeze", "unfreeze") or (action == "restored" and target == "controller"):
            frozen = action == "freeze" or c.new_value == "frozen"
        elif action in ("set_budget", "restored") and target.startswith("backend:"):
            value = _parse(c.new_value)
            budget = value if isinstance(value, int) else budget
        elif action == "overrides_dropped":
            frozen, budget = False, None
        if not frozen and mode != "static":
            budget = None  # the controller moves it (a freeze holds it where the controller left it)
    return ("static" if mode == "static" else "frozen" if frozen else "adaptive"), budget


def _class_values(config: Config, cls: str, values: dict[str, Any]) -> Config:
    """`config` with class `cls`'s keys of `values` set, as `_set_class` sets them (unknown keys
    and an unknown class left alone)."""
    known = {f.name for f in dataclasses.fields(ClassConfig)}
    return dataclasses.replace(
        config,
        classes=tuple(
            dataclasses.replace(c, **{k: v for k, v in values.items() if k in known}) if c.name == cls else c for c in config.classes
        ),
    )


def _budget_values(config: Config, values: dict[str, Any]) -> Config:
    """`config` with the [budget] keys of `values` set, as `_set_budget_settings` sets them (not
    its mode, which no retune changes)."""
    known = {f.name for f in dataclasses.fields(config.budget)} - {"mode"}
    return dataclasses.replace(config, budget=dataclasses.replace(config.budget, **{k: v for k, v in values.items() if k in known}))


def _set_file(state: dict[str, Any], cls: str | None, values: dict[str, Any]) -> None:
    """A reload's key in the file config the replay keeps beside the one in force (`state["file"]`)."""
    file: Config = state["file"]
    if cls is None:
        known = {f.name for f in dataclasses.fields(file.budget)}
        state["file"] = dataclasses.replace(
            file, budget=dataclasses.replace(file.budget, **{k: v for k, v in values.items() if k in known})
        )
        return
    known = {f.name for f in dataclasses.fields(ClassConfig)}
    state["file"] = dataclasses.replace(
        file,
        classes=tuple(
            dataclasses.replace(c, **{k: v for k, v in values.items() if k in known}) if c.name == cls else c for c in file.classes
        ),
    )


def _drop_overrides(now: float, adm: Admission, controller: Any, classes: dict[str, ClassConfig], state: dict[str, Any]) -> None:
    """`tokengate overrides drop` (or the console's), as `gate.ops.control.drop_overrides` does
    it: every class and [budget] back to the file's (a proposal's keys at their proposed value,
    which its file config holds), every pause ended, the controller unfrozen, and a budget an
    operator held (static, or frozen) back to the ceiling, where a start sets it. Not replayed
    until 2026-12-06, a dropped pause was replayed as still in force: a trial's batch admitted 62
    became 0 with 188 class_paused."""
    file: Config = state["file"]
    held = controller.frozen or file.budget.mode == "static"
    _classes_back_to(file, adm, classes)  # then [budget]: the reservations set its floor
    _set_budget_settings({f.name: getattr(file.budget, f.name) for f in dataclasses.fields(file.budget)}, now, adm, controller, state)
    for name in adm.class_names:  # then the pauses end, as the gate's drop_overrides orders it
        adm.resume(name)
    controller.unfreeze()
    if held:
        controller.set_budget(now, adm.capacity.ceiling)


def _set_class(cls: str, values: dict[str, Any], adm: Admission, classes: dict[str, ClassConfig]) -> None:
    known = {f.name for f in dataclasses.fields(ClassConfig)}
    updated = dataclasses.replace(classes[cls], **{k: v for k, v in values.items() if k in known})
    classes[cls] = updated
    adm.set_policy(updated)


def _set_budget_settings(values: dict[str, Any], now: float, adm: Admission, controller: Any, state: dict[str, Any]) -> None:
    config: Config = state["config"]
    known = {f.name for f in dataclasses.fields(config.budget)}
    budget = dataclasses.replace(config.budget, **{k: v for k, v in values.items() if k in known and k != "mode"})
    state["config"] = dataclasses.replace(config, budget=budget)
    settings = controller_settings(budget, controller.ceiling_tokens, adm.reserved_total)
    controller.set_tuning(settings)  # every [budget] tuning key, as the running gate's since dd2e7a8
    controller.set_bounds(now, settings.min_tokens)
    _core_budget_keys(budget, adm, state)


def _classes_back_to(config: Config, adm: Admission, classes: dict[str, ClassConfig]) -> None:
    """Every class to `config`'s thresholds: a restarted gate's (its new config), or the file's
    when the runtime overrides are dropped."""
    for c in config.classes:
        if c.name in classes:
            classes[c.name] = c
            adm.set_policy(c)


def _core_budget_keys(budget: BudgetConfig, adm: Admission, state: dict[str, Any]) -> None:
    """The [budget] keys the core itself holds, as gate.ops.control's _apply_budget sets them."""
    adm.aging_s = budget.aging_s or None
    adm.keep_slots = budget.keep_slots
    adm.default_ttft_objective_ms = budget.slo_ttft_p95_ms
    state["slo_s"] = budget.slo_ttft_p95_ms / 1000.0


def unpinned(change: Change, pinned: frozenset[str]) -> Change | None:
    """What of a recorded change replays under a proposal: all of it but the keys the proposal
    sets (`pinned`), which keep their proposed value; None when nothing is left. A proposal of
    one key must not undo the operator's other moves in the window (until 2026-12-05 any
    `budget.*` key dropped every recorded hand-set budget, and any `classes.C.*` key every
    retune of C: a trial's proposal column mixed the change with an undone cut)."""
    if not pinned:
        return change
    action, target = change.action, change.target
    if action == "set_budget" or (action == "restored" and target.startswith("backend:")):
        # a hand-set working budget: a proposed ceiling is what replaces it
        return None if "backends.token_budget" in pinned else change
    if action == "set_budget_settings":
        return _without(change, {k for k in _pairs(change.new_value) if f"budget.{k}" in pinned})
    if action in ("reload", "restored") and (target.startswith("budget.") or target.startswith("classes.")):
        return None if target in pinned else change
    if action == "set_class":
        cls = target.partition(":")[2]
        return _without(change, {k for k in _pairs(change.new_value) if f"classes.{cls}.{k}" in pinned})
    return change


def _without(change: Change, keys: set[str]) -> Change | None:
    """`change` (a `k=v, k=v` audit value) without `keys`; None when none is left."""
    if not keys:
        return change
    left = [part for part in (change.new_value or "").split(", ") if part.partition("=")[0].strip() not in keys]
    return dataclasses.replace(change, new_value=", ".join(left)) if left else None


def failed_reason(a: Arrival) -> str | None:
    """The reason of an arrival recorded as admitted and then failed (`failed` outcome), else None."""
    return a.reason if a.outcome == "failed" else None


def as_recorded(a: Arrival) -> Outcome:
    """What the journal says `a` got: admitted unless refused or shed (a failed request was
    admitted, then failed: `Outcome.failed`, never a refusal)."""
    admitted = a.outcome not in ("refused", "shed")
    return Outcome(
        admitted, "ok" if admitted else a.reason, a.queue_ms, a.ttft_arrival_ms, a.completion_tokens or 0, a.duration_ms, failed_reason(a)
    )


def _fill_ratio(arrivals: Sequence[Arrival]) -> dict[str, float]:
    """Per class: the median of generated / max_tokens over the requests that ran."""
    by_class: dict[str, list[float]] = {}
    for a in arrivals:
        if a.completion_tokens is not None and a.max_tokens > 0:
            by_class.setdefault(a.cls, []).append(min(1.0, a.completion_tokens / a.max_tokens))
    return {cls: sorted(v)[len(v) // 2] for cls, v in by_class.items()}


def _tokens(a: Arrival, ratio: Mapping[str, float]) -> int:
    if a.completion_tokens is not None:
        return max(0, a.completion_tokens)
    return max(1, round(a.max_tokens * ratio.get(a.cls, 1.0)))
