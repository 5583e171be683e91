"""Pure: numbers, grid, breach, recommendation.

What a sweep measures (the endpoint, the cells of concurrency x context, each cell's prompt
size, max_tokens and request count) and how it is judged: nearest-rank percentiles, a
cell's breach reasons against the :class:`Slo`, and the :class:`Recommendation`. No I/O.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from gate.core.adaptive import percentile_nearest_rank

DEFAULT_CTX: tuple[int, ...] = (512, 1024, 2048, 4096)
DEFAULT_MAX_TOKENS = 128
DEFAULT_SLO_TTFT_MS = 2000.0
RECOMMEND_FRACTION = 0.75

Endpoint = Literal["chat", "completion"]
ENDPOINT_PATHS: dict[str, str] = {"chat": "/v1/chat/completions", "completion": "/completion"}


def percentile(values: Iterable[float], pct: int = 95) -> float | None:
    """Nearest-rank percentile (as the adaptive controller computes it); None for no values."""
    vals = list(values)
    if not vals:
        return None
    return percentile_nearest_rank(vals, pct)


def _ms(x: float) -> str:
    """Milliseconds for people: 2,150 / 180 / 12 / 7.5."""
    if x >= 10:
        return f"{x:,.0f}"
    return f"{x:.1f}"


@dataclass(frozen=True, slots=True)
class Slo:
    """The objective a cell must meet. None: not checked."""

    ttft_ms: float | None = DEFAULT_SLO_TTFT_MS
    tpot_ms: float | None = None

    def describe(self) -> str:
        parts = []
        if self.ttft_ms is not None:
            parts.append(f"TTFT p95 <= {_ms(self.ttft_ms)} ms")
        if self.tpot_ms is not None:
            parts.append(f"latency p95 <= {_ms(self.tpot_ms)} ms/token")
        return " and ".join(parts) if parts else "none (only failures breach)"


@dataclass(frozen=True, slots=True, order=True)
class Cell:
    """One point of the sweep: ``concurrency`` requests in flight, prompts sized for ``ctx``."""

    ctx: int
    concurrency: int


def concurrency_levels(slots: int, factor: int = 2) -> list[int]:
    """1, 2, 4, ... below ``factor`` x slots, plus ``slots`` and ``factor`` x slots themselves."""
    if slots < 1:
        raise ValueError(f"slots must be >= 1, got {slots}")
    top = slots * factor
    levels = {top, slots}
    c = 1
    while c < top:
        levels.add(c)
        c *= 2
    return sorted(levels)


def ctx_levels(slot_ctx: int, candidates: Sequence[int] | None = None) -> list[int]:
    """The candidate context lengths that fit one slot's context, ascending, without repeats.

    With the default candidates and a slot smaller than all of them, the slot's own context is
    the only level (a tiny test server still gets one column). Explicit candidates are filtered
    only: none fitting gives an empty list, which the caller reports.
    """
    if slot_ctx < 1:
        raise ValueError(f"slot_ctx must be >= 1, got {slot_ctx}")
    chosen = DEFAULT_CTX if candidates is None else tuple(candidates)
    fit = sorted({c for c in chosen if 0 < c <= slot_ctx})
    if not fit and candidates is None:
        fit = [slot_ctx]
    return fit


def build_grid(
    slots: int,
    slot_ctx: int,
    *,
    ctx: Sequence[int] | None = None,
    concurrency: Sequence[int] | None = None,
) -> list[Cell]:
    """Every (ctx, concurrency) cell, ctx ascending then concurrency ascending.

    ``concurrency`` given explicitly is used as is (deduplicated, sorted); otherwise it is
    :func:`concurrency_levels` of ``slots``.
    """
    ctxs = ctx_levels(slot_ctx, ctx)
    concs = sorted(set(concurrency)) if concurrency else concurrency_levels(slots)
    return [Cell(ctx=x, concurrency=c) for x in ctxs for c in concs]


def prompt_target(ctx: int) -> int:
    """Prompt size aimed at for a cell: half its context."""
    return max(1, ctx // 2)


def max_tokens_for(ctx: int, cap: int = DEFAULT_MAX_TOKENS) -> int:
    """Tokens each request generates: a quarter of the context, at most ``cap``."""
    return max(1, min(ctx // 4, cap))


def requests_for(concurrency: int, requested: int | None = None) -> int:
    """Requests run in a cell: ``requested`` (at least one full round) or max(2 x concurrency, 4)."""
    if requested is None:
        return max(concurrency * 2, 4)
    return max(requested, concurrency)


@dataclass(frozen=True, slots=True)
class RequestResult:
    """One measured request. ``ok`` False carries ``error``."""

    ok: bool
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    tokens: int = 0
    prompt_tokens: int | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class CellResult:
    cell: Cell
    prompt_tokens: int
    max_tokens: int
    requests: int
    ok: int
    failed: int
    ttft_p50_ms: float | None
    ttft_p95_ms: float | None
    tpot_p50_ms: float | None
    tpot_p95_ms: float | None
    errors: tuple[tuple[str, int], ...]
    breach_reasons: tuple[str, ...]
    wall_s: float = 0.0
    generated_tokens: int = 0
    slots: int | None = None  # the server's slots; None: unknown (no cap on held_tokens)

    @property
    def concurrency(self) -> int:
        return self.cell.concurrency

    @property
    def ctx(self) -> int:
        return self.cell.ctx

    @property
    def request_tokens(self) -> int:
        """What one request costs the gate: prompt + max_tokens."""
        return self.prompt_tokens + self.max_tokens

    @property
    def in_flight_tokens(self) -> int:
        """The tokens the cell's clients have outstanding: concurrency x (prompt + max_tokens)."""
        return self.concurrency * self.request_tokens

    @property
    def held_tokens(self) -> int:
        """The tokens the server holds in its KV cache at once: only ``slots`` requests run, the
        rest wait in llama-server's queue holding nothing. The gate never lets llama-server
        queue (it dispatches only to a free slot), so this is what a budget is compared with."""
        running = self.concurrency if self.slots is None else min(self.concurrency, self.slots)
        return running * self.request_tokens

    @property
    def breach(self) -> bool:
        return bool(self.breach_reasons)


