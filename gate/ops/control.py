"""Operator actions: the only way to change a running gate (consoles, SIGHUP).

`Control` owns the operator state (paused classes, the controller freeze); the
service and the console only read it. `execute(command, operator)` is the entry
point for consoles: a command is validated as a whole first and changes nothing
when invalid (CommandError with a message fit for a toast), then applied at
once, with an audit row per changed value: operator, SSH origin, old and new.
Everything here runs synchronously on the gate's event loop, so no request is
admitted half-way through a command.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

from gate.backend.pool import Backend, BackendPool, Core, budget_floor, controller_settings, cores, reserved_total
from gate.config import ClassConfig, Config, ConfigError, config_digest, load_config, validate_config
from gate.data.commands import (
    ActionResult,
    Command,
    CommandError,
    Drain,
    DropOverrides,
    Freeze,
    ModelAction,
    Operator,
    Pause,
    Retune,
    describe,
)
from gate.data.records import AuditRecord, AuditSource
from gate.fleet import model_ops
from gate.fleet.router_mode import ModelFleet
from gate.ops import overrides as overrides_file
from gate.ops.overrides import Overrides

log = logging.getLogger("tokengate.service")

# ttft_objective_ms among them: a class starving because it is held to the SLO ("would miss its
# 2000 ms objective") had no lever on the console but the SLO of every class (an on-call trial)
CLASS_FIELDS = (
    "reserved_tokens",
    "limit_tokens",
    "queue_depth",
    "queue_timeout_s",
    "default_max_tokens",
    "max_tokens_cap",
    "priority",
    "ttft_objective_ms",
)

#: what a reload applies to a class: all of its table but its name
_RELOADED_CLASS_FIELDS = tuple(f.name for f in dataclasses.fields(ClassConfig) if f.name != "name")

#: the name older code and tests use for a refused action
ControlError = CommandError


def _fmt(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


class Control:
    """The gate's control API and the owner of operator state; `source` says who drives it."""

    def __init__(self, config: Config, backends: BackendPool, *, clock: Callable[[], float], audit: Callable[[AuditRecord], None]) -> None:
        #: the config in force: read by every layer through this one owner (a reload or a
        #: retune replaces it here and nowhere else)
        self.config = config
        self.backends = backends
        self.clock = clock
        self.audit = audit
        self.paused: set[str] = set()
        self.frozen = False
        #: the config file as last read (start or reload): what a runtime change overrides
        self.file_config = config
        #: the operator's runtime changes in force, kept at `overrides_path` (beside the journal)
        self.overrides = Overrides()
        self.overrides_path: str | None = None
        #: why the last write of the overrides failed (None: kept), for the command's answer
        self.keep_error: str | None = None
        self._keep_failed_now = False  # the command being executed could not write them
        self._budgets: dict[str, int] = {}  # working budgets set by hand, per backend
        self._pending_budgets: dict[str, int] = {}  # restored for backends whose capacity is not known yet
        self._pending_pins: dict[str, bool] = {}  # restored for router units not seen yet (the router down at start)

    # ---- the console's entry point -------------------------------------------

    def execute(self, command: Command, *, operator: Operator, source: AuditSource = "console") -> list[ActionResult]:
        """Validate `command` whole, apply it atomically, audit each changed value. When the
        overrides could not be written beside the journal, the answer says the change will not
        survive a restart (the log alone was not seen: a trial's toast said "Paused batch")."""
        # Only this command's own write decides the warning; a command that writes nothing (a
        # drain) leaves an earlier failure standing: clearing it here told the metric the
        # overrides were kept while the file still held the ones before the failed write.
        self._keep_failed_now = False
        before = {b.name: b.warnings for b in self.backends}
        results = self._execute(command, operator=operator, source=source)
        # A budget this command holds (set by hand, frozen, static) that leaves a class no room for
        # its default request: said in the answer too, not only in the log and /health (a trial's
        # what-if apply froze 1,024 under a ceiling of 2,048; every batch request was then refused,
        # and the toast said only "budget 2048 -> 1024")
        raised = [
            f"backend {b.name}: {w}" for b in self.backends for w in self.backends.held_warnings(b) if w not in before.get(b.name, ())
        ]
        if raised and results:
            last = results[-1]
            results[-1] = dataclasses.replace(last, message=f"{last.message}. WARNING: {'; '.join(raised)}")
        if self._keep_failed_now and results:
            last = results[-1]
            warning = f" (NOT kept for a restart: {self.keep_error}; a restart would revert it)"
            results[-1] = dataclasses.replace(last, message=last.message + warning)
        return results

    def _execute(self, command: Command, *, operator: Operator, source: AuditSource) -> list[ActionResult]:
        if isinstance(command, Pause):
            return [self.pause(command.cls, command.paused, operator=operator, note=command.note, source=source)]
        if isinstance(command, Drain):
            return [self.drain(command.cls, operator=operator, note=command.note, source=source)]
        if isinstance(command, Freeze):
            return [self.freeze(command.frozen, operator=operator, note=command.note, source=source)]
        if isinstance(command, Retune):
            return self.retune(command, operator=operator, source=source)
        if isinstance(command, ModelAction):
            return [self.model(command, operator=operator, source=source)]
        if isinstance(command, DropOverrides):
            return [self.drop_overrides(operator=operator, note=command.note, source=source)]
        raise CommandError(f"unknown command {command!r}")

    # ---- router mode: models ---------------------------------------------------------

    def model(self, command: ModelAction, *, operator: Operator, source: AuditSource = "console") -> ActionResult:
        """Load, unload, pin or unpin a model of a llama-server in router mode (gate/fleet/router_mode.py)."""
        unit = self.backends.route(command.model) if command.model else None
        if unit is None or unit.fleet is None or unit.model != command.model:
            models = [m for f in self.backends.fleets for m in f.units]
            known = ", ".join(models) if models else "none (no llama-server in router mode)"
            raise CommandError(f"{command.model!r} is not a router-mode model; models: {known}")
        fleet, model = unit.fleet, unit.model
        assert isinstance(fleet, ModelFleet)  # the only Fleet there is
        old: Any = fleet.info[model].status
        new: Any = None
        note = command.note
        try:
            if command.action == "load":
                what = model_ops.load(fleet, model)
                new, note = "loading", f"{what}; {note}" if note else what
            elif command.action == "unload":
                model_ops.unload(fleet, model)
                new = "unloaded"
            else:
                old = model_ops.pin(fleet, model, command.action == "pin")
                new = command.action == "pin"
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        result = self._audit(operator, source, f"model_{command.action}", f"model:{unit.name}", old, new, note)
        if command.action in ("pin", "unpin"):
            self._pending_pins.pop(unit.name, None)
            self._keep()  # a pin is the operator's, as a pause is: a restart keeps it
        return result

    def _pins(self) -> dict[str, bool]:
        """Router units whose pin differs from the file's `pin` (with those restored but not seen yet)."""
        out = dict(self._pending_pins)
        for fleet in self._model_fleets():
            for model, unit in fleet.units.items():
                pinned = model in fleet.pins
                if pinned != (model in fleet.parent.config.pin):
                    out[unit.name] = pinned
        return out

    def _model_fleets(self) -> list[ModelFleet]:
        return [f for f in self.backends.fleets if isinstance(f, ModelFleet)]

    def _restore_pin(self, unit: Backend, pinned: bool, operator: Operator, source: AuditSource) -> ActionResult | None:
        fleet, model = unit.fleet, unit.model
        assert isinstance(fleet, ModelFleet) and model is not None
        self._pending_pins.pop(unit.name, None)
        old = model in fleet.pins
        if old == pinned:
            return None
        model_ops.pin(fleet, model, pinned)
        return self._audit(operator, source, "restored", f"model:{unit.name}", old, pinned, "kept from the last run")

    # ---- budget and controller ---------------------------------------------

    def retune(self, change: Retune, *, operator: Operator, source: AuditSource = "console") -> list[ActionResult]:
        """Budget, [budget] settings and one class's settings in one step: all or nothing."""
        if not change:
            return []
        old = self.config
        new = old
        if change.settings:
            unknown = set(change.settings) - {f.name for f in dataclasses.fields(old.budget)}
            if unknown:
                raise CommandError(f"unknown budget setting(s): {', '.join(sorted(unknown))}")
            new = dataclasses.replace(new, budget=_replaced(old.budget, change.settings))
        current: ClassConfig | None = None
        if change.class_changes:
            if change.cls is None:
                raise CommandError("class settings given without a class")
            current = self._class(change.cls)
            unknown = set(change.class_changes) - set(CLASS_FIELDS)
            if unknown:
                raise CommandError(f"unknown class setting(s): {', '.join(sorted(unknown))}")
            updated = _replaced(current, change.class_changes)
            classes = tuple(updated if c.name == change.cls else c for c in new.classes)
            new = dataclasses.replace(new, classes=tuple(sorted(classes, key=lambda c: (-c.priority, c.name))))
        self._validated(new)
        floor = change.settings.get("min_tokens") if change.settings else None
        ceilings = [b.controller.ceiling_tokens for b in self.backends if b.controller is not None]
        if isinstance(floor, int) and ceilings and floor > max(ceilings):
            # as the retune form refuses it: a floor no backend can reach is clamped everywhere
            raise CommandError(f"budget.min_tokens {floor} is above every backend's ceiling (at most {max(ceilings)})")
        # What already holds is not a change: no audit row for it (a what-if applied twice
        # wrote "queue_depth=2 -> queue_depth=2"). A budget by hand stays: it pins the value.
        settings = {k: v for k, v in change.settings.items() if getattr(old.budget, k) != v} if change.settings else {}
        class_changes = {k: v for k, v in change.class_changes.items() if getattr(current, k) != v} if change.class_changes else {}
        change = dataclasses.replace(change, settings=settings, class_changes=class_changes)
        targets = self._backends(None) if change.budget is not None else []
        for b in targets:
            reserved = reserved_total(new.classes, b.controller.ceiling_tokens)  # type: ignore[union-attr]
            floor = budget_floor(new.budget, b.controller.ceiling_tokens, reserved)  # type: ignore[union-attr]
            self._check_budget(b, change.budget, floor, new.budget.min_tokens, reserved)  # type: ignore[arg-type]
        # Validated whole: nothing below refuses.
        results = []
        if change.settings:
            if not change.class_changes:  # else _apply_classes applies both, below
                self._apply_budget(new)
            results.append(
                self._audit(
                    operator,
                    source,
                    "set_budget_settings",
                    "budget",
                    _diff_old(old.budget, change.settings),
                    _diff_new(change.settings),
                    change.note,
                )
            )
        if change.class_changes:
            self._apply_classes(new)
            scaled = self._scaled(change.cls) if change.cls and "reserved_tokens" in change.class_changes else ""
            # the values stay parseable (replay reads `k=v`); what an unset objective meant goes
            # in the note and the toast: "ttft_objective_ms=none -> 1500" read as if no objective
            # had held, where [budget] slo_ttft_p95_ms 2000 had (a trial)
            old_pairs, new_pairs = _diff_old(current, change.class_changes), _diff_new(change.class_changes)
            assert current is not None  # class changes name a class: _class() found it above
            meant = _objective_in_force(current, change.class_changes, old.budget.slo_ttft_p95_ms, new.budget.slo_ttft_p95_ms)
            result = self._audit(
                operator,
                source,
                "set_class",
                f"class:{change.cls}",
                old_pairs,
                new_pairs,
                "; ".join(n for n in (change.note, meant, scaled) if n),
            )
            if meant:
                shown_old = _diff_old(current, change.class_changes, slo_ms=old.budget.slo_ttft_p95_ms)
                shown_new = _diff_new(change.class_changes, slo_ms=new.budget.slo_ttft_p95_ms)
                result = dataclasses.replace(result, message=describe("set_class", result.target, shown_old, shown_new))
            results.append(dataclasses.replace(result, message=f"{result.message}; {scaled}") if scaled else result)
        if change.budget is not None:
            results += self._set_budget(targets, change.budget, operator, source, change.note)
        if change.freeze is not None and change.freeze != self.frozen:
            results.append(self.freeze(change.freeze, operator=operator, note=change.note, source=source))
        self._keep()
        return results

    def set_budget(
        self, tokens: int, *, operator: Operator, backend: str | None = None, note: str = "", source: AuditSource = "console"
    ) -> list[ActionResult]:
        """Set the working budget by hand (one backend or all)."""
        targets = self._backends(backend)
        for b in targets:
            reserved = b.admission.reserved_total if b.admission is not None else 0
            self._check_budget(b, tokens, b.controller.min_tokens if b.controller else 0, self.config.budget.min_tokens, reserved)
        return self._set_budget(targets, tokens, operator, source, note)

    def _check_budget(self, b: Backend, tokens: int, floor: int, min_tokens: int, reserved: int) -> None:
        """Refuse a budget outside [floor, ceiling], saying what sets the side it crossed (one
        piece of advice for both sides told a budget above the ceiling to lower min_tokens).
        ``min_tokens``: [budget] min_tokens (0: auto); ``reserved``: the classes' reservations."""
        if b.controller is None or b.admission is None:
            raise CommandError(f"backend {b.name!r} is {b.state}: its capacity is not known yet")
        ceiling = b.controller.ceiling_tokens
        if floor <= tokens <= ceiling:
            return
        where = f"budget {tokens} is outside [{floor}, {ceiling}] for backend {b.name!r}"
        if tokens > ceiling:
            raise CommandError(f"{where}: {_ceiling_advice(b, ceiling)}")
        raise CommandError(f"{where}: {_floor_advice(tokens, floor, min_tokens, reserved)}")

    def _set_budget(self, targets: list[Backend], tokens: int, operator: Operator, source: AuditSource, note: str) -> list[ActionResult]:
        now = self.clock()
        results = []
        for b in targets:
            assert b.controller is not None  # targets have cores: _backends' callers checked
            move = b.controller.set_budget(now, tokens)  # pushed to admission
            self._budgets[b.name] = move.new_budget
            results.append(self._audit(operator, source, "set_budget", f"backend:{b.name}", move.old_budget, move.new_budget, note))
        self._keep()
        return results

    def freeze(self, frozen: bool, *, operator: Operator, note: str = "", source: AuditSource = "console") -> ActionResult:
        """Stop (or restart) the adaptive controller's own moves on every backend."""
        old = self.frozen
        self.frozen = frozen
        if not frozen and self.config.budget.mode != "static":
            self._budgets.clear()  # the controller moves the budget again: a hand budget no longer holds
        elif frozen and self.config.budget.mode != "static":
            # Frozen, the budget stays where the controller left it: kept with the freeze, so a
            # restart restores both (a trial's freeze came back at the start's budget, not its own)
            for b in self.backends:
                if b.controller is not None and b.capacity is not None:
                    self._budgets.setdefault(b.name, b.controller.budget)
        for b in self.backends:
            self.adopt(b)
        result = self._audit(operator, source, "freeze" if frozen else "unfreeze", "controller", old, frozen, note)
        self._keep()
        return result

    def set_budget_settings(self, *, operator: Operator, note: str = "", source: AuditSource = "console", **changes: Any) -> ActionResult:
        """Retune [budget]: min_tokens, slo_ttft_p95_ms, slo_tpot_p95_ms, window_s, cooldown_s..."""
        results = self.retune(Retune(settings=changes, note=note), operator=operator, source=source)
        return results[0] if results else _unchanged("set_budget_settings", "budget", changes)

    # ---- classes -----------------------------------------------------------

    def set_class(self, cls: str, *, operator: Operator, note: str = "", source: AuditSource = "console", **changes: Any) -> ActionResult:
        """Retune one class's shares and queue bounds."""
        self._class(cls)
        results = self.retune(Retune(cls=cls, class_changes=changes, note=note), operator=operator, source=source)
        return results[0] if results else _unchanged("set_class", f"class:{cls}", changes)

    def pause(self, cls: str, paused: bool, *, operator: Operator, note: str = "", source: AuditSource = "console") -> ActionResult:
        """Pause (refuse newcomers with 503 class_paused, hold the queue) or resume a class."""
        self._class(cls)
        old = cls in self.paused
        if paused:
            self.paused.add(cls)
        else:
            self.paused.discard(cls)
        for b in self._ready_admissions():
            b.gatekeeper.pause(cls, paused)
        result = self._audit(operator, source, "pause_class" if paused else "resume_class", f"class:{cls}", old, paused, note)
        self._keep()
        return result

    def drain(self, cls: str, *, operator: Operator, note: str = "", source: AuditSource = "console") -> ActionResult:
        """Refuse everything waiting in a class (503 drained with Retry-After)."""
        self._class(cls)
        waiting = self.queued(cls)
        refused = sum(b.gatekeeper.drain(cls) for b in self._ready_admissions())
        return self._audit(
            operator, source, "drain_class", f"class:{cls}", waiting, 0, note or f"{refused} request{'' if refused == 1 else 's'} refused"
        )

    def queued(self, cls: str) -> int:
        """How many requests of `cls` wait right now (what a drain would refuse)."""
        return sum(len(b.admission.queue(cls)) for b in self._ready_admissions())

    def adopt(self, backend: Backend) -> None:
        """Bring a backend's admission core and controller in line with the operator state."""
        if backend.gatekeeper is not None:
            for cls in backend.gatekeeper.admission.class_names:
                backend.gatekeeper.pause(cls, cls in self.paused)
        if backend.controller is not None:
            backend.controller.freeze() if self.frozen else backend.controller.unfreeze()
            tokens = self._pending_budgets.pop(backend.name, None)
            if tokens is not None:  # a restored hand budget, once the capacity is known
                self._restore_budget(backend, tokens)
            self.backends.warn(backend)  # frozen, the budget is held: what it leaves each class is said
        if backend.fleet is not None and backend.name in self._pending_pins:  # a restored pin, once its unit exists
            self._restore_pin(backend, self._pending_pins[backend.name], self._restorer, "gate")

    # ---- runtime overrides: kept beside the journal, restored at start ----------------

    def _keep(self) -> None:
        """Recompute the overrides in force (what differs from the file) and write them."""
        file, now = self.file_config, self.config
        settings = {
            f.name: getattr(now.budget, f.name)
            for f in dataclasses.fields(now.budget)
            if getattr(now.budget, f.name) != getattr(file.budget, f.name)
        }
        file_classes = {c.name: c for c in file.classes}
        classes: dict[str, dict[str, Any]] = {}
        for c in now.classes:
            base = file_classes.get(c.name)
            changed = {f: getattr(c, f) for f in CLASS_FIELDS if base is not None and getattr(c, f) != getattr(base, f)}
            if changed:
                classes[c.name] = changed
        # A budget set by hand holds only while the controller does not move it.
        holds = self.frozen or now.budget.mode == "static"
        self.overrides = Overrides(
            settings=settings,
            classes=classes,
            budgets=dict(self._budgets) if holds else {},
            paused=sorted(self.paused),
            frozen=self.frozen,
            pins=self._pins(),
        )
        self._save(quiet=False)

    def _save(self, *, quiet: bool) -> None:
        if self.overrides_path is None:
            return
        try:
            overrides_file.save(self.overrides_path, self.overrides)
        except OSError as exc:
            self._keep_failed_now = True
            if not quiet:
                log.error("runtime overrides NOT kept in %s (%s): a restart would revert them", self.overrides_path, exc)
            self.keep_error = f"{self.overrides_path}: {exc.strerror or exc}"
        else:
            self.keep_error = None

    def rewrite_if_gone(self) -> bool:
        """Write the overrides in force again when their file was deleted under the running gate
        (a trial's `rm tokengate.db*` took it with the journal: the next restart would have
        reverted them), or when the last write failed (a full or read-only disk: the operator
        was told once; freeing the disk brought the journal back, but the pause and freeze
        stayed unwritten until the next change, and a restart reverted them). The retry is
        quiet until it lands. True: written again."""
        if self.overrides_path is None:
            return False
        if self.keep_error is not None:
            failed = self.keep_error
            self._save(quiet=True)
            if self.keep_error is None:
                log.warning("runtime overrides kept again in %s (the last write failed: %s)", self.overrides_path, failed)
                return True
            return False
        if not self.overrides or os.path.exists(self.overrides_path):
            return False
        log.warning("runtime overrides %s were deleted while the gate ran: writing them again", self.overrides_path)
        self._keep()
        return self.keep_error is None

    def keep_beside(self, journal_path: str, *, operator: Operator) -> None:
        """The operator's runtime changes live beside the journal this gate holds (one gate per
        journal): kept from here on, and what the last run kept is re-applied now, before the
        gate listens, so no request is admitted under the file's values (even after SIGKILL).
        A gate that never starts (a test's) keeps nothing; neither does a journal in memory."""
        if journal_path == ":memory:":
            return
        self.overrides_path = overrides_file.path_for(journal_path)
        saved, why = overrides_file.load_or_why(self.overrides_path)
        if why is not None:  # the operator's pauses, freeze and retunes are not back: say so where they look
            self._audit(operator, "gate", "restore_refused", "overrides", None, None, why)
        saved, held = _not_in(saved, self.config)
        if held:
            # `tokengate overrides write` put them in the file, and the gate was killed before a
            # reload rewrote the overrides file: a trial's restart warned "restored
            # classes.interactive.queue_depth: 9 -> 9" of a value the file holds
            log.info(
                "runtime overrides in %s the config file now holds: %s (kept, nothing to restore)", self.overrides_path, "; ".join(held)
            )
        if saved:
            self.restore(saved, operator=operator)
            log.warning("restored runtime overrides from %s: %s", self.overrides_path, "; ".join(saved.lines()))
        elif held:
            self._keep()  # the overrides file says what is in force: nothing beyond the file

    def restore(self, saved: Overrides, *, operator: Operator, source: AuditSource = "gate") -> list[ActionResult]:
        """Re-apply the overrides a previous run kept, each with an audit row `restored`; what
        no longer applies (a class gone, a value the config now refuses) is audited
        `restore_refused` with the reason, and dropped."""
        results: list[ActionResult] = []
        self._restorer = operator  # also for hand budgets restored once their backend is ready
        new = self.config
        known = {f.name for f in dataclasses.fields(new.budget)}
        settings = {k: v for k, v in saved.settings.items() if k in known}
        changes: list[tuple[str, Any, Any]] = [(f"budget.{k}", getattr(new.budget, k), v) for k, v in sorted(settings.items())]
        if settings:
            new = dataclasses.replace(new, budget=dataclasses.replace(new.budget, **settings))
        names = set(new.class_names)
        classes = []
        for c in new.classes:
            wanted = {k: v for k, v in saved.classes.get(c.name, {}).items() if k in CLASS_FIELDS}
            changes += [(f"classes.{c.name}.{k}", getattr(c, k), v) for k, v in sorted(wanted.items())]
            classes.append(dataclasses.replace(c, **wanted) if wanted else c)
        new = dataclasses.replace(new, classes=tuple(sorted(classes, key=lambda c: (-c.priority, c.name))))
        gone = [c for c in (*saved.classes, *saved.paused) if c not in names]
        if gone:
            results.append(
                self._audit(
                    operator, source, "restore_refused", "overrides", ", ".join(sorted(set(gone))), None, "classes no longer in the config"
                )
            )
        if changes:
            try:
                self._validated(new)
            except CommandError as exc:
                results.append(
                    self._audit(
                        operator, source, "restore_refused", "overrides", ", ".join(_pair(k, v) for k, _, v in changes), None, str(exc)
                    )
                )
            else:
                self._apply_classes(new)  # the budget too, after the classes (their reservations set its floor)
                for key, before, after in changes:
                    results.append(self._audit(operator, source, "restored", key, before, after, "kept from the last run"))
        for cls in saved.paused:
            if cls in names and cls not in self.paused:
                self.paused.add(cls)
                for b in self._ready_admissions():
                    if b.gatekeeper is not None:
                        b.gatekeeper.pause(cls, True)
                results.append(self._audit(operator, source, "restored", f"class:{cls}", "running", "paused", "kept from the last run"))
        if saved.frozen and not self.frozen:
            self.frozen = True
            for b in self.backends:
                self.adopt(b)
            results.append(self._audit(operator, source, "restored", "controller", "adaptive", "frozen", "kept from the last run"))
        for name, tokens in sorted(saved.budgets.items()):
            backend = self.backends.by_name(name)
            if backend is None:
                continue
            if backend.controller is None:
                self._pending_budgets[name] = tokens
            else:
                results.append(self._restore_budget(backend, tokens))
        results += self._restore_pins(saved.pins, operator, source)
        self._keep()
        return results

    def _restore_pins(self, pins: dict[str, bool], operator: Operator, source: AuditSource) -> list[ActionResult]:
        """The router models pinned or unpinned by the last run: now where the unit exists, else
        once the router is first seen (`adopt`); a model no longer configured is refused."""
        results: list[ActionResult] = []
        units = {u.name: u for f in self.backends.fleets for u in f.units.values()}
        configured = {f"{b.name}/{m}" for b in self.backends.configured for m in b.config.models}
        gone = []
        for name, pinned in sorted(pins.items()):
            if name in units:
                done = self._restore_pin(units[name], pinned, operator, source)
                if done is not None:
                    results.append(done)
            elif name in configured:
                self._pending_pins[name] = pinned
            else:
                gone.append(name)
        if gone:
            results.append(
                self._audit(operator, source, "restore_refused", "overrides", ", ".join(gone), None, "models no longer in the config")
            )
        return results

    def _restore_budget(self, backend: Backend, tokens: int) -> ActionResult:
        assert backend.controller is not None
        low, high = backend.controller.min_tokens, backend.controller.ceiling_tokens
        note = "kept from the last run"
        if not low <= tokens <= high:
            note += f"; {tokens} clamped into [{low}, {high}]"
        move = backend.controller.set_budget(self.clock(), min(max(tokens, low), high))
        self._budgets[backend.name] = move.new_budget
        result = self._audit(self._restorer, "gate", "restored", f"backend:{backend.name}", move.old_budget, move.new_budget, note)
        self._keep()
        return result

    _restorer = Operator("tokengate", "local")

    def drop_overrides(self, *, operator: Operator, note: str = "", source: AuditSource = "console") -> ActionResult:
        """Back to the config file: every runtime override dropped, in one audited step."""
        dropped = self.overrides.lines()
        # the budgets an operator's word holds (set by hand while frozen or static, or frozen where
        # the controller left them): back to where the file starts them
        held = {name for name in self._budgets if self.frozen or self.config.budget.mode == "static"}
        self._apply_classes(self.file_config)  # the budget too, after the classes (their reservations set its floor)
        for cls in sorted(self.paused):
            self.paused.discard(cls)
            for b in self._ready_admissions():
                if b.gatekeeper is not None:
                    b.gatekeeper.pause(cls, False)
        self.frozen = False
        budgets = []
        for b in self.backends:
            self.adopt(b)
            if b.name in held and b.controller is not None and b.capacity is not None:
                # As a fresh start sets it: the ceiling, which is [[backends]] token_budget where set.
                # Unset, a trial's budget set by hand (1500, frozen) stayed 1500 on /metrics against
                # a ceiling of 2048 after "back to the config file", until traffic moved the controller.
                move = b.controller.set_budget(self.clock(), b.capacity.ceiling)
                start = "token_budget" if b.config.token_budget is not None else "the ceiling"
                budgets.append(f"budget {move.old_budget} -> {move.new_budget} on {b.name} ({start}, as at start)")
        self._budgets.clear()
        self._pending_budgets.clear()
        self._pending_pins.clear()
        for fleet in self._model_fleets():  # the file's pins
            for model in fleet.units:
                if (model in fleet.pins) != (model in fleet.parent.config.pin):
                    model_ops.pin(fleet, model, model in fleet.parent.config.pin)
        self._keep()
        return self._audit(
            operator,
            source,
            "overrides_dropped",
            "overrides",
            "; ".join(dropped) or None,
            "; ".join(budgets) or None,
            note or ("back to the config file" if dropped else "none were in force"),
        )

    # ---- reload --------------------------------------------------------------

    def reload(self, new_config: Config, *, operator: Operator, source: AuditSource = "signal", note: str = "") -> list[ActionResult]:
        """Apply a re-read config file: classes and [budget] live; backends and tenants need a restart."""
        old = self.config
        if tuple(old.backends) != tuple(new_config.backends) or old.gate != new_config.gate:
            keys = _changed_keys("gate", old.gate, new_config.gate)
            if len(old.backends) != len(new_config.backends):
                keys.append(f"[[backends]] ({len(old.backends)} -> {len(new_config.backends)} tables)")
            else:
                for i, (a, b) in enumerate(zip(old.backends, new_config.backends)):
                    keys += _changed_keys(f"backends[{i}]", a, b)
            raise CommandError(f"{', '.join(keys)} changed: [gate] and [[backends]] need a restart of tokengate")
        if old.tenants != new_config.tenants:
            # which key (a trial raised one tenant's requests_per_minute and read only "keys are
            # read at start"); names, not values: a tenant's key digest stays out of the audit
            if len(old.tenants) != len(new_config.tenants):
                changed = [f"[[tenants]] ({len(old.tenants)} -> {len(new_config.tenants)} tables)"]
            else:
                changed = [
                    k
                    for i, (a, b) in enumerate(zip(old.tenants, new_config.tenants))
                    for k in _changed_keys(f"tenants[{i}]", a, b, values=False)
                ]
            raise CommandError(
                f"{', '.join(changed)} changed: [[tenants]] are read at start (their keys from the environment), "
                "so restart tokengate to apply; nothing else in the file was applied either"
            )
        if old.shared != new_config.shared:
            # which key (a trial changed failure_policy and read only "[shared] changed"); the
            # URL by name only: its password may be what changed
            changed = [
                f.name if f.name == "redis_url" else f"{f.name} ({_fmt(before)} -> {_fmt(after)})"
                for f in dataclasses.fields(old.shared)
                if (before := getattr(old.shared, f.name)) != (after := getattr(new_config.shared, f.name))
            ]
            raise CommandError(
                f"[shared] {', '.join(changed)} changed: restart tokengate to apply (each gate of the fleet, one at a "
                "time); nothing else in the file was applied either"
            )
        if {c.name for c in old.classes} != {c.name for c in new_config.classes}:
            raise CommandError("classes were added or removed: restart tokengate to apply")
        self._validated(new_config)
        if new_config == self.file_config and self.overrides.lines():
            # the file as it was read: nothing of it to apply, and the runtime overrides stay. A
            # terminal hang-up is a SIGHUP too: closing the tmux session a gate ran in replaced
            # the operator's retunes with the file's values (a trial); `overrides drop` goes back
            # to the file
            kept = "; ".join(self.overrides.lines())
            log.info("reload: the file is unchanged since it was read; the runtime overrides stay in force: %s", kept)
            what = f"the file is unchanged since it was read: the runtime overrides stay in force ({kept}; `tokengate overrides drop` goes back to the file)"
            return [self._audit(operator, source, "reload", "config", None, None, f"{what}: {note}" if note else what)]
        results = []
        for key, before, after in _config_diff(old, new_config):
            results.append(self._audit(operator, source, "reload", key, before, after, note))
        replaced = [*self.overrides.lines()[: len(self.overrides.settings) + sum(map(len, self.overrides.classes.values()))]]
        self.file_config = new_config
        self._apply_classes(new_config)  # the budget too, after the classes (their reservations set its floor)
        if not results:  # said as such (a trial read "config: None -> None (1 changes audited)")
            # the file may now say what the runtime overrides said: nothing in force moves, yet
            # the file changed (a trial read "no changes" beside a new digest)
            what = "no changes in force: the file now holds the overridden values" if replaced else "no changes"
            results.append(self._audit(operator, source, "reload", "config", None, None, f"{what}: {note}" if note else what))
        self._keep()
        if replaced:
            kept = "; ".join(self.overrides.lines()) or "none"
            log.warning("reload replaced runtime overrides with the file's values: %s (still in force: %s)", ", ".join(replaced), kept)
            results.append(
                self._audit(
                    operator,
                    source,
                    "overrides_replaced",
                    "overrides",
                    "; ".join(replaced),
                    None,
                    f"the file's values now; still in force: {kept}",
                )
            )
        return results

    def reload_file(self, config_path: str | None, *, operator: Operator, source: AuditSource = "signal") -> bool:
        """Re-read the config file and apply it; a refusal changes nothing and is audited with its reason."""
        if config_path is None:
            log.warning("reload: no --config file to re-read")
            self._audit(operator, source, "reload_refused", "gate", None, None, "no --config file to re-read")
            return False
        try:
            new_config = load_config(config_path)
            results = self.reload(new_config, operator=operator, source=source, note=f"{config_path} {config_digest(new_config)}")
        except (ConfigError, CommandError) as exc:
            log.error("reload refused, nothing changed: %s", exc)
            # a config error starts with the file's name already ("tg.toml: tg.toml: ..." otherwise)
            note = str(exc) if str(exc).startswith(f"{config_path}:") else f"{config_path}: {exc}"
            self._audit(operator, source, "reload_refused", "gate", None, None, note)
            return False
        changed = [r for r in results if r.action == "reload" and r.target != "config"]  # ("reload", "config"): no changes
        adopted = "; the runtime overrides are the file's values now" if any(r.action == "overrides_replaced" for r in results) else ""
        log.info("reloaded %s (%s%s)", config_path, f"{len(changed)} changes audited" if changed else "no changes in force", adopted)
        return True

    # ---- internals -----------------------------------------------------------

    def _validated(self, config: Config) -> Config:
        try:
            validate_config(config, "retune")
        except ConfigError as exc:
            raise CommandError(f"{exc.key}: {exc.problem}") from None
        return config

    def _apply_budget(self, config: Config) -> None:
        self.config = config
        self.backends.set_budget_config(config.budget)
        now = self.clock()
        for b in self._ready_admissions():
            # A router's model before its first load has no capacity yet: its core's stands in.
            ceiling = b.capacity.ceiling if b.capacity is not None else b.admission.capacity.ceiling
            settings = controller_settings(config.budget, ceiling, reserved_total(config.classes, ceiling))
            # every [budget] tuning key, not the SLOs alone: a retune (or reload) of window_s,
            # min_samples, cooldown_s, increase or decrease was audited and kept as an override
            # while the running controller went on with the values it started with
            b.controller.set_tuning(settings)
            b.controller.set_bounds(now, settings.min_tokens)  # a clamped budget is pushed to admission
            # ... and what the core and the gatekeeper read of [budget] themselves (#24: a retune of
            # slo_ttft_p95_ms moved only the controller's SLO, not the objective of the classes
            # without their own nor the prefill cap derived from it; aging_s reached nothing)
            b.admission.aging_s = config.budget.aging_s or None
            b.admission.keep_slots = config.budget.keep_slots
            b.admission.default_ttft_objective_ms = config.budget.slo_ttft_p95_ms
            b.gatekeeper.slo_ttft_s = config.budget.slo_ttft_p95_ms / 1000.0

    def _apply_classes(self, config: Config) -> None:
        self.config = config
        self.backends.set_classes(config.classes)
        for b in self._ready_admissions():
            for c in config.classes:
                b.gatekeeper.set_policy(c)
        # the controller's floor follows the reservations in force (an auto floor is at least
        # them, R0): a retune of reserved_tokens left the floor the old reservations gave
        self._apply_budget(config)

    def _class(self, cls: str) -> ClassConfig:
        try:
            return self.config.class_by_name(cls)
        except KeyError:
            raise CommandError(f"unknown class {cls!r}; classes: {', '.join(self.config.class_names)}") from None

    def _backends(self, name: str | None) -> list[Backend]:
        if name is None:
            return list(self.backends)
        backend = self.backends.by_name(name)
        if backend is None:
            raise CommandError(f"unknown backend {name!r}")
        return [backend]

    def _ready_admissions(self) -> list[Core]:
        return cores(self.backends)

    def _scaled(self, cls: str) -> str:
        """Where R0 scales `cls`'s reservation down, what is in force, per backend: the audit row
        and the toast said only the configured value (a user's trial of R0)."""
        configured = self.config.class_by_name(cls).reserved_tokens
        scaled = [f"{b.name} {b.admission.reserved(cls)}" for b in self._ready_admissions() if b.admission.reserved(cls) != configured]
        return f"in force (R0: half the ceiling): {', '.join(scaled)}" if scaled else ""

    def _audit(self, operator: Operator, source: AuditSource, action: str, target: str, old: Any, new: Any, note: str) -> ActionResult:
        record = AuditRecord(
            ts=time.time(),
            operator=operator.name,
            origin=operator.origin,
            source=source,
            action=action,
            target=target,
            old_value=_fmt(old),
            new_value=_fmt(new),
            note=note,
        )
        self.audit(record)
        message = describe(action, target, record.old_value, record.new_value)
        if note and action.startswith("model_"):
            message += f" ({note})"  # what a model action does: "evicts tiny"
        return ActionResult(action, target, record.old_value, record.new_value, message)


