"""A request cut short after dispatch keeps its slot until llama-server lets go of it
(gate/backend/pool.py `release_when_slot_frees`)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from gate.backend.gatekeeper import Ticket
from gate.backend.pool import release_when_slot_frees
from gate.core.admission import Admission, Admit, Capacity
from tests.unit.core_helpers import Cls, req


@dataclass
class _Answer:
    slots: list[dict[str, Any]]
    status_code: int = 200

    def json(self) -> list[dict[str, Any]]:
        return self.slots


@dataclass
class _FakeBackend:
    """llama-server's /slots as a script of answers; `on_poll` runs after each."""

    admission: Admission
    script: list[list[dict[str, Any]]]
    now: list[float]
    on_poll: Any = None
    polls: int = 0
    released_at_poll: int | None = None
    gatekeeper: Any = field(default=None)

    async def get(self, path: str, *, routed: bool, timeout: float) -> _Answer:
        assert path == "/slots"
        answer = _Answer(self.script[min(self.polls, len(self.script) - 1)])
        self.polls += 1
        if self.on_poll is not None:
            self.on_poll(self.polls)
        return answer


class _Keeper:
    def __init__(self, backend: _FakeBackend) -> None:
        self.backend = backend

    def release(self, ticket: Ticket, *, ran: bool = True) -> None:
        self.backend.released_at_poll = self.backend.polls
        self.backend.admission.release(ticket.request.id, self.backend.now[0])


def _slot(i: int, task: int, busy: bool) -> dict[str, Any]:
    return {"id": i, "id_task": task, "is_processing": busy}


def test_a_cut_request_keeps_its_slot_while_a_request_dispatched_after_it_is_not_started_yet():
    """A trial: four streams left during their 1,600-token prefills; llama-server went on
    prefilling one of them for 2.2 s (a batch is not interrupted). The gate held that one's slot,
    but let go of it as soon as it dispatched a new request that llama-server had not started
    yet (one busy slot shown, two held): all four new requests were dispatched at once, one more
    than llama-server had free, and every one of them got its first token after 2.3 s."""
    adm = Admission([Cls("chat", 10, queue_depth=8, queue_timeout_s=10.0)], Capacity(slots=4, slot_context=4000, ceiling=16000))
    now = [0.0]
    cut = req("chat", 1700, at=0.0)
    assert isinstance(adm.offer(cut, 0.0), Admit)
    ticket = Ticket(cut, 0.0)
    new = req("chat", 80, at=1.0)
    idle = [_slot(1, 5, False), _slot(2, 6, False), _slot(3, 7, False)]
    script = [
        [_slot(0, 10, True), *idle],  # the cut request still prefilling; nothing else started
        [_slot(0, 10, True), *idle],  # the new request is dispatched but not started yet
        [_slot(0, 10, True), _slot(1, 11, True), idle[1], idle[2]],  # now it runs too
        [_slot(0, 10, False), _slot(1, 11, True), idle[1], idle[2]],  # the cut one's slot is free
    ]

    def dispatch_new(polls: int) -> None:
        if polls == 1:
            now[0] = 1.0
            assert isinstance(adm.offer(new, 1.0), Admit)

    backend = _FakeBackend(adm, script, now, on_poll=dispatch_new)
    backend.gatekeeper = _Keeper(backend)
    asyncio.run(release_when_slot_frees(backend, ticket, timeout_s=30.0, clock=lambda: now[0]))  # type: ignore[arg-type]
    assert backend.released_at_poll == 4, f"released after poll {backend.released_at_poll}, while llama-server still ran it"


def test_a_cut_request_whose_slot_is_free_at_once_is_released_at_once():
    adm = Admission([Cls("chat", 10, queue_depth=8, queue_timeout_s=10.0)], Capacity(slots=4, slot_context=4000, ceiling=16000))
    now = [0.0]
    cut = req("chat", 100, at=0.0)
    other = req("chat", 100, at=0.0)
    assert isinstance(adm.offer(cut, 0.0), Admit) and isinstance(adm.offer(other, 0.0), Admit)
    script = [[_slot(0, 10, False), _slot(1, 11, True), _slot(2, 6, False), _slot(3, 7, False)]]
    backend = _FakeBackend(adm, script, now)
    backend.gatekeeper = _Keeper(backend)
    asyncio.run(release_when_slot_frees(backend, Ticket(cut, 0.0), timeout_s=30.0, clock=lambda: now[0]))  # type: ignore[arg-type]
    assert backend.released_at_poll == 1