def is_overflow(error: str | None) -> bool:
    """Is this llama-server's answer to a KV cache that cannot hold the request (HTTP 500
    "Context size has been exceeded", or the `exceed_context_size_error` type)? On a unified
    pool, concurrent requests that each fit one slot overfill the pool they share."""
    text = (error or "").lower()
    return "context size has been exceeded" in text or "exceed_context_size" in text or "context shift is disabled" in text


def breach_reasons(
    *,
    requests: int,
    failed: int,
    ttft_p95_ms: float | None,
    tpot_p95_ms: float | None,
    slo: Slo,
    overflowed: int = 0,
) -> tuple[str, ...]:
    """Why a cell breaches (empty: it met the objective). ``overflowed``: of ``failed``, those
    llama-server refused because its KV cache was full (named as such: more in flight than the
    server holds is itself the reason for a budget, not a generic error)."""
    reasons = []
    if overflowed:
        reasons.append(f"{overflowed} of {requests} requests overfilled the KV cache (llama-server: context size exceeded)")
    if failed - overflowed:
        reasons.append(f"{failed - overflowed} of {requests} requests failed")
    if slo.ttft_ms is not None and ttft_p95_ms is not None and ttft_p95_ms > slo.ttft_ms:
        reasons.append(f"TTFT p95 > {_ms(slo.ttft_ms)} ms")
    if slo.tpot_ms is not None and tpot_p95_ms is not None and tpot_p95_ms > slo.tpot_ms:
        reasons.append(f"latency p95 > {_ms(slo.tpot_ms)} ms/token")
    if requests and not failed and ttft_p95_ms is None:
        reasons.append("no request was measured")
    return tuple(reasons)


def evaluate_cell(
    cell: Cell,
    prompt_tokens: int,
    max_tokens: int,
    results: Sequence[RequestResult],
    slo: Slo,
    *,
    wall_s: float = 0.0,
    slots: int | None = None,
) -> CellResult:
    """Summarise a cell's requests: p50/p95 TTFT and time per token, failures, breach."""
    ok = [r for r in results if r.ok]
    failed = [r for r in results if not r.ok]
    ttfts = [r.ttft_ms for r in ok if r.ttft_ms is not None]
    tpots = [r.tpot_ms for r in ok if r.tpot_ms is not None]
    ttft95 = percentile(ttfts, 95)
    tpot95 = percentile(tpots, 95)
    # The prompt measured with /tokenize; the server's own count when it reported a larger one.
    observed = [r.prompt_tokens for r in ok if r.prompt_tokens]
    prompt = max([prompt_tokens, *observed])
    errors = Counter(r.error or "unknown error" for r in failed)
    return CellResult(
        cell=cell,
        prompt_tokens=prompt,
        max_tokens=max_tokens,
        requests=len(results),
        ok=len(ok),
        failed=len(failed),
        ttft_p50_ms=percentile(ttfts, 50),
        ttft_p95_ms=ttft95,
        tpot_p50_ms=percentile(tpots, 50),
        tpot_p95_ms=tpot95,
        errors=tuple(sorted(errors.items(), key=lambda kv: (-kv[1], kv[0]))),
        breach_reasons=breach_reasons(
            requests=len(results),
            failed=len(failed),
            ttft_p95_ms=ttft95,
            tpot_p95_ms=tpot95,
            slo=slo,
            overflowed=sum(1 for r in failed if is_overflow(r.error)),
        ),
        wall_s=wall_s,
        generated_tokens=sum(r.tokens for r in ok),
        slots=slots,
    )


