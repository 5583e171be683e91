"""The header line: where the gate listens, backend states, label, operator, clock, flags.

With ``[shared]`` on it says whether tenant limits are shared through Redis
(``shared:ok``) or the failure policy applies (``shared: FAIL_OPEN``/``FAIL_CLOSED``).

A second line, a red banner, appears only when something is wrong with the
gate itself (the journal dropping rows, or the gate stopping).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from rich.text import Text
from textual.widgets import Static

from console.styles import ALARM_BADGE, BACKEND_STATE, LABEL, SHARED, VIEW_PAUSED_BADGE, WARN_BADGE
from console.widgets.status import show_text
from gate.data.snapshot import GateSnapshot


def journal_banner(snap: GateSnapshot) -> str | None:
    """The banner text when the journal is in trouble, else None."""
    j = snap.journal
    if j is None or j.ok:
        return None
    parts = [f"JOURNAL FAILING ({j.path}): {j.dropped} rows dropped, {j.pending} pending"]
    if j.last_error:
        parts.append(f"last error: {j.last_error}")
    return " | ".join(parts)


class GateHeader(Static):
    """One line of identity and health, plus a red banner line for journal trouble."""

    def __init__(self, *, clock: Callable[[], float] = time.time, read_only: bool = False, attached: str = "", **kwargs) -> None:
        super().__init__("tokengate", **kwargs)
        self._clock = clock
        self.read_only = read_only
        self.attached = attached  # the control socket, when this console attached to a running gate
        self.paused = False
        self._snap: GateSnapshot | None = None

    def set_paused(self, paused: bool) -> None:
        """Rendering paused or resumed: the flag shows even though nothing else redraws."""
        self.paused = paused
        self._draw()

    def on_resize(self) -> None:
        self._draw()  # the name goes when the line is too narrow for it

    def update_snapshot(self, snap: GateSnapshot) -> None:
        self._snap = snap
        self._draw()

    def _draw(self) -> None:
        snap = self._snap
        line = Text(no_wrap=False, overflow="fold")
        if self.size.width == 0 or self.size.width >= 100:
            line.append(" tokengate ", "bold")
        if snap is None:
            line.append(" waiting for the first snapshot", "dim")
        else:
            line.append(f" {snap.label} ", LABEL.get(snap.label, "bold reverse"))
        # While paused nothing redraws, so the clock shows when the picture was frozen.
        line.append("  " + time.strftime("%H:%M:%S", time.localtime(self._clock())), "bold")
        if snap is not None:
            line.append(f"  {snap.listen}", "bold")
            for b in snap.backends:
                line.append("  ")
                line.append(f"{b.name}:", "")
                line.append(b.state, BACKEND_STATE.get(b.state, "bold"))
            if snap.shared != "off":
                # Tenant limits shared through Redis: ok, or the failure policy applying.
                line.append("  shared:")
                line.append(snap.shared if snap.shared == "ok" else f" {snap.shared.upper()} ", SHARED.get(snap.shared, "bold"))
            line.append(f"  op {snap.operator}", "cyan")
            if self.attached:
                line.append(f"  attached {self.attached}", "dim")
        if self.read_only:
            line.append("  ")
            line.append(" READ-ONLY ", WARN_BADGE)
        if self.paused:
            line.append("  ")
            line.append(" PAUSED ", VIEW_PAUSED_BADGE)
        if snap is not None and snap.overrides:
            # Runtime changes the config file does not hold: a restart restores them.
            line.append("  ")
            shown = ", ".join(o.removeprefix("budget.").removeprefix("classes.") for o in snap.overrides)
            line.append(f" OVERRIDES {len(snap.overrides)}: {shown} ", "bold black on cyan")
            if snap.overrides_not_kept:
                # said once in a toast; the header said "OVERRIDES" as if a restart kept them
                line.append(" NOT KEPT for a restart ", ALARM_BADGE)
        if snap is not None:
            banner = journal_banner(snap)
            if banner:
                line.append("\n")
                line.append(f" {banner} ", ALARM_BADGE)
            if snap.shutting_down:
                line.append("\n")
                line.append(" GATE STOPPING: new requests are refused (503 shutting_down) ", ALARM_BADGE)
        show_text(self, line)
        self.set_class(bool(snap is not None and (journal_banner(snap) or snap.shutting_down)), "-alert")
