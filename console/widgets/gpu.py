"""GPU memory per device (NVML), or `n/a: <reason>` when there is no NVML/GPU."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from console.widgets.status import show_text

from gate.snapshot import format_reading
from gate.snapshot import GateSnapshot


def mem_style(frac: float) -> str:
    """nvitop's memory thresholds: light < 10%, heavy >= 80%."""
    return "green" if frac < 0.1 else "yellow" if frac < 0.8 else "bold red"


def render_gpu(reading, *, compact: bool) -> Text:
    if reading is None:
        return Text("GPU n/a: not read yet", style="dim yellow")
    lines = format_reading(reading)
    if reading.unavailable is not None or not reading.devices:
        text = lines[0] if lines else "n/a: no GPU devices"
        return Text(("GPU " if not text.startswith("GPU") else "") + text, style="dim yellow")
    out = Text()
    devices = iter(reading.devices)
    first = True
    for line in lines:
        if line.startswith("  "):  # a process line under its device
            if not compact:
                out.append("\n" + line, "dim")
            continue
        dev = next(devices, None)
        if not first:
            out.append("\n")
        first = False
        if dev is not None and dev.total_bytes:
            frac = dev.used_bytes / dev.total_bytes
            width = 8 if compact else 12
            filled = round(frac * width)
            out.append("█" * filled, mem_style(frac))
            out.append("░" * (width - filled) + " ", "grey37")
        out.append(line)
        if dev is not None:
            out.append(" util", "dim")
    return out


class GpuPanel(Static):
    """Memory used/total per GPU, from the snapshot's GpuReading."""

    def __init__(self, **kwargs) -> None:
        super().__init__("", **kwargs)
        self.compact = False
        self._reading = None

    def set_compact(self, compact: bool) -> None:
        self.compact = compact
        show_text(self, render_gpu(self._reading, compact=compact))

    def update_snapshot(self, snap: GateSnapshot) -> None:
        self._reading = snap.gpu
        show_text(self, render_gpu(snap.gpu, compact=self.compact))
