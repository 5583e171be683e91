"""The async shell around one backend's admission core.

`Admission` decides; this module waits. A queued request is one future; the
core's decisions resolve it (dispatched, timed out, drained). There is one
timer, set for the earliest queue deadline, and no polling. Every ticket is
released exactly once, including when the waiting task is cancelled at the
instant its request is dispatched.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from gate.core.admission import Admission, Admit, Capacity, ClassPolicy, Queue, Refuse, Step
from gate.core.errors import GateError
from gate.core.ledger import Request
from gate.core.prefill import PrefillModel
from gate.core.reasons import Reason

log = logging.getLogger("tokengate.gatekeeper")


class Refused(GateError):
    """Raised by `acquire` when the core refuses the request (at once or after waiting)."""

    def __init__(self, refusal: Refuse, *, waited: bool = False) -> None:
        super().__init__(refusal.reason, refusal.detail, retry_after_s=refusal.retry_after_s)
        self.refusal = refusal
        #: it waited in a queue before the refusal (timeout, drain); False: refused at once
        self.waited = waited


def context_error_fields(admission: Admission, request: Request) -> dict[str, object]:
    """llama-server's own shape for a request its context cannot hold (server-task.cpp,
    ``server_task_result_error::to_json``: ``type`` ``exceed_context_size_error`` with
    ``n_prompt_tokens`` and ``n_ctx``), for the gate's never-fits refusal: a client written for
    llama-server reads the same fields. ``n_ctx`` is the limit the request exceeded: one slot's
    context, or the most its class can ever hold when that is smaller; ``n_prompt_tokens`` is
    the largest task's prompt."""
    cap = admission.capacity
    limit = cap.slot_context if request.largest_task > cap.slot_context else admission.class_reach(request.cls, cap.ceiling)
    prompt = request.prompt_tokens if request.tasks == 1 else request.largest_task - request.max_tokens
    return {"type": "exceed_context_size_error", "n_prompt_tokens": prompt, "n_ctx": max(0, limit)}


@dataclass(slots=True, eq=False)
class Ticket:
    """A held reservation; `Gatekeeper.release` gives it back exactly once."""

    request: Request
    admitted_at: float
    owner: asyncio.Task | None = None
    expected_s: float | None = None  # set by the caller once known, for the reaper
    prefill_ahead: int = 0  # prompt tokens already prefilling when it was dispatched
    released: bool = field(default=False, init=False)

    @property
    def queued_s(self) -> float:
        return max(0.0, self.admitted_at - self.request.arrival)


