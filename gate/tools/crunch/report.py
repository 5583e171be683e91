"""Pure: the report and its formats: one line per cell, the human report with the
recommended budget, the tokengate.toml snippet, and the JSON form."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gate.tools.crunch.plan import ENDPOINT_PATHS, CellResult, Endpoint, Recommendation, Slo, _ms, prefill_advice


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
            "skipped ctx " + ", ".join(ctx_label(x) for x in report.skipped_ctx) + f": larger than one slot's context ({s.slot_ctx:,})"
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
    advice = prefill_advice(report.cells, report.slo)
    if advice is not None:
        out.append(
            f"note: one prompt of {advice.prompt_tokens:,} tokens took {_ms(advice.prefill_ms)} ms to prefill alone "
            f"(~{advice.rate_tok_s:,.0f} tokens/s), over half the TTFT objective, and every running stream "
            f"waits for it: start llama-server with {advice.flags()} so a long prompt is processed in steps "
            "short requests can get between (the gate's prefill_yield_tokens and max_prefill_tokens keep long "
            "prompts from starting in front of interactive ones, but cannot split one)"
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
        out.append(f"note: smaller loads breached too ({which}); a budget does not fix those (long prompts: consider max_prefill_tokens)")
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


def _advice_json(a) -> dict[str, Any] | None:
    if a is None:
        return None
    return {
        "prompt_tokens": a.prompt_tokens,
        "prefill_ms": round(a.prefill_ms, 1),
        "rate_tok_s": round(a.rate_tok_s, 1),
        "llama_server_flags": a.flags(),
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
        "prefill_advice": _advice_json(prefill_advice(report.cells, report.slo)),
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
            "breached_below": [{"concurrency": c.concurrency, "ctx": c.ctx} for c in rec.breached_below],
            "too_large_request_tokens": list(rec.too_large),
            "config": config_snippet(report, rec),
        },
    }