@dataclass(frozen=True, slots=True)
class Recommendation:
    token_budget: int
    min_tokens: int
    fraction: float
    from_cell: CellResult
    # Cells with no more in flight than ``from_cell``, all of it running, that still breached.
    breached_below: tuple[CellResult, ...] = ()
    # Measured request sizes (prompt + max_tokens) larger than the budget: those never fit.
    too_large: tuple[int, ...] = ()
    # What the latency objective alone gave: ``fraction`` of the pick's tokens in flight, at
    # least one measured request. 0: not computed (a Recommendation built by hand).
    latency_tokens: int = 0
    # One slot's context, the floor of ``token_budget`` (None: not known to ``recommend``).
    slot_ctx: int | None = None
    # Why ``token_budget`` was raised further for a config's class reservations ("" if not).
    raised_for_classes: str = ""

    @property
    def raised_to_slot(self) -> bool:
        """The budget is one slot's context because the latency figure was below it."""
        return self.slot_ctx is not None and self.latency_tokens < self.slot_ctx <= self.token_budget


def recommend(
    cells: Sequence[CellResult],
    fraction: float = RECOMMEND_FRACTION,
    *,
    slot_ctx: int | None = None,
) -> Recommendation | None:
    """``fraction`` of the largest in-flight count among the cells that met the objective,
    never below the largest single request measured (prompt + max_tokens), and never below
    ``slot_ctx``, one slot's context, where it is given.

    The count is :attr:`CellResult.held_tokens`: concurrency x (prompt + max_tokens) while the
    concurrency is within the server's slots; above them, the extra requests wait in
    llama-server's queue and hold no KV, so only ``slots`` of them count (a budget measured from
    queued requests could exceed what the server ever held). None when every cell breached.

    token_budget is the gate's ceiling, and the gate refuses at once (400) a request larger
    than its class can reach of the ceiling: a budget below one slot's context refuses requests
    llama-server serves (a user's trial: 272 on 4 slots of 512; 432 on a unified 2,048). So the
    budget is at least ``slot_ctx`` (split: the per-slot context; unified: the pool, which one
    request may fill), and a lower latency figure becomes ``min_tokens``, the adaptive
    controller's floor: the gate holds the load down to it while latency is over the objective
    and a larger request still starts by its turn. Otherwise ``min_tokens`` is a quarter of the
    budget, raised to the largest single request measured, and never above the budget.
    """
    passing = [c for c in cells if not c.breach]
    if not passing:
        return None
    best = max(passing, key=lambda c: c.held_tokens)  # first of equals: the sweep's order
    largest_request = max(c.request_tokens for c in cells)
    # Never below the largest request measured: a budget one of its own requests cannot fit
    # in refuses it (400) once merged. The fraction is headroom, not a reason to refuse.
    latency = max(math.floor(best.held_tokens * fraction), largest_request)
    if latency < 1:
        return None
    budget = max(latency, slot_ctx or 0)
    if budget > latency:
        min_tokens = latency  # the load the objective was met at: the controller's floor
    else:
        min_tokens = min(budget, max(budget // 4, largest_request))
    # Breaches at no more tokens than the pick, where every request had a slot: a budget cannot
    # fix those. Cells above the slot count breach by waiting in llama-server's queue, which
    # the gate replaces with its own (queue time is not upstream TTFT): not listed.
    below = tuple(c for c in cells if c.breach and c.held_tokens <= best.held_tokens and c.held_tokens == c.in_flight_tokens)
    too_large = tuple(sorted({c.request_tokens for c in cells if c.request_tokens > budget}))
    return Recommendation(
        token_budget=budget,
        min_tokens=min_tokens,
        fraction=fraction,
        from_cell=best,
        breached_below=below,
        too_large=too_large,
        latency_tokens=latency,
        slot_ctx=slot_ctx,
    )


@dataclass(frozen=True, slots=True)
class PrefillAdvice:
    """llama-server's batch sizes when one long prefill would stall every stream too long.

    A prompt is processed in steps of at most ``-ub`` tokens (within ``-b``), and every running
    stream waits for each step. Measured alone (concurrency 1), the largest prompt took
    ``prefill_ms``; when that is over half the TTFT objective, one such prefill pushes every
    request that arrives meanwhile past it. Steps of ``ubatch`` tokens take about a quarter
    of the objective each, so a short request's prompt gets in between.
    """

    prompt_tokens: int
    prefill_ms: float
    rate_tok_s: float
    ubatch: int

    def flags(self) -> str:
        return f"-b {self.ubatch} -ub {self.ubatch}"


def prefill_advice(cells: Sequence[CellResult], slo: Slo) -> PrefillAdvice | None:
    """Advice from the concurrency-1 cells (their TTFT is the prefill alone), or None."""
    if slo.ttft_ms is None:
        return None
    alone = [c for c in cells if c.concurrency == 1 and c.ttft_p50_ms and c.ok]
    if not alone:
        return None
    longest = max(alone, key=lambda c: c.prompt_tokens)
    ttft_ms = longest.ttft_p50_ms
    if ttft_ms is None or ttft_ms <= slo.ttft_ms / 2:
        return None
    rate = longest.prompt_tokens / (ttft_ms / 1000.0)
    fit = max(64, int(rate * slo.ttft_ms / 4000.0))
    ubatch = 1 << (fit.bit_length() - 1)  # the largest power of two within a quarter objective
    if ubatch >= longest.prompt_tokens:
        return None  # one step already: smaller batches would not split it
    return PrefillAdvice(longest.prompt_tokens, ttft_ms, rate, ubatch)
