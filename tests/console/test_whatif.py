"""The review screen's what-if (`w`): Pilot tests on a synthetic v4 journal
(gate/tools/replay/synthetic.py: a seeded workload "recorded" through the engine under a known
backend model, written with the writer's own schema; NOT a recording of a real gate)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from pathlib import Path

import pytest
from textual.pilot import Pilot
from textual.widgets import Button, DataTable, TextArea
from textual.worker import WorkerFailed

from console.review_app import ReviewApp
from console.screens.confirm import ConfirmScreen
from console.screens.review import ReviewScreen
from console.screens.whatif import WhatIfScreen, proposal_text, retune_of
from gate.config import EXAMPLE_CONFIG, parse_config
from gate.data.commands import Freeze, Retune
from gate.tools.replay import BackendFit, load_window, proposal_from_set, run_replay, table_cells, to_table
from gate.tools.replay.synthetic import SMALL_FIT, recorded_by_model, synthetic_arrivals, write_journal
from tests.console.conftest import make_app, type_ahead
from tests.console.conftest import settle as settle_keys

SIZE = (140, 45)
CONFIG = parse_config(EXAMPLE_CONFIG)
FIT = SMALL_FIT


def recorded_journal(tmp_path: Path, config=CONFIG) -> Path:
    """300 arrivals over 60 s recorded by the backend model under `config`, as a journal."""
    arrivals = synthetic_arrivals(300, 60.0, seed=3)
    _, outcomes = recorded_by_model(config, FIT, arrivals)
    path = tmp_path / "incident.db"
    write_journal(str(path), config, FIT, arrivals, outcomes)
    return path


@pytest.fixture
def journal(tmp_path: Path) -> Path:
    return recorded_journal(tmp_path)


async def until(pilot: Pilot, condition) -> None:
    """Pause until `condition()` holds (a worker that is meant to stay running: not settle)."""
    for _ in range(500):
        if condition():
            return
        await pilot.pause()
    raise AssertionError("the condition never held")


async def settle(pilot: Pilot) -> None:
    for _ in range(200):
        await pilot.pause()
        with contextlib.suppress(WorkerFailed):  # the screen says a worker's error (exit_on_error=False)
            await pilot.app.workers.wait_for_complete()
        await pilot.pause()
        if not any(w.is_running for w in pilot.app.workers):
            return
    raise AssertionError("workers never finished")


async def open_whatif(pilot: Pilot) -> WhatIfScreen:
    await settle(pilot)
    assert isinstance(pilot.app.screen, ReviewScreen)
    await pilot.press("w")
    await settle(pilot)
    screen = pilot.app.screen
    assert isinstance(screen, WhatIfScreen)
    assert screen.window is not None, screen.error
    return screen


def test_proposal_text_keeps_only_the_changed_lines() -> None:
    recorded = {"budget.min_tokens": "256", "classes.batch.reserved_tokens": "0"}
    text = "budget.min_tokens=1024\n# a comment\n\nclasses.batch.reserved_tokens=0\nbudget.mode=static"
    assert proposal_text(text, recorded) == "budget.min_tokens=1024,budget.mode=static"
    assert proposal_text("budget.min_tokens=256", recorded) == ""
    with pytest.raises(ValueError, match="KEY=VALUE"):
        proposal_text("budget.min_tokens 1024", recorded)
    # a key given twice (a trial added a line above the prefilled one): refused, as the CLI does
    with pytest.raises(ValueError, match="given twice"):
        proposal_text("classes.batch.reserved_tokens=6\nclasses.batch.reserved_tokens=0", recorded)


def test_the_form_offers_every_class_key_the_live_retune_edits() -> None:
    # The retune form edits each class's TTFT objective ('TTFT obj. (ms|slo)') and the apply sends
    # it, but the what-if's prefilled lines left it out (a post-incident trial had to guess the
    # key's name): one line per class key of the retune, unset ones as `none`, and the prefilled
    # form unchanged is no proposal.
    from console.screens.retune import CLASS_SETTINGS
    from gate.tools.replay import settable

    config = dataclasses.replace(
        CONFIG,
        classes=tuple(dataclasses.replace(c, ttft_objective_ms=1500.0) if c.name == "batch" else c for c in CONFIG.classes),
    )
    pairs = dict(settable(config, 2048))
    for c in config.classes:
        # but default_max_tokens, which a replay refuses to change (prefilled, a trial edited it
        # and was refused): every line offered replays at another value
        assert {f"classes.{c.name}.{k}" for k in CLASS_SETTINGS if k != "default_max_tokens"} <= set(pairs), c.name
        assert f"classes.{c.name}.default_max_tokens" not in pairs
    for key, value in pairs.items():
        other = (
            "4096"
            if value == "none"
            else "none"
            if key.endswith((".limit_tokens", ".ttft_objective_ms"))
            else str(int(float(value)) * 2 or 2048)
        )
        assert proposal_from_set(f"{key}={other}", config).pinned, key
    assert pairs["classes.batch.ttft_objective_ms"] == "1500"
    assert pairs["classes.interactive.ttft_objective_ms"] == "none"
    form = "\n".join(f"{k}={v}" for k, v in pairs.items())
    assert proposal_text(form, pairs) == ""
    edited = form.replace("classes.interactive.ttft_objective_ms=none", "classes.interactive.ttft_objective_ms=800")
    text = proposal_text(edited, pairs)
    assert text == "classes.interactive.ttft_objective_ms=800"
    assert proposal_from_set(text, config).pinned == frozenset({"classes.interactive.ttft_objective_ms"})
    assert retune_of(text).class_changes == {"ttft_objective_ms": 800.0}


async def test_w_replays_the_window_under_an_edited_threshold(journal: Path) -> None:
    app = ReviewApp(journal)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_whatif(pilot)
        form = screen.query_one("#whatif-form", TextArea)
        lines = form.text.splitlines()
        # the form holds the retune's thresholds at their recorded values, in --set form
        assert any(line.startswith("budget.min_tokens=") for line in lines)
        assert "classes.batch.reserved_tokens=" + screen.recorded["classes.batch.reserved_tokens"] in lines
        assert not screen.query_one("#whatif-replay", Button).disabled
        # edit one threshold (the budget the backend has), then ctrl+r
        old = next(line for line in lines if line.startswith("backend.token_budget="))
        form.text = form.text.replace(old, "backend.token_budget=512")
        await pilot.press("ctrl+r")
        await settle(pilot)
        assert screen.error is None
        assert screen.proposal == "backend.token_budget=512"
        assert screen.answer is not None
        assert [s["name"] for s in screen.answer["scenarios"]] == ["recorded", "replayed", "backend.token_budget=512"]
        # the table shown is tokengate replay's: the same window and proposal, replayed here
        window = load_window(str(journal), screen.since, screen.until)
        expected = table_cells(run_replay(window, [proposal_from_set("backend.token_budget=512", window.config)]))
        head, rows = expected
        assert [str(c.label) for c in screen.query_one("#whatif-table").columns.values()] == [*head[:5], "proposal"]
        assert screen.table_rows == [cells for cells, _ in rows]
        assert {r[0] for r in screen.table_rows} == {"interactive", "batch"}
        # a quarter of the budget changes what the gate admits: the proposal column moves
        admitted = [r for r in screen.table_rows if r[1] == "admitted"]
        assert any(r[5].rstrip("?") != r[3].rstrip("?") for r in admitted), admitted
        # untrusted figures end in '?' in the replayed and proposal columns alike
        for cells, bad in rows:
            assert (cells[3].endswith("?") and cells[5].endswith("?")) == bad
        # under the table, each scenario's budget over the window, the replayed over the recorded
        assert [line.split()[1] for line in screen.curve_lines] == ["recorded", "replayed", "backend.token_budget=512"]
        assert screen.curve_lines[2].endswith("  512")  # the proposal's budget, as set
        await pilot.press("escape")
        await pilot.pause()
        assert isinstance(app.screen, ReviewScreen)


async def test_the_form_takes_keys_typed_ahead_in_order(journal: Path) -> None:
    """A burst (a paste of edits, `tmux send-keys`): each editing key lands where it was typed."""
    app = ReviewApp(journal)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_whatif(pilot)
        form = screen.query_one("#whatif-form", TextArea)
        form.focus()
        form.move_cursor((0, 0))
        first = form.text.splitlines()[0]
        type_ahead(pilot.app, *"#x", "backspace", " ", "end", "backspace", "9")
        await settle_keys(pilot)
        assert form.text.splitlines()[0] == "# " + first[:-1] + "9"


async def test_a_bad_proposal_is_said_and_not_replayed(journal: Path) -> None:
    app = ReviewApp(journal)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_whatif(pilot)
        screen.query_one("#whatif-form", TextArea).text = "classes.nosuch.reserved_tokens=5"
        await pilot.press("ctrl+r")
        await settle(pilot)
        assert screen.error is not None and "nosuch" in screen.error
        assert screen.answer is None


async def test_no_change_replays_the_calibration_only(journal: Path) -> None:
    app = ReviewApp(journal)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_whatif(pilot)
        await pilot.click("#whatif-replay")
        await settle(pilot)
        assert screen.answer is not None and screen.proposal == ""
        assert [s["name"] for s in screen.answer["scenarios"]] == ["recorded", "replayed"]
        assert len(screen.table_rows[0]) == 5


# ---- applying from the live console (r, w, ctrl+t): one audited command through the link


def test_retune_of_maps_the_retunes_keys_and_refuses_what_it_cannot_send() -> None:
    cmd = retune_of("backend.token_budget=4096,budget.slo_ttft_p95_ms=1500,classes.batch.queue_depth=3,classes.batch.limit_tokens=none")
    assert (cmd.budget, cmd.settings, cmd.cls) == (4096, {"slo_ttft_p95_ms": 1500.0}, "batch")
    assert cmd.class_changes == {"queue_depth": 3, "limit_tokens": None}
    # the replay held the proposed budget as the pool: applied, the controller is frozen there
    # (not frozen, an adaptive controller moved 600 to 660 within 20 s in a user's trial)
    assert cmd.freeze is True
    assert retune_of("classes.batch.queue_depth=3").freeze is None  # no budget: the controller as it is
    # `slo`, as the live retune form writes a class held to the SLO (the what-if refused it)
    assert retune_of("classes.batch.ttft_objective_ms=slo").class_changes == {"ttft_objective_ms": None}
    with pytest.raises(ValueError, match="one class"):
        retune_of("classes.batch.queue_depth=3,classes.interactive.queue_depth=3")
    with pytest.raises(ValueError, match="does not set it"):
        retune_of("budget.mode=static")
    with pytest.raises(ValueError, match="nothing to apply"):
        retune_of("")


async def test_apply_from_the_what_if_sends_exactly_one_retune(gate, journal: Path) -> None:
    gate.journal_path = str(journal)
    app = make_app(gate)
    sent: list[object] = []
    send = app.send

    async def counting(command):  # the app's own sender, counted
        sent.append(command)
        return await send(command)

    app.send = counting  # type: ignore[method-assign]
    before = len(gate.recent_audit)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("r")
        screen = await open_whatif(pilot)
        assert screen.apply is not None
        assert screen.query_one("#whatif-dialog").region.width >= 130  # 96%, not `.dialog`'s 76 columns
        form = screen.query_one("#whatif-form", TextArea)
        form.text = form.text.replace("classes.batch.queue_depth=256", "classes.batch.queue_depth=3")
        await pilot.press("ctrl+t")  # nothing replayed yet: says so, sends nothing
        await settle(pilot)
        assert screen.error is not None and "replay a proposal first" in screen.error and not sent
        await pilot.press("ctrl+r")
        await settle(pilot)
        assert screen.proposal == "classes.batch.queue_depth=3"
        await pilot.press("ctrl+t")
        await confirmation(pilot)  # the apply fetches the gate's snapshot first
        # the confirmation says how many of the figures behind it the calibration trusts not
        untrusted = len(screen.answer["scenarios"][1]["untrusted"])
        assert (f"{untrusted} of the table's figures are not trusted" in app.screen.message) == (untrusted > 0)
        await pilot.press("y")
        await settle(pilot)
        assert screen.error is None and screen.applied
        assert len(sent) == 1
        command = sent[0]
        assert isinstance(command, Retune)
        assert (command.cls, command.class_changes, command.budget, command.settings) == ("batch", {"queue_depth": 3}, None, {})
        assert "what-if replay of incident.db" in command.note
        new = list(gate.recent_audit)[before:]
        assert [(a.action, a.target) for a in new] == [("set_class", "class:batch")]
        assert new[0].new_value == "queue_depth=3"
        assert gate.backends.backends[0].admission.queue("batch").depth == 3
        # applied again: the gate already runs it, so nothing is audited and the screen says so
        await pilot.press("ctrl+t")
        await confirmation(pilot)
        await pilot.press("y")
        await settle(pilot)
        assert len(sent) == 2 and len(gate.recent_audit) == before + 1
        status = str(screen.query_one("#whatif-status").render())
        assert "nothing applied: the gate already runs these values" in status


async def test_read_only_console_offers_no_apply(gate, journal: Path) -> None:
    gate.journal_path = str(journal)
    app = make_app(gate, read_only=True)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("r")
        screen = await open_whatif(pilot)
        assert screen.apply is None and not screen.query("#whatif-apply")
        await pilot.press("ctrl+t")
        await pilot.pause()
        assert not isinstance(app.screen, ConfirmScreen)


async def test_the_replay_runs_off_the_ui_thread_and_out_of_the_consoles_process(journal: Path, monkeypatch) -> None:
    """A replay takes seconds (5,000 arrivals: ~11 s on the contended 2-core machine); while
    one is held, the screen still answers keys and draws. And the engine never runs in the
    console's process, which may be the gate's (embedded): here it fails if called, and the
    replay still answers, from the child process."""
    import threading

    import console.screens.whatif as whatif
    import gate.tools.replay.engine as engine
    import gate.tools.replay.report as report

    def not_here(*args, **kwargs):
        raise AssertionError("the engine ran in the console's process")

    monkeypatch.setattr(engine, "replay", not_here)
    monkeypatch.setattr(report, "replay", not_here)
    release = threading.Event()
    started = threading.Event()
    real = whatif.ReplayProcess.replay

    def held(self, text):
        started.set()
        assert release.wait(30)
        return real(self, text)

    monkeypatch.setattr(whatif.ReplayProcess, "replay", held)
    app = ReviewApp(journal)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_whatif(pilot)
        assert screen.window is not None and screen.window.arrivals == () and screen.arrivals == 300
        await pilot.press("ctrl+r")
        for _ in range(100):
            await pilot.pause(0.01)
            if started.is_set():
                break
        assert started.is_set()
        assert "replaying 300 arrivals" in str(screen.query_one("#whatif-status").render())
        form = screen.query_one("#whatif-form", TextArea)
        await pilot.press("end", "#", "x")  # the UI thread is free: typing lands
        assert form.text.splitlines()[0].endswith("#x")
        assert screen.answer is None
        release.set()
        await settle(pilot)
        assert screen.answer is not None, screen.error
        assert screen.table_rows


async def test_tokengate_reviews_what_if_is_the_wide_dialog_and_names_the_window_replayed(journal: Path) -> None:
    # `tokengate review` had no stylesheet: the dialog was drawn unbordered over the review
    # (and in the console `.dialog`'s 76 columns cut the proposal column). And a range reaching
    # back before the gate's start replays from that start (as `tokengate replay --since`): the
    # title says so, not the range's blank start.
    app = ReviewApp(journal)
    async with app.run_test(size=(200, 50)) as pilot:
        await pilot.press("5")  # all: the range ends at the newest row and starts before the first
        screen = await open_whatif(pilot)
        dialog = screen.query_one("#whatif-dialog")
        assert dialog.region.width >= 180, dialog.region
        assert dialog.styles.border.top[0] != ""  # bordered, as the console draws its dialogs
        title = str(screen.query_one("#whatif-title").render())
        window = screen.window
        assert window is not None
        import time as _time

        assert _time.strftime("%H:%M:%S", _time.gmtime(window.since)) in title


async def test_a_live_range_past_the_last_decision_replays_the_clis_default_window(journal: Path) -> None:
    # attached to a live gate, "now" is minutes after the incident: the what-if ends where
    # `tokengate replay` ends by default, just after the last decision, and so agrees with it
    window = load_window(str(journal))
    app = ReviewApp(journal, clock=lambda: window.until + 300.0)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("5")  # everything in the journal
        screen = await open_whatif(pilot)
        assert screen.until == pytest.approx(window.until, abs=1e-3)  # not rel: 1e-6 of an epoch is 30 min
        await pilot.press("ctrl+r")
        await settle(pilot)
        assert screen.answer is not None
        ours = screen.answer["scenarios"][0]["classes"]
        cli = run_replay(window, [])["scenarios"][0]["classes"]
        assert {c: v["tokens_per_s"] for c, v in ours.items()} == {c: v["tokens_per_s"] for c, v in cli.items()}


async def test_rows_after_the_last_decision_do_not_stretch_the_what_ifs_window(journal: Path) -> None:
    # A gate keeps writing samples (one a second) and audit rows (its `stopped`) after the
    # last decision: the review's "now" is the newest row of any table, and the what-if ended
    # there, not at the last decision as `tokengate replay` does by default (a user's trial,
    # a gate stopped 5 s after its last request: tokens/s 104 in the what-if, 112 from the CLI)
    import sqlite3

    window = load_window(str(journal))
    conn = sqlite3.connect(journal)
    with conn:
        later = window.until + 30.0
        conn.execute(
            "INSERT INTO samples (ts, backend, budget, in_flight, queued, slots_busy, slots_total, admitted, refused)"
            " VALUES (?, 'default', 2048, 0, 0, 0, 4, 0, 0)",
            (later,),
        )
        conn.execute(
            "INSERT INTO audit (ts, operator, origin, source, action, target) VALUES (?, 'tokengate', 'local', 'gate', 'stopped', 'gate')",
            (later + 0.1,),
        )
    conn.close()
    app = ReviewApp(journal)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("5")
        screen = await open_whatif(pilot)
        assert screen.until == pytest.approx(window.until, abs=1e-3)
        await pilot.press("ctrl+r")
        await settle(pilot)
        assert screen.answer is not None
        ours = screen.answer["scenarios"][0]["classes"]
        cli = run_replay(load_window(str(journal), screen.since), [])["scenarios"][0]["classes"]
        assert {c: v["tokens_per_s"] for c, v in ours.items()} == {c: v["tokens_per_s"] for c, v in cli.items()}


async def test_at_80x24_the_answer_and_the_buttons_can_be_reached(journal: Path) -> None:
    # At 80x24 the dialog (94% high) held the 12-line form, the status and the notes: the
    # table after a replay was its header alone, and the curves, hint and buttons were drawn
    # below the dialog's edge, out of reach (a user's trial). Now the table keeps 10 rows and
    # the dialog scrolls to whatever takes the focus.
    app = ReviewApp(journal)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await open_whatif(pilot)
        await pilot.press("ctrl+r")
        await settle(pilot)
        assert screen.answer is not None
        # each budget curve is one line: at 80 columns they were ~90 wide and wrapped onto two
        curve = screen.query_one("#whatif-curve")
        assert screen.curve_lines and all(len(line) <= curve.content_region.width for line in screen.curve_lines), (
            curve.content_region.width,
            screen.curve_lines,
        )
        dialog = screen.query_one("#whatif-dialog")
        table = screen.query_one("#whatif-table")
        assert table.size.height >= 10, table.size
        for widget in (table, screen.query_one("#whatif-replay", Button), screen.query_one("#whatif-close", Button)):
            widget.focus()
            await pilot.pause()
            await pilot.pause()
            visible = dialog.content_region
            assert visible.y <= widget.region.y and widget.region.bottom <= visible.bottom, (widget, widget.region, visible)


#: the partial blocks Textual draws at a scrollbar thumb's ends: a trial's "stray glyphs"
PARTIAL_BLOCKS = set("▁▂▃▄▅▆▇▉▊▋▌▍▎▏")


def scrollbar_glyphs(screen: WhatIfScreen) -> list[tuple[str, str]]:
    """The partial blocks drawn in the what-if's scrollbars (none: they draw whole cells)."""
    strips = screen._compositor.render_strips()
    seen = screen.query_one("#whatif-body").region  # what scrolled out of it is not drawn there
    found = []
    for selector in ("#whatif-body", "#whatif-form", "#whatif-table", "#whatif-notes"):
        widget = screen.query_one(selector)
        for shown, bar in (
            (widget.show_vertical_scrollbar, widget.vertical_scrollbar),
            (widget.show_horizontal_scrollbar, widget.horizontal_scrollbar),
        ):
            r = bar.region.intersection(seen)
            if shown and r.area:
                found += [(selector, c) for strip in strips[r.y : r.bottom] for c in strip.crop(r.x, r.right).text if c in PARTIAL_BLOCKS]
    return found


