"""Pure: the report and its formats: one line per cell, the human report with the
recommended budget, the tokengate.toml snippet, and the JSON form."""

from __future__ import annotations

import dataclasses
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
    # "unified" (one pool the slots share; ``slot_ctx`` is the pool, or each slot's cap of it),
    # "split" (each slot owns ``slot_ctx``), or None: not known (llama-server does not report it
    # over HTTP; crunch learns it from a local server's command line, as the gate does).
    kv: str | None = None
    pool: int | None = None  # unified: the pool when larger than one slot's cap (-kvu -c above the slot)

    @property
    def layout(self) -> str:
        """``4 slots sharing a 2,048-token pool`` / ``4 slots x 512 tokens per slot``."""
        if self.kv == "unified":
            return f"{self.total_slots} slots sharing a {(self.pool or self.slot_ctx):,}-token pool" + (
                f" (at most {self.slot_ctx:,} per slot)" if self.pool and self.pool > self.slot_ctx else ""
            )
        text = f"{self.total_slots} slots x {self.slot_ctx:,} tokens per slot"
        if self.kv is None and self.total_slots > 1:
            text += " (unified or split: not known; a unified pool is shared, not multiplied)"
        return text

    @property
    def capacity(self) -> int | None:
        """The most KV tokens the server holds at once; None: layout not known."""
        if self.kv == "unified":
            return self.pool or self.slot_ctx
        if self.kv == "split":
            return self.total_slots * self.slot_ctx
        return None


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


def config_snippet(report: CrunchReport, rec: Recommendation, file_min: int | None = None) -> str:
    """The ``[budget]`` and ``[[backends]]`` tables to paste into tokengate.toml. `file_min`: the
    floor the edits of the user's own file set, where its classes' reservations raised it (said
    beside this file's, which has no class reserving anything: a trial read 512 in the edits and
    272 here as a contradiction)."""
    best = rec.from_cell
    lines = [
        "[budget]",
        'mode = "adaptive"',
        "# The controller may close the budget down to here; one request of the largest size",
        "# measured still fits. Keep the classes' reserved_tokens within it.",
        *(
            [f"# (this file's classes reserve nothing; with your file's reservations it is {file_min:,}, as the edits above set)"]
            if file_min is not None and file_min != rec.min_tokens
            else []
        ),
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
        '# kv = "auto" learns how this llama-server shares its KV cache where it can (a local server);',
        '# else set "unified" or "split" (-np N without -kvu): /props does not say.',
        f"# Measured by `tokengate crunch`{' on ' + report.measured_at if report.measured_at else ''} against"
        f" {report.server.layout} ({ENDPOINT_PATHS[report.endpoint]}):",
        *(
            [
                f"# one slot's context: a smaller budget refuses (400) requests llama-server serves; the objective was met up to"
                f" {rec.latency_tokens:,} tokens in flight (min_tokens above, the adaptive controller's floor):"
            ]
            if rec.raised_to_slot
            else [f"# raised from {rec.latency_tokens:,} so that every class reaches one slot beside the others' reservations:"]
            if rec.raised_for_classes
            else ["# raised to the largest request measured; the fraction below would not hold one:"]
            if _raised(rec)
            else []
        ),
        f"# {round(rec.fraction * 100)}% of {best.held_tokens:,} tokens in flight ({_running(best)} x"
        f" ({best.prompt_tokens:,} prompt + {best.max_tokens:,} max_tokens) at concurrency {best.concurrency},"
        f" ctx {ctx_label(best.ctx)}),",
        f"# the largest load with {report.slo.describe()} and no failed request.",
        *(
            [f"# the largest request it admits: over {rec.token_budget:,} tokens is a 400 (one slot holds {report.server.slot_ctx:,})"]
            if rec.token_budget < report.server.slot_ctx
            else []
        ),
        f"token_budget = {rec.token_budget}",
    ]
    return "\n".join(lines) + "\n"


