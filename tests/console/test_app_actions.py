"""Every console action through the keyboard: the key, the dialog, the effect on a REAL gate,
the audit row (operator, origin, old/new), the toast; read-only mode; pausing the view."""

from __future__ import annotations

import asyncio
import time

import pytest
from textual.command import CommandPalette
from textual.widgets import Button, Input, Label

from console.app import TokengateApp
from console.screens.confirm import ConfirmScreen
from console.screens.help import HelpScreen
from console.screens.retune import RetuneScreen
from console.screens.review import ReviewScreen
from gate.backend.gatekeeper import Refused
from gate.data.commands import CommandError
from tests.console.conftest import Queue, decision, make_app, messages, record, settle, severities, type_ahead

SIZE = (200, 50)


def audit_rows(gate, action: str | None = None):
    return [a for a in gate.recent_audit if action is None or a.action == action]


def admission(gate):
    return gate.backends.backends[0].admission


async def select(pilot, app: TokengateApp, cls: str) -> None:
    app.class_table.focus()
    app.class_table.select_class(cls)
    await pilot.pause()
    assert app.class_table.selected_class == cls


async def until(pilot, predicate, turns: int = 200) -> None:
    """Let the app run until `predicate()` holds: an async action answers a few loop turns later."""
    for _ in range(turns):
        if predicate():
            return
        await pilot.pause(0.01)


# ---- p: pause / resume ---------------------------------------------------------------


async def test_p_pauses_the_selected_class_then_resumes_it(gate):
    app = make_app(gate)
    async with app.run_test(size=SIZE) as pilot:
        assert app.class_table.selected_class == "interactive"  # the cursor starts on the top row
        await pilot.press("down")
        assert app.class_table.selected_class == "batch"
        await pilot.press("p")
        assert admission(gate).paused("batch") and not admission(gate).paused("interactive")
        row = gate.recent_audit[-1]
        assert (row.operator, row.origin, row.source, row.action, row.target) == (
            "alice",
            "10.1.2.3",
            "console",
            "pause_class",
            "class:batch",
        )
        assert (row.old_value, row.new_value) == ("False", "True")
        assert messages(app)[-1] == "Paused batch: new requests get 503 class_paused; queued ones wait until it is resumed"
        # the table shows it at once (the action re-renders)
        assert "PAUSED" in str(app.class_table.get_cell("batch", "paused"))

        await pilot.press("p")
        assert not admission(gate).paused("batch")
        assert (gate.recent_audit[-1].action, gate.recent_audit[-1].new_value) == ("resume_class", "False")
        assert messages(app)[-1] == "Resumed batch: admitting its requests again"


async def test_a_console_back_after_its_gate_restarted_keeps_the_class_the_operator_selected(gate, monkeypatch):
    """Batch selected, the gate restarted (SIGTERM + start): the reattached console came back
    with its cursor on the top row, and the operator's `p` for batch asked to pause interactive
    (a quiet class is paused without asking). The next console gets the selection and the
    refresh rate of the last one."""
    app = make_app(gate)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("down")
        app.gate_lost("the gate closed the connection (it stopped or restarted)")
        await pilot.pause()
    assert (app.lost, app.selected_at_loss) == ("the gate closed the connection (it stopped or restarted)", "batch")

    again = make_app(gate, select=app.selected_at_loss)
    async with again.run_test(size=SIZE) as pilot:
        await again.tick()
        await pilot.pause()
        assert again.class_table.selected_class == "batch"
        await pilot.press("p")
        await until(pilot, lambda: admission(gate).paused("batch"))
        assert admission(gate).paused("batch") and not admission(gate).paused("interactive")

    # and `tokengate console --attach` hands both to the console it starts after the restart
    import console.run as run
    from gate.ops import link as link_mod

    class Link:
        info = type("Info", (), {"journal": "", "pid": 0, "gate_id": "h:2:t"})()

        async def close(self) -> None:
            pass

    async def connect(path, read_only=False):
        return Link()

    started: list[dict] = []

    async def run_app(link, *, read_only, on_signal=None, **view):
        started.append(view)
        ended = type("Ended", (), {})()
        ended.lost = "restarted" if len(started) == 1 else None
        ended.selected_at_loss, ended.interval_s = "batch", 5.0
        return ended

    async def reconnect(path, *, read_only, within_s):
        return Link()

    monkeypatch.setattr(link_mod.SocketLink, "connect", staticmethod(connect))
    monkeypatch.setattr(run, "_run_app", run_app)
    monkeypatch.setattr(run, "_reconnect", reconnect)
    monkeypatch.setattr(run, "_log_beside", lambda journal: None)
    assert await run.attach_console("/nowhere.sock") == 0
    assert started == [{}, {"select": "batch", "interval_s": 5.0}]


