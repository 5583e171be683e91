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
        self.call_after_refresh(self._draw)  # the name goes when the line is too narrow for it

    def update_snapshot(self, snap: GateSnapshot) -> None:
        self._snap = snap
        self._draw()

    def _draw(self) -> None:
        snap = self._snap
        line = Text(no_wrap=False, overflow="fold")
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
        overrides = snap.overrides if snap is not None else ()
        named, rest = self._fitted(line.cell_len, snap, overrides)
        line.append_text(rest)
        if named:
            line = Text.assemble((" tokengate ", "bold"), line, no_wrap=False, overflow="fold")
        # the whole list where the header has no room for it: on hover (and `tokengate overrides`)
        tip = ("Runtime overrides (a restart restores them):\n" + "\n".join(overrides)) if overrides else None
        if tip != self.tooltip:
            self.tooltip = tip
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

    def _fitted(self, used: int, snap: GateSnapshot | None, overrides: tuple[str, ...]) -> tuple[bool, Text]:
        """Whether the line starts with the name "tokengate", and the rest of the line after
        `used` cells (operator, attached socket, badges, OVERRIDES, NOT KEPT), made to fit the
        width: first the overrides list is cut with an ellipsis (its count always stays), then
        the name goes, then the operator's name, then the socket's path from its left, then
        NOT KEPT's words, the list and the socket. The list folded onto a second line at 160
        columns (a trial's three overrides), and at 80 the header took a row of the panels; at
        80 an attached console showed neither the name nor the socket it watched, where the
        operator's own name had stayed (a trial)."""
        attached = self.attached if snap is not None else ""
        listed = ", ".join(o.removeprefix("budget.").removeprefix("classes.") for o in overrides)
        count = f" OVERRIDES {len(overrides)}"
        # each part's forms, widest first; a part steps to its next form while the line is too wide
        forms: dict[str, list[str]] = {
            "name": [" tokengate ", ""],
            "op": [f"  op {snap.operator}", ""] if snap is not None else [""],
            "attached": [f"  attached {attached}"] + [f"  attached …{attached[-n:]}" for n in (24, 12) if len(attached) > n] + [""]
            if attached
            else [""],
            "list": [f": {listed}", f": {_cut(listed, 24)}", "…"] if overrides else [""],
            "not_kept": [" NOT KEPT for a restart ", " NOT KEPT "] if overrides and snap is not None and snap.overrides_not_kept else [""],
        }
        # which part gives way next: the list to its first 24 characters, the name, the operator, ...
        order = ["list", "name", "op", "attached", "attached", "not_kept", "list", "attached"]
        pick = dict.fromkeys(forms, 0)
        fixed = (2 + len(" READ-ONLY ")) * self.read_only + (2 + len(" PAUSED ")) * self.paused
        fixed += (2 + len(count) + 1) if overrides else 0  # "  " before the badge, its count, its closing space

        def width() -> int:
            return used + fixed + sum(len(forms[k][i]) for k, i in pick.items())

        for part in order:
            if self.size.width <= 0 or width() <= self.size.width:
                break
            pick[part] = min(pick[part] + 1, len(forms[part]) - 1)
        shown_list = forms["list"][pick["list"]]
        if overrides and self.size.width > 0 and pick["list"] > 0:
            # cut to make room: the list takes back what the other parts left, if a few characters
            room = self.size.width - (width() - len(shown_list)) - 2
            shown_list = f": {_cut(listed, room)}" if room >= 8 else shown_list
        out = Text()
        out.append(forms["op"][pick["op"]], "cyan")
        out.append(forms["attached"][pick["attached"]], "dim")
        if self.read_only:
            out.append("  ")
            out.append(" READ-ONLY ", WARN_BADGE)
        if self.paused:
            out.append("  ")
            out.append(" PAUSED ", VIEW_PAUSED_BADGE)
        if overrides:
            # Runtime changes the config file does not hold: a restart restores them.
            out.append("  ")
            out.append(f"{count}{shown_list} ", "bold black on cyan")
        out.append(forms["not_kept"][pick["not_kept"]], ALARM_BADGE)
        return bool(forms["name"][pick["name"]]), out


def _cut(text: str, most: int) -> str:
    """`text`, or its first `most` - 1 characters and an ellipsis (at least the ellipsis)."""
    if len(text) <= most:
        return text
    return text[: max(0, most - 1)].rstrip(", ") + "…"