async def test_at_80x24_a_replay_shows_its_table_without_a_tab(journal: Path) -> None:
    # A trial at 80x24: after ctrl+r the dialog showed the form, the one-line summary and the
    # buttons; the table, the notes and the curves had no height until Tab, and nothing said to
    # press it. The proposal column was past the right edge, and scrolling to it took the class
    # column away; scrollbar ends drew block glyphs (▂▂, ▅▅, ▆▆) inside the dialog's right edge.
    app = ReviewApp(journal)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await open_whatif(pilot)
        set_form(screen, {"backend.token_budget": "800"})
        await pilot.press("ctrl+r")
        await settle(pilot)
        table = screen.query_one("#whatif-table", DataTable)
        await until(pilot, lambda: screen.focused is table)  # the table takes the focus, no Tab pressed
        seen, shown = screen.query_one("#whatif-body").region, table.region
        assert seen.y <= shown.y and shown.bottom <= seen.bottom and shown.height >= 10, (seen, shown)
        rows = drawn(app, "#whatif-table")
        assert rows.startswith("class figure recorded") and "batch admitted 31 34 10%" in rows, rows
        assert "shift+tab: the form" in drawn(app, "#whatif-hint")
        assert not scrollbar_glyphs(screen), scrollbar_glyphs(screen)
        # scrolled right to the proposal, the class and figure columns stay (with the class alone
        # kept, a trial's rows read "batch _ms", "batch it_p50_ms")
        assert "proposal" not in rows
        for _ in range(12):
            await pilot.press("right")
        await until(pilot, lambda: "proposal" in drawn(app, "#whatif-table"))
        rows = drawn(app, "#whatif-table")
        assert rows.startswith("class figure") and "recorded" not in rows, rows
        assert "batch queue_wait_p50_ms" in rows.split("proposal", 1)[1], rows
        # shift+tab: back to the form, in view, its hint again
        await pilot.press("shift+tab")
        form = screen.query_one("#whatif-form", TextArea)
        await until(pilot, lambda: screen.focused is form)
        await until(pilot, lambda: screen.query_one("#whatif-body").region.y <= form.region.y)
        assert "edit KEY=VALUE lines" in drawn(app, "#whatif-hint")
        # reopened with `w` (the form kept), the same
        await pilot.press("escape")
        screen = await open_whatif(pilot)
        await pilot.press("ctrl+r")
        await settle(pilot)
        await until(pilot, lambda: screen.focused is screen.query_one("#whatif-table"))
        assert "batch admitted 31 34 10%" in drawn(app, "#whatif-table")
    # where the form and the table fit together, the form keeps the focus (edit, replay again)
    async with ReviewApp(journal).run_test(size=(200, 50)) as pilot:
        screen = await open_whatif(pilot)
        await pilot.press("ctrl+r")
        await settle(pilot)
        assert screen.answer is not None and screen.focused is screen.query_one("#whatif-form")
        assert "batch admitted" in drawn(pilot.app, "#whatif-table")
        assert not scrollbar_glyphs(screen), scrollbar_glyphs(screen)