def fit_classes(report: CrunchReport, rec: Recommendation, base_text: str | None = None) -> Recommendation:
    """`rec` with its budget raised, within what the server holds, so that every class of
    `base_text` reaches one slot's context beside the others' reservations: the gate refuses
    (400) a request over what its class can reach of the budget, and holds back at most half
    the budget for reservations, so a class reaches slot_ctx once the budget is slot_ctx plus
    the others' reservations, or twice slot_ctx. Unchanged where the layout is not known or
    nothing is reserved; where the server holds less, :func:`config_plan` says which class
    falls short."""
    from gate.config import EXAMPLE_CONFIG, parse_config

    capacity = report.server.capacity
    if capacity is None:
        return rec
    base = parse_config(EXAMPLE_CONFIG if base_text is None else base_text, "<base>")
    slot = report.server.slot_ctx
    reserved = {c.name: c.reserved_tokens for c in base.classes}
    others = max((sum(n for name, n in reserved.items() if name != c) for c in reserved), default=0)
    need = min(capacity, max(rec.token_budget, min(slot + others, 2 * slot)))
    if need <= rec.token_budget:
        return rec
    why = (
        f"raised from {rec.token_budget:,} to {need:,} so that every class reaches one slot's {slot:,} tokens beside "
        f"the other classes' reserved_tokens (a request over what its class can reach of the budget is refused 400); "
        f"the server holds {capacity:,}"
    )
    too_large = tuple(n for n in rec.too_large if n > need)
    return dataclasses.replace(rec, token_budget=need, raised_for_classes=why, too_large=too_large)


def config_edits(report: CrunchReport, rec: Recommendation, base_text: str | None = None) -> list[tuple[str, Any]]:
    """The keys to change in `base_text` (default: `tokengate config example`'s file) so that it
    runs with the recommendation, checked by merging and validating. ValueError when the merged
    file still does not validate. :func:`config_plan` gives the reasons beside them."""
    return config_plan(report, rec, base_text)[0]


