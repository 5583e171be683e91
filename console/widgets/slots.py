"""Capacity: the controller's budget line, then each backend's slots and context use.

Compact (80x24) mode shows one line per backend; the full mode adds a line of
per-slot context bars under each backend.
"""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from console.styles import ALARM_BADGE, BACKEND_STATE, BAR_EMPTY, NOTE_BADGE, fill_style, ttft_style
from console.widgets.status import show_text
from gate.data.snapshot import BackendView, ControllerView, GateSnapshot, SlotView


def bar(used: float, total: float, width: int) -> Text:
    """A solid bar, green/yellow/red at 70%/90% full."""
    frac = 0.0 if total <= 0 else max(0.0, min(1.0, used / total))
    filled = round(frac * width)
    out = Text()
    out.append("█" * filled, fill_style(frac, full="red"))
    out.append("░" * (width - filled), BAR_EMPTY)
    return out


def _n(value: int | None) -> str:
    return "n/a" if value is None else f"{value:,}"


def controller_line(c: ControllerView, in_flight: int, queued: int, *, compact: bool = False, unfreeze_key: str | None = None) -> Text:
    """Budget (and its bounds), in-flight tokens against it, queue, p95 TTFT vs SLO.
    `unfreeze_key`: the key that unfreezes a frozen controller here (None: none, read-only)."""
    line = Text()
    line.append("budget ", "bold")
    line.append(_n(c.budget), "bold")
    if compact:
        line.append(f"/{_n(c.ceiling)}", "dim")
    else:
        line.append(f" [{c.min_tokens:,}..{_n(c.ceiling)}]", "dim")
    line.append(f" {c.mode}")
    if c.frozen:
        line.append(" FROZEN", NOTE_BADGE)
    line.append("  in-flight ")
    if c.budget:
        line.append_text(bar(in_flight, c.budget, 6 if compact else 10))
        line.append(f" {in_flight:,} {100 * in_flight / c.budget:.0f}%")
    else:
        line.append(f"{in_flight:,}")
    line.append("  queued " if not compact else "  q ")
    line.append(str(queued), "bold yellow" if queued else "")
    # The worst class's p95 TTFT from dispatch over the last minute, against [budget]
    # slo_ttft_p95_ms: the kind of signal the adaptive controller closes on (its own input is
    # smoothed over its window, named when it differs), said so. Unnamed, a trial read
    # "117/2,000" in green as the clients' TTFT while they saw 1.9 s (their queue wait is not in
    # it); the classes table shows each class's from arrival, against its own objective.
    p95 = "n/a" if c.p95_ttft_ms_1m is None else f"{c.p95_ttft_ms_1m:,.0f}"
    if compact:  # as wide as "  p95 768/2,000 ms" was: 80 columns hold the line
        line.append("  ctl p95 ")
        line.append("n/a" if c.p95_ttft_ms_1m is None else _short_ms(c.p95_ttft_ms_1m), ttft_style(c.p95_ttft_ms_1m, c.slo_ttft_ms))
        line.append(f"/{_short_ms(c.slo_ttft_ms)}")
    else:
        line.append("  p95 TTFT from dispatch ")
        line.append(p95, ttft_style(c.p95_ttft_ms_1m, c.slo_ttft_ms))
        line.append(f"/{c.slo_ttft_ms:,.0f} ms")
    if not compact and c.mode == "adaptive":
        if c.frozen:  # "0/20 samples, not moving yet" read as if it would move once it had them
            who = f" {c.frozen_by}" if c.frozen_by else ""
            how = f"; {unfreeze_key} unfreezes" if unfreeze_key else ""
            line.append(f" (controller frozen{who}: the budget stays where it is{how})", "yellow")
        elif c.p95_ttft_ms is None:
            # too few for a p95: it closes on none of them, and reopens only while every one is
            # fast (gate/core/adaptive.py); "not moving yet" was untrue once that rule came
            line.append(f" (controller: {c.samples}/{c.min_samples} samples, no p95 yet)", "dim")
        elif c.p95_ttft_ms_1m is None or abs(c.p95_ttft_ms - c.p95_ttft_ms_1m) >= 1:
            line.append(f" (controller sees {c.p95_ttft_ms:,.0f})", "dim")
    return line