def test_whatif_at_80x24_snapshot(snap_compare, journal: Path) -> None:
    """The what-if at 80x24 after ctrl+r on a proposal, nothing else pressed: the table in
    view and focused, its error column whole, the hints for it, no scrollbar glyphs (the old
    layout showed the form, the summary and the buttons, and no row of the answer). Regenerate
    after an intended change with `--snapshot-update` and look at the SVG before committing it."""

    async def run_before(pilot: Pilot) -> None:
        screen = await open_whatif(pilot)
        set_form(screen, {"backend.token_budget": "800"})
        await pilot.press("ctrl+r")
        await settle(pilot)
        for _ in range(100):  # the table takes the focus after its layout (not raised here: the picture says)
            if screen.focused is screen.query_one("#whatif-table"):
                break
            await pilot.pause()
        # every table, the review's behind too, sized to its rows and drawn at those widths
        # (tests/console/test_review.py's snapshot: DataTable sizes its columns when idle)
        tables = [t for s in pilot.app.screen_stack for t in s.query(DataTable)]
        await until(pilot, lambda: not any(t._require_update_dimensions for t in tables))
        for table in tables:
            table._clear_caches()
            table.refresh()
        await pilot.pause()

    assert snap_compare(ReviewApp(journal), terminal_size=(80, 24), run_before=run_before)


