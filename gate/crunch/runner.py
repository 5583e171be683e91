"""``tokengate crunch``: measure a llama-server before choosing a token budget.

Run it against llama-server itself, never through the gate. It sweeps a grid of cells,
concurrency (1, 2, 4, ... up to twice the server's slots) x context length (512, 1K, 2K, 4K
that fit the per-slot context), and in each cell keeps ``concurrency`` streaming requests in
flight: a prompt of about ctx/2 tokens (plain words, measured with ``/tokenize``) and
``max_tokens`` = min(ctx/4, --max-tokens) with ``ignore_eos`` so every request generates exactly
that many tokens. Per request it measures the time to the first SSE data chunk (TTFT) and the
time per output token after it ((last - first) / (tokens - 1)); per cell it reports the p95 of
both (nearest rank, the same percentile the adaptive controller uses) and the tokens the cell
holds in flight: concurrency x (prompt + max_tokens), the quantity the gate budgets. Above the
slot count the extra requests only wait in llama-server's queue, holding no KV cache (and the
gate never lets llama-server queue), so the recommendation counts at most ``slots`` of them.

A cell breaches when its p95 TTFT or p95 time per token is over the objective, or when any of
its requests failed (an HTTP error, a 500 "Context size has been exceeded", an error event in
the stream, a timeout). The recommended budget is 75% of the largest in-flight count among the
cells that did not breach (in flight counted as above), printed as a config snippet.

The module has a pure part (percentile, grid, breach marking, recommendation, formatting, JSON)
and an async runner (:func:`run_crunch`) built on httpx.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import sys
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TextIO

import httpx

from gate.adaptive import percentile_nearest_rank

__all__ = [
    "DEFAULT_CTX",
    "DEFAULT_MAX_TOKENS",
    "RECOMMEND_FRACTION",
    "Cell",
    "CellResult",
    "CrunchError",
    "CrunchReport",
    "CrunchSettings",
    "CrunchUnreachable",
    "CrunchUsageError",
    "Progress",
    "Recommendation",
    "RequestResult",
    "ServerInfo",
    "Slo",
    "build_grid",
    "cell_line",
    "concurrency_levels",
    "config_snippet",
    "ctx_label",
    "ctx_levels",
    "evaluate_cell",
    "format_report",
    "max_tokens_for",
    "normalize_url",
    "parse_ctx_list",
    "parse_int_list",
    "percentile",
    "prompt_target",
    "recommend",
    "report_to_json",
    "requests_for",
    "run_crunch",
    "word_sequence",
]

DEFAULT_CTX: tuple[int, ...] = (512, 1024, 2048, 4096)
DEFAULT_MAX_TOKENS = 128
DEFAULT_SLO_TTFT_MS = 2000.0
RECOMMEND_FRACTION = 0.75

Endpoint = Literal["chat", "completion"]
ENDPOINT_PATHS: dict[str, str] = {"chat": "/v1/chat/completions", "completion": "/completion"}


class CrunchError(Exception):
    """A runtime failure (exit 1)."""

    exit_code = 1


class CrunchUnreachable(CrunchError):
    """The server could not be reached (exit 1)."""


class CrunchUsageError(CrunchError):
    """The arguments do not fit the server, e.g. no --ctx value fits its slots (exit 2)."""

    exit_code = 2


# ------------------------------------------------------------------------------------------
# Pure: numbers, grid, breach, recommendation


def percentile(values: Iterable[float], pct: int = 95) -> float | None:
    """Nearest-rank percentile (as the adaptive controller computes it); None for no values."""
    vals = list(values)
    if not vals:
        return None
    return percentile_nearest_rank(vals, pct)


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


def breach_reasons(
    *,
    requests: int,
    failed: int,
    ttft_p95_ms: float | None,
    tpot_p95_ms: float | None,
    slo: Slo,
) -> tuple[str, ...]:
    """Why a cell breaches (empty: it met the objective)."""
    reasons = []
    if failed:
        reasons.append(f"{failed} of {requests} requests failed")
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
            requests=len(results), failed=len(failed), ttft_p95_ms=ttft95, tpot_p95_ms=tpot95, slo=slo
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


def recommend(cells: Sequence[CellResult], fraction: float = RECOMMEND_FRACTION) -> Recommendation | None:
    """``fraction`` of the largest in-flight count among the cells that met the objective.

    The count is :attr:`CellResult.held_tokens`: concurrency x (prompt + max_tokens) while the
    concurrency is within the server's slots; above them, the extra requests wait in
    llama-server's queue and hold no KV, so only ``slots`` of them count (a budget measured from
    queued requests could exceed what the server ever held). None when every cell breached. ``min_tokens`` (the floor for the adaptive controller) is a
    quarter of the budget, raised to the largest single request measured so that one request
    of any measured size always fits, and never above the budget.
    """
    passing = [c for c in cells if not c.breach]
    if not passing:
        return None
    best = max(passing, key=lambda c: c.held_tokens)  # first of equals: the sweep's order
    budget = math.floor(best.held_tokens * fraction)
    if budget < 1:
        return None
    largest_request = max(c.request_tokens for c in cells)
    min_tokens = min(budget, max(budget // 4, largest_request))
    # Breaches at no more tokens than the pick, where every request had a slot: a budget cannot
    # fix those. Cells above the slot count breach by waiting in llama-server's queue, which
    # the gate replaces with its own (queue time is not upstream TTFT): not listed.
    below = tuple(
        c for c in cells if c.breach and c.held_tokens <= best.held_tokens and c.held_tokens == c.in_flight_tokens
    )
    too_large = tuple(sorted({c.request_tokens for c in cells if c.request_tokens > budget}))
    return Recommendation(
        token_budget=budget,
        min_tokens=min_tokens,
        fraction=fraction,
        from_cell=best,
        breached_below=below,
        too_large=too_large,
    )


# ------------------------------------------------------------------------------------------
# Pure: the report and its formats


@dataclass(frozen=True, slots=True)
class ServerInfo:
    url: str
    total_slots: int
    slot_ctx: int
    model: str | None = None
    build: str | None = None


@dataclass(frozen=True, slots=True)
class CrunchReport:
    server: ServerInfo
    endpoint: Endpoint
    slo: Slo
    max_tokens_cap: int
    cells: tuple[CellResult, ...]
    recommendation: Recommendation | None
    measured_at: str = ""  # ISO-8601 UTC, for the snippet's comment
    skipped_ctx: tuple[int, ...] = ()  # --ctx values larger than one slot's context


def ctx_label(ctx: int) -> str:
    """512 -> "512", 1024 -> "1K", 1536 -> "1.5K", 32768 -> "32K"."""
    if ctx >= 1024 and ctx % 512 == 0:
        k = ctx / 1024
        return f"{k:g}K"
    return str(ctx)


def _ms(x: float) -> str:
    """Milliseconds for people: 2,150 / 180 / 12 / 7.5."""
    if x >= 10:
        return f"{x:,.0f}"
    return f"{x:.1f}"


def cell_line(c: CellResult) -> str:
    """``Concurrency: 4 | ctx: 4K | TTFT p95: 950 ms | latency p95: 180 ms/token | in-flight: 10,240 tokens``."""
    ttft = "-" if c.ttft_p95_ms is None else f"{_ms(c.ttft_p95_ms)} ms"
    tpot = "-" if c.tpot_p95_ms is None else f"{_ms(c.tpot_p95_ms)} ms/token"
    line = (
        f"Concurrency: {c.concurrency} | ctx: {ctx_label(c.ctx)} | TTFT p95: {ttft} | "
        f"latency p95: {tpot} | in-flight: {c.in_flight_tokens:,} tokens"
    )
    if c.held_tokens != c.in_flight_tokens:
        line += f" ({c.slots} slots hold {c.held_tokens:,})"
    if c.breach:
        line += f"  BREACH ({'; '.join(c.breach_reasons)})"
    return line


def _error_line(c: CellResult) -> str:
    parts = [f"{msg} (x{n})" if n > 1 else msg for msg, n in c.errors]
    return f"    failed {c.failed}/{c.requests}: " + "; ".join(parts)


def config_snippet(report: CrunchReport, rec: Recommendation) -> str:
    """The ``[budget]`` and ``[[backends]]`` tables to paste into tokengate.toml."""
    best = rec.from_cell
    lines = [
        "[budget]",
        'mode = "adaptive"',
        "# The controller may close the budget down to here; one request of the largest size",
        "# measured still fits. Keep the classes' reserved_tokens within it.",
        f"min_tokens = {rec.min_tokens}",
    ]
    if report.slo.ttft_ms is not None:
        lines.append(f"slo_ttft_p95_ms = {_toml_float(report.slo.ttft_ms)}")
    if report.slo.tpot_ms is not None:
        lines.append(f"slo_tpot_p95_ms = {_toml_float(report.slo.tpot_ms)}")
    lines += [
        "",
        "[[backends]]",
        'name = "default"',
        f'url = "{report.server.url}"',
        '# kv = "unified" or "split": how this llama-server shares its KV cache (not visible over HTTP).',
        f"# Measured by `tokengate crunch`{' on ' + report.measured_at if report.measured_at else ''} against"
        f" {report.server.total_slots} slots x {report.server.slot_ctx:,} tokens ({ENDPOINT_PATHS[report.endpoint]}):",
        f"# {round(rec.fraction * 100)}% of {best.held_tokens:,} tokens in flight ({_running(best)} x"
        f" ({best.prompt_tokens:,} prompt + {best.max_tokens:,} max_tokens) at concurrency {best.concurrency},"
        f" ctx {ctx_label(best.ctx)}),",
        f"# the largest load with {report.slo.describe()} and no failed request.",
        f"token_budget = {rec.token_budget}",
    ]
    return "\n".join(lines) + "\n"


def _running(c: CellResult) -> int:
    return c.held_tokens // c.request_tokens if c.request_tokens else c.concurrency


def _toml_float(x: float) -> str:
    text = repr(float(x))
    return text if ("." in text or "e" in text or "inf" in text or "nan" in text) else text + ".0"


def format_report(report: CrunchReport) -> str:
    """The human report: header, one line per cell, the recommendation and the snippet."""
    s = report.server
    head = f"tokengate crunch: {s.url}: {s.total_slots} slots x {s.slot_ctx:,} tokens per slot"
    if s.model:
        head += f", model {s.model}"
    out = [
        head,
        f"{ENDPOINT_PATHS[report.endpoint]} streaming, prompt ~ctx/2 tokens, max_tokens = "
        f"min(ctx/4, {report.max_tokens_cap}), ignore_eos; objective: {report.slo.describe()}",
    ]
    if report.skipped_ctx:
        out.append(
            "skipped ctx " + ", ".join(ctx_label(x) for x in report.skipped_ctx)
            + f": larger than one slot's context ({s.slot_ctx:,})"
        )
    out.append("")
    for c in report.cells:
        out.append(cell_line(c))
        if c.failed:
            out.append(_error_line(c))
    if any(c.held_tokens != c.in_flight_tokens for c in report.cells):
        out.append(
            f"(above {s.total_slots} concurrent requests the rest wait in llama-server's queue: "
            "their TTFT includes that wait, their tokens are not held)"
        )
    out.append("")
    rec = report.recommendation
    if rec is None:
        out.append(
            "No cell met the objective, so no budget is recommended: relax the objective, "
            "shorten --ctx or --max-tokens, or give the server more capacity."
        )
        return "\n".join(out) + "\n"
    best = rec.from_cell
    out.append(
        f"Recommended token budget: {rec.token_budget:,} tokens ({round(rec.fraction * 100)}% of "
        f"{best.held_tokens:,} in flight at concurrency {best.concurrency}, ctx {ctx_label(best.ctx)}, "
        "the largest load that met the objective)"
    )
    if rec.breached_below:
        which = ", ".join(f"concurrency {c.concurrency} ctx {ctx_label(c.ctx)}" for c in rec.breached_below)
        out.append(
            f"note: smaller loads breached too ({which}); a budget does not fix those "
            "(long prompts: consider max_prefill_tokens)"
        )
    if rec.too_large:
        sizes = ", ".join(f"{n:,}" for n in rec.too_large)
        out.append(
            f"note: requests of {sizes} tokens (prompt + max_tokens) were measured but exceed this "
            "budget: the gate would refuse them; lower their max_tokens or keep their context shorter"
        )
    out += ["", "Paste into tokengate.toml:", "", config_snippet(report, rec).rstrip("\n")]
    return "\n".join(out) + "\n"


def _round(x: float | None, nd: int = 1) -> float | None:
    return None if x is None else round(x, nd)


def _cell_json(c: CellResult) -> dict[str, Any]:
    return {
        "concurrency": c.concurrency,
        "ctx": c.ctx,
        "prompt_tokens": c.prompt_tokens,
        "max_tokens": c.max_tokens,
        "in_flight_tokens": c.in_flight_tokens,
        "held_tokens": c.held_tokens,
        "requests": c.requests,
        "ok": c.ok,
        "failed": c.failed,
        "ttft_p50_ms": _round(c.ttft_p50_ms),
        "ttft_p95_ms": _round(c.ttft_p95_ms),
        "tpot_p50_ms": _round(c.tpot_p50_ms, 2),
        "tpot_p95_ms": _round(c.tpot_p95_ms, 2),
        "tokens_per_s": round(c.generated_tokens / c.wall_s, 1) if c.wall_s > 0 else None,
        "breach": c.breach,
        "breach_reasons": list(c.breach_reasons),
        "errors": [{"error": msg, "count": n} for msg, n in c.errors],
    }


def report_to_json(report: CrunchReport) -> dict[str, Any]:
    """The whole table and the recommendation as plain JSON-able data."""
    rec = report.recommendation
    s = report.server
    return {
        "server": {
            "url": s.url,
            "total_slots": s.total_slots,
            "slot_ctx": s.slot_ctx,
            "model": s.model,
            "build": s.build,
        },
        "endpoint": ENDPOINT_PATHS[report.endpoint],
        "measured_at": report.measured_at or None,
        "slo": {"ttft_p95_ms": report.slo.ttft_ms, "tpot_p95_ms": report.slo.tpot_ms},
        "max_tokens_cap": report.max_tokens_cap,
        "skipped_ctx": list(report.skipped_ctx),
        "cells": [_cell_json(c) for c in report.cells],
        "recommendation": None
        if rec is None
        else {
            "token_budget": rec.token_budget,
            "min_tokens": rec.min_tokens,
            "fraction": rec.fraction,
            "in_flight_tokens": rec.from_cell.in_flight_tokens,
            "held_tokens": rec.from_cell.held_tokens,
            "concurrency": rec.from_cell.concurrency,
            "ctx": rec.from_cell.ctx,
            "breached_below": [
                {"concurrency": c.concurrency, "ctx": c.ctx} for c in rec.breached_below
            ],
            "too_large_request_tokens": list(rec.too_large),
            "config": config_snippet(report, rec),
        },
    }


# ------------------------------------------------------------------------------------------
# Pure: arguments and prompts


def parse_int_list(text: str, *, what: str = "value") -> tuple[int, ...]:
    """``"1,2,4"`` -> (1, 2, 4). Raises ValueError naming the bad item."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise ValueError(f"no {what} given")
    out = []
    for item in items:
        try:
            n = int(item)
        except ValueError:
            raise ValueError(f"not an integer {what}: {item!r}") from None
        if n < 1:
            raise ValueError(f"{what} must be >= 1: {n}")
        out.append(n)
    return tuple(sorted(set(out)))


