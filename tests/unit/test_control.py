"""Operator actions through gate/ops/control.py: applied, audited with old/new, or refused cleanly."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from gate.config import parse_config
from gate.data.commands import CommandError, DropOverrides, Freeze, Retune
from gate.ops.control import Control, ControlError, Operator
from gate.service import GateService
from tests.fakes import GATE_CONFIG, fake_llama_transport

ALICE = Operator("alice", "10.1.2.3")

CONFIG = GATE_CONFIG


@pytest.fixture
async def gate():
    g = GateService(parse_config(CONFIG), environ={}, transport=fake_llama_transport())
    await g.backends.probe_all()
    yield g
    await g.client.aclose()


@contextlib.asynccontextmanager
async def restarted(tmp_path):
    """The next gate on the journal `tmp_path / "j.db"`, from the overrides this one kept there."""
    after = GateService(parse_config(CONFIG), environ={}, transport=fake_llama_transport())
    try:
        after.control.keep_beside(str(tmp_path / "j.db"), operator=ALICE)
        await after.backends.probe_all()
        for b in after.backends:
            after.control.adopt(b)
        yield after
    finally:
        await after.client.aclose()


def last_audit(gate: GateService):
    return gate.recent_audit[-1]


def test_operator_identity_prefers_sudo_user_and_ssh_client_address():
    assert Operator.from_environ({"USER": "root", "SUDO_USER": "bob", "SSH_CONNECTION": "192.0.2.7 51000 10.0.0.1 22"}) == Operator(
        "bob", "192.0.2.7"
    )
    assert Operator.from_environ({"USER": "carol"}) == Operator("carol", "local")


async def test_set_budget_applies_to_admission_and_audits_old_and_new(gate):
    backend = gate.backends.backends[0]
    assert backend.admission.budget == 8192
    gate.control.set_budget(4096, operator=ALICE, note="incident 42")
    assert backend.admission.budget == 4096 and backend.controller.budget == 4096
    row = last_audit(gate)
    assert (row.operator, row.origin, row.source, row.action, row.target) == (
        "alice",
        "10.1.2.3",
        "console",
        "set_budget",
        "backend:default",
    )
    assert (row.old_value, row.new_value, row.note) == ("8192", "4096", "incident 42")


@pytest.mark.parametrize("tokens", [10, 100_000])
async def test_budget_outside_bounds_is_refused_and_changes_nothing(gate, tokens):
    before = len(gate.recent_audit)
    with pytest.raises(ControlError, match=r"outside \[1024, 8192\]"):
        gate.control.set_budget(tokens, operator=ALICE)
    assert gate.backends.backends[0].admission.budget == 8192
    assert len(gate.recent_audit) == before


async def test_a_budget_above_the_ceiling_names_the_kv_pool_the_gate_learned(gate):
    # one piece of advice for both sides told a budget above the ceiling to "lower
    # budget.min_tokens first" (a user's what-if applied backend.token_budget=2000)
    with pytest.raises(ControlError) as above:
        gate.control.set_budget(100_000, operator=ALICE)
    said = str(above.value)
    assert "outside [1024, 8192]" in said and "min_tokens" not in said
    assert "llama-server's KV pool as the gate learned it (split KV, 4 slots of 2048 tokens)" in said
    assert "larger context (-c)" in said
    # the same through a retune (the what-if's apply sends one)
    with pytest.raises(ControlError, match="KV pool as the gate learned it"):
        gate.control.execute(Retune(budget=9000, freeze=True), operator=ALICE)


async def test_a_budget_above_a_configured_token_budget_names_it_and_the_restart():
    config = CONFIG.replace('kv = "split"', 'kv = "split"\ntoken_budget = 1400')
    g = GateService(parse_config(config), environ={}, transport=fake_llama_transport())
    await g.backends.probe_all()
    try:
        before = len(g.recent_audit)
        with pytest.raises(ControlError) as above:
            g.control.execute(Retune(budget=2000, freeze=True), operator=ALICE)
        said = str(above.value)
        assert "outside [1024, 1400]" in said and "min_tokens" not in said
        assert "token_budget = 1400 in the config ([[backends]])" in said and "restart of tokengate" in said
        assert "-c" not in said  # the pool (8192) holds more: the config is what limits it
        assert g.backends.backends[0].admission.budget == 1400 and len(g.recent_audit) == before
    finally:
        await g.client.aclose()


async def test_a_budget_below_the_floor_names_what_sets_the_floor(gate):
    with pytest.raises(ControlError) as below:
        gate.control.set_budget(800, operator=ALICE)
    assert "outside [1024, 8192]" in str(below.value)
    assert "the floor is budget.min_tokens 1024: lower budget.min_tokens first" in str(below.value)
    # under the classes' reservations (interactive holds 512) min_tokens alone cannot reach it
    with pytest.raises(
        ControlError, match=r"the classes reserve 512 tokens in all: lower their reserved_tokens first, then budget.min_tokens"
    ):
        gate.control.set_budget(10, operator=ALICE)
    # with min_tokens 0 (auto) the floor is a quarter of the ceiling: set min_tokens to go under it
    with pytest.raises(
        ControlError, match=r"outside \[2048, 8192\].*budget.min_tokens is 0 \(auto\).*set budget.min_tokens to 1000 or lower"
    ):
        gate.control.execute(Retune(budget=1000, settings={"min_tokens": 0}), operator=ALICE)
    assert gate.backends.backends[0].admission.budget == 8192


async def test_a_min_samples_over_the_controller_window_is_refused_whole(gate):
    """A chaos run's retune of min_samples = 2**63 passed validation, then the controller
    refused it (ValueError) after the config in force had changed: every later retune of
    [budget] failed the same way until a restart. It is refused before anything changes."""
    before = gate.config.budget
    with pytest.raises(ControlError, match=r"budget.min_samples.*at most 10000"):
        gate.control.execute(Retune(settings={"min_samples": 2**63}), operator=ALICE)
    assert gate.config.budget == before
    gate.control.execute(Retune(settings={"min_samples": 10}), operator=ALICE)
    assert gate.config.budget.min_samples == 10


async def test_set_class_retunes_shares_and_queue_bounds(gate):
    gate.control.set_class("batch", operator=ALICE, queue_depth=2, limit_tokens=3000)
    adm = gate.backends.backends[0].admission
    assert adm.policy("batch").limit_tokens == 3000 and adm.queue("batch").depth == 2
    assert gate.config.class_by_name("batch").queue_depth == 2
    row = last_audit(gate)
    assert row.target == "class:batch"
    assert row.old_value == "limit_tokens=none, queue_depth=8" and row.new_value == "limit_tokens=3000, queue_depth=2"


@pytest.mark.parametrize(
    ("cls", "changes", "message"),
    [
        ("batch", {"queue_depth": -3}, "queue_depth"),
        ("interactive", {"reserved_tokens": 5000}, "reserved_tokens"),  # above budget.min_tokens
        ("nope", {"queue_depth": 1}, "unknown class 'nope'"),
        ("batch", {"colour": "red"}, "unknown class setting"),
    ],
)
async def test_invalid_class_change_is_refused_with_a_clear_message(gate, cls, changes, message):
    before = gate.config
    with pytest.raises(ControlError, match=message):
        gate.control.set_class(cls, operator=ALICE, **changes)
    assert gate.config is before


async def test_pause_refuses_newcomers_and_resume_restores(gate):
    adm = gate.backends.backends[0].admission
    gate.control.pause("batch", True, operator=ALICE)
    assert adm.paused("batch") and last_audit(gate).action == "pause_class"
    gate.control.pause("batch", False, operator=ALICE)
    assert not adm.paused("batch") and last_audit(gate).action == "resume_class"


async def test_drain_refuses_every_waiter_and_audits_how_many(gate):
    from gate.backend.gatekeeper import Refused
    from gate.core.ledger import Request

    backend = gate.backends.backends[0]
    gk = backend.gatekeeper
    holders = [await gk.acquire(Request(f"h{i}", "batch", "t", 10, 10, 0.0)) for i in range(4)]  # all slots
    waiters = [asyncio.create_task(gk.acquire(Request(f"w{i}", "batch", "t", 10, 10, 0.0))) for i in range(3)]
    await asyncio.sleep(0)
    assert gate.control.queued("batch") == 3
    gate.control.drain("batch", operator=ALICE)
    for w in waiters:
        with pytest.raises(Refused):
            await w
    row = last_audit(gate)
    assert (row.action, row.old_value, row.new_value, row.note) == ("drain_class", "3", "0", "3 requests refused")
    one = asyncio.create_task(gk.acquire(Request("w3", "batch", "t", 10, 10, 0.0)))
    await asyncio.sleep(0)
    gate.control.drain("batch", operator=ALICE)
    with pytest.raises(Refused):
        await one
    assert last_audit(gate).note == "1 request refused"
    for h in holders:
        gk.release(h)
    assert backend.admission.ledger.in_flight == 0


async def test_freeze_stops_the_controller_and_is_audited(gate):
    gate.control.freeze(True, operator=ALICE)
    assert gate.backends.backends[0].controller.frozen
    assert (last_audit(gate).action, last_audit(gate).new_value) == ("freeze", "True")


async def test_slo_and_min_budget_retune_reach_the_controller(gate):
    gate.control.set_budget_settings(operator=ALICE, slo_ttft_p95_ms=500.0, min_tokens=2048)
    controller = gate.backends.backends[0].controller
    assert controller.settings.slo_ttft_p95_s == 0.5 and controller.min_tokens == 2048
    with pytest.raises(ControlError, match="min_tokens"):
        gate.control.set_budget_settings(operator=ALICE, min_tokens=100)  # below interactive's reservation


async def test_slo_and_aging_retune_reach_the_core_and_the_gatekeeper(gate):
    """#24: the TTFT objective of the classes without their own, the prefill cap's objective and
    aging_s are the core's and the gatekeeper's copies of [budget]: a retune moves them too."""
    backend = gate.backends.backends[0]
    assert backend.admission.objective_ms("batch") == 2000 and backend.admission.aging_s == 5.0
    gate.control.set_budget_settings(operator=ALICE, slo_ttft_p95_ms=500.0, aging_s=2.0)
    assert backend.admission.objective_ms("batch") == 500.0 and backend.admission.objective_ms("interactive") == 500.0
    assert backend.gatekeeper.slo_ttft_s == 0.5
    assert backend.admission.aging_s == 2.0
    gate.control.set_budget_settings(operator=ALICE, aging_s=0.0)
    assert backend.admission.aging_s is None  # 0 is off, as at start
    gate.control.reload(parse_config(CONFIG.replace("min_tokens = 1024", "min_tokens = 1024\nslo_ttft_p95_ms = 900")), operator=ALICE)
    assert backend.admission.objective_ms("batch") == 900.0 and backend.gatekeeper.slo_ttft_s == 0.9


async def test_reload_audits_each_changed_key_and_refuses_backend_changes(gate):
    changed = parse_config(CONFIG.replace("queue_depth = 8", "queue_depth = 16"))
    results = gate.control.reload(changed, operator=ALICE)
    assert [(r.target, r.old_value, r.new_value) for r in results] == [("classes.batch.queue_depth", "8", "16")]
    assert gate.backends.backends[0].admission.queue("batch").depth == 16
    with pytest.raises(ControlError, match="restart") as refused:
        gate.control.reload(parse_config(CONFIG.replace("llama:8080", "llama:9090")), operator=ALICE)
    # the refusal names the key and both values, not "[gate] or [[backends]] changed"
    assert "backends[0].url (http://llama:8080 -> http://llama:9090)" in str(refused.value)


async def test_a_reload_refused_for_a_new_listen_address_names_the_key_the_file_has(gate):
    # a first-day trial's refusal named `gate.listen_port`, which no file has: the key is `gate.listen`
    with pytest.raises(ControlError, match="restart") as refused:
        gate.control.reload(parse_config('[gate]\nlisten = "127.0.0.1:8082"\n' + CONFIG), operator=ALICE)
    assert "gate.listen (127.0.0.1:8081 -> 127.0.0.1:8082)" in str(refused.value)
    assert "listen_port" not in str(refused.value) and "listen_host" not in str(refused.value)
    with pytest.raises(ControlError) as refused:  # a list: as the file writes it
        gate.control.reload(parse_config('[gate]\nlisten = ["127.0.0.1:8081", "[::1]:8081"]\n' + CONFIG), operator=ALICE)
    assert "gate.listen (127.0.0.1:8081 -> [127.0.0.1:8081, [::1]:8081])" in str(refused.value)


async def test_reload_audits_every_class_setting_it_applies_not_only_the_retunable_ones(gate):
    """A class's TTFT objective took effect on SIGHUP with no audit row (CLASS_FIELDS, the
    retunable settings, was all the reload's diff looked at)."""
    text = CONFIG.replace("queue_depth = 8", "queue_depth = 8\nttft_objective_ms = 5000")
    results = gate.control.reload(parse_config(text), operator=ALICE)
    assert [(r.target, r.old_value, r.new_value) for r in results] == [("classes.batch.ttft_objective_ms", None, "5000")]
    assert gate.backends.backends[0].admission.objective_ms("batch") == 5000.0
    back = gate.control.reload(parse_config(CONFIG), operator=ALICE)  # and removing it is audited too
    assert [(r.target, r.old_value, r.new_value) for r in back] == [("classes.batch.ttft_objective_ms", "5000", None)]