def _short_ms(ms: float) -> str:
    """A time in few characters: 768ms, 1.9s, 2s."""
    return f"{ms:.0f}ms" if ms < 1000 else f"{ms / 1000:.1f}".removesuffix(".0") + "s"


def backend_line(b: BackendView, compact: bool) -> Text:
    line = Text()
    line.append(f"{b.name} ", "bold")
    line.append(b.state, BACKEND_STATE.get(b.state, "bold"))
    if b.state != "ready" and b.detail and not compact:
        line.append(f" ({b.detail})", "dim")
    line.append("  slots ")
    if b.slots_total:
        line.append_text(bar(b.slots_busy, b.slots_total, min(b.slots_total, 8)))
        line.append(f" {b.slots_busy}/{b.slots_total}")
        if b.bypass_slots:  # llama-server is busier than the gate: someone talks to it directly
            line.append(f" +{b.bypass_slots} bypassing the gate", "bold yellow")
    else:
        line.append(f"{b.slots_busy}/?", "dim")
    if not compact:
        kv = f"  kv {b.kv}" + (f" ({b.kv_source})" if b.kv_source and b.kv_source != "config" else "")
        line.append(kv, "bold yellow" if b.kv_source == "assumed" else "dim")
        line.append(f"  budget {_n(b.budget)}/{_n(b.ceiling)}")
        if b.stretched_to is not None:  # in-flight above the budget: say why
            line.append(f" stretched to {b.stretched_to:,} (aged or min rate)", "yellow")
        line.append(f"  in-flight {b.in_flight:,}")

        line.append(f"  queued {b.queued}", "bold yellow" if b.queued else "")
    if compact and b.slots:
        used = [s.n_prompt_tokens / s.n_ctx for s in b.slots if s.processing and s.n_prompt_tokens is not None and s.n_ctx]
        if used:
            frac = max(used)
            line.append("  ctx max ")
            line.append(f"{100 * frac:.0f}%", fill_style(frac))
    if b.telemetry_stale:
        why = f": {b.telemetry_error}" if b.telemetry_error and not compact else ""
        line.append(f"  telemetry STALE{why}", "bold black on yellow")
    line.append("  deferred ")
    if b.requests_deferred is None:
        line.append("n/a" + (" (llama-server runs without --metrics)" if b.metrics_off and not compact else ""), "dim")
    else:
        line.append(str(b.requests_deferred), ALARM_BADGE if b.requests_deferred else "green")
    if not compact and b.decode_tps is not None:
        line.append(f"  decode {b.decode_tps:,.0f} tok/s" + (" (last read)" if b.telemetry_stale else ""), "dim")
    return line


def prefill_line(b: BackendView) -> Text:
    """`  prefill 1,200 now / cap 4,096 (auto: 3,300 tok/s measured)`: prompt tokens being
    processed, the most allowed at once, and where the cap comes from."""
    line = Text("  prefill ", "dim")
    line.append(f"{b.prefilling:,}", "bold" if b.prefilling else "dim")
    line.append(" now", "dim")
    if b.prefill_cap is not None:
        line.append(f" / cap {b.prefill_cap:,}", "dim")
    else:
        line.append(" / no cap", "dim")
    rate = "" if b.prefill_tok_s is None else f"{b.prefill_tok_s:,.0f} tok/s measured"
    if b.prefill_cap_auto:
        if not rate:  # until first tokens of prompts of different sizes show a prefill rate
            # ("not measured yet" read wrong once a rate had shown and the fit then failed its
            # test: the prompts' sizes no longer explained their first-token times)
            rate = "no prefill rate fits the first tokens yet"
        elif b.prefill_cap is None:
            rate += "; one decode step alone is over the TTFT objective"
        line.append(f" (auto: {rate})", "dim")
    elif rate:
        line.append(f" ({rate})", "dim")
    if b.ttft_guard:  # the TTFT objectives' early refusals are partial or off: say so
        line.append(f"  TTFT guard: {b.ttft_guard}", "yellow")
    return line