def parse_ctx_list(text: str) -> tuple[int, ...]:
    """``"512,1k,2K,4096"`` -> (512, 1024, 2048, 4096)."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise ValueError("no context length given")
    out = []
    for item in items:
        mult = 1
        body = item
        if body[-1:] in ("k", "K"):
            mult, body = 1024, body[:-1]
        try:
            n = round(float(body) * mult) if mult != 1 else int(body)
        except ValueError:
            raise ValueError(f"not a context length: {item!r} (use e.g. 512,1k,2048)") from None
        if n < 4:
            raise ValueError(f"context length must be >= 4 tokens: {item!r}")
        out.append(n)
    return tuple(sorted(set(out)))


def normalize_url(url: str) -> str:
    """``http(s)://host[:port]`` with no path (a trailing slash is dropped); ValueError otherwise."""
    text = url.strip()
    if "://" not in text:
        text = "http://" + text
    parts = urllib.parse.urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {url!r}")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError(f"give the server's base URL without a path: {url!r}")
    try:
        parts.port  # noqa: B018 - validates the port
    except ValueError:
        raise ValueError(f"bad port in {url!r}") from None
    return f"{parts.scheme}://{parts.netloc}"


_WORDS = (
    "the quick brown fox jumps over lazy dog while river stone market table window garden "
    "morning evening paper light water mountain forest village road bridge city tower field "
    "green blue red yellow small large old young warm cold bright dark simple clear quiet loud "
    "story letter music picture number question answer reason moment season country history "
    "friend family teacher student doctor farmer worker driver painter writer reader singer "
    "walk run read write speak listen think build carry bring find keep hold open close start "
    "finish follow learn teach watch travel plant grow wait change return visit help move turn "
    "apple bread cheese coffee sugar salt honey lemon orange potato tomato onion pepper rice "
    "chair door floor wall roof lamp clock cup plate spoon knife glass bottle basket box bag "
    "cloud rain snow wind storm sun moon star sky sea lake hill valley island desert shore"
).split()


