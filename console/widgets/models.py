"""Models (router mode only): one keyed row per model of a llama-server router.

Status (green loaded, yellow loading / waking / evicting / unloaded, red failed or missing),
slots busy/total while loaded, tokens in flight, requests waiting in the gate for it, its
last measured load time, how long it has been idle, PIN, and llama-server's own queue for it
(`deferred`, red above 0: the gate keeps it at 0). The panel hides itself when the gate
fronts no router. `m` opens the same rows with the load / unload / pin actions.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widgets import DataTable

from console.styles import MODEL_STATUS
from console.widgets.classes import drop_stale, sync_row
from gate.data.snapshot import GateSnapshot, ModelView

LABELS: dict[str, str] = {
    "name": "model",
    "status": "status",
    "slots": "slots",
    "in_flight": "in-flight",
    "queued": "queued",
    "load": "last load",
    "idle": "idle",
    "pin": "pin",
    "deferred": "deferred",
    "detail": "detail",
}
COLUMNS = tuple(LABELS)


def _age(s: float) -> str:
    if s < 120:
        return f"{s:.0f}s"
    return f"{s / 60:.0f}m" if s < 7200 else f"{s / 3600:.0f}h"


def model_cells(m: ModelView) -> dict[str, Any]:
    slots = "-" if m.slots_total is None else f"{m.slots_busy}/{m.slots_total}"
    deferred = "-" if m.requests_deferred is None else str(m.requests_deferred)
    return {
        "name": Text(m.name, style="bold"),
        "status": Text(m.status, style=MODEL_STATUS.get(m.status, "")),
        "slots": slots,
        "in_flight": m.in_flight,
        "queued": Text(str(m.queued), style="bold yellow" if m.queued else ""),
        "load": "-" if m.last_load_s is None else f"{m.last_load_s:.2f}s",
        "idle": "busy" if m.idle_s is None else _age(m.idle_s),
        "pin": Text("PIN", style="bold cyan") if m.pinned else Text(""),
        "deferred": Text(deferred, style="bold red" if m.requests_deferred else ""),
        "detail": Text(m.detail if m.detail != m.status else "", style="dim"),
    }


def title(models: tuple[ModelView, ...], *, read_only: bool = False) -> str:
    loaded = sum(1 for m in models if m.status in ("loaded", "sleeping", "loading", "evicting"))
    top = max((m.models_max for m in models), default=0)
    return f"models {loaded}/{top or 'any'} loaded  " + ("(m: the rows)" if read_only else "(m: load, unload, pin)")


class ModelsTable(DataTable):
    """The rows; `selected_model` is the row under the cursor (the models dialog acts on it)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)
        self._cells: dict[str, dict[str, Any]] = {}
        for key in COLUMNS:
            self.add_column(LABELS[key], key=key)

    @property
    def selected_model(self) -> str | None:
        if not self.row_count:
            return None
        row_key, _ = self.coordinate_to_cell_key(self.cursor_coordinate)
        return row_key.value

    def update_models(self, models: tuple[ModelView, ...]) -> None:
        for m in models:
            sync_row(self, self._cells, m.name, model_cells(m), COLUMNS)
        drop_stale(self, self._cells, {m.name for m in models})


class ModelsPanel(ModelsTable):
    """The main view's panel: shown only in router mode, never takes the focus."""

    can_focus = False

    def __init__(self, *, read_only: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.read_only = read_only

    def update_snapshot(self, snap: GateSnapshot) -> None:
        self.display = bool(snap.models)
        if snap.models:
            self.border_title = title(snap.models, read_only=self.read_only)
            self.update_models(snap.models)