def _ceiling_advice(b: Backend, ceiling: int) -> str:
    """What sets a backend's ceiling, and what raises it: the config's token_budget (a restart),
    or the KV pool the gate learned from llama-server (a larger context there)."""
    cap, configured = b.capacity, b.config.token_budget
    if configured is not None and configured == ceiling:
        said = f"the ceiling is this backend's token_budget = {configured} in the config ([[backends]]); a larger one raises it on a restart of tokengate (a reload does not change [[backends]])"
        if cap is not None and cap.pool is not None and cap.pool <= configured:
            said += f"; llama-server's KV pool is {cap.pool} tokens, so above that it also takes a llama-server with a larger context (-c)"
        return said
    if cap is not None and cap.ceiling == ceiling:
        kv = f"{b.layout.kv} KV, " if b.layout is not None else ""
        return (
            f"the ceiling is llama-server's KV pool as the gate learned it ({kv}{cap.slots} slot{'' if cap.slots == 1 else 's'} of {cap.slot_context} tokens): "
            "a budget above it would admit more than the cache holds; a llama-server restarted with a larger context (-c) "
            "raises it (the gate learns it on its next probe)"
        )
    return "the ceiling is provisional until the backend reports its capacity (a router's model: when it loads)"


def _floor_advice(tokens: int, floor: int, min_tokens: int, reserved: int) -> str:
    """What sets the budget's floor, and what lowers it."""
    if tokens < reserved:
        then = ", then budget.min_tokens" if min_tokens else ""
        return f"the classes reserve {reserved} tokens in all: lower their reserved_tokens first{then}"
    if min_tokens:
        clamped = "" if floor == min_tokens else f" (clamped to the ceiling {floor})"
        return f"the floor is budget.min_tokens {min_tokens}{clamped}: lower budget.min_tokens first to go below it"
    return (
        f"budget.min_tokens is 0 (auto), so the floor {floor} is a quarter of the ceiling: set budget.min_tokens to {tokens} or lower first"
    )