def word_sequence(n: int, seed: int = 0) -> list[str]:
    """``n`` plain words, the same for the same seed."""
    rng = random.Random(seed)
    return [rng.choice(_WORDS) for _ in range(n)]


def rotated_text(words: Sequence[str], k: int) -> str:
    """The words rotated by ``k``: the same tokens in another order, so no two prompts share a prefix."""
    if not words:
        return ""
    k %= len(words)
    return " ".join([*words[k:], *words[:k]])


# ------------------------------------------------------------------------------------------
# Progress (stderr)


class Progress:
    """A progress bar redrawn with \\r on a terminal, and one line per finished cell."""

    def __init__(self, stream: TextIO | None, total: int, *, width: int = 28) -> None:
        self.stream = stream
        self.total = max(total, 1)
        self.done = 0
        self.width = width
        self.tty = bool(stream is not None and getattr(stream, "isatty", lambda: False)())
        self._label = ""
        self._dirty = False

    def note(self, text: str) -> None:
        if self.stream is None:
            return
        self._clear()
        self.stream.write(text + "\n")
        self.stream.flush()

    def cell_started(self, label: str) -> None:
        self._label = label
        self._draw()

    def advance(self, n: int = 1) -> None:
        self.done += n
        self._draw()

    def cell_finished(self, result: CellResult) -> None:
        """Each finished cell gets a line (above the bar on a terminal)."""
        if self.stream is None:
            return
        self._clear()
        self.stream.write(f"[{self.done}/{self.total}] {cell_line(result)}\n")
        self.stream.flush()
        self._draw()

    def close(self) -> None:
        self._clear()

    def _draw(self) -> None:
        if self.stream is None or not self.tty:
            return
        filled = int(self.width * min(self.done, self.total) / self.total)
        bar = "#" * filled + "-" * (self.width - filled)
        self.stream.write(f"\rcrunch [{bar}] {self.done}/{self.total} requests  {self._label}\x1b[K")
        self.stream.flush()
        self._dirty = True

    def _clear(self) -> None:
        if self.stream is not None and self.tty and self._dirty:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self._dirty = False


