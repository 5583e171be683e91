"""Operator commands and their results: plain, versioned data that crosses a GateLink.

A console (embedded or attached over the control socket) changes the gate only by
sending one of these; `gate.control.Control.execute` validates the command as a
whole and applies it atomically, or refuses it and changes nothing. On the wire a
command is a dict with an "op" key (`to_wire` / `from_wire`), so a console of
another version gets a clear refusal instead of a half-understood action.
"""

from __future__ import annotations

import dataclasses
import getpass
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

COMMAND_VERSION = 1


class CommandError(ValueError):
    """A command was refused; nothing changed. The message is fit for a toast."""


@dataclass(frozen=True, slots=True)
class Pause:
    """Pause (new requests get 503 class_paused, the queue is held) or resume a class."""

    cls: str
    paused: bool
    note: str = ""
    op = "pause"


@dataclass(frozen=True, slots=True)
class Drain:
    """Refuse everything queued in a class (503 drained with Retry-After)."""

    cls: str
    note: str = ""
    op = "drain"


@dataclass(frozen=True, slots=True)
class Freeze:
    """Stop (or restart) the adaptive controller's own budget moves."""

    frozen: bool
    note: str = ""
    op = "freeze"


@dataclass(frozen=True, slots=True)
class Retune:
    """Budget, [budget] settings and one class's settings: applied completely or not at all."""

    budget: int | None = None  # the working budget of every backend
    settings: dict[str, Any] = field(default_factory=dict)  # [budget] keys: min_tokens, slo_ttft_p95_ms, ...
    cls: str | None = None
    class_changes: dict[str, Any] = field(default_factory=dict)  # [classes.cls] keys
    note: str = ""
    #: also freeze (True) or unfreeze (False) the adaptive controller, in the same step: a
    #: budget set by hand then stays until the operator unfreezes
    freeze: bool | None = None
    op = "retune"

    def __bool__(self) -> bool:
        return self.budget is not None or bool(self.settings) or bool(self.class_changes) or self.freeze is not None


MODEL_ACTIONS = ("load", "unload", "pin", "unpin")


@dataclass(frozen=True, slots=True)
class ModelAction:
    """Router mode: load, unload, pin (keep loaded, never evict) or unpin one model."""

    model: str
    action: str  # one of MODEL_ACTIONS
    note: str = ""
    op = "model"


@dataclass(frozen=True, slots=True)
class DropOverrides:
    """Back to the config file: drop every runtime override (retunes, hand budgets, pauses,
    the freeze, router models pinned or unpinned) that a restart would otherwise restore."""

    note: str = ""
    op = "drop_overrides"


Command = Pause | Drain | Freeze | Retune | ModelAction | DropOverrides
_BY_OP: dict[str, type[Command]] = {c.op: c for c in (Pause, Drain, Freeze, Retune, ModelAction, DropOverrides)}


@dataclass(frozen=True, slots=True)
class ActionResult:
    """One changed value, as audited; `message` is what a toast says."""

    action: str
    target: str
    old_value: str | None
    new_value: str | None
    message: str


def _plural(n: str | None, word: str) -> str:
    return f"{n} {word}" + ("" if n == "1" else "s")


def describe(action: str, target: str, old: str | None, new: str | None, note: str = "") -> str:
    """An audited change in plain words, for toasts: what changed and what it does to
    requests (the status and reason codes are those of gate/core/reasons.py)."""
    name = target.split(":", 1)[-1]
    if action == "pause_class":
        return f"Paused {name}: new requests get 503 class_paused; queued ones wait until it is resumed"
    if action == "resume_class":
        return f"Resumed {name}: admitting its requests again"
    if action == "drain_class":
        return f"Drained {name}: {_plural(old, 'queued request')} refused with 503 drained"
    if action == "freeze":
        return "Froze the controller: the budget stays where it is until unfrozen"
    if action == "unfreeze":
        return "Unfroze the controller: it moves the budget with latency again"
    if action == "set_budget":
        return f"Budget of {name}: {old} -> {new} tokens"
    if action == "set_budget_settings":
        return f"Budget settings: {old} -> {new}"
    if action == "set_class":
        return f"Class {name}: {old} -> {new}"
    if action == "model_load":
        return f"Loading {name}: its requests queue in the gate until it is loaded"
    if action == "model_unload":
        return f"Unloaded {name}: its next request loads it again"
    if action == "model_pin":
        return f"Pinned {name}: kept loaded, never evicted for another model"
    if action == "model_unpin":
        return f"Unpinned {name}: it may be evicted once idle"
    if action == "model_loaded":
        return f"{name} loaded"
    if action == "model_evict":
        return f"Evicted {name} to load another model"
    if action == "model_failed":
        return f"{name} failed: its requests get 503 model_unavailable until it is loaded again"
    if action == "restored":
        return f"Restored {name} from the last run: {old} -> {new}"
    if action == "overrides_dropped":
        if not old:
            return "No runtime overrides were in force"
        return f"Dropped the runtime overrides ({old}): back to the config file" + (f"; {new}" if new else "")
    if action == "reload" and target == "config":
        return "Reloaded the config file: no changes"
    if action == "reload":
        return f"Reloaded {target} from the config file: {old} -> {new}"
    if action == "reload_refused":
        return "Config reload refused: nothing changed, the settings in force stay"
    if action == "overrides_replaced":
        return f"The reload replaced runtime overrides with the file's values: {old}"
    what = f"{action} {target}"
    if old is not None or new is not None:
        what += f": {old} -> {new}"
    return what + (f" ({note})" if note else "")


