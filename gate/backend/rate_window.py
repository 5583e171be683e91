"""llama-server's two throughput gauges over the window a client's scrape means. Pure.

llama-server's ``llamacpp:prompt_tokens_seconds`` and ``llamacpp:predicted_tokens_seconds`` are
averaged over the window since the previous read of its ``/metrics``, and every read starts a new
window (its "buckets", reset by the read). The gate reads ``/metrics`` every second for its own
telemetry, so a client scraping llama-server through the gate would see the rate since the gate's
last read (0 when idle; llama.cpp's ``test_sleep.py::test_server_sleep_metrics_buckets`` caught it),
not since its own previous scrape.

Every read the gate makes is one piece of the client's window: the gauge (steps per second) and
the piece's time, the increase of the matching seconds total (``prompt_seconds_total``,
``tokens_predicted_seconds_total``: llama-server adds the same microseconds to the total and to
the bucket). A client's scrape is answered with the steps of every piece since its previous
scrape (or since the gate's first read) over their time: what llama-server would have said had
nobody else read it in between, within the precision it prints (six significant digits). A piece
whose total did not move adds nothing, so a bucket llama-server reports twice (a scrape right
after it wakes from sleep) is not counted twice.

Keyed by the llama-server the gate reads (base URL and router query); llama-server restarting
(its ``Process-Start-Time-Unix`` changes, or a total goes down) starts the totals again from 0.
Several clients scraping through the gate share one window, as they would straight (and a
scraper that reads llama-server directly takes its pieces with it, as it would).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

#: gauge -> the seconds total that grows with its bucket
GAUGES = {
    "prompt_tokens_seconds": "prompt_seconds_total",
    "predicted_tokens_seconds": "tokens_predicted_seconds_total",
}
PREFIX = "llamacpp:"
#: llama-server's header: when its counters started
START_HEADER = "Process-Start-Time-Unix"

_LINE = re.compile(r"^(llamacpp:(?:prompt_tokens_seconds|predicted_tokens_seconds))([ \t]+)\S+(.*)$", re.M)


@dataclass(slots=True)
class _Window:
    start: str | None = None
    totals: dict[str, float] = field(default_factory=dict)  # seconds total -> last read
    steps: dict[str, float] = field(default_factory=dict)  # gauge -> steps since the last client scrape
    seconds: dict[str, float] = field(default_factory=dict)  # gauge -> time since the last client scrape


class RateWindows:
    """Pieces of llama-server's throughput windows, per llama-server (see the module)."""

    __slots__ = ("_windows",)

    def __init__(self) -> None:
        self._windows: dict[str, _Window] = {}

    def observe(self, key: str, metrics: Mapping[str, float], start: str | None = None) -> None:
        """One read of llama-server ``key``'s /metrics by the gate (``metrics`` as
        :func:`gate.backend.telemetry.parse_metrics` gives them, ``start`` its
        Process-Start-Time-Unix): adds its piece to the window."""
        w = self._windows.setdefault(key, _Window())
        if start is not None and w.start is not None and start != w.start:
            w.totals.clear()  # llama-server restarted: its totals begin at 0 again
        if start is not None:
            w.start = start
        for gauge, total_name in GAUGES.items():
            rate, total = metrics.get(gauge), metrics.get(total_name)
            if rate is None or total is None or not (math.isfinite(rate) and math.isfinite(total)):
                continue
            before = w.totals.get(total_name, 0.0)
            if total < before:
                if start is not None:
                    continue  # a read overtaken by a newer one (two at once): its time is in that one's piece
                before = 0.0  # no header to tell, and a total went down: llama-server restarted
            piece = total - before
            w.totals[total_name] = total
            if piece > 0 and rate > 0:
                w.steps[gauge] = w.steps.get(gauge, 0.0) + rate * piece
            if piece > 0:
                w.seconds[gauge] = w.seconds.get(gauge, 0.0) + piece

    def take(self, key: str, metrics: Mapping[str, float], start: str | None = None) -> dict[str, float]:
        """A client's scrape: observes this read, then answers each gauge over the window since
        the client's previous scrape (0 when no time passed in it, as llama-server says) and
        starts the next window."""
        self.observe(key, metrics, start)
        w = self._windows[key]
        out = {}
        for gauge in GAUGES:
            seconds = w.seconds.pop(gauge, 0.0)
            steps = w.steps.pop(gauge, 0.0)
            out[gauge] = steps / seconds if seconds > 0 else 0.0
        return out


def rewrite(text: str, gauges: Mapping[str, float]) -> str:
    """llama-server's /metrics text with the two gauges' values replaced (printed as llama-server
    prints a double: six significant digits)."""

    def one(m: re.Match[str]) -> str:
        name = m.group(1).removeprefix(PREFIX)
        value = gauges.get(name)
        return m.group(0) if value is None else f"{m.group(1)}{m.group(2)}{value:.6g}{m.group(3)}"

    return _LINE.sub(one, text)


def window_key(url: str, query: str = "") -> str:
    """The key both readers use for one llama-server (a router's model is its own)."""
    return url.rstrip("/") + query