# ------------------------------------------------------------------------------------------
# The runner (async, httpx)


@dataclass(frozen=True, slots=True)
class CrunchSettings:
    url: str = "http://127.0.0.1:8080"
    ctx: tuple[int, ...] | None = None
    concurrency: tuple[int, ...] | None = None
    requests: int | None = None
    max_tokens: int = DEFAULT_MAX_TOKENS
    endpoint: Endpoint = "chat"
    slo: Slo = field(default_factory=Slo)
    timeout_s: float = 300.0
    api_key: str | None = None


def _error_text(status: int, body: bytes) -> str:
    message = ""
    try:
        data = json.loads(body)
        err = data.get("error") if isinstance(data, dict) else None
        if isinstance(err, dict):
            message = str(err.get("message") or "")
        elif isinstance(err, str):
            message = err
    except (ValueError, UnicodeDecodeError):
        message = body.decode(errors="replace").strip()[:200]
    return f"HTTP {status}: {message}" if message else f"HTTP {status}"


def _stream_error_text(obj: dict[str, Any]) -> str:
    err = obj.get("error")
    if isinstance(err, dict):
        code = err.get("code")
        msg = err.get("message") or "error"
        return f"stream error {code}: {msg}" if code else f"stream error: {msg}"
    return f"stream error: {err}"


