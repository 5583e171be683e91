"""Layout at 80x24 and 200x50, and what each panel renders from a snapshot."""

from __future__ import annotations

import dataclasses

import pytest
from rich.text import Text

from console.app import CHART_POINTS, TokengateApp
from console.styles import ttft_style
from console.widgets.classes import FULL as CLASS_FULL
from console.widgets.classes import NARROW as CLASS_NARROW
from console.widgets.classes import TINY as CLASS_TINY
from console.widgets.decisions import DecisionTail
from gate.data.snapshot import JournalView
from gate.observe.gpu import GpuReading
from gate.ops.link import InProcessLink
from tests.console.conftest import FIXED_NOW, decision, enrich, make_app, record


def visible(app: TokengateApp, widget) -> bool:
    region = widget.region
    screen = app.screen.region
    return widget.display and region.area > 0 and screen.contains_region(region)


def styles_of(text: Text, needle: str, skip: str = "") -> set[str]:
    """The styles of the spans that cover `needle` (the first after `skip`) in `text`."""
    start = text.plain.index(skip + needle) + len(skip)
    return {str(span.style) for span in text.spans if span.start <= start < span.end}


async def test_80x24_is_compact_and_shows_the_classes_table(gate):
    await enrich(gate)
    app = make_app(gate)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert app.compact and app.body.has_class("compact")
        for widget in (app.header, app.slots, app.gpu, app.class_table, app.tabs, app.decisions, app.status):
            assert visible(app, widget), widget
        assert not app.denials.display and not app.chart.display  # behind their tabs
        assert app.class_table.columns_shown == CLASS_TINY
        assert [str(r.key.value) for r in app.class_table.ordered_rows] == ["interactive", "batch"]
        # every class row fits on screen, p95 vs SLO column included
        assert app.class_table.region.height >= 3
        assert app.class_table.virtual_size.width <= app.class_table.region.width
        shot = app.export_screenshot()
        for text in ("interactive", "batch", "LIVE", "alice", "p95/obj", "denials", "decisions"):
            assert text in shot.replace("&#160;", " "), text
        # the tabs switch the pane
        app.tabs.active = "tab-denials"
        await pilot.pause()
        assert visible(app, app.denials) and not app.decisions.display
        app.tabs.active = "tab-chart"
        await pilot.pause()
        assert visible(app, app.chart) and not app.denials.display


async def test_200x50_shows_every_panel_at_once(gate):
    await enrich(gate)
    app = make_app(gate)
    async with app.run_test(size=(200, 50)) as pilot:
        await pilot.pause()
        assert not app.compact
        assert not app.tabs.display
        for widget in (app.header, app.slots, app.gpu, app.class_table, app.denials, app.decisions, app.chart, app.status):
            assert visible(app, widget), widget
        assert app.class_table.columns_shown == CLASS_FULL
        assert app.class_table.region.height >= 2 + 1 + 2  # both classes, the header, the border
        assert app.decisions.columns_shown == DecisionTail.__init__.__globals__["FULL"]
        assert app.chart.region.height >= 15 and app.decisions.region.height >= 15
        assert "per-slot" not in str(app.slots.content)  # /slots was polled: bars per slot
        assert "s2" in str(app.slots.content) and "1900/2048" in str(app.slots.content)


async def test_tiny_terminals_do_not_crash(gate):
    await enrich(gate)
    app = make_app(gate)
    async with app.run_test(size=(50, 14)) as pilot:
        await pilot.pause()
        assert app.compact and app.last_error is None
        await pilot.resize_terminal(20, 6)
        await app.tick()
        await pilot.pause()
        assert app.is_running and app.last_error is None


async def test_resizing_switches_between_the_layouts(gate):
    app = make_app(gate)
    async with app.run_test(size=(200, 50)) as pilot:
        assert not app.compact
        await pilot.resize_terminal(80, 24)
        await pilot.pause()
        assert app.compact and visible(app, app.class_table)
        assert app.class_table.columns_shown == CLASS_TINY
        await pilot.resize_terminal(200, 50)
        await pilot.pause()
        assert not app.compact and visible(app, app.denials) and visible(app, app.chart)
        assert app.class_table.columns_shown == CLASS_FULL
        assert app.class_table.selected_class == "interactive"