def slot_cell(s: SlotView) -> Text:
    """`s0 ████░░░░ 812/2048`: tokens in the slot's cache (prompt + generated) over its context."""
    cell = Text()
    cell.append(f"s{s.id} ", "bold" if s.processing else "dim")
    if not s.processing or s.n_prompt_tokens is None:
        cell.append_text(bar(0, 1, 8))
        cell.append(" idle", "dim")
        cell.append(" " * (len(f"{s.n_ctx}/{s.n_ctx}") - 4))
    else:
        cell.append_text(bar(s.n_prompt_tokens, s.n_ctx, 8))
        cell.append(f" {s.n_prompt_tokens}/{s.n_ctx}")
    return cell


def wrap_chunks(line: Text, width: int) -> Text:
    """Break `line` only between its chunks (the parts two spaces apart), never inside one,
    so a value keeps its unit and its label ("p95 TTFT 18/2,000 ms", "deferred n/a"); a
    chunk that does not fit on a line of its own is left to the terminal's wrap. width 0:
    as it is (not laid out yet)."""
    if width <= 0 or line.cell_len <= width:
        return line
    out = Text()
    col = 0
    for i, chunk in enumerate(line.split("  ", allow_blank=True)):
        if i and col + 2 + chunk.cell_len > width:
            out.append("\n  ")
            col = 2
        elif i:
            out.append("  ")
            col += 2
        out.append_text(chunk)
        col += chunk.cell_len
    return out


def render_capacity(snap: GateSnapshot, *, compact: bool, width: int = 0, unfreeze_key: str | None = None) -> Text:
    line = controller_line(snap.controller, snap.in_flight, snap.queued, compact=compact, unfreeze_key=unfreeze_key)
    out = wrap_chunks(line, width)
    for c in snap.classes:  # an objective no admission can meet: the classes table marks it, this says why
        if c.objective_below_ttft:
            note = f"class {c.name}: {c.objective_below_ttft}"
            out.append("\n  ! ", "bold yellow")
            out.append(note if not compact else note[: max(20, width - 4)] if width else note, "yellow")
    for b in snap.backends:
        out.append("\n")
        out.append_text(wrap_chunks(backend_line(b, compact), width))
        for w in b.warnings:  # the capacity contradicts the config: never silent
            out.append("\n  ! ", "bold yellow")
            out.append(w if not compact else w[: max(20, width - 4)] if width else w, "yellow")
        if compact:
            continue
        out.append("\n")
        out.append_text(wrap_chunks(prefill_line(b), width))
        if b.slots is None:
            out.append("\n  per-slot context: n/a (/slots not polled)", "dim")
            continue
        out.append("\n ")
        if b.telemetry_stale:
            out.append(" (last read, stale)", "bold yellow")
        for s in b.slots:
            out.append(" ")
            cell = slot_cell(s)
            if b.telemetry_stale:
                cell.stylize("dim")
            out.append_text(cell)
    return out


class SlotsPanel(Static):
    """Budget, in-flight and per-backend slots; never reaches into the gate."""

    def __init__(self, *, unfreeze_key: str | None = None, **kwargs) -> None:
        super().__init__("", **kwargs)
        self.unfreeze_key = unfreeze_key  # the screen's freeze key, named beside a frozen controller
        self.compact = False
        self._snap: GateSnapshot | None = None

    def set_compact(self, compact: bool) -> None:
        self.compact = compact
        if self._snap is not None:
            self.update_snapshot(self._snap)

    def update_snapshot(self, snap: GateSnapshot) -> None:
        self._snap = snap
        show_text(self, render_capacity(snap, compact=self.compact, width=self.content_size.width, unfreeze_key=self.unfreeze_key))

    def on_resize(self) -> None:
        if self._snap is not None:
            self.update_snapshot(self._snap)
