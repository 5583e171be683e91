"""Small builders shared by the pure-core tests."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import count

from gate.core.admission import Admission, Capacity, TenantPolicy
from gate.core.ledger import Request


@dataclass(frozen=True)
class Cls:
    """A class policy with the fields admission reads (config.ClassConfig has the same)."""

    name: str
    priority: int
    reserved_tokens: int = 0
    limit_tokens: int | None = None
    queue_depth: int = 8
    queue_timeout_s: float = 10.0
    ttft_objective_ms: float | None = None


_ids = count()


def req(cls: str, cost: int = 100, *, tenant: str = "t", prompt: int | None = None, at: float = 0.0) -> Request:
    prompt_tokens = cost // 2 if prompt is None else prompt
    return Request(f"r{next(_ids)}", cls, tenant, prompt_tokens, cost - prompt_tokens, at)


def two_classes(
    *,
    budget: int = 1000,
    slots: int = 4,
    slot_context: int = 1000,
    interactive: dict | None = None,
    batch: dict | None = None,
    tenants: dict[str, TenantPolicy] | None = None,
    max_prefill_tokens: int | None = None,
) -> Admission:
    classes = [
        Cls("interactive", 10, **(interactive or {})),
        Cls("batch", 1, **(batch or {})),
    ]
    policies = tenants or {}
    return Admission(
        classes,
        Capacity(slots=slots, slot_context=slot_context, ceiling=budget, max_prefill_tokens=max_prefill_tokens),
        tenant_policy=lambda t: policies.get(t, TenantPolicy()),
    )


def state_of(adm: Admission) -> tuple:
    """Everything a decision could change, for before/after comparisons."""
    return (
        adm.budget,
        adm.ledger.in_flight,
        adm.ledger.prefilling,
        dict(adm.ledger.by_class),
        dict(adm.ledger.by_tenant),
        sorted(r.request.id for r in adm.ledger),
        {c: sorted(w.request.id for w in adm.queue(c)) for c in adm.class_names},
    )
