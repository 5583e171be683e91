"""The plain data a GateLink carries (snapshots, commands, results) and the journal lock."""

from __future__ import annotations

import json
import os

import pytest

from gate.config import parse_config
from gate.data.commands import ActionResult, CommandError, Drain, Freeze, Pause, Retune, from_wire, to_wire
from gate.data.snapshot import GateSnapshot, GpuDevice, GpuReading
from gate.data.wire import WireError, decode, encode
from gate.ops.control import Operator
from gate.ops.lock import JournalLock, JournalLocked
from tests.fakes import GATE_CONFIG, fake_llama_transport


@pytest.fixture
async def gate():
    from gate.service import GateService

    g = GateService(parse_config(GATE_CONFIG), environ={"USER": "alice"}, transport=fake_llama_transport())
    await g.backends.probe_all()
    yield g
    for b in g.backends:
        b.gatekeeper.close()
    await g.client.aclose()


async def test_a_snapshot_survives_json_whole(gate):
    from gate.data.records import AuditRecord
    from tests.console.conftest import decision, record

    for _ in range(3):
        record(gate, decision("batch"))
    gate.audit(AuditRecord(1.0, "alice", "local", "console", "pause_class", "class:batch", "False", "True"))
    gate.gpu_reading = GpuReading((GpuDevice(0, "NVIDIA H200", 5, 10, None, 44, ()),), None)
    snap = gate.snapshot()
    back = decode(GateSnapshot, json.loads(json.dumps(encode(snap))))
    assert back == snap


def test_decoding_names_what_is_wrong_and_tolerates_added_fields():
    good = {"devices": [], "unavailable": "NVML library not found", "added_by_a_newer_gate": 1}
    assert decode(GpuReading, good) == GpuReading((), "NVML library not found")
    with pytest.raises(WireError, match="devices is missing"):
        decode(GpuReading, {"unavailable": None})
    with pytest.raises(WireError, match="expected int"):
        decode(
            GpuDevice,
            {
                "index": "0",
                "name": "x",
                "used_bytes": 1,
                "total_bytes": 1,
                "reserved_bytes": None,
                "utilization_pct": None,
                "processes": [],
            },
        )
    with pytest.raises(WireError, match="boolean"):
        decode(
            GpuDevice,
            {
                "index": True,
                "name": "x",
                "used_bytes": 1,
                "total_bytes": 1,
                "reserved_bytes": None,
                "utilization_pct": None,
                "processes": [],
            },
        )


@pytest.mark.parametrize(
    "command",
    [
        Pause("batch", True),
        Drain("interactive", note="incident 7"),
        Freeze(False),
        Retune(budget=4096, settings={"slo_ttft_p95_ms": 900.0}, cls="batch", class_changes={"queue_depth": 3}),
        Retune(budget=6144, freeze=True),
    ],
)
def test_commands_round_trip_through_their_wire_form(command):
    assert from_wire(json.loads(json.dumps(to_wire(command)))) == command


def test_a_retune_without_freeze_is_understood_by_a_gate_that_predates_it():
    assert "freeze" not in to_wire(Retune(budget=4096))
    assert to_wire(Retune(budget=4096, freeze=False))["freeze"] is False


async def test_a_retune_can_freeze_the_controller_in_the_same_step(gate):
    op = Operator("alice", "local")
    results = gate.control.execute(Retune(budget=6144, freeze=True), operator=op)
    assert [r.action for r in results] == ["set_budget", "freeze"]
    assert gate.control.frozen and gate.backends.backends[0].admission.budget == 6144
    with pytest.raises(CommandError):
        gate.control.execute(Retune(budget=99_999, freeze=False), operator=op)
    assert gate.control.frozen  # refused whole: the freeze stays


@pytest.mark.parametrize(
    "wire, message",
    [
        ("pause", "must be an object"),
        ({"v": 2, "op": "pause", "cls": "a", "paused": True}, "version 2"),
        ({"v": 1, "op": "reboot"}, "unknown command 'reboot'"),
        ({"v": 1, "op": "pause", "cls": "a", "paused": True, "force": True}, "unknown field"),
        ({"v": 1, "op": "pause", "cls": "a"}, "pause:"),
        ({"v": 1, "op": "pause", "cls": "a", "paused": "yes"}, "paused must be true or false"),
        ({"v": 1, "op": "retune", "budget": 1.5}, "budget must be a whole number"),
        ({"v": 1, "op": "retune", "budget": True}, "budget must be a whole number"),
        ({"v": 1, "op": "retune", "settings": []}, "settings must be an object"),
        ({"v": 1, "op": "retune", "freeze": "yes"}, "freeze must be true, false or absent"),
    ],
)
def test_a_malformed_command_is_refused_with_its_reason(wire, message):
    with pytest.raises(CommandError, match=message):
        from_wire(wire)