class _Runner:
    def __init__(self, settings: CrunchSettings, client: httpx.AsyncClient, clock: Callable[[], float]) -> None:
        self.s = settings
        self.client = client
        self.clock = clock
        self.path = ENDPOINT_PATHS[settings.endpoint]
        self.slots: int | None = None  # from /props

    # --- server facts -------------------------------------------------------------------

    async def props(self) -> ServerInfo:
        url = self.s.url
        try:
            resp = await self.client.get("/props", timeout=10.0)
        except httpx.TransportError as e:
            raise CrunchUnreachable(f"cannot reach llama-server at {url}: {_transport_text(e)}") from e
        if any(h.lower().startswith("x-tokengate") for h in resp.headers):
            raise CrunchUsageError(
                f"{url} is a tokengate gate: point crunch at llama-server itself, not through the gate"
            )
        if resp.status_code == 503:
            raise CrunchError(f"{url}/props answered 503 (model still loading?): try again when /health is 200")
        if resp.status_code != 200:
            raise CrunchError(f"{url}/props answered HTTP {resp.status_code}: is this llama-server?")
        try:
            data = resp.json()
            slots = int(data["total_slots"])
            slot_ctx = int(data["default_generation_settings"]["n_ctx"])
        except (ValueError, KeyError, TypeError):
            raise CrunchError(
                f"{url}/props lacks total_slots or default_generation_settings.n_ctx: is this llama-server?"
            ) from None
        if slots < 1 or slot_ctx < 1:
            raise CrunchError(f"{url}/props reports {slots} slots of {slot_ctx} tokens")
        model = data.get("model_path")
        if isinstance(model, str) and model:
            model = model.replace("\\", "/").rsplit("/", 1)[-1]
        else:
            model = None
        build = data.get("build_info") if isinstance(data.get("build_info"), str) else None
        return ServerInfo(url=url, total_slots=slots, slot_ctx=slot_ctx, model=model, build=build)

    # --- prompts -------------------------------------------------------------------------

    async def _post_json(self, path: str, body: dict[str, Any]) -> httpx.Response:
        try:
            return await self.client.post(path, json=body, timeout=30.0)
        except httpx.TransportError as e:
            raise CrunchUnreachable(f"cannot reach llama-server at {self.s.url}: {_transport_text(e)}") from e

    async def count_tokens(self, text: str) -> int:
        """Prompt tokens the server will see for ``text`` (chat: after its template)."""
        content = text
        if self.s.endpoint == "chat":
            resp = await self._post_json("/apply-template", {"messages": [{"role": "user", "content": text}]})
            if resp.status_code == 200:
                content = resp.json().get("prompt", text)
        resp = await self._post_json("/tokenize", {"content": content, "add_special": True})
        if resp.status_code != 200:
            raise CrunchError(f"{self.s.url}/tokenize answered {_error_text(resp.status_code, resp.content)}")
        return len(resp.json()["tokens"])

    async def fit_prompt(self, target: int) -> tuple[list[str], int]:
        """The most words whose prompt is at most ``target`` tokens (binary search on /tokenize)."""
        words = word_sequence(target + 1)
        lo, lo_tokens = 1, await self.count_tokens(" ".join(words[:1]))
        if lo_tokens >= target:
            return words[:1], lo_tokens
        hi = target + 1  # every word is at least one token
        while hi - lo > 1:
            mid = (lo + hi) // 2
            n = await self.count_tokens(" ".join(words[:mid]))
            if n <= target:
                lo, lo_tokens = mid, n
            else:
                hi = mid
        return words[:lo], lo_tokens

    # --- one request ---------------------------------------------------------------------

    def body(self, text: str, max_tokens: int) -> dict[str, Any]:
        common = {"stream": True, "ignore_eos": True, "cache_prompt": False}
        if self.s.endpoint == "chat":
            return {
                "messages": [{"role": "user", "content": text}],
                "max_tokens": max_tokens,
                "stream_options": {"include_usage": True},
                **common,
            }
        return {"prompt": text, "n_predict": max_tokens, **common}

    async def one(self, text: str, max_tokens: int) -> RequestResult:
        chat = self.s.endpoint == "chat"
        t0 = self.clock()
        first: float | None = None
        last: float | None = None
        counted = 0
        reported_tokens: int | None = None
        reported_prompt: int | None = None
        try:
            # llama-server closes the connection after a streamed answer without saying so; a
            # pooled connection then fails the next request ("Server disconnected"): never reuse.
            async with self.client.stream(
                "POST", self.path, json=self.body(text, max_tokens), headers={"Connection": "close"}
            ) as resp:
                if "x-tokengate-class" in resp.headers:
                    raise CrunchUsageError(
                        f"{self.s.url} is a tokengate gate: point crunch at llama-server itself, not through the gate"
                    )
                if resp.status_code != 200:
                    return RequestResult(ok=False, error=_error_text(resp.status_code, await resp.aread()))
                async for line in resp.aiter_lines():
                    if not line.startswith("data:"):
                        continue  # blank separators, ": ping" comments
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    now = self.clock()
                    try:
                        obj = json.loads(data)
                    except ValueError:
                        return RequestResult(ok=False, error=f"bad stream chunk: {data[:80]!r}")
                    if not isinstance(obj, dict):
                        continue
                    if "error" in obj:
                        return RequestResult(ok=False, error=_stream_error_text(obj))
                    if first is None:
                        first = now
                    usage = obj.get("usage")
                    if isinstance(usage, dict):
                        reported_tokens = _int_or(usage.get("completion_tokens"), reported_tokens)
                        reported_prompt = _int_or(usage.get("prompt_tokens"), reported_prompt)
                    timings = obj.get("timings")
                    if isinstance(timings, dict) and reported_tokens is None:
                        reported_tokens = _int_or(timings.get("predicted_n"), None)
                    if chat:
                        choices = obj.get("choices") or []
                        if choices:
                            last = now
                            delta = choices[0].get("delta") or {}
                            if delta.get("content"):
                                counted += 1
                    else:
                        last = now
                        if obj.get("stop"):
                            reported_tokens = _int_or(obj.get("tokens_predicted"), reported_tokens)
                            reported_prompt = _int_or(obj.get("tokens_evaluated"), reported_prompt)
                        else:
                            counted += 1
        except httpx.TimeoutException:
            return RequestResult(ok=False, error=f"timed out after {self.s.timeout_s:g} s")
        except httpx.ConnectError as e:
            raise CrunchUnreachable(f"lost llama-server at {self.s.url}: {_transport_text(e)}") from e
        except httpx.TransportError as e:
            return RequestResult(ok=False, error=f"connection error: {_transport_text(e)}")
        if first is None:
            return RequestResult(ok=False, error="the stream ended without data")
        tokens = reported_tokens if reported_tokens is not None else counted
        ttft_ms = (first - t0) * 1000.0
        tpot_ms = None
        if tokens > 1 and last is not None and last > first:
            tpot_ms = (last - first) * 1000.0 / (tokens - 1)
        return RequestResult(ok=True, ttft_ms=ttft_ms, tpot_ms=tpot_ms, tokens=tokens, prompt_tokens=reported_prompt)

    # --- one cell ------------------------------------------------------------------------

    async def cell(
        self,
        cell: Cell,
        words: list[str],
        prompt_tokens: int,
        max_tokens: int,
        n_requests: int,
        first_rotation: int,
        progress: Progress,
    ) -> CellResult:
        queue = iter(range(n_requests))
        results: list[RequestResult] = []

        async def worker() -> None:
            for i in queue:  # a shared iterator: each index goes to exactly one worker
                # Each request of a context length gets its own rotation of the words, so no two
                # prompts share a prefix (the prompt cache would flatter TTFT) until they run out.
                r = await self.one(rotated_text(words, first_rotation + i), max_tokens)
                results.append(r)
                progress.advance()

        started = self.clock()
        await asyncio.gather(*(worker() for _ in range(min(cell.concurrency, n_requests))))
        wall = self.clock() - started
        return evaluate_cell(cell, prompt_tokens, max_tokens, results, self.s.slo, wall_s=wall, slots=self.slots)


