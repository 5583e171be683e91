"""The fleet console's model: the gates it watches (one control-socket link each) and one row
of figures per gate.

`tokengate console --attach A --attach B ...` (or `--attach --config F` with `[[fleet]]`
tables) names the gates; each gets a read-only `SocketLink` that the fleet polls for a
snapshot every tick. A gate that cannot be reached is a row that says why, retried every
RETRY_S, never an error that ends the console. Opening a gate's full view (console/fleet_app.py)
takes a link of its own, with the console's own read-only flag.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gate.data.records import AuditRecord
from gate.data.snapshot import GateSnapshot
from gate.ops.link import GateLink, LinkLost, SocketLink

#: seconds between attempts to reach a gate that did not answer
RETRY_S = 2.0
#: how long one snapshot may take before the gate's row says it is slow
SNAPSHOT_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True)
class FleetEntry:
    name: str
    socket: str


def parse_attach(arg: str) -> tuple[str, str]:
    """`NAME=PATH` or `PATH` -> (name or "", path). A path may itself hold '=' after a '/'."""
    name, sep, path = arg.partition("=")
    if sep and name and "/" not in name and path:
        return name, path
    return "", arg


def fleet_entries(items: Iterable[tuple[str, str]]) -> list[FleetEntry]:
    """Named gates, each socket once. A gate without a name gets its socket file's name without
    .sock (gpu-2.sock -> gpu-2), numbered when that is taken (tokengate, tokengate-2).
    ValueError when two gates are given the same name."""
    items = list(items)
    explicit = [name for name, _ in items if name]
    if len(set(explicit)) != len(explicit):
        dup = next(n for n in explicit if explicit.count(n) > 1)
        raise ValueError(f"two gates are named {dup!r}: give each its own name (NAME=SOCKET)")
    entries: list[FleetEntry] = []
    taken = set(explicit)
    for name, socket in items:
        if any(e.socket == socket for e in entries):
            continue
        if not name:
            base = Path(socket).stem or "gate"
            name, n = base, 2
            while name in taken:
                name, n = f"{base}-{n}", n + 1
            taken.add(name)
        entries.append(FleetEntry(name, socket))
    return entries


@dataclass(frozen=True, slots=True)
class FleetRow:
    """One gate's figures, as the fleet table shows them (None: not known)."""

    name: str
    state: str  # ok | stopping | connecting | down
    note: str  # why it is down ("" otherwise)
    host: str
    listen: str
    ready: int | None  # backends ready
    backends: int | None  # backends configured
    budget: int | None
    in_flight: int | None  # tokens
    running: int | None  # requests holding a reservation (dispatched upstream)
    queued: int | None
    denials_per_min: int | None
    p95_ttft_ms: float | None  # the class furthest over its objective: its TTFT p95 from arrival
    slo_ttft_ms: float | None  # ... and that objective (`worst_class_ttft`)
    shared: str  # off | ok | fail_open | fail_closed
    ttft_class: str = ""  # ... and that class


def fleet_row(name: str, snap: GateSnapshot | None, error: str | None) -> FleetRow:
    """The row for one gate from its last snapshot; an error wins (the figures would be old)."""
    if snap is None or error is not None:
        state = "down" if error else "connecting"
        return FleetRow(name, state, error or "", "", "", None, None, None, None, None, None, None, None, None, "")
    return FleetRow(
        name=name,
        state="stopping" if snap.shutting_down else "ok",
        note="",
        host=snap.gate_id.split(":", 1)[0],
        listen=snap.listen,
        ready=sum(b.state == "ready" for b in snap.backends),
        backends=len(snap.backends),
        budget=snap.controller.budget,
        in_flight=snap.in_flight,
        running=max(0, snap.requests_in_flight - snap.queued),
        queued=snap.queued,
        denials_per_min=sum(c.refused_per_min for c in snap.classes),
        **worst_class_ttft(snap),
        shared=snap.shared or "off",
    )