async def test_a_reload_of_an_unchanged_file_says_no_changes(gate):
    # a trial read "config: None -> None (1 changes audited)" for an unchanged file
    (row,) = gate.control.reload(parse_config(CONFIG), operator=ALICE, note="tg.toml sha256:1234")
    assert row.message == "Reloaded the config file: no changes"
    assert list(gate.recent_audit)[-1].note == "no changes: tg.toml sha256:1234"


async def test_a_refused_reload_names_the_file_once(gate, tmp_path):
    """A trial's refused SIGHUP was audited (and toasted) as "tg.toml: tg.toml: classes....":
    the config error already starts with the file's name."""
    f = tmp_path / "tg.toml"
    f.write_text(CONFIG.replace("queue_depth = 8", "queue_depth = -1"))
    assert not gate.control.reload_file(str(f), operator=ALICE)
    row = last_audit(gate)
    assert row.action == "reload_refused"
    assert row.note.count(str(f)) == 1 and "queue_depth" in row.note


async def test_a_freeze_is_kept_with_the_budget_it_froze(gate, tmp_path):
    """A trial froze the controller with the budget at 1,536 (not set by hand: where the
    controller had left it); after a restart the freeze was restored, announced and shown,
    but at the start's 2,048: "the budget stays where it is" did not survive the restart."""
    backend = gate.backends.backends[0]
    now = gate.clock()
    for _ in range(30):
        backend.controller.observe(now, 10.0, None)  # 10 s TTFT against a 2 s SLO
    gate.tick_controllers()  # the controller closes the budget: 8192 -> 6553
    assert backend.admission.budget == 6553
    gate.control.freeze(True, operator=ALICE)
    assert gate.control.overrides.budgets == {backend.name: 6553} and gate.control.overrides.frozen
    # the next gate, from what this one kept
    gate.control.overrides_path = str(tmp_path / "j.db.overrides.json")
    gate.control.freeze(True, operator=ALICE)  # written where a journal's gate keeps it
    async with restarted(tmp_path) as after:
        assert after.control.frozen and after.backends.backends[0].admission.budget == 6553
    # unfrozen, the controller moves the budget again: nothing of it is kept
    gate.control.freeze(False, operator=ALICE)
    assert gate.control.overrides.budgets == {} and not gate.control.overrides.frozen