async def test_closing_the_what_if_keeps_the_edits_for_the_next_time(journal: Path) -> None:
    # closing and reopening (esc, w) threw the edits away (a user's trial)
    app = ReviewApp(journal)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_whatif(pilot)
        form = screen.query_one("#whatif-form", TextArea)
        old = next(line for line in form.text.splitlines() if line.startswith("classes.batch.queue_depth="))
        form.text = form.text.replace(old, "classes.batch.queue_depth=3")
        await pilot.press("escape")
        await settle(pilot)
        again = await open_whatif(pilot)
        assert "classes.batch.queue_depth=3" in again.query_one("#whatif-form", TextArea).text.splitlines()


def drawn(app, selector: str) -> str:
    """What the terminal shows inside one widget's region, its lines joined and spaces
    collapsed (a note wraps at word boundaries: joined, it reads whole)."""
    region = app.screen.query_one(selector).region
    strips = app.screen._compositor.render_strips()[region.y : region.bottom]
    return " ".join(" ".join(strip.crop(region.x, region.right).text.split()) for strip in strips)


async def test_the_window_notes_and_the_proposals_warnings_are_on_screen_after_a_replay(journal: Path, monkeypatch) -> None:
    # A user's trial: `tokengate replay` printed the window's notes and the proposal's
    # config-check warnings; the what-if showed the notes in its status line until ctrl+r
    # replaced them, and never showed the warnings.
    # a window from before the gate's start: it starts at that start, and says so (the note
    # comes from the window loaded in the replay's process, as every note does)
    since = load_window(str(journal)).since - 60.0
    full = load_window(str(journal), since)
    (said,) = full.notes
    app = ReviewApp(journal)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        app.push_screen(WhatIfScreen(str(journal), since, None))
        await settle(pilot)
        screen = app.screen
        assert isinstance(screen, WhatIfScreen)
        window = screen.window
        assert window is not None and window.fit.notes  # the synthetic journal has no pool size: the model says so
        # before any replay: the window's notes and the model's, under the table
        assert [n for n, _ in screen.notes] == [said, *window.fit.notes]
        assert f"note: {said}" in drawn(app, "#whatif-notes")
        form = screen.query_one("#whatif-form", TextArea)
        old = next(line for line in form.text.splitlines() if line.startswith("backend.token_budget="))
        form.text = form.text.replace(old, "backend.token_budget=300")
        await pilot.press("ctrl+r")
        await settle(pilot)
        assert screen.error is None and screen.proposal == "backend.token_budget=300"
        # the notes are the command line's, in its order: its "note: " lines
        answer = run_replay(full, [proposal_from_set("backend.token_budget=300", full.config)])
        cli = [line.removeprefix("note: ") for line in to_table(answer).splitlines() if line.startswith("note: ")]
        assert [n for n, _ in screen.notes] == cli
        warnings = answer["scenarios"][2]["warnings"]
        assert warnings and any("of the ceiling 300: interactive 150 in force here" in w for w in warnings)
        assert [n for n, warning in screen.notes if warning] == [f"backend.token_budget=300: {w}" for w in warnings]
        # ... and on screen, whole, beside the status line (which counts the warnings)
        shown = drawn(app, "#whatif-notes")
        for w in warnings:
            assert f"warning: backend.token_budget=300: {w}" in shown, shown
        assert f"note: {said}" in shown and all(f"note: {n}" in shown for n in window.fit.notes)
        assert f"{len(warnings)} config-check warnings below" in drawn(app, "#whatif-status")
        # the figures are still the command line's
        assert screen.table_rows == [cells for cells, _ in table_cells(answer)[1]]
        # a proposal without warnings: the warnings go, the window's notes stay
        form.text = form.text.replace("backend.token_budget=300", old).replace(
            "classes.batch.queue_depth=256", "classes.batch.queue_depth=3"
        )
        await pilot.press("ctrl+r")
        await settle(pilot)
        assert screen.proposal == "classes.batch.queue_depth=3"
        assert not any(warning for _, warning in screen.notes)
        shown = drawn(app, "#whatif-notes")
        assert "warning:" not in shown and f"note: {said}" in shown


async def test_the_what_if_says_what_the_backend_model_assumed(journal: Path) -> None:
    # `tokengate replay` prints the fitted llama-server model above its table (slots, pool, TTFT
    # and decode per token); the what-if showed the model's notes but never the model, so a
    # trial could not see that its replay decoded at a fifth of the recorded time per token.
    from gate.tools.replay import model_line

    app = ReviewApp(journal)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_whatif(pilot)
        assert screen.window is not None
        line = model_line(dataclasses.asdict(screen.window.fit))
        assert line.startswith("backend model: 4 slots")
        assert line in to_table(run_replay(screen.window, [])).splitlines()  # the command line's own words
        assert line in drawn(app, "#whatif-notes")
        await pilot.press("ctrl+r")
        await settle(pilot)
        assert screen.answer is not None
        assert line in drawn(app, "#whatif-notes")