def _int_or(value: Any, default: int | None) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _transport_text(e: Exception) -> str:
    text = str(e).strip()
    return text or type(e).__name__


async def run_crunch(
    settings: CrunchSettings,
    *,
    err: TextIO | None = None,
    clock: Callable[[], float] = time.perf_counter,
    transport: httpx.AsyncBaseTransport | None = None,
) -> CrunchReport:
    """Run the sweep against ``settings.url`` and return the report. Progress goes to ``err``."""
    headers = {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}
    timeout = httpx.Timeout(settings.timeout_s, connect=10.0)
    # Shorter than llama-server's own 5 s keep-alive (for /props, /tokenize; streams never pool).
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=8, keepalive_expiry=2.0)
    async with httpx.AsyncClient(
        base_url=settings.url, headers=headers, timeout=timeout, limits=limits, transport=transport
    ) as client:
        runner = _Runner(settings, client, clock)
        server = await runner.props()
        runner.slots = server.total_slots
        grid = build_grid(server.total_slots, server.slot_ctx, ctx=settings.ctx, concurrency=settings.concurrency)
        skipped = tuple(x for x in (settings.ctx or ()) if x > server.slot_ctx)
        if not grid:
            raise CrunchUsageError(
                "no --ctx value fits one slot's context of "
                f"{server.slot_ctx:,} tokens ({server.total_slots} slots): use --ctx {server.slot_ctx} or less"
            )
        plan = [(c, requests_for(c.concurrency, settings.requests)) for c in grid]
        progress = Progress(err, sum(n for _, n in plan))
        progress.note(
            f"crunch: {server.url}: {server.total_slots} slots x {server.slot_ctx:,} tokens; "
            f"{len(grid)} cells, {progress.total} requests"
        )
        prompts: dict[int, tuple[list[str], int]] = {}
        for x in sorted({c.ctx for c in grid}):
            progress.cell_started(f"sizing a ~{prompt_target(x)}-token prompt for ctx {ctx_label(x)}")
            prompts[x] = await runner.fit_prompt(prompt_target(x))
        # One short request first, so no cell pays for a cold server.
        warm_words = prompts[min(prompts)][0]
        await runner.one(rotated_text(warm_words, 0), 2)
        results = []
        rotations = dict.fromkeys(prompts, 1)  # rotation 0 was the warm-up's
        try:
            for cell, n in plan:
                words, tokens = prompts[cell.ctx]
                progress.cell_started(f"concurrency {cell.concurrency}, ctx {ctx_label(cell.ctx)}")
                result = await runner.cell(
                    cell, words, tokens, max_tokens_for(cell.ctx, settings.max_tokens), n, rotations[cell.ctx], progress
                )
                rotations[cell.ctx] += n
                results.append(result)
                progress.cell_finished(result)
        finally:
            progress.close()
    return CrunchReport(
        server=server,
        endpoint=settings.endpoint,
        slo=settings.slo,
        max_tokens_cap=settings.max_tokens,
        cells=tuple(results),
        recommendation=recommend(results),
        measured_at=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        skipped_ctx=skipped,
    )


def write_json(report: CrunchReport, out: TextIO = sys.stdout) -> None:
    json.dump(report_to_json(report), out, indent=2)
    out.write("\n")
