"""The Model Router's choices for one request: counting on a unit, the fallback chain, look-ahead.

A class (or a tenant, which then replaces its class's list) may name fallback models, tried in
order when the requested model

* is saturated: it would queue (its admission core does not take the request at once),
* is loading (router mode: not loaded yet, or waking), or
* refuses the request (queue full, wait over, budget, context, model failed or down).

In the first two cases a fallback is taken only if it admits the request at once; otherwise the
request waits for the model it asked for. When that model refuses, each fallback is tried in
turn and may queue. Operator and tenant refusals (paused, drained, rate limits, quotas) are
never rerouted: they hold for every model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from gate.backend.taskcount import count_tasks
from gate.backend.tokens import TokenCount, TokenKind, TokenSource, canonical_json, estimate_tokens, prompt_fields
from gate.core.ledger import Request
from gate.core.reasons import Reason

if TYPE_CHECKING:
    from gate.backend.pool import Backend
    from gate.http.intake import Intake
    from gate.http.ports import RequestPorts
    from gate.http.tenants import Caller

#: refusals of the requested model that a fallback may answer instead
REROUTABLE = frozenset(
    {
        Reason.QUEUE_FULL,
        Reason.QUEUE_TIMEOUT,
        Reason.TOKEN_BUDGET_EXCEEDED,
        Reason.CONTEXT_LENGTH_EXCEEDED,
        Reason.MODEL_UNAVAILABLE,
        Reason.NO_BACKEND,
    }
)


def fallback_models(gate: RequestPorts, caller: Caller) -> tuple[str, ...]:
    """The caller's tenant's fallback list, else its class's."""
    config = gate.config
    for tenant in config.tenants:
        if tenant.name == caller.tenant and tenant.fallback:
            return tenant.fallback
    for cls in config.classes:
        if cls.name == caller.cls:
            return cls.fallback
    return ()


def fallback_chain(gate: RequestPorts, caller: Caller, requested: Backend) -> list[Backend]:
    """The fallbacks as routed units/backends, without the requested one, each once."""
    chain: list[Backend] = []
    for name in fallback_models(gate, caller):
        b = gate.backends.route(name)
        if b is not None and b is not requested and b not in chain:
            chain.append(b)
    return chain


def serving(b: Backend) -> bool:
    """Takes requests now: a plain backend that is ready, or a router's model that is loaded."""
    if b.fleet is not None:
        return b.model is not None and b.fleet.loaded(b)
    return b.state == "ready" and b.gatekeeper is not None


def routed_name(b: Backend, intake: Intake) -> str | None:
    """The model name a request answered by `b` names (a plain backend's first model)."""
    return b.model or (b.config.models[0] if b.config.models else intake.model)


async def count_tokens(gate: RequestPorts, b: Backend, intake: Intake) -> TokenCount:
    """The prompt's tokens on `b`. A router's model that is not loaded cannot count: estimate
    (asking would load it behind the gate's back)."""
    kind = cast(TokenKind, intake.kind)  # one prompt counted whole: chat or completions (no plans)
    if b.fleet is not None and not serving(b):
        # An estimate (JSON bytes / 3, ~2x English text) is no ground to refuse as too long (a
        # trial's 290-token chat was refused at arrival as 514 + 16 > 512): held at most at what
        # fits the slot an earlier load told (else the provisional 2^30: no bound); the count at
        # dispatch, once the model is loaded, decides (proxy._recount).
        estimate = estimate_tokens(canonical_json(prompt_fields(kind, intake.body)))
        if b.admission is not None:
            estimate = min(estimate, max(1, b.admission.capacity.slot_context - intake.max_tokens))
        return TokenCount(estimate, "estimate", False)
    return await gate.tokens.count(b.url, kind, intake.body, b.auth_headers(), model=b.model)


@dataclass(frozen=True, slots=True)
class Measured:
    """What a request will hold on `b`: every task's prompt tokens (copies included), its tasks,
    and the most one task holds in its slot (None: a single task)."""

    count: TokenCount
    tasks: int
    slot_tokens: int | None


async def measure(gate: RequestPorts, b: Backend, intake: Intake) -> Measured:
    """Count the request on `b`, task by task when llama-server splits it (gate.data.tasks)."""
    if intake.kind == "predict":
        return await _measure_parts(gate, b, intake)
    if intake.plans is None:
        count = await count_tokens(gate, b, intake)
        per_task: tuple[int, ...] = (count.tokens,)
    else:
        ask = not (b.fleet is not None and not serving(b))
        counted = await count_tasks(gate.tokens, b.url, intake.plans, b.auth_headers(), model=b.model, ask=ask)
        count, per_task = counted.source, counted.per_task
    slots = b.admission.capacity.slots if b.admission is not None else 0
    tasks = len(per_task) * intake.copies
    if 0 < slots < tasks:
        # More tasks than slots (a RAG batch of 64 inputs on 4 slots): llama-server runs them in
        # waves as its slots free up, so the request holds every slot, for its largest tasks at
        # once. Refused as "never fits" it could never be served by this backend at all.
        # No more than `slots` copies of a prompt can be among them: the copies are never
        # listed one by one (a client's "n": 2147483648 made the gate allocate 16 GB).
        every = sorted(per_task * min(intake.copies, slots), reverse=True)[:slots]
        tasks, tokens = len(every), sum(every)
    else:
        tokens = sum(per_task) * intake.copies
    total = TokenCount(tokens, count.source, count.cached)
    return Measured(total, tasks, None if tasks == 1 else max(per_task) + intake.max_tokens)


async def _measure_parts(gate: RequestPorts, b: Backend, intake: Intake) -> Measured:
    """/predict: every admitted instance at once, each task reserved for the largest limit among
    them (`intake.max_tokens`). An envelope with nothing to admit (only /tokenize and such, or
    no instance at all) still holds one slot at no token cost: llama-server runs it."""
    parts = [await measure(gate, b, part) for part in intake.parts]
    if not parts:
        return Measured(TokenCount(0, "exact", False), 1, None)
    tasks = sum(m.tasks for m in parts)
    prompt = sum(m.count.tokens for m in parts)
    # the largest single task's prompt: a part's slot_tokens (several tasks) or its whole prompt
    largest = max((m.slot_tokens - p.max_tokens) if m.slot_tokens is not None else m.count.tokens for m, p in zip(parts, intake.parts))
    source: TokenSource = "exact" if all(m.count.source == "exact" for m in parts) else "estimate"
    return Measured(TokenCount(prompt, source, False), tasks, None if tasks == 1 else largest + intake.max_tokens)


def admission_request(request_id: str, intake: Intake, measured: Measured, now: float, came: float | None = None) -> Request:
    """The core's view of the request: all of its tasks, their prompts and generation limits;
    `came`: when it reached the gate (its TTFT objective counts from there)."""
    caller = intake.caller
    return Request(
        request_id,
        caller.cls,
        caller.tenant,
        measured.count.tokens,
        intake.max_tokens,
        now,
        tasks=measured.tasks,
        slot_tokens=measured.slot_tokens,
        came=came,
    )


async def fits_now(gate: RequestPorts, b: Backend, intake: Intake) -> bool:
    """Would `b` admit this request at once? Changes nothing."""
    if not serving(b) or b.admission is None:
        return False
    if b.fleet is not None:
        try:
            b.fleet.check(b)
        except Exception:  # noqa: BLE001 - a GateError: it would refuse
            return False
    return b.admission.fits_now(admission_request("look-ahead", intake, await measure(gate, b, intake), gate.clock()))