async def test_a_proposal_of_several_keys_shows_its_figures_without_scrolling(journal: Path) -> None:
    """A trial at 160x48 replayed three keys: the proposal's column was headed by the whole
    --set text (94 characters), so its figures sat past the table's right edge, out of view
    beside the recorded and replayed ones. The column is "proposal"; the status line above the
    table names it whole, as before."""
    app = ReviewApp(journal)
    async with app.run_test(size=(160, 48)) as pilot:
        screen = await open_whatif(pilot)
        text = "backend.token_budget=1500\nclasses.interactive.queue_depth=8\nclasses.batch.queue_depth=2"
        screen.query_one("#whatif-form", TextArea).text = text
        await pilot.press("ctrl+r")
        await settle(pilot)
        assert screen.error is None and screen.proposal == text.replace("\n", ",")
        table = screen.query_one("#whatif-table")
        assert [str(c.label) for c in table.columns.values()][-1] == "proposal"
        assert table.virtual_size.width <= table.scrollable_content_region.width, (table.virtual_size, table.region)
        status = str(screen.query_one("#whatif-status").render())
        assert f"proposal {screen.proposal}" in status


def test_console_words_name_the_reviews_filter_keys_not_the_commands_flags() -> None:
    from console.screens.whatif import console_words

    assert console_words("replay the windows apart (--until / --since 2027-01-15T08:00:05Z)") == (
        "replay the windows apart (until= / since=2027-01-15T08:00:05Z)"
    )
    assert console_words("give --until a moment at least 30 s ago") == "give until= a moment at least 30 s ago"
    assert console_words("x: --until 2026-12-01T00:00:00Z must be after --since (y)") == (
        "x: until=2026-12-01T00:00:00Z must be after since= (y)"
    )
    assert console_words("--set KEY=VALUE pins KEY") == "--set KEY=VALUE pins KEY"  # only the window's flags


async def test_a_window_before_the_journal_says_the_filter_key_the_user_typed(journal: Path) -> None:
    # The what-if's window comes from the review's range or its since=/until= filter: an error
    # that named "--until" (the command's flag) sent a console user looking for a flag
    window = load_window(str(journal))
    app = ReviewApp(journal)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        app.push_screen(WhatIfScreen(str(journal), window.since - 7200.0, window.since - 3600.0))
        await settle(pilot)
        screen = app.screen
        assert isinstance(screen, WhatIfScreen)
        assert screen.error is not None
        assert "no decisions before until=" in screen.error, screen.error
        assert "--until" not in screen.error


# ---- a user's trial of the live what-if (findings 1-7)


@pytest.fixture
def gate_journal(tmp_path: Path) -> Path:
    """A window recorded under the console fixture's own config (tests/fakes.py GATE_CONFIG:
    interactive queue_depth 4, batch 8): the live gate runs what was recorded, but for what a
    test retunes on it."""
    from tests.fakes import GATE_CONFIG

    return recorded_journal(tmp_path, parse_config(GATE_CONFIG))


async def confirmation(pilot: Pilot) -> ConfirmScreen:
    """The apply's confirmation, once shown (the apply first fetches the gate's snapshot)."""
    for _ in range(200):
        await pilot.pause()
        if isinstance(pilot.app.screen, ConfirmScreen):
            return pilot.app.screen
    raise AssertionError(f"no confirmation: {pilot.app.screen}")


async def replayed(pilot: Pilot, changes: dict[str, str]) -> WhatIfScreen:
    """The review opened, its what-if with `changes` in the form, replayed."""
    await pilot.press("r")
    screen = await open_whatif(pilot)
    set_form(screen, changes)
    await pilot.press("ctrl+r")
    await settle(pilot)
    return screen


def set_form(screen: WhatIfScreen, changes: dict[str, str]) -> None:
    """The form with each KEY's line set to VALUE (a line added for a KEY not in it)."""
    form = screen.query_one("#whatif-form", TextArea)
    lines = form.text.splitlines()
    for key, value in changes.items():
        at = [i for i, line in enumerate(lines) if line.partition("=")[0] == key]
        if at:
            lines[at[0]] = f"{key}={value}"
        else:
            lines.append(f"{key}={value}")
    form.text = "\n".join(lines)


async def confirm_on_a_retuned_gate(app, pilot: Pilot, depth: int, form: dict[str, str]) -> tuple[WhatIfScreen, str]:
    """The gate's interactive queue_depth retuned to `depth` (the window recorded 4), then a
    what-if of `form` replayed and ctrl+t: the screen and what its confirmation says."""
    await app.send(Retune(cls="interactive", class_changes={"queue_depth": depth}))
    await pilot.press("r")
    screen = await open_whatif(pilot)
    assert screen.recorded["classes.interactive.queue_depth"] == "4"
    set_form(screen, form)
    await pilot.press("ctrl+r")
    await settle(pilot)
    assert screen.error is None and screen.proposal
    await pilot.press("ctrl+t")
    return screen, (await confirmation(pilot)).message


async def test_apply_says_where_the_live_gate_differs_from_what_was_replayed(gate, gate_journal: Path) -> None:
    # A trial: an earlier retune had left classes.interactive.queue_depth=12 on the gate, the
    # window recorded 8; the operator applied the budget, the SLO and batch's queue_depth, the
    # dialog listed those alone and the gate kept 12, which the replay had not run with.
    gate.journal_path = str(gate_journal)
    app = make_app(gate)
    async with app.run_test(size=SIZE) as pilot:
        form = {"backend.token_budget": "1500", "budget.slo_ttft_p95_ms": "3000", "classes.batch.queue_depth": "3"}
        screen, said = await confirm_on_a_retuned_gate(app, pilot, 12, form)
        assert (
            "The gate now differs from what was replayed: classes.interactive.queue_depth 12 (replayed with 4); "
            "applying leaves it as it is." in said
        ), said
        # each key the proposal sets, as the apply moves it on the gate (which runs the recorded
        # value of each here) ...
        assert "classes.batch.queue_depth 8 → 3" in said and "budget.slo_ttft_p95_ms 2000 → 3000" in said, said
        # ... and not among the keys it leaves as they are
        left = said.split("The gate now differs from what was replayed: ", 1)[1].split(";", 1)[0]
        assert "classes.batch" not in left and "slo_ttft" not in left, left
        await pilot.press("y")
        await settle(pilot)
        assert screen.applied
        assert gate.backends.backends[0].admission.queue("interactive").depth == 12  # as said: left as it is


async def test_the_confirmation_moves_each_key_from_what_the_gate_runs_now(gate, gate_journal: Path) -> None:
    """A trial: the replay raised interactive's queue_depth from the window's 4 to 6, the gate
    ran 8 by then, and the dialog said only "queue_depth=6": the apply lowered it."""
    gate.journal_path = str(gate_journal)
    app = make_app(gate)
    async with app.run_test(size=SIZE) as pilot:
        screen, said = await confirm_on_a_retuned_gate(app, pilot, 8, {"classes.interactive.queue_depth": "6"})
        assert screen.proposal == "classes.interactive.queue_depth=6"
        assert "Retune the running gate: classes.interactive.queue_depth 8 → 6 (replayed 4 → 6)" in said, said