async def test_header_shows_listen_states_label_operator_and_clock(gate):
    app = make_app(gate)
    async with app.run_test(size=(200, 50)):
        header = app.header.content
        plain = header.plain
        for part in ("LIVE", gate.snapshot().listen, "default:", "ready", "op alice"):
            assert part in plain, part
        assert "READ-ONLY" not in plain and "PAUSED" not in plain and "JOURNAL" not in plain
        assert "bold green" in styles_of(header, "ready")
        snap = gate.snapshot()
        down = dataclasses.replace(snap, backends=(dataclasses.replace(snap.backends[0], state="down"),))
        app.header.update_snapshot(down)
        assert "bold red" in styles_of(app.header.content, "down")
        loading = dataclasses.replace(snap, backends=(dataclasses.replace(snap.backends[0], state="loading"),))
        app.header.update_snapshot(loading)
        assert "bold yellow" in styles_of(app.header.content, "loading")


async def test_journal_trouble_shows_a_red_banner(gate):
    app = make_app(gate)
    async with app.run_test(size=(80, 24)) as pilot:
        bad = JournalView(ok=False, path="/var/lib/tokengate/journal.db", written=10, dropped=42, pending=0, last_error="disk I/O error")
        app.header.update_snapshot(dataclasses.replace(gate.snapshot(), journal=bad))
        await pilot.pause()
        text = app.header.content
        assert "JOURNAL FAILING" in text.plain and "42 rows dropped" in text.plain and "disk I/O error" in text.plain
        assert "bold white on red" in styles_of(text, "JOURNAL FAILING")
        assert app.header.size.height >= 2  # the banner has a line of its own


async def test_gpu_panel_says_na_with_the_reason(gate):
    gate.gpu_reading = GpuReading.failed("NVML library not found")
    app = make_app(gate)
    async with app.run_test(size=(200, 50)):
        assert "n/a: NVML library not found" in str(app.gpu.content)
    gate.gpu_reading = None
    app = make_app(gate)
    async with app.run_test(size=(80, 24)):
        assert "n/a" in str(app.gpu.content)


async def test_gpu_panel_shows_each_device(gate):
    await enrich(gate)
    app = make_app(gate)
    async with app.run_test(size=(200, 50)):
        assert "GPU0 NVIDIA H200  61.0/140.0 GiB  44%" in str(app.gpu.content)


async def test_deferred_requests_in_llama_show_red(gate):
    app = make_app(gate)
    async with app.run_test(size=(200, 50)):
        snap = gate.snapshot()
        assert "deferred n/a" in str(app.slots.content)  # /metrics not polled yet
        bad = dataclasses.replace(snap, backends=(dataclasses.replace(snap.backends[0], requests_deferred=3),))
        app.slots.update_snapshot(bad)
        text = app.slots.content
        assert "deferred 3" in text.plain
        assert "bold white on red" in styles_of(text, "3", skip="deferred ")
        ok = dataclasses.replace(snap, backends=(dataclasses.replace(snap.backends[0], requests_deferred=0),))
        app.slots.update_snapshot(ok)
        assert "green" in styles_of(app.slots.content, "0", skip="deferred ")


def test_p95_colours_against_the_slo():
    assert ttft_style(600, 1000) == "green"
    assert ttft_style(800, 1000) == "yellow"
    assert ttft_style(1000, 1000) == "yellow"
    assert ttft_style(1200, 1000) == "bold red"
    assert ttft_style(None, 1000) == "dim"


async def test_classes_table_shows_each_column_and_p95_colour(gate):
    await enrich(gate)
    app = make_app(gate)
    async with app.run_test(size=(200, 50)):
        cells = {col: app.class_table.get_cell("batch", col) for col in CLASS_FULL}
        assert str(cells["name"]) == "batch" and cells["prio"] == 1 and cells["limit"] == "-"
        assert str(cells["queued"]) == "0/8"
        assert str(cells["ref"]) == "5" and "red" in str(cells["ref"].style)
        assert str(cells["p95"]) == "123/2,000" and cells["p95"].style == "green"  # from arrival: 3 ms waited, 120 from dispatch