#: GateConfig's fields that the one TOML key `[gate] listen` sets
_LISTEN_FIELDS = ("listen_host", "listen_port", "listen_also")


def _not_in(saved: Overrides, config: Config) -> tuple[Overrides, tuple[str, ...]]:
    """`saved` without the [budget] and class settings `config` already holds, and the lines of
    those (`key=value`): restoring one changes nothing."""
    differs: dict[str, Any] = {}
    held = Overrides()
    for k, v in saved.settings.items():
        (differs if getattr(config.budget, k, object()) != v else held.settings)[k] = v
    in_file = {c.name: c for c in config.classes}
    classes: dict[str, dict[str, Any]] = {}
    for cls, changes in saved.classes.items():
        base = in_file.get(cls)
        for k, v in changes.items():
            same = base is not None and getattr(base, k, object()) == v
            (held.classes if same else classes).setdefault(cls, {})[k] = v
    return dataclasses.replace(saved, settings=differs, classes=classes), held.lines()


def _listen_text(gate: Any) -> str:
    """`[gate] listen` as the file writes it: "host:port", or the list of them."""
    if not gate.listen_also:
        return str(gate.listen)
    return "[" + ", ".join([gate.listen, *gate.listen_also]) + "]"


def _changed_keys(prefix: str, old: Any, new: Any, *, values: bool = True) -> list[str]:
    """`prefix.key (old -> new)` for each key that differs, named as the file names it (a
    trial's reload refusal named `gate.listen_port`, a key no file has: `gate.listen`);
    `prefix.key` alone without ``values`` (a tenant's key digest stays out of the audit)."""
    out = []
    if prefix == "gate" and any(getattr(old, f) != getattr(new, f) for f in _LISTEN_FIELDS):
        out.append(f"gate.listen ({_listen_text(old)} -> {_listen_text(new)})" if values else "gate.listen")
    for f in dataclasses.fields(old):
        if (prefix == "gate" and f.name in _LISTEN_FIELDS) or getattr(old, f.name) == getattr(new, f.name):
            continue
        key = f"{prefix}.{'class' if f.name == 'class_name' else f.name}"  # a tenant's TOML key `class`
        out.append(f"{key} ({_fmt(getattr(old, f.name))} -> {_fmt(getattr(new, f.name))})" if values else key)
    return out