async def test_a_second_apply_waits_for_the_first_s_answer(gate, gate_journal: Path) -> None:
    """A trial's second ctrl+t, while the first apply waited on a stopped gate, cancelled that
    wait (not its command, which landed later unannounced) and asked again."""
    gate.journal_path = str(gate_journal)
    app = make_app(gate)
    held = asyncio.Event()
    sent: list[object] = []

    async def stalled(command):  # a gate that has not answered yet
        sent.append(command)
        await held.wait()
        return ["retuned"]

    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("r")
        screen = await open_whatif(pilot)
        screen.apply = stalled
        set_form(screen, {"classes.batch.queue_depth": "3"})
        await pilot.press("ctrl+r")
        await settle(pilot)
        await pilot.press("ctrl+t")
        await confirmation(pilot)
        await pilot.press("y")
        await until(pilot, lambda: sent)  # (not settle: the apply's worker waits on the gate)
        await until(pilot, lambda: "applying: sent to the gate" in drawn(app, "#whatif-status"))
        await pilot.press("ctrl+t")
        await pilot.pause()
        assert isinstance(app.screen, WhatIfScreen)  # no second confirmation
        assert "an apply is in flight" in drawn(app, "#whatif-status") and len(sent) == 1
        held.set()
        await settle(pilot)
        assert screen.applied == ["retuned"] and "applied: retuned" in drawn(app, "#whatif-status")


async def test_the_confirmation_says_an_adaptive_replay_moved_the_budget_the_apply_freezes(gate, journal: Path) -> None:
    # A trial's JSON curve for backend.token_budget=1500: [[0,1500],[35,1200],[40,960]]; the
    # dialog said "frozen there, as the replay held it", false in adaptive mode.
    gate.journal_path = str(journal)
    app = make_app(gate)
    async with app.run_test(size=SIZE) as pilot:
        screen = await replayed(pilot, {"backend.token_budget": "1500"})
        assert screen.window is not None and screen.window.config.budget.mode == "adaptive"
        assert screen.proposal == "backend.token_budget=1500"
        await pilot.press("ctrl+t")
        said = (await confirmation(pilot)).message
        assert "as the replay held it" not in said, said
        assert "took backend.token_budget=1500 as the pool's ceiling and moved the budget under it" in said, said
        assert (
            "applied, it is held at 1500 by hand, the controller frozen (f unfreezes), under the gate's ceiling of 8,192: not "
            "what was replayed (no replay holds a budget under the ceiling)." in said
        ), said
        # it advised "Replay with budget.mode=static added to see what this apply does": a static
        # replay takes the budget as the ceiling too, and the apply refuses budget.mode
        assert "budget.mode=static added" not in said
        await pilot.press("n")
        await settle(pilot)


async def test_the_confirmation_warns_of_a_class_the_applied_budget_leaves_no_room(journal: Path) -> None:
    """A trial applied backend.token_budget=1024: the replay took it as the ceiling, where R0
    scaled interactive's 1,024 to 512, and predicted batch admitted; applied under the gate's
    ceiling (2,048 there, 8,192 here), interactive's 1,024 stayed in force, batch reached 0 tokens
    and every batch request was refused 429 token_budget_exceeded, and the dialog, like the
    toast, said nothing of it."""
    from tests.console.conftest import ENVIRON, SLOTS
    from tests.fakes import GATE_CONFIG, gate_on_fake_llama

    config = GATE_CONFIG.replace("reserved_tokens = 512", "reserved_tokens = 1024")
    async with gate_on_fake_llama(config, environ=ENVIRON, slots=SLOTS) as gate:
        gate.journal_path = str(journal)
        app = make_app(gate)
        async with app.run_test(size=SIZE) as pilot:
            screen = await replayed(pilot, {"backend.token_budget": "1024"})
            assert screen.answer["scenarios"][2]["classes"]["batch"]["admitted"] > 0  # as the replay predicted
            await pilot.press("ctrl+t")
            said = (await confirmation(pilot)).message
            assert (
                "WARNING: batch can reach 0 tokens at a budget of 1,024 held by hand (interactive reserves 1,024): its "
                "requests will be refused with token_budget_exceeded until the budget is raised." in said
            ), said
            assert (
                "On the replay's ceiling of 1,024, R0 put interactive 512 in force; the gate keeps interactive 1,024 in force "
                "on its ceiling of 8,192." in said
            ), said
            await pilot.press("y")
            await settle(pilot)
            # applied (the operator was told): the gate's answer says it too, and the toast is a warning
            assert (
                screen.applied
                and "WARNING: backend default: classes.batch: a batch request may hold at most 0 tokens" in screen.applied[-1]
            )
            assert gate.backends.backends[0].admission.class_reach("batch", 1024) == 0
            assert app._notifications and list(app._notifications)[-1].severity == "warning"
        # at 80x24 what the confirmation says scrolls, its buttons on screen (they were pushed
        # past the bottom edge)
        async with make_app(gate).run_test(size=(80, 24)) as pilot:
            await replayed(pilot, {"backend.token_budget": "1024"})
            await pilot.press("ctrl+t")
            dialog = await confirmation(pilot)
            await pilot.pause()
            body, yes = dialog.query_one("#confirm-body"), dialog.query_one("#yes")
            assert yes.region.bottom <= 24 and body.max_scroll_y > 0, (yes.region, body.max_scroll_y)
            await pilot.press("pagedown")
            await pilot.pause()
            assert body.scroll_y == body.max_scroll_y
            await pilot.press("n")


async def test_the_confirmation_says_the_gates_controller_is_not_the_one_replayed(gate, journal: Path) -> None:
    # A trial: the window was replayed with the controller adaptive; the running gate's was
    # frozen since, and the confirmation listed the thresholds that differed, not that
    from gate.data.commands import Freeze

    gate.journal_path = str(journal)
    app = make_app(gate)
    async with app.run_test(size=SIZE) as pilot:
        screen = await replayed(pilot, {"classes.batch.queue_depth": "3"})
        assert screen.window is not None and screen.window.controller_state(at_end=True) == "adaptive"
        await pilot.press("ctrl+t")
        said = (await confirmation(pilot)).message
        assert "controller" not in said, said  # adaptive on both sides: nothing to say
        await pilot.press("n")
        await settle(pilot)
        await app.send(Freeze(True))
        await pilot.press("ctrl+t")
        said = (await confirmation(pilot)).message
        held = gate.snapshot().controller.budget
        assert (
            f"The gate's controller is now frozen, the budget held at {held:,}; the window was replayed with it adaptive: "
            "the replay's controller moved the budget, the gate's holds it, and applying leaves it frozen." in said
        ), said
        await pilot.press("n")
        await settle(pilot)


async def test_the_confirmation_warns_of_a_reservation_raised_under_a_budget_the_gate_holds(gate, gate_journal: Path) -> None:
    # no budget proposed, but the gate holds one (frozen at 1,500): interactive's reservation
    # raised to 1,000 leaves batch 500 of it, short of its default request (512 and a prompt)
    gate.journal_path = str(gate_journal)
    app = make_app(gate)
    async with app.run_test(size=SIZE) as pilot:
        await app.send(Retune(budget=1500, freeze=True))
        screen = await replayed(pilot, {"classes.interactive.reserved_tokens": "1000"})
        assert screen.proposal == "classes.interactive.reserved_tokens=1000"
        await pilot.press("ctrl+t")
        said = (await confirmation(pilot)).message
        assert "WARNING: batch can reach 500 tokens at a budget of 1,500 held by hand (interactive reserves 1,000)" in said, said
        assert "R0 put" not in said  # no budget proposed: the replay ran the gate's ceiling's reservations
        await pilot.press("n")
        await settle(pilot)
        await app.send(Freeze(False))  # the controller moves the budget: nothing is held to warn of
        await pilot.press("ctrl+t")
        assert "WARNING" not in (await confirmation(pilot)).message
        await pilot.press("n")
        await settle(pilot)