# ---- d: drain --------------------------------------------------------------------------


async def test_d_asks_with_the_count_and_focus_on_no_and_enter_does_not_drain(gate):
    app = make_app(gate)
    async with Queue(gate, "batch", 3) as q, app.run_test(size=SIZE) as pilot:
        await select(pilot, app, "batch")
        await pilot.press("d")
        assert isinstance(app.screen, ConfirmScreen)
        text = str(app.screen.query_one("#confirm-message").content)
        assert "Drain batch: 3 queued requests will be refused with 503 drained" in text
        assert app.screen.focused is not None and app.screen.focused.id == "no"
        await pilot.press("enter")  # enter answers the focused button: No
        assert not isinstance(app.screen, ConfirmScreen)
        assert gate.control.queued("batch") == 3
        assert not audit_rows(gate, "drain_class")
        assert not any(w.done() for w in q.waiters)


async def test_d_then_yes_refuses_the_queue_audits_and_toasts(gate):
    app = make_app(gate)
    async with Queue(gate, "batch", 3) as q, app.run_test(size=SIZE) as pilot:
        await select(pilot, app, "batch")
        await pilot.press("d")
        await pilot.click("#yes")
        await pilot.pause()
        assert not isinstance(app.screen, ConfirmScreen)
        assert gate.control.queued("batch") == 0
        for w in q.waiters:
            with pytest.raises(Refused):
                await w
        row = gate.recent_audit[-1]
        assert (row.operator, row.origin, row.action, row.target) == ("alice", "10.1.2.3", "drain_class", "class:batch")
        assert (row.old_value, row.new_value, row.note) == ("3", "0", "3 requests refused")
        assert messages(app)[-1] == "Drained batch: 3 queued requests refused with 503 drained"


async def test_drain_dialog_y_key_and_escape(gate):
    app = make_app(gate)
    async with Queue(gate, "interactive", 2), app.run_test(size=SIZE) as pilot:
        await pilot.press("d")  # interactive is selected
        await pilot.press("escape")
        assert gate.control.queued("interactive") == 2 and not audit_rows(gate, "drain_class")
        await pilot.press("d")
        await pilot.press("y")
        assert gate.control.queued("interactive") == 0
        assert audit_rows(gate, "drain_class")[-1].target == "class:interactive"


async def test_drain_with_nothing_queued_says_so_and_changes_nothing(gate):
    app = make_app(gate)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("d")
        assert len(app.screen_stack) == 1
        assert "nothing queued" in messages(app)[-1] and severities(app)[-1] == "warning"
        assert not audit_rows(gate)


# ---- f: freeze -------------------------------------------------------------------------


async def test_f_freezes_and_unfreezes_the_controller(gate):
    app = make_app(gate)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f")
        assert gate.backends.backends[0].controller.frozen and gate.snapshot().controller.frozen
        row = gate.recent_audit[-1]
        assert (row.operator, row.action, row.target, row.old_value, row.new_value) == ("alice", "freeze", "controller", "False", "True")
        assert messages(app)[-1] == "Froze the controller: the budget stays where it is until unfrozen"
        assert "FROZEN" in str(app.slots.content)
        await pilot.press("f")
        assert not gate.backends.backends[0].controller.frozen
        assert (gate.recent_audit[-1].action, gate.recent_audit[-1].new_value) == ("unfreeze", "False")


# ---- t: retune -------------------------------------------------------------------------


def field(app, key: str) -> Input:
    return app.screen.query_one(f"#field-{key}", Input)


def error_text(app, key: str) -> str:
    return str(app.screen.query_one(f"#error-{key}", Label).content)


def save_disabled(app) -> bool:
    return app.screen.query_one("#save", Button).disabled