async def test_tables_update_in_place_never_cleared_per_tick(gate, monkeypatch):
    app = make_app(gate)
    async with app.run_test(size=(200, 50)):
        cleared = []
        for table in (app.class_table, app.denials, app.decisions.table):
            monkeypatch.setattr(table, "clear", lambda *a, _t=table, **k: cleared.append(_t))
        for i in range(40):
            record(gate, decision("batch", ts=FIXED_NOW + i))
            record(gate, decision("batch", outcome="refused", reason="queue_full", status=429, ts=FIXED_NOW + i))
            gate.control.pause("batch", i % 2 == 0, operator=gate.operator)
            await app.tick()
        assert not cleared
        assert app.decisions.table.row_count == 80
        assert app.denials.row_keys == ["queue_full|batch"]


async def test_decision_tail_appends_by_request_id_and_trims(gate):
    app = make_app(gate)
    async with app.run_test(size=(200, 50)):
        first = decision("batch")
        record(gate, first)
        await app.tick()
        await app.tick()  # the same snapshot twice adds nothing
        assert app.decisions.visible_request_ids == [first.request_id]
        newest = None
        for _ in range(10):
            before = app.decisions.table.row_count
            for _ in range(200):
                newest = decision("interactive")
                record(gate, newest)
            await app.tick()
            grown = app.decisions.table.row_count - before
            assert grown <= DecisionTail.MAX_NEW_ROWS_PER_TICK or app.decisions.table.row_count <= DecisionTail.MAX_ROWS
        ids = app.decisions.visible_request_ids
        assert DecisionTail.MAX_ROWS <= len(ids) <= DecisionTail.MAX_ROWS + DecisionTail.SLACK
        assert ids[-1] == newest.request_id and first.request_id not in ids
        assert ids == sorted(ids)  # oldest first, newest at the bottom


async def test_chart_gets_ten_minutes_of_history_and_audit_marks(gate):
    now = [FIXED_NOW]
    app = TokengateApp(InProcessLink(gate), interval_s=3600, clock=lambda: now[0])
    async with app.run_test(size=(200, 50)):
        for _ in range(1500):
            now[0] += 0.5
            app.history.append((now[0], 8192, 100, 300.0))
        gate.control.freeze(True, operator=gate.operator)
        series = app.chart_series(gate.snapshot())
        assert len(series["times"]) <= CHART_POINTS
        assert series["times"][-1] == now[0] and series["times"][0] >= now[0] - 600
        assert series["window_s"] == 600 and series["slo_ttft_ms"] == 2000
        await app.tick()
        assert not app.chart.empty and app.last_error is None


async def test_chart_marks_come_from_the_audit(gate):
    app = TokengateApp(InProcessLink(gate), interval_s=3600)  # the real clock: audit rows carry wall time
    async with app.run_test(size=(200, 50)) as pilot:
        await pilot.press("f")
        series = app.chart_series(gate.snapshot())
        assert [label for _, label in series["marks"]] == ["freeze"]


async def test_a_failing_snapshot_is_shown_not_fatal(gate, monkeypatch):
    app = make_app(gate)
    async with app.run_test(size=(80, 24)) as pilot:

        def broken(**_):
            raise RuntimeError("boom")

        monkeypatch.setattr(gate, "snapshot", broken)
        await app.tick()
        await pilot.pause()
        assert "snapshot failed: RuntimeError: boom" in str(app.status.content)
        assert app.is_running
        monkeypatch.undo()
        await app.tick()
        assert app.last_error is None and "boom" not in str(app.status.content)


