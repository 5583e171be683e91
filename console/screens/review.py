"""The review screen: a journal file, read-only, over a chosen time range.

Self-contained, so the live console can ``push_screen(ReviewScreen(journal_path))`` (key
``r``) and ``tokengate review`` can run it alone (:class:`console.review_app.ReviewApp`):
it opens its own read-only connection (:class:`gate.journal.reader.JournalReader`) and
closes it on unmount. ``q`` dismisses it with ``None`` (or the open error's message when the
journal could not be read). ``escape`` never does: it clears the filter (or leaves the filter
field); with nothing to clear it says that ``q`` closes (a second esc meant for a filter quit
``tokengate review`` at once, and the what-if's edits with it).

Shows: the budget curve for the range (samples bucketed in SQL to at most
``CHART_POINTS`` points) with audit events as marks; the audit rows; the decisions, one
page of ``PAGE_SIZE`` rows at a time, keyset-paged from SQLite (never all loaded),
newest first; a filter (``/``); CSV export of the whole filtered view (``e``, in a
thread); the what-if (``w``, console/screens/whatif.py): the window shown replayed under
edited thresholds.

"now" is the newest row in the journal (so a journal from yesterday opens on its last
hour), or ``clock()`` when a clock is given; it is fixed when the screen opens and moves
only on ``r`` (reload), so paging and counts stay consistent while the gate writes on.
All times are shown in UTC, like ``tokengate log``.
"""

from __future__ import annotations

import math
import os
import shlex
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

from rich.text import Text
from textual import events, on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Input, Static
from textual.worker import Worker, WorkerState, get_current_worker

from console.styles import OUTCOME
from console.widgets.budget_chart import BudgetChart
from console.widgets.inputs import InOrderInput
from gate.journal.reader import (
    FILTER_FIELDS,
    DecisionFilters,
    JournalReader,
    ReviewError,
    default_export_name,
    export_decisions_csv,
    window_moments,
)

PAGE_SIZE = 200
CHART_POINTS = 600
AUDIT_ROWS = 200  # newest audit rows listed (the count says how many there are)

#: (label, seconds; None = everything in the journal), keys 1-5
RANGES: tuple[tuple[str, float | None], ...] = (
    ("15m", 900.0),
    ("1h", 3600.0),
    ("6h", 21600.0),
    ("24h", 86400.0),
    ("all", None),
)
DEFAULT_RANGE = 1  # last 1h

OUTCOMES = ("admitted", "refused", "shed", "cancelled", "failed", "forwarded")
_FILTER_KEYS = {
    "class": "cls",
    "cls": "cls",
    "reason": "reason",
    "tenant": "tenant",
    "outcome": "outcome",
    "since": "since",
    "until": "until",
}
#: the journal's ttft_ms, labelled for what it is (the review's "TTFT ms" counts from arrival)
DISPATCH_TTFT = "disp. TTFT ms"
#: a decision's fields as the row opened whole (enter) names them: the two first-token times said apart
DECISION_FIELD_LABELS = {
    "ttft_arrival_ms": "ttft_arrival_ms (TTFT ms: from arrival, queue included)",
    "ttft_ms": f"ttft_ms ({DISPATCH_TTFT}: from dispatch)",
}
FILTER_HELP = "class=batch reason=queue_full tenant=alice outcome=refused (a,b = either) since=23:01 until=23:15 (UTC)"
_TIME_KEYS = ("since", "until")


def parse_when(text: str, now: float) -> float:
    """A review time, UTC like the screen: ``23:01``/``23:01:30`` (that day of the journal's newest
    row, `now` here, or the day before when later than it), ``2026-12-01T23:01`` (ISO), or
    ``10m``/``2h`` ago: `parse_since`, the reading `tokengate log` and `tokengate replay` share."""
    from gate.journal.reader import parse_since

    try:
        return parse_since(text, now)
    except ValueError as e:
        raise FilterError(str(e)) from None


class FilterError(ValueError):
    """The filter text is not ``key=value`` terms (the message says what is wrong)."""