def _replaced(obj: Any, changes: Mapping[str, Any]) -> Any:
    try:
        return dataclasses.replace(obj, **changes)
    except TypeError as exc:
        raise CommandError(str(exc)) from None


def _unchanged(action: str, target: str, changes: Mapping[str, Any]) -> ActionResult:
    """What a retune that changed nothing answers (and audits nothing)."""
    value = _diff_new(changes)
    return ActionResult(action, target, value, value, f"{target}: {value} already in force, nothing changed")


def _pair(key: str, value: Any, slo_ms: float | None = None) -> str:
    """`key=value` as an audit row and a toast say it: an unset value is `none`, as `--set` and
    the what-if's form write it (a trial's toast read "ttft_objective_ms=None"). `slo_ms`: for
    people, an unset ttft_objective_ms says what holds instead, "none (2000 from slo_ttft_p95_ms)"."""
    if value is None and key == "ttft_objective_ms" and slo_ms is not None:
        return f"{key}=none ({_fmt(slo_ms)} from slo_ttft_p95_ms)"
    return f"{key}={'none' if value is None else _fmt(value)}"


def _diff_old(obj: Any, changes: Mapping[str, Any], *, slo_ms: float | None = None) -> str:
    """The old values as `k=v, k=v`; `slo_ms`: said after an unset ttft_objective_ms (for people)."""
    return ", ".join(_pair(k, getattr(obj, k), slo_ms) for k in sorted(changes))


