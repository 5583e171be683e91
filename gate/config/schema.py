"""The config schema: one frozen dataclass per TOML table, their defaults, the name rules and
:class:`ConfigError`.

Nothing here reads or checks anything; :mod:`gate.config.reader` fills these in from TOML and
:mod:`gate.config.checks` judges their values.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

KvMode = Literal["auto", "unified", "split"]
BudgetMode = Literal["adaptive", "static"]
FailurePolicy = Literal["fail_open", "fail_closed"]

CLASS_NAME_RE = re.compile(r"[a-z0-9_-]+")
# Backend and tenant names show up in logs, metrics labels and the console: printable, no spaces.
NAME_RE = re.compile(r"[A-Za-z0-9_.@:-]{1,64}")
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
SHA256_RE = re.compile(r"[0-9a-f]{64}")


# --------------------------------------------------------------------------------------------
# Errors


class ConfigError(Exception):
    """A config problem: where (``source``), which key (dotted path) and what is wrong."""

    def __init__(self, source: str, key: str, problem: str) -> None:
        self.source = source
        self.key = key
        self.problem = problem
        super().__init__(str(self))

    def __str__(self) -> str:
        if self.key:
            return f"{self.source}: {self.key}: {self.problem}"
        return f"{self.source}: {self.problem}"

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.source, self.key, self.problem))


# --------------------------------------------------------------------------------------------
# Dataclasses


@dataclass(frozen=True, slots=True)
class GateConfig:
    """``[gate]``: the gate's own listener and limits."""

    listen_host: str = "127.0.0.1"
    listen_port: int = 8081
    #: more addresses to listen on, "host:port" each (``listen`` given as a list: its rest)
    listen_also: tuple[str, ...] = ()
    #: a path not in llama-server's route table (gate/data/endpoints.py): forwarded, or 404
    unknown_routes: Literal["forward", "refuse"] = "forward"
    journal: str = "tokengate.db"
    max_body_bytes: int = 8 * 1024 * 1024
    request_timeout_s: float = 600.0
    shed_factor: float = 2.5
    shed_stall_s: float = 60.0
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    write_stall_s: float = 30.0
    #: after a stream's first token, llama-server is read at most this often (ms) and what came
    #: is relayed in one write; 0: every read as it comes (gate/backend/netio.py)
    stream_batch_ms: float = 10.0
    #: a request that fits at once on an upper bound of its prompt goes to llama-server while
    #: llama-server counts it, not after: the count's round trip leaves the first token's path
    #: (gate/http/proxy.py); False: count, then admit, then forward
    forward_beside_count: bool = True
    #: the Unix socket consoles attach to; "" = beside the journal (tokengate.db -> tokengate.sock)
    control_socket: str = ""
    #: "" = mode 0600 (only the gate's user); a group name = mode 0660 and that group
    control_socket_group: str = ""

    def control_socket_path(self) -> str | None:
        """Where the control socket lives; None for an in-memory journal with no socket set."""
        if self.control_socket:
            return self.control_socket
        if self.journal == ":memory:":
            return None
        base, dot, ext = self.journal.rpartition(".")
        stem = base if dot and "/" not in ext else self.journal
        return stem + ".sock"

    @property
    def listen(self) -> str:
        """The listen address as ``host:port`` (IPv6 hosts in brackets)."""
        host = f"[{self.listen_host}]" if ":" in self.listen_host else self.listen_host
        return f"{host}:{self.listen_port}"

    @property
    def listen_addresses(self) -> tuple[tuple[str, int], ...]:
        """Every (host, port) the gate listens on, the first one ``listen_host:listen_port``."""
        extra = []
        for text in self.listen_also:
            host, _, port = text.rpartition(":")
            extra.append((host.strip("[]"), int(port)))
        return ((self.listen_host, self.listen_port), *extra)


@dataclass(frozen=True, slots=True)
class BackendConfig:
    """One ``[[backends]]`` entry: a llama-server the gate forwards to."""

    name: str = "default"
    url: str = "http://127.0.0.1:8080"
    models: tuple[str, ...] = ()
    kv: KvMode = "auto"  # learned from the server where it tells; else unified, said loudly
    token_budget: int | None = None
    max_prefill_tokens: int | None = None  # None: derived from the measured prefill rate; 0: off
    prefill_yield_tokens: int = 512  # prompts longer than this yield to higher classes; 0: off
    api_key_env: str | None = None
    #: router mode (llama-server --models-dir/--models-preset): models the gate keeps loaded
    pin: tuple[str, ...] = ()
    #: router mode: what a cold start costs, in seconds; a model idle for less is not evicted.
    #: None = each model's measured load time
    cold_start_s: float | None = None


@dataclass(frozen=True, slots=True)
class BudgetConfig:
    """``[budget]``: the token budget and its adaptive controller."""

    mode: BudgetMode = "adaptive"
    #: the controller's floor; 0 = auto: a quarter of each backend's ceiling, never below the
    #: classes' reservations (#25: the old default, 2048, equalled a 2,048-token pool and the
    #: controller never moved)
    min_tokens: int = 0
    slo_ttft_p95_ms: float = 2000.0
    slo_tpot_p95_ms: float | None = None
    window_s: float = 30.0
    cooldown_s: float = 5.0
    increase: float = 1.1
    decrease: float = 0.8
    min_samples: int = 20
    # A waiter this old goes first (and may stretch the controller's budget); 0: off. 5 s: with the
    # time the others take to get back within their reservations, under 10 s, so every class with
    # demand is served in every 10 s window (#13's guarantee; at 10 s a 1x run had a window of 0).
    aging_s: float = 5.0
    #: F7 (gate/core/admission.py): a lower class leaves free the slots a higher class's recent
    #: arrivals are expected to need (#25: with TTFT objectives batch at 2x took the slots that
    #: freed before interactive at 1x arrived, 74 served to 25)
    keep_slots: bool = True