async def test_a_budget_held_below_what_the_reservations_leave_a_class_is_warned_everywhere(caplog):
    """A what-if applied backend.token_budget=1024: set by hand and frozen under a ceiling of
    2,048, interactive's 1,024 stayed in force, batch could reach 0, and every batch request was
    refused 429 token_budget_exceeded; neither the toast, /health, the console's backend line
    nor the log said so. Here the ceiling is 8,192 and interactive reserves 4,096 (half of it,
    unscaled); a budget held at 4,096 leaves batch 0."""
    import logging

    import httpx

    config = CONFIG.replace("min_tokens = 1024", "min_tokens = 0").replace("reserved_tokens = 512", "reserved_tokens = 4096")
    g = GateService(parse_config(config), environ={}, transport=fake_llama_transport())
    await g.backends.probe_all()

    async def health() -> list[str]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=g.app), base_url="http://gate") as c:
            return (await c.get("/health")).json()["backends"]["default"].get("warnings", [])

    try:
        backend = g.backends.backends[0]
        assert await health() == [] and backend.warnings == ()
        with caplog.at_level(logging.WARNING, logger="tokengate.backends"):
            results = g.control.execute(Retune(budget=4096, freeze=True), operator=ALICE)  # as the what-if applies it
        said = (
            "classes.batch: a batch request may hold at most 0 tokens, not its default_max_tokens 512 and a prompt: its "
            "requests are refused 429 token_budget_exceeded until the budget is raised or the controller unfrozen; the "
            "budget is held at 4096 by hand (the controller frozen there; the ceiling is 8192) and the other classes "
            "reserve 4096 of it (interactive 4096)"
        )
        assert said in results[-1].message and "WARNING: backend default: " in results[-1].message, results
        assert backend.admission.class_reach("batch", backend.admission.budget) == 0  # the core's own reach
        assert await health() == [said] and backend.warnings == (said,)  # /health, and the snapshot's backend line
        assert [r.getMessage() for r in caplog.records if said in r.getMessage()] == [f"backend default: {said}"]  # once
        # raised to where batch's default fits beside the reservation: gone, everywhere
        results = g.control.execute(Retune(budget=6000), operator=ALICE)
        assert "WARNING" not in results[-1].message and await health() == []
        # held again at 4,096, then unfrozen: the controller moves it, nothing is held
        g.control.execute(Retune(budget=4096), operator=ALICE)
        assert await health() == [said]
        with caplog.at_level(logging.INFO, logger="tokengate.backends"):
            (result,) = g.control.execute(Freeze(False), operator=ALICE)
        assert await health() == [] and "WARNING" not in result.message
        assert f"backend default: no longer: {said}" in [r.getMessage() for r in caplog.records]  # the log says it went
        # a freeze where the budget stands holds it too: said in the freeze's own answer
        g.control.set_budget(4096, operator=ALICE)
        (result,) = g.control.execute(Freeze(True), operator=ALICE)
        assert result.message.startswith("Froze the controller") and said in result.message
    finally:
        await g.client.aclose()


def test_a_static_budget_held_below_the_ceiling_is_warned_and_one_at_the_ceiling_is_not() -> None:
    from gate.backend.pool import held_budget_warnings
    from gate.config import ClassConfig
    from gate.core.admission import Capacity

    classes = (ClassConfig("interactive", priority=10, reserved_tokens=1024), ClassConfig("batch", priority=1, default_max_tokens=512))
    cap = Capacity(slots=4, slot_context=2048, ceiling=2048)
    (warning,) = held_budget_warnings(cap, 1024, False, classes)
    assert "held at 1024 by hand (static mode; the ceiling is 2048)" in warning and "may hold at most 0 tokens" in warning
    assert "unfrozen" not in warning
    assert held_budget_warnings(cap, 2048, False, classes) == ()  # at the ceiling: capacity_warnings' part
    assert held_budget_warnings(cap, None, False, classes) == ()  # the controller moves it
    assert held_budget_warnings(cap, 1537, False, classes) == ()  # 513: a prompt of one token and 512 fit
    (low,) = held_budget_warnings(cap, 1536, False, classes)
    assert "may hold at most 512 tokens" in low
    # no reservation: a budget below a class's default request refuses it all the same
    alone = (ClassConfig("batch", priority=1, default_max_tokens=512),)
    (warning,) = held_budget_warnings(cap, 300, True, alone)
    assert warning.startswith("classes.batch: a batch request may hold at most 300 tokens") and warning.endswith(
        "held at 300 by hand (the controller frozen there; the ceiling is 2048)"
    )