def parse_filter(text: str) -> dict[str, tuple[str, ...]]:
    """``class=batch outcome=refused,shed tenant="a b"`` -> ``{"cls": ("batch",),
    "outcome": ("refused", "shed"), "tenant": ("a b",)}``. Keys: class (or cls), reason,
    tenant, outcome; ``a,b`` accepts either; a key given twice accepts either too. An
    empty text is no filter. Raises :class:`FilterError`."""
    try:
        terms = shlex.split(text)
    except ValueError as e:
        raise FilterError(f"cannot read the filter: {e}") from None
    out: dict[str, list[str]] = {}
    for term in terms:
        key, sep, value = term.partition("=")
        key = key.strip().lower()
        if not sep:
            raise FilterError(f"{term!r} is not key=value; use {FILTER_HELP}")
        if key not in _FILTER_KEYS:
            raise FilterError(f"unknown filter key {key!r}: use class, reason, tenant, outcome, since or until")
        values = [v.strip() for v in value.split(",")]
        if not value.strip() or any(not v for v in values):
            raise FilterError(f"{term!r}: empty value")
        field = _FILTER_KEYS[key]
        if field in _TIME_KEYS:
            parse_when(value.strip(), time.time())  # checked now; resolved against the journal's day
            out[field] = [value.strip()]
            continue
        if field == "outcome":
            bad = [v for v in values if v not in OUTCOMES]
            if bad:
                raise FilterError(f"outcome {bad[0]!r} is not one of {', '.join(OUTCOMES)}")
        seen = out.setdefault(field, [])
        seen.extend(v for v in values if v not in seen)
    return {k: tuple(v) for k, v in out.items()}


def format_filter(filters: dict[str, tuple[str, ...]]) -> str:
    names = {"cls": "class", "reason": "reason", "tenant": "tenant", "outcome": "outcome", "since": "since", "until": "until"}
    parts = []
    for field in (*FILTER_FIELDS, *_TIME_KEYS):
        values = filters.get(field)
        if values:
            joined = ",".join(values)
            parts.append(f"{names[field]}={shlex.quote(joined) if ' ' in joined else joined}")
    return " ".join(parts)


def _utc(ts: float | None, fmt: str = "%m-%d %H:%M:%S") -> str:
    if ts is None:
        return "-"
    return time.strftime(fmt, time.gmtime(ts))


def _num(v: Any, digits: int = 0) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return f"{v:,}" if isinstance(v, int) else str(v)


class DecisionTable(DataTable):
    """The decisions page; pagedown/pageup turn the page (not scroll inside it)."""

    BINDINGS = [
        Binding("pagedown", "screen.next_page", "Next page", show=False),
        Binding("pageup", "screen.prev_page", "Prev page", show=False),
    ]


