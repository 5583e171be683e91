"""Denials by reason and class over the last 1, 5 and 15 minutes (keyed rows)."""

from __future__ import annotations

from textual.widgets import DataTable

from console.widgets.borders import set_border_text
from console.widgets.classes import drop_stale, sync_row
from gate.data.snapshot import GateSnapshot

COLUMNS = (("reason", "reason"), ("cls", "class"), ("m1", "1m"), ("m5", "5m"), ("m15", "15m"))
KEYS = tuple(k for k, _ in COLUMNS)


class DenialsTable(DataTable):
    """What the gate refuses and why, most frequent (last 5 min) first."""

    def __init__(self, **kwargs) -> None:
        super().__init__(cursor_type="none", zebra_stripes=True, **kwargs)
        self._cells: dict[str, dict] = {}
        self._order: tuple[str, ...] = ()
        for key, label in COLUMNS:
            self.add_column(label, key=key)

    def update_snapshot(self, snap: GateSnapshot) -> None:
        live = set()
        for d in snap.denials:
            key = f"{d.reason}|{d.cls}"
            live.add(key)
            cells = {"reason": d.reason, "cls": d.cls, "m1": d.last_1m, "m5": d.last_5m, "m15": d.last_15m}
            sync_row(self, self._cells, key, cells, KEYS)
        drop_stale(self, self._cells, live)

        def rank(c: dict) -> tuple:
            # The current problem first: the last minute, then 5, then 15 (#22: an old burst's
            # 15-minute count sorted today's above it).
            return (-c["m1"], -c["m5"], -c["m15"], c["reason"], c["cls"])

        order = tuple(sorted(self._cells, key=lambda k: rank(self._cells[k])))
        if order != self._order:
            self.sort("m1", "m5", "m15", "reason", "cls", key=lambda v: (-v[0], -v[1], -v[2], v[3], v[4]))
            self._order = order
        total = sum(c["m15"] for c in self._cells.values())
        set_border_text(self, f"{total} in 15 min" if total else "none in 15 min")

    @property
    def row_keys(self) -> list[str]:
        return [str(row.key.value) for row in self.ordered_rows]