@pytest.mark.parametrize(
    ("config", "mode", "start", "said"),
    [
        (CONFIG, "adaptive", 8192, "the ceiling"),
        (CONFIG.replace('kv = "split"', 'kv = "split"\ntoken_budget = 6000'), "adaptive", 6000, "token_budget"),
        (CONFIG.replace("[budget]", '[budget]\nmode = "static"'), "static", 8192, "the ceiling"),
    ],
)
async def test_dropping_the_overrides_puts_a_held_budget_where_the_file_starts_it(config, mode, start, said):
    """A trial set 1500 by hand, frozen, then `overrides drop`: "back to the config file", yet
    /metrics said 1500 against a ceiling of 2048 until traffic moved the controller."""
    g = GateService(parse_config(config), environ={}, transport=fake_llama_transport())
    await g.backends.probe_all()
    try:
        backend = g.backends.backends[0]
        assert g.config.budget.mode == mode and backend.controller.budget == start
        g.control.execute(Retune(budget=1500, freeze=mode == "adaptive" or None), operator=ALICE)
        assert backend.admission.budget == 1500 and "budget 1500 on default" in g.control.overrides.lines()
        (result,) = g.control.execute(DropOverrides(), operator=ALICE)
        assert backend.controller.budget == start and backend.admission.budget == start
        assert not backend.controller.frozen and g.control.overrides.lines() == ()
        row = last_audit(g)
        assert row.action == "overrides_dropped" and row.new_value == f"budget 1500 -> {start} on default ({said}, as at start)"
        assert result.message.endswith(f"back to the config file; budget 1500 -> {start} on default ({said}, as at start)")
    finally:
        await g.client.aclose()


async def test_dropping_the_overrides_leaves_a_budget_the_controller_moves_where_it_is(gate):
    """Unfrozen, the adaptive controller owns the budget: the drop does not reset it."""
    backend = gate.backends.backends[0]
    gate.control.execute(Retune(settings={"slo_ttft_p95_ms": 900.0}), operator=ALICE)
    gate.control.set_budget(4096, operator=ALICE)  # not held: the controller moves it from here
    (result,) = gate.control.execute(DropOverrides(), operator=ALICE)
    assert backend.controller.budget == 4096 and result.new_value is None
    assert result.message == "Dropped the runtime overrides (budget.slo_ttft_p95_ms=900): back to the config file"


async def test_controller_tick_shrinks_budget_on_slow_upstream_and_audits_it(gate):
    backend = gate.backends.backends[0]
    now = gate.clock()
    for _ in range(30):
        backend.controller.observe(now, 10.0, None)  # 10 s TTFT against a 2 s SLO
    gate.tick_controllers()
    assert backend.admission.budget == int(8192 * 0.8)
    row = last_audit(gate)
    assert (row.source, row.operator, row.action, row.old_value, row.new_value) == (
        "controller",
        "controller",
        "budget_close",
        "8192",
        "6553",
    )


