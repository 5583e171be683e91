"""The budget curve: budget and in-flight tokens (left axis), p95 upstream TTFT against
the SLO (right axis), operator/controller changes as vertical marks.

One widget for the live console (last 10 min, x relative to now) and the review screen
(any range, x as UTC clock time). Feed it with :meth:`BudgetChart.set_series`; it keeps
no history of its own.

plotext's module-level API is global state: this widget only ever touches its own
figure (``self.plt``), and only on the main thread.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from textual_plotext import PlotextPlot

TimeAxis = Literal["relative", "utc"]

BUDGET_COLOR = "cyan"
IN_FLIGHT_COLOR = "green"
TTFT_COLOR = "magenta"
SLO_COLOR = "yellow"  # never the p95's colour: the two must be told apart at a glance
MARK_COLOR = "orange"
HAND_SET_COLOR = "white"

#: Steps (seconds) the time axis may use between ticks.
_NICE_STEPS = (
    1,
    2,
    5,
    10,
    15,
    30,
    60,
    120,
    300,
    600,
    900,
    1800,
    3600,
    7200,
    10800,
    21600,
    43200,
    86400,
    172800,
    604800,
)
#: Most marks drawn with a text label; beyond this only the lines are drawn.
MAX_LABELLED_MARKS = 12
#: Most marks drawn at all (the newest are kept).
MAX_MARKS = 200

NO_DATA = "no samples yet"


def _runs(xs: Sequence[float], ys: Sequence[float | None]) -> list[tuple[list[float], list[float]]]:
    """Split a series at its gaps (None / NaN): plotext cannot draw them."""
    runs: list[tuple[list[float], list[float]]] = []
    cur_x: list[float] = []
    cur_y: list[float] = []
    for x, y in zip(xs, ys, strict=True):
        if y is None or (isinstance(y, float) and math.isnan(y)):
            if cur_x:
                runs.append((cur_x, cur_y))
                cur_x, cur_y = [], []
            continue
        cur_x.append(x)
        cur_y.append(float(y))
    if cur_x:
        runs.append((cur_x, cur_y))
    return runs


def _finite_max(*series: Sequence[float | None]) -> float | None:
    best: float | None = None
    for s in series:
        for v in s:
            if v is None:
                continue
            v = float(v)
            if math.isnan(v) or math.isinf(v):
                continue
            if best is None or v > best:
                best = v
    return best


def _nice_step(span: float, max_ticks: int) -> float:
    for step in _NICE_STEPS:
        if span / step <= max_ticks:
            return float(step)
    return float(_NICE_STEPS[-1])


def _relative_label(seconds: float) -> str:
    s = abs(seconds)
    if s < 0.5:
        return "now"
    if s % 86400 == 0:
        text = f"{s / 86400:g}d"
    elif s % 3600 == 0:
        text = f"{s / 3600:g}h"
    elif s % 60 == 0:
        text = f"{s / 60:g}m"
    else:
        text = f"{s:g}s"
    return "-" + text


def _utc_label(ts: float, step: float) -> str:
    t = time.gmtime(ts)
    if step >= 86400:
        return time.strftime("%m-%d", t)
    if step < 60:
        return time.strftime("%H:%M:%S", t)
    if t.tm_hour == 0 and t.tm_min == 0 and step >= 3600:
        return time.strftime("%m-%d", t)
    return time.strftime("%H:%M", t)


def time_ticks(lo: float, hi: float, now: float, axis: TimeAxis, max_ticks: int = 6) -> tuple[list[float], list[str]]:
    """Tick positions (x = seconds relative to ``now``) and their labels for [lo, hi]."""
    span = max(hi - lo, 1.0)
    step = _nice_step(span, max_ticks)
    ticks: list[float] = []
    labels: list[str] = []
    if axis == "relative":
        k = math.floor(hi / step)
        while k * step >= lo - 1e-9:
            ticks.append(k * step)
            labels.append(_relative_label(k * step))
            k -= 1
    else:  # aligned to round wall-clock (UTC) times
        k = math.floor((now + hi) / step)
        while k * step - now >= lo - 1e-9:
            ticks.append(k * step - now)
            labels.append(_utc_label(k * step, step))
            k -= 1
    ticks.reverse()
    labels.reverse()
    return ticks, labels


def _compact(v: float) -> str:
    if v >= 1_000_000:
        return f"{v / 1_000_000:g}M"
    if v >= 1000:
        return f"{v / 1000:g}k"
    return f"{v:g}"


def value_ticks(top: float, max_ticks: int = 5) -> tuple[list[float], list[str]]:
    """Round ticks from 0 up to ``top`` (1-2-5 steps), labelled compactly (8k, 1.5M)."""
    if top <= 0 or math.isnan(top) or math.isinf(top):
        return [0.0], ["0"]
    raw = top / max_ticks
    mag = 10 ** math.floor(math.log10(raw))
    step = next((m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw), 10 * mag)
    ticks = [k * step for k in range(int(top // step) + 1)]
    return ticks, [_compact(round(t, 10)) for t in ticks]


DEFAULT_COLUMNS = 120  # width assumed before the first layout
LABEL_ROWS = 3  # rows of mark labels under the top of the plot
LABEL_CHARS = 10


def place_labels(marks: Sequence[tuple[float, str]], lo: float, hi: float, columns: int) -> list[tuple[float, str, int, str]]:
    """(x, label, row, alignment) for the marks whose label fits without touching another:
    each label starts at its line (ends there when it would run off the right edge) and
    takes the first of LABEL_ROWS rows where its characters (plus a space) are free; a
    label that fits nowhere is left out (its vertical line stays)."""
    taken: list[list[tuple[int, int]]] = [[] for _ in range(LABEL_ROWS)]
    placed: list[tuple[float, str, int, str]] = []
    plot_columns = max(columns - 12, 10)  # the axes take some
    for x, text in marks:
        text = text[:LABEL_CHARS]
        col = int((x - lo) / (hi - lo) * plot_columns) if hi > lo else 0
        start, alignment = col, "left"
        if col + len(text) >= plot_columns:
            start, alignment = col - len(text), "right"
        end = start + len(text) + 1
        for row, spans in enumerate(taken):
            if all(end <= a or start >= b for a, b in spans):
                spans.append((start, end))
                placed.append((x, text, row, alignment))
                break
    return placed


def _right_top(right_max: float | None, slo: float | None, top_left: float, rows: int) -> float:
    """The right axis' top: room above p95 and the SLO, chosen so the SLO line does not fall
    on a row that carries a left-axis label (it would read as a number of tokens)."""
    base = max(right_max or 0.0, slo or 0.0) or 1.0
    if not slo or slo <= 0:
        return base * 1.2
    left = [t / top_left * (rows - 1) for t in value_ticks(top_left)[0]]  # rows from the bottom
    best, best_gap = base * 1.2, -1.0
    for step in range(41):  # 1.2 .. 3.2 x
        top = base * (1.2 + 0.05 * step)
        at = slo / top * (rows - 1)
        gap = min(abs(at - row) for row in left) if left else rows
        clash = any(math.floor(at + 0.5) == math.floor(row + 0.5) or round(at) == round(row) for row in left)
        if not clash:  # on a row of its own, whichever way plotext rounds
            return top
        if gap > best_gap:
            best, best_gap = top, gap
    return best


@dataclass(frozen=True, slots=True)
class _Series:
    times: list[float]
    budget: list[float | None]
    in_flight: list[float | None]
    p95_ttft_ms: list[float | None]
    slo_ttft_ms: float | None
    marks: list[tuple[float, str]]
    now: float | None
    window_s: float | None
    hand_set: tuple[float, float] | None = None


def _downsample(
    xs: list[float],
    budget: list[float | None],
    in_flight: list[float | None],
    p95: list[float | None],
    lo: float,
    hi: float,
    buckets: int,
) -> tuple[list[float], list[float | None], list[float | None], list[float | None]]:
    """At most ``buckets`` points over [lo, hi]: x and budget averaged, in-flight and p95
    the bucket's maximum (peaks stay visible); points outside [lo, hi] dropped. A value
    is None only when the whole bucket had none (the line breaks there)."""
    if len(xs) <= buckets:
        return xs, budget, in_flight, p95
    width = (hi - lo) / buckets
    acc: dict[int, list] = {}
    for x, b, f, p in zip(xs, budget, in_flight, p95, strict=True):
        if x < lo or x > hi:
            continue
        k = min(int((x - lo) / width), buckets - 1)
        a = acc.get(k)
        if a is None:
            a = acc[k] = [0.0, 0, 0.0, 0, None, None]  # x sum, n, budget sum, budget n, in-flight max, p95 max
        a[0] += x
        a[1] += 1
        if b is not None:
            a[2] += b
            a[3] += 1
        if f is not None and (a[4] is None or f > a[4]):
            a[4] = f
        if p is not None and (a[5] is None or p > a[5]):
            a[5] = p
    out_x: list[float] = []
    out_b: list[float | None] = []
    out_f: list[float | None] = []
    out_p: list[float | None] = []
    for k in sorted(acc):
        a = acc[k]
        out_x.append(a[0] / a[1])
        out_b.append(a[2] / a[3] if a[3] else None)
        out_f.append(a[4])
        out_p.append(a[5])
    return out_x, out_b, out_f, out_p


class BudgetChart(PlotextPlot):
    """Budget and in-flight tokens (left), p95 TTFT ms and its SLO (right), marks.

    ``time_axis``: ``"relative"`` labels the x axis ``-10m … now``; ``"utc"`` labels it
    with UTC clock times (the review screen). x values are always seconds relative to
    ``now`` (the end of the series unless given).
    """

    DEFAULT_CSS = """
    BudgetChart {
        height: 1fr;
        min-height: 8;
    }
    """

    def __init__(
        self,
        *,
        title: str = "tokens (left) · p95 TTFT ms (right)",
        time_axis: TimeAxis = "relative",
        name: str | None = None,
        id: str | None = None,  # noqa: A002 - Textual's name
        classes: str | None = None,
        disabled: bool = False,
    ) -> None:
        super().__init__(name=name, id=id, classes=classes, disabled=disabled)
        self.chart_title = title
        self.time_axis: TimeAxis = time_axis
        #: True while the chart shows "no samples yet"
        self.empty = True
        #: number of points drawn by the last set_series (all series together)
        self.points = 0
        self._series_set = False
        self._data: _Series | None = None
        self._drawn_width = 0

    def on_mount(self) -> None:
        # PlotextPlot.on_mount (theme registration) runs too: Textual calls each class's handler.
        self.plt.title(self.chart_title)
        if not self._series_set:
            self._draw_empty()

    # -- public ------------------------------------------------------------------------

    def set_series(
        self,
        *,
        times: Sequence[float],
        budget: Sequence[float | None],
        in_flight: Sequence[float | None],
        p95_ttft_ms: Sequence[float | None],
        slo_ttft_ms: float | None,
        marks: Sequence[tuple[float, str]] = (),
        now: float | None = None,
        window_s: float | None = None,
        hand_set: tuple[float, float] | None = None,
    ) -> None:
        """Replace what the chart shows, then redraw.

        ``hand_set``: (epoch seconds, tokens) of the newest budget an operator set by
        hand, drawn from then to now beside the budget the gate runs with (the adaptive
        controller may have moved it since: both show).

        ``times`` are wall-clock epoch seconds, one per value of ``budget``, ``in_flight``
        and ``p95_ttft_ms`` (None = no value: the line breaks there). ``marks`` are
        (epoch seconds, short label) drawn as vertical lines. ``now`` (default: the last
        time) is x = 0; ``window_s`` fixes the x range to [-window_s, 0] (default: the
        span of the data).

        More points than the chart can show (two braille dots per character column) are
        bucketed first: budget averaged, in-flight and p95 TTFT the bucket's peak. Drawing
        costs about 0.1 ms per point, so the live console may pass its whole 10-minute
        buffer each second. On a resize the stored series is redrawn at the new width.
        """
        n = len(times)
        if not (len(budget) == len(in_flight) == len(p95_ttft_ms) == n):
            raise ValueError(
                f"set_series: times ({n}), budget ({len(budget)}), in_flight ({len(in_flight)}) "
                f"and p95_ttft_ms ({len(p95_ttft_ms)}) must have the same length"
            )
        self._series_set = True
        self._data = _Series(
            list(times),
            list(budget),
            list(in_flight),
            list(p95_ttft_ms),
            slo_ttft_ms,
            list(marks),
            now,
            window_s,
            hand_set,
        )
        self._drawn_width = self.size.width
        self._redraw()

    def seconds_per_dot(self, window_s: float) -> float:
        """How much time one braille dot of the x axis spans (two a column): redrawing a
        `window_s` chart more often than this moves nothing on it."""
        return window_s / max(2 * self.size.width, 1)

    def clear(self) -> None:
        """Show "no samples yet"."""
        self._series_set = True
        self._data = None
        self.plt.clear_data()
        self._draw_empty()

    def on_resize(self) -> None:
        if self._data is not None and self.size.width != self._drawn_width:
            self._drawn_width = self.size.width
            self._redraw()

    # -- internals ---------------------------------------------------------------------

    def _redraw(self) -> None:
        data = self._data
        assert data is not None
        plt = self.plt
        plt.clear_data()
        times, budget, in_flight, p95 = data.times, data.budget, data.in_flight, data.p95_ttft_ms
        slo_ttft_ms = data.slo_ttft_ms
        left_max = _finite_max(budget, in_flight)
        right_max = _finite_max(p95)
        if not times or (left_max is None and right_max is None):
            self._draw_empty()
            return
        self.empty = False
        now = float(max(times)) if data.now is None else float(data.now)
        xs = [float(t) - now for t in times]
        hi = 0.0 if data.window_s is not None else max(max(xs), 0.0)
        lo = -float(data.window_s) if data.window_s is not None else min(xs)
        if hi - lo < 1.0:
            lo = hi - 1.0
        columns = self.size.width or DEFAULT_COLUMNS
        xs, budget, in_flight, p95 = _downsample(xs, budget, in_flight, p95, lo, hi, max(2 * columns, 60))

        points = 0
        # left axis: tokens
        if data.hand_set is not None:
            left_max = max(left_max or 0.0, float(data.hand_set[1]))
        top_left = (left_max or 0.0) * 1.15 or 1.0
        for label, series, color in (
            ("budget", budget, BUDGET_COLOR),
            ("in-flight", in_flight, IN_FLIGHT_COLOR),
        ):
            for i, (rx, ry) in enumerate(_runs(xs, series)):
                plt.plot(rx, ry, marker="braille", color=color, label=label if i == 0 else None)
                points += len(rx)
        if data.hand_set is not None and lo <= float(data.hand_set[0]) - now <= hi:
            x0, value = float(data.hand_set[0]) - now, float(data.hand_set[1])
            plt.plot([x0, hi], [value, value], marker="dot", color=HAND_SET_COLOR, label="set by hand")
        # right axis: p95 TTFT ms and the SLO (plotted as a line: plotext's hline ignores yside)
        top_right = _right_top(right_max, slo_ttft_ms, top_left, self._plot_rows())
        for i, (rx, ry) in enumerate(_runs(xs, p95)):
            plt.plot(
                rx,
                ry,
                marker="braille",
                color=TTFT_COLOR,
                yside="right",
                label="p95 TTFT ms" if i == 0 else None,
            )
            points += len(rx)
        if slo_ttft_ms is not None and slo_ttft_ms > 0:
            plt.plot([lo, hi], [slo_ttft_ms, slo_ttft_ms], marker="-", color=SLO_COLOR, yside="right", label="SLO")
        self.points = points

        # marks: one per character column at most (plotext draws each line over the whole
        # canvas; more cannot be told apart), the newest MAX_MARKS; labels only when few
        per_column: dict[int, tuple[float, str]] = {}
        for ts, text in data.marks:
            x = float(ts) - now
            if lo <= x <= hi:
                per_column[int((x - lo) / (hi - lo) * columns)] = (x, text)
        shown = [per_column[c] for c in sorted(per_column)][-MAX_MARKS:]
        for x, _text in shown:
            plt.vline(x, MARK_COLOR)
        if 0 < len(shown) <= MAX_LABELLED_MARKS:
            # mid-height rows: the legend takes the top left, the budget runs near the top. Each
            # label row on a terminal row of its own: 0.62, 0.53 and 0.44 of the height fell on
            # one row of an 8-row plot (the review's at 120x40), and a label placed on the second
            # row to miss the first was drawn over it ("setpause_clas", a trial)
            rows = self._plot_rows()
            first = round(0.62 * (rows - 1))  # rows from the bottom, as plotext rounds y
            for x, text, row, alignment in place_labels(shown, lo, hi, columns):
                y = top_left * max(first - row, 0) / max(rows - 1, 1)
                plt.text(text, x, y, color=MARK_COLOR, alignment=alignment)  # type: ignore[arg-type]  # one of plotext's alignments

        plt.xlim(lo, hi)
        plt.ylim(0, top_left)
        plt.yticks(*value_ticks(top_left))
        right_ticks, right_labels = value_ticks(top_right)
        if slo_ttft_ms is not None and slo_ttft_ms > 0:
            # the SLO gets its own tick on the right axis; a tick within a row of it gives way (a
            # trial's 3,000 ms SLO line was labelled "2k": that tick landed on the SLO's row)
            row_span = top_right / max(self._plot_rows() - 1, 1)
            keep = [(t, label) for t, label in zip(right_ticks, right_labels) if abs(t - slo_ttft_ms) > max(0.08 * top_right, row_span)]
            right_ticks = [t for t, _ in keep] + [slo_ttft_ms]
            right_labels = [label for _, label in keep] + [_compact(round(slo_ttft_ms, 10))]
        plt.yticks(right_ticks, right_labels, yside="right")  # type: ignore[arg-type]  # plotext types yside as a number; it takes "left" or "right"
        plt.ylim(0, top_right, yside="right")  # type: ignore[arg-type]  # plotext types yside as a number; it takes "left" or "right"
        ticks, labels = time_ticks(lo, hi, now, self.time_axis)
        plt.xticks(ticks, labels)
        self.refresh()

    def _plot_rows(self) -> int:
        return max((self.size.height or 20) - 4, 4)  # title, top frame, x axis, its labels

    def _draw_empty(self) -> None:
        self.empty = True
        self.points = 0
        plt = self.plt
        plt.xlim(0, 1)
        plt.ylim(0, 1)
        plt.xticks([], [])
        plt.yticks([], [])
        plt.yticks([], [], yside="right")  # type: ignore[arg-type]  # plotext types yside as a number; it takes "left" or "right"
        plt.text(NO_DATA, 0.5, 0.5, alignment="center")
        self.refresh()
