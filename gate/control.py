"""Operator actions: the console's (and SIGHUP's) only way to change the gate.

Every action validates first and changes nothing when invalid (ControlError
with a message fit for a toast), applies atomically, and writes an audit row
with the operator, their SSH origin, the old and the new value.
"""

from __future__ import annotations

import dataclasses
import getpass
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gate.config import ClassConfig, Config, ConfigError, validate_config
from gate.records import AuditRecord, AuditSource

if TYPE_CHECKING:
    from gate.backends import Backend
    from gate.service import GateService

CLASS_FIELDS = ("reserved_tokens", "limit_tokens", "queue_depth", "queue_timeout_s", "default_max_tokens", "max_tokens_cap", "priority")


class ControlError(ValueError):
    """An operator action was refused; nothing changed."""


@dataclass(frozen=True, slots=True)
class Operator:
    name: str
    origin: str

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> Operator:
        """Who is at the keyboard: SUDO_USER over USER, and the SSH client address or "local"."""
        env = os.environ if environ is None else environ
        name = env.get("SUDO_USER") or env.get("USER") or env.get("LOGNAME")
        if not name:
            try:
                name = getpass.getuser()
            except Exception:  # noqa: BLE001 - no passwd entry in some containers
                name = "unknown"
        ssh = env.get("SSH_CONNECTION") or env.get("SSH_CLIENT") or ""
        origin = ssh.split()[0] if ssh.split() else "local"
        return cls(name, origin)


@dataclass(frozen=True, slots=True)
class ActionResult:
    """What an action did, for the toast."""

    action: str
    target: str
    old_value: str | None
    new_value: str | None
    message: str


