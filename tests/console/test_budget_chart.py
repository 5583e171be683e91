"""console.widgets.budget_chart: the budget curve shared by the live console and review."""

from __future__ import annotations

import math
import re

import pytest
from textual.app import App, ComposeResult

from console.widgets.budget_chart import NO_DATA, BudgetChart, time_ticks, value_ticks

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
T0 = 1_700_000_000.0  # 2023-11-14 22:13:20 UTC


class ChartApp(App[None]):
    def __init__(self, **kwargs: object) -> None:
        super().__init__()
        self.kwargs = kwargs

    def compose(self) -> ComposeResult:
        yield BudgetChart(id="chart", **self.kwargs)  # type: ignore[arg-type]


def text_of(chart: BudgetChart) -> str:
    chart.render()  # sizes the figure to the widget, as Textual does
    return _ANSI.sub("", chart.plt.build())


def series(n: int = 300, step: float = 2.0) -> dict[str, list]:
    times = [T0 + i * step for i in range(n)]
    return {
        "times": times,
        "budget": [8000 + 1000 * math.sin(i / 30) for i in range(n)],
        "in_flight": [None if i % 50 == 0 else 4000 + 3000 * math.sin(i / 10) for i in range(n)],
        "p95_ttft_ms": [800 + 400 * math.sin(i / 20) for i in range(n)],
    }


async def test_empty_chart_says_no_samples_yet() -> None:
    app = ChartApp()
    async with app.run_test(size=(100, 20)) as pilot:
        chart = app.query_one(BudgetChart)
        await pilot.pause()
        assert chart.empty
        assert NO_DATA in text_of(chart)
        # explicitly empty data: same, no crash
        chart.set_series(times=[], budget=[], in_flight=[], p95_ttft_ms=[], slo_ttft_ms=None)
        await pilot.pause()
        assert chart.empty and chart.points == 0
        assert NO_DATA in text_of(chart)
        # values all missing: nothing to draw either
        chart.set_series(times=[T0, T0 + 1], budget=[None, None], in_flight=[None, None], p95_ttft_ms=[None, None], slo_ttft_ms=500)
        await pilot.pause()
        assert chart.empty
        assert NO_DATA in text_of(chart)


async def test_series_renders_lines_axes_slo_and_marks() -> None:
    app = ChartApp(time_axis="utc")
    async with app.run_test(size=(100, 22)) as pilot:
        chart = app.query_one(BudgetChart)
        data = series()
        chart.set_series(**data, slo_ttft_ms=1500, marks=[(T0 + 200, "set_budget"), (T0 + 400, "freeze")])
        await pilot.pause()
        assert not chart.empty
        # 300 points are more than a 100-column chart shows (2 braille dots a column)
        assert 0 < chart.points <= 3 * 200
        monitor = chart.plt.monitor
        assert len(monitor.x) >= 3  # budget, in-flight runs, p95, the SLO line
        assert "right" in monitor.yside  # p95 and the SLO on the right axis
        out = text_of(chart)
        assert NO_DATA not in out
        for label in ("budget", "in-flight", "p95 TTFT ms", "SLO", "set_budget", "freeze"):
            assert label in out, label
        assert "1.5k" in out  # the right axis reaches the SLO
        assert "22:14" in out  # UTC clock labels on the x axis
        assert any(ch in out for ch in "⠁⠂⠄⡀⢀⣀")  # braille lines were drawn
        # back to empty: the previous series is gone
        chart.set_series(times=[], budget=[], in_flight=[], p95_ttft_ms=[], slo_ttft_ms=None)
        await pilot.pause()
        assert NO_DATA in text_of(chart)
        assert "set_budget" not in text_of(chart)