class ReviewScreen(Screen[str | None]):
    """Review a journal file read-only. See the module docstring."""

    DEFAULT_CSS = """
    ReviewScreen {
        layout: vertical;
    }
    ReviewScreen #review-header {
        height: 1;
        background: $panel;
    }
    ReviewScreen #review-body {
        height: 1fr;
    }
    ReviewScreen #review-chart {
        width: 1fr;
        height: 2fr;
        min-height: 5;
        max-height: 16;
    }
    ReviewScreen #review-audit-box {
        width: 1fr;
        height: 1fr;
        min-height: 3;
        max-height: 10;
    }
    ReviewScreen #review-audit-title {
        height: 1;
        color: $text-muted;
    }
    ReviewScreen #review-audit {
        height: 1fr;
    }
    ReviewScreen #review-filter {
        height: 1;
    }
    ReviewScreen #review-filter-error {
        height: auto;
        color: $error;
        display: none;
    }
    ReviewScreen #review-filter-error.shown {
        display: block;
    }
    ReviewScreen #review-decisions {
        height: 3fr;
        min-height: 10;
    }

    ReviewScreen #review-status {
        height: 1;
        background: $panel;
    }
    ReviewScreen #review-error {
        height: 1fr;
        content-align: center middle;
        color: $error;
        display: none;
    }
    """

    BINDINGS = [
        Binding("escape", "escape", "Clear filter"),
        Binding("q", "close", "Close"),
        Binding("1", "set_range(0)", "Range", key_display="1-5"),
        Binding("2", "set_range(1)", "1h", show=False),
        Binding("3", "set_range(2)", "6h", show=False),
        Binding("4", "set_range(3)", "24h", show=False),
        Binding("5", "set_range(4)", "all", show=False),
        Binding("n", "next_page", "Next page"),
        Binding("p", "prev_page", "Prev page"),
        Binding("slash", "focus_filter", "Filter"),
        Binding("e", "export", "Export CSV"),
        Binding("r", "reload", "Reload"),
        Binding(
            "w",
            "whatif",
            "What if",
            tooltip="what-if: replay the window shown (range or since=/until=) under edited thresholds, beside what happened",
        ),
    ]

    def __init__(
        self,
        journal_path: str | os.PathLike[str],
        *,
        slo_ttft_ms: float | None = None,
        clock: Callable[[], float] | None = None,
        export_dir: str | os.PathLike[str] | None = None,
        range_index: int | None = None,
        apply: Callable[[Any], Awaitable[list[str]]] | None = None,
        live: Callable[[], Awaitable[Any]] | None = None,
        no_apply: str = "",
        name: str | None = None,
        id: str | None = None,  # noqa: A002 - Textual's name
        classes: str | None = None,
    ) -> None:
        """``clock``: returns "now" (epoch seconds); default: the journal's newest row.
        ``slo_ttft_ms``: draws the SLO line (the journal does not record it).
        ``export_dir``: where ``e`` writes its CSV (default: the working directory).
        ``range_index``: into RANGES; default: the shortest range that holds the whole journal.
        ``apply``: the live console's sender of one command (the what-if's apply); None: replay
        only, ``no_apply`` saying why (default: review has no gate). ``live``: the gate's latest
        snapshot (what the what-if's confirmation compares with the thresholds replayed)."""
        super().__init__(name=name, id=id, classes=classes)
        self.journal_path = os.fspath(journal_path)
        self.slo_ttft_ms = slo_ttft_ms
        self.clock = clock
        self.export_dir = Path(export_dir) if export_dir is not None else None
        self.range_index = DEFAULT_RANGE if range_index is None else range_index
        self.apply = apply
        self.live = live
        self.no_apply = no_apply
        self._fit_range = range_index is None
        self.reader: JournalReader | None = None
        #: the open error (shown instead of the review), if any
        self.error: str | None = None
        #: "now": the end of every range (epoch seconds)
        self.now: float | None = None
        self.oldest: float | None = None
        self.newest: float | None = None  # the journal's last decision
        #: the what-if form's edits as it was left: the lines changed from its prefill, put over
        #: the next window's prefill (a live range moves with the clock)
        self._whatif_draft: str | None = None
        self.filter_fields: dict[str, tuple[str, ...]] = {}
        self.filters = DecisionFilters()
        self.page_rows: list[dict[str, Any]] = []
        self.page_no = 1
        self.total = 0
        self.audit: list[dict[str, Any]] = []
        self.audit_shown: list[dict[str, Any]] = []  # as listed, top to bottom
        self.audit_total = 0
        #: (path, rows) of the last finished export
        self.last_export: tuple[Path, int] | None = None
        self._review_unmounted = False
        #: strftime format of the tables' time column: the date only when the range spans days
        self.time_fmt = "%m-%d %H:%M:%S"

    # -- layout ------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Static(self._header_text(), id="review-header")
        with Vertical(id="review-body"):
            yield BudgetChart(
                id="review-chart",
                time_axis="utc",
                title="tokens (left) · p95 TTFT ms (right) · UTC",
            )
            with Vertical(id="review-audit-box"):
                yield Static("audit", id="review-audit-title")
                audit: DataTable[str] = DataTable(id="review-audit", cursor_type="row", zebra_stripes=True)
                for label, key in AUDIT_COLUMNS:
                    audit.add_column(label, key=key)
                self._audit_widths: tuple[tuple[str, int], ...] = ()  # the columns as laid out (`_show_audit`)
                yield audit
            yield InOrderInput(placeholder=f"/ filter: {FILTER_HELP}", id="review-filter", compact=True)
            yield Static("", id="review-filter-error")
            table = DecisionTable(id="review-decisions", cursor_type="row", zebra_stripes=True)
            for label, key in (
                ("arrived (UTC)", "ts"),  # a decision's ts is its arrival; the live tail shows its end
                ("tenant", "tenant"),
                ("class", "cls"),
                ("outcome", "outcome"),
                ("reason", "reason"),
                ("http", "http_status"),
                ("prompt", "prompt_tokens"),
                ("max", "max_tokens"),
                ("queue ms", "queue_ms"),
                # One word, one time: "TTFT ms" counts from arrival, as the live console's decision
                # tail and "met" count it; the journal's ttft_ms (from dispatch, the controller's
                # signal) is said as such. Shown as "ttft ms", a trial read "queue ms 297, ttft ms
                # 89" here beside the console's TTFT of ~400 for the same request.
                ("TTFT ms", "ttft_arrival_ms"),
                ("dur ms", "duration_ms"),
                (DISPATCH_TTFT, "ttft_ms"),  # after the duration: at 160 columns the columns before it fit as before
                ("why", "detail"),  # the refusal's message: queue_timeout names three different ones
            ):
                table.add_column(label, key=key)
            yield table
            yield Static("loading…", id="review-status")
        yield Static("", id="review-error")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#review-decisions", DataTable).focus()
        self.run_worker(self._start(), group="review-open", exit_on_error=False)

    async def on_unmount(self) -> None:
        self._review_unmounted = True
        reader, self.reader = self.reader, None
        if reader is not None:
            await reader.close()

    # -- loading -----------------------------------------------------------------------

    async def _start(self) -> None:
        try:
            reader = await JournalReader.open(self.journal_path)
        except ReviewError as e:
            self._show_error(str(e))
            return
        except Exception as e:  # noqa: BLE001 - any failure to open is shown, not raised
            self._show_error(f"{self.journal_path}: cannot open the journal: {type(e).__name__}: {e}")
            return
        if self._review_unmounted:
            await reader.close()
            return
        self.reader = reader
        try:
            await self._load_bounds()
            self._apply_range()
            await self._load_timeline()
            await self._load_decisions("first", count=True)
        except Exception as e:  # noqa: BLE001
            self._show_error(f"{self.journal_path}: reading the journal failed: {type(e).__name__}: {e}")

    async def _load_bounds(self) -> None:
        assert self.reader is not None
        lo, hi = await self.reader.bounds()
        self.oldest = lo
        # the what-if's end, as `tokengate replay`'s default: the last DECISION, not hi (the
        # newest row of any table: the samples and audit rows a gate writes after it)
        self.newest = await self.reader.last_decision_ts()
        if self.clock is not None:
            self.now = float(self.clock())
        else:
            self.now = hi if hi is not None else time.time()
        if self._fit_range and self.oldest is not None:
            # Open on the data: a journal of 9 minutes opens on 15m, not on 1h of blank.
            span = self.now - self.oldest
            self.range_index = next(
                (i for i, (_label, seconds) in enumerate(RANGES) if seconds is not None and span <= seconds),
                len(RANGES) - 1,
            )

    def _range_bounds(self) -> tuple[float | None, float | None]:
        """[since, until) of the current range; until just past "now" (inclusive of it). A
        `since=`/`until=` filter zooms to that window instead (an incident's minutes)."""
        assert self.now is not None
        until = math.nextafter(self.now, math.inf)
        seconds = RANGES[self.range_index][1]
        since = None if seconds is None else self.now - seconds
        if self.filter_fields.get("since"):
            since = parse_when(self.filter_fields["since"][0], self.now)
        if self.filter_fields.get("until"):
            until = parse_when(self.filter_fields["until"][0], self.now)
        return window_moments(since, until)  # an until= time of day before since= is on since='s day

    def _apply_range(self) -> None:
        since, until = self._range_bounds()
        self.filters = DecisionFilters(**self._filter_kwargs(self.filter_fields), since_ts=since, until_ts=until)
        start = since if since is not None else self.oldest
        one_day = start is not None and self.now is not None and time.gmtime(start)[:3] == time.gmtime(self.now)[:3]
        self.time_fmt = "%H:%M:%S" if one_day else "%m-%d %H:%M:%S"
        self._refresh_header()

    @staticmethod
    def _filter_kwargs(fields: dict[str, tuple[str, ...]]) -> dict[str, tuple[str, ...] | None]:
        return {k: fields.get(k) or None for k in FILTER_FIELDS}

    async def _load_timeline(self) -> None:
        reader = self.reader
        if reader is None or self.now is None:
            return
        since, until = self._range_bounds()
        chart_since = since if since is not None else (self.oldest if self.oldest is not None else self.now - 60)
        chart_until = until if until is not None else self.now
        if self.oldest is not None and not self.filter_fields.get("since") and chart_since < self.oldest:
            # a range wider than the journal starts at its first row, not in blank: a trial's
            # 3 minutes of journal filled the right fifth of 15m, the audit marks' labels clipped
            chart_since = max(min(self.oldest, chart_until - 60.0), chart_since)
        # the chart's right edge is the window's end: an until= filter's, else "now" (it was "now"
        # whatever until= said, as the header's end once was)
        chart_end = min(self.now, chart_until)
        points = await reader.sample_series(chart_since, chart_until, buckets=CHART_POINTS)
        audit = await reader.audit_rows(since, until, limit=AUDIT_ROWS)
        audit_total = await reader.count_audit(since, until)
        marks = await reader.audit_marks(chart_since, chart_until, buckets=200)
        if reader is not self.reader:
            return
        self.audit = audit
        self.audit_total = audit_total
        chart = self.query_one("#review-chart", BudgetChart)
        chart.set_series(
            times=[p.ts for p in points],
            budget=[p.budget for p in points],
            in_flight=[p.in_flight for p in points],
            p95_ttft_ms=[p.p95_ttft_ms for p in points],
            slo_ttft_ms=self.slo_ttft_ms,
            marks=marks,
            now=chart_end,
            window_s=max(chart_end - chart_since, 1.0),
        )
        self.audit_shown = list(reversed(audit))  # newest first, like the decisions
        self._show_audit(force=True)
        title = f"audit: {audit_total:,} in range"
        if audit_total > len(audit):
            title += f" (newest {len(audit):,} listed)"
        self.query_one("#review-audit-title", Static).update(title)

    async def _load_decisions(self, where: str, *, count: bool = False) -> None:
        """``where``: "first" (newest page), "next" (older), "prev" (newer)."""
        reader = self.reader
        if reader is None:
            return
        filters = self.filters
        kw: dict[str, Any] = {"filters": filters}
        page_no = self.page_no
        if where == "next" and self.page_rows:
            rows = await reader.decisions_page(before_id=self.page_rows[-1]["id"], limit=PAGE_SIZE, **kw)
            if not rows:
                self.notify("last page", timeout=2)
                return
            page_no += 1
        elif where == "prev" and self.page_rows:
            if page_no <= 1:
                self.notify("first page", timeout=2)
                return
            rows = await reader.decisions_page(after_id=self.page_rows[0]["id"], limit=PAGE_SIZE, **kw)
            rows.reverse()
            page_no -= 1
            if not rows or (page_no == 1 and len(rows) < PAGE_SIZE):
                rows = await reader.decisions_page(limit=PAGE_SIZE, **kw)
                page_no = 1
        else:
            rows = await reader.decisions_page(limit=PAGE_SIZE, **kw)
            page_no = 1
        total = await reader.count_decisions(**kw) if count else self.total
        if reader is not self.reader or filters is not self.filters:
            return  # superseded while reading
        self.page_rows = rows
        self.page_no = page_no
        self.total = total
        self._fill_decisions()

    def _fill_decisions(self) -> None:
        table = self.query_one("#review-decisions", DataTable)
        table.clear()
        table.add_rows(
            (
                (
                    Text(_utc(r["ts"], self.time_fmt)),
                    Text(r["tenant"]),
                    Text(r["cls"]),
                    _outcome_text(r["outcome"]),
                    Text(r["reason"]),
                    Text(str(r["http_status"])),
                    Text(_num(r["prompt_tokens"]), justify="right"),
                    Text(_num(r["max_tokens"]), justify="right"),
                    Text(_num(r["queue_ms"]), justify="right"),
                    Text(_num(r.get("ttft_arrival_ms")), justify="right"),  # none in a journal before v4: "-"
                    Text(_num(r["duration_ms"]), justify="right"),
                    Text(_num(r["ttft_ms"]), justify="right"),
                    Text(r.get("detail") or ""),
                )
                for r in self.page_rows
            ),
        )
        # Cells are rich Text, never str: a str cell is parsed as markup (a tenant named
        # "[b]x" would be mangled) and measuring it costs ~3x more (200 rows x 12 cells).
        self._refresh_status()

    @property
    def page_ids(self) -> list[int]:
        """The journal ids of the rows shown, top to bottom."""
        return [r["id"] for r in self.page_rows]

    def _refresh_status(self) -> None:
        if self.error is not None:
            return
        if self.page_rows:
            first = (self.page_no - 1) * PAGE_SIZE + 1
            last = first + len(self.page_rows) - 1
            text = f"page {self.page_no}, rows {first:,}-{last:,} of {self.total:,}"
        else:
            text = f"page 1, rows 0-0 of {self.total:,} (no decisions match)"
        shown = format_filter(self.filter_fields)
        text += f"  ·  filter: {shown}" if shown else "  ·  no filter"
        text += "  ·  n/p page  / filter  e export"
        self.query_one("#review-status", Static).update(Text(" " + text))

    def _header_text(self) -> Text:
        window = ""
        if self.now is not None:
            since, until = self._range_bounds()
            start = since if since is not None else self.oldest
            # an until= filter ends the window before "now" (a trial's header read "now" while
            # the rows and the what-if ended at the filter's until)
            end = min(self.now, until) if until is not None else self.now
            fmt = "%Y-%m-%d %H:%M:%S"
            window = f"{_utc(start, fmt)} → {_utc(end, fmt)} UTC"
        text = self._header(window, narrow=False)
        if window and text.cell_len > self.size.width > 0:
            # narrow (80 columns cut it after the range keys and the window's date): the window
            # first, its date once, then the keys (the footer lists "1-5 Range" too)
            if window[:10] == window[22:32]:
                window = window[:22] + window[33:]
            text = self._header(window, narrow=True)
        return text

    def _header(self, window: str, *, narrow: bool) -> Text:
        text = Text()
        text.append(" REVIEW ", style="bold black on dark_orange")
        text.append(f" {Path(self.journal_path).name} ", style="bold")
        if narrow:
            text.append(f" {window} ")
        text.append(" read-only ", style="dim")
        text.append("  range ")
        for i, (label, _s) in enumerate(RANGES):
            style = "bold reverse" if i == self.range_index else "dim"
            text.append(f"{i + 1} {label}", style=style)
            text.append(" ")
        if window and not narrow:
            text.append(f"  {window}")
        return text

    def on_resize(self, event: events.Resize) -> None:
        if self.now is not None:
            self._refresh_header()
            self.call_after_refresh(self._show_audit)

    def _show_audit(self, *, force: bool = False) -> None:
        """The audit rows in columns sized to them and to the width (`audit_layout`), laid out
        again when the width asks for other columns (`force`: new rows)."""
        table = self.query_one("#review-audit", DataTable)
        cells = [
            {key: _utc(a["ts"], self.time_fmt) if key == "ts" else _audit_value(a, key) for _label, key in AUDIT_COLUMNS}
            for a in self.audit_shown
        ]
        # the scrollbar's two columns aside; before the first layout, the screen's width
        width = (table.size.width or self.size.width or self.app.size.width) - 2
        widths = audit_layout(cells, width)
        if not force and widths == self._audit_widths:
            return
        self._audit_widths = widths
        labels = dict((key, label) for label, key in AUDIT_COLUMNS)
        table.clear(columns=True)
        for key, w in widths:
            table.add_column(labels[key], width=w, key=key)
        table.add_rows(tuple(Text(_fit(row[key], w)) for key, w in widths) for row in cells)

    def _refresh_header(self) -> None:
        self.query_one("#review-header", Static).update(self._header_text())

    def _show_error(self, message: str) -> None:
        self.error = message
        self.query_one("#review-body").display = False
        err = self.query_one("#review-error", Static)
        err.update(Text(f"cannot review the journal\n\n{message}\n\npress q to close", justify="center"))
        err.display = True
        self.notify(message, title="review", severity="error", timeout=10)

    # -- actions -----------------------------------------------------------------------

    def action_close(self) -> None:
        filt = self.query_one("#review-filter", Input)
        if self.focused is filt:
            self.query_one("#review-decisions", DataTable).focus()
            return
        self.dismiss(self.error)

    def action_escape(self) -> None:
        """Esc clears a filter, as in the live console, or leaves the filter field; it never
        closes the review (q does): with nothing to clear, it says so."""
        filt = self.query_one("#review-filter", Input)
        if self.filter_fields or filt.value:
            filt.value = ""
            self._filter_submitted(Input.Submitted(filt, ""))
            return
        if self.focused is filt:
            self.query_one("#review-decisions", DataTable).focus()
            return
        self.notify("nothing to clear: q closes the review (esc never does)", timeout=3, markup=False)

    def action_set_range(self, index: int) -> None:
        if not 0 <= index < len(RANGES):
            return
        self.range_index = index
        if self.reader is None or self.now is None:
            self._refresh_header()
            return
        self._apply_range()
        self.run_worker(self._load_timeline(), group="review-timeline", exclusive=True, exit_on_error=False)
        self.run_worker(self._load_decisions("first", count=True), group="review-decisions", exclusive=True, exit_on_error=False)

    def action_next_page(self) -> None:
        if self.reader is not None:
            self.run_worker(self._load_decisions("next"), group="review-decisions", exclusive=True, exit_on_error=False)

    def action_prev_page(self) -> None:
        if self.reader is not None:
            self.run_worker(self._load_decisions("prev"), group="review-decisions", exclusive=True, exit_on_error=False)

    @on(DataTable.RowSelected)
    def _row_selected(self, event: DataTable.RowSelected) -> None:
        """Enter (or a click on the selected row): every field of that row, uncut."""
        event.stop()
        self.open_row(event.data_table, event.cursor_row)

    def open_row(self, table: DataTable, row: int) -> None:
        from console.screens.record import RecordScreen

        focused = table
        if focused.id == "review-audit" and row < len(self.audit_shown):
            a = self.audit_shown[row]
            fields = [("time (UTC)", _utc(a["ts"], "%Y-%m-%d %H:%M:%S"))]
            fields += [(label, _audit_value(a, key)) for label, key in AUDIT_COLUMNS if key != "ts"]
            self.app.push_screen(RecordScreen(f"audit: {a['action']} {a['target']}", fields))
        elif focused.id == "review-decisions" and row < len(self.page_rows):
            r = self.page_rows[row]
            fields = [("arrived (UTC)", _utc(r["ts"], "%Y-%m-%d %H:%M:%S"))]
            fields += [(DECISION_FIELD_LABELS.get(k, k), "-" if v is None else str(v)) for k, v in r.items() if k != "ts"]
            self.app.push_screen(RecordScreen(f"decision {r.get('request_id', '')}", fields))

    def action_focus_filter(self) -> None:
        self.query_one("#review-filter", Input).focus()

    def action_reload(self) -> None:
        if self.reader is None:
            return

        async def reload() -> None:
            await self._load_bounds()
            self._apply_range()
            await self._load_timeline()
            await self._load_decisions("first", count=True)

        # the timeline's group: a page turn meanwhile is discarded (the filters change) and
        # the reload ends on the first page anyway
        self.run_worker(reload(), group="review-timeline", exclusive=True, exit_on_error=False)

    def action_whatif(self) -> None:
        """``w``: the what-if over the window shown (console/screens/whatif.py)."""
        from console.screens.whatif import WhatIfScreen, window_text

        if self.reader is None or self.now is None:
            # a `w` pressed before the journal has opened (its first second) is not lost silently
            why = "the journal could not be opened" if self.error else "the journal is still opening: press w again in a moment"
            self.notify(why, severity="warning", timeout=3)
            return
        since, until = self._range_bounds()
        if self.newest is not None and until is not None and until > self.newest + 1e-6:
            # A range reaching past the last decision (a live gate's "now", minutes after the
            # incident) ends where `tokengate replay` ends it by default: just after that
            # decision (the idle tail diluted tokens/s: 7.9 here against 69.4 from the CLI, a
            # user's trial, 2026-12-05).
            until = self.newest + 1e-6
        # A range reaching back past the gate's start (15m over a 1-minute journal) is passed
        # as it is: the replay starts it at the gate's start, as `tokengate replay --since`
        # does, and the title then shows the window replayed (it once began at the first
        # decision instead, a few seconds later than both said: tokens/s disagreed).
        text = window_text(self.journal_path, since if since is not None else self.oldest, until)
        self.app.push_screen(
            WhatIfScreen(
                self.journal_path,
                since,
                until,
                window_text=text,
                apply=self.apply,
                live=self.live,
                no_apply=self.no_apply,
                draft=self._whatif_draft,
                keep_draft=self._keep_whatif_draft,
            )
        )

    def _keep_whatif_draft(self, form: str) -> None:
        self._whatif_draft = form

    def action_export(self) -> None:
        if self.reader is None:
            self.notify("nothing to export: the journal is not open", severity="warning")
            return
        directory = self.export_dir if self.export_dir is not None else Path.cwd()
        out = directory / default_export_name()
        n = 1
        while out.exists():  # two exports in the same second
            n += 1
            out = directory / default_export_name().replace(".csv", f"-{n}.csv")
        self.notify(f"exporting {self.total:,} decisions to {out} …", timeout=3)
        self.run_worker(
            partial(self._export_thread, out, self.filters),
            thread=True,
            group="review-export",
            name=str(out),
            exit_on_error=False,
        )

    def _export_thread(self, out: Path, filters: DecisionFilters) -> tuple[Path, int]:
        worker = get_current_worker()
        rows = export_decisions_csv(self.journal_path, out, filters, cancelled=lambda: worker.is_cancelled)
        return out, rows

    # -- events ------------------------------------------------------------------------

    @on(Input.Submitted, "#review-filter")
    def _filter_submitted(self, event: Input.Submitted) -> None:
        error = self.query_one("#review-filter-error", Static)
        try:
            fields = parse_filter(event.value)
        except FilterError as e:
            error.update(Text(f"filter not applied: {e}"))
            error.add_class("shown")
            self.notify(str(e), title="filter", severity="error", timeout=5)
            return
        error.update("")
        error.remove_class("shown")
        self.filter_fields = fields
        self.query_one("#review-decisions", DataTable).focus()
        if self.reader is None or self.now is None:
            return
        self._apply_range()
        # the chart and the audit list follow a since=/until= window as the rows and the header do
        # (a trial's since=19:18:50 until=19:19:20 kept a chart of 19:16-19:31 and an audit list
        # of rows outside the window under "audit: 8 in range")
        self.run_worker(self._load_timeline(), group="review-timeline", exclusive=True, exit_on_error=False)
        self.run_worker(self._load_decisions("first", count=True), group="review-decisions", exclusive=True, exit_on_error=False)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        worker = event.worker
        if event.state == WorkerState.SUCCESS and worker.group == "review-export" and worker.result is not None:
            out, rows = worker.result
            self.last_export = (out, rows)
            self.notify(f"exported {rows:,} decisions to {out}", title="export", timeout=8)
        elif event.state == WorkerState.ERROR:
            error = worker.error
            what = "export" if worker.group == "review-export" else "review"
            message = str(error) if isinstance(error, ReviewError) else f"{type(error).__name__}: {error}"
            self.notify(message, title=f"{what} failed", severity="error", timeout=10)