async def test_t_retunes_budget_and_class_typed_by_keys(gate):
    app = make_app(gate)
    async with app.run_test(size=SIZE) as pilot:
        await select(pilot, app, "batch")
        await pilot.press("t")
        assert isinstance(app.screen, RetuneScreen) and app.screen.cls == "batch"
        assert field(app, "budget").value == "8192" and app.screen.focused is field(app, "budget")
        await pilot.press("end", *["backspace"] * 4, *"4096")
        assert field(app, "budget").value == "4096" and not save_disabled(app)
        field(app, "queue_depth").focus()
        await pilot.press("end", "backspace", "2")
        field(app, "limit_tokens").focus()
        await pilot.press("end", *["backspace"] * 4, *"3000")
        await pilot.click("#save")
        await pilot.pause()
        assert not isinstance(app.screen, RetuneScreen)

        adm = admission(gate)
        assert adm.budget == 4096
        assert adm.queue("batch").depth == 2 and adm.policy("batch").limit_tokens == 3000
        by_action = {a.action: a for a in gate.recent_audit}
        assert (by_action["set_budget"].old_value, by_action["set_budget"].new_value) == ("8192", "4096")
        assert by_action["set_class"].target == "class:batch"
        assert by_action["set_class"].old_value == "limit_tokens=none, queue_depth=8"
        assert by_action["set_class"].new_value == "limit_tokens=3000, queue_depth=2"
        assert all(a.operator == "alice" and a.origin == "10.1.2.3" for a in gate.recent_audit)
        toast = messages(app)[-1]
        assert "Budget of default: 8192 -> 4096 tokens" in toast and "Class batch: " in toast


async def test_retune_slo_and_min_budget_reach_the_controller(gate):
    app = make_app(gate)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("t")
        field(app, "slo_ttft_p95_ms").value = "500"
        field(app, "min_tokens").value = "2048"
        await pilot.pause()
        assert not save_disabled(app)
        await pilot.press("enter")  # enter in a field saves when the form is valid
        await pilot.pause()
        assert not isinstance(app.screen, RetuneScreen)
        controller = gate.backends.backends[0].controller
        assert controller.settings.slo_ttft_p95_s == 0.5 and controller.min_tokens == 2048
        row = audit_rows(gate, "set_budget_settings")[-1]
        assert row.old_value == "min_tokens=1024, slo_ttft_p95_ms=2000"
        assert row.new_value == "min_tokens=2048, slo_ttft_p95_ms=500"


async def test_retune_lowering_min_budget_and_a_reservation_together(gate):
    """Reservations must fit min budget: lowering both needs the class change first."""
    app = make_app(gate)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("t")  # interactive (reserved 512)
        field(app, "reserved_tokens").value = "256"
        field(app, "min_tokens").value = "300"
        await pilot.pause()
        assert not save_disabled(app), app.screen.errors
        await pilot.click("#save")
        await pilot.pause()
        assert gate.config.budget.min_tokens == 300
        assert gate.config.class_by_name("interactive").reserved_tokens == 256


async def test_retune_on_a_pool_that_scales_the_reservations_down_saves_with_the_auto_floor():
    """A trial of R0 (#25): the example's auto floor on a pool of 800 is interactive's 400 in
    force, below its configured 512; the form checked 512 against that floor and refused every
    save, a queue depth's too. Only a floor the operator sets (here or in [budget]) binds."""
    from tests.fakes import SMALL_POOL_CONFIG, gate_on_fake_llama

    async with gate_on_fake_llama(SMALL_POOL_CONFIG) as g:
        app = make_app(g)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.press("t")  # interactive: reserved 512, 400 in force; the floor 400
            assert field(app, "min_tokens").value == "400" and field(app, "reserved_tokens").value == "512"
            # said before saving, not refused: what R0 will put in force (800 / 2 = 400)
            assert error_text(app, "reserved_tokens") == "reservations 512 > half the ceiling: 400 in force"
            field(app, "reserved_tokens").value = "300"
            await pilot.pause()
            assert error_text(app, "reserved_tokens") == ""  # fits half the ceiling: kept whole
            field(app, "reserved_tokens").value = "512"
            field(app, "queue_depth").value = "3"
            await pilot.pause()
            assert not save_disabled(app), app.screen.errors
            await pilot.click("#save")
            await pilot.pause()
            assert g.config.class_by_name("interactive").queue_depth == 3
            assert g.config.budget.min_tokens == 0  # the floor stays auto: nothing pinned
        # a floor set here binds the reservations, as [budget] min_tokens does
        app = make_app(g)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.press("t")
            field(app, "min_tokens").value = "450"
            await pilot.pause()
            assert save_disabled(app) and "must fit min budget (450)" in error_text(app, "reserved_tokens")