async def test_execute_applies_a_retune_whole_or_not_at_all(gate):
    control, op = gate.control, Operator("alice", "local")
    adm = gate.backends.backends[0].admission
    before = (adm.budget, gate.config)
    for bad in (
        Retune(budget=4096, cls="batch", class_changes={"queue_depth": 3, "no_such_key": 1}),
        Retune(budget=4096, settings={"min_tokens": 5000}, cls="batch", class_changes={"queue_depth": 3}),
        Retune(budget=99_999, cls="batch", class_changes={"queue_depth": 3}),
        Retune(settings={"slo_ttft_p95_ms": -1.0}, budget=4096),
        Retune(cls="nope", class_changes={"queue_depth": 3}),
    ):
        with pytest.raises(CommandError):
            control.execute(bad, operator=op)
        assert (adm.budget, gate.config) == before
        assert not gate.recent_audit
    results = control.execute(
        Retune(budget=4096, settings={"min_tokens": 2048}, cls="batch", class_changes={"queue_depth": 3}), operator=op
    )
    assert [(r.action, r.target) for r in results] == [
        ("set_budget_settings", "budget"),
        ("set_class", "class:batch"),
        ("set_budget", "backend:default"),
    ]
    assert adm.budget == 4096 and gate.config.budget.min_tokens == 2048
    assert gate.config.class_by_name("batch").queue_depth == 3
    assert all(isinstance(r, ActionResult) for r in results)
    assert [a.gate_id for a in gate.recent_audit] == [gate.gate_id] * 3


async def test_a_retune_of_what_already_holds_audits_nothing_and_a_floor_over_every_ceiling_is_refused(gate):
    # A user's trial: a what-if applied twice wrote "queue_depth=2 -> queue_depth=2"; and
    # min_tokens 99999 went through (the retune form refuses it) to be clamped with a warning.
    control, op = gate.control, Operator("alice", "local")
    assert control.execute(Retune(cls="batch", class_changes={"queue_depth": 3}), operator=op)
    assert len(gate.recent_audit) == 1
    assert control.execute(Retune(cls="batch", class_changes={"queue_depth": 3}), operator=op) == []
    same = gate.config.budget.slo_ttft_p95_ms
    result = control.set_budget_settings(operator=op, slo_ttft_p95_ms=same)
    assert "already in force, nothing changed" in result.message
    assert len(gate.recent_audit) == 1  # neither audited
    # a retune where one key changes audits that key only
    old_timeout = gate.config.class_by_name("batch").queue_timeout_s
    (r,) = control.execute(Retune(cls="batch", class_changes={"queue_depth": 3, "queue_timeout_s": 7.0}), operator=op)
    assert (r.old_value, r.new_value) == (f"queue_timeout_s={old_timeout:g}", "queue_timeout_s=7")
    ceiling = gate.backends.backends[0].controller.ceiling_tokens
    with pytest.raises(CommandError, match=rf"above every backend's ceiling \(at most {ceiling}\)"):
        control.execute(Retune(settings={"min_tokens": ceiling + 1}), operator=op)
    assert gate.config.budget.min_tokens <= ceiling and len(gate.recent_audit) == 2


async def test_a_new_budget_reaches_admission_once_through_the_controller(gate):
    b = gate.backends.backends[0]
    b.controller.set_budget(0.0, 3000)
    assert b.admission.budget == 3000  # pushed by the controller's listener, nobody copied it


def test_one_gate_per_journal_and_the_holder_is_named(tmp_path):
    journal = str(tmp_path / "j.db")
    first, second = JournalLock(journal), JournalLock(journal)
    first.acquire("host:1:t")
    with pytest.raises(JournalLocked, match=rf"pid {os.getpid()}, gate host:1:t"):
        second.acquire("host:2:t")
    first.release()
    assert not os.path.exists(journal + ".lock")
    second.acquire("host:2:t")  # free again
    second.release()
    JournalLock(":memory:").acquire("x")  # nothing to lock


def test_a_lock_file_deleted_under_a_running_gate_is_taken_again(tmp_path):
    """A trial deleted `<journal>.lock` under a running gate: a second `tokengate serve` on the
    same journal then started (other port and socket), both wrote the journal and its
    overrides, and the second audited `unclean_end` for the first, alive. The holder now
    notices (housekeeping, every second) and takes the lock again."""
    journal = str(tmp_path / "j.db")
    first, second = JournalLock(journal), JournalLock(journal)
    first.acquire("host:1:t")
    assert first.keep() is True  # there: nothing to do
    os.unlink(journal + ".lock")
    assert first.keep() is True
    with pytest.raises(JournalLocked, match=rf"pid {os.getpid()}, gate host:1:t"):
        second.acquire("host:2:t")
    # someone else got there first: said, not fought over
    os.unlink(journal + ".lock")
    second.acquire("host:2:t")
    assert first.keep() is False
    second.release()
    first.release()


async def test_a_reservation_retune_that_r0_scales_says_what_is_in_force_in_the_toast_and_the_audit():
    """A user's trial of R0: the audit row and the toast said reserved_tokens 1024 where 512 was
    in force on a small pool."""
    from tests.fakes import SMALL_POOL_CONFIG, gate_on_fake_llama

    async with gate_on_fake_llama(SMALL_POOL_CONFIG) as g:
        op = Operator("alice", "local")
        (result,) = g.control.execute(Retune(cls="batch", class_changes={"reserved_tokens": 200}), operator=op)
        # interactive 512 + batch 200 = 712 > 400: batch 200 * 400 // 712 = 112 in force
        assert result.message.endswith("; in force (R0: half the ceiling): default 112"), result.message
        assert g.recent_audit[-1].note == "in force (R0: half the ceiling): default 112"
        (result,) = g.control.execute(Retune(cls="batch", class_changes={"queue_depth": 5}), operator=op)
        assert "in force" not in result.message  # said only of a reservation's retune