async def test_more_points_than_columns_are_bucketed_keeping_peaks() -> None:
    app = ChartApp()
    async with app.run_test(size=(60, 16)) as pilot:
        chart = app.query_one(BudgetChart)
        n = 3600
        spike = 1234
        chart.set_series(
            times=[T0 + i for i in range(n)],
            budget=[10_000.0] * n,
            in_flight=[50_000.0 if i == spike else 1000.0 for i in range(n)],
            p95_ttft_ms=[9000.0 if i == spike else 500.0 for i in range(n)],
            slo_ttft_ms=1000,
        )
        await pilot.pause()
        assert 0 < chart.points <= 3 * 2 * 60  # at most 2 points per column per series
        monitor = chart.plt.monitor
        drawn = [y for ys in monitor.y for y in ys]
        assert 50_000.0 in drawn and 9000.0 in drawn  # the peaks survive the bucketing
        assert 10_000.0 in drawn
        # a wider chart redraws with more points
        before = chart.points
        await pilot.resize_terminal(120, 16)
        await pilot.pause()
        assert chart.points > before


async def test_relative_axis_and_fixed_window() -> None:
    app = ChartApp()
    async with app.run_test(size=(80, 16)) as pilot:
        chart = app.query_one(BudgetChart)
        data = series(n=120, step=1.0)
        chart.set_series(**data, slo_ttft_ms=None, now=T0 + 119, window_s=600)
        await pilot.pause()
        out = text_of(chart)
        assert "now" in out and "-2m" in out and "-10m" in out
        assert "SLO" not in out


async def test_mismatched_lengths_are_refused() -> None:
    app = ChartApp()
    async with app.run_test(size=(80, 16)):
        chart = app.query_one(BudgetChart)
        with pytest.raises(ValueError, match="same length"):
            chart.set_series(times=[T0], budget=[], in_flight=[1], p95_ttft_ms=[1], slo_ttft_ms=None)


def test_time_ticks_relative_and_utc() -> None:
    ticks, labels = time_ticks(-600, 0, T0, "relative")
    assert labels[-1] == "now" and labels[0] == "-10m"
    assert ticks == sorted(ticks)
    ticks, labels = time_ticks(-86400, 0, T0, "utc")
    assert 2 <= len(ticks) <= 7
    assert all(-86400 <= t <= 0 for t in ticks)
    assert all(re.fullmatch(r"\d\d:\d\d|\d\d-\d\d", label) for label in labels)


def test_value_ticks_are_round() -> None:
    ticks, labels = value_ticks(11500)
    assert ticks[0] == 0 and ticks[-1] <= 11500
    assert labels[:3] == ["0", "2.5k", "5k"]
    assert value_ticks(0) == ([0.0], ["0"])


# ---- issue #12 item 11: readable at 80x24 and 160x48 -------------------------------------


def test_close_marks_get_labels_that_never_overlap():
    from console.widgets.budget_chart import place_labels

    marks = [(float(x), text) for x, text in ((-300, "set 6144"), (-299, "ctl 8192"), (-297, "freeze"), (-296, "open"))]
    placed = place_labels(marks, -600.0, 0.0, 60)
    spans: dict[int, list[tuple[int, int]]] = {}
    for x, text, row, _alignment in placed:
        start = int((x + 600) / 600 * 48)
        for a, b in spans.get(row, []):
            assert start + len(text) + 1 <= a or start >= b, (text, row)
        spans.setdefault(row, []).append((start, start + len(text) + 1))
    assert {t for _, t, _, _ in placed} >= {"set 6144", "ctl 8192", "freeze"}
    ((_, _, _, alignment),) = place_labels([(-1.0, "started")], -600.0, 0.0, 60)
    assert alignment == "right"  # at the right edge the label ends at its line  # 3 rows: 3 close labels fit


def test_p95_and_slo_have_their_own_colours():
    from console.widgets.budget_chart import SLO_COLOR, TTFT_COLOR

    assert SLO_COLOR != TTFT_COLOR


