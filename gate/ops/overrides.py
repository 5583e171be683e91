"""Operator changes made at runtime, kept beside the journal so that a restart re-applies them.

A retune (budget settings, a class's shares), a budget set by hand, a paused class, the
controller's freeze and a router model pinned or unpinned are the operator's, not the file's. `Control` records each in one
`Overrides` and writes it at once to `<journal>.overrides.json` (mode 0600, written whole
to a temporary file, fsynced, renamed over the old one): a gate killed by SIGKILL a
millisecond after the command still has it, which the journal's group commit cannot
promise. At start `Control.restore` applies it over the file's config with an audit row
`restored` per value; `Control.drop_overrides` (the `overrides` command, `tokengate
overrides drop`) goes back to the file; a SIGHUP reload replaces the settings it covers
and says which. One gate per journal (the lock) makes this one gate's state.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("tokengate.service")

VERSION = 1


def path_for(journal_path: str) -> str:
    return journal_path + ".overrides.json"


def _fmt(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


@dataclass(slots=True)
class Overrides:
    """What differs from the config file because an operator changed it at runtime."""

    settings: dict[str, Any] = field(default_factory=dict)  # [budget] keys
    classes: dict[str, dict[str, Any]] = field(default_factory=dict)  # class -> [classes.X] keys
    budgets: dict[str, int] = field(default_factory=dict)  # backend -> working budget set by hand
    paused: list[str] = field(default_factory=list)
    frozen: bool = False
    #: router mode: a model's unit ("backend/model") -> pinned, where the file's `pin` says otherwise
    #: (a console unpin came back pinned after a restart: a trial, 2026-12-07)
    pins: dict[str, bool] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.settings or self.classes or self.budgets or self.paused or self.frozen or self.pins)

    def lines(self) -> tuple[str, ...]:
        """One short item per override, for the header, `tokengate overrides` and audit notes."""
        out = [f"budget.{k}={_fmt(v)}" for k, v in sorted(self.settings.items())]
        for cls, changes in sorted(self.classes.items()):
            out += [f"classes.{cls}.{k}={_fmt(v)}" for k, v in sorted(changes.items())]
        out += [f"budget {n} on {b}" for b, n in sorted(self.budgets.items())]
        out += [f"{c} paused" for c in sorted(self.paused)]
        if self.frozen:
            out.append("controller frozen")
        out += [f"model {unit} {'pinned' if pinned else 'unpinned'}" for unit, pinned in sorted(self.pins.items())]
        return tuple(out)

    def to_json(self) -> dict[str, Any]:
        return {
            "v": VERSION,
            "settings": self.settings,
            "classes": self.classes,
            "budgets": self.budgets,
            "paused": sorted(self.paused),
            "frozen": self.frozen,
            "pins": self.pins,
        }

    @classmethod
    def from_json(cls, data: Any) -> Overrides:
        if not isinstance(data, dict) or data.get("v") != VERSION:
            raise ValueError(f"not a version {VERSION} overrides file")
        out = cls(
            settings=dict(data.get("settings") or {}),
            classes={str(k): dict(v) for k, v in (data.get("classes") or {}).items()},
            budgets={str(k): int(v) for k, v in (data.get("budgets") or {}).items()},
            paused=[str(c) for c in data.get("paused") or ()],
            frozen=bool(data.get("frozen", False)),
            pins={str(k): bool(v) for k, v in (data.get("pins") or {}).items()},  # absent before 2026-12-07
        )
        return out


def load(path: str) -> Overrides:
    """The overrides kept at `path`; none when the file is absent. A damaged file is logged
    and ignored (it is kept, renamed `.bad`, for a person to look at)."""
    return load_or_why(path)[0]


def load_or_why(path: str, *, set_aside: bool = True) -> tuple[Overrides, str | None]:
    """`load`, and why a file that is there could not be used (None when it could, or when
    there is none), for the gate to audit: a log line alone went unseen. `set_aside` False
    (a command that only reads, beside a running gate): nothing is logged or renamed."""
    try:
        with open(path, encoding="utf-8") as f:
            return Overrides.from_json(json.load(f)), None
    except FileNotFoundError:
        return Overrides(), None
    except (OSError, ValueError, TypeError) as exc:
        if not set_aside:
            return Overrides(), f"{path} unreadable ({exc})"
        log.error("runtime overrides %s unreadable (%s): starting from the config file alone", path, exc)
        why = f"{path} unreadable ({exc}): starting from the config file alone"
        try:
            os.replace(path, path + ".bad")
        except OSError:
            pass
        else:
            why += f"; the file is kept as {path}.bad"
        return Overrides(), why


def save(path: str, overrides: Overrides) -> None:
    """Write whole and durably (temporary file, fsync, rename); no file when there is nothing."""
    if not overrides:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        return
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".overrides-", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(overrides.to_json(), f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