async def test_a_gate_that_does_not_answer_is_said_and_the_console_goes_on(gate, monkeypatch):
    """A trial SIGSTOPped an attached gate: the view's clock stood still with nothing said, and
    every action waited behind the snapshot for good. Now a snapshot not answered within
    ANSWER_WAIT_S is said in the status line, and the next answered one clears it."""
    import asyncio

    import console.app as app_mod

    monkeypatch.setattr(app_mod, "ANSWER_WAIT_S", 0.2)
    app = make_app(gate)
    async with app.run_test(size=(120, 30)) as pilot:
        await app.tick()
        assert app.last_snapshot_at is not None
        link = app.link
        answered = link.snapshot

        async def stuck():  # a gate whose loop never gets to the request
            await asyncio.Event().wait()

        monkeypatch.setattr(link, "snapshot", stuck)
        await app.tick()
        await pilot.pause()
        assert app.last_error is not None and "the gate has not answered for 0 s (is its process stopped or stuck?)" in app.last_error
        assert "the view shows its last snapshot, from" in str(app.status.content)
        assert app.is_running and not app._ticking  # the next tick is not held behind it
        monkeypatch.setattr(link, "snapshot", answered)
        await app.tick()
        assert app.last_error is None


async def test_the_work_per_tick_does_not_grow_with_the_decisions_per_second(gate):
    """10, 1,000 or 10,000 decisions between two ticks: one snapshot, one update per widget,
    and at most MAX_NEW_ROWS_PER_TICK new rows in the decision tail (the console is a window,
    never a load: its work is bounded by the screen, not by the request rate)."""
    from tests.console.conftest import decision, record

    app = make_app(gate)
    async with app.run_test(size=(160, 48)) as pilot:
        await app.tick()
        table = app.decisions.table
        counts: dict[str, int] = {}
        real_add_rows = table.add_rows

        def add_rows(rows):
            rows = list(rows)
            counts["rows"] = counts.get("rows", 0) + len(rows)
            return real_add_rows(rows)

        table.add_rows = add_rows
        updates: dict[str, int] = {}
        for widget in (app.header, app.slots, app.gpu, app.class_table, app.denials, app.decisions):
            real = widget.update_snapshot

            def counted(snap, real=real, name=widget.id):
                updates[name] = updates.get(name, 0) + 1
                return real(snap)

            widget.update_snapshot = counted
        per_rate = {}
        for n in (10, 1_000, 10_000):
            counts.clear()
            updates.clear()
            for _ in range(n):
                record(gate, decision("interactive"))
            snapshots_before = app.ticks
            await app.tick()
            await pilot.pause()
            per_rate[n] = (app.ticks - snapshots_before, dict(updates), counts.get("rows", 0))
        cap = DecisionTail.MAX_NEW_ROWS_PER_TICK
        assert per_rate[10] == (1, {w: 1 for w in updates}, 10)
        assert per_rate[1_000] == per_rate[10_000] == (1, {w: 1 for w in updates}, cap)
        assert len(updates) == 6


async def test_header_says_whether_tenant_limits_are_shared_or_the_failure_policy_applies(gate):
    app = make_app(gate)
    async with app.run_test(size=(200, 50)) as pilot:
        assert gate.snapshot().shared == "off" and "shared" not in app.header.content.plain  # no [shared]: nothing
        snap = gate.snapshot()
        app.header.update_snapshot(dataclasses.replace(snap, shared="ok"))
        assert "shared:ok" in app.header.content.plain
        assert "bold green" in styles_of(app.header.content, "ok", skip="shared:")
        app.header.update_snapshot(dataclasses.replace(snap, shared="fail_open"))
        await pilot.pause()
        assert "FAIL_OPEN" in app.header.content.plain
        assert "bold black on yellow" in styles_of(app.header.content, "FAIL_OPEN")
        app.header.update_snapshot(dataclasses.replace(snap, shared="fail_closed"))
        assert "bold white on red" in styles_of(app.header.content, "FAIL_CLOSED")


