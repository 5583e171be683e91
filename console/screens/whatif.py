"""`w` on the review screen: what if the window shown had run under other thresholds?

The window is the review's current range (or its ``since=``/``until=`` filter: the incident's
minutes). The form lists the thresholds the live retune edits (``t``) and a replay can change (not
``default_max_tokens``, which the replay refuses: prefilled, it invited an edit), each as a ``--set``
line ``KEY=VALUE`` holding its value in force at the window's start (``Window.config``: a retune
before the window included; the gate's start values read as proposals that were none, and made
the apply's confirmation say the gate differed from a replay that had run with the retune: a
trial); the operator edits any of them
(or adds other ``--set`` keys) and presses ctrl+r (or Replay). The replay
(:mod:`gate.tools.replay`: load the window, fit the backend model, replay it at the
recorded thresholds and under the proposal) runs in a child process (:class:`ReplayProcess`:
a replay on a thread here took the GIL from the console's loop for the whole run, and could
not be stopped), which a thread worker waits on, so the screen keeps
rendering (measured on the contended 2-core machine: 300 arrivals / 60 s load+fit 0.01 s,
replay at the recorded thresholds + 1 proposal 0.19 s; 5,000 arrivals / 300 s: 0.11 s and
10.9 s; the child keeps the replay at the recorded thresholds, so each proposal after the
first is one engine run); a newer run stops an older one. The answer is the same table as
``tokengate replay``: recorded | replayed | error | proposal per class, a figure the
calibration does not trust (error over 25%) ending in '?' and dimmed in every column.
Under the table, the notes the command prints above its own (:func:`notes_of`): what the
window does not show, what the backend model assumed, and each proposal's config-check
warnings (a trial's status line replaced the window's notes, and no warning was shown).

From the live console (``r`` then ``w``, not ``--read-only``) the proposal replayed can be
applied to the running gate: ctrl+t (or Apply) asks, then sends it as ONE Retune command
through the link (:func:`retune_of`: ``backend.token_budget`` -> the budget, set by hand and
the controller frozen there (``f`` unfreezes), ``budget.min_tokens``/``budget.slo_ttft_p95_ms``
-> settings, one class's retune keys), audited like ``t`` with a note naming the window. The
replay took the proposed ``backend.token_budget`` as the pool's ceiling (in adaptive mode its
controller moved the budget under it: a trial's curve 1500, then 1200, then 960); the apply holds
it under the gate's own ceiling, which it leaves as it is, so only a static replay on that
ceiling ran what the apply does, and the confirmation says which (:func:`budget_note`; it
advised a replay with ``budget.mode=static``, which takes the budget as the ceiling too). The
reservations in force are a share of the ceiling (R0): the confirmation warns of each class
that cannot start its default request at the budget held after the apply, beside the
reservations the gate keeps, and says where the replay scaled them otherwise
(:func:`apply_warnings`: a trial's apply of 1,024 under a ceiling of 2,048, replayed with
interactive's 1,024 scaled to 512, left batch 0 tokens and every batch request refused,
unsaid). The confirmation also lists
the form's keys the proposal leaves alone whose value on the running gate now (its latest
snapshot) differs from the one the replay ran with (a hand retune since the window): applying
leaves them as they are (:func:`live_differences`); and the gate's controller (static, frozen or
adaptive) when it is not the one the replay ran (:func:`controller_note`). A proposal the live retune cannot express
(other keys, two classes) is replayable but not appliable, and the form says why. After a
failed replay (a typo in the form, an error in the worker) the previous answer is cleared, not
left under the error, and nothing can be applied until a replay succeeds. ``tokengate review``
has no gate, nor has a ``--read-only`` console: there the what-if only replays, and ctrl+t
says why.

At 80x24 the form, the table, the notes and the curves share one scrolling area; the title,
the status line, the key hints and the buttons stay on screen. There the form and the table do
not fit together: after a replay the table takes the area and the focus (the answer showed no
row until Tab, and nothing said to press it: a trial), the key hints say how to scroll it and
go back to the form (shift+tab), and its first two columns (class, figure) stay while it scrolls right to the
proposal; below 100 columns the dialog takes every column (at 80 the error column was cut to
"err"). Where both fit the form keeps the focus, to edit and replay again. The scrollbars draw
whole cells: their ends' partial blocks read as stray glyphs at the dialog's edge (a trial's
``▂▂``, ``▅▅``, ``▆▆``).
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any, ClassVar

from rich.text import Text
from textual import events, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingsMap
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.scrollbar import ScrollBarRender
from textual.widgets import Button, DataTable, Footer, Static, TextArea
from textual.worker import Worker, WorkerState

from console.screens.confirm import ConfirmScreen
from console.widgets.inputs import InOrderTextArea
from gate.data.commands import CommandError, Retune
from gate.data.snapshot import GateSnapshot
from gate.ops.link import LinkLost, NoAnswer
from gate.tools.replay import (
    ClassShare,
    ReplayError,
    ReplayProcess,
    Window,
    budget_lines,
    model_line,
    plain_value,
    proposal_from_set,
    scaled_apart,
    settable,
    short_reach,
    table_cells,
)


def proposal_text(lines: str, recorded: dict[str, str]) -> str:
    """The ``--set`` text of the form: its ``KEY=VALUE`` lines (blank and ``#`` lines skipped)
    whose value differs from the recorded one, comma-joined; "" when nothing changed."""
    changed = []
    seen: set[str] = set()
    for raw in lines.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise ValueError(f"{line!r}: give KEY=VALUE, e.g. budget.min_tokens=1024")
        if key.strip() in seen:
            # which line would win is a guess: refused, as `tokengate replay --set` refuses it
            raise ValueError(f"{key.strip()} is given twice: keep one line for it")
        seen.add(key.strip())
        if recorded.get(key.strip()) != value.strip():
            changed.append(f"{key.strip()}={value.strip()}")
    return ",".join(changed)


#: the retune's [budget] keys and class keys (console/screens/retune.py's form)
_SETTINGS = ("min_tokens", "slo_ttft_p95_ms")
_CLASS_KEYS = ("reserved_tokens", "limit_tokens", "queue_depth", "queue_timeout_s", "default_max_tokens", "ttft_objective_ms")
_FLOAT_KEYS = ("slo_ttft_p95_ms", "queue_timeout_s", "ttft_objective_ms")


def _number(key: str, text: str) -> int | float | None:
    if text.lower() == "none" and key.rpartition(".")[2] in ("limit_tokens", "ttft_objective_ms"):
        return None
    if text.lower() == "slo" and key.endswith(".ttft_objective_ms"):
        return None  # back to [budget] slo_ttft_p95_ms, as the live retune form writes it (and --set reads it)
    try:
        return float(text) if key.rpartition(".")[2] in _FLOAT_KEYS else int(text)
    except ValueError:
        raise ValueError(f"{key}={text}: not a number") from None


def proposal_items(proposal: str) -> list[tuple[str, str]]:
    """The ``KEY=VALUE`` items of a proposal's ``--set`` text, in order, stripped."""
    return [(k.strip(), v.strip()) for k, _, v in (p.partition("=") for p in proposal.split(",") if p.strip())]


def retune_of(proposal: str, note: str = "") -> Retune:
    """The ``--set`` text as the live retune's one command; ValueError when the retune cannot
    express it (a key it does not edit, or two classes: one Retune carries one class)."""
    budget: int | None = None
    settings: dict[str, Any] = {}
    cls: str | None = None
    changes: dict[str, Any] = {}
    for key, value in proposal_items(proposal):
        head, _, rest = key.partition(".")
        if key in ("backend.token_budget", "backends.token_budget"):
            number = _number(key, value)
            if number is None:
                raise ValueError(f"{key}=none: the live retune sets a budget, not none")
            budget = int(number)
        elif head == "budget" and rest in _SETTINGS:
            settings[rest] = _number(key, value)
        elif head == "classes" and rest.rpartition(".")[2] in _CLASS_KEYS:
            name, _, setting = rest.rpartition(".")
            if cls is not None and cls != name:
                raise ValueError(f"classes {cls} and {name}: one command retunes one class; apply one class at a time")
            cls = name
            changes[setting] = _number(key, value)
        else:
            raise ValueError(f"{key}: the live retune does not set it (replay only); it sets {', '.join(_RETUNE_KEYS)}")
    # Live, backend.token_budget is the working budget, which an adaptive controller would move
    # again within seconds (600 became 660 in a user's trial): it is applied frozen, and stays
    # until `f`. That is what a static-mode replay ran; an adaptive one took it as the pool's
    # ceiling and moved under it (budget_note says which, in the confirmation).
    cmd = Retune(budget=budget, settings=settings, cls=cls, class_changes=changes, note=note, freeze=True if budget is not None else None)
    if not cmd:
        raise ValueError("no change from the recorded thresholds: nothing to apply")
    return cmd


_RETUNE_KEYS = ("backend.token_budget", *(f"budget.{k}" for k in _SETTINGS), *(f"classes.NAME.{k}" for k in _CLASS_KEYS))


def _same(a: str, b: str) -> bool:
    try:
        return float(a) == float(b)
    except ValueError:
        return a == b


def live_values(snap: GateSnapshot) -> dict[str, str]:
    """The running gate's values of the form's keys, in ``--set`` form, from one snapshot:
    ``budget.min_tokens`` (0 when the floor is the automatic one) and ``slo_ttft_p95_ms``, each
    class's retune keys (its own ``ttft_objective_ms``, ``none`` when it has none) and, when one
    backend's budget is set by hand (frozen, or static mode), ``backend.token_budget``: an
    adaptive controller's moving budget is no threshold to compare."""
    c = snap.controller
    out = {
        "budget.min_tokens": "0" if c.min_tokens_auto else plain_value(c.min_tokens),
        "budget.slo_ttft_p95_ms": plain_value(c.slo_ttft_ms),
    }
    if (c.frozen or c.mode == "static") and c.budget is not None and len(snap.backends) == 1:
        out["backend.token_budget"] = plain_value(c.budget)
    for v in snap.classes:
        values = {
            "reserved_tokens": v.reserved_tokens,
            "limit_tokens": v.limit_tokens,
            "queue_depth": v.queue_depth,
            "queue_timeout_s": v.queue_timeout_s,
            "default_max_tokens": v.default_max_tokens,
            "ttft_objective_ms": v.own_ttft_objective_ms,
        }
        out.update({f"classes.{v.name}.{k}": plain_value(value) for k, value in values.items()})
    return out


def live_differences(
    recorded: Mapping[str, str], proposal: str, live: Mapping[str, str], at_end: Mapping[str, str] | None = None
) -> list[str]:
    """The form's keys the proposal leaves alone whose value on the running gate (`live`,
    :func:`live_values`) is not the one the replay ran with (`recorded`, at the window's start;
    `at_end`, the window's end, when a change in the window moved it: the replay ran it as
    recorded, and a trial's retune in the window read as "the gate now differs"): "KEY LIVE
    (replayed with RECORDED)" or "(the replay ended with END)", in the form's order. Applying
    leaves them as they are."""
    proposed = {key for key, _ in proposal_items(proposal)}
    if proposed & {"backend.token_budget", "backends.token_budget"}:
        proposed |= {"backend.token_budget", "backends.token_budget"}
    out = []
    for key, value in recorded.items():
        end = (at_end or {}).get(key, value)
        if key in proposed or key not in live or _same(live[key], end):
            continue
        out.append(
            f"{key} {live[key]} (replayed with {value})" if _same(end, value) else f"{key} {live[key]} (the replay ended with {end})"
        )
    return out


def live_moves(recorded: Mapping[str, str], proposal: str, live: Mapping[str, str]) -> list[str]:
    """Each proposed key as the apply moves it on the running gate: "KEY LIVE -> NEW", with
    "(replayed RECORDED -> NEW)" when the gate no longer runs what the replay started from (a
    trial's confirmation said only "queue_depth=6": the replay raised it from 4, the apply
    lowered it from 8). "KEY RECORDED -> NEW" when the gate's value is not known (an adaptive
    budget) or is the recorded one."""
    out = []
    for key, value in proposal_items(proposal):
        name = "backend." + key.split(".", 1)[1] if key.startswith("backends.") else key
        was, running = recorded.get(name), live.get(name)
        if running is not None and was is not None and not _same(running, was):
            out.append(f"{key} {running} → {value} (replayed {was} → {value})")
        elif was is not None:
            out.append(f"{key} {was} → {value}")
        else:
            out.append(f"{key}={value}")
    return out


def live_controller(snap: GateSnapshot) -> str:
    """The running gate's controller as the replay names one: "static", "frozen" or "adaptive"."""
    c = snap.controller
    return "static" if c.mode == "static" else "frozen" if c.frozen else "adaptive"


def controller_note(start: str, end: str, live: str, budget: int | None) -> str:
    """What the confirmation says when the running gate's controller is not the one the replay
    ran (`start`/`end`: at the window's start and end, `Window.controller_state`; `live`:
    `live_controller`, `budget` its budget): a trial replayed a window with it adaptive and
    applied to a gate frozen since, and the confirmation listed the thresholds that differed,
    not that. "" when they agree."""
    if live == end:
        return ""
    held = f", the budget held at {budget:,}" if budget is not None and live != "adaptive" else ""
    ran = f"with it {end}" if start == end else f"with it {start}, then {end} (a change in the window)"
    moves = (
        "the replay's controller moved the budget, the gate's holds it"
        if end == "adaptive"
        else "the replay held the budget, the gate's controller moves it"
        if live == "adaptive"
        else "each holds the budget by hand"
    )
    return f"The gate's controller is now {live}{held}; the window was replayed {ran}: {moves}, and applying leaves it {live}."


def budget_note(mode: str, budget: int, curve: list[list[float]] | None, ceiling: int | None = None) -> str:
    """What the confirmation says of a proposed ``backend.token_budget``. The replay, in either
    budget ``mode``, took it as the pool's ceiling (the reservations in force scaled to it, R0);
    the apply sets the working budget by hand and freezes the controller there, under the gate's
    own ceiling (`ceiling`, when the snapshot names one), which it leaves as it is. Static, the
    replay held the budget; adaptive, its controller moved under it (``curve``: the proposal's
    ``budget_curve``, [[t, budget], ...]). Only a static replay on the gate's own ceiling ran
    what the apply does. It said "Replay with budget.mode=static added to see what this apply
    does": false, a static replay also takes the budget as the ceiling, and the apply then
    refuses budget.mode (a trial)."""
    applied = f"applied, it is held at {budget} by hand, the controller frozen (f unfreezes)"
    if ceiling == budget:
        if mode != "adaptive":
            return "The budget is set by hand and the adaptive controller frozen there, as the replay held it (f unfreezes it)."
        under = ""
    else:
        under = f", under the gate's ceiling{'' if ceiling is None else f' of {ceiling:,}'}"
    if mode != "adaptive":
        return (
            f"The replay (budget.mode=static) held backend.token_budget={budget} as the pool's ceiling; {applied}{under}: "
            "the budget replayed, not its ceiling (no replay holds a budget under the ceiling)."
        )
    seen = [int(b) for _, b in curve or ()]
    moved = f" ({min(seen)}-{max(seen)})" if seen and min(seen) != max(seen) else ""
    return (
        f"The replay (budget.mode=adaptive) took backend.token_budget={budget} as the pool's ceiling and moved the budget under it"
        f"{moved}; {applied}{under}: not what was replayed (no replay holds a budget under the ceiling)."
    )


def apply_warnings(command: Retune, snap: GateSnapshot | None, replayed: Sequence[ClassShare]) -> tuple[list[str], list[str]]:
    """What the confirmation warns of the apply, on the running gate as its latest snapshot
    shows it: the classes that cannot start their default request at the budget held after it
    (`short_reach`: the proposal's budget, or the one the gate holds now, frozen or static),
    with the reservations the gate keeps in force (on its ceiling, the proposal's class changes
    applied); and, for a proposed budget, reservations the replay scaled on it as its ceiling
    that the gate does not (`scaled_apart`, `replayed`: the proposal's classes). (warnings,
    notes); nothing without a snapshot. A trial applied backend.token_budget=1024, replayed with
    interactive's 1,024 scaled to 512 and batch admitted; on the gate batch reached 0 tokens and
    every request was refused, and the dialog said nothing of it."""
    if snap is None:
        return [], []
    changes = {k: v for k, v in command.class_changes.items() if k in ("reserved_tokens", "default_max_tokens")}
    live = [ClassShare(v.name, v.reserved_tokens, v.default_max_tokens) for v in snap.classes]
    live = [dataclasses.replace(c, **changes) if c.name == command.cls else c for c in live]
    held = command.budget is not None or snap.controller.frozen or snap.controller.mode == "static"
    warnings: list[str] = []
    notes: list[str] = []
    for b in snap.backends:
        if b.ceiling is None:
            continue
        where = f" on {b.name}" if len(snap.backends) > 1 else ""
        budget = command.budget if command.budget is not None else b.budget
        if command.budget is not None:
            apart = scaled_apart(command.budget, replayed, b.ceiling, live, where)
            notes += [apart] if apart else []
        if held and budget is not None:
            warnings += short_reach(min(budget, b.ceiling), b.ceiling, b.slot_context, live, where)
    return warnings, notes


class WholeCellScrollBar(ScrollBarRender):
    """A scrollbar whose thumb is whole cells, without the partial blocks (``▂``, ``▅``, ``▆``,
    ``▎``) Textual draws at its ends: inside the what-if they read as stray glyphs (a trial)."""

    VERTICAL_BARS: ClassVar[list[str]] = [" "] * 8
    HORIZONTAL_BARS: ClassVar[list[str]] = [" "] * 8


#: the key hints under the what-if's body: editing the form, and reading the table
FORM_HINT = "edit KEY=VALUE lines (as `tokengate replay --set`) · ctrl+r replays{applies} · esc closes · '?' = not trusted"
TABLE_HINT = "arrows scroll · shift+tab: the form{applies} · '?' = not trusted"


def title_window(text: str) -> str:
    """`window_text` for the title: the end's date once when it is the start's ("incident.db,
    2027-01-15 07:59:59 → 08:00:59 UTC"), so that it fits one line at 80 columns."""
    m = re.fullmatch(r"(.*, )(\d{4}-\d\d-\d\d) (\S+) → (\d{4}-\d\d-\d\d) (.*)", text)
    return f"{m[1]}{m[2]} {m[3]} → {m[5]}" if m and m[2] == m[4] else text


def curve_label(name: str, room: int = 24) -> str:
    """A scenario's name as the budget curves label it, in `room` characters: cut in the
    middle, keeping the value at its end (two proposals on one key were both
    ``classes.interactive.ttf…`` when cut at the end)."""
    if len(name) <= room:
        return name
    tail = min(max(len(name) - name.rfind("=") + 8, room // 2), room - 5)
    return name[: room - 1 - tail] + "…" + name[-tail:]


def notes_of(window: Window, answer: Mapping[str, Any] | None) -> list[tuple[str, bool]]:
    """The notes ``tokengate replay`` prints above its table (its "note: " lines), in its
    order: the window's, each proposal's config-check warnings ("NAME: ..."), then the backend
    model's; True marks a proposal's warning. Before any replay: the window's and the model's."""
    if answer is None:
        return [(n, False) for n in (*window.notes, *window.fit.notes)]
    warned = {f"{s['name']}: {w}" for s in answer["scenarios"] for w in s.get("warnings", ())}
    return [(n, n in warned) for n in (*answer.get("notes", ()), *answer["fit"]["notes"])]


#: ctrl+t in `tokengate review`: why nothing is applied
NO_GATE = "review has no gate: the what-if only replays; apply from `tokengate console --attach`"
#: ... and in a read-only console
READ_ONLY = "read-only console: the gate refuses commands; the what-if only replays (attach without --read-only to apply)"


def console_words(text: str) -> str:
    """A replay message as the console's user acts on it: the window here is the review's range
    or its ``since=``/``until=`` filter, not the command's flags (a trial read "--until" in an
    error about the ``until=`` it had typed): ``--until 2027-01-15T08:00:05Z`` -> ``until=2027-...``,
    ``give --until a moment`` -> ``give until= a moment``."""
    return _FLAG.sub(lambda m: f"{m.group(1)}=", _FLAG_AT.sub(lambda m: f"{m.group(1)}=", text))


_FLAG_AT = re.compile(r"--(since|until) (?=\d)")  # a flag and its time
_FLAG = re.compile(r"--(since|until)\b")


def window_text(journal_path: str, since: float | None, until: float | None) -> str:
    """The window as the what-if's title names it: "incident.db, 2026-12-05 11:03:38 → ... UTC"."""

    def utc(ts: float | None) -> str:
        return "-" if ts is None else time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ts))

    return f"{Path(journal_path).name}, {utc(since)} → {utc(until)} UTC"


def edits_of(form: str, prefilled: dict[str, str]) -> str:
    """The lines of `form` an operator changed from the window's prefill (a changed value, a line
    that is not KEY=VALUE, a key not prefilled): what a what-if keeps when it closes. The whole
    form was kept, and opened on another window it replayed that window's thresholds as edits
    nobody typed (a trial: three keys, interactive admitted 30 against 33)."""
    kept = []
    for line in form.splitlines():
        key, sep, value = line.partition("=")
        if line.strip() and not (sep and prefilled.get(key.strip()) == value.strip()):
            kept.append(line)
    return "\n".join(kept)


def over_prefill(pairs: list[tuple[str, str]], edits: str | None) -> str:
    """This window's prefill with the operator's kept edits over it: an edited key replaces its
    line, anything else is added at the end."""
    lines = [f"{k}={v}" for k, v in pairs]
    index = {k: i for i, (k, _) in enumerate(pairs)}
    for line in (edits or "").splitlines():
        key, sep, _ = line.partition("=")
        if sep and key.strip() in index:
            lines[index[key.strip()]] = line
        else:
            lines.append(line)
    return "\n".join(lines)


class WhatIfScreen(ModalScreen[None]):
    """See the module docstring. ``since``/``until``: the window (epoch seconds; None = the
    journal's first/last decision)."""

    DEFAULT_CSS = """
    WhatIfScreen #whatif-dialog {
        width: 96%;
        height: 94%;
    }
    /* the form, the table, the notes and the curves scroll together; the title, the status
       line, the hints and the buttons around them stay on screen (at 80x24 the hints and
       the buttons were drawn below the dialog's edge) */
    WhatIfScreen #whatif-body {
        height: 1fr;
    }
    WhatIfScreen #whatif-form {
        height: 12;
    }
    WhatIfScreen #whatif-table {
        height: 1fr;
        min-height: 10;
    }
    WhatIfScreen #whatif-curve {
        height: auto;
    }
    WhatIfScreen #whatif-notes {
        height: auto;
        max-height: 10;
    }
    WhatIfScreen #whatif-notes Static {
        color: $text-muted;
    }
    WhatIfScreen #whatif-notes Static.warning {
        color: $warning;
    }
    WhatIfScreen #whatif-status {
        height: auto;
        color: $text-muted;
    }
    WhatIfScreen #whatif-hint {
        height: auto;
    }
    /* one column each: at 80 columns every one counts for the table */
    WhatIfScreen #whatif-body, WhatIfScreen #whatif-form, WhatIfScreen #whatif-table, WhatIfScreen #whatif-notes {
        scrollbar-size-vertical: 1;
    }
    WhatIfScreen #whatif-status.error {
        color: $error;
    }
    """

    BINDINGS = [
        Binding("escape", "cancel", "close", tooltip="close the what-if (nothing is applied)"),
        Binding("ctrl+r", "replay", "replay", tooltip="replay the window under the edited thresholds"),
        Binding("ctrl+t", "apply", "apply", tooltip="apply the proposal replayed to the running gate (asks; one audited retune)"),
    ]

    def __init__(
        self,
        journal_path: str,
        since: float | None,
        until: float | None,
        *,
        window_text: str = "",
        apply: Callable[[Retune], Awaitable[list[str]]] | None = None,
        draft: str | None = None,
        keep_draft: Callable[[str], None] | None = None,
        live: Callable[[], Awaitable[GateSnapshot | None]] | None = None,
        no_apply: str = "",
    ) -> None:
        """``apply``: sends one command to the attached gate (the live console's); None:
        replay only (``tokengate review``, ``--read-only``), and ``no_apply`` says why when
        ctrl+t is pressed (default: review's). ``live``: the gate's latest snapshot, for what
        the confirmation says of the gate now. ``draft``: the form as it was left for this
        window (closing the what-if once threw the edits away); ``keep_draft`` gets the form's
        text when it closes."""
        super().__init__(classes="dialog-screen")
        self.apply = apply
        self.live = live
        self.no_apply = no_apply or NO_GATE
        if apply is None:
            # ctrl+t stays bound (it says why nothing is applied), out of the footer
            self._bindings = BindingsMap.from_keys(
                {
                    key: [dataclasses.replace(b, show=False) if b.action == "apply" else b for b in found]
                    for key, found in self._bindings.key_to_bindings.items()
                }
            )
        self.draft = draft
        self.keep_draft = keep_draft
        #: the messages of the command applied from here, if one was
        self.applied: list[str] | None = None
        self.applying = False  # an apply sent, its answer not in yet (one at a time)
        self.journal_path = journal_path
        self.since = since
        self.until = until
        self.window_text = window_text
        #: the window as loaded, without its arrivals (they stay in the replay's process)
        self.window: Window | None = None
        self.arrivals = 0
        #: the window is loaded and replayed in a child process: a replay on a thread here held
        #: the GIL for the whole run, the console's loop waiting ~5 ms at every wake-up, and it
        #: could not be stopped (gate/tools/replay/workers.py)
        self.process = ReplayProcess(journal_path, since, until)
        #: KEY -> its value in force at the window's start (the form's starting lines)
        self.recorded: dict[str, str] = {}
        self.at_end: dict[str, str] = {}  # the form's keys at the window's end (a change in it replayed)
        #: the last answer shown (``run_replay``'s), and the proposal text it replayed
        self.answer: dict[str, Any] | None = None
        self.proposal = ""
        self.error: str | None = None
        #: the budget curves shown under the table (gate.tools.replay.budget_lines of the answer)
        self.curve_lines: list[str] = []
        #: the notes shown under the table, as ``notes_of`` gives them (True: a proposal's warning)
        self.notes: list[tuple[str, bool]] = []
        self._run = 0
        #: the latest replay failed (or was refused): its answer cleared, nothing to apply
        self.failed = False
        #: the replay worker whose answer (or error) is awaited: an older one's is not shown
        self._replaying: Worker[Any] | None = None

    def compose(self) -> ComposeResult:
        with Vertical(id="whatif-dialog", classes="dialog"):
            yield Static(f"What if: replay {title_window(self.window_text)}", id="whatif-title", classes="dialog-title", markup=False)
            yield Static("loading the window…", id="whatif-status", markup=False)
            with VerticalScroll(id="whatif-body"):
                yield InOrderTextArea("", id="whatif-form", soft_wrap=False, show_line_numbers=False)
                # the class and figure columns stay while the table scrolls right (at 80 columns the
                # proposal is past the edge: scrolling to it took the class away, then, with the class
                # kept, the figure's name, whose rows read "_ms", "it_p50_ms": two trials)
                table: DataTable[Text] = DataTable(id="whatif-table", zebra_stripes=True, cursor_type="row", fixed_columns=2)
                yield table
                # the notes `tokengate replay` prints (the window's, the model's, the proposal's
                # warnings): their own area, which scrolls, not the status line a replay overwrites
                yield VerticalScroll(id="whatif-notes")
                # each scenario's working budget over the window, on one scale: the replayed over the recorded
                yield Static("", id="whatif-curve", markup=False)
            yield Static(
                FORM_HINT.format(applies=self._applies),
                id="whatif-hint",
                classes="dialog-hint",
                markup=False,
            )
            with Horizontal(classes="dialog-buttons"):
                yield Button("Replay", id="whatif-replay", variant="success", disabled=True)
                if self.apply is not None:
                    yield Button("Apply to gate", id="whatif-apply", variant="warning", disabled=True)
                yield Button("Close", id="whatif-close")
        # its own keys at the bottom line: without it the review's footer showed through the
        # modal's tint (q Close, n Next page ...), keys the what-if does not answer (a trial)
        yield Footer(compact=True)

    @property
    def _applies(self) -> str:
        return " · ctrl+t applies" if self.apply is not None else ""

    def on_mount(self) -> None:
        for selector in ("#whatif-body", "#whatif-form", "#whatif-table", "#whatif-notes"):
            widget = self.query_one(selector)
            # per scrollbar, as textual.scrollbar.ScrollBar.renderer's docs show (typed ClassVar there)
            widget.vertical_scrollbar.renderer = WholeCellScrollBar  # type: ignore[misc]
            widget.horizontal_scrollbar.renderer = WholeCellScrollBar  # type: ignore[misc]
        self.run_worker(self._load_thread, thread=True, group="whatif-load", exit_on_error=False)

    def on_descendant_focus(self, event: events.DescendantFocus) -> None:
        """The key hints follow the focus: the form's editing, or the table's scrolling."""
        hint = TABLE_HINT if event.widget.id == "whatif-table" else FORM_HINT
        self.query_one("#whatif-hint", Static).update(hint.format(applies=self._applies))

    def _show_answer(self) -> None:
        """After a replay, once laid out: when the table is not wholly in view (80x24: the form
        above it fills the area), it takes the area and the focus; where both fit, the form
        keeps the focus."""
        body, table = self.query_one("#whatif-body", VerticalScroll), self.query_one("#whatif-table", DataTable)
        if self.answer is None or self.focused is table:
            return
        seen = body.region
        if seen.y <= table.region.y and table.region.bottom <= seen.bottom:
            return
        body.scroll_to_widget(table, animate=False, top=True)
        table.focus(scroll_visible=False)

    # ---- workers (threads: reading and replaying take seconds) ----------------------------

    def on_unmount(self) -> None:
        self.process.close()  # a replay still running stops with the screen

    def _load_thread(self) -> tuple[Window, int]:
        return self.process.load()

    def _replay_thread(self, text: str, run: int) -> tuple[int, str, dict[str, Any]]:
        # the engine runs in the child; this thread waits on its pipe (the replay at the
        # recorded thresholds is kept there: each proposal after the first is one engine run)
        return run, text, self.process.replay(text)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        worker = event.worker
        event.stop()
        if event.state == WorkerState.SUCCESS and worker.group == "whatif-load":
            loaded = worker.result
            assert isinstance(loaded, tuple)
            window, self.arrivals = loaded
            assert isinstance(window, Window)
            self.window = window
            if window.since != self.since or (self.until is not None and window.until != self.until):
                # the window replayed is not the one asked for (it starts at the gate's start): say which
                self.window_text = window_text(window.path, window.since, window.until)
                self.query_one("#whatif-title", Static).update(f"What if: replay {title_window(self.window_text)}")
            pairs = settable(window.config, window.fit.ceiling, window.held_budget())
            self.recorded = dict(pairs)
            self.at_end = dict(settable(window.config_at_end, window.fit.ceiling, window.held_budget(at_end=True)))
            self.query_one("#whatif-form", TextArea).text = over_prefill(pairs, self.draft)
            self.query_one("#whatif-replay", Button).disabled = False
            self._show_notes(notes_of(window, None))
            below = f" · {len(self.notes)} note{'' if len(self.notes) == 1 else 's'} below" if self.notes else ""
            self._status(f"{self.arrivals:,} arrivals, backend {window.backend}; edit a threshold, then ctrl+r{below}")
            self.query_one("#whatif-form", TextArea).focus()
        elif event.state == WorkerState.SUCCESS and worker.group == "whatif-replay":
            result = worker.result
            assert isinstance(result, tuple)
            run, text, answer = result
            if run != self._run:
                return  # an older run's answer: a newer one (or a refused one) came after it
            self.answer, self.proposal, self.failed = answer, text, False
            self._fill(answer)
            self.call_after_refresh(self._show_answer)
            assert self.window is not None
            self._show_notes(notes_of(self.window, answer))
            if self.apply is not None:
                self.query_one("#whatif-apply", Button).disabled = not text
            untrusted = len(answer["scenarios"][1]["untrusted"])
            what = f"proposal {text}" if text else "no change from the recorded thresholds (calibration only)"
            warnings = sum(1 for _, warning in self.notes if warning)
            warned = f" · {warnings} config-check warning{'' if warnings == 1 else 's'} below" if warnings else ""
            figures = f"{untrusted} figure{'' if untrusted == 1 else 's'} not trusted"
            self._status(f"{what} · {figures} ('?': calibration error over 25%){warned}")
        elif event.state == WorkerState.ERROR:
            if worker.group == "whatif-replay" and worker is not self._replaying:
                return  # an older run's error: a newer one came after it
            error = worker.error
            message = str(error) if isinstance(error, ReplayError | ValueError) else f"{type(error).__name__}: {error}"
            if worker.group == "whatif-replay":
                self._forget_answer()
            prefix = "cannot replay this window: " if worker.group == "whatif-load" else "replay failed: "
            self._status(prefix + console_words(message), error=True)

    # ---- view ---------------------------------------------------------------------

    def _status(self, text: str, *, error: bool = False) -> None:
        status = self.query_one("#whatif-status", Static)
        self.error = text if error else None
        status.set_class(error, "error")
        status.update(text)

    def _show_notes(self, notes: list[tuple[str, bool]]) -> None:
        """One line per note, as the command words it; a proposal's warning in the warning colour."""
        self.notes = notes
        box = self.query_one("#whatif-notes", VerticalScroll)
        box.remove_children()
        # first, what the replay assumed of llama-server: the line `tokengate replay` prints above its notes
        model = [Static(model_line(dataclasses.asdict(self.window.fit)), markup=False)] if self.window is not None else []
        box.mount_all(
            [
                *model,
                *(
                    Static(f"{'warning' if warning else 'note'}: {console_words(text)}", classes="warning" if warning else "", markup=False)
                    for text, warning in notes
                ),
            ]
        )

    def _fill(self, answer: dict[str, Any]) -> None:
        head, rows = table_cells(answer)
        # the one proposal's column is "proposal" (the status line names it whole): headed by its
        # --set text, three keys pushed its figures past the table's edge at 160 columns (a trial)
        head = [*head[:5], *("proposal" for _ in head[5:])]
        table = self.query_one("#whatif-table", DataTable)
        table.clear(columns=True)
        for i, label in enumerate(head):
            table.add_column(label, key=f"c{i}")
        for cells, untrusted in rows:
            style = "dim" if untrusted else ""
            table.add_row(*(Text(c, style=style if i >= 2 else "", justify="right" if i >= 2 else "left") for i, c in enumerate(cells)))
        self._draw_curves()

    def _draw_curves(self) -> None:
        """The budget curves under the table, each one line at the width shown (again on a resize)."""
        if self.answer is None:
            return
        curve = self.query_one("#whatif-curve", Static)
        # labelled by curve_label: budget_lines cuts a name at its end, and two proposals on one
        # key read alike there
        labelled = {**self.answer, "scenarios": [{**s, "name": curve_label(s["name"])} for s in self.answer["scenarios"]]}
        self.curve_lines = budget_lines(labelled, columns=curve.content_region.width or None)
        curve.update("\n".join(self.curve_lines))

    def _forget_answer(self) -> None:
        """The latest replay failed (or was refused): the previous answer goes, not left under
        the error as if it were this form's (a trial read the last run's proposal column under
        "proposal not replayed"); nothing can be applied until a replay succeeds."""
        self._run += 1  # a replay still running answers for a form that is no longer there
        self._replaying = None
        self.answer, self.proposal, self.failed = None, "", True
        self.curve_lines = []
        self.query_one("#whatif-table", DataTable).clear(columns=True)
        self.query_one("#whatif-curve", Static).update("")
        if self.window is not None:
            self._show_notes(notes_of(self.window, None))
        if self.apply is not None:
            self.query_one("#whatif-apply", Button).disabled = True

    def on_resize(self, event: events.Resize) -> None:
        self.set_class(event.size.width < 100, "-narrow")  # console/app.tcss: the dialog takes every column
        self._draw_curves()

    @property
    def table_rows(self) -> list[list[str]]:
        """The table as shown (plain strings), for tests and screenshots."""
        table = self.query_one("#whatif-table", DataTable)
        return [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]

    # ---- actions --------------------------------------------------------------------

    def action_replay(self) -> None:
        if self.window is None:
            self.notify("the window is still loading (or cannot be replayed)", severity="warning", timeout=3)
            return
        try:
            text = proposal_text(self.query_one("#whatif-form", TextArea).text, self.recorded)
            if text:
                proposal_from_set(text, self.window.config)  # checked here: a typo is said at once
        except ValueError as e:
            self._forget_answer()
            self._status(f"proposal not replayed: {e} (the table is cleared)", error=True)
            return
        self._run += 1
        if self._replaying is not None and self._replaying.is_running:
            self.process.cancel()  # its answer would not be shown: stop it rather than wait for it
        self._status(f"replaying {self.arrivals:,} arrivals" + (f" under {text}" if text else "") + " …")
        self._replaying = self.run_worker(
            partial(self._replay_thread, text, self._run),
            thread=True,
            group="whatif-replay",
            exit_on_error=False,
        )

    def action_apply(self) -> None:
        """ctrl+t: one apply at a time. A second ctrl+t while the first waited on a stalled gate
        cancelled the first's wait, not its command, which then landed unannounced (a trial)."""
        if self.applying:
            self._status("an apply is in flight: waiting for the gate's answer", error=True)
            return
        self.applying = True
        self._apply()

    @work(group="whatif-apply", exit_on_error=False)
    async def _apply(self) -> None:
        try:
            await self._ask_and_apply()
        finally:
            self.applying = False

    async def _ask_and_apply(self) -> None:
        """Ask, then send the proposal last replayed as one Retune (the form's current text
        must be what was replayed: apply what you saw)."""
        if self.apply is None:
            # said, not ignored (ctrl+t did nothing in review and in a read-only console)
            self._status(self.no_apply, error=True)
            return
        if self.failed:
            self._status("not applied: the last replay failed (its table is cleared): fix the form and replay it (ctrl+r)", error=True)
            return
        if self.answer is None or not self.proposal:
            self._status("replay a proposal first (ctrl+r): apply sends what the table shows", error=True)
            return
        try:
            current = proposal_text(self.query_one("#whatif-form", TextArea).text, self.recorded)
            if current != self.proposal:
                raise ValueError("the form changed since the replay: replay it again (ctrl+r) before applying")
            command = retune_of(self.proposal, note=f"what-if replay of {self.window_text}")
        except ValueError as e:
            self._status(f"not applied: {e}", error=True)
            return
        untrusted = len(self.answer["scenarios"][1]["untrusted"])
        assert self.window is not None
        # the running gate now, beside what was replayed: a hand retune since the window (a
        # trial's queue_depth 12 where the replay ran 8) stays in force, and is said
        snap = await self.live() if self.live is not None else None
        now = live_values(snap) if snap is not None else {}
        replayed = [
            ClassShare(c.name, c.reserved_tokens, c.default_max_tokens)
            for c in proposal_from_set(self.proposal, self.window.config).config.classes
        ]
        warnings, apart = apply_warnings(command, snap, replayed)
        budget = "".join(f"\nWARNING: {w}." for w in warnings)
        if command.budget is not None:
            curve = self.answer["scenarios"][-1].get("budget_curve")
            ceilings = {b.ceiling for b in snap.backends if b.ceiling is not None} if snap is not None else set()
            ceiling = next(iter(ceilings)) if len(ceilings) == 1 else None
            budget += "\n" + budget_note(self.window.config.budget.mode, command.budget, curve, ceiling)
        budget += "".join(f"\n{n}" for n in apart)
        differ = live_differences(self.recorded, self.proposal, now, self.at_end)
        if differ:
            them = "them as they are" if len(differ) > 1 else "it as it is"
            budget += f"\nThe gate now differs from what was replayed: {', '.join(differ)}; applying leaves {them}."
        if snap is not None and command.budget is None:
            # (a proposed budget freezes the controller: budget_note says that of the replay)
            state = controller_note(
                self.window.controller_state(), self.window.controller_state(at_end=True), live_controller(snap), snap.controller.budget
            )
            budget += f"\n{state}" if state else ""
        if not await self.app.push_screen_wait(
            ConfirmScreen(
                "Apply the what-if",
                f"Retune the running gate: {', '.join(live_moves(self.recorded, self.proposal, now))}"
                + budget
                # the figures behind the decision, as trusted as the calibration says (a trial
                # applied a proposal whose 15 of 17 figures were marked '?', with nothing said here)
                + (
                    f"\n{untrusted} of the table's figures are not trusted (calibration error over 25%): "
                    "the replay predicts them poorly for this window."
                    if untrusted
                    else ""
                ),
                yes_label="Apply",
            )
        ):
            return
        self._status("applying: sent to the gate, waiting for its answer ...")
        try:
            self.applied = await self.apply(command)
        except NoAnswer as e:  # sent, unanswered: neither "applied" nor "not applied"
            self._status(f"unknown: {e}", error=True)
            return
        except (CommandError, LinkLost) as e:
            self._status(f"not applied: {e}", error=True)
            return
        if not self.applied:
            self._status("nothing applied: the gate already runs these values (no audit row)")
            return
        self._status("applied: " + "; ".join(self.applied))
        # the gate's own word on a budget it now holds short of a class's default request (Control.execute)
        warned = any("WARNING:" in m for m in self.applied)
        self.notify("\n".join(self.applied), title="what-if applied", markup=False, severity="warning" if warned else "information")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        if event.button.id == "whatif-replay":
            self.action_replay()
        elif event.button.id == "whatif-apply":
            self.action_apply()
        else:
            self.action_cancel()

    def action_cancel(self) -> None:
        if self.keep_draft is not None and self.window is not None:
            self.keep_draft(edits_of(self.query_one("#whatif-form", TextArea).text, self.recorded))
        self.dismiss(None)