@pytest.mark.parametrize(
    ("key", "text", "why"),
    [
        ("queue_depth", "abc", "a whole number, please"),
        ("queue_depth", "0", "between 1 and 100,000"),
        ("queue_depth", "", "required"),
        ("budget", "10", "1,024..8,192 (min budget..ceiling)"),
        ("budget", "100000", "1,024..8,192 (min budget..ceiling)"),
        ("slo_ttft_p95_ms", "-5", "must be positive"),
        ("queue_timeout_s", "1e9", "above 0, at most 3600 s"),
        ("reserved_tokens", "5000", "must fit min budget (1,024)"),
        ("limit_tokens", "100", "at least reserved (512)"),
        ("default_max_tokens", "999999", "between 1 and max_tokens_cap"),
        ("min_tokens", "100", "all reservations"),  # reported on reserved_tokens, see below
    ],
)
async def test_retune_invalid_input_keeps_save_disabled_and_says_why(gate, key, text, why):
    app = make_app(gate)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("t")  # interactive: reserved 512
        assert not save_disabled(app)
        field(app, key).value = text
        await pilot.pause()
        assert save_disabled(app)
        shown = " ".join(error_text(app, k) for k in app.screen.keys)
        assert why in shown
        assert field(app, key).has_class("-invalid") or key == "min_tokens"
        await pilot.press("enter")  # does not save either
        await pilot.pause()
        assert isinstance(app.screen, RetuneScreen)
        assert not audit_rows(gate)


async def test_retune_fixing_the_input_enables_save_again(gate):
    app = make_app(gate)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("t")
        field(app, "queue_depth").focus()
        await pilot.press("end", "backspace", "x")
        assert save_disabled(app) and error_text(app, "queue_depth") == "a whole number, please"
        await pilot.press("backspace", "5")
        assert not save_disabled(app) and error_text(app, "queue_depth") == ""


@pytest.mark.parametrize(
    "keys",
    [
        # focusing a field selects its text ("slo"): the first backspace clears it, the next two
        # find nothing; a trial's burst left "3" (the backspaces ran after "3000" was in)
        ("backspace", "backspace", "backspace", *"3000"),
        # another run's "End BSpace ...": the field empty ("required"), the 3 ms not even typed
        ("end", "backspace", "backspace", "backspace", "backspace", *"3000"),
        ("end", "backspace", *"3000", "home", "delete", "delete"),  # "sl3000", then "3000"
    ],
)
async def test_retune_keys_typed_ahead_land_in_order_and_save_what_was_typed(gate, keys):
    """Tabs, edits and enter in one burst, as `tmux send-keys` writes them: the value typed is
    the one saved, never a TTFT objective of 3 ms."""
    app = make_app(gate)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("t")  # interactive: TTFT obj. "slo", the ninth field
        assert field(app, "ttft_objective_ms").value == "slo"
        type_ahead(app, *["tab"] * 8, *keys, "enter")
        await settle(pilot)
        assert len(app.screen_stack) == 1, field(app, "ttft_objective_ms").value
        assert gate.config.class_by_name("interactive").ttft_objective_ms == 3000
        row = audit_rows(gate, "set_class")[-1]
        assert (row.target, row.new_value) == ("class:interactive", "ttft_objective_ms=3000")


async def test_filters_take_keys_typed_ahead_in_order(gate):
    """The decision tail's filter and the review's: the same fields, the same burst."""
    app = make_app(gate)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("slash")
        type_ahead(app, *"acmx", "backspace", "e", "home", "delete")
        await settle(pilot)
        assert app.decisions.input.value == "cme"
        await pilot.press("escape", "r")
        assert isinstance(app.screen, ReviewScreen)
        await pilot.press("slash")
        type_ahead(app, *"batcx", "backspace", "h")
        await settle(pilot)
        assert app.screen.query_one("#review-filter", Input).value == "batch"