class Gatekeeper:
    """Waiting, dispatching and releasing around one `Admission`."""

    def __init__(
        self,
        admission: Admission,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[], None] | None = None,
        prefill: PrefillModel | None = None,
        slo_ttft_s: float | None = None,
    ) -> None:
        self.admission = admission
        self.clock = clock
        # Measured first-token times: the core's TTFT estimate reads it, and with an objective
        # it sets the core's automatic prefill cap.
        self.prefill = prefill if prefill is not None else PrefillModel()
        self.slo_ttft_s = slo_ttft_s
        self.reaped = 0
        self._on_change = on_change
        # Waiting requests: the future their task awaits, and that task (the ticket's owner).
        self._waiters: dict[str, tuple[asyncio.Future[Ticket], asyncio.Task | None]] = {}
        self._tickets: dict[str, Ticket] = {}
        self._timer: asyncio.TimerHandle | None = None

    @property
    def tickets(self) -> tuple[Ticket, ...]:
        return tuple(self._tickets.values())

    async def acquire(self, request: Request) -> Ticket:
        """Admit now, or wait in the class queue until dispatched; raise Refused otherwise."""
        decision = self.admission.offer(request, self.clock())
        if isinstance(decision, Refuse):
            refused = Refused(decision)
            if decision.reason is Reason.CONTEXT_LENGTH_EXCEEDED:
                refused.extra = context_error_fields(self.admission, decision.request)
            raise refused
        if isinstance(decision, Admit):
            self._changed()
            return self._ticket(decision, _current_task())
        assert isinstance(decision, Queue)
        fut: asyncio.Future[Ticket] = asyncio.get_running_loop().create_future()
        self._waiters[request.id] = (fut, _current_task())
        self._arm_timer()
        self._changed()
        try:
            return await fut
        except asyncio.CancelledError:
            self._abandon(request.id, fut)
            raise

    def refuses_before_count(self, request: Request) -> Refused | None:
        """The refusal `acquire` would raise for `request` however large its uncounted prompt
        (`request.prompt_tokens`, a lower bound) turns out (`Admission.refuses_before_count`),
        else None; nothing changes but what a refusal counts (`Admission.refuses_before_count`)."""
        refusal = self.admission.refuses_before_count(request, self.clock())
        return None if refusal is None else Refused(refusal)

    def admit_now(self, request: Request) -> Ticket | None:
        """A ticket for `request` if the core admits it at once with nobody waiting anywhere
        (`Admission.fits_now`, then `offer`), else None and nothing changed: the forward beside
        the count (`[gate] forward_beside_count`) holds `request`, an upper bound of the real
        one, while llama-server counts; `settle` or `release(ran=False)` follows."""
        admission = self.admission
        if admission.waiting() or not admission.fits_now(request):
            return None
        decision = admission.offer(request, self.clock())
        if not isinstance(decision, Admit):  # fits_now with nobody waiting says it admits; be sure
            if isinstance(decision, Queue):
                admission.cancel(request.id)
            return None
        self._changed()
        return self._ticket(decision, _current_task())

    def settle(self, ticket: Ticket, request: Request) -> bool:
        """`ticket` (from `admit_now`) now holds `request`, counted (`Admission.settle`: no larger,
        or larger and admitted at once in its place); False, nothing changed, otherwise: the
        caller takes the ticket back (`release(ran=False)`, once llama-server has let go of it)."""
        if ticket.released or not self.admission.settle(request):
            return False
        ticket.request = request
        self.advance()  # the bound's tokens over the count may let a waiter go
        return True

    def release(self, ticket: Ticket, *, ran: bool = True) -> bool:
        """Give the ticket's tokens back; False if it was already released. `ran` False: its
        request never ran as admitted (a bound taken back: `Admission.withdraw`, no hold measured)."""
        if ticket.released:
            return False
        ticket.released = True
        self._tickets.pop(ticket.request.id, None)
        if ran:
            self.admission.release(ticket.request.id, self.clock())
        else:
            self.admission.withdraw(ticket.request.id, self.clock())
        self.advance()
        return True

    def first_token(self, ticket: Ticket) -> None:
        held = self.admission.ledger.get(ticket.request.id)
        if held is not None and held.prefilling and not ticket.released:
            self.prefill.observe(ticket.request.prompt_tokens + ticket.prefill_ahead, self.clock() - ticket.admitted_at)
            if self.slo_ttft_s is not None:
                self.admission.prefill_cap_auto = self.prefill.auto_prefill_cap(self.slo_ttft_s)
        if self.admission.first_token(ticket.request.id):
            # Prefill capacity came free: waiters blocked on it may go now.
            self.advance()

    def advance(self) -> Step:
        """Run the core's dispatch and resolve the futures it decided."""
        step = self.admission.advance(self.clock())
        for admit in step.admitted:
            fut, owner = self._waiters.pop(admit.request.id, (None, None))
            ticket = self._ticket(admit, owner)
            if fut is None or fut.done():
                # Its task was cancelled in the same instant: nobody will use the slot.
                self.release(ticket)
            else:
                fut.set_result(ticket)
        for refusal in step.expired:
            self._fail(refusal)
        self._arm_timer()
        if step.admitted or step.expired:
            self._changed()
        return step

    # ---- changes to the core: each re-arms the dispatch itself --------------------------

    def pause(self, cls: str, paused: bool = True) -> None:
        """Hold (or release) a class's queue; a resumed queue may dispatch at once."""
        self.admission.pause(cls) if paused else self.admission.resume(cls)
        self.advance()

    def set_policy(self, policy: ClassPolicy) -> None:
        self.admission.set_policy(policy)
        self.advance()

    def set_budget(self, budget: int) -> None:
        self.admission.set_budget(budget)
        self.advance()

    def set_capacity(self, capacity: Capacity) -> None:
        self.admission.set_capacity(capacity)
        self.advance()

    def drain(self, cls: str) -> int:
        """Refuse every request waiting in `cls`; returns how many."""
        refusals = self.admission.drain(cls, self.clock())
        for refusal in refusals:
            self._fail(refusal)
        self._arm_timer()
        self._changed()
        return len(refusals)

    def refuse_queued(self, reason: Reason, message: str, retry_after_s: float | None, *, classes: Collection[str] | None = None) -> int:
        """Refuse every request waiting (in `classes` only, when given) with `reason`; how many."""
        adm = self.admission
        refusals = []
        for cls in adm.class_names if classes is None else classes:
            for waiting in list(adm.queue(cls)):
                adm.cancel(waiting.request.id)
                refusals.append(Refuse(waiting.request, reason, message, retry_after_s))
        if refusals:
            self.refuse_waiting(refusals)
        return len(refusals)

    def refuse_waiting(self, refusals: list[Refuse]) -> None:
        """Fail waiters the caller already took out of the core's queues (`Admission.cancel`):
        router mode refuses them when their model fails or reports a context they never fit."""
        for refusal in refusals:
            self._fail(refusal)
        self._arm_timer()
        self._changed()

    def reap(self) -> list[Ticket]:
        """Force-release tickets whose request is gone and that outlived 2x their expected time."""
        now = self.clock()
        reaped = []
        for ticket in list(self._tickets.values()):
            owner_gone = ticket.owner is not None and ticket.owner.done()
            overdue = ticket.expected_s is None or now - ticket.admitted_at > 2 * ticket.expected_s
            if owner_gone and overdue and self.release(ticket):
                log.error("reaped leaked reservation %s (%s tokens)", ticket.request.id, ticket.request.cost)
                reaped.append(ticket)
        self.reaped += len(reaped)
        return reaped

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _ticket(self, admit: Admit, owner: asyncio.Task | None) -> Ticket:
        ahead = max(0, self.admission.ledger.prefilling - admit.request.prompt_tokens)
        ticket = Ticket(admit.request, admit.at, owner=owner, prefill_ahead=ahead)
        self._tickets[admit.request.id] = ticket
        return ticket

    def _fail(self, refusal: Refuse) -> None:
        fut, _ = self._waiters.pop(refusal.request.id, (None, None))
        if fut is not None and not fut.done():
            fut.set_exception(Refused(refusal, waited=True))

    def _abandon(self, request_id: str, fut: asyncio.Future[Ticket]) -> None:
        self._waiters.pop(request_id, None)
        if self.admission.cancel(request_id, self.clock()) is not None:
            self._arm_timer()
            self._changed()
        elif fut.done() and not fut.cancelled() and fut.exception() is None:
            # Dispatched, then cancelled before the task resumed: hand the slot back.
            self.release(fut.result())

    def _arm_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        deadline = self.admission.next_deadline(self.clock())
        if deadline is not None:
            # The loop may fire a timer up to its clock resolution early; a hair
            # of slack makes the deadline really past when the core looks.
            delay = max(0.0, deadline - self.clock()) + 0.001
            self._timer = asyncio.get_running_loop().call_later(delay, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self.advance()

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change()


def _current_task() -> asyncio.Task | None:
    try:
        return asyncio.current_task()
    except RuntimeError:
        return None