def config_plan(report: CrunchReport, rec: Recommendation, base_text: str | None = None) -> tuple[list[tuple[str, Any]], list[str]]:
    """The edits (see :func:`config_edits`) and one note per edit beyond the budget, the floor and
    the objective, saying why, plus what the file's classes leave unsaid (a class that cannot
    reach one slot's context). A class's reserved_tokens is never changed silently and never
    cut to 0: reservations must fit `min_tokens` (the config refuses more), so the floor is
    raised to hold them where half the budget allows (the gate's own cap on reservations);
    only beyond that are they scaled down, each kept at least 1, and the note says so."""
    from gate.config import EXAMPLE_CONFIG, parse_config
    from gate.config.edit import set_keys
    from gate.core.admission import RESERVED_SHARE_MAX, reservations_in_force

    text = EXAMPLE_CONFIG if base_text is None else base_text
    base = parse_config(text, "<base>")
    notes: list[str] = []
    min_tokens = rec.min_tokens
    reserved = {c.name: c.reserved_tokens for c in base.classes if c.reserved_tokens}
    total = sum(reserved.values())
    half = int(rec.token_budget * RESERVED_SHARE_MAX)
    scaled: dict[str, int] = {}
    if total > min_tokens:
        parts = " + ".join(f"{name} {n:,}" for name, n in sorted(reserved.items()))
        if total <= half:
            notes.append(
                f"budget.min_tokens {total:,} rather than {min_tokens:,}: the classes reserve {total:,} ({parts}) and "
                "reservations must fit the smallest budget the controller may choose; to let it close further, "
                "lower those reserved_tokens yourself"
            )
            min_tokens = total
        else:
            target = max(half, len(reserved))
            scaled = {name: max(1, n * target // total) for name, n in reserved.items()}
            while sum(scaled.values()) > target:  # the floors of 1 may pass it by a few tokens
                name = max(scaled, key=lambda k: scaled[k])
                scaled[name] -= 1
            if sum(scaled.values()) > min_tokens:
                notes.append(
                    f"budget.min_tokens {sum(scaled.values()):,} rather than {min_tokens:,}: the reservations below "
                    "must fit the smallest budget the controller may choose"
                )
                min_tokens = sum(scaled.values())
            for name in sorted(scaled):
                notes.append(
                    f"classes.{name}.reserved_tokens {reserved[name]:,} -> {scaled[name]:,}: the classes reserve {total:,} "
                    f"({parts}), more than half the budget ({half:,}), the most the gate holds back for reservations; "
                    "scaled down in proportion to it, not removed"
                )
            reserved = scaled
    edits: list[tuple[str, Any]] = [("budget.min_tokens", min_tokens)]
    if report.slo.ttft_ms is not None:
        edits.append(("budget.slo_ttft_p95_ms", float(report.slo.ttft_ms)))
    if report.slo.tpot_ms is not None:
        edits.append(("budget.slo_tpot_p95_ms", float(report.slo.tpot_ms)))
    edits.append(("backends[0].token_budget", rec.token_budget))
    edits += [(f"classes.{name}.reserved_tokens", n) for name, n in sorted(scaled.items())]
    in_force = reservations_in_force(
        [dataclasses.replace(c, reserved_tokens=reserved.get(c.name, 0)) for c in base.classes], rec.token_budget
    )
    slot = report.server.slot_ctx
    for c in base.classes:
        held = sum(n for name, n in in_force.items() if name != c.name)
        reach = rec.token_budget - held
        if c.limit_tokens is not None:
            reach = min(reach, c.limit_tokens)
        # a short prompt (64 tokens) with the class's default max_tokens must fit what it can reach
        if c.default_max_tokens + 64 > reach:
            edits.append((f"classes.{c.name}.default_max_tokens", max(1, reach - 64)))
            notes.append(
                f"classes.{c.name}.default_max_tokens {c.default_max_tokens:,} -> {max(1, reach - 64):,}: the class "
                f"reaches {reach:,} tokens of the budget, and a short prompt with its default must fit"
            )
        if reach < slot and c.max_tokens_cap + 1 > reach:
            whom = ", ".join(f"{name} {n:,}" for name, n in sorted(in_force.items()) if name != c.name and n)
            notes.append(
                f"class {c.name} reaches at most {reach:,} tokens of the budget"
                + (f" (reserved for other classes: {whom})" if whom else "")
                + f": the gate refuses (400) its requests over {reach:,} tokens, which one slot ({slot:,}) holds; "
                "lower those reservations or its max_tokens_cap if that is not what you want"
            )
    parse_config(set_keys(text, edits), "<merged>")  # raises ConfigError naming the key
    return edits, notes


def edit_command(edits: list[tuple[str, Any]], file: str = "tokengate.toml") -> str:
    from gate.config.edit import toml_value

    parts = [f"{k}={toml_value(v)}" for k, v in edits]
    quoted = [f"'{p}'" if any(ch in p for ch in '[]" ') else p for p in parts]
    return f"tokengate config set {file} " + " ".join(quoted)


def _raised(rec: Recommendation) -> bool:
    """The budget was raised to the largest measured request (the fraction gave less)."""
    import math

    # latency_tokens: the figure before the slot and the classes raised it (0: a hand-built one)
    return (rec.latency_tokens or rec.token_budget) > math.floor(rec.from_cell.held_tokens * rec.fraction)


def _running(c: CellResult) -> int:
    return c.held_tokens // c.request_tokens if c.request_tokens else c.concurrency


def _toml_float(x: float) -> str:
    text = repr(float(x))
    return text if ("." in text or "e" in text or "inf" in text or "nan" in text) else text + ".0"


def format_report(report: CrunchReport, *, config_text: str | None = None, config_file: str | None = None) -> str:
    """The human report: header, one line per cell, the recommendation as edits that merge
    into `config_file` (default: a file made by `tokengate config example`), and the snippet."""
    s = report.server
    head = f"tokengate crunch: {s.url}: {s.layout}"
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
    if rec is not None:
        try:
            rec = fit_classes(report, rec, config_text)
        except Exception:  # noqa: BLE001 - a config that does not parse: said below, where the edits fail
            pass
    if rec is None:
        out.append(
            "No cell met the objective, so no budget is recommended: relax the objective, "
            "shorten --ctx or --max-tokens, or give the server more capacity."
        )
        return "\n".join(out) + "\n"
    best = rec.from_cell
    if rec.raised_to_slot:
        out.append(
            f"Recommended token budget: {rec.token_budget:,} tokens (one slot's context"
            + (f", then {rec.raised_for_classes}" if rec.raised_for_classes else "")
            + ")"
        )
        out.append(
            f"note: the latency objective was met only up to {best.held_tokens:,} tokens in flight (concurrency "
            f"{best.concurrency}, ctx {ctx_label(best.ctx)}), which suggests a budget of {rec.latency_tokens:,} "
            + (
                f"(the largest request measured; {round(rec.fraction * 100)}% of it would not hold one); "
                if _raised(rec)
                else f"({round(rec.fraction * 100)}% of it); "
            )
            + f"a budget below one slot's {report.server.slot_ctx:,} would refuse (400) requests llama-server can serve, "
            f"so the budget is {rec.token_budget:,} and {rec.latency_tokens:,} is budget.min_tokens: the adaptive "
            "controller (budget.mode = adaptive) closes down to it while latency is over the objective; to hold "
            "latency lower for every request, lower the classes' max_tokens_cap or give the server more capacity"
        )
    elif rec.raised_for_classes:
        out.append(
            f"Recommended token budget: {rec.token_budget:,} tokens ({round(rec.fraction * 100)}% of "
            f"{best.held_tokens:,} in flight at concurrency {best.concurrency}, ctx {ctx_label(best.ctx)}, "
            f"the largest load that met the objective, gave {rec.latency_tokens:,}; raised for the classes, see below)"
        )
    elif _raised(rec):
        out.append(
            f"Recommended token budget: {rec.token_budget:,} tokens (the largest request measured: "
            f"{round(rec.fraction * 100)}% of the {best.held_tokens:,} in flight at concurrency {best.concurrency}, "
            f"ctx {ctx_label(best.ctx)}, the largest load that met the objective, would not hold one)"
        )
    else:
        out.append(
            f"Recommended token budget: {rec.token_budget:,} tokens ({round(rec.fraction * 100)}% of "
            f"{best.held_tokens:,} in flight at concurrency {best.concurrency}, ctx {ctx_label(best.ctx)}, "
            "the largest load that met the objective)"
        )
    if rec.raised_for_classes and not rec.raised_to_slot:
        out.append(f"note: token_budget {rec.raised_for_classes}")
    if rec.breached_below:
        which = ", ".join(f"concurrency {c.concurrency} ctx {ctx_label(c.ctx)}" for c in rec.breached_below)
        out.append(f"note: smaller loads breached too ({which}); a budget does not fix those (long prompts: consider max_prefill_tokens)")
    if rec.too_large:
        sizes = ", ".join(f"{n:,}" for n in rec.too_large)
        out.append(
            f"note: requests of {sizes} tokens (prompt + max_tokens) were measured but exceed this "
            "budget: the gate would refuse them; lower their max_tokens or keep their context shorter"
        )
    if rec.token_budget < report.server.slot_ctx:
        # The gate refuses at once what can never fit its ceiling (400): the budget caps one
        # request's size too, below what llama-server serves (a trial's 640-token request).
        out.append(
            f"note: this budget is also the largest request the gate admits: it refuses (400 context_length_exceeded) "
            f"every request over {rec.token_budget:,} tokens (prompt + max_tokens), which llama-server serves up to "
            f"{report.server.slot_ctx:,} in one slot; if your clients send larger ones, keep token_budget at "
            f"{report.server.slot_ctx:,} or more and let min_tokens ({rec.min_tokens:,}) and the adaptive controller hold the load"
        )
    target = config_file or "tokengate.toml"
    notes: list[str] = []
    try:
        edits, notes = config_plan(report, rec, config_text)
    except Exception as exc:  # noqa: BLE001 - a config of the user's that no edit makes valid: say so
        out += ["", f"note: the recommendation does not merge into {target}: {exc}"]
        edits = None
    out += [f"note: {n}" for n in notes]
    if edits is not None:
        made = "" if config_file else " (a file made by `tokengate config example`)"
        out += [
            "",
            f"Apply it to {target}{made}: these keys, in the tables the file already has (validated, comments kept):",
            "",
            "  " + edit_command(edits, target),
            "",
            "or by hand:",
            *(f"  {_by_hand(k)}{_toml(v)}" for k, v in edits),
        ]
    out += [
        "",
        "Or start from this complete tokengate.toml (a new file, not to paste into another):",
        "",
        config_snippet(report, rec, dict(edits).get("budget.min_tokens") if edits is not None else None).rstrip("\n"),
    ]
    return "\n".join(out) + "\n"


def _by_hand(key: str) -> str:
    """`budget.min_tokens` as a line to write by hand: "in [budget]: min_tokens = " (a dotted or
    indexed key pasted as is, `backends[0].token_budget = 216`, is not TOML: a user's trial)."""
    import re

    table, _, name = key.rpartition(".")
    indexed = re.fullmatch(r"(\w+)\[(\d+)\]", table)
    if indexed is not None:
        where = f"the [[{indexed.group(1)}]] table number {int(indexed.group(2)) + 1}"
    else:
        where = f"[{table}]"
    return f"in {where}: {name} = "


def _toml(v: Any) -> str:
    from gate.config.edit import toml_value

    return toml_value(v)


def _edits_json(report: CrunchReport, rec: Recommendation) -> tuple[dict[str, Any] | None, list[str]]:
    try:
        edits, notes = config_plan(report, rec)
    except Exception:  # noqa: BLE001
        return None, []
    return dict(edits), notes


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
    if rec is not None:
        rec = fit_classes(report, rec)
    s = report.server
    edits, notes = _edits_json(report, rec) if rec is not None else (None, [])
    return {
        "server": {
            "url": s.url,
            "total_slots": s.total_slots,
            "slot_ctx": s.slot_ctx,
            "model": s.model,
            "build": s.build,
            "kv": s.kv,
            "pool": s.pool,
            "capacity_tokens": s.capacity,
            "layout": s.layout,
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
            "latency_tokens": rec.latency_tokens or None,
            "raised_to_slot": rec.raised_to_slot,
            "raised_for_classes": rec.raised_for_classes or None,
            "config": config_snippet(report, rec),
            "edits": edits,
            "notes": notes,
        },
    }