async def test_retune_control_error_is_shown_in_the_form_not_a_crash(gate, monkeypatch):
    app = make_app(gate)

    def refuse(*args, **kwargs):
        raise CommandError("classes: reserved_tokens add up to too much [test]")

    monkeypatch.setattr(gate.control, "retune", refuse)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("t")
        field(app, "queue_depth").value = "3"
        await pilot.pause()
        await pilot.click("#save")
        await pilot.pause()
        assert isinstance(app.screen, RetuneScreen)  # still open, with the reason
        result = str(app.screen.query_one("#retune-result", Label).content)
        assert "refused: classes: reserved_tokens add up to too much [test]" in result
        assert not audit_rows(gate)
        await pilot.press("escape")
        assert len(app.screen_stack) == 1


async def test_retune_is_one_command_a_refused_part_changes_nothing(gate):
    """Budget + queue depth in one Save while another operator raised the min budget above
    the new budget: the gate refuses the whole command; the queue depth stays as it was."""
    from gate.data.commands import Retune
    from gate.ops.control import Operator

    app = make_app(gate)
    adm = admission(gate)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("t")
        field(app, "budget").value = "4000"
        field(app, "queue_depth").value = "3"
        await pilot.pause()
        # meanwhile, from another console: min budget 5000
        gate.control.execute(Retune(settings={"min_tokens": 5000}), operator=Operator("bob", "local"))
        before = (adm.budget, gate.config.class_by_name("interactive"), len(audit_rows(gate)))
        app.screen.query_one("#save", Button).press()  # not a click: the form just changed its height
        await until(pilot, lambda: str(app.screen.query_one("#retune-result", Label).content))
        assert isinstance(app.screen, RetuneScreen)
        result = str(app.screen.query_one("#retune-result", Label).content)
        assert result.startswith("refused:") and "outside [5000, 8192]" in result
        assert (adm.budget, gate.config.class_by_name("interactive"), len(audit_rows(gate))) == before
        # the same form with a budget the gate accepts: everything lands, one row per changed value
        field(app, "budget").value = "6000"
        await pilot.pause()
        app.screen.query_one("#save", Button).press()  # not a click: the form just changed its height
        await until(pilot, lambda: len(app.screen_stack) == 1)
        assert len(app.screen_stack) == 1, str(app.screen.query_one("#retune-result", Label).content)
        assert adm.budget == 6000 and gate.config.class_by_name("interactive").queue_depth == 3
        assert [a.action for a in audit_rows(gate)][-2:] == ["set_class", "set_budget"]


async def test_retune_escape_and_unchanged_save_change_nothing(gate):
    app = make_app(gate)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("t")
        field(app, "budget").value = "2048"
        await pilot.press("escape")
        assert len(app.screen_stack) == 1 and admission(gate).budget == 8192
        await pilot.press("t")
        await pilot.click("#save")
        await pilot.pause()
        assert len(app.screen_stack) == 1 and not audit_rows(gate)
        assert messages(app)[-1] == "nothing changed"


# ---- errors from control become error toasts -------------------------------------------


async def test_control_error_becomes_an_error_toast(gate):
    app = make_app(gate)
    async with app.run_test(size=SIZE) as pilot:
        await app.action_pause_class("nope")  # e.g. from a stale palette entry
        await pilot.pause()
        assert "unknown class 'nope'" in messages(app)[-1] and severities(app)[-1] == "error"
        assert not audit_rows(gate)


# ---- q: quit ------------------------------------------------------------------------------


async def test_q_quits_at_once_when_idle(gate):
    app = make_app(gate)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("q")
        await pilot.pause()
        assert app._exit  # exiting


async def test_q_with_requests_in_flight_asks_with_focus_on_no(gate):
    app = make_app(gate)
    async with Queue(gate, "batch", 3), app.run_test(size=SIZE) as pilot:
        await pilot.press("q")
        assert isinstance(app.screen, ConfirmScreen)
        text = str(app.screen.query_one("#confirm-message").content)
        assert "7 requests are in flight or queued" in text and "stops the gate" in text
        assert app.screen.focused.id == "no"
        await pilot.press("enter")
        assert not app._exit and len(app.screen_stack) == 1
        await pilot.press("q")
        await pilot.press("y")
        await pilot.pause()
        assert app._exit


