"""Operator actions on a router's models (load, unload, pin), validated whole before they change
anything; gate/ops/control.py audits them. A refusal is a ValueError whose message fits a toast."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from gate.core.model_plan import plan

if TYPE_CHECKING:
    from gate.fleet.router_mode import ModelFleet


def load(fleet: ModelFleet, model: str) -> str:
    """Ask for `model` to be loaded (the fleet's loop does it); returns what that will do."""
    info = fleet.info[model]
    if info.status in ("loaded", "loading"):
        raise ValueError(f"model {model!r} is already {info.status}")
    if not fleet.router_up or info.status in ("missing", "unknown"):
        raise ValueError(f"model {model!r} cannot be loaded: {fleet.units[model].detail}")
    asked = [dataclasses.replace(s, asked=True, may_load=True) if s.name == model else s for s in fleet.states()]
    p = plan(asked, fleet.max_loaded, fleet.held)
    if p.load is None and p.blocked:
        raise ValueError(f"cannot load {model!r} now: {p.blocked}")
    info.asked, info.retry_at, info.hold_off_until = True, 0.0, 0.0
    fleet.wake()
    return f"evicts {p.evict}" if p.evict and p.load == model else "loads it"


def unload(fleet: ModelFleet, model: str) -> None:
    """Unload an idle, unpinned, loaded model now (its next request loads it again)."""
    info = fleet.info[model]
    adm = fleet.units[model].admission
    assert adm is not None
    if info.status not in ("loaded", "sleeping"):
        raise ValueError(f"model {model!r} is {info.status}, not loaded")
    if model in fleet.pins:
        raise ValueError(f"model {model!r} is pinned: unpin it first")
    if len(adm.ledger) or adm.waiting():
        raise ValueError(f"model {model!r} has {len(adm.ledger)} requests in flight and {adm.waiting()} waiting")
    fleet.evict(model, "by the operator", chosen=False)


def pin(fleet: ModelFleet, model: str, pinned: bool) -> bool:
    """Pin (kept loaded, never evicted) or unpin; returns the old value."""
    old = model in fleet.pins
    (fleet.pins.add if pinned else fleet.pins.discard)(model)
    fleet.wake()
    return old