CLASS_QUEUE_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class ClassConfig:
    """One ``[classes.NAME]`` table. A HIGHER ``priority`` is served first.

    ``limit_tokens`` None means the class may borrow up to the whole budget.
    """

    name: str
    priority: int
    reserved_tokens: int = 0
    limit_tokens: int | None = None
    queue_depth: int = 64
    #: a backstop: the TTFT objective refuses a waiter that cannot make it long before (#25:
    #: 10 s, what the example and the built-in interactive class say)
    queue_timeout_s: float = CLASS_QUEUE_TIMEOUT_S
    default_max_tokens: int = 512
    max_tokens_cap: int = 4096
    ttft_objective_ms: float | None = None  # refuse a waiter early once it cannot meet this
    #: models to try, in order, when the requested one is saturated, loading or refuses
    fallback: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class TenantConfig:
    """One ``[[tenants]]`` entry. The TOML key ``class`` is ``class_name`` here.

    ``class_name`` None means the config's ``default_class``; ``allowed_classes`` empty means the
    tenant may use only its own class.
    """

    name: str
    api_key_sha256: str | None = None
    api_key_env: str | None = None
    class_name: str | None = None
    allowed_classes: tuple[str, ...] = ()
    weight: float = 1.0
    max_tokens_in_flight: int | None = None
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    #: replaces its class's fallback list when not empty
    fallback: tuple[str, ...] = ()
    #: may call the routes that change llama-server (POST /props, /lora-adapters, /slots/N, router
    #: model load/unload); audited like console actions
    operator: bool = False


@dataclass(frozen=True, slots=True)
class FleetGateConfig:
    """One ``[[fleet]]`` entry: another gate the fleet console attaches to (the gate itself
    ignores the list). ``name`` "" means the socket file's name without ``.sock``."""

    socket: str
    name: str = ""


@dataclass(frozen=True, slots=True)
class SharedConfig:
    """``[shared]``: tenant limits shared by every gate on one Redis; ``redis_url`` "" = off."""

    redis_url: str = ""
    key_prefix: str = "tokengate:"
    failure_policy: FailurePolicy = "fail_open"
    #: how often each gate renews its leases; a dead gate's leases expire after 3x this
    renew_interval_s: float = 1.0
    #: how long Redis may take to answer an admission before the failure policy applies,
    #: counted in time the gate's loop could hear it (gate/fleet/sharedlimits/heard.py).
    #: 100, not 20: the gate's own lag is not counted, but Redis's is, and a Redis on a loaded
    #: host is itself short of CPU. A user trial (two gates and Redis on one loaded 2-core host,
    #: Redis at 110 us a call) saw 20 ms missed in 4 of 4 bursts of 20 s, each flip ~3 s long:
    #: fail_closed refused 539 of 1,428 requests, fail_open let a tenant reach 894 of its 600;
    #: at 100 ms, 0 flips in 3 bursts (one beside 2 CPU burners). A Redis that is down is still
    #: noticed at once (a refused connection does not wait for the bound).
    wait_ms: float = 100.0

    @property
    def enabled(self) -> bool:
        return bool(self.redis_url)

    @property
    def lease_ttl_s(self) -> float:
        """How long a lease lives without renewal: 3 renewal intervals."""
        return 3.0 * self.renew_interval_s


DEFAULT_CLASSES: tuple[ClassConfig, ...] = (
    ClassConfig(
        name="interactive",
        priority=10,
        queue_depth=64,
        queue_timeout_s=10.0,
        default_max_tokens=256,
        max_tokens_cap=4096,
    ),
    ClassConfig(
        name="batch",
        priority=1,
        queue_depth=256,
        queue_timeout_s=120.0,
        default_max_tokens=512,
        max_tokens_cap=4096,
    ),
)

DEFAULT_CLASS_NAME = "interactive"


@dataclass(frozen=True, slots=True)
class Config:
    """The whole validated config. ``classes`` is sorted by priority, highest first."""

    gate: GateConfig = field(default_factory=GateConfig)
    backends: tuple[BackendConfig, ...] = (BackendConfig(),)
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    classes: tuple[ClassConfig, ...] = DEFAULT_CLASSES
    tenants: tuple[TenantConfig, ...] = ()
    default_class: str = DEFAULT_CLASS_NAME
    #: gates for `tokengate console --attach --config F` (the fleet console)
    fleet: tuple[FleetGateConfig, ...] = ()
    shared: SharedConfig = field(default_factory=SharedConfig)

    def class_by_name(self, name: str) -> ClassConfig:
        """The class called ``name``; KeyError if there is none."""
        for c in self.classes:
            if c.name == name:
                return c
        raise KeyError(name)

    def objective_ms(self, cls: str) -> float | None:
        """The TTFT objective (from arrival) class ``cls`` is refused by and judged against: its
        ``ttft_objective_ms``, else ``[budget] slo_ttft_p95_ms``; None for an unknown class."""
        policy = next((c for c in self.classes if c.name == cls), None)
        return None if policy is None else policy.ttft_objective_ms or self.budget.slo_ttft_p95_ms

    def backend_by_name(self, name: str) -> BackendConfig:
        """The backend called ``name``; KeyError if there is none."""
        for b in self.backends:
            if b.name == name:
                return b
        raise KeyError(name)

    def tenant_by_name(self, name: str) -> TenantConfig:
        """The tenant called ``name``; KeyError if there is none."""
        for t in self.tenants:
            if t.name == name:
                return t
        raise KeyError(name)

    @property
    def class_names(self) -> tuple[str, ...]:
        """Class names, highest priority first."""
        return tuple(c.name for c in self.classes)