def _fmt(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


class Control:
    """The gate's control API; `source` says who drives it (console, config, signal)."""

    def __init__(self, gate: GateService) -> None:
        self.gate = gate

    # ---- budget and controller ---------------------------------------------

    def set_budget(self, tokens: int, *, operator: Operator, backend: str | None = None, note: str = "", source: AuditSource = "console") -> list[ActionResult]:
        """Set the working budget by hand (one backend or all)."""
        targets = self._backends(backend)
        for b in targets:
            if b.controller is None or b.admission is None:
                raise ControlError(f"backend {b.name!r} is {b.state}: its capacity is not known yet")
            if not b.controller.min_tokens <= tokens <= b.controller.ceiling_tokens:
                raise ControlError(
                    f"budget {tokens} is outside [{b.controller.min_tokens}, {b.controller.ceiling_tokens}] "
                    f"for backend {b.name!r} (lower budget.min_tokens first to go below it)"
                )
        results = []
        now = self.gate.clock()
        for b in targets:
            move = b.controller.set_budget(now, tokens)
            b.admission.set_budget(move.new_budget)
            b.gatekeeper.advance()
            results.append(self._audit(operator, source, "set_budget", f"backend:{b.name}", move.old_budget, move.new_budget, note))
        return results

    def freeze(self, frozen: bool, *, operator: Operator, note: str = "", source: AuditSource = "console") -> ActionResult:
        """Stop (or restart) the adaptive controller's own moves on every backend."""
        controllers = [b.controller for b in self.gate.backends if b.controller is not None]
        old = any(c.frozen for c in controllers) if controllers else self.gate.frozen
        for c in controllers:
            c.freeze() if frozen else c.unfreeze()
        self.gate.frozen = frozen
        return self._audit(operator, source, "freeze" if frozen else "unfreeze", "controller", old, frozen, note)

    def set_budget_settings(self, *, operator: Operator, note: str = "", source: AuditSource = "console", **changes: Any) -> ActionResult:
        """Retune [budget]: min_tokens, slo_ttft_p95_ms, slo_tpot_p95_ms, window_s, cooldown_s..."""
        unknown = set(changes) - {f.name for f in dataclasses.fields(self.gate.config.budget)}
        if unknown:
            raise ControlError(f"unknown budget setting(s): {', '.join(sorted(unknown))}")
        old = self.gate.config.budget
        new_config = self._validated(dataclasses.replace(self.gate.config, budget=dataclasses.replace(old, **changes)))
        self._apply_budget(new_config)
        return self._audit(operator, source, "set_budget_settings", "budget", _diff_old(old, changes), _diff_new(changes), note)

    # ---- classes -----------------------------------------------------------

    def set_class(self, cls: str, *, operator: Operator, note: str = "", source: AuditSource = "console", **changes: Any) -> ActionResult:
        """Retune one class's shares and queue bounds."""
        current = self._class(cls)
        unknown = set(changes) - set(CLASS_FIELDS)
        if unknown:
            raise ControlError(f"unknown class setting(s): {', '.join(sorted(unknown))}")
        updated = dataclasses.replace(current, **changes)
        classes = tuple(updated if c.name == cls else c for c in self.gate.config.classes)
        new_config = self._validated(dataclasses.replace(self.gate.config, classes=tuple(sorted(classes, key=lambda c: (-c.priority, c.name)))))
        self._apply_classes(new_config)
        return self._audit(operator, source, "set_class", f"class:{cls}", _diff_old(current, changes), _diff_new(changes), note)

    def pause(self, cls: str, paused: bool, *, operator: Operator, note: str = "", source: AuditSource = "console") -> ActionResult:
        """Pause (refuse newcomers with 503 class_paused, hold the queue) or resume a class."""
        self._class(cls)
        old = cls in self.gate.paused_classes
        if paused:
            self.gate.paused_classes.add(cls)
        else:
            self.gate.paused_classes.discard(cls)
        for b in self._ready_admissions():
            b.admission.pause(cls) if paused else b.admission.resume(cls)
            b.gatekeeper.advance()
        return self._audit(operator, source, "pause_class" if paused else "resume_class", f"class:{cls}", old, paused, note)

    def drain(self, cls: str, *, operator: Operator, note: str = "", source: AuditSource = "console") -> ActionResult:
        """Refuse everything waiting in a class (503 drained with Retry-After)."""
        self._class(cls)
        waiting = self.queued(cls)
        refused = sum(b.gatekeeper.drain(cls) for b in self._ready_admissions())
        return self._audit(operator, source, "drain_class", f"class:{cls}", waiting, 0, note or f"{refused} requests refused")

    def queued(self, cls: str) -> int:
        """How many requests of `cls` wait right now (what a drain would refuse)."""
        return sum(len(b.admission.queue(cls)) for b in self._ready_admissions())

    # ---- reload --------------------------------------------------------------

    def reload(self, new_config: Config, *, operator: Operator, source: AuditSource = "signal", note: str = "") -> list[ActionResult]:
        """Apply a re-read config file: classes and [budget] live; backends and tenants need a restart."""
        old = self.gate.config
        if _listing(old.backends) != _listing(new_config.backends) or old.gate != new_config.gate:
            raise ControlError("[gate] or [[backends]] changed: restart tokengate to apply those")
        if old.tenants != new_config.tenants:
            raise ControlError("[[tenants]] changed: restart tokengate to apply (keys are read at start)")
        if {c.name for c in old.classes} != {c.name for c in new_config.classes}:
            raise ControlError("classes were added or removed: restart tokengate to apply")
        self._validated(new_config)
        results = []
        for key, before, after in _config_diff(old, new_config):
            results.append(self._audit(operator, source, "reload", key, before, after, note))
        self._apply_budget(new_config)
        self._apply_classes(new_config)
        if not results:
            results.append(self._audit(operator, source, "reload", "config", None, None, note or "no changes"))
        return results

    # ---- internals -----------------------------------------------------------

    def _validated(self, config: Config) -> Config:
        try:
            validate_config(config, "retune")
        except ConfigError as exc:
            raise ControlError(f"{exc.key}: {exc.problem}") from None
        return config

    def _apply_budget(self, config: Config) -> None:
        from gate.backends import controller_settings

        self.gate.config = config
        self.gate.backends.set_budget_config(config.budget)
        now = self.gate.clock()
        for b in self._ready_admissions():
            settings = controller_settings(config.budget, b.capacity.ceiling)
            b.controller.set_slos(settings.slo_ttft_p95_s, settings.slo_tpot_p95_s)
            b.controller.set_bounds(now, settings.min_tokens)
            b.admission.set_budget(b.controller.budget)
            b.gatekeeper.advance()

    def _apply_classes(self, config: Config) -> None:
        self.gate.config = config
        self.gate.backends.set_classes(config.classes)
        for b in self._ready_admissions():
            for c in config.classes:
                b.admission.set_policy(c)
            b.gatekeeper.advance()

    def _class(self, cls: str) -> ClassConfig:
        try:
            return self.gate.config.class_by_name(cls)
        except KeyError:
            raise ControlError(f"unknown class {cls!r}; classes: {', '.join(self.gate.config.class_names)}") from None

    def _backends(self, name: str | None) -> list[Backend]:
        if name is None:
            return list(self.gate.backends)
        backend = self.gate.backends.by_name(name)
        if backend is None:
            raise ControlError(f"unknown backend {name!r}")
        return [backend]

    def _ready_admissions(self) -> list[Backend]:
        return [b for b in self.gate.backends if b.admission is not None]

    def _audit(self, operator: Operator, source: AuditSource, action: str, target: str, old: Any, new: Any, note: str) -> ActionResult:
        record = AuditRecord(
            ts=time.time(), operator=operator.name, origin=operator.origin, source=source, action=action,
            target=target, old_value=_fmt(old), new_value=_fmt(new), note=note,
        )
        self.gate.audit(record)
        message = f"{action} {target}: {record.old_value} -> {record.new_value}"
        return ActionResult(action, target, record.old_value, record.new_value, message)


def _diff_old(obj: Any, changes: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={_fmt(getattr(obj, k))}" for k in sorted(changes))


def _diff_new(changes: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={_fmt(v)}" for k, v in sorted(changes.items()))


def _listing(backends) -> tuple:
    return tuple(backends)


def _config_diff(old: Config, new: Config) -> list[tuple[str, str | None, str | None]]:
    """(key, old, new) for every changed [budget] and class setting."""
    out = []
    for f in dataclasses.fields(old.budget):
        a, b = getattr(old.budget, f.name), getattr(new.budget, f.name)
        if a != b:
            out.append((f"budget.{f.name}", _fmt(a), _fmt(b)))
    new_classes = {c.name: c for c in new.classes}
    for c in old.classes:
        for f in CLASS_FIELDS:
            a, b = getattr(c, f), getattr(new_classes[c.name], f)
            if a != b:
                out.append((f"classes.{c.name}.{f}", _fmt(a), _fmt(b)))
    if old.default_class != new.default_class:
        out.append(("default_class", old.default_class, new.default_class))
    return out