def _diff_new(changes: Mapping[str, Any], *, slo_ms: float | None = None) -> str:
    return ", ".join(_pair(k, v, slo_ms) for k, v in sorted(changes.items()))


def _objective_in_force(current: ClassConfig, changes: Mapping[str, Any], old_slo_ms: float, new_slo_ms: float) -> str:
    """A set_class row's note when its ttft_objective_ms goes from or to unset: the objective
    that held or will hold, [budget] slo_ttft_p95_ms ("" when neither side is unset)."""
    if "ttft_objective_ms" not in changes:
        return ""
    said = []
    if current.ttft_objective_ms is None:
        said.append(f"ttft_objective_ms was none: {_fmt(old_slo_ms)} from [budget] slo_ttft_p95_ms in force")
    if changes["ttft_objective_ms"] is None:
        said.append(f"ttft_objective_ms none: {_fmt(new_slo_ms)} from [budget] slo_ttft_p95_ms in force")
    return "; ".join(said)


def _config_diff(old: Config, new: Config) -> list[tuple[str, str | None, str | None]]:
    """(key, old, new) for every changed [budget] and class setting."""
    out = []
    for f in dataclasses.fields(old.budget):
        a, b = getattr(old.budget, f.name), getattr(new.budget, f.name)
        if a != b:
            out.append((f"budget.{f.name}", _fmt(a), _fmt(b)))
    new_classes = {c.name: c for c in new.classes}
    for c in old.classes:
        # every setting a reload applies, not only those a live retune may set (CLASS_FIELDS):
        # ttft_objective_ms and fallback took effect unaudited (a user's trial, 2026-12-05)
        for name in _RELOADED_CLASS_FIELDS:
            a, b = getattr(c, name), getattr(new_classes[c.name], name)
            if a != b:
                out.append((f"classes.{c.name}.{name}", _fmt(a), _fmt(b)))
    if old.default_class != new.default_class:
        out.append(("default_class", old.default_class, new.default_class))
    return out