AUDIT_COLUMNS = (
    ("time (UTC)", "ts"),
    ("operator", "operator"),
    ("from", "origin"),
    ("source", "source"),
    ("action", "action"),
    ("target", "target"),
    ("old", "old_value"),
    ("new", "new_value"),
    ("note", "note"),
)


NOTE_LEAST = 10  # the note takes what the others leave, this much at least (else it goes)
#: what gives way, in order, while the columns do not fit: the old and new values shorten, where
#: from and through what go, the rest shortens, the note goes (a row opened whole shows it), the
#: values shorten again; action and target stay readable longest (at 80 columns, whole)
AUDIT_NARROWING: tuple[tuple[str, int | None], ...] = (
    # first what is longer than it needs be: a config_in_force row's value is the whole config
    # as JSON, ~1,000 characters (the row opened with enter shows each value whole)
    ("new_value", 18),
    ("old_value", 18),
    ("target", 24),
    ("action", 20),
    ("operator", 12),
    ("origin", 15),
    ("source", 10),
    ("old_value", 12),
    ("new_value", 12),
    ("origin", None),
    ("source", None),
    ("old_value", 8),
    ("new_value", 8),
    ("operator", 8),
    ("note", None),
    ("old_value", 6),
    ("new_value", 6),
    ("target", 16),
    ("action", 14),
    ("operator", None),
    ("target", 12),
    ("action", 12),
)
_CELL_PADDING = 2  # a DataTable cell's padding, one column each side


