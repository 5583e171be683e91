"""Backends: readiness, capacity from llama-server's own /props, and model routing.

Each backend gets its admission core (and gatekeeper) once its capacity is
known: slots from `total_slots`, per-slot context from
`default_generation_settings.n_ctx`, and the KV layout learned where the server's own
figures tell it (gate/backend/layout.py), else the configured `kv`. Whatever the
capacity contradicts (the config's `kv`, `min_tokens` or class reservations above the
ceiling), and what a budget an operator holds below it leaves a class (`held_budget_warnings`),
is in the backend's `warnings`: logged, in /health and in the console.

A llama-server in router mode (its /props says `"role": "router"`) serves several
models, each in its own child process: it becomes one capacity unit per configured
model (gate/fleet/router_mode.py), and iterating the pool yields those units in its place.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import httpx

from gate.backend.gatekeeper import Gatekeeper, Ticket
from gate.backend.layout import Layout, ServerArgs, learn_layout, local_server_args
from gate.backend.sameserver import same_process_problem
from gate.backend.upstream import RelayStats, Upstream
from gate.config import BackendConfig, BudgetConfig
from gate.core.adaptive import BudgetController, ControllerSettings, Move, controller_for, has_demand
from gate.core.admission import RESERVED_SHARE_MAX, Admission, Capacity, ClassPolicy, Reserves, TenantPolicy, reservations_in_force
from gate.core.errors import GateError
from gate.core.prefill import PrefillModel
from gate.core.shedding import DecodeMeter
from gate.data.snapshot import ModelView


class Fleet(Protocol):
    """A router-mode backend's models, one capacity unit each (`gate.fleet.router_mode.ModelFleet`).

    The pool knows a fleet only through this port, and builds one with the `fleet_factory`
    the composition root hands it: the backend layer never imports the fleet layer above it.
    """

    parent: Backend
    units: dict[str, Backend]
    refreshed: bool
    router_up: bool
    task: asyncio.Task[None] | None

    @property
    def info(self) -> Mapping[str, Any]: ...

    def accepts(self, unit: Backend) -> bool: ...
    def check(self, unit: Backend) -> None: ...
    def loaded(self, unit: Backend) -> bool: ...
    def refused(self, unit: Backend, err: GateError) -> None: ...
    def gone(self, unit: Backend) -> GateError: ...
    def demand(self, model: str) -> None: ...
    def router_props(self, props: dict[str, Any]) -> None: ...
    def router_state(self, state: str, detail: str) -> None: ...
    def views(self, telemetry: dict[str, Any]) -> list[ModelView]: ...
    async def refresh(self) -> None: ...
    async def run(self, interval_s: float = 1.0) -> None: ...
    async def close(self) -> None: ...


#: builds a backend's fleet: (the router backend, the pool, the HTTP client, clock, event hook)
FleetFactory = Callable[..., Fleet]

log = logging.getLogger("tokengate.backends")

#: health probes in a row that must time out before a ready backend is marked down (a refused
#: connection or an error answer marks it down at once)
PROBE_TIMEOUTS_DOWN = 2

BackendState = Literal["ready", "loading", "down", "unloaded", "sleeping"]  # the last two: router mode


def capacity_from_props(props: Mapping[str, Any], config: BackendConfig, layout: Layout | None = None) -> Capacity:
    """The physical limits of a llama-server from its /props and its KV layout (learned, or
    else the configured one: `learn_layout`)."""
    slots = props.get("total_slots")
    n_ctx = (props.get("default_generation_settings") or {}).get("n_ctx")
    if not isinstance(slots, int) or slots < 1 or not isinstance(n_ctx, int) or n_ctx < 1:
        raise ValueError(f"/props lacks total_slots/default_generation_settings.n_ctx: {slots!r}, {n_ctx!r}")
    kv = layout.kv if layout is not None else learn_layout(props, config.kv, None).kv
    # Unified: every slot reports the whole shared pool (unless each is capped below it: the
    # layout then knows the pool from the process). Split: each slot owns n_ctx.
    if kv == "unified":
        pool = layout.pool if layout is not None and layout.pool else n_ctx
    else:
        pool = slots * n_ctx
    return Capacity(
        slots=slots,
        slot_context=n_ctx,
        ceiling=pool if config.token_budget is None else config.token_budget,
        max_prefill_tokens=config.max_prefill_tokens,
        prefill_yield_tokens=config.prefill_yield_tokens or None,
        pool=None if config.token_budget is None else pool,
    )


def capacity_warnings(layout: Layout | None, cap: Capacity | None, budget: BudgetConfig, classes: Iterable[ClassPolicy]) -> tuple[str, ...]:
    """What a backend's capacity contradicts: its layout's warnings, and [budget] min_tokens or
    class reservations above its ceiling (the controller's floor is clamped to the ceiling; a
    class cannot reach tokens the others reserve)."""
    out = list(layout.warnings if layout is not None else ())
    if cap is None:
        return tuple(out)
    if cap.pool is not None and cap.ceiling > cap.pool:
        out.append(
            f"token_budget {cap.ceiling} is above llama-server's KV pool of {cap.pool} tokens: the gate may admit more "
            "than the cache holds, and llama-server then fails requests (context size exceeded); the cache is no longer "
            "kept from overcommitting"
        )
    where = f"ceiling {cap.ceiling}" + (
        f" ({layout.kv} KV, {cap.slots} slot{'' if cap.slots == 1 else 's'} of {cap.slot_context})" if layout else ""
    )
    if budget.min_tokens and budget.min_tokens > cap.ceiling:
        out.append(f"budget.min_tokens {budget.min_tokens} is above the {where}: the floor is clamped to {cap.ceiling}")
    classes = tuple(classes)
    in_force = reservations_in_force(classes, cap.ceiling)
    wanted = [(c.name, c.reserved_tokens) for c in classes if c.reserved_tokens]
    reserved = [(name, in_force[name]) for name, _ in wanted]
    total = sum(n for _, n in reserved)
    if wanted and reserved != wanted:
        # R0 (#25): the example's interactive 1,024 on a 1,024-token pool left the controller no
        # room and batch nothing (400 on every request); scaled, both keep room, and it is said
        was = ", ".join(f"{name} {n}" for name, n in wanted)
        now = ", ".join(f"{name} {n}" for name, n in reserved)
        out.append(
            f"class reservations ({was}) are over {RESERVED_SHARE_MAX:.0%} of the {where}: {now} in force here, "
            "so the other classes and the adaptive budget keep room; lower reserved_tokens to choose yourself"
        )
    # A class reaches at most what the others leave of the ceiling (F1: they hold back what they
    # reserve and do not use).
    for c in classes:
        default = getattr(c, "default_max_tokens", None)
        others = [(name, n) for name, n in reserved if name != c.name and n]
        room = cap.ceiling - sum(n for _, n in others)
        # a default request holds its prompt and default_max_tokens, or (default_max_tokens not
        # below a slot's context, said above) the whole slot its prompt leaves: it fits a slot
        if others and isinstance(default, int) and room < min(default + 1, cap.slot_context):
            each = ", ".join(f"{name} {n}" for name, n in others)
            out.append(
                f"classes.{c.name}: the other classes reserve {cap.ceiling - room} of the ceiling {cap.ceiling} "
                f"({each}); a {c.name} request may hold at most {room} tokens, not its default_max_tokens "
                f"{default} and a prompt: it never starts; lower reserved_tokens or default_max_tokens"
            )
    floor = budget_floor(budget, cap.ceiling, total)
    if getattr(budget, "mode", None) == "adaptive" and floor >= cap.ceiling and not budget.min_tokens > cap.ceiling:
        why = f"budget.min_tokens {budget.min_tokens}" if budget.min_tokens else f"the classes' reservations, {total}"
        out.append(
            f"the adaptive budget has no room: its floor ({why}) is the ceiling {cap.ceiling}, so the "
            "controller can never lower it; lower min_tokens or reserved_tokens"
        )
    return tuple(out)


@dataclass(frozen=True, slots=True)
class ShortReach:
    """A class a budget leaves less room than its default request needs (`short_of_default`)."""

    cls: str
    default_max_tokens: int
    reach: int  # the budget less the others' reservations in force (may be below 0)
    others: tuple[tuple[str, int], ...]  # (class, reservation in force) of the others that reserve
    at_ceiling: bool  # short at the ceiling too (the reservations alone: `capacity_warnings` says it)


def short_of_default(budget: int, ceiling: int, slot_context: int | None, classes: Iterable[Reserves]) -> list[ShortReach]:
    """The classes that cannot start their default request (its default_max_tokens and a prompt
    of a token at least, or the slot it fills: the gate lowers the default it injects to what the
    slot holds) at `budget`, beside the others' reservations in force on `ceiling` (R0 scales them
    to the ceiling, not to the budget): a class's reach as ``Admission.class_reach`` has it, its
    own limit_tokens aside (a limit below the default is `limit_warnings`', a 400 at any budget).
    The one computation behind `held_budget_warnings` and the what-if's confirmation
    (gate/tools/replay/apply.py)."""
    classes = tuple(classes)
    in_force = reservations_in_force(classes, ceiling)
    out = []
    for c in classes:
        default = getattr(c, "default_max_tokens", None)
        if not isinstance(default, int):
            continue
        need = min(default + 1, slot_context or default + 1)
        others = tuple((p.name, in_force[p.name]) for p in classes if p.name != c.name and in_force[p.name])
        reserved = sum(n for _, n in others)
        if budget - reserved < need:
            out.append(ShortReach(c.name, default, budget - reserved, others, ceiling - reserved < need))
    return out


def held_budget_warnings(cap: Capacity | None, held: int | None, frozen: bool, classes: Iterable[ClassPolicy]) -> tuple[str, ...]:
    """What a budget an operator holds below the ceiling (`held`: set by hand with the controller
    frozen, or in static mode; None while the controller moves it) leaves a class: less room than
    its default request needs (`short_of_default`), so that each of its requests is refused 429
    token_budget_exceeded until the budget moves (an operator's budget is a limit, never
    stretched for aged work: E1-E2). `capacity_warnings` says what the reservations leave at the
    ceiling; this, at the budget held, for the classes that fit at the ceiling. A what-if applied
    backend.token_budget=1024 (frozen) under a ceiling of 2,048: interactive's 1,024 stayed in
    force, batch could reach 0, and every batch request was refused with nothing said, in the
    console, /health or the log (a trial)."""
    if cap is None or held is None or held >= cap.ceiling:
        return ()
    out = []
    for s in short_of_default(held, cap.ceiling, cap.slot_context, classes):
        if s.at_ceiling:
            continue  # said at the ceiling already
        each = ", ".join(f"{n} {k}" for n, k in s.others)
        kept = f" and the other classes reserve {sum(k for _, k in s.others)} of it ({each})" if s.others else ""
        how = "the controller frozen there" if frozen else "static mode"
        # the consequence first: the console's backend line is cut at its width, and a trial's
        # 120 columns ended at "... the ceiling is 2048) and the other", the 0 tokens unsaid
        out.append(
            f"classes.{s.cls}: a {s.cls} request may hold at most {max(0, s.reach)} tokens, not its default_max_tokens "
            f"{s.default_max_tokens} and a prompt: its requests are refused 429 token_budget_exceeded until the budget is "
            f"raised{' or the controller unfrozen' if frozen else ''}; the budget is held at {held} by hand ({how}; the "
            f"ceiling is {cap.ceiling}){kept}"
        )
    return tuple(out)


#: prompt counts of one backend out at once when a request may have to wait (llama-server
#: answers them on the HTTP threads its streams leave free: n_parallel + 2 at its default)
COUNTS_AT_ONCE = 4


@dataclass(slots=True)
class Backend:
    """One llama-server: its state, capacity and the gatekeeper guarding it."""

    config: BackendConfig
    upstream: Upstream
    auth_token: str | None = None
    state: BackendState = "down"
    detail: str = "not probed yet"
    capacity: Capacity | None = None
    gatekeeper: Gatekeeper | None = None
    props: dict[str, Any] = field(default_factory=dict)
    decode: DecodeMeter = field(default_factory=DecodeMeter)  # the current per-slot rate, for shedding
    controller: BudgetController | None = None
    kv_bytes_per_token: int | None = None  # from the model's GGUF header, when local
    layout: Layout | None = None  # the KV layout in force, and how it was learned
    #: what the capacity contradicts (config kv, min_tokens, reservations above the ceiling)
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()  # capacity_notes: logged once, not warnings
    #: router mode: the model this unit serves, its fleet (the router's own entry has the
    #: fleet and no model) and the query its GETs need
    model: str | None = None
    fleet: Fleet | None = None
    query: str = ""
    #: the prompt counts a request may wait for its turn on (`gate.http.proxy`: at most
    #: COUNTS_AT_ONCE at a time, each request looking again whether it must be refused once its
    #: turn comes), so that a burst is judged as it queues, not all of it against an empty queue
    counting: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(COUNTS_AT_ONCE))
    #: health probes in a row that timed out (`BackendPool.probe`: a ready backend goes down on
    #: the PROBE_TIMEOUTS_DOWN-th, not on one)
    probe_timeouts: int = 0
    #: the pid of the local llama-server on this backend's port (/proc), when one is found
    server_pid: int | None = None
    #: what llama-server's chat template adds to a chat's prompt count (`TokenCounter.
    #: chat_template_tokens`), learned with the layout on each (re)start of the server; None:
    #: not measured (a router, a backend that gave no count). Journaled with the capacity, for
    #: `tokengate log --format aiperf`
    chat_template_tokens: int | None = None

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def url(self) -> str:
        return self.config.url

    @property
    def admission(self) -> Admission | None:
        return None if self.gatekeeper is None else self.gatekeeper.admission

    async def call(self, method: str, path: str, *, timeout: float | None, routed: bool = False, **kw: Any) -> httpx.Response:
        """One call to this llama-server: the base URL, the auth header and (`routed`) the
        router-mode query its model needs, in one place; `kw` goes to httpx (json, content,
        params, headers). Raises httpx's errors; the caller decides what they mean."""
        headers = {**kw.pop("headers", {}), **self.auth_headers()}
        url = self.url + path + (self.query if routed else "")
        return await self.upstream.client.request(method, url, headers=headers, timeout=timeout, **kw)

    async def get(self, path: str, *, timeout: float | None, routed: bool = False) -> httpx.Response:
        return await self.call("GET", path, timeout=timeout, routed=routed)

    def auth_headers(self) -> dict[str, str]:
        headers = {"Authorization": f"Bearer {self.auth_token}"} if self.auth_token else {}
        if self.fleet is not None:
            # Router mode: no idle connection to the router is kept. A pooled one, reused by the
            # next call (a request's relay), was seen answered "Server disconnected without
            # sending a response" under load; a fresh loopback connection costs ~0.1 ms.
            headers["Connection"] = "close"
        return headers


AUTO_FLOOR_SHARE = 4  # min_tokens = 0: the floor is a quarter of the ceiling


def reserved_total(classes: Iterable[ClassPolicy], ceiling: int) -> int:
    """The classes' reservations in force on a backend of this ceiling, together (R0: at most
    half of it), for the controller's floor."""
    return sum(reservations_in_force(classes, ceiling).values())


def budget_floor(budget: BudgetConfig, ceiling: int, reserved: int = 0) -> int:
    """The controller's floor: `min_tokens`, or with 0 (auto) a quarter of the ceiling and never
    below the classes' reservations in force (`reserved_total`); never above the ceiling."""
    floor = budget.min_tokens or max(reserved, ceiling // AUTO_FLOOR_SHARE, 1)
    return min(floor, ceiling)


def controller_settings(budget: BudgetConfig, ceiling: int, reserved: int = 0) -> ControllerSettings:
    """The controller's tuning from `[budget]`, the backend's ceiling and the classes' reservations."""
    return ControllerSettings(
        min_tokens=budget_floor(budget, ceiling, reserved),
        ceiling_tokens=ceiling,
        slo_ttft_p95_s=budget.slo_ttft_p95_ms / 1000,
        slo_tpot_p95_s=None if budget.slo_tpot_p95_ms is None else budget.slo_tpot_p95_ms / 1000,
        window_s=budget.window_s,
        min_samples=budget.min_samples,
        cooldown_s=budget.cooldown_s,
        increase=budget.increase,
        decrease=budget.decrease,
    )


class BackendPool:
    """All backends, routing by model name, and the probe loop that keeps their state."""

    def __init__(
        self,
        configs: Iterable[BackendConfig],
        client: httpx.AsyncClient,
        *,
        classes: Iterable[ClassPolicy],
        tenant_policy: Callable[[str], TenantPolicy],
        environ: Mapping[str, str],
        budget: BudgetConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[], None] | None = None,
        on_created: Callable[[Backend], None] | None = None,
        probe_timeout_s: float = 2.0,
        on_model_event: Callable[[str, str, str | None, str | None, str], None] | None = None,
        fleet_factory: FleetFactory | None = None,
        kv_bytes_per_token: int | None = None,
    ) -> None:
        self._client = client
        self._budget = budget or BudgetConfig()
        self._clock = clock
        self._classes = tuple(classes)
        self._tenant_policy = tenant_policy
        self._on_change = on_change
        self._on_created = on_created
        self._timeout = probe_timeout_s
        self._fleet_factory = fleet_factory
        #: router mode: called with (action, target, old, new, note) for loads, evictions, failures
        self.on_model_event = on_model_event
        #: called when router mode turns a backend into model units (the telemetry follows)
        self.on_units: Callable[[], None] | None = None
        self.configured: tuple[Backend, ...] = tuple(
            Backend(
                c,
                Upstream(client, c.url),
                environ.get(c.api_key_env) if c.api_key_env else None,
                kv_bytes_per_token=kv_bytes_per_token,
            )
            for c in configs
        )
        self._fleet_tasks: list[asyncio.Task] = []
        #: called with (backend, old state, new state) when a backend goes ready or stops being
        #: ready: the service audits it, so a llama-server crash leaves its mark on the review
        self.on_state: Callable[[Backend, str, str], None] | None = None
        #: called with the backend when a ready backend's capacity is learned or changes (its
        #: first probe included): the service journals it, so that `tokengate replay` models the
        #: KV layout the gate learned, not the configured `kv = "auto"`
        self.on_capacity: Callable[[Backend], None] | None = None
        #: measures a backend's chat template (`Backend.chat_template_tokens`) when its layout is
        #: learned; None: not measured (the service sets it to its token counter's)
        self.measure_template: Callable[[Backend], Awaitable[int | None]] | None = None
        #: the budget moved because the capacity did (clamped to a smaller pool, or an operator's
        #: budget back once the pool allows it): audited as the controller's moves are
        self.on_budget_move: Callable[[Backend, Move], None] | None = None
        #: finds a local llama-server's command line (a seam for tests)
        self._args_finder: Callable[[str], ServerArgs | None] = local_server_args
        self._said_same: set[frozenset[str]] = set()  # backend pairs said to share one llama-server

    @property
    def backends(self) -> tuple[Backend, ...]:
        """The capacity units: each backend, or for a router its model units in config order."""
        out: list[Backend] = []
        for b in self.configured:
            out.extend(b.fleet.units.values() if b.fleet is not None else (b,))
        return tuple(out)

    @property
    def fleets(self) -> list[Fleet]:
        return [b.fleet for b in self.configured if b.fleet is not None]

    def requests_in_flight(self) -> int:
        """Requests holding a reservation or waiting in a queue, over all backends."""
        return sum(len(b.admission.ledger) + b.admission.waiting() for b in self if b.admission is not None)

    def reap(self) -> int:
        """Force-release reservations whose request is gone (each gatekeeper logs them); how many."""
        return sum(len(b.gatekeeper.reap()) for b in self if b.gatekeeper is not None)

    def __iter__(self):
        return iter(self.backends)

    def _own(self, backend: Backend, controller: BudgetController) -> None:
        """`controller` owns the backend's budget: each of its moves reaches the gatekeeper, and
        the backend's warnings (a budget held by hand: `held_budget_warnings`)."""
        assert backend.gatekeeper is not None
        backend.controller = controller
        controller.on_change(backend.gatekeeper.set_budget)
        controller.on_change(lambda _budget: self.warn(backend))

    def set_budget_config(self, budget: BudgetConfig) -> None:
        """Controllers created from now on use these settings (live ones are retuned by control).

        A reload that changes `mode` hands each budget to the other kind of owner (adaptive
        controller or fixed budget), at the budget in force and with the freeze carried over.
        """
        if budget.mode != self._budget.mode:
            for b in self:
                old = b.controller
                if old is None:
                    continue
                new = controller_for(budget.mode, old.settings, old.budget)
                if old.frozen:
                    new.freeze()
                self._own(b, new)
        self._budget = budget
        for b in self:
            self.warn(b)

    def set_classes(self, classes: Iterable[ClassPolicy]) -> None:
        self._classes = tuple(classes)
        for b in self:
            self.warn(b)

    def route(self, model: str | None) -> Backend | None:
        """Declared models first; an absent model goes to the first backend; else a catch-all.

        A router's models route to their units (an absent model: its first model)."""
        if model is None:
            first = self.configured[0]
            # a router with no unit (no model listed in [[backends]] models): nothing to admit to
            return next(iter(first.fleet.units.values()), None) if first.fleet is not None else first
        for b in self.configured:
            if model in b.config.models:
                return b.fleet.units[model] if b.fleet is not None else b
        return next((b for b in self.configured if not b.config.models and b.fleet is None), None)

    def by_name(self, name: str) -> Backend | None:
        return next((b for b in (*self.backends, *self.configured) if b.name == name), None)

    @property
    def any_ready(self) -> bool:
        return any(b.state == "ready" or (b.fleet is not None and b.fleet.accepts(b)) for b in self.backends)

    async def probe_all(self) -> None:
        await asyncio.gather(*(self.probe(b) for b in self.configured))

    async def probe(self, backend: Backend) -> None:
        """One health check (and /props when ready); never raises."""
        before = (backend.state, backend.capacity, backend.chat_template_tokens)
        first = backend.detail == "not probed yet"  # the first probe at start is not an event
        try:
            health = await backend.get("/health", timeout=self._timeout)
            if health.status_code == 503:
                backend.state, backend.detail = "loading", "llama-server is loading the model"
            elif health.status_code != 200:
                backend.state, backend.detail = "down", f"/health answered {health.status_code}"
            else:
                props = await backend.get("/props", timeout=self._timeout)
                props.raise_for_status()
                backend.props = props.json()
                if backend.props.get("role") == "router" or backend.fleet is not None:
                    self._router(backend)
                    if backend.fleet is not None and not backend.fleet.refreshed:
                        await backend.fleet.refresh()  # the models' states before the gate answers
                else:
                    if backend.state != "ready" or backend.layout is None:
                        # Learned on each (re)start of the server: it may come back with other flags.
                        args = self._server_args(backend)
                        backend.layout = learn_layout(backend.props, backend.config.kv, args, await self._n_ctx_train(backend))
                        backend.server_pid = args.pid if args is not None else None
                        self._say_same_process(backend, args)
                        backend.chat_template_tokens = await self._template_tokens(backend)
                    self.apply_capacity(backend, capacity_from_props(backend.props, backend.config, backend.layout))
                    backend.state, backend.detail = "ready", "ok"
            backend.probe_timeouts = 0
        except httpx.TimeoutException as exc:
            backend.probe_timeouts += 1
            if backend.state == "ready" and backend.probe_timeouts < PROBE_TIMEOUTS_DOWN:
                # One probe that timed out is no verdict on a ready backend: the timeout counts the
                # gate's own stalls too (a test run here, 2026-12-06: the loop of three gates stalled 2.28 s, each
                # marked its healthy llama-server down and answered 503 no_backend until its next
                # probe). A hung llama-server times out the next probe too, a second later.
                log.info("backend %s: health probe timed out (%s); still ready until the next probe says so too", backend.name, exc)
            else:
                backend.state, backend.detail = "down", f"{type(exc).__name__}: {exc}"[:200]
        except (httpx.HTTPError, ValueError) as exc:
            backend.state, backend.detail = "down", f"{type(exc).__name__}: {exc}"[:200]
        if backend.fleet is not None:
            backend.fleet.router_state(backend.state, backend.detail)
        if self.on_state is not None and not first and (before[0] == "ready") != (backend.state == "ready"):
            self.on_state(backend, before[0], backend.state)
        if (backend.state, backend.capacity) != before[:2]:
            log.info("backend %s: %s %s", backend.name, describe_state(backend), describe_capacity(backend))
            if backend.gatekeeper is not None:
                backend.gatekeeper.advance()
            if self._on_change is not None:
                self._on_change()
        # (a restart on another model of the same size changes only the template: journaled too)
        learned = (backend.capacity, backend.chat_template_tokens) != before[1:]
        if self.on_capacity is not None and backend.state == "ready" and backend.capacity is not None and learned:
            self.on_capacity(backend)

    async def _template_tokens(self, backend: Backend) -> int | None:
        """`measure_template`'s answer for `backend`; never raises (a probe must not fail on it)."""
        if self.measure_template is None:
            return None
        try:
            return await self.measure_template(backend)
        except Exception:  # a bug here must not keep a backend from going ready
            log.exception("backend %s: measuring the chat template failed", backend.name)
            return None

    def _say_same_process(self, backend: Backend, args: ServerArgs | None) -> None:
        """An ERROR when another backend's llama-server is this one's process: its capacity is
        counted twice. `serve` refuses two URLs that resolve to one address; this is what
        resolving cannot tell (llama-server on 0.0.0.0, reached as 127.0.0.1 and as ::1). Said
        once per pair (a router's backends never get here: their probe takes the router path)."""
        if args is None:
            return
        for other in self.configured:
            pair = frozenset((backend.name, other.name))
            if other is backend or other.server_pid != args.pid or pair in self._said_same:
                continue
            self._said_same.add(pair)
            first, second = (other, backend) if self.configured.index(other) < self.configured.index(backend) else (backend, other)
            log.error("%s", same_process_problem(first.config, second.config, args))

    def _server_args(self, backend: Backend) -> ServerArgs | None:
        return self._args_finder(backend.url)

    async def _n_ctx_train(self, backend: Backend) -> int | None:
        """`/v1/models` meta.n_ctx_train: the total context of a server started with `-c 0`."""
        try:
            data = (await backend.get("/v1/models", timeout=self._timeout)).json()["data"]
            value = data[0]["meta"]["n_ctx_train"]
            return value if isinstance(value, int) else None
        except (httpx.HTTPError, ValueError, LookupError, TypeError):
            return None

    def capacity_warnings(self, backend: Backend) -> tuple[str, ...]:
        return capacity_warnings(backend.layout, backend.capacity, self._budget, self._classes) + self.held_warnings(backend)

    def held_warnings(self, backend: Backend) -> tuple[str, ...]:
        """`held_budget_warnings` of the backend's budget, when an operator holds it."""
        c = backend.controller
        held = None if c is None or c.elastic else c.budget
        return held_budget_warnings(backend.capacity, held, c is not None and c.frozen, self._classes)

    def warn(self, backend: Backend) -> None:
        """Recompute the backend's warnings (each logged once, as it appears): on a change of its
        capacity, the classes, [budget], its budget, or the controller's freeze."""
        warnings = self.capacity_warnings(backend)
        if warnings != backend.warnings:
            for w in warnings:
                if w not in backend.warnings:
                    log.warning("backend %s: %s", backend.name, w)
            for w in backend.warnings:
                if w not in warnings:  # a trial unfroze and saw it go only in /health and the console
                    log.info("backend %s: no longer: %s", backend.name, w)
            backend.warnings = warnings
        notes = capacity_notes(backend.capacity, self._classes)
        if notes != backend.notes:
            for n in notes:
                if n not in backend.notes:
                    log.info("backend %s: note: %s", backend.name, n)
            backend.notes = notes

    def _router(self, backend: Backend) -> None:
        """Router mode: the backend becomes one unit per configured model (once)."""
        if backend.props.get("role") != "router":
            backend.state, backend.detail = "down", "llama-server left router mode: restart tokengate"
            return
        if self._fleet_factory is None:
            backend.state, backend.detail = "down", "llama-server runs in router mode, which this gate was built without"
            return
        if backend.fleet is None:
            backend.fleet = self._fleet_factory(backend, self, self._client, clock=self._clock, on_event=self.on_model_event)
            log.info("backend %s: llama-server router mode, models %s", backend.name, ", ".join(backend.config.models) or "none")
            if not backend.config.models:
                log.warning("backend %s: llama-server runs in router mode: list its models in [[backends]] models", backend.name)
            if self.on_units is not None:
                self.on_units()
        backend.fleet.router_props(backend.props)
        if not backend.config.models:
            # Ready, as llama-server's own router with nothing to serve is: every model is a 404
            # (model_not_found) until [[backends]] models lists the ones the gate may serve.
            backend.state, backend.detail = "ready", "router: no models listed in [[backends]] models: each request is refused"
            return
        backend.state, backend.detail = "ready", f"router: {len(backend.config.models)} models"

    def floor_for(self, ceiling: int) -> int:
        """The controller's floor on a backend of this ceiling, from [budget] and the classes in force."""
        return budget_floor(self._budget, ceiling, reserved_total(self._classes, ceiling))

    def apply_capacity(self, backend: Backend, capacity: Capacity, *, gatekeeper_factory: Callable[..., Gatekeeper] = Gatekeeper) -> None:
        if backend.gatekeeper is None:
            reserved = reserved_total(self._classes, capacity.ceiling)
            controller = controller_for(self._budget.mode, controller_settings(self._budget, capacity.ceiling, reserved))
            prefill = PrefillModel()
            admission = Admission(
                self._classes,
                capacity,
                budget=controller.budget,
                tenant_policy=self._tenant_policy,
                aging_s=self._budget.aging_s or None,
                keep_slots=self._budget.keep_slots,
                # the fitted model, else the median first-token time measured lately (#25: fixed
                # prompt sizes give no fit, and the protection must not vanish with it)
                expected_ttft=lambda r, prefilling: prefill.expected_or_recent(r.prompt_tokens, prefilling),
                first_token_spread=prefill.spread,  # T1: likely to make it, its first token's spread counted
                # a line of the prompt's tokens with a rate > 0, or a median: never less for a longer prompt (#24)
                ttft_grows_with_prompt=True,
                # every class has an objective: its own ttft_objective_ms, else the SLO
                default_ttft_objective_ms=self._budget.slo_ttft_p95_ms,
                # The controller's budget is an estimate the aged may stretch; an operator's is a limit.
                budget_elastic=lambda: backend.controller is not None and backend.controller.elastic,
            )
            backend.gatekeeper = gatekeeper_factory(
                admission, clock=self._clock, prefill=prefill, slo_ttft_s=self._budget.slo_ttft_p95_ms / 1000.0
            )
            self._own(backend, controller)
            if self._on_created is not None:
                self._on_created(backend)  # operator state (paused classes, freeze) carries over
        elif backend.capacity != capacity:
            backend.gatekeeper.set_capacity(capacity)
            if backend.controller is not None:
                # the floor follows the ceiling too (auto: a quarter of it, or the reservations in
                # force, R0): a llama-server restarted with a smaller -c kept the old pool's floor,
                # clamped to the new ceiling, and the controller had no room
                reseat = backend.capacity is not None and backend.capacity.ceiling != capacity.ceiling
                backend.capacity = capacity  # before the move, whose warnings (`warn`) judge against it
                move = backend.controller.set_ceiling(self._clock(), capacity.ceiling, self.floor_for(capacity.ceiling), reseat=reseat)
                if move is not None and self.on_budget_move is not None:
                    # unsaid, a trial's frozen 1,200 became 1,024 on a smaller pool with no audit
                    # row, the console still saying 1,200
                    self.on_budget_move(backend, move)
        backend.capacity = capacity
        self.warn(backend)

    async def run(self, interval_s: float = 1.0) -> None:
        """Probe every backend forever; a down backend costs one refused connect per interval.

        A router's model fleet runs its own loop beside this one, stopped with it."""
        try:
            while True:
                await self.probe_all()
                for fleet in self.fleets:
                    if fleet.task is None:
                        fleet.task = asyncio.create_task(fleet.run(interval_s), name=f"tokengate-models-{fleet.parent.name}")
                        self._fleet_tasks.append(fleet.task)
                await asyncio.sleep(interval_s)
        finally:
            for task in self._fleet_tasks:
                task.cancel()
            await asyncio.gather(*self._fleet_tasks, return_exceptions=True)
            await asyncio.gather(*(fleet.close() for fleet in self.fleets), return_exceptions=True)


def controller_moves(pool: BackendPool, now: float) -> list[tuple[Backend, Move]]:
    """One adaptive step per backend; the moves made (each already pushed to its admission)."""
    moves = []
    for b in pool:
        if b.controller is None or b.admission is None:
            continue
        adm = b.admission
        move = b.controller.tick(now, has_demand(adm.waiting(), adm.ledger.in_flight, adm.budget))
        if move is not None:
            moves.append((b, move))
    return moves


async def release_when_slot_frees(
    backend: Backend,
    ticket: Ticket,
    *,
    timeout_s: float,
    clock: Callable[[], float],
    then: Callable[[], None] | None = None,
    ran: bool = True,
) -> None:
    """Release `ticket` once llama-server shows one busy slot fewer than the gate holds; then call `then`.

    A cancelled request's slot stays busy in llama-server until its next decode step; releasing
    before that would let the gate dispatch into a slot llama-server still holds. `ran` False: a
    forward sent beside its count and taken back: withdrawn, no hold measured from it (a prompt
    of up to a batch is prefilled whole before llama-server sees the cancel: 1.1 s for 352 tokens
    on the test VM, 2026-12-05).
    """
    cut_at = clock()
    deadline = cut_at + timeout_s
    pause = 0.05
    last_task: int | None = None  # llama-server's newest task at the first look: later ones started after the cut
    try:
        while clock() < deadline and backend.admission is not None:
            try:
                response = await backend.get("/slots", routed=True, timeout=1.0)
                slots = response.json() if response.status_code == 200 else None
            except (httpx.HTTPError, ValueError):
                slots = None
            if not isinstance(slots, list):
                break  # /slots is off or the backend is gone: nothing to wait for
            slots = [s for s in slots if isinstance(s, dict)]
            if last_task is None:
                last_task = max((t for s in slots if isinstance(t := s.get("id_task"), int)), default=-1)
            # Compare like with like: the slots busy with tasks llama-server had started by the
            # cut, against the slots of requests the gate had dispatched by then (this one's
            # included). Against every slot the gate holds, a request dispatched after the cut
            # and not started yet made a slot look free: a trial's gate let go of a cut 1,600-
            # token prefill at once, dispatched one request more than llama-server had slots,
            # and all of them waited 2.3 s for the prefill (llama-server does not stop a batch).
            busy = sum(1 for s in slots if s.get("is_processing") and not (isinstance(t := s.get("id_task"), int) and t > last_task))
            held = sum(r.request.tasks for r in backend.admission.ledger if r.admitted_at <= cut_at)
            if busy + ticket.request.tasks <= held:  # the ledger still counts this ticket's slots
                break
            await asyncio.sleep(pause)
            # a stream's slot frees within a decode step; a plain call's may take its whole answer
            # (up to request_timeout_s): asked every 50 ms at first, then at most every 0.5 s, so a
            # burst of cut plain calls does not poll llama-server's /slots at 20 Hz each for minutes
            pause = min(pause * 1.5, 0.5)
    finally:
        if backend.gatekeeper is not None:
            backend.gatekeeper.release(ticket, ran=ran)
        if then is not None:
            then()


def observe_upstream(backend: Backend, stats: RelayStats, now: float) -> None:
    """Feed a completed request's upstream latencies (TTFT, time per output token) to the controller."""
    tpot = None
    if stats.first_token_at is not None and stats.completion_tokens and stats.completion_tokens > 1:
        tpot = (now - stats.first_token_at) / (stats.completion_tokens - 1)
    if backend.controller is not None:
        backend.controller.observe(now, stats.ttft_s, tpot)


def describe_state(backend: Backend) -> str:
    """A backend's state for the log: ``ready (ok)``, or the state alone when there is nothing
    to add (a router's model at rest: the start-up log read ``unloaded ()``)."""
    return f"{backend.state} ({backend.detail})" if backend.detail else backend.state


def describe_capacity(backend: Backend) -> str:
    """The start-up line's words for what the gate admits against (as `config check --backends`)."""
    cap, layout = backend.capacity, backend.layout
    if cap is None:
        text = "capacity per model, as each loads" if backend.fleet is not None else "capacity not known yet"
    else:
        text = f"{cap.slots} slot{'' if cap.slots == 1 else 's'} of {cap.slot_context} tokens, ceiling {cap.ceiling}"
        if cap.pool is not None:
            text += f" (token_budget; llama-server's pool {cap.pool})"
        if cap.max_prefill_tokens is not None:
            text += f", max_prefill_tokens {cap.max_prefill_tokens}"
    if layout is not None:
        text += f", kv {layout.kv} ({layout.source}: {layout.detail})"
    return text


def capacity_notes(cap: Capacity | None, classes: Iterable[ClassPolicy]) -> tuple[str, ...]:
    """What the operator may want to know of a backend's capacity that the gate handles on its
    own (logged at start and printed by `config check --backends`, never a warning: the exit
    status, `/health` and the console's backend line stay for contradictions)."""
    out = []
    for c in classes if cap is not None else ():
        default = getattr(c, "default_max_tokens", None)
        if isinstance(default, int) and cap is not None and default >= cap.slot_context:
            # a note, not a warning (#25, tried as a user): the example's batch 512 on the
            # README's own `-np 4 -c 2048` (slots of 512) made `config check --backends` exit 1,
            # yet such a request starts and is served; its only cost is the budget it reserves
            out.append(
                f"classes.{c.name}.default_max_tokens {default} fills one slot's context {cap.slot_context}: a "
                f"{c.name} request without max_tokens gets what its slot holds after its prompt, and reserves the "
                f"whole slot ({cap.slot_context} tokens) of the budget; lower it to run more of them at once"
            )
    return tuple(out)


def check_backend(
    config: BackendConfig,
    budget: BudgetConfig,
    classes: Iterable[ClassPolicy],
    *,
    environ: Mapping[str, str],
    timeout_s: float = 3.0,
    args_finder: Callable[[str], ServerArgs | None] = local_server_args,
) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
    """`tokengate config check --backends`: one line on what the running llama-server reports
    and the capacity the gate would run with, what the config contradicts (blocking), and
    notes (`capacity_notes`: not blocking)."""
    token = environ.get(config.api_key_env) if config.api_key_env else None
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with httpx.Client(timeout=timeout_s, headers=headers) as client:
            health = client.get(config.url + "/health")
            if health.status_code != 200:
                return f"not ready (/health answered {health.status_code})", (), ()
            props = client.get(config.url + "/props").json()
            if props.get("role") == "router":
                return _check_router(client, config, props)
            try:
                n_ctx_train = client.get(config.url + "/v1/models").json()["data"][0]["meta"]["n_ctx_train"]
            except (httpx.HTTPError, ValueError, LookupError, TypeError):
                n_ctx_train = None
    except (httpx.HTTPError, ValueError) as exc:
        return f"unreachable ({type(exc).__name__}: {exc})"[:200], (), ()
    layout = learn_layout(props, config.kv, args_finder(config.url), n_ctx_train if isinstance(n_ctx_train, int) else None)
    try:
        cap = capacity_from_props(props, config, layout)
    except ValueError as exc:
        return str(exc), (), ()
    slots = f"{cap.slots} slot{'' if cap.slots == 1 else 's'}"  # "1 slots of 2048 tokens": a trial's -np 1
    line = f"{slots} of {cap.slot_context} tokens, kv {layout.kv} ({layout.source}: {layout.detail}), ceiling {cap.ceiling}"
    classes = tuple(classes)
    if budget.mode == "adaptive":
        # the floor in force (auto: a quarter of the ceiling, at least the reservations), which
        # the summary can only describe without the ceiling (a trial read "min auto" and no number)
        line += (
            f"; the adaptive budget moves within {budget_floor(budget, cap.ceiling, reserved_total(classes, cap.ceiling))}..{cap.ceiling}"
        )
    return line, capacity_warnings(layout, cap, budget, classes), capacity_notes(cap, classes)


def _check_router(client: httpx.Client, config: BackendConfig, props: Mapping[str, Any]) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
    """A router: each configured model's status in its /models list, and those it does not list
    (every request for one is refused 503 model_unavailable); no model listed at all, or pins
    that take every --models-max place (both said only at serve time before: a trial)."""
    line = "router mode: capacity per model, checked when each loads"
    if not config.models:
        return line, ("a router needs `models`, the models the gate serves: with none every request is refused",), ()
    max_instances = props.get("max_instances")
    pins = [m for m in config.models if m in config.pin]
    crowded: tuple[str, ...] = ()
    # what can never load once the pins take every place: the pins past them, and the rest
    left = pins[max_instances:] + [m for m in config.models if m not in config.pin] if isinstance(max_instances, int) else []
    if isinstance(max_instances, int) and 0 < max_instances <= len(pins) and left:
        crowded = (
            f"pin names {len(pins)} {'model' if len(pins) == 1 else 'models'} and llama-server runs at most {max_instances} "
            f"(--models-max): "
            f"{', '.join(left)} could never load (refused 503 model_unavailable)",
        )
    try:
        data = client.get(config.url + "/models").json()["data"]
        listed: dict[str, str] = {}
        for entry in data:
            status = entry.get("status")
            value = str(status.get("value")) if isinstance(status, dict) else "?"
            if isinstance(status, dict) and status.get("failed"):
                value = f"failed, exit code {status.get('exit_code')}"
            for name in (entry["id"], *(entry.get("aliases") or ())):
                listed.setdefault(str(name), value)
    except (httpx.HTTPError, ValueError, LookupError, TypeError, AttributeError) as exc:
        return f"{line}; its model list could not be read ({type(exc).__name__})", (), ()
    found = [f"{m} ({listed[m]})" for m in config.models if m in listed]
    if found:
        line += "; models: " + ", ".join(found)
    have = ", ".join(sorted(listed)) or "none"
    missing = tuple(
        f"model {m!r} is not in llama-server's model list ({have}): every request for it would be refused"
        for m in config.models
        if m not in listed
    )
    return line, missing + crowded, ()


@dataclass(frozen=True, slots=True)
class Core:
    """A backend whose admission core exists, with its gatekeeper and budget owner typed as
    present (the operator layer acts on these; a router's model before its first load too)."""

    backend: Backend
    gatekeeper: Gatekeeper
    controller: BudgetController

    @property
    def admission(self) -> Admission:
        return self.gatekeeper.admission

    @property
    def capacity(self) -> Capacity | None:
        return self.backend.capacity

    @property
    def name(self) -> str:
        return self.backend.name


def cores(backends: Iterable[Backend]) -> list[Core]:
    return [Core(b, b.gatekeeper, b.controller) for b in backends if b.gatekeeper is not None and b.controller is not None]