def test_the_controller_note_names_both_states() -> None:
    from console.screens.whatif import controller_note

    assert controller_note("adaptive", "adaptive", "adaptive", 2048) == ""
    assert controller_note("static", "static", "static", 1200) == ""
    assert "now adaptive; the window was replayed with it static: the replay held the budget, the gate's controller moves it" in (
        controller_note("static", "static", "adaptive", 2048)
    )
    # a freeze in the window: the replay ended frozen, as the gate still is
    assert controller_note("adaptive", "frozen", "frozen", 900) == ""
    assert "replayed with it adaptive, then frozen (a change in the window)" in controller_note("adaptive", "frozen", "adaptive", 2048)


def test_the_budget_note_is_true_to_the_replays_mode() -> None:
    from console.screens.whatif import budget_note

    # a static replay on the gate's own ceiling held what the apply holds; under it, it held the
    # budget as the ceiling (the reservations in force scaled to it), which the apply does not
    assert "as the replay held it" in budget_note("static", 1500, [[0, 1500]], ceiling=1500)
    under = budget_note("static", 1500, [[0, 1500]], ceiling=2048)
    assert "as the replay held it" not in under and "under the gate's ceiling of 2,048" in under
    assert "the budget replayed, not its ceiling" in budget_note("static", 1500, [[0, 1500]])  # the ceiling unknown
    adaptive = budget_note("adaptive", 1500, [[0, 1500], [35, 1200], [40, 960]])
    assert "moved the budget under it (960-1500)" in adaptive and "as the replay held it" not in adaptive


async def test_a_failed_replay_clears_the_previous_answer_and_nothing_is_applied(gate, journal: Path) -> None:
    # A trial: ctrl+r on a proposal, then a line budget.nope=3 and ctrl+r again: the header said
    # "proposal not replayed: ... unknown key", the table still showed the previous proposal.
    gate.journal_path = str(journal)
    app = make_app(gate)
    sent: list[object] = []
    send = app.send

    async def counting(command):
        sent.append(command)
        return await send(command)

    app.send = counting  # type: ignore[method-assign]
    async with app.run_test(size=SIZE) as pilot:
        screen = await replayed(pilot, {"classes.batch.queue_depth": "3"})
        assert screen.proposal == "classes.batch.queue_depth=3" and screen.table_rows and screen.curve_lines
        set_form(screen, {"budget.nope": "3"})
        await pilot.press("ctrl+r")
        await settle(pilot)
        assert screen.error is not None and screen.error.startswith("proposal not replayed:"), screen.error
        assert screen.answer is None and screen.proposal == ""
        assert screen.table_rows == [] and not screen.query_one("#whatif-table").columns
        assert screen.curve_lines == [] and drawn(app, "#whatif-curve") == ""
        assert screen.query_one("#whatif-apply", Button).disabled
        # the form back as it was replayed: still nothing to apply until it is replayed again
        form = screen.query_one("#whatif-form", TextArea)
        form.text = "\n".join(line for line in form.text.splitlines() if not line.startswith("budget.nope="))
        await pilot.press("ctrl+t")
        await settle(pilot)
        assert not isinstance(app.screen, ConfirmScreen) and not sent
        assert screen.error is not None and "the last replay failed" in screen.error


async def test_an_error_in_the_replay_worker_clears_the_previous_answer(journal: Path, monkeypatch) -> None:
    import console.screens.whatif as whatif

    real = whatif.ReplayProcess.replay
    calls: list[int] = []

    def second_fails(self, text):
        calls.append(1)
        if len(calls) == 2:
            raise whatif.ReplayError("the journal moved under the replay")
        return real(self, text)

    monkeypatch.setattr(whatif.ReplayProcess, "replay", second_fails)
    app = ReviewApp(journal)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_whatif(pilot)
        set_form(screen, {"classes.batch.queue_depth": "3"})
        await pilot.press("ctrl+r")
        await settle(pilot)
        assert screen.table_rows
        await pilot.press("ctrl+r")
        await settle(pilot)
        assert screen.error is not None and "replay failed: the journal moved" in screen.error
        assert screen.answer is None and screen.table_rows == [] and screen.curve_lines == []


async def test_escape_never_quits_review_and_keeps_the_what_if_edits(journal: Path) -> None:
    # A trial pressed esc twice to clear a filter: the second quit `tokengate review` (exit 0,
    # nothing asked) and the what-if's edits went with it.
    from textual.widgets import Input

    app = ReviewApp(journal)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_whatif(pilot)
        set_form(screen, {"classes.batch.queue_depth": "3"})
        await pilot.press("escape")  # closes the what-if (a modal)
        await settle(pilot)
        review = app.screen
        assert isinstance(review, ReviewScreen)
        await pilot.press("slash", *"class=batch", "enter")
        await settle(pilot)
        assert review.filter_fields
        await pilot.press("escape", "escape", "escape")
        await settle(pilot)
        assert app.is_running and app.screen is review and not review.filter_fields
        assert any("q closes the review" in n.message for n in app._notifications)
        await pilot.press("slash", "escape")  # in the filter field: leaves it
        await pilot.pause()
        assert app.is_running and app.screen is review and not isinstance(review.focused, Input)
        again = await open_whatif(pilot)
        assert "classes.batch.queue_depth=3" in again.query_one("#whatif-form", TextArea).text.splitlines()
        await pilot.press("escape")
        await settle(pilot)
        await pilot.press("q")
        await pilot.pause()
    assert app.return_code == 0


async def test_escape_on_the_live_console_neither_stops_the_gate_nor_leaves_the_review(gate, journal: Path) -> None:
    gate.journal_path = str(journal)
    app = make_app(gate)
    assert app.link.info.embedded  # quitting this console would stop the gate
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("escape", "escape", "escape")
        await pilot.pause()
        assert app.is_running and len(app.screen_stack) == 1 and not gate.shutting_down
        await pilot.press("r")
        await settle(pilot)
        assert isinstance(app.screen, ReviewScreen)
        await pilot.press("escape", "escape")
        await settle(pilot)
        assert isinstance(app.screen, ReviewScreen) and app.is_running
        await pilot.press("q")
        await settle(pilot)
        assert len(app.screen_stack) == 1 and app.is_running and not gate.shutting_down


async def test_ctrl_t_without_a_gate_says_why(journal: Path) -> None:
    from console.screens.whatif import NO_GATE

    app = ReviewApp(journal)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_whatif(pilot)
        await pilot.press("ctrl+t")
        await settle(pilot)
        assert screen.error == NO_GATE
        assert "review has no gate" in drawn(app, "#whatif-status")
        assert "ctrl+t" not in drawn(app, "#whatif-hint")


async def test_ctrl_t_in_a_read_only_console_says_why(gate, journal: Path) -> None:
    from console.screens.whatif import READ_ONLY

    gate.journal_path = str(journal)
    app = make_app(gate, read_only=True)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("r")
        screen = await open_whatif(pilot)
        await pilot.press("ctrl+t")
        await settle(pilot)
        assert screen.error == READ_ONLY and "read-only console: the gate refuses commands" in screen.error
        assert not isinstance(app.screen, ConfirmScreen)


async def test_budget_curve_labels_keep_the_proposals_value(journal: Path) -> None:
    # cut at 24 characters, two proposals on one key both read `classes.interactive.ttf…`
    app = ReviewApp(journal)
    labels = []
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_whatif(pilot)
        for value in ("800", "1200"):
            set_form(screen, {"classes.interactive.ttft_objective_ms": value})
            await pilot.press("ctrl+r")
            await settle(pilot)
            assert screen.proposal == f"classes.interactive.ttft_objective_ms={value}"
            line = screen.curve_lines[2]
            assert f"_ms={value} " in line, line
            labels.append(line.split()[1])
    assert labels[0] != labels[1], labels


