"""The review screen's what-if (`w`): Pilot tests on a synthetic v4 journal
(gate/tools/replay/synthetic.py: a seeded workload "recorded" through the engine under a known
backend model, written with the writer's own schema; NOT a recording of a real gate)."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.pilot import Pilot
from textual.widgets import Button, TextArea

from console.review_app import ReviewApp
from console.screens.review import ReviewScreen
from console.screens.whatif import WhatIfScreen, proposal_text
from gate.config import EXAMPLE_CONFIG, parse_config
from gate.tools.replay import BackendFit, load_window, proposal_from_set, run_replay, table_cells
from gate.tools.replay.synthetic import recorded_by_model, synthetic_arrivals, write_journal

SIZE = (140, 45)
CONFIG = parse_config(EXAMPLE_CONFIG)
FIT = BackendFit(
    slots=4,
    slot_context=2048,
    ceiling=2048,
    ttft_base_s=0.03,
    ttft_per_busy_s=0.01,
    prefill_tps=3000,
    tpot_alone_s=0.01,
    tpot_per_busy_s=0.004,
)


@pytest.fixture
def journal(tmp_path: Path) -> Path:
    arrivals = synthetic_arrivals(300, 60.0, seed=3)
    _, outcomes = recorded_by_model(CONFIG, FIT, arrivals)
    path = tmp_path / "incident.db"
    write_journal(str(path), CONFIG, FIT, arrivals, outcomes)
    return path


async def settle(pilot: Pilot) -> None:
    for _ in range(200):
        await pilot.pause()
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
        assert [str(c.label) for c in screen.query_one("#whatif-table").columns.values()] == head
        assert screen.table_rows == [cells for cells, _ in rows]
        assert {r[0] for r in screen.table_rows} == {"interactive", "batch"}
        # a quarter of the budget changes what the gate admits: the proposal column moves
        admitted = [r for r in screen.table_rows if r[1] == "admitted"]
        assert any(r[5].rstrip("?") != r[3].rstrip("?") for r in admitted), admitted
        # untrusted figures end in '?' in the replayed and proposal columns alike
        for cells, bad in rows:
            assert (cells[3].endswith("?") and cells[5].endswith("?")) == bad
        await pilot.press("escape")
        await pilot.pause()
        assert isinstance(app.screen, ReviewScreen)


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
