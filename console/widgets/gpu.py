"""GPU memory per device (NVML), or `n/a: <reason>` when there is no NVML/GPU; and always
the KV cache memory the gate has reserved (tokens in flight x KV bytes per token, from the
model's GGUF header) against the pool llama-server allocated: the VRAM pressure the gate
controls, shown even on a host where NVML cannot be read."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from console.styles import BAR_EMPTY, fill_style
from console.widgets.status import show_text
from gate.data.snapshot import GIB, BackendView, GateSnapshot, format_reading


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
            width = 8
            filled = round(frac * width)
            out.append("█" * filled, mem_style(frac))
            out.append("░" * (width - filled) + " ", BAR_EMPTY)
        out.append(line)
        if dev is not None and not compact:
            out.append(" util", "dim")
    return out


def kv_line(b: BackendView, *, compact: bool, named: bool = False) -> Text:
    """``KV reserved ██░░░░░░ 0.08/1.00 GiB 660/8,192 tok x 128 KiB/tok`` for one backend;
    `named` (several backends, or a router's models) puts its name after ``KV reserved``."""
    out = Text()
    pool = b.ceiling
    if not pool:
        return Text(f"KV {b.name}: pool not known yet", style="dim yellow")
    frac = min(b.in_flight / pool, 1.0)
    width = 8
    filled = round(frac * width)
    out.append("KV reserved ", "bold")
    if named:
        out.append(f"{b.name} ", "bold")
    out.append("█" * filled, fill_style(frac))
    out.append("░" * (width - filled) + " ", BAR_EMPTY)
    per_token = b.kv_bytes_per_token
    if per_token:
        out.append(f"{b.in_flight * per_token / GIB:.2f}/{pool * per_token / GIB:.2f} GiB ")
        out.append(f"{b.in_flight:,}/{pool:,} tok", "dim")
        if not compact:
            out.append(f" x {per_token // 1024:,} KiB/tok", "dim")
    else:
        out.append(f"{b.in_flight:,}/{pool:,} tok ")
        out.append("(bytes/token n/a)", "dim")  # the GGUF file is not on this host (help says so)
    return out


def render_panel(snap: GateSnapshot | None, *, compact: bool) -> Text:
    out = render_gpu(snap.gpu if snap is not None else None, compact=compact)
    backends = snap.backends if snap is not None else ()
    for b in backends:
        out.append("\n")
        out.append_text(kv_line(b, compact=compact, named=len(backends) > 1))
    return out


class GpuPanel(Static):
    """Memory used/total per GPU, from the snapshot's GpuReading."""

    def __init__(self, **kwargs) -> None:
        super().__init__("", **kwargs)
        self.compact = False
        self._snap: GateSnapshot | None = None

    def set_compact(self, compact: bool) -> None:
        self.compact = compact
        show_text(self, render_panel(self._snap, compact=compact))

    def update_snapshot(self, snap: GateSnapshot) -> None:
        self._snap = snap
        show_text(self, render_panel(snap, compact=self.compact))
