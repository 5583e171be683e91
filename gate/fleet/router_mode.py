"""Router mode: a llama-server router's configured models as capacity units (the async shell).

llama-server started with ``--models-dir DIR`` or ``--models-preset FILE`` and no ``-m`` is one
HTTP server in front of several models, each loaded on demand into its own child process
(``GET /models`` lists each with ``status.value`` unloaded | loading | loaded | sleeping, a
failed one with ``failed`` and ``exit_code``). Left alone it loads a model when a request
names it, evicts its own least recently used idle model when ``--models-max`` are running, and
holds the request (and every one after it) in a hidden queue until the load is done.

Here each configured model is a unit with its own admission core, budget, class queues and
telemetry, built from ``/props?model=NAME`` once the model is loaded. While a model is not
loaded its unit holds no slots: requests wait in the gate's own queues (bounded, with their
deadlines) and the gate asks for the load itself, evicting the model gate/core/model_plan.py
picks. Every request, count and poll the gate sends names its model with ``autoload=false``,
so llama-server never loads or queues anything behind the gate's back.

Facts this relies on (llama.cpp b1-0c1e570, measured with the tests' 90 MB model, -c 2048 -np 2):
a load takes ~0.4 s from ``POST /models/load`` to ``loaded``; ``POST /models/unload`` answers
at once and the model reads ``unloaded`` ~0.1 s later; a killed child reads ``unloaded`` with
``failed: true, exit_code: 1``; ``POST /models/load`` beyond ``--models-max`` while every
loaded model is busy answers 500 "model limit reached".
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import math
import urllib.parse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import httpx

from gate.core.admission import Capacity, clamp_retry
from gate.core.errors import GateError
from gate.core.model_plan import ModelState, plan
from gate.core.reasons import Reason
from gate.data.snapshot import ModelView
from gate.fleet.model_units import (
    UNIT_STATE,
    ModelGatekeeper,
    ModelInfo,
    hold,
    model_view,
    refuse_unfit,
    refuse_waiting,
    set_capacity,
)

if TYPE_CHECKING:
    from gate.backend.pool import Backend, BackendPool

log = logging.getLogger("tokengate.models")

#: a model's context before its first load (unknown): nothing is refused as too long yet
PROVISIONAL_TOKENS = 1 << 30
DEFAULT_LOAD_GUESS_S = 10.0  # Retry-After before any load was measured
FAST_POLL_S = 0.05  # GET /models while a load or an eviction is under way
EVICT_TIMEOUT_S = 60.0
FAIL_BACKOFF_S = 5.0  # a failed model is tried again after 5 s, 10 s, 20 s ... up to 300 s
FAIL_BACKOFF_MAX_S = 300.0
CALL_TIMEOUT_S = 10.0
PLACES_TAKEN_RETRY_S = 60.0  # every --models-max place pinned: only an operator frees one

EventHook = Callable[[str, str, "str | None", "str | None", str], None]


class ModelFleet:
    """One router backend: its units, their states from GET /models, loads and evictions."""

    def __init__(
        self,
        parent: Backend,
        pool: BackendPool,
        client: httpx.AsyncClient,
        *,
        clock: Callable[[], float],
        on_event: EventHook | None = None,
    ) -> None:
        from gate.backend.pool import Backend

        self.parent, self.pool, self.client, self.clock = parent, pool, client, clock
        self.on_event = on_event
        self.max_loaded = 0
        self.autoload = True
        self.router_up = True
        self.pins: set[str] = set(parent.config.pin)
        self.blocked = ""  # why a wanted model waits for a place (the last plan's word)
        self.task: asyncio.Task | None = None
        self.interval_s = 1.0
        self._wake = asyncio.Event()
        self._next_refresh = -math.inf
        self.refreshed = False  # GET /models answered at least once
        #: models the router runs that the gate does not serve (loaded straight): each takes one
        #: of the --models-max places, never the gate's to evict (gate/core/model_plan.py)
        self.held: tuple[str, ...] = ()
        self._calls: set[asyncio.Task] = set()
        now = clock()
        self.info: dict[str, ModelInfo] = {m: ModelInfo(idle_since=now, since=now) for m in parent.config.models}
        self.units: dict[str, Backend] = {}
        for model in parent.config.models:
            cfg = dataclasses.replace(parent.config, name=f"{parent.name}/{model}", models=(model,))
            unit = Backend(
                cfg,
                parent.upstream,
                parent.auth_token,
                model=model,
                fleet=self,
                query=f"?model={urllib.parse.quote(model, safe='')}&autoload=false",
            )
            ceiling = parent.config.token_budget or PROVISIONAL_TOKENS
            provisional = Capacity(0, PROVISIONAL_TOKENS, ceiling, parent.config.max_prefill_tokens)
            keeper = functools.partial(ModelGatekeeper, on_change=self.wake, on_release=functools.partial(self.used, model))
            pool.apply_capacity(unit, provisional, gatekeeper_factory=keeper)
            unit.capacity = None  # unknown until the model reports it
            unit.state, unit.detail = "loading", "not seen yet"
            self.units[model] = unit

    # ---- what the request path asks ---------------------------------------------------

    def accepts(self, unit: Backend) -> bool:
        """May a request for this unit queue (or run) now?"""
        try:
            self.check(unit)
        except GateError:
            return False
        return True

    def check(self, unit: Backend) -> None:
        """Raise the GateError a request for `unit` gets at once (failed, missing, not loadable)."""
        model = unit.model
        assert model is not None
        info, now = self.info[model], self.clock()
        if not self.router_up:
            raise GateError(Reason.NO_BACKEND, f"backend {self.parent.name!r} is {self.parent.state}", retry_after_s=5.0)
        if info.status == "missing":
            raise GateError(Reason.MODEL_UNAVAILABLE, f"llama-server lists no model {model!r}", "model")
        if info.status == "failed" and now < info.retry_at:
            raise GateError(
                Reason.MODEL_UNAVAILABLE,
                f"model {model!r} failed: its llama-server process exited with code {info.exit_code}; "
                f"the gate loads it again on demand in {math.ceil(info.retry_at - now)} s",
                retry_after_s=info.retry_at - now,
            )
        if info.status in ("unloaded", "failed") and not (self.autoload or model in self.pins or info.asked):
            raise GateError(
                Reason.MODEL_UNAVAILABLE,
                f"model {model!r} is not loaded and llama-server runs with --no-models-autoload; an operator can load it (console: m)",
            )
        if info.status in ("unloaded", "failed") and (taken := self.places_taken(model)):
            # Nothing the gate may evict: a request would wait out its queue and be told to
            # retry in a second, forever (a trial: pin = ["tiny"] with --models-max 1)
            raise GateError(
                Reason.MODEL_UNAVAILABLE,
                f"model {model!r} cannot be loaded: llama-server runs at most {self.max_loaded} "
                f"{'model' if self.max_loaded == 1 else 'models'} (--models-max) and {taken} take every place; "
                "an operator can unpin one (console: m)",
                "model",
                retry_after_s=PLACES_TAKEN_RETRY_S,
            )

    def places_taken(self, model: str) -> str:
        """What holds every --models-max place for good, when something does and `model` is not
        among it: the pinned models (not failed or missing) and those the router runs for others."""
        if not self.max_loaded:
            return ""
        # (a pinned model too: more pins than places leave one of them out for good)
        pinned = [p for p in sorted(self.pins) if p != model and p in self.info and self.info[p].status not in ("missing", "failed")]
        if len(pinned) + len(self.held) < self.max_loaded:
            return ""
        return ", ".join([*(f"{p} (pinned)" for p in pinned), *(f"{h} (loaded straight, not served by this gate)" for h in self.held)])

    def loaded(self, unit: Backend) -> bool:
        return unit.model is not None and self.info[unit.model].status == "loaded"

    def ready_in(self, model: str) -> float:
        """Seconds until `model` is expected to take requests (0 when loaded)."""
        info = self.info[model]
        if info.status == "loaded":
            return 0.0
        guess = info.last_load_s or self.parent.config.cold_start_s or DEFAULT_LOAD_GUESS_S
        if info.status == "loading" and info.load_started is not None:
            return max(0.0, guess - (self.clock() - info.load_started))
        return guess

    def refused(self, unit: Backend, err: GateError) -> None:
        """A refusal while the model is not loaded: Retry-After is at least the time until it
        should be (its measured load time, less what has passed), never less than the queue says."""
        if err.reason in (Reason.QUEUE_FULL, Reason.QUEUE_TIMEOUT) and unit.model is not None and not self.loaded(unit):
            err.retry_after_s = clamp_retry(max(err.retry_after_s or 0.0, self.ready_in(unit.model)))

    def cold_start(self, model: str) -> float:
        configured = self.parent.config.cold_start_s
        return configured if configured is not None else (self.info[model].last_load_s or 0.0)

    def used(self, model: str) -> None:
        self.info[model].idle_since = self.clock()
        self._wake.set()

    def wake(self) -> None:
        self._wake.set()

    def gone(self, unit: Backend) -> GateError:
        """llama-server answered a request for `unit` "model is not loaded": unloaded or exited
        outside the gate since the last GET /models. What the client gets (503, as for a failed
        model: the client did nothing wrong), and the model list is read again at once."""
        model = unit.model
        assert model is not None
        self._next_refresh = -math.inf
        self._wake.set()
        return GateError(
            Reason.MODEL_UNAVAILABLE,
            f"model {model!r} is no longer loaded on llama-server (unloaded or exited outside the gate); "
            "the gate loads it again for the next requests",
            "model",
            retry_after_s=max(1.0, self.ready_in(model)),
        )

    def demand(self, model: str) -> None:
        """A request for `model` was answered by a fallback while it was not loaded: load it
        as if that request waited, so that the next ones find it."""
        self.info[model].demanded = True
        self._wake.set()

    # ---- what the probe tells --------------------------------------------------------

    def router_props(self, props: dict[str, Any]) -> None:
        max_instances = props.get("max_instances")
        self.max_loaded = max_instances if isinstance(max_instances, int) and max_instances > 0 else 0
        self.autoload = props.get("models_autoload") is not False

    def router_state(self, state: str, detail: str) -> None:
        up = state == "ready"
        if up == self.router_up:
            return
        self.router_up = up
        if not up:
            for model, unit in self.units.items():
                hold(unit)
                unit.state, unit.detail = "down", f"router {state}: {detail}"
                # Whatever it was, the next GET /models says afresh (a model may have restarted).
                self.info[model].status, self.info[model].waking = "unknown", False
        else:
            self._next_refresh = -math.inf
            self._wake.set()

    # ---- the loop ------------------------------------------------------------------

    async def run(self, interval_s: float = 1.0) -> None:
        """Refresh model states, then act on the plan; fast while a change is under way."""
        self.interval_s = interval_s
        while True:
            self._wake.clear()
            try:
                if self.router_up and (self.clock() >= self._next_refresh or self.changing):
                    self._next_refresh = self.clock() + interval_s
                    await self.refresh()
                if self.router_up:
                    await self.step()
            except Exception:  # noqa: BLE001 - the loop must outlive one bad answer
                log.exception("router %s: model loop failed once", self.parent.name)
            timeout = FAST_POLL_S if self.changing else max(0.0, self._next_refresh - self.clock())
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._wake.wait()

    @property
    def changing(self) -> bool:
        return any(i.status in ("loading", "evicting") or i.waking for i in self.info.values())

    async def refresh(self) -> None:
        """GET /models and apply each configured model's status."""
        try:
            response = await self.parent.get("/models", timeout=CALL_TIMEOUT_S)
            response.raise_for_status()
            listed = {e["id"]: e for e in response.json()["data"] if isinstance(e, dict) and "id" in e}
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            log.warning("router %s: GET /models failed: %s: %s", self.parent.name, type(exc).__name__, exc)
            return
        self.refreshed = True
        self.held = tuple(
            sorted(
                name
                for name, entry in listed.items()
                if not ({name, *(entry.get("aliases") or ())} & self.info.keys())
                and isinstance(entry.get("status"), dict)
                and entry["status"].get("value") in ("loading", "loaded", "sleeping")
            )
        )
        for entry in list(listed.values()):
            for alias in entry.get("aliases") or ():
                listed.setdefault(alias, entry)
        for model in self.info:
            found = listed.get(model)
            status = found.get("status") if found is not None else None
            if not isinstance(status, dict):
                await self._apply(model, "missing", 0)
                continue
            code = status.get("exit_code") if status.get("failed") else 0
            await self._apply(model, str(status.get("value")), code if isinstance(code, int) else 1)

    async def step(self) -> None:
        """Plan with the states as they are now, and start what the plan says."""
        p = plan(self.states(), self.max_loaded, self.held)
        self.blocked = p.blocked
        if p.load is None and p.evict is None:
            return
        if p.evict is not None:
            wanted = p.load or p.waiting_for
            self.evict(p.evict, f"for {wanted} ({p.why}); idle {self._idle(p.evict):.1f} s, least recently used")
        elif p.load is not None and p.wake:
            self._start_wake(p.load, p.why)
        elif p.load is not None:
            await self._load(p.load, p.why)

    def states(self) -> list[ModelState]:
        now = self.clock()
        out = []
        for model, info in self.info.items():
            adm = self.units[model].admission
            assert adm is not None
            oldest = [now - t for c in adm.class_names if (t := adm.queue(c).oldest_enqueued_at()) is not None]
            may = (
                self.router_up
                and info.status not in ("missing", "unknown")
                and now >= info.hold_off_until
                and (info.status != "failed" or now >= info.retry_at)
                and (self.autoload or model in self.pins or info.asked)
            )
            out.append(
                ModelState(
                    model,
                    "missing" if info.status == "unknown" else info.status,  # type: ignore[arg-type]
                    in_flight=len(adm.ledger),
                    waiting=adm.waiting() + (info.demanded and info.status != "loaded"),
                    oldest_wait_s=max(oldest, default=0.0),
                    pinned=model in self.pins,
                    asked=info.asked,
                    may_load=may,
                    idle_s=self._idle(model),
                    cold_start_s=self.cold_start(model),
                )
            )
        return out

    def _idle(self, model: str) -> float:
        adm = self.units[model].admission
        return 0.0 if adm is not None and len(adm.ledger) else self.clock() - self.info[model].idle_since

    # ---- transitions -----------------------------------------------------------------

    async def _apply(self, model: str, reported: str, exit_code: int) -> None:
        info, unit, now = self.info[model], self.units[model], self.clock()
        if reported in ("downloading", "downloaded"):
            reported = "loading"
        if reported == "unloaded" and exit_code:
            # a child the gate stopped (an eviction, an operator's unload) that exits non-zero was
            # asked to go, and went: unloaded, loadable at once. As `failed` it was refused 503 for
            # the back-off (CI saw exit code 1 from an unload on a loaded 2-core host)
            reported = "unloaded" if info.status == "evicting" else "failed"
        if reported not in ("unloaded", "loading", "loaded", "sleeping", "failed", "missing"):
            log.warning("router %s: model %s reports status %r; treated as unloaded", self.parent.name, model, reported)
            reported = "unloaded"
        if info.status == "evicting" and reported not in ("unloaded", "failed") and now - info.since < EVICT_TIMEOUT_S:
            return  # llama-server says "loaded" until the child has exited
        if info.waking and reported == "sleeping":
            return
        first = info.status == "unknown"
        if reported == info.status:
            if reported == "loaded" and unit.capacity is None:
                await self._loaded(model)
            return
        if reported == "loaded":
            await self._loaded(model)
            return
        if reported == "failed":
            if first:  # failed before the gate started: loadable on demand at once
                self._set(model, "failed", f"failed earlier (exit code {exit_code})")
                info.exit_code, info.retry_at = exit_code, now
            else:
                self._failed(model, exit_code)
            return
        if reported == "loading" and info.load_started is None:
            info.load_started, info.load_cause = now, "started by llama-server"
        detail = ""
        if reported == "missing":
            detail = "llama-server lists no such model"
            refuse_waiting(unit, Reason.MODEL_UNAVAILABLE, f"llama-server lists no model {model!r}", None)
        self._set(model, reported, detail)

    def _set(self, model: str, status: str, detail: str) -> None:
        info, unit = self.info[model], self.units[model]
        info.status, info.since = status, self.clock()
        hold(unit)
        unit.state = UNIT_STATE.get(status, "loading")
        unit.detail = detail
        self._wake.set()

    async def _loaded(self, model: str) -> None:
        """The model is up: its capacity from its own /props, then its queue moves."""
        info, unit, now = self.info[model], self.units[model], self.clock()
        try:
            response = await unit.get("/props", routed=True, timeout=CALL_TIMEOUT_S)
            response.raise_for_status()
            props = response.json()
            from gate.backend.pool import capacity_from_props

            cap = capacity_from_props(props, self.parent.config)
        except (httpx.HTTPError, ValueError) as exc:
            log.warning("router %s: model %s is loaded but /props failed: %s", self.parent.name, model, exc)
            return  # the next refresh tries again
        unit.props = props
        if info.capacity is None:
            refuse_unfit(unit, cap)  # before the capacity lets the queue move
        info.capacity = unit.capacity = cap
        # the floor from the model's own ceiling, not the provisional one its unit was built with
        set_capacity(unit, cap, now, self.pool.floor_for(cap.ceiling))
        info.status, info.since, info.waking, info.asked, info.demanded = "loaded", now, False, False, False
        info.idle_since = now
        unit.state, unit.detail = "ready", "loaded"
        if info.load_started is not None:
            took = now - info.load_started
            info.last_load_s, info.loads, info.failures = took, info.loads + 1, 0
            self._event("model_loaded", model, "unloaded", "loaded", f"in {took:.2f} s; {info.load_cause}")
            info.load_started = None
        assert unit.gatekeeper is not None
        unit.gatekeeper.advance()

    def _failed(self, model: str, exit_code: int) -> None:
        info, unit, now = self.info[model], self.units[model], self.clock()
        info.exit_code, info.failures, info.failures_total = exit_code, info.failures + 1, info.failures_total + 1
        backoff = min(FAIL_BACKOFF_S * 2 ** (info.failures - 1), FAIL_BACKOFF_MAX_S)
        info.retry_at, info.load_started, info.waking, info.demanded = now + backoff, None, False, False
        self._set(model, "failed", f"failed: exit code {exit_code}")
        message = (
            f"model {model!r} failed: its llama-server process exited with code {exit_code}; "
            f"the gate loads it again on demand in {math.ceil(backoff)} s"
        )
        refuse_waiting(unit, Reason.MODEL_UNAVAILABLE, message, backoff)
        self._event("model_failed", model, None, "failed", f"exit code {exit_code}; next try in {backoff:g} s")

    # ---- calls to llama-server ---------------------------------------------------------

    async def _load(self, model: str, why: str) -> None:
        info = self.info[model]
        before = info.status
        info.load_started, info.load_cause, info.asked = self.clock(), why, False
        self._set(model, "loading", f"loading ({why})")
        error = await self._post("/models/load", model)
        if error is not None and "already running" not in error:
            info.load_started, info.hold_off_until = None, self.clock() + 1.0
            self._set(model, before, f"load refused: {error}")
            log.warning("router %s: loading %s refused: %s", self.parent.name, model, error)

    def _start_wake(self, model: str, why: str) -> None:
        info = self.info[model]
        info.load_started, info.load_cause, info.waking = self.clock(), f"wake, {why}", True
        self._set(model, "loading", f"waking ({why})")

        async def wake() -> None:
            # Any task wakes a sleeping child; /tokenize blocks until it is awake.
            error = await self._post("/tokenize", model, {"content": ""}, timeout=None)
            if error is not None:
                log.warning("router %s: waking %s failed: %s", self.parent.name, model, error)
            info.waking = False
            self._wake.set()

        self._spawn(wake())

    def evict(self, model: str, note: str, *, chosen: bool = True) -> None:
        """Unload `model` (no request in flight or waiting: the caller checked); `chosen`: the
        gate's own choice (counted and audited here; an operator's unload is audited by control)."""
        info = self.info[model]
        old, info.note = info.status, note
        self._set(model, "evicting", f"evicting {note}")
        if chosen:
            info.evictions += 1
            self._event("model_evict", model, old, "unloaded", note)

        async def unload() -> None:
            error = await self._post("/models/unload", model)
            if error is not None and "not running" not in error:
                log.warning("router %s: unloading %s refused: %s", self.parent.name, model, error)
                info.since = -math.inf  # the next refresh takes llama-server's word for it
            self._wake.set()

        self._spawn(unload())

    async def _post(self, path: str, model: str, extra: dict[str, Any] | None = None, timeout: float | None = CALL_TIMEOUT_S) -> str | None:
        """POST {"model": model, ...}; None when it went through, else llama-server's message."""
        query = "?autoload=false" if path == "/tokenize" else ""
        try:
            response = await self.parent.call("POST", path + query, json={"model": model, **(extra or {})}, timeout=timeout)
        except httpx.HTTPError as exc:
            return f"{type(exc).__name__}: {exc}"
        if response.status_code == 200:
            return None
        try:
            return str(response.json()["error"]["message"])
        except (ValueError, KeyError, TypeError):
            return f"HTTP {response.status_code}"

    async def close(self) -> None:
        """Cancel the calls still under way (an unload, a wake); the loop task is the pool's."""
        for task in tuple(self._calls):
            task.cancel()
        await asyncio.gather(*self._calls, return_exceptions=True)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._calls.add(task)
        task.add_done_callback(self._calls.discard)

    # ---- views -------------------------------------------------------------------------

    def views(self, telemetry: dict[str, Any]) -> list[ModelView]:
        now = self.clock()
        return [
            model_view(
                self.parent.name,
                self.units[model],
                info,
                pinned=model in self.pins,
                blocked=self.blocked,
                models_max=self.max_loaded,
                now=now,
                telemetry=telemetry.get(self.units[model].name),
            )
            for model, info in self.info.items()
        ]

    def _event(self, action: str, model: str, old: str | None, new: str | None, note: str) -> None:
        # a model that failed to load is news to whoever reads the log (it was at INFO, with loads)
        level = logging.WARNING if action == "model_failed" else logging.INFO
        log.log(level, "router %s: %s %s (%s)", self.parent.name, action, model, note)
        if self.on_event is not None:
            self.on_event(action, f"model:{self.parent.name}/{model}", old, new, note)
