"""One decision record per request, at its end: the journal's `decisions` row.

Never the prompt text. Until the SQLite journal lands, records go to a bounded
in-memory tail that the console and tests read.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from gate.core.reasons import Outcome as Outcome  # re-exported: the core's vocabulary


@dataclass(frozen=True, slots=True)
class DecisionRecord:
    ts: float  # wall clock, seconds since the epoch
    request_id: str
    tenant: str
    cls: str
    backend: str
    endpoint: str
    stream: bool
    prompt_tokens: int | None
    token_count_source: Literal["exact", "estimate"] | None
    max_tokens: int | None
    reserved_tokens: int
    outcome: Outcome
    reason: str  # a Reason value, "ok" for a completed request, "client_disconnect" for a cancel
    http_status: int
    queue_ms: float | None
    ttft_ms: float | None  # first token, measured from DISPATCH (upstream latency: the controller's signal)
    duration_ms: float
    completion_tokens: int | None
    budget_at_decision: int | None
    in_flight_at_decision: int | None
    model: str = ""  # the model that answered, when the gate routed by model ("" otherwise)
    rerouted_from: str = ""  # the model asked for, when a fallback answered instead
    #: first token, measured from ARRIVAL at the gate (what the client saw: queue wait included);
    #: None before schema v4 and for requests that never got a first token
    ttft_arrival_ms: float | None = None
    #: why the gate ended it, in the words its client got (a refusal's message: "cannot start
    #: now: expected wait ...", "waited 4.2s ...; would miss the 2000 ms objective", "waited
    #: 10.0s ..., its limit is 10s" tell apart what one reason code, queue_timeout, names);
    #: "" for a completed request, a relayed backend error, and rows before schema v5
    detail: str = ""


class RecentDecisions:
    """The last N records, newest last."""

    def __init__(self, maxlen: int = 10_000) -> None:
        self._rows: deque[DecisionRecord] = deque(maxlen=maxlen)
        self.total = 0

    def add(self, record: DecisionRecord) -> None:
        self._rows.append(record)
        self.total += 1

    def __iter__(self) -> Iterator[DecisionRecord]:
        return iter(tuple(self._rows))

    def __len__(self) -> int:
        return len(self._rows)

    def since(self, seq: int, n: int) -> list[DecisionRecord]:
        """At most the newest n of the records after sequence number `seq` (1-based; 0: from the start)."""
        wanted = min(n, self.total - seq, len(self._rows))
        if wanted <= 0:
            return []
        newest = list(itertools.islice(reversed(self._rows), wanted))
        newest.reverse()
        return newest

    def tail(self, n: int) -> list[DecisionRecord]:
        """The newest n records, oldest first."""
        return list(self._rows)[-n:] if n < len(self._rows) else list(self._rows)

    def find(self, request_id: str) -> DecisionRecord | None:
        return next((r for r in reversed(self._rows) if r.request_id == request_id), None)


AuditSource = Literal["console", "cli", "config", "controller", "signal", "api", "gate"]  # cli: a one-shot command (overrides drop)


#: the audit action of a ready backend's capacity, learned or changed (its value: JSON with
#: slots, kv, slot_context, ceiling): `tokengate replay` models the layout the gate learned
CAPACITY_LEARNED = "capacity_learned"
#: the audit action of the gates counted on Redis ([shared]), when the count changes (its value:
#: N): a gate started while Redis is out of reach divides fail_open's limits by the last one
SHARED_GATES = "shared_gates"


@dataclass(frozen=True, slots=True)
class AuditRecord:
    """One change to the gate's settings: who, from where, what, old and new value."""

    ts: float  # wall clock, seconds since the epoch
    operator: str  # user name (SUDO_USER over USER); "controller" for the adaptive loop
    origin: str  # SSH client address, or "local"
    source: AuditSource
    action: str  # e.g. "set_budget", "pause_class", "drain_class", "freeze", "reload"
    target: str  # e.g. "backend:default", "class:batch", "controller"
    old_value: str | None
    new_value: str | None
    note: str = ""
    gate_id: str = ""  # host:pid:start of the gate that wrote it (merged journals stay apart)


@dataclass(frozen=True, slots=True)
class ClassSample:
    cls: str
    in_flight: int
    queued: int


@dataclass(frozen=True, slots=True)
class SampleRecord:
    """The gate's state once a second, per backend: what the review screen charts."""

    ts: float  # wall clock, seconds since the epoch
    backend: str
    budget: int | None
    in_flight: int
    queued: int
    slots_busy: int | None
    slots_total: int | None
    gpu_used_bytes: int | None
    gpu_total_bytes: int | None
    p95_ttft_ms: float | None
    p95_tpot_ms: float | None
    admitted: int  # decisions in the last second
    refused: int
    gate_id: str = ""
    #: journal rows this gate dropped since it opened the journal (cumulative; schema v4): a rise
    #: between two samples says the decisions of that stretch are incomplete
    journal_dropped: int = 0
    classes: tuple[ClassSample, ...] = ()
