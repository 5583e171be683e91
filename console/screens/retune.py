"""`t`: retune the budget and the selected class in one form, validated as you type.

Each field says what is wrong with it next to it, and Save stays disabled until
every field is valid. Save hands only the changed values to the app's `apply`
callback, which sends them to the gate as one Retune command (all or nothing);
a CommandError it raises is shown in the form, which stays open.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Button, Checkbox, Input, Label, Static

from console.widgets.inputs import InOrderInput
from gate.data.commands import CommandError, Retune
from gate.data.snapshot import GateSnapshot
from gate.ops.link import LinkLost, NoAnswer

MAX_SLO_MS = 600_000.0
MAX_QUEUE_DEPTH = 100_000
MAX_QUEUE_TIMEOUT_S = 3600.0


class StateCheckbox(Checkbox, inherit_bindings=False):
    """A checkbox that says its state in characters, `[x]` on and `[ ]` off: the compact stock
    one draws an X either way, told apart by colour only, and looked ticked when off (#22).

    Only space toggles it: enter saves the form, as its hint says (the stock box toggled on
    enter too, so a trial's "space, enter" un-ticked the freeze and saved nothing)."""

    BINDINGS = [Binding("space", "toggle_button", "toggle", show=False)]

    @property
    def _button(self) -> Content:
        return Content("[x]" if self.value else "[ ]")


@dataclass
class RetuneChanges:
    """What Save applies; empty parts are left alone."""

    budget: int | None = None  # set_budget on every backend
    settings: dict[str, Any] = field(default_factory=dict)  # set_budget_settings
    cls: str | None = None
    class_changes: dict[str, Any] = field(default_factory=dict)  # set_class(cls, ...)
    freeze: bool | None = None  # freeze the controller in the same command

    def __bool__(self) -> bool:
        return self.budget is not None or bool(self.settings) or bool(self.class_changes) or self.freeze is not None

    def command(self) -> Retune:
        return Retune(
            budget=self.budget,
            settings=dict(self.settings),
            cls=self.cls,
            class_changes=dict(self.class_changes),
            freeze=self.freeze,
        )


def controller_outlook(snap: GateSnapshot) -> str:
    """What the adaptive controller will do with a budget set by hand (the retune form says it)."""
    c = snap.controller
    if c.mode != "adaptive":
        return "static budget: the value stays until changed"
    if c.frozen:
        return "controller frozen: the value stays until you unfreeze it (f)"
    slo = c.slo_ttft_ms
    # its signal: p95 TTFT from dispatch (llama-server's latency, no queue wait), smoothed
    ms = c.p95_ttft_ms
    p95 = f"p95 TTFT from dispatch {ms:,.0f} ms" if ms is not None else ""
    if ms is None:
        now = "with too few samples it waits; then"
    elif ms < 0.7 * slo and c.ceiling is not None and c.budget is not None and c.budget >= c.ceiling:
        # "it will raise it" was said of a budget already at its ceiling (a trial): it cannot
        now = (
            f"{p95} < 0.7 x SLO, but the budget is at its ceiling {c.ceiling:,}: it cannot raise it; "
            "a lower one you set it raises back (x1.1 per step) when there is demand;"
        )
    elif ms < 0.7 * slo:
        now = f"{p95} < 0.7 x SLO: it will raise it (x1.1 per step, up to {c.ceiling or 0:,}) when there is demand;"
    elif ms > 1.2 * slo:
        now = f"{p95} > 1.2 x SLO: it will lower it (x0.8 per step, down to {c.min_tokens:,});"
    else:
        now = f"{p95} is near the SLO: it holds it for now;"
    return f"adaptive controller: {now} it moves the budget after every cool-down. Freeze it to keep your value."


class Invalid(ValueError):
    pass


def parse_int(text: str) -> int:
    text = text.strip().replace("_", "").replace(",", "")
    if not text:
        raise Invalid("required")
    try:
        return int(text)
    except ValueError:
        raise Invalid("a whole number, please") from None


def parse_num(text: str) -> float:
    text = text.strip().replace("_", "").replace(",", "")
    if not text:
        raise Invalid("required")
    try:
        value = float(text)
    except ValueError:
        raise Invalid("a number, please") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise Invalid("a finite number, please")
    return value


def parse_limit(text: str) -> int | None:
    if text.strip().lower() in ("", "none", "-"):
        return None
    return parse_int(text)


def parse_objective(text: str) -> float | None:
    """A class's TTFT objective: milliseconds, or "slo" (or blank): held to [budget] slo_ttft_p95_ms."""
    if text.strip().lower() in ("", "slo", "none", "-"):
        return None
    return parse_num(text)


def _g(value: float) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


# field key -> (label, which part it belongs to)
FIELDS: tuple[tuple[str, str], ...] = (
    ("budget", "budget (tokens)"),
    ("min_tokens", "min budget (tokens)"),
    ("slo_ttft_p95_ms", "SLO p95 TTFT (ms)"),
    ("reserved_tokens", "reserved (tokens)"),
    ("limit_tokens", "limit (tokens|none)"),
    ("queue_depth", "queue depth"),
    ("queue_timeout_s", "queue timeout (s)"),
    ("default_max_tokens", "default max_tokens"),
    ("ttft_objective_ms", "TTFT obj. (ms|slo)"),
)
BUDGET_SETTINGS = ("min_tokens", "slo_ttft_p95_ms")
CLASS_SETTINGS = ("reserved_tokens", "limit_tokens", "queue_depth", "queue_timeout_s", "default_max_tokens", "ttft_objective_ms")


class RetuneScreen(ModalScreen[list[str] | None]):
    """Dismisses with the applied actions' messages, or None when cancelled."""

    BINDINGS = [
        Binding("escape", "cancel", "cancel"),
        Binding("enter", "save", "save", show=False),
        # Priority: the focus moves before the next key is delivered. Keys read in one burst (typed
        # ahead over a laggy SSH link; a trial's `tmux send-keys Tab Tab Tab 7`) were all queued
        # to the field focused then: the 7 went into the budget and saved a budget change.
        Binding("tab", "app.focus_next", show=False, priority=True),
        Binding("shift+tab", "app.focus_previous", show=False, priority=True),
    ]

    def __init__(
        self,
        snap: GateSnapshot,
        cls: str | None,
        apply: Callable[[RetuneChanges], Awaitable[list[str]]],
        *,
        gate: str = "",
    ) -> None:
        super().__init__(classes="dialog-screen")
        self.gate = gate  # named in the title in a fleet console
        self.snap = snap
        self.apply = apply
        self.cls_view = next((c for c in snap.classes if c.name == cls), None)
        self.cls = self.cls_view.name if self.cls_view else None
        ready = [b for b in snap.backends if b.budget is not None and b.ceiling is not None]
        self.ceiling = min((b.ceiling for b in ready if b.ceiling is not None), default=None)
        budgets = {b.budget for b in ready}
        c = snap.controller
        self.initial: dict[str, str] = {
            "budget": str(budgets.pop()) if len(budgets) == 1 else "",
            "min_tokens": str(c.min_tokens),
            "slo_ttft_p95_ms": _g(c.slo_ttft_ms),
        }
        if self.cls_view is not None:
            v = self.cls_view
            self.initial.update(
                reserved_tokens=str(v.reserved_tokens),
                limit_tokens="none" if v.limit_tokens is None else str(v.limit_tokens),
                queue_depth=str(v.queue_depth),
                queue_timeout_s=_g(v.queue_timeout_s),
                default_max_tokens=str(v.default_max_tokens),
                ttft_objective_ms="slo" if v.own_ttft_objective_ms is None else _g(v.own_ttft_objective_ms),
            )
        self.keys = [k for k, _ in FIELDS if k in self.initial]
        #: the controller would move a budget set by hand: the form offers to freeze it
        self.offers_freeze = c.mode == "adaptive" and not c.frozen
        self.errors: dict[str, str] = {}

    # ---- layout ------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        title = "Retune" + (f" gate {self.gate}" if self.gate else "") + (f" (class {self.cls})" if self.cls else "")
        with Vertical(id="retune-dialog", classes="dialog"):
            yield Static(title, classes="dialog-title")
            with VerticalScroll(id="retune-fields"):
                for key, label in FIELDS:
                    if key not in self.initial:
                        continue
                    if key == "reserved_tokens":
                        yield Static(f"class {self.cls}", classes="retune-section")
                    with Horizontal(classes="retune-row", id=f"row-{key}"):
                        yield Label(label, classes="retune-label")
                        yield InOrderInput(self.initial[key], id=f"field-{key}", compact=True, classes="retune-input")
                        yield Label("", id=f"error-{key}", classes="retune-error", markup=False)
                if not self.initial["budget"]:
                    yield Static("budget: backends differ or are not ready; leave empty to keep", classes="dialog-hint")
                yield Static(controller_outlook(self.snap), id="retune-controller", classes="dialog-hint", markup=False)
                if self.offers_freeze:
                    yield StateCheckbox("freeze the controller (it keeps the budget you set)", id="retune-freeze", compact=True)
            yield Label("", id="retune-result", classes="retune-error", markup=False)
            yield Static("enter saves when every field is valid · esc cancels · tab moves", classes="dialog-hint")
            with Horizontal(classes="dialog-buttons"):
                yield Button("Save", id="save", variant="success")
                yield Button("Cancel", id="cancel")

    def on_mount(self) -> None:
        self.validate_all()
        self.query_one(f"#field-{self.keys[0]}", Input).focus()

    # ---- validation ----------------------------------------------------------------

    def _text(self, key: str) -> str:
        return self.query_one(f"#field-{key}", Input).value

    def parsed(self) -> tuple[dict[str, Any], dict[str, str]]:
        """(values, errors) for the current text of every field, cross-field rules included."""
        values: dict[str, Any] = {}
        errors: dict[str, str] = {}
        parsers = {
            "budget": parse_int,
            "min_tokens": parse_int,
            "slo_ttft_p95_ms": parse_num,
            "reserved_tokens": parse_int,
            "limit_tokens": parse_limit,
            "queue_depth": parse_int,
            "queue_timeout_s": parse_num,
            "default_max_tokens": parse_int,
            "ttft_objective_ms": parse_objective,
        }
        for key in self.keys:
            text = self._text(key)
            if key == "budget" and not text.strip() and not self.initial["budget"]:
                values[key] = None  # unknown or differing budgets: blank keeps them
                continue
            try:
                values[key] = parsers[key](text)
            except Invalid as exc:
                errors[key] = str(exc)
        ceiling = self.ceiling

        def check(key: str, ok: bool, why: str) -> None:
            if key not in errors and key in values and values[key] is not None and not ok:
                errors[key] = why

        min_tokens = values.get("min_tokens")
        check("min_tokens", (min_tokens or 0) > 0, "must be positive")
        if ceiling is not None:
            check("min_tokens", (min_tokens or 0) <= ceiling, f"at most the ceiling ({ceiling:,})")
        if "budget" in values and values["budget"] is not None:
            b = values["budget"]
            if ceiling is None:
                errors["budget"] = "no backend is ready: capacity unknown"
            else:
                lo = min_tokens if isinstance(min_tokens, int) and "min_tokens" not in errors else self.snap.controller.min_tokens
                check("budget", lo <= b <= ceiling, f"{lo:,}..{ceiling:,} (min budget..ceiling)")
        slo = values.get("slo_ttft_p95_ms")
        check("slo_ttft_p95_ms", (slo or 0) > 0, "must be positive")
        check("slo_ttft_p95_ms", (slo or 0) <= MAX_SLO_MS, f"at most {MAX_SLO_MS:,.0f} ms")
        if self.cls_view is not None:
            reserved = values.get("reserved_tokens")
            check("reserved_tokens", (reserved if reserved is not None else 0) >= 0, "zero or more")
            # Only a floor set (here or in [budget] min_tokens) binds the reservations: the auto
            # floor shown may sit below them where a small pool scales them down (R0), and
            # checking against it refused every save there, a queue depth's too.
            pinned = str(min_tokens) != self.initial["min_tokens"] or not self.snap.controller.min_tokens_auto
            if isinstance(reserved, int) and isinstance(min_tokens, int) and pinned:
                others = sum(c.reserved_tokens for c in self.snap.classes if c.name != self.cls)
                check(
                    "reserved_tokens",
                    others + reserved <= min_tokens,
                    f"all reservations ({others:,} + this) must fit min budget ({min_tokens:,})",
                )
            limit = values.get("limit_tokens")
            if limit is not None:
                check("limit_tokens", limit > 0, "positive, or none")
                if isinstance(reserved, int):
                    check("limit_tokens", limit >= reserved, f"at least reserved ({reserved:,})")
            depth = values.get("queue_depth")
            check("queue_depth", 1 <= (depth or 0) <= MAX_QUEUE_DEPTH, f"between 1 and {MAX_QUEUE_DEPTH:,}")
            timeout = values.get("queue_timeout_s")
            check("queue_timeout_s", 0 < (timeout or 0) <= MAX_QUEUE_TIMEOUT_S, f"above 0, at most {MAX_QUEUE_TIMEOUT_S:g} s")
            default = values.get("default_max_tokens")
            cap = self.cls_view.max_tokens_cap
            check("default_max_tokens", 1 <= (default or 0) <= cap, f"between 1 and max_tokens_cap ({cap:,})")
            objective = values.get("ttft_objective_ms")
            if objective is not None:  # None: held to the SLO
                check("ttft_objective_ms", 0 < objective <= MAX_SLO_MS, f"above 0, at most {MAX_SLO_MS:,.0f} ms, or slo")
        return values, errors

    def notes(self, values: dict[str, Any]) -> dict[str, str]:
        """What saving would do that the operator may not expect, said before saving (not an
        error: the save stays open)."""
        out: dict[str, str] = {}
        reserved, most = values.get("reserved_tokens"), self.snap.controller.reserved_max
        if self.cls_view is not None and isinstance(reserved, int) and reserved > 0 and most is not None:
            total = reserved + sum(c.reserved_tokens for c in self.snap.classes if c.name != self.cls)
            if total > most:
                # R0, as the gate will apply it; a trial saved 1,024 and saw 512 only afterwards
                out["reserved_tokens"] = f"reservations {total:,} > half the ceiling: {reserved * most // total:,} in force"
        return out

    def validate_all(self) -> bool:
        values, errors = self.parsed()
        self.errors = errors
        notes = self.notes(values)
        for key in self.keys:
            label = self.query_one(f"#error-{key}", Label)
            label.update(errors.get(key) or notes.get(key, ""))
            label.set_class(key not in errors and key in notes, "-note")
            self.query_one(f"#field-{key}", Input).set_class(key in errors, "-invalid")
        self.query_one("#save", Button).disabled = bool(errors)
        return not errors

    def changes(self) -> RetuneChanges:
        values, errors = self.parsed()
        if errors:
            raise CommandError("; ".join(f"{k}: {v}" for k, v in errors.items()))
        initial = {}
        for key in self.keys:
            try:
                initial[key] = (
                    parse_limit(self.initial[key])
                    if key == "limit_tokens"
                    else parse_objective(self.initial[key])
                    if key == "ttft_objective_ms"
                    else (parse_num(self.initial[key]) if key in ("slo_ttft_p95_ms", "queue_timeout_s") else parse_int(self.initial[key]))
                )
            except Invalid:
                initial[key] = None
        out = RetuneChanges(cls=self.cls)
        for key in self.keys:
            if values[key] == initial[key]:
                continue
            if key == "budget":
                out.budget = values[key]
            elif key in BUDGET_SETTINGS:
                out.settings[key] = float(values[key]) if key == "slo_ttft_p95_ms" else values[key]
            else:
                out.class_changes[key] = (
                    float(values[key]) if key in ("queue_timeout_s", "ttft_objective_ms") and values[key] is not None else values[key]
                )
        if self.offers_freeze and self.query_one("#retune-freeze", Checkbox).value:
            out.freeze = True
        return out

    def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        self.validate_all()
        self.query_one("#retune-result", Label).update("")

    async def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        await self.save()

    async def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        if event.button.id == "save":
            await self.save()
        else:
            self.action_cancel()

    # ---- actions ---------------------------------------------------------------------

    async def action_save(self) -> None:
        """enter where no field takes it (the freeze box): save, as the hint says."""
        await self.save()

    async def save(self) -> None:
        if not self.validate_all():
            return
        try:
            changes = self.changes()
            if not changes:
                self.dismiss([])
                return
            messages = await self.apply(changes)
        except NoAnswer as exc:  # sent, unanswered: not "refused"
            self.query_one("#retune-result", Label).update(str(exc))
            return
        except (CommandError, LinkLost) as exc:
            self.query_one("#retune-result", Label).update(f"refused: {exc}")
            return
        self.dismiss(messages)

    def action_cancel(self) -> None:
        self.dismiss(None)