async def test_snapshot_reflects_operator_state_and_is_immutable(gate):
    import dataclasses

    gate.control.pause("batch", True, operator=ALICE)
    gate.control.set_budget(2048, operator=ALICE)
    snap = gate.snapshot()
    batch = next(c for c in snap.classes if c.name == "batch")
    assert batch.paused and snap.budget == 2048
    assert snap.backends[0].slots_total == 4 and snap.backends[0].state == "ready"
    assert [a.action for a in snap.audit][-2:] == ["pause_class", "set_budget"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        snap.label = "REVIEW"


async def test_keep_slots_starts_from_the_config_and_a_retune_reaches_the_core(gate):
    backend = gate.backends.backends[0]
    assert backend.admission.keep_slots is True  # [budget] keep_slots defaults on (F7)
    gate.control.set_budget_settings(operator=ALICE, keep_slots=False)
    assert backend.admission.keep_slots is False
    # the file's values unchanged (a default written out): the operator's override stays
    gate.control.reload(parse_config(CONFIG.replace("min_tokens = 1024", "min_tokens = 1024\nkeep_slots = true")), operator=ALICE)
    assert backend.admission.keep_slots is False
    edited = CONFIG.replace("min_tokens = 1024", "min_tokens = 1024\nkeep_slots = true").replace("queue_depth = 8", "queue_depth = 9")
    gate.control.reload(parse_config(edited), operator=ALICE)
    assert backend.admission.keep_slots is True


async def test_a_change_that_cannot_be_kept_for_a_restart_says_so_to_the_operator(gate, tmp_path):
    """A trial paused a class on a full journal disk: the toast said "Paused batch", the header
    showed the override, and only the gate's log said it was NOT kept; the next restart
    quietly ran the class again. The command's own answer now says so."""
    from gate.data.commands import Pause

    gate.control.overrides_path = str(tmp_path / "gone" / "j.db.overrides.json")  # cannot be written
    (result,) = gate.control.execute(Pause(cls="batch", paused=True), operator=ALICE)
    assert "batch" in gate.control.paused
    assert "NOT kept" in result.message and "restart" in result.message
    gate.control.overrides_path = str(tmp_path / "j.db.overrides.json")
    (result,) = gate.control.execute(Pause(cls="batch", paused=False), operator=ALICE)
    assert "NOT kept" not in result.message


async def test_overrides_a_failed_write_could_not_keep_are_written_once_the_disk_takes_them(gate, tmp_path, caplog):
    """An ops trial froze the controller on a full journal disk: the toast said NOT kept, and
    `tokengate_operator_channel_up{channel="overrides"}` went 0. Freeing the disk brought the
    journal back ("writing again") but never the overrides: the channel stayed down, the file
    was never written, and the next restart would have unfrozen the controller. Housekeeping
    now retries the write, quietly, until it lands."""
    from gate.ops import overrides as overrides_file

    where = tmp_path / "gone"
    gate.control.overrides_path = str(where / "j.db.overrides.json")  # cannot be written yet
    gate.control.execute(Freeze(frozen=True), operator=ALICE)
    assert gate.control.keep_error is not None
    with caplog.at_level("ERROR", logger="tokengate.service"):
        caplog.clear()
        assert gate.control.rewrite_if_gone() is False  # still failing: no file, no log flood
    assert gate.control.keep_error is not None and "NOT kept" not in caplog.text
    where.mkdir()  # the disk takes it again
    with caplog.at_level("WARNING", logger="tokengate.service"):
        assert gate.control.rewrite_if_gone() is True
    assert gate.control.keep_error is None and "kept again" in caplog.text
    assert overrides_file.load(gate.control.overrides_path).frozen is True
    assert gate.control.rewrite_if_gone() is False  # kept: nothing more to do


async def test_a_command_that_writes_no_overrides_leaves_a_failed_write_standing(gate, tmp_path, monkeypatch):
    """Every command cleared the last write's failure, also one that writes nothing (a drain):
    after a freeze the full disk could not keep, a drain set the overrides channel back to up
    while the file still held only the earlier pause; the next restart ran unfrozen and no
    alert had said so."""
    from gate.data.commands import Drain, Pause
    from gate.ops import overrides as overrides_file

    gate.control.overrides_path = str(tmp_path / "j.db.overrides.json")
    gate.control.execute(Pause(cls="batch", paused=True), operator=ALICE)  # kept
    real_save = overrides_file.save

    def disk_full(path: str, overrides: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(overrides_file, "save", disk_full)
    (frozen,) = gate.control.execute(Freeze(frozen=True), operator=ALICE)
    assert "NOT kept" in frozen.message
    (drained,) = gate.control.execute(Drain(cls="interactive"), operator=ALICE)
    assert "NOT kept" not in drained.message  # a drain is no override: nothing of its own to keep
    assert gate.control.keep_error is not None  # but the freeze is still not kept
    gate.refresh_metrics()
    assert 'tokengate_operator_channel_up{channel="overrides"} 0.0' in gate.metrics.render()[0].decode()
    monkeypatch.setattr(overrides_file, "save", real_save)
    assert gate.control.rewrite_if_gone() is True
    assert overrides_file.load(gate.control.overrides_path).frozen is True


async def test_a_control_socket_deleted_under_a_running_gate_is_listened_on_again(gate, tmp_path):
    """A trial deleted the control socket file under a running gate (a /tmp cleaner, a hand
    tidying up): the gate served on, said nothing, and every `console --attach` answered "no
    control socket here (is `tokengate serve` running with this config?)" while it ran. The
    gate's once-a-second housekeeping now binds it again; consoles attached before keep going."""
    import os

    from gate.ops.control_socket import ControlServer
    from gate.ops.link import SocketLink

    server = ControlServer(str(tmp_path / "gate.sock"), gate)
    await server.start()
    try:
        before = await SocketLink.connect(server.path)
        assert await server.rebind_if_gone() is False  # there: nothing to do
        os.unlink(server.path)
        assert await server.rebind_if_gone() is True
        assert oct(os.stat(server.path).st_mode & 0o777) == "0o600"
        after = await SocketLink.connect(server.path)
        await after.snapshot()
        await before.snapshot()  # the session from before the deletion goes on
        await after.close()
        await before.close()
        # a file put there by someone else is never taken over
        os.unlink(server.path)
        (tmp_path / "gate.sock").write_text("not ours")
        assert await server.rebind_if_gone() is False
        assert (tmp_path / "gate.sock").read_text() == "not ours"
        os.unlink(server.path)
    finally:
        await server.close()


async def test_a_control_socket_that_cannot_be_created_does_not_stop_the_gate(gate, tmp_path, caplog):
    """A trial started the gate with its journal (and so its control socket) on a read-only
    disk: the journal degraded as promised, then the gate exited 1 with "tokengate: error:
    OSError: [Errno 30] Read-only file system", naming no file, and served nothing. Now the
    gate serves on without a console, says so naming the socket, and binds it once it can."""
    import os

    from gate.ops.control_socket import ControlServer
    from gate.ops.link import SocketLink

    where = tmp_path / "not-yet"
    server = ControlServer(str(where / "gate.sock"), gate)
    with caplog.at_level("ERROR", logger="tokengate.control"):
        await server.start()
    try:
        assert str(where / "gate.sock") in caplog.text and "consoles cannot attach" in caplog.text
        assert await server.rebind_if_gone() is False
        where.mkdir()
        assert await server.rebind_if_gone() is True
        link = await SocketLink.connect(server.path)
        await link.snapshot()
        await link.close()
    finally:
        await server.close()
    assert not os.path.exists(server.path)
    assert await server.rebind_if_gone() is False  # closed: never bound again


async def test_an_unreadable_overrides_file_at_start_is_audited_not_only_logged(gate, tmp_path):
    """A trial truncated `<journal>.overrides.json` (a paused class, a frozen budget in it) and
    restarted: the class ran again and the budget moved, and the journal's audit had no word
    of it (only the gate's log did): `tokengate log --kind audit`, review and every console
    showed a clean start. Now a `restore_refused` row names the file, the error and the .bad copy."""
    kept = tmp_path / "j.db.overrides.json"
    kept.write_text('{\n "budgets": {\n  "default": 3000\n },\n "classes": {')
    gate.control.keep_beside(str(tmp_path / "j.db"), operator=ALICE)
    row = last_audit(gate)
    assert (row.action, row.target) == ("restore_refused", "overrides")
    assert str(kept) in row.note and ".bad" in row.note and "config file alone" in row.note
    assert (tmp_path / "j.db.overrides.json.bad").exists()


async def test_a_kept_override_the_file_now_holds_is_no_warning_nor_a_restored_row(tmp_path, caplog):
    """A first-day trial: `tokengate overrides write` put a retune (queue_depth 9) into the file,
    the gate was killed (-9) before a reload, and its restart warned "restored
    classes.interactive.queue_depth: 9 -> 9" of a value equal to the file's. Said at info now,
    with no `restored` row; a value that still differs is restored and warned of as before."""
    import json

    from gate.ops import overrides as overrides_file

    kept = tmp_path / "j.db.overrides.json"
    kept.write_text(json.dumps({"v": 1, "classes": {"interactive": {"queue_depth": 9}, "batch": {"queue_depth": 3}}}))
    config = parse_config(CONFIG.replace("queue_depth = 4", "queue_depth = 9"))
    g = GateService(config, environ={}, transport=fake_llama_transport())
    try:
        with caplog.at_level("INFO", logger="tokengate.service"):
            g.control.keep_beside(str(tmp_path / "j.db"), operator=ALICE)
        warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert warned == [f"restored runtime overrides from {kept}: classes.batch.queue_depth=3"]
        assert any("classes.interactive.queue_depth=9 (kept, nothing to restore)" in r.getMessage() for r in caplog.records)
        restored = [(r.target, r.old_value, r.new_value) for r in g.recent_audit if r.action == "restored"]
        assert restored == [("classes.batch.queue_depth", "8", "3")]
        assert overrides_file.load(str(kept)).classes == {"batch": {"queue_depth": 3}}
    finally:
        await g.client.aclose()
    # all of it in the file: nothing warned, and the kept file says no overrides
    caplog.clear()
    g = GateService(parse_config(CONFIG.replace("queue_depth = 8", "queue_depth = 3")), environ={}, transport=fake_llama_transport())
    try:
        with caplog.at_level("INFO", logger="tokengate.service"):
            g.control.keep_beside(str(tmp_path / "j.db"), operator=ALICE)
        assert not [r for r in caplog.records if r.levelname == "WARNING"]
        assert not [r for r in g.recent_audit if r.action == "restored"]
        assert not overrides_file.load(str(kept))
    finally:
        await g.client.aclose()


async def test_a_pin_kept_for_a_router_not_seen_yet_waits_for_it_and_a_model_gone_is_refused(tmp_path):
    """Router mode: the last run's pins are restored once the router is first seen (down at the
    start, its units do not exist yet); kept meanwhile, not lost by the next write of the
    overrides. A model no longer configured is audited restore_refused, not carried on."""
    import json

    config = parse_config(CONFIG.replace('kv = "split"', 'kv = "split"\nmodels = ["m1"]', 1))
    g = GateService(config, environ={}, transport=fake_llama_transport())
    try:
        (tmp_path / "j.db.overrides.json").write_text(json.dumps({"v": 1, "pins": {"default/m1": False, "default/gone": True}}))
        g.control.keep_beside(str(tmp_path / "j.db"), operator=ALICE)
        row = last_audit(g)
        assert (row.action, row.old_value, row.note) == ("restore_refused", "default/gone", "models no longer in the config")
        assert g.control.overrides.pins == {"default/m1": False}
        assert json.loads((tmp_path / "j.db.overrides.json").read_text())["pins"] == {"default/m1": False}
    finally:
        await g.client.aclose()


async def test_overrides_file_deleted_under_a_running_gate_is_written_again(gate, tmp_path, caplog):
    """A trial's `rm tokengate.db*` under a running gate took `tokengate.db.overrides.json`
    with it: the batch pause stayed in force and on the header, but the next restart ran the
    class again. Housekeeping now writes the file again while overrides are in force."""
    from gate.ops import overrides as overrides_file

    gate.control.overrides_path = str(tmp_path / "j.db.overrides.json")
    gate.control.pause("batch", True, operator=ALICE)
    assert gate.control.rewrite_if_gone() is False  # there: nothing to do
    (tmp_path / "j.db.overrides.json").unlink()
    with caplog.at_level("WARNING", logger="tokengate.service"):
        assert gate.control.rewrite_if_gone() is True
    assert overrides_file.load(gate.control.overrides_path).paused == ["batch"]
    assert "deleted" in caplog.text
    gate.control.pause("batch", False, operator=ALICE)  # nothing in force: no file, nothing to write
    assert gate.control.rewrite_if_gone() is False


async def test_a_stop_the_journal_could_not_record_says_so_in_the_log(tmp_path, caplog):
    """A trial stopped a gate cleanly (SIGTERM) with its journal's disk full: the log said
    "stopped", and the next gate said "ended without 'stopped' (killed or crashed)": an incident
    review then chases a crash that did not happen. The stopping gate now says, in its log, that
    its last rows ('stopped' among them) were not written and what the next gate will report."""
    from gate.journal import Journal

    g = GateService(parse_config(CONFIG), environ={}, transport=fake_llama_transport())
    g.recorder.journal = await Journal.open(tmp_path / "gone" / "j.db", backoff_s=(0.01, 0.01), close_timeout_s=0.2)
    g.audit_gate("stopped", "signal SIGTERM")
    with caplog.at_level("WARNING", logger="tokengate.service"):
        await g._close_resources()
    assert "'stopped'" in caplog.text and "unclean end" in caplog.text


async def test_a_stop_the_journal_recorded_says_nothing_of_an_unclean_end(tmp_path, caplog):
    """The negative control: a journal closed is no longer `ok`, and the warning above was
    logged on every clean stop (CI's log, 2026-12-06), telling the operator the next gate would
    report a crash that it then did not report."""
    from gate.journal import Journal

    g = GateService(parse_config(CONFIG), environ={}, transport=fake_llama_transport())
    g.recorder.journal = await Journal.open(tmp_path / "j.db", backoff_s=(0.01, 0.01), close_timeout_s=0.2)
    g.audit_gate("stopped", "signal SIGTERM")
    with caplog.at_level("WARNING", logger="tokengate.service"):
        await g._close_resources()
    assert "unclean end" not in caplog.text
    assert g.recorder.journal.health.written >= 1 and not g.recorder.journal.health.failing


async def test_the_log_line_of_an_audit_row_without_values_has_no_none_arrow(caplog):
    """Every start and stop logged "audit root@local gate stopped gate: None -> None signal
    SIGTERM": the log says a change only where the row has one."""
    g = GateService(parse_config(CONFIG), environ={}, transport=fake_llama_transport())
    with caplog.at_level("INFO", logger="tokengate.service"):
        g.audit_gate("stopped", "signal SIGTERM")
        g.audit_gate("started", "listen here", new_value="0.1.0")
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("audit ")]
    assert lines[0].endswith("gate stopped gate: signal SIGTERM"), lines
    assert lines[1].endswith("gate started gate: (none) -> 0.1.0 listen here"), lines
    assert not [line for line in lines if "None" in line]


def channel_up(gate: GateService, channel: str) -> float | None:
    text = gate.metrics.render()[0].decode()
    line = next((x for x in text.splitlines() if x.startswith(f'tokengate_operator_channel_up{{channel="{channel}"}}')), None)
    return None if line is None else float(line.split()[-1])


async def test_an_operator_channel_down_is_a_metric_not_only_a_log_line(gate, tmp_path):
    """A change not kept for a restart, a control socket that cannot be created: each said once
    in the log, and nothing an alert could see (deploy/prometheus: TokengateOperatorChannelDown)."""
    from gate.data.commands import Pause
    from gate.ops.control_socket import ControlServer

    gate.refresh_metrics()
    assert channel_up(gate, "overrides") is None and channel_up(gate, "control_socket") is None  # none: no series
    gate.control.overrides_path = str(tmp_path / "gone" / "j.db.overrides.json")  # cannot be written
    gate.control.execute(Pause(cls="batch", paused=True), operator=ALICE)
    gate.control_server = ControlServer(str(tmp_path / "not-yet" / "gate.sock"), gate)
    await gate.control_server.start()
    try:
        gate.refresh_metrics()
        assert channel_up(gate, "overrides") == 0 and channel_up(gate, "control_socket") == 0
        gate.control.overrides_path = str(tmp_path / "j.db.overrides.json")
        gate.control.execute(Pause(cls="batch", paused=False), operator=ALICE)
        (tmp_path / "not-yet").mkdir()
        assert await gate.control_server.rebind_if_gone() is True
        gate.refresh_metrics()
        assert channel_up(gate, "overrides") == 1 and channel_up(gate, "control_socket") == 1
    finally:
        await gate.control_server.close()


async def test_a_class_s_ttft_objective_is_retuned_live_kept_and_restored(gate, tmp_path):
    """An on-call trial: batch was refused "would miss its 2000 ms time-to-first-token
    objective" (held to the SLO) and the console's only lever was the SLO of every class. Its
    own objective is now a live retune: the core refuses by it, the audit says it, a restart
    keeps it, and "slo" (None) hands the class back to the SLO."""
    adm = gate.backends.backends[0].admission
    assert adm.objective_ms("batch") == 2000
    gate.control.overrides_path = str(tmp_path / "j.db.overrides.json")
    gate.control.execute(Retune(cls="batch", class_changes={"ttft_objective_ms": 30000.0}), operator=ALICE)
    assert adm.objective_ms("batch") == 30000 and adm.objective_ms("interactive") == 2000
    row = last_audit(gate)
    assert (row.action, row.target, row.old_value, row.new_value) == (
        "set_class",
        "class:batch",
        "ttft_objective_ms=none",  # as --set and the form write it (a trial read "None")
        "ttft_objective_ms=30000",
    )
    batch = next(c for c in gate.snapshot().classes if c.name == "batch")
    assert (batch.ttft_objective_ms, batch.own_ttft_objective_ms) == (30000, 30000)
    async with restarted(tmp_path) as after:
        assert after.backends.backends[0].admission.objective_ms("batch") == 30000
    (back,) = gate.control.execute(Retune(cls="batch", class_changes={"ttft_objective_ms": None}), operator=ALICE)
    assert adm.objective_ms("batch") == 2000
    assert back.message == "Class batch: ttft_objective_ms=30000 -> ttft_objective_ms=none (2000 from slo_ttft_p95_ms)"
    with pytest.raises(CommandError):
        gate.control.execute(Retune(cls="batch", class_changes={"ttft_objective_ms": -5.0}), operator=ALICE)


async def test_a_class_objective_retune_says_which_objective_held_while_it_was_unset(gate):
    """A trial's audit row and toast read "ttft_objective_ms=none -> 1500" where [budget]
    slo_ttft_p95_ms 2000 held: as if the class had had no objective. The values stay `k=v` (the
    replay parses them); the note says what held, and the toast shows it beside `none`."""
    from gate.tools.replay.engine import _pairs

    (result,) = gate.control.execute(Retune(cls="interactive", class_changes={"ttft_objective_ms": 1500.0}), operator=ALICE)
    row = last_audit(gate)
    assert (row.old_value, row.new_value) == ("ttft_objective_ms=none", "ttft_objective_ms=1500")
    assert _pairs(row.old_value) == {"ttft_objective_ms": None} and _pairs(row.new_value) == {"ttft_objective_ms": 1500}
    assert row.note == "ttft_objective_ms was none: 2000 from [budget] slo_ttft_p95_ms in force"
    assert result.message == "Class interactive: ttft_objective_ms=none (2000 from slo_ttft_p95_ms) -> ttft_objective_ms=1500"
    # a retune of the SLO beside it: the old side is the SLO that held, the new side the one that will
    gate.control.execute(
        Retune(settings={"slo_ttft_p95_ms": 3000.0}, cls="interactive", class_changes={"ttft_objective_ms": None}, note="back"),
        operator=ALICE,
    )
    row = last_audit(gate)
    assert (row.old_value, row.new_value) == ("ttft_objective_ms=1500", "ttft_objective_ms=none")
    assert row.note == "back; ttft_objective_ms none: 3000 from [budget] slo_ttft_p95_ms in force"
    (other,) = gate.control.execute(Retune(cls="interactive", class_changes={"queue_depth": 3}), operator=ALICE)
    assert last_audit(gate).note == "" and "slo_ttft_p95_ms" not in other.message  # no objective changed: nothing said


async def test_a_retune_of_the_controller_tuning_reaches_the_running_controller(gate):
    """A retune (console or SIGHUP) of window_s, min_samples, cooldown_s, increase or decrease
    was audited and kept as an override, while the running controller went on with the values
    it started with until a restart: only the SLOs and min_tokens reached it."""
    tuning = {"window_s": 12.0, "min_samples": 7, "cooldown_s": 2.0, "increase": 1.5, "decrease": 0.5, "slo_ttft_p95_ms": 900.0}
    gate.control.execute(Retune(settings=tuning), operator=ALICE)
    s = gate.backends.backends[0].controller.settings
    assert (s.window_s, s.min_samples, s.cooldown_s, s.increase, s.decrease, s.slo_ttft_p95_s) == (12.0, 7, 2.0, 1.5, 0.5, 0.9)


async def test_a_controller_step_that_raises_does_not_end_housekeeping(gate, monkeypatch):
    """A retune of `increase = 1e308` (finite, so valid then) made the controller's next opening
    step raise OverflowError inside the once-a-second housekeeping loop, which ended it for
    good: no more reaping of leaked reservations, no samples, no gauges, and nothing said.
    Such a factor is refused now; whatever else a step raises is logged and the loop goes on."""
    with pytest.raises(CommandError, match="at most 10"):
        gate.control.execute(Retune(settings={"increase": 1e308}), operator=ALICE)

    def failing_step() -> None:
        raise OverflowError("a controller step that fails")

    monkeypatch.setattr(gate, "tick_controllers", failing_step)
    reaps = 0
    real_reap = gate.backends.reap

    def counted_reap() -> int:
        nonlocal reaps
        reaps += 1
        return real_reap()

    monkeypatch.setattr(gate.backends, "reap", counted_reap)
    task = asyncio.create_task(gate._housekeeping())
    try:
        await asyncio.wait_for(_until(lambda: reaps >= 2 or task.done()), timeout=30)
        assert not task.done(), task.exception()
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _until(predicate) -> None:
    while not predicate():
        await asyncio.sleep(0.05)


def metric(gate: GateService, series: str) -> float | None:
    gate.refresh_metrics()
    text = gate.metrics.render()[0].decode()
    line = next((x for x in text.splitlines() if x.startswith(series + " ")), None)
    return None if line is None else float(line.split()[-1])


async def test_a_pause_and_a_freeze_are_metrics_a_dashboard_and_an_alert_can_see(gate):
    """An ops trial paused batch and froze the controller at 3 a.m.; both are kept for restarts,
    and nothing but the console's header showed them: /metrics had no word of a paused class
    (its class_paused refusals only while traffic came), so a pause forgotten after the
    incident held for days. Now each is a gauge (alert TokengateClassPausedLong)."""
    from gate.data.commands import Pause

    assert metric(gate, 'tokengate_class_paused{class="batch"}') == 0.0
    assert metric(gate, "tokengate_controller_frozen") == 0.0
    assert metric(gate, "tokengate_operator_overrides") == 0.0
    gate.control.execute(Pause(cls="batch", paused=True), operator=ALICE)
    gate.control.execute(Freeze(frozen=True), operator=ALICE)
    assert metric(gate, 'tokengate_class_paused{class="batch"}') == 1.0
    assert metric(gate, 'tokengate_class_paused{class="interactive"}') == 0.0
    assert metric(gate, "tokengate_controller_frozen") == 1.0
    assert metric(gate, "tokengate_operator_overrides") == len(gate.control.overrides.lines()) >= 2
    gate.control.execute(Pause(cls="batch", paused=False), operator=ALICE)
    gate.control.execute(Freeze(frozen=False), operator=ALICE)
    assert metric(gate, 'tokengate_class_paused{class="batch"}') == 0.0
    assert metric(gate, "tokengate_controller_frozen") == 0.0
    assert metric(gate, "tokengate_operator_overrides") == 0.0


async def test_a_reload_of_a_file_that_now_holds_the_overridden_values_says_so(gate):
    """A trial: the file was edited to what a runtime retune had set; the reload said "no changes"
    beside the file's new digest, and the log "1 changes audited" (the overrides_replaced row)."""
    from gate.data.commands import Retune

    gate.control.execute(Retune(cls="batch", class_changes={"queue_depth": 3}), operator=ALICE)
    edited = parse_config(CONFIG.replace("queue_depth = 8", "queue_depth = 3", 1))
    assert edited.class_by_name("batch").queue_depth == 3
    rows = gate.control.reload(edited, operator=ALICE, note="tg.toml sha256:5678")
    assert [(r.action, r.target) for r in rows] == [("reload", "config"), ("overrides_replaced", "overrides")]
    note = [a.note for a in gate.recent_audit if a.action == "reload"][-1]
    assert note == "no changes in force: the file now holds the overridden values: tg.toml sha256:5678"


async def test_a_command_the_gate_does_not_answer_is_said_unanswered_not_refused(gate, tmp_path, monkeypatch):
    """A trial SIGSTOPped a gate and applied a what-if from its console: the status line stayed
    unchanged for 30 s (the link waited for good), and the retune landed unannounced once the
    gate was resumed. The link now gives up waiting after ANSWER_WAIT_S with NoAnswer, a
    CommandError that says the command was sent and may still take effect; the link goes on."""
    from gate.ops import link as link_mod
    from gate.ops.control_socket import ControlServer
    from gate.ops.link import NoAnswer, SocketLink

    server = ControlServer(str(tmp_path / "gate.sock"), gate)
    await server.start()
    answer = server._handle
    # a gate whose loop never gets to the command (stopped or stuck): no reply line
    monkeypatch.setattr(server, "_handle", lambda s, r: b"" if isinstance(r, dict) and r.get("op") == "command" else answer(s, r))
    monkeypatch.setattr(link_mod, "ANSWER_WAIT_S", 0.2)
    try:
        link = await SocketLink.connect(server.path)
        with pytest.raises(NoAnswer, match="no answer from the gate within .*may still take effect.*tokengate log --kind audit"):
            await link.command(Retune(cls="batch", class_changes={"queue_depth": 3}))
        assert not link._pending  # nobody waits on it any more
        await link.snapshot()  # the session goes on
        monkeypatch.setattr(server, "_handle", answer)
        assert await link.command(Retune(cls="batch", class_changes={"queue_depth": 3}))  # answered: applied
        await link.close()
    finally:
        await server.close()


async def test_a_reload_of_the_unchanged_file_keeps_the_runtime_overrides(gate):
    """A terminal hang-up is a SIGHUP: closing the tmux session a gate ran in reloaded the
    unchanged file and replaced the operator's retunes with its values (a trial)."""
    from gate.data.commands import Retune

    gate.control.execute(Retune(cls="batch", class_changes={"queue_depth": 3}), operator=ALICE)
    rows = gate.control.reload(parse_config(CONFIG), operator=ALICE, note="tg.toml sha256:1234")
    assert [(r.action, r.target) for r in rows] == [("reload", "config")]
    note = [a.note for a in gate.recent_audit if a.action == "reload"][-1] or ""
    assert "file is unchanged" in note and "overrides drop" in note and "queue_depth=3" in note, note
    assert gate.config.class_by_name("batch").queue_depth == 3
    assert gate.control.overrides.lines()


async def test_a_socket_group_the_gates_user_is_not_in_is_refused_at_start_and_said(gate, tmp_path, monkeypatch):
    """A trial followed the service setup: the ops group made, the service's user not in it. The
    socket's chown then failed with EPERM, said as "cannot be created (Operation not permitted)
    ... set [gate] control_socket to a writable place", and no console could attach. Now the gate
    refuses to start (exit 2) saying what to add, as for a group that does not exist."""
    import grp

    from gate.ops import control_socket
    from gate.ops.control_socket import ControlServer, SocketInUse

    group = grp.getgrgid(0).gr_name
    monkeypatch.setattr(control_socket.os, "geteuid", lambda: 4242)
    monkeypatch.setattr(control_socket.os, "getegid", lambda: 4242)
    monkeypatch.setattr(control_socket.os, "getgroups", lambda: [4242])
    server = ControlServer(str(tmp_path / "gate.sock"), gate, group=group)
    with pytest.raises(SocketInUse, match=f"uid 4242, which is not in group '{group}'.*SupplementaryGroups={group}"):
        await server.start()
    assert not (tmp_path / "gate.sock").exists()
    monkeypatch.setattr(control_socket.os, "getgroups", lambda: [4242, 0])  # a member: it may
    assert control_socket.can_give_to(0)


async def test_a_reload_that_changes_a_tenant_names_the_key_and_not_its_value(gate):
    """A trial raised one tenant's requests_per_minute and read "[[tenants]] changed: restart
    tokengate to apply (keys are read at start)", as if only keys were read at start."""
    before = CONFIG + '\n[[tenants]]\nname = "web"\napi_key_sha256 = "' + "ab" * 32 + '"\nrequests_per_minute = 60\n'
    gate.control.config = gate.control.file_config = parse_config(before)
    after = parse_config(before.replace("requests_per_minute = 60", "requests_per_minute = 300"))
    with pytest.raises(CommandError, match=r"^tenants\[0\]\.requests_per_minute changed: .*restart tokengate") as info:
        gate.control.reload(after, operator=ALICE)
    assert "ab" * 32 not in str(info.value) and "300" not in str(info.value)


async def test_a_reload_that_changes_shared_names_the_keys_and_never_the_url(gate):
    """A trial changed [shared] failure_policy and read "[shared] changed: restart tokengate to
    apply", naming no key. The URL is named, not shown: its password may be what changed."""
    before = CONFIG + '\n[shared]\nredis_url = "redis://:old-s3cret@10.0.0.5:6379/0"\nfailure_policy = "fail_open"\n'
    gate.control.config = gate.control.file_config = parse_config(before)
    after = parse_config(before.replace("fail_open", "fail_closed").replace("old-s3cret", "new-s3cret"))
    with pytest.raises(CommandError) as info:
        gate.control.reload(after, operator=ALICE)
    assert str(info.value).startswith(
        "[shared] redis_url, failure_policy (fail_open -> fail_closed) changed: restart tokengate to apply"
    ), info.value
    assert "s3cret" not in str(info.value) and "10.0.0.5" not in str(info.value)