# ---- ? help, r review, : palette ------------------------------------------------------------


async def test_question_mark_lists_every_key(gate):
    app = make_app(gate)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        keys = [k for keys, _ in app.screen.keys for k in keys.split(", ")]
        assert any(k.startswith("q, ") and "ctrl+c" in k and "ctrl+q" in k for k, _ in app.screen.keys)
        for key in ("t", "p", "d", "f", "r", "/", "space", "+", "-", ":", "?", "q"):
            assert key in keys, key
        await pilot.press("escape")
        assert len(app.screen_stack) == 1


async def test_r_opens_the_review_screen_and_actions_stay_off_under_it(gate, tmp_path):
    gate.journal_path = str(tmp_path / "missing.db")
    app = make_app(gate)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("r")
        await pilot.pause()
        assert isinstance(app.screen, ReviewScreen)
        assert app.screen.journal_path == gate.journal_path
        await pilot.press("f", "d", "t")  # the live view's actions are not for the review screen
        await pilot.pause()
        assert not gate.snapshot().controller.frozen and not audit_rows(gate)
        await pilot.press("escape")  # esc never leaves the review (it clears a filter): q does
        await pilot.pause()
        assert len(app.screen_stack) == 2
        await pilot.press("q")
        await pilot.pause()
        assert len(app.screen_stack) == 1


async def test_colon_palette_offers_every_action_by_name_and_runs_it(gate):
    app = make_app(gate)
    async with app.run_test(size=SIZE) as pilot:
        names = [name for name, _, _ in app.palette_commands()]
        for name in (
            "Retune",
            "Pause class batch",
            "Drain class batch",
            "Pause class interactive",
            "Freeze controller",
            "Review journal",
            "Filter decisions",
            "Pause rendering",
            "Refresh faster",
            "Refresh slower",
            "Help",
            "Quit",
        ):
            assert name in names, name
        await pilot.press("colon")
        await pilot.pause()
        assert isinstance(app.screen, CommandPalette)
        await pilot.press(*"freeze controller")
        await asyncio.sleep(0.3)  # the palette searches in a worker
        await pilot.pause()
        await pilot.press("enter")
        await pilot.pause()
        await pilot.pause()
        assert gate.snapshot().controller.frozen
        assert gate.recent_audit[-1].action == "freeze" and gate.recent_audit[-1].operator == "alice"


# ---- read-only -------------------------------------------------------------------------------


async def test_read_only_has_no_action_keys_at_all(gate):
    app = make_app(gate, read_only=True)
    async with Queue(gate, "batch", 2), app.run_test(size=SIZE) as pilot:
        await select(pilot, app, "batch")
        before = (admission(gate).budget, gate.snapshot().controller.frozen)
        await pilot.press("t", "p", "d", "f")
        await pilot.pause()
        assert len(app.screen_stack) == 1
        assert not audit_rows(gate)
        # not silently ignored: each key says why it does nothing (#22)
        assert messages(app) and all("read-only console" in m for m in messages(app))
        assert not admission(gate).paused("batch") and gate.control.queued("batch") == 2
        assert (admission(gate).budget, gate.snapshot().controller.frozen) == before
        bound = {binding.action for _, binding in app.main._bindings}
        assert not bound & {"retune", "pause_class", "drain_class", "freeze"}  # absent, not disabled
        assert "app.read_only_notice" in bound
        shown = {ab.binding.action for ab in app.active_bindings.values()}
        assert not shown & {"retune", "pause_class", "drain_class", "freeze"}
        assert {"help", "quit", "review", "filter", "toggle_render"} <= shown
        names = [name for name, _, _ in app.palette_commands()]
        assert not [n for n in names if n.startswith(("Retune", "Pause class", "Resume class", "Drain", "Freeze", "Unfreeze"))]
        assert "READ-ONLY" in str(app.header.content)
        # even a direct call (a stale palette entry) does nothing
        await app.action_freeze()
        await app.action_pause_class("batch")
        await app.action_drain_class("batch")
        await app.action_retune()
        await pilot.pause()
        assert not audit_rows(gate) and len(app.screen_stack) == 1
        await pilot.press("question_mark")
        keys = [k for keys, _ in app.screen.keys for k in keys.split(", ")]
        assert not {"t", "p", "d", "f"} & set(keys) and "q" in keys