async def test_the_chart_draws_when_it_would_show_something_new(gate):
    now = [FIXED_NOW]
    app = TokengateApp(InProcessLink(gate), interval_s=3600, clock=lambda: now[0])
    async with app.run_test(size=(160, 48)) as pilot:
        await app.tick()
        assert not app.chart.empty  # drawn once (at mount or here)
        draws = []
        real = app.chart.set_series
        app.chart.set_series = lambda **kw: draws.append(kw) or real(**kw)
        per_dot = app.chart.seconds_per_dot(600)
        assert 1 < per_dot < 10  # ~60-80 columns at 160 wide
        for _ in range(3):  # the same budget, a second apart: nothing would move
            now[0] += 1
            await app.tick()
        assert draws == []
        gate.control.set_budget(4096, operator=gate.operator)  # a new budget and its audit mark: now
        now[0] += 1
        await app.tick()
        assert len(draws) == 1 and draws[-1]["budget"][-1] == 4096 and draws[-1]["marks"]
        now[0] += per_dot + 0.01
        await app.tick()  # a dot's worth of time: the curve moves
        assert len(draws) == 2


async def test_a_chart_behind_its_tab_is_not_drawn_until_shown(gate):
    now = [FIXED_NOW]
    app = TokengateApp(InProcessLink(gate), interval_s=3600, clock=lambda: now[0])
    async with app.run_test(size=(80, 24)) as pilot:
        await app.tick()
        draws = []
        real = app.chart.set_series
        app.chart.set_series = lambda **kw: draws.append(kw) or real(**kw)
        assert not app.chart.display
        gate.control.set_budget(4096, operator=gate.operator)
        now[0] += 60
        await app.tick()
        assert draws == []
        app._show_pane("chart")
        await pilot.pause()
        await app.tick()
        assert len(draws) == 1 and draws[-1]["budget"][-1] == 4096


@pytest.mark.parametrize("size", [(160, 48), (120, 40), (80, 24)])
@pytest.mark.parametrize("not_kept", [False, True])
async def test_the_overrides_fit_the_header_s_one_line_their_count_shown_the_list_cut(gate, size, not_kept):
    """A trial's "OVERRIDES 3: ..." folded onto a second line at 160 columns (at 120 the list
    had no room at all); at 80 the header took a second row from the panels. One line, the
    count always, as much of the list as fits and an ellipsis; the whole list on hover."""
    from console.widgets.header import GateHeader

    width = size[0]
    app = make_app(gate)
    async with app.run_test(size=size) as pilot:
        await app.tick()
        await pilot.pause()
        header = app.query_one(GateHeader)
        header.attached = "/run/tokengate/tokengate.sock"  # an attached console names its socket
        listed = ("budget.slo_ttft_p95_ms=900", "classes.interactive.ttft_objective_ms=3000", "budget 1500 on default")
        why = "/var/lib/tokengate/tokengate.db.overrides.json: No space left on device" if not_kept else ""
        header.update_snapshot(dataclasses.replace(gate.snapshot(), overrides=listed, overrides_not_kept=why))
        await pilot.pause()
        shown = str(header.content)
        assert header.size.height == 1 and "\n" not in shown and len(shown) <= width, (len(shown), shown)
        assert " OVERRIDES 3" in shown and ("NOT KEPT" in shown) == not_kept, shown
        assert ("…" in shown) == (width < 200), shown  # cut at every width tried here
        assert "slo_ttft_p95_ms=" in shown or width == 80  # as much of the list as there is room for
        assert all(o in str(header.tooltip) for o in listed)
        header.update_snapshot(gate.snapshot())  # dropped: the badge and its tooltip go
        await pilot.pause()
        assert header.size.height == 1 and "OVERRIDES" not in str(header.content) and header.tooltip is None


async def test_the_header_says_when_the_overrides_in_force_are_not_kept_for_a_restart(gate):
    """An ops trial froze the controller on a full journal disk: the toast said NOT kept once,
    then the header said "OVERRIDES 2: ..." as if a restart would restore them."""
    from console.widgets.header import GateHeader

    app = make_app(gate)
    async with app.run_test(size=(160, 48)) as pilot:
        await app.tick()
        header = app.query_one(GateHeader)
        listed = ("budget 4096 on default", "controller frozen")
        header.update_snapshot(dataclasses.replace(gate.snapshot(), overrides=listed))
        await pilot.pause()
        assert "OVERRIDES 2" in str(header.render()) and "NOT KEPT" not in str(header.render())
        gone = "/var/lib/tokengate/tokengate.db.overrides.json: No space left on device"
        header.update_snapshot(dataclasses.replace(gate.snapshot(), overrides=listed, overrides_not_kept=gone))
        await pilot.pause()
        assert "NOT KEPT for a restart" in str(header.render())