def audit_layout(rows: list[dict[str, str]], width: int) -> tuple[tuple[str, int], ...]:
    """(key, width) of each audit column shown in `width` columns: each as wide as its widest
    cell (or its label), the note taking the rest; while they do not fit, AUDIT_NARROWING's
    steps shorten a column (never below its label) or drop it. A trial's
    list at 120x40 showed its columns at their labels' widths ("loca", "consol", "resume",
    "class:", "Tru", "Fal"): sized here from the rows, not left to the table's own sizing."""
    labels = {key: label for label, key in AUDIT_COLUMNS}
    sizes = {key: max([len(labels[key])] + [len(r[key]) for r in rows]) for key in labels}
    shown = [key for _label, key in AUDIT_COLUMNS]
    note_least = min(NOTE_LEAST, sizes["note"])

    def left() -> int:  # what the note gets (all of it when the note is gone: at least 0 to fit)
        return width - sum(sizes[k] + _CELL_PADDING for k in shown if k != "note") - _CELL_PADDING * ("note" in shown)

    for key, most in AUDIT_NARROWING:
        if left() >= (note_least if "note" in shown else 0):
            break
        if most is None:
            if key in shown:
                shown.remove(key)
        else:
            sizes[key] = min(sizes[key], max(most, len(labels[key])))
    return tuple((k, max(left(), 1) if k == "note" else sizes[k]) for k in shown)


def _fit(text: str, width: int) -> str:
    """`text` in `width` characters: cut with an ellipsis."""
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


def _audit_value(a: dict[str, Any], key: str) -> str:
    value = a.get(key)
    return "-" if value is None or value == "" else str(value)


def _outcome_text(outcome: str) -> Text:
    return Text(outcome, style=OUTCOME.get(outcome, ""))