async def test_footer_shows_the_action_keys_when_not_read_only(gate):
    app = make_app(gate)
    async with app.run_test(size=SIZE):
        shown = {ab.binding.action for ab in app.active_bindings.values()}
        assert {"retune", "pause_class", "drain_class", "freeze"} <= shown
        assert "READ-ONLY" not in str(app.header.content)


# ---- space: pause rendering ---------------------------------------------------------------------


async def test_space_pauses_rendering_while_the_gate_goes_on(gate):
    app = make_app(gate)
    async with app.run_test(size=SIZE) as pilot:
        record(gate, decision("batch"))
        await app.tick()
        rows_before = app.decisions.table.row_count
        slots_before = str(app.slots.content)
        history_before = len(app.history)

        await pilot.press("space")
        assert app.render_paused and "PAUSED" in str(app.header.content)
        # the gate changes underneath; collection goes on
        gate.control.pause("batch", True, operator=gate.operator)
        gate.control.set_budget(4096, operator=gate.operator)
        for _ in range(3):
            record(gate, decision("interactive"))
        await app.tick()
        await app.tick()
        await pilot.pause()
        assert len(app.history) == history_before + 2
        assert app.history[-1][1] == 4096  # the chart's buffer has the new budget
        assert app.decisions.table.row_count == rows_before
        assert str(app.slots.content) == slots_before
        assert "PAUSED" not in str(app.class_table.get_cell("batch", "paused"))

        await pilot.press("space")
        assert not app.render_paused and "PAUSED" not in str(app.header.content)
        assert app.decisions.table.row_count == rows_before + 3
        assert "4,096" in str(app.slots.content)
        assert "PAUSED" in str(app.class_table.get_cell("batch", "paused"))


async def test_rendering_goes_on_under_a_dialog_and_skips_under_review(gate):
    app = make_app(gate)
    async with app.run_test(size=SIZE) as pilot:
        renders, history = app.renders, len(app.history)
        await pilot.press("question_mark")
        await app.tick()
        assert app.renders == renders + 1 and len(app.history) == history + 1  # a dialog covers part of it
        await pilot.press("escape")
        app.push_screen(ReviewScreen(":memory:"))
        await pilot.pause()
        await app.tick()
        assert app.renders == renders + 1 and len(app.history) == history + 2  # review covers all of it


# ---- + / - : refresh interval --------------------------------------------------------------------


async def test_plus_and_minus_step_the_interval_within_bounds(gate):
    app = make_app(gate, interval_s=1.0)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("plus")
        assert app.interval_s == 0.5
        await pilot.press("plus", "plus", "plus")
        assert app.interval_s == 0.25
        await pilot.press(*["minus"] * 8)
        assert app.interval_s == 10.0
        assert "refresh 10s" in str(app.status.content)
        assert messages(app)[-1] == "refresh every 10 s"
        assert not audit_rows(gate)  # a view setting, not a gate change


# ---- / : filter ---------------------------------------------------------------------------------


async def test_slash_filters_the_decision_tail_and_escape_clears(gate):
    app = make_app(gate)
    async with app.run_test(size=SIZE) as pilot:
        for i in range(6):
            record(gate, decision("batch", tenant="acme" if i % 2 else "globex"))
        record(gate, decision("interactive", tenant="initech", outcome="refused", reason="queue_full", status=429))
        await app.tick()
        assert app.decisions.table.row_count == 7
        await pilot.press("slash")
        assert app.focused is app.decisions.input
        await pilot.press(*"acme")
        assert app.decisions.table.row_count == 3
        await pilot.press("p")  # typed into the filter, not a pause
        assert not admission(gate).paused("interactive") and app.decisions.table.row_count == 0
        await pilot.press("backspace", "enter")  # enter keeps the filter, focus goes back
        assert app.focused is app.class_table and app.decisions.filter_text == "acme"
        record(gate, decision("batch", tenant="acme"))
        record(gate, decision("batch", tenant="globex"))
        await app.tick()
        assert app.decisions.table.row_count == 4  # new rows obey the filter
        assert "filter 'acme'" in str(app.status.content)
        await pilot.press("slash")
        await pilot.press("escape")
        assert app.decisions.filter_text == "" and app.decisions.table.row_count == 9
        await pilot.press("slash", *"queue_full")
        assert app.decisions.visible_request_ids == [r.request_id for r in gate.records if r.reason == "queue_full"]


