"""A read-only console never starts a gate (console/run.py run_console)."""

from __future__ import annotations

import pytest

import console.run as run
import gate.ops.control_socket as control_socket
from gate.config import parse_config

CONFIG = """
[gate]
journal = "{journal}"
[classes.interactive]
priority = 10
"""


def config(tmp_path):
    return parse_config(CONFIG.format(journal=tmp_path / "journal.db"))


@pytest.fixture
def no_start(monkeypatch):
    async def start(*args, **kwargs):
        raise AssertionError("a read-only console started a gate")

    monkeypatch.setattr(run.GateProcess, "start", start)


async def test_a_gate_that_stops_between_two_looks_is_not_started_by_a_read_only_console(tmp_path, monkeypatch, no_start) -> None:
    # run_console looked twice: live at the first look, gone at the second (a restart), and a
    # read-only console fell through to starting a gate of its own, which took the journal's
    # lock from the gate being restarted (a trial's harness)
    looks = iter([True, False, False])
    monkeypatch.setattr(control_socket, "is_live", lambda path: next(looks))
    attached = []

    async def attach(path, *, read_only=False):
        attached.append(read_only)
        return 0

    monkeypatch.setattr(run, "attach_console", attach)
    assert await run.run_console(config(tmp_path), config_path="tg.toml", read_only=True) == 0
    assert attached == [True]


async def test_a_read_only_console_with_no_gate_says_so_and_starts_none(tmp_path, monkeypatch, no_start) -> None:
    monkeypatch.setattr(control_socket, "is_live", lambda path: False)
    with pytest.raises(run.ConsoleExit, match="only watches a running gate"):
        await run.run_console(config(tmp_path), config_path="tg.toml", read_only=True)