async def test_at_80x24_the_buttons_and_hints_stay_on_screen(gate, journal: Path) -> None:
    # at 80x24 the key hints and the buttons were below the screen's edge until scrolled to
    gate.journal_path = str(journal)
    app = make_app(gate)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("r")
        screen = await open_whatif(pilot)

        def on_screen() -> None:
            dialog = screen.query_one("#whatif-dialog").content_region
            for selector in ("#whatif-replay", "#whatif-apply", "#whatif-close", "#whatif-hint", "#whatif-status"):
                region = screen.query_one(selector).region
                assert region.height > 0 and 0 <= region.y and region.bottom <= 24, (selector, region)
                assert dialog.y <= region.y and region.bottom <= dialog.bottom, (selector, region, dialog)

        on_screen()
        assert "ctrl+t applies" in drawn(app, "#whatif-hint")
        await pilot.press("ctrl+r")
        await settle(pilot)
        assert screen.answer is not None
        on_screen()
        screen.query_one("#whatif-table").focus()
        await pilot.pause()
        on_screen()


async def test_the_bottom_line_names_the_what_ifs_keys_not_the_reviews(gate, journal: Path) -> None:
    # the review's footer showed through the modal's tint (q Close, n Next page, 1-5 Range),
    # keys the what-if does not answer, and never its own ctrl+r / ctrl+t (a trial)
    def bottom(app) -> str:
        return app.screen._compositor.render_strips()[-1].text

    async with ReviewApp(journal).run_test(size=SIZE) as pilot:
        await open_whatif(pilot)
        line = bottom(pilot.app)
        assert "replay" in line and "close" in line, line
        assert "Next page" not in line and "Range" not in line and "apply" not in line, line  # review: nothing applies
    gate.journal_path = str(journal)
    async with make_app(gate).run_test(size=SIZE) as pilot:
        await pilot.press("r")
        await open_whatif(pilot)
        line = bottom(pilot.app)
        assert "replay" in line and "apply" in line and "Next page" not in line, line


async def test_the_form_and_the_confirmation_start_from_the_thresholds_in_force_at_the_windows_start(gate, gate_journal: Path) -> None:
    """A trial: interactive's queue_depth was retuned 4 -> 12 before the window; the what-if's
    form offered the gate's start value (4), and the apply's confirmation said "The gate now
    differs from what was replayed: classes.interactive.queue_depth 12 (replayed with 4)" although
    the replay ran with 12 (the retune, in force at the window's start). The form holds 12 now;
    the gate, which runs 12, does not differ; 4 is a proposal (pinned over the retune)."""
    import sqlite3

    from console.screens.whatif import live_differences

    conn = sqlite3.connect(gate_journal, isolation_level=None)
    first = conn.execute("SELECT min(ts) FROM decisions").fetchone()[0]
    conn.execute(
        "INSERT INTO audit (ts, operator, origin, source, action, target, old_value, new_value, note) "
        "VALUES (?, 'op', 'local', 'console', 'set_class', 'class:interactive', 'queue_depth=4', 'queue_depth=12', '')",
        (first + 1.0,),
    )
    conn.close()
    gate.journal_path = str(gate_journal)
    app = make_app(gate)
    async with app.run_test(size=SIZE) as pilot:
        await app.send(Retune(cls="interactive", class_changes={"queue_depth": 12}))
        await pilot.press("r")
        await settle(pilot)
        review = app.screen
        assert isinstance(review, ReviewScreen)
        app.push_screen(WhatIfScreen(str(gate_journal), first + 5.0, None, apply=review.apply, live=review.live))
        await settle(pilot)
        screen = app.screen
        assert isinstance(screen, WhatIfScreen) and screen.window is not None, screen.error
        assert screen.recorded["classes.interactive.queue_depth"] == "12"
        assert "classes.interactive.queue_depth=12" in screen.query_one("#whatif-form", TextArea).text.splitlines()
        set_form(screen, {"classes.batch.queue_depth": "3"})
        await pilot.press("ctrl+r")
        await settle(pilot)
        assert screen.error is None and screen.proposal == "classes.batch.queue_depth=3"
        await pilot.press("ctrl+t")
        said = (await confirmation(pilot)).message
        assert "Retune the running gate: classes.batch.queue_depth 8 → 3" in said, said
        assert "The gate now differs" not in said and "replayed with 4" not in said, said
        await pilot.press("n")
        await settle(pilot)
        # the gate's start value is a proposal now: it pins 4 over the retune
        assert live_differences(screen.recorded, "classes.interactive.queue_depth=4", {"classes.interactive.queue_depth": "12"}) == []
        set_form(screen, {"classes.batch.queue_depth": "8", "classes.interactive.queue_depth": "4"})
        await pilot.press("ctrl+r")
        await settle(pilot)
        assert screen.error is None and screen.proposal == "classes.interactive.queue_depth=4"
        assert screen.answer is not None and screen.answer["scenarios"][2]["changes"] == ["classes.interactive.queue_depth"]


def test_a_change_recorded_in_the_window_is_not_read_as_the_gate_now_differing() -> None:
    """A trial retuned queue_depth 8 -> 12 inside the window; the replay ran that retune as
    recorded, and the apply's confirmation said "The gate now differs from what was replayed:
    ... 12 (replayed with 8)". The gate is compared with the window's end now; a value that
    differs from both is said against the end."""
    from console.screens.whatif import live_differences

    start = {"classes.interactive.queue_depth": "8", "classes.batch.queue_depth": "4"}
    end = {"classes.interactive.queue_depth": "12", "classes.batch.queue_depth": "4"}
    assert live_differences(start, "classes.batch.queue_depth=2", {"classes.interactive.queue_depth": "12"}, end) == []
    assert live_differences(start, "classes.batch.queue_depth=2", {"classes.interactive.queue_depth": "16"}, end) == [
        "classes.interactive.queue_depth 16 (the replay ended with 12)"
    ]
    assert live_differences(start, "classes.interactive.queue_depth=2", {"classes.batch.queue_depth": "6"}, end) == [
        "classes.batch.queue_depth 6 (replayed with 4)"
    ]


def test_the_edits_kept_are_the_changed_lines_and_go_over_the_next_windows_prefill() -> None:
    """A trial opened the what-if on one window, closed it unedited and opened it on another:
    the form held the first window's values in force, and ctrl+r replayed them as a three-key
    proposal nobody typed. What is kept is the lines changed from the prefill."""
    from console.screens.whatif import edits_of, over_prefill

    a = [("classes.interactive.queue_depth", "10"), ("classes.interactive.ttft_objective_ms", "none"), ("budget.aging_s", "5")]
    b = [("classes.interactive.queue_depth", "16"), ("classes.interactive.ttft_objective_ms", "1500"), ("budget.aging_s", "5")]
    untouched = over_prefill(a, None)
    assert edits_of(untouched, dict(a)) == ""
    assert over_prefill(b, edits_of(untouched, dict(a))) == over_prefill(b, None)  # B's own values, nothing proposed
    edited = untouched.replace("budget.aging_s=5", "budget.aging_s=0") + "\nnonsense line"
    kept = edits_of(edited, dict(a))
    assert kept == "budget.aging_s=0\nnonsense line"
    assert over_prefill(b, kept).splitlines() == [
        "classes.interactive.queue_depth=16",
        "classes.interactive.ttft_objective_ms=1500",
        "budget.aging_s=0",
        "nonsense line",
    ]