async def test_decisions_under_one_client_request_id_each_get_a_row(gate):
    # a client's X-Request-Id names its request; a retry (or a fixed header) sends it again: keyed
    # by the id alone, every decision after the first under it never appeared
    app = make_app(gate)
    async with app.run_test(size=(200, 50)):
        first = decision("batch")
        retry = dataclasses.replace(decision("batch", outcome="refused", reason="queue_full", status=429), request_id=first.request_id)
        record(gate, first)
        await app.tick()
        record(gate, dataclasses.replace(retry, ts=first.ts + 1.0))
        await app.tick()
        await app.tick()  # the same snapshot twice adds nothing
        assert app.decisions.visible_request_ids == [first.request_id, first.request_id]
        assert len(set(app.decisions.visible_rows)) == 2


# ---- a trial: the header of an attached console at 80x24, and after a gate restart -------------


def attached_app(gate, where: str) -> TokengateApp:
    """The console as `--attach` shows it (the in-process link standing in for the socket's)."""
    link = InProcessLink(gate)
    link.info = dataclasses.replace(link.info, embedded=False, where=where)
    return TokengateApp(link, interval_s=3600.0, clock=lambda: FIXED_NOW)


def header_rows(app: TokengateApp) -> list[str]:
    header = app.main.header
    return [strip.text.rstrip() for strip in header.render_lines(header.content_region.reset_offset)]


@pytest.mark.parametrize(
    "size, where, shown",
    [
        ((80, 24), "tokengate.sock", "attached tokengate.sock"),
        ((80, 24), "/run/tokengate/prod/tokengate.sock", "attached …kengate.sock"),
        ((120, 40), "/run/tokengate/tokengate.sock", " tokengate  LIVE"),
    ],
)
async def test_an_attached_consoles_header_names_its_socket_on_one_row(gate, size, where, shown):
    """At 80x24 a trial's attached console showed neither "tokengate" nor the socket it watched
    (the operator's own name had stayed), and 2 blank rows under its header: the header was laid
    out for its first, unfitted line (drawn before the screen had a width) and the line fitted on
    resize never laid it out again."""
    app = attached_app(gate, where)
    async with app.run_test(size=size) as pilot:
        await app.tick()
        await pilot.pause()
        await pilot.pause()
        rows = header_rows(app)
        assert app.main.header.region.height == 1, rows
        assert shown in rows[0] and len(rows[0]) <= size[0], rows


async def test_the_header_of_a_console_reattached_to_a_gate_with_overrides_takes_one_row(gate):
    """After a gate restart the reattached console (a new app, the gate's overrides restored)
    gained a blank row at 120x40 and at 160x48: the header's first line, with its overrides,
    wrapped to two rows before the width was known and stayed two rows tall."""
    from gate.data.commands import Freeze, Retune

    gate.control.execute(Retune(cls="batch", class_changes={"queue_depth": 5}), operator=gate.operator)
    gate.control.execute(Retune(cls="interactive", class_changes={"queue_depth": 3, "ttft_objective_ms": 1500.0}), operator=gate.operator)
    gate.control.execute(Freeze(True), operator=gate.operator)
    for size in ((120, 40), (160, 48)):
        app = attached_app(gate, "/run/tokengate/tokengate.sock")
        async with app.run_test(size=size) as pilot:
            await app.tick()
            await pilot.pause()
            await pilot.pause()
            rows = header_rows(app)
            assert app.main.header.region.height == 1 and " OVERRIDES " in rows[0], (size, rows)


async def test_an_embedded_consoles_header_keeps_the_name_at_80_columns(gate):
    app = make_app(gate)
    async with app.run_test(size=(80, 24)) as pilot:
        await app.tick()
        await pilot.pause()
        rows = header_rows(app)
        assert rows[0].startswith(" tokengate  LIVE") and "op " in rows[0] and app.main.header.region.height == 1, rows