async def test_escape_clears_a_kept_filter_from_the_live_view(gate):
    """A trial kept a filter (enter), saw "filter 'interactive'" in the status line and pressed
    esc, as `?` says ("esc: clear the filter"): nothing happened, the focus being back on the
    classes table; only `/` then esc cleared it."""
    app = make_app(gate)
    async with app.run_test(size=SIZE) as pilot:
        for i in range(4):
            record(gate, decision("batch", tenant="acme" if i % 2 else "globex"))
        await app.tick()
        await pilot.press("slash", *"acme", "enter")
        assert app.focused is app.class_table and app.decisions.filter_text == "acme"
        assert app.decisions.table.row_count == 2
        await pilot.press("escape")
        assert app.decisions.filter_text == "" and app.decisions.table.row_count == 4
        assert "filter" not in str(app.status.content)
        await pilot.press("escape")  # nothing to clear: nothing happens
        assert len(app.screen_stack) == 1


# ---- responsiveness ------------------------------------------------------------------------------


async def test_a_key_press_is_answered_within_100ms(gate):
    """From the key press to the action having run (its re-render included), with a full decision tail."""
    for i in range(200):
        record(gate, decision("batch" if i % 2 else "interactive", tenant=f"t{i % 7}"))
    app = make_app(gate)
    async with app.run_test(size=SIZE) as pilot:
        await app.tick()
        await pilot.pause()
        answered: list[float] = []
        original = app.action_toggle_render

        async def timed() -> None:
            await original()
            answered.append(time.perf_counter())

        app.action_toggle_render = timed
        latencies = []
        for _ in range(6):
            started = time.perf_counter()
            await pilot.press("space")
            latencies.append(answered[-1] - started)
        assert not app.render_paused and len(answered) == 6
        assert min(latencies) < 0.1, latencies


async def test_retune_sets_a_class_s_own_ttft_objective_and_slo_gives_it_back(gate):
    """The class held to the SLO shows "slo"; a number is its own objective, "slo" again undoes it."""
    app = make_app(gate)
    async with app.run_test(size=SIZE) as pilot:
        await select(pilot, app, "batch")
        await pilot.press("t")
        assert field(app, "ttft_objective_ms").value == "slo"
        field(app, "ttft_objective_ms").value = "-3"
        await pilot.pause()
        assert save_disabled(app) and "above 0" in error_text(app, "ttft_objective_ms")
        field(app, "ttft_objective_ms").value = "30000"
        await pilot.pause()
        await pilot.click("#save")
        await pilot.pause()
        assert not isinstance(app.screen, RetuneScreen)
        assert admission(gate).objective_ms("batch") == 30000
        row = audit_rows(gate, "set_class")[-1]
        assert (row.old_value, row.new_value) == ("ttft_objective_ms=none", "ttft_objective_ms=30000")
        await pilot.press("t")
        assert field(app, "ttft_objective_ms").value == "30000"
        field(app, "ttft_objective_ms").value = "slo"
        await pilot.pause()
        await pilot.click("#save")
        await pilot.pause()
        assert admission(gate).objective_ms("batch") == gate.config.budget.slo_ttft_p95_ms


async def test_retune_keys_typed_ahead_in_one_burst_go_to_the_field_the_tabs_reach(gate):
    """A trial over tmux (`send-keys Tab Tab Tab 7`: one read, as keys typed ahead over a laggy
    SSH link arrive): every key was queued to the field focused when the burst came, so the 7 went
    into the budget and the save changed it. Tab moves the focus before the next key now."""
    from textual import events

    app = make_app(gate)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("t")
        keys = list(app.screen.keys)
        assert app.screen.focused is field(app, keys[0])
        before = {k: field(app, k).value for k in keys}
        for key, char in (("tab", "\t"), ("tab", "\t"), ("tab", "\t"), ("7", "7")):
            app.post_message(events.Key(key, char))
        await pilot.pause()
        await pilot.pause()
        assert app.screen.focused is field(app, keys[3])
        assert "7" in field(app, keys[3]).value
        assert {k: field(app, k).value for k in keys[:3]} == {k: before[k] for k in keys[:3]}