@pytest.mark.parametrize("height", [12, 16, 22, 29, 32, 40])
async def test_the_slo_line_never_shares_a_row_with_a_left_axis_label(height):
    """Rendered, as plotext draws it (80x24 gives the chart 12 rows, 160x48 about 30)."""
    for slo, budget in ((2500, 8192.0), (2000, 8192.0), (1500, 8192.0), (100000, 8192.0), (1000, 24576.0)):
        app = ChartApp()
        async with app.run_test(size=(80, height)) as pilot:
            chart = app.query_one(BudgetChart)
            data = series()
            data["budget"] = [budget] * len(data["budget"])
            chart.set_series(**data, slo_ttft_ms=slo)
            await pilot.pause()
            for line in text_of(chart).splitlines():
                if "-----" in line:  # the SLO line
                    left_label = re.split("[┤│]", line, maxsplit=1)[0].strip()
                    assert not left_label, (height, slo, line[:12])


async def test_a_hand_set_budget_shows_beside_the_controllers():
    app = ChartApp()
    async with app.run_test(size=(80, 20)) as pilot:
        chart = app.query_one(BudgetChart)
        data = series()
        chart.set_series(**data, slo_ttft_ms=1500, hand_set=(data["times"][100], 6144.0))
        await pilot.pause()
        assert "set by hand" in text_of(chart)


@pytest.mark.parametrize("height", [11, 12, 14, 16, 22, 29, 40])
@pytest.mark.parametrize("budget", [2048.0, 8000.0])
async def test_the_slo_line_is_labelled_with_the_slo(height, budget):
    """A trial's review chart (a 2,048-token budget, p95 up to 4.4 s) drew a 3,000 ms SLO line
    labelled "2k" on the right axis: the 2k tick landed on the SLO's row, over its label."""
    from console.widgets.budget_chart import _compact

    for slo, peak in ((3000, 4377.0), (3000, 2925.0), (2000, 5000.0), (3000, 60000.0), (1500, 900.0), (60000, 5077.0)):
        app = ChartApp()
        async with app.run_test(size=(118, height)) as pilot:
            chart = app.query_one(BudgetChart)
            data = series()
            data["budget"] = [budget] * len(data["budget"])
            data["p95_ttft_ms"] = [peak * (0.5 + 0.5 * math.sin(i / 20)) for i in range(len(data["p95_ttft_ms"]))]
            chart.set_series(**data, slo_ttft_ms=slo)
            await pilot.pause()
            rows = [line for line in text_of(chart).splitlines() if "-----" in line]
            assert rows, (height, slo)
            right = re.split("[├┤│]", rows[0].rstrip())[-1].strip()
            assert right in ("", _compact(slo)), (height, slo, peak, rows[0][-12:])
            labelled = [line for line in text_of(chart).splitlines() if line.rstrip().endswith(_compact(slo))]
            assert labelled, (height, slo, peak)


@pytest.mark.parametrize("height", [12, 14, 16, 22])
async def test_close_mark_labels_are_drawn_on_rows_of_their_own(height):
    """A trial's review chart (120x40: an 8-row plot) drew "setpause_clas": place_labels had put
    pause_class on its second label row to miss set_budget, and that row fell on the first's
    terminal row. Rendered, every label drawn is whole, and none is drawn over another."""
    app = ChartApp(time_axis="utc")
    async with app.run_test(size=(120, height)) as pilot:
        chart = app.query_one(BudgetChart)
        n = 1800  # an hour; the lines away from the labels' rows (a line drawn later covers a label)
        times = [T0 + 2.0 * i for i in range(n)]
        chart.set_series(times=times, budget=[8000.0] * n, in_flight=[300.0] * n, p95_ttft_ms=[50.0] * n, slo_ttft_ms=1500, marks=MARKS)
        await pilot.pause()
        out = text_of(chart)
        drawn = [label[:10] for _, label in MARKS if label[:10] in out]
        assert len(drawn) >= 3, (height, out)  # three label rows: three close labels
        for line in out.splitlines():
            for word in re.findall(r"[a-z][a-z_]{3,}", line):
                assert word in {m[:10] for _, m in MARKS} or word in ("tokens", "left", "right", "budget", "flight"), (height, word, out)


MARKS = [(T0 + 2400, "set_budget"), (T0 + 2460, "pause_class"), (T0 + 2520, "resume_class"), (T0 + 2580, "set_class")]  # 2 columns apart