def worst_class_ttft(snap: GateSnapshot) -> dict[str, Any]:
    """The class furthest over (or nearest to) its own objective, by its TTFT p95 from arrival,
    as the gate's classes table shows them: the column said the worst class's p95 from dispatch
    against [budget]'s SLO, `117/2,000` in green while clients waited 1.9 s and interactive's
    objective was 1.5 s (a trial, of the gate's own console; the fleet's said the same). With no
    class measured, the SLO and no figure."""
    judged = [
        (c.p95_ttft_arrival_ms / c.ttft_objective_ms, c) for c in snap.classes if c.p95_ttft_arrival_ms is not None and c.ttft_objective_ms
    ]
    if not judged:
        return {"p95_ttft_ms": None, "slo_ttft_ms": snap.controller.slo_ttft_ms}
    _, c = max(judged, key=lambda j: j[0])
    return {"p95_ttft_ms": c.p95_ttft_arrival_ms, "slo_ttft_ms": c.ttft_objective_ms, "ttft_class": c.name}


class FleetGate:
    """One watched gate: its read-only link (reconnected when lost) and its last snapshot."""

    def __init__(self, entry: FleetEntry, on_audit: Callable[[str, AuditRecord], None] | None = None) -> None:
        self.entry = entry
        self.link: GateLink | None = None
        self.snap: GateSnapshot | None = None
        self.error: str | None = None
        self._on_audit = on_audit
        self._next_try = 0.0
        self.polls = 0  # snapshots read since the console started

    @property
    def name(self) -> str:
        return self.entry.name

    @property
    def row(self) -> FleetRow:
        return fleet_row(self.name, self.snap, self.error)

    async def poll(self, now: float) -> None:
        if self.link is None:
            if now < self._next_try:
                return
            try:
                async with asyncio.timeout(SNAPSHOT_TIMEOUT_S):
                    self.link = await SocketLink.connect(self.entry.socket, read_only=True)
            except (LinkLost, OSError, TimeoutError) as exc:
                self._failed(now, str(exc) or type(exc).__name__)
                return
            if self._on_audit is not None:
                on_audit, name = self._on_audit, self.name
                self.link.subscribe(lambda record: on_audit(name, record))
        try:
            async with asyncio.timeout(SNAPSHOT_TIMEOUT_S):
                self.snap = await self.link.snapshot()
        except TimeoutError:
            self.error = f"no snapshot within {SNAPSHOT_TIMEOUT_S:g} s"
            return
        except Exception as exc:  # noqa: BLE001 - LinkLost, or a snapshot this console cannot read
            await self._drop()
            self._failed(now, str(exc) or type(exc).__name__)
            return
        self.error = None
        self.polls += 1

    def _failed(self, now: float, why: str) -> None:
        self.error = why.removeprefix(f"{self.entry.socket}: ")
        self._next_try = now + RETRY_S

    async def _drop(self) -> None:
        link, self.link = self.link, None
        if link is not None:
            with contextlib.suppress(Exception):
                await link.close()

    async def close(self) -> None:
        await self._drop()


class Fleet:
    """Every watched gate; `poll()` asks them all at once."""

    def __init__(
        self,
        entries: Sequence[FleetEntry],
        *,
        on_audit: Callable[[str, AuditRecord], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not entries:
            raise ValueError("a fleet needs at least one gate")
        self.gates = [FleetGate(e, on_audit) for e in entries]
        self.clock = clock

    def __iter__(self):
        return iter(self.gates)

    def by_name(self, name: str) -> FleetGate | None:
        return next((g for g in self.gates if g.name == name), None)

    @property
    def rows(self) -> list[FleetRow]:
        return [g.row for g in self.gates]

    async def poll(self) -> list[FleetRow]:
        now = self.clock()
        await asyncio.gather(*(g.poll(now) for g in self.gates))
        return self.rows

    async def close(self) -> None:
        await asyncio.gather(*(g.close() for g in self.gates), return_exceptions=True)
