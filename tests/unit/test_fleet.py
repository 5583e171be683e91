"""The fleet console's model (console/fleet.py): naming the gates, and one row per gate from a
REAL gate's snapshot; and the CLI's --attach, given once, several times or with [[fleet]]."""

from __future__ import annotations

import asyncio
import dataclasses
import types

import pytest

from console.fleet import FleetRow, fleet_entries, fleet_row, parse_attach
from gate.cli import build_parser
from gate.config import parse_config
from gate.core.ledger import Request
from gate.service import GateService
from tests.fakes import GATE_CONFIG, fake_llama_transport


def test_parse_attach_takes_an_optional_name():
    assert parse_attach("gpu-1=/run/tokengate/tokengate.sock") == ("gpu-1", "/run/tokengate/tokengate.sock")
    assert parse_attach("/tmp/gpu-2.sock") == ("", "/tmp/gpu-2.sock")
    assert parse_attach("/tmp/a=b.sock") == ("", "/tmp/a=b.sock")  # '=' inside a path is the path's
    assert parse_attach("=/tmp/x.sock") == ("", "=/tmp/x.sock")


def test_unnamed_gates_are_named_after_their_socket_and_numbered_when_taken():
    entries = fleet_entries(
        [
            ("", "/tmp/gpu-2.sock"),
            ("", "/run/a/tokengate.sock"),
            ("", "/run/b/tokengate.sock"),
            ("tokengate-2", "/run/c/x.sock"),
            ("", "/tmp/gpu-2.sock"),
        ]
    )
    assert [(e.name, e.socket) for e in entries] == [
        ("gpu-2", "/tmp/gpu-2.sock"),
        ("tokengate", "/run/a/tokengate.sock"),
        ("tokengate-3", "/run/b/tokengate.sock"),  # tokengate-2 is someone's own name
        ("tokengate-2", "/run/c/x.sock"),
    ]


def test_two_gates_with_one_name_are_refused():
    with pytest.raises(ValueError, match="two gates are named 'a'"):
        fleet_entries([("a", "/x.sock"), ("a", "/y.sock")])


async def test_a_row_holds_the_gates_own_figures():
    gate = GateService(parse_config(GATE_CONFIG), environ={}, transport=fake_llama_transport())
    try:
        await gate.backends.probe_all()
        gk = gate.backends.backends[0].gatekeeper
        held = [await gk.acquire(Request(f"h{i}", "batch", "t", 100, 100, 0.0)) for i in range(4)]
        waiting = asyncio.create_task(gk.acquire(Request("w", "interactive", "t", 10, 10, 0.0)))
        await asyncio.sleep(0)
        snap = gate.snapshot()
        row = fleet_row("gpu-1", snap, None)
        assert row == FleetRow(
            name="gpu-1",
            state="ok",
            note="",
            host=snap.gate_id.split(":")[0],
            listen=snap.listen,
            ready=1,
            backends=1,
            budget=snap.controller.budget,
            in_flight=800,
            running=4,
            queued=1,
            denials_per_min=0,
            p95_ttft_ms=None,
            slo_ttft_ms=2000.0,
            shared="off",
        )
        assert fleet_row("gpu-1", dataclasses.replace(snap, shared="fail_open"), None).shared == "fail_open"
        assert fleet_row("gpu-1", dataclasses.replace(snap, shutting_down=True), None).state == "stopping"
        waiting.cancel()
        for t in held:
            gk.release(t)
    finally:
        gk.close()
        await gate.client.aclose()


def test_the_ttft_column_is_the_class_furthest_over_its_own_objective_from_arrival():
    """The column read the worst class's p95 from dispatch against [budget]'s SLO: `117/2,000`
    in green while clients waited 1.9 s and interactive's objective was 1.5 s (a trial)."""
    from console.fleet import worst_class_ttft
    from gate.data.snapshot import ClassView, ControllerView

    def view(name: str, dispatch: float | None, arrival: float | None, objective: float) -> ClassView:
        return ClassView(
            name=name,
            priority=1,
            paused=False,
            reserved_tokens=0,
            limit_tokens=None,
            queue_depth=8,
            queue_timeout_s=10.0,
            default_max_tokens=64,
            max_tokens_cap=64,
            in_flight=0,
            queued=0,
            oldest_wait_s=None,
            admitted_per_min=0,
            refused_per_min=0,
            p95_ttft_ms=dispatch,
            p95_ttft_arrival_ms=arrival,
            p95_queue_ms=None,
            waiting_on="",
            ttft_objective_ms=objective,
        )

    controller = ControllerView(
        mode="adaptive",
        frozen=False,
        budget=2048,
        min_tokens=1024,
        ceiling=2048,
        p95_ttft_ms=117.0,
        p95_tpot_ms=None,
        slo_ttft_ms=2000.0,
        slo_tpot_ms=None,
    )
    snap = types.SimpleNamespace(
        controller=controller,
        classes=(
            view("interactive", 117.0, 1900.0, 1500.0),  # 127% of its objective
            view("batch", 150.0, 40000.0, 60000.0),  # 67% of its
        ),
    )
    assert worst_class_ttft(snap) == {"p95_ttft_ms": 1900.0, "slo_ttft_ms": 1500.0, "ttft_class": "interactive"}
    snap.classes = (view("interactive", None, None, 1500.0),)
    assert worst_class_ttft(snap) == {"p95_ttft_ms": None, "slo_ttft_ms": 2000.0}  # nothing measured: the SLO
    row = fleet_row("gpu-1", None, None)
    assert row.ttft_class == ""


def test_an_unreachable_gate_is_a_row_that_says_why():
    row = fleet_row("gpu-9", None, "no control socket here")
    assert (row.state, row.note, row.budget, row.queued) == ("down", "no control socket here", None, None)
    assert fleet_row("gpu-9", None, None).state == "connecting"


@pytest.mark.parametrize(
    ("argv", "attach"),
    [
        (["console"], None),
        (["console", "--attach"], [""]),
        (["console", "--attach", "/a.sock"], ["/a.sock"]),
        (["console", "--attach", "a=/a.sock", "--attach", "/b.sock"], ["a=/a.sock", "/b.sock"]),
    ],
)
def test_attach_may_be_given_several_times(argv, attach):
    assert build_parser().parse_args(argv).attach == attach