@dataclass(frozen=True, slots=True)
class Operator:
    """Who acts: a user name and where they came from ("local" or an SSH client address)."""

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
        return cls(name, ssh_origin(env))


def ssh_origin(environ: Mapping[str, str]) -> str:
    """The SSH client's address from SSH_CONNECTION / SSH_CLIENT, or "local"."""
    ssh = (environ.get("SSH_CONNECTION") or environ.get("SSH_CLIENT") or "").split()
    return ssh[0] if ssh else "local"


def to_wire(command: Command) -> dict[str, Any]:
    # A field left at its None default is omitted: a gate from before that field existed
    # then still accepts the command (it refuses unknown fields).
    fields = {
        f.name: getattr(command, f.name)
        for f in dataclasses.fields(command)
        if not (f.default is None and getattr(command, f.name) is None)
    }
    return {"v": COMMAND_VERSION, "op": command.op, **fields}


def from_wire(data: Any) -> Command:
    """A command from its wire dict; CommandError names what is wrong with it."""
    if not isinstance(data, dict):
        raise CommandError("a command must be an object")
    if data.get("v") != COMMAND_VERSION:
        raise CommandError(f"command version {data.get('v')!r} is not {COMMAND_VERSION}: upgrade the console")
    op = data.get("op")
    kind = _BY_OP.get(op) if isinstance(op, str) else None
    if kind is None:
        raise CommandError(f"unknown command {data.get('op')!r}; known: {', '.join(sorted(_BY_OP))}")
    names = {f.name for f in dataclasses.fields(kind)}
    extra = set(data) - names - {"v", "op"}
    if extra:
        raise CommandError(f"{kind.op}: unknown field(s) {', '.join(sorted(extra))}")
    try:
        command = kind(**{k: v for k, v in data.items() if k in names})
    except TypeError as exc:
        raise CommandError(f"{kind.op}: {exc}") from None
    _check_types(command)
    return command


def _check_types(command: Command) -> None:
    def need(ok: bool, name: str, what: str) -> None:
        if not ok:
            raise CommandError(f"{command.op}: {name} must be {what}, got {getattr(command, name)!r}")

    if hasattr(command, "cls") and not isinstance(command, Retune):
        need(isinstance(command.cls, str), "cls", "a class name")
    for name in ("paused", "frozen"):
        if hasattr(command, name):
            need(isinstance(getattr(command, name), bool), name, "true or false")
    need(isinstance(command.note, str), "note", "text")
    if isinstance(command, ModelAction):
        need(isinstance(command.model, str), "model", "a model name")
        need(command.action in MODEL_ACTIONS, "action", " or ".join(MODEL_ACTIONS))
    if isinstance(command, Retune):
        need(command.freeze is None or isinstance(command.freeze, bool), "freeze", "true, false or absent")
    if isinstance(command, Retune):
        need(
            command.budget is None or (isinstance(command.budget, int) and not isinstance(command.budget, bool)), "budget", "a whole number"
        )
        need(command.cls is None or isinstance(command.cls, str), "cls", "a class name")
        need(isinstance(command.settings, dict), "settings", "an object")
        need(isinstance(command.class_changes, dict), "class_changes", "an object")
