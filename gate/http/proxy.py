"""The admitted request path: intake, count, admit or wait, relay, release, record.

A raw ASGI endpoint rather than a Starlette Response, because one task must own
the whole life of a request: it watches for the client leaving while the
request waits in a queue, while llama-server prefills and while tokens stream,
and its `finally` releases the reservation exactly once and writes the record.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from starlette.datastructures import Headers
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from gate.backend.gatekeeper import Ticket
from gate.backend.pool import Backend
from gate.backend.tokens import TokenCount
from gate.backend.upstream import REBUILT, EventFormat, RelayStats, SseRelay, forward_headers, relayed_headers, upstream_body
from gate.core.errors import GateError, Who, error_object, render
from gate.core.ledger import Request
from gate.core.reasons import CLIENT_DISCONNECT, Reason
from gate.core.shedding import Deadline, next_deadline
from gate.data.records import DecisionRecord, Outcome
from gate.http.apis.dispatch import error_shape, event_format, parse_request
from gate.http.assembly import assemble, plain_body, stream_loses
from gate.http.clientguard import BodyReader, abort, send_within
from gate.http.cors import mark_relayed
from gate.http.intake import Intake, fit_injected
from gate.http.requestids import HeaderNames, RequestIds
from gate.http.routing import REROUTABLE, Measured, admission_request, fallback_chain, fits_now, measure, routed_name, serving

if TYPE_CHECKING:
    from gate.http.ports import RequestPorts

_REQUEST_ID_RE = re.compile(r"[A-Za-z0-9._:-]{1,64}")
CLIENT_CLOSED = 499  # nginx's convention for "client closed the request"
#: the prompts one count answers whole (gate.backend.tokens.TokenKind): what may go beside it
_COUNTED_WHOLE = frozenset({"chat", "completions", "completion", "messages", "responses"})
#: the ledger id of a request's bound (its id + this), apart from the request offered as counted
_BOUND_ID = "/beside-count"
#: the longest a bound taken back waits for llama-server to let go of its slot
_TAKE_BACK_S = 3.0
#: llama-server's Content-Type for its JSON answers (server-http.cpp), spelled as it does
_JSON = b"application/json; charset=utf-8"
_STREAM_ONLY = frozenset({b"x-accel-buffering"})  # a stream's header, wrong on an answer assembled whole


class ClientGone(Exception):
    """The client disconnected before the answer was complete."""


class AdmittedEndpoint:
    """ASGI app for every admitted route (gate/data/endpoints.py): OpenAI chat and completions,
    /completion, and the Messages and Responses APIs through their adapters (gate/http/apis/)."""

    def __init__(self, gate: RequestPorts) -> None:
        self.gate = gate
        self.new_id = RequestIds()
        self.header_name = HeaderNames()

    def __call__(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        # Returns the flow's coroutine rather than awaiting it: one coroutine frame
        # less for each of the thousands of requests a queue may hold.
        return _Flow(self.gate, scope, receive, send, self.new_id, self.header_name).run()


class _Flow:
    """One request's journey; every exit path goes through `conclude` exactly once."""

    # Thousands may wait in a queue at once: no per-request __dict__.
    __slots__ = (
        "gate",
        "scope",
        "receive",
        "send",
        "headers",
        "request_id",
        "core_id",
        "t0",
        "wall0",
        "intake",
        "backend",
        "count",
        "ticket",
        "stats",
        "rate_charged",
        "started",
        "concluded",
        "committed",
        "budget_at",
        "in_flight_at",
        "_task",
        "_cut",
        "_watchdog",
        "_counted",
        "_decoding",
        "_plain",
        "shared_lease",
        "shared_done",
        "model_name",
        "rerouted_from",
        "caller",
        "waited_s",
        "queued",
        "events",
        "_early",
        "_early_at",
    )

    def __init__(
        self,
        gate: RequestPorts,
        scope: Scope,
        receive: Receive,
        send: Send,
        new_id: Callable[[], str],
        header_name: Callable[[bytes], str],
    ) -> None:
        self.gate = gate
        self.scope = scope
        limits = gate.config.gate
        self.receive = BodyReader(receive, scope["headers"], limits.max_body_bytes, limits.body_timeout_s)
        self.send = send
        self.headers = {header_name(k): v.decode("latin-1") for k, v in scope["headers"]}
        given = self.headers.get("x-request-id", "")
        if _REQUEST_ID_RE.fullmatch(given):
            self.request_id = given  # the client's, in its answer, the journal and the log
            # the core's id is the gate's own: a client may reuse its id while its first try is
            # held (an SDK's retry of a cut plain call, whose slot is held until llama-server lets
            # go), and the core's ids are unique (a second reservation under one id was a 500)
            self.core_id = f"{given}~{new_id()}"
        else:
            self.request_id = self.core_id = new_id()
        self.t0 = gate.clock()
        self.wall0 = time.time()
        self.intake: Intake | None = None
        self.backend: Backend | None = None
        self.count: TokenCount | None = None
        self.ticket: Ticket | None = None
        self.stats: RelayStats | None = None
        self.rate_charged = 0
        self.shared_lease: Any = None  # the tenant's reservation across gates ([shared]), if any
        self.shared_done: asyncio.Future[bool] | None = None  # its release, once in Redis
        self.started = False  # response headers sent
        self.concluded = False
        self.committed: asyncio.Future[bool] | None = None  # the decision row's commit
        self.budget_at: int | None = None
        self.in_flight_at: int | None = None
        self._task: asyncio.Task[Any] | None = None  # this request's task, while `_race` runs its work
        self._cut: Exception | None = None  # why `_race` cancelled the work: ClientGone, or a shed
        self._watchdog: asyncio.TimerHandle | None = None  # the next progress check while relaying
        self._counted = 0  # tokens of this request already fed to the backend's decode meter
        self._decoding = False  # counted among the meter's decoding streams
        self._plain = False  # a plain (non-streamed) upstream call: no token to watch, only the clock
        self.model_name: str | None = None  # the model that answers, when the gate routed by model
        self.rerouted_from: str | None = None  # the model asked for, when a fallback answers
        self.caller: Who | None = None  # who asked, when refused before the intake was whole
        #: time spent in admission queues by tries that ended without a ticket (refused after
        #: waiting, drained, a fallback tried next, the client gone); None: never offered
        self.waited_s: float | None = None
        #: it went through an admission queue: waited in one (whatever ended it), or was admitted
        #: (at once too); what tokengate_queue_wait_seconds observes. Not a refusal at once.
        self.queued = False
        #: the reader of a typed event stream (Messages, Responses: gate/http/apis/), while relaying
        self.events: EventFormat | None = None
        #: the forward sent beside the count ([gate] forward_beside_count), and when it was sent
        self._early: asyncio.Future[Any] | None = None
        self._early_at: float | None = None

    # ---- the path ------------------------------------------------------------

    async def run(self) -> None:
        try:
            tenants = self.gate.tenants
            headers = Headers(raw=self.scope["headers"])  # every pair: repeated credentials are seen
            # With tenants, the key is checked before the body is read: an anonymous caller costs no read
            # (open mode in front of a keyed backend: its key, the same way).
            if tenants.open:
                tenants.check_key(headers)
            caller = None if tenants.open else tenants.identify(headers, self._client_host(), None)
            self.caller = caller
            raw = await self._read_body()
            if self.gate.shutting_down:
                raise GateError(Reason.SHUTTING_DOWN, "the gate is shutting down; retry against another instance", retry_after_s=1.0)
            self.intake = parse_request(self.scope["path"], raw, headers, self._client_host(), self.gate.config, tenants, caller)
            await self._race(self._serve())
        except GateError as err:
            if err.caller is not None:
                self.caller = err.caller
            await self._failed(err)
        except ClientGone:
            self.conclude("cancelled", CLIENT_DISCONNECT, CLIENT_CLOSED)
        except asyncio.CancelledError:
            if await self._server_cancelled():
                return  # the client has its complete answer: nothing left to cancel
            raise
        except Exception:
            self.gate.log.exception("request %s failed inside the gate", self.request_id)
            # internal_error, not upstream_error: a trial's router-mode bug answered 500
            # upstream_error, and the upstream-5xx alert would have sent the on-call to llama-server
            await self._failed(GateError(Reason.INTERNAL_ERROR, "internal error in the gate; the request was not completed"))
        finally:
            if not self.concluded:
                self.conclude("failed", Reason.INTERNAL_ERROR, 500)

    async def _serve(self) -> None:
        intake = self.intake
        assert intake is not None
        if not intake.model and self.gate.backends.configured[0].fleet is not None:
            # a router needs the model named, and says so in these words (a trial's request with
            # none was served by the router's first model, where llama-server answers 400)
            raise GateError(Reason.INVALID_REQUEST, "model name is missing from the request", "model")
        backend = self.gate.backends.route(intake.model)
        if backend is None:
            shown = intake.model if intake.model is None or len(intake.model) <= 64 else intake.model[:64] + "..."
            # llama-server's router answers an unknown model so (400, its words); the gate adds where
            # to look, since a model its router has may still not be one the gate serves
            raise GateError(
                Reason.MODEL_NOT_FOUND, f"model {shown!r} not found (GET /v1/models lists the models this gate serves)", "model"
            )
        chain = fallback_chain(self.gate, intake.caller, backend)
        if backend.fleet is None and not chain:
            await self._admit(backend, intake, early=True)
        else:
            backend = await self._admit_routed(backend, chain, intake)
        admission = backend.gatekeeper.admission  # type: ignore[union-attr]
        self.budget_at, self.in_flight_at = admission.budget, admission.ledger.in_flight
        assert self.ticket is not None  # acquired just above, or it raised
        self.ticket.expected_s = self.gate.config.gate.request_timeout_s  # the longest it may run
        assert self.intake is not None
        await self._relay(backend, self.intake)  # as admitted: an injected limit may be fitted (fit_injected)

    async def _admit(self, backend: Backend, intake: Intake, *, early: bool = False) -> None:
        """Count, charge the tenant (once) and hold a ticket on `backend`, or raise why not.
        `early`: a plain backend with no fallback, where the forward may go beside the count."""
        self.backend = backend
        if backend.fleet is not None:
            backend.fleet.check(backend)  # failed, missing, not loadable: at once
            self.model_name = backend.model
        elif backend.state != "ready" or backend.gatekeeper is None:
            # The detail (it may hold the backend's address) stays in the log and the console.
            raise GateError(Reason.NO_BACKEND, f"backend {backend.name!r} is {backend.state}", retry_after_s=5.0)
        bound = self._forward_early(backend, intake) if early else None
        try:
            if early and bound is None and self._one_count(intake):
                measured = await self._count_in_turn(backend, intake)
            else:
                measured = await measure(self.gate, backend, intake)
            if bound is None and backend.capacity is not None and measured.tasks == 1:
                # a class default that does not fit the slot after this prompt: what fits (a bound
                # forwarded beside the count already fitted the default)
                self.intake = intake = fit_injected(intake, measured.count.tokens, backend.capacity.slot_context)
            self.count = measured.count
            cost = measured.count.tokens + measured.tasks * intake.max_tokens  # Request.cost: every task's prompt and limit
            if not self.rate_charged:  # once, even when a fallback model is tried next
                self._rate_check(intake.caller.tenant, cost)
                if self.gate.shared is not None and intake.caller.tenant_config is not None:
                    # The fleet-wide limits: one atomic round trip to Redis, bounded (gate/fleet/sharedlimits/).
                    self.shared_lease = await self.gate.shared.reserve(intake.caller.tenant_config, cost)
        except BaseException:
            if bound is not None:
                self.gate.metrics.beside("taken_back")
                self._take_back(backend, bound)
            raise
        assert backend.gatekeeper is not None
        if bound is not None:
            # Admitted at arrival on the bound: the count settles it (or, larger, where it stands
            # if it fits there), else the bound is taken back and the request offered as counted.
            try:
                counted = admission_request(bound.request.id, intake, measured, bound.request.arrival, self.t0)
                grew = counted.cost > bound.request.cost
                settled = backend.gatekeeper.settle(bound, counted)
            except BaseException:
                self.gate.metrics.beside("taken_back")
                self._take_back(backend, bound)
                raise
            if settled:
                self.gate.metrics.beside("grown" if grew else "settled")
                self.ticket = bound
                self.queued = True  # admitted at once
                return
            self.gate.metrics.beside("over_bound")
            self._take_back(backend, bound)
        # Arrival is now: queue time is time spent waiting for admission, not counting tokens.
        request = admission_request(self.core_id, intake, measured, self.gate.clock(), self.t0)
        queued = True  # until the core says it refused at once
        try:
            self.ticket = await backend.gatekeeper.acquire(request)
        except GateError as err:
            queued = bool(getattr(err, "waited", True))
            if backend.fleet is not None:
                backend.fleet.refused(backend, err)  # Retry-After from the load time, while it loads
            raise
        finally:
            if self.ticket is None or self.ticket.request is not request:
                # Refused after waiting, drained, or cancelled while queued: the wait counts.
                # Refused at once: it never waited (0, not the microseconds of the decision).
                waited = max(0.0, self.gate.clock() - request.arrival) if queued else 0.0
                self.waited_s = (self.waited_s or 0.0) + waited
                self.queued = self.queued or queued
            else:
                self.queued = True  # admitted
        if backend.fleet is not None and self.count is not None and self.count.source == "estimate" and serving(backend):
            await self._recount(backend, intake)

    async def _recount(self, backend: Backend, intake: Intake) -> None:
        """A router's model cannot count before it is loaded (asking would load it): its waiters
        were admitted on an estimate (JSON bytes / 3, without the chat template: 350 for a prompt
        of 776 in a trial, and a 1,511-token prompt estimated at 685 reached llama-server, which
        refused it). Dispatched now that it is loaded, the request is counted and its reservation
        settled to the count; a larger count with no room where it stands gives the estimate's
        hold back and is offered as counted, from its arrival (it may wait again; one that never
        fits gets the gate's 400)."""
        assert self.ticket is not None and backend.gatekeeper is not None
        held = self.ticket.request
        try:
            measured = await measure(self.gate, backend, intake)
        except BaseException:
            backend.gatekeeper.release(self.ticket, ran=False)
            self.ticket = None
            raise
        if measured.count.source != "exact":
            return
        if backend.capacity is not None and measured.tasks == 1:
            self.intake = intake = fit_injected(intake, measured.count.tokens, backend.capacity.slot_context)
        self.count = measured.count
        counted = admission_request(held.id, intake, measured, held.arrival, held.came)
        if backend.gatekeeper.settle(self.ticket, counted):
            return
        ticket, self.ticket = self.ticket, None
        backend.gatekeeper.release(ticket, ran=False)
        self.ticket = await backend.gatekeeper.acquire(counted)

    def _forward_early(self, backend: Backend, intake: Intake) -> Ticket | None:
        """Forward beside the count ([gate] forward_beside_count): when `backend` admits at once,
        with nobody waiting, a request as large as an upper bound of this one (`TokenCounter.bound`:
        its prompt's JSON bytes / 3, x what the backend's counts needed lately, + 64), the
        request goes to llama-server now, holding that bound, and the count runs beside it: the
        count's round trip (2.4-2.7 ms of the +6 to +9 ms the gate added to TTFT p50 at light
        load, 2026-12-05) leaves the first token's path. The ticket, or None (nothing changed: count,
        then admit, then forward). Not for what a count answers in pieces (tasks, copies,
        /predict), nor for a tenant with rate limits or fleet-wide limits (charged on the count)."""
        gate = self.gate
        caller = intake.caller
        keeper = backend.gatekeeper
        if keeper is None or not gate.config.gate.forward_beside_count or keeper.admission.waiting() or not self._one_count(intake):
            return None  # (with waiters it would wait: count first, as before)
        prompt = gate.tokens.bound(backend.url, intake.kind, intake.body, model=backend.model)  # type: ignore[arg-type]
        # its own id: taken back, it may be held until llama-server lets go while the request
        # is offered again as counted
        bound = Request(self.core_id + _BOUND_ID, caller.cls, caller.tenant, prompt, intake.max_tokens, gate.clock(), came=self.t0)
        ticket = keeper.admit_now(bound)
        if ticket is not None:
            try:
                call = self._upstream_call(backend, intake)
            except BaseException:
                keeper.release(ticket, ran=False)  # nothing was sent: the bound goes back now
                raise
            self._early = asyncio.ensure_future(backend.upstream.open(*call))
            self._early_at = ticket.admitted_at
        return ticket

    def _one_count(self, intake: Intake) -> bool:
        """Does one count of the whole prompt decide this request (not what a count answers in
        pieces: tasks, copies, /predict), with nothing charged on the count (a tenant's rate
        limits, fleet-wide limits)? Then the gate may act before the count comes back."""
        gate, caller = self.gate, intake.caller
        return (
            intake.kind in _COUNTED_WHOLE
            and intake.plans is None
            and intake.copies == 1
            and not gate.ratelimit.limited(caller.tenant)
            and not (gate.shared is not None and caller.tenant_config is not None)
        )

    async def _count_in_turn(self, backend: Backend, intake: Intake) -> Measured:
        """Refuse what the count could only confirm (`_refuse_before_count`), else count, at most
        COUNTS_AT_ONCE of the backend's at a time, looking again when its turn comes: a burst of
        60 arrived together, each found an empty queue, and all of them waited on llama-server's
        counts (up to the 2 s the gate allows one) before 53 were refused (a trial, 2026-12-05)."""
        self._refuse_before_count(backend, intake)
        waits = backend.counting.locked()
        asked = self.gate.clock()
        async with backend.counting:
            if waits:
                # a wait in the gate's queue for the count's turn: a refusal after it reported a
                # queue wait of 0 ms ("refused at once") after 2 s in the gate (a trial)
                self.waited_s = (self.waited_s or 0.0) + max(0.0, self.gate.clock() - asked)
                self.queued = True
            self._refuse_before_count(backend, intake)  # the ones counted before it may have queued
            return await measure(self.gate, backend, intake)

    def _refuse_before_count(self, backend: Backend, intake: Intake) -> None:
        """Raise the refusal the count could only confirm (`Gatekeeper.refuses_before_count`, the
        prompt taken as 0 tokens): under overload llama-server's count waited on its busy HTTP
        threads, up to the 2 s the gate allows it, before a refusal "at arrival" (a user's trial,
        2026-12-05: 2.0 s on average where counts timed out, 257 ms where they answered). Its
        journal row carries a likely count (`TokenCounter.likely`), marked "estimate"."""
        keeper = backend.gatekeeper
        if keeper is None:
            return
        caller = intake.caller
        refused = keeper.refuses_before_count(
            Request(self.core_id, caller.cls, caller.tenant, 0, intake.max_tokens, self.gate.clock(), came=self.t0)
        )
        if refused is not None:
            self.count = self.gate.tokens.likely(backend.url, intake.kind, intake.body, model=backend.model)  # type: ignore[arg-type]
            if backend.capacity is not None:
                # journaled with the limit the gate would have forwarded after that prompt, as a
                # counted request is: a trial's batch default 512 on slots of 512 was journaled as
                # 51 + 512, which replay re-ran as never-fits and the aiperf trace sent as 512
                self.intake = fit_injected(intake, self.count.tokens, backend.capacity.slot_context)
            self.waited_s = self.waited_s or 0.0  # refused at once (after its count's turn, if it waited for one)
            raise refused

    def _take_back(self, backend: Backend, ticket: Ticket) -> None:
        """The count exceeded the bound where it stands, failed, or the client left, while the
        request went beside its count: close llama-server's request and give the bound back,
        unmeasured, once llama-server shows the slot free (it prefills a prompt of up to a batch
        whole before it sees the cancel: 1.1 s for 352 tokens here, while the gate, which had
        given the bound back at once, dispatched the request again into that busy slot)."""
        self._drop_early()
        ticket.expected_s = _TAKE_BACK_S  # for the reaper: its owner may end before llama-server lets go
        self.gate.release_when_slot_frees(backend, ticket, _TAKE_BACK_S, ran=False)

    def _drop_early(self) -> None:
        """Close the forward sent beside the count (llama-server frees the slot once it sees the
        connection closed), whether its answer has come or not."""
        task, self._early, self._early_at = self._early, None, None
        if task is None:
            return
        if not task.done():
            task.cancel()
        task.add_done_callback(_close_answer)

    async def _admit_routed(self, backend: Backend, chain: list[Backend], intake: Intake) -> Backend:
        """Router mode and fallbacks: the requested model, or the first fallback that admits at
        once while it is saturated or loading, or that takes the request when it refuses."""
        target, why = backend, ""
        if chain and not await fits_now(self.gate, backend, intake):
            for fallback in chain:
                if await fits_now(self.gate, fallback, intake):
                    target, why = fallback, ("saturated" if serving(backend) else "loading")
                    break
        try:
            await self._admit(target, intake)
        except GateError as err:
            if target is not backend or err.reason not in REROUTABLE:
                raise
            for fallback in chain:
                try:
                    await self._admit(fallback, intake)
                except GateError:
                    continue
                target, why = fallback, "refused"
                break
            else:
                self.backend, self.model_name = backend, backend.model
                raise err from None
        if why:
            if why == "loading" and backend.fleet is not None and backend.model is not None:
                backend.fleet.demand(backend.model)  # the fallback answers this one; load it for the next
            self.model_name = target.model or routed_name(target, intake)
            self.rerouted_from = backend.model or intake.model
            self.gate.model_metrics.rerouted(self.rerouted_from, self.model_name, why)
            self.gate.log.info("request %s: %s %s, rerouted to %s", self.request_id, self.rerouted_from, why, self.model_name)
        return target

    def _rate_check(self, tenant: str, cost: int) -> None:
        verdict = self.gate.ratelimit.check(tenant, cost, self.gate.clock())
        if verdict.never:
            raise GateError(Reason.TENANT_QUOTA, f"request needs {cost} tokens, more than tenant {tenant!r} may use per minute")
        if not verdict.allowed:
            raise GateError(
                Reason.RATE_LIMITED, f"tenant {tenant!r} is over its {verdict.limit}-per-minute limit", retry_after_s=verdict.wait_s
            )
        self.rate_charged = cost

    # ---- relaying ------------------------------------------------------------

    async def _relay(self, backend: Backend, intake: Intake) -> None:
        ticket = self.ticket
        keeper = backend.gatekeeper
        assert ticket is not None and keeper is not None
        gate = self.gate
        early, sent_at = self._early, self._early_at
        self._early = self._early_at = None
        self.stats = stats = RelayStats(dispatched_at=gate.clock() if sent_at is None else sent_at)
        call = None if early is not None else self._upstream_call(backend, intake)
        plain = self._plain
        self._check_progress()  # arms the watchdog: stall, overrun and request_timeout_s
        response = None
        try:
            try:
                response = await (early if call is None else backend.upstream.open(*call))  # type: ignore[misc]
            except GateError as err:
                if backend.fleet is not None and err.status == 400 and b"model is not loaded" in (err.body or b""):
                    # the router's own 400 for a model gone outside the gate (a kill, a straight
                    # unload): the client was told its request was wrong (a trial)
                    raise backend.fleet.gone(backend) from None
                raise
            relay = SseRelay(
                response,
                stats,
                gate.clock,
                lambda: keeper.first_token(ticket),
                keep_usage_chunk=intake.include_usage,
                collect=not intake.stream,
                events=event_format(intake.kind),
                stops_left=ticket.request.tasks,
                tasks=ticket.request.tasks,
                batch_s=gate.config.gate.stream_batch_ms / 1000.0,
            )
            self.events = relay.events
            if plain:
                await self._relay_plain(relay)
            elif intake.stream:
                await self._relay_stream(relay)
            else:
                await self._relay_collect(relay, intake)
        finally:
            if self._watchdog is not None:
                self._watchdog.cancel()
                self._watchdog = None
            if self._decoding:
                backend.decode.stop(gate.clock())
            if response is not None:
                await response.aclose()  # frees the llama-server slot on every path, before the client hears
            elif early is not None:
                early.add_done_callback(_close_answer)  # cut while its answer came: closed all the same

    def _upstream_call(self, backend: Backend, intake: Intake) -> tuple[str, dict[str, Any], dict[str, str | bytes]]:
        """llama-server's path, body and headers for this request; sets `_plain`."""
        # The few options whose answer llama-server's stream lacks get a plain call (no fast cancel).
        # Embeddings and rerank have no stream at all: their body goes as sent, their answer as given.
        # Several tasks answered at once (choices by index) are not rebuilt from the stream either.
        self._plain = plain = intake.unstreamed or (not intake.stream and (intake.several or stream_loses(intake.kind, intake.body)))
        sent = intake.body
        if self.model_name is not None and sent.get("model") != self.model_name:
            sent = {**sent, "model": self.model_name}  # router mode names its model; a fallback its own
        body = dict(sent) if intake.unstreamed else plain_body(sent) if plain else upstream_body(intake.kind, sent)
        # Router mode: llama-server must never load (and queue behind) a model on its own.
        path = intake.path + ("?autoload=false" if backend.model is not None else "")
        return path, body, forward_headers(self.headers, backend.auth_token)

    async def _relay_stream(self, relay: SseRelay) -> None:
        await self._start(
            200,
            [
                # spelled as llama-server does, and without a Cache-Control it does not send (its
                # X-Accel-Buffering, relayed, is what keeps a proxy from holding the stream)
                (b"Content-Type", b"text/event-stream"),
                *relayed_headers(relay.response.headers, drop=REBUILT),
            ],
            relayed=True,
        )
        final = ""  # the terminal event ([DONE], or /completion's stop chunk) and anything after it
        async for now, held in relay.reads():
            self._progressed()
            # The terminal event waits for the decision row's commit, so a client
            # never sees the end of a request the journal could still lose.
            final += held
            if now:
                await self._body(now.encode())
        if relay.error is None and not relay.stats.finished:
            # The stream ended cleanly but before its end ([DONE], the stop chunk, message_stop):
            # a llama-server router whose model process died ends its chunked answer with a
            # line "proxy error: ..." that SSE readers ignore, so the client saw an answer cut
            # short as if it were whole. Say so in the stream's format, as for a broken one.
            raise self._cut_short(relay)
        if relay.error is not None:
            self.conclude("failed", Reason.UPSTREAM_ERROR, 200)
        else:
            self._finish_ok()
        await self._last(final.encode())

    def _cut_short(self, relay: SseRelay) -> GateError:
        """A stream that ended without its end, logged with the backend's name (the journal has the row)."""
        name = self.backend.name if self.backend is not None else "?"
        self.gate.log.warning(
            "request %s: backend %s closed its stream before finishing (%d tokens read)", self.request_id, name, relay.stats.tokens
        )
        return GateError(Reason.UPSTREAM_ERROR, "backend closed the stream before finishing", retry_after_s=1.0)

    async def _relay_collect(self, relay: SseRelay, intake: Intake) -> None:
        async for _ in relay.reads():
            self._progressed()
        if relay.error is not None:
            message = str(relay.error.get("message") or "backend reported an error mid-answer")
            raise GateError(Reason.UPSTREAM_ERROR, message)
        if not relay.stats.finished or not relay.chunks:
            raise self._cut_short(relay)
        payload = json.dumps(assemble(intake.kind, relay.chunks)).encode()
        self._finish_ok()
        # The head of llama-server's plain answer: its JSON type, without its stream's X-Accel-Buffering.
        own = relayed_headers(relay.response.headers, drop=REBUILT | _STREAM_ONLY)
        await self._start(200, [(b"Content-Type", _JSON), *own, _length(payload)], relayed=True)
        await self._last(payload)

    async def _relay_plain(self, relay: SseRelay) -> None:
        payload = await relay.whole()
        self._finish_ok()
        content_type = relay.response.headers.get("content-type")
        await self._start(
            200,
            [
                (b"Content-Type", content_type.encode("latin-1") if content_type else _JSON),
                *relayed_headers(relay.response.headers, drop=REBUILT),
                _length(payload),
            ],
            relayed=True,
        )
        await self._last(payload)  # llama-server's own answer, byte for byte

    # ---- progress: what decides a shed -----------------------------------------

    def _progressed(self) -> None:
        """Feed the tokens of the last read to the backend's decode meter."""
        stats = self.stats
        if stats is None or stats.tokens == self._counted or self.backend is None:
            return
        meter = self.backend.decode
        if not self._decoding:
            self._decoding = True
            meter.start(stats.first_token_at if stats.first_token_at is not None else self.gate.clock())
        meter.add(stats.last_token_at if stats.last_token_at is not None else self.gate.clock(), stats.tokens - self._counted)
        self._counted = stats.tokens

    def _deadline(self) -> Deadline:
        stats, intake, backend = self.stats, self.intake, self.backend
        assert stats is not None and intake is not None and backend is not None
        config = self.gate.config.gate
        return next_deadline(
            dispatched_at=stats.dispatched_at,
            first_token_at=stats.first_token_at,
            last_token_at=stats.last_token_at,
            max_tokens=intake.max_tokens,
            per_slot_tps=backend.decode.per_slot_tps(self.gate.clock()),
            factor=config.shed_factor,
            stall_s=config.shed_stall_s,
            timeout_s=config.request_timeout_s,
            blind=self._plain,
        )

    def _check_progress(self) -> None:
        """The watchdog: one timer, re-armed for the deadline as it stands now; cut the work once it passed.

        The deadline is recomputed when the timer fires, never trusted from when it
        was set: tokens that came since, or a slower decode rate, move it later. The
        reason is the one of the deadline that passed (no race between two timers).
        """
        self._watchdog = None
        deadline = self._deadline()
        delay = deadline.at - self.gate.clock()
        if delay > 0:
            # The loop may fire a timer up to its clock resolution early: a hair of slack.
            self._watchdog = asyncio.get_running_loop().call_later(delay + 0.001, self._check_progress)
            return
        self.gate.log.warning("request %s cut: %s", self.request_id, deadline.message)
        self._cancel_work(GateError(deadline.reason, deadline.message))

    def _cancel_work(self, why: Exception) -> None:
        task = self._task
        if task is not None and self._cut is None:
            self._cut = why
            task.cancel()

    def _finish_ok(self) -> None:
        if self.backend is not None and self.stats is not None:
            self.gate.observe_success(self.backend, self.stats)
        self.conclude("admitted", "ok", 200)

    # ---- responses -----------------------------------------------------------

    async def _race(self, work: Awaitable[None]) -> None:
        """Run `work` in this task until it finishes or the client disconnects (then cancel it)."""
        # One watcher task that cancels this one, rather than a task for the work and
        # asyncio.wait over both: a third of the cost per request on a refusal flood.
        me = self._task = asyncio.current_task()
        assert me is not None
        watcher = asyncio.ensure_future(self._disconnected())
        watcher.add_done_callback(self._client_left)
        try:
            await work
        except asyncio.CancelledError:
            if self._cut is not None and me.uncancel() == 0:
                raise self._cut from None  # ClientGone, or the watchdog's shed / timeout
            raise  # the server is cancelling this request (shutdown)
        finally:
            self._task = None
            watcher.cancel()

    def _client_left(self, watcher: asyncio.Future[None]) -> None:
        # Only while the work runs: a cancel requested after it returned would land
        # on whatever this task awaits next.
        if not watcher.cancelled() and watcher.exception() is None:
            self._cancel_work(ClientGone())

    async def _disconnected(self) -> None:
        while (await self.receive.receive())["type"] != "http.disconnect":
            pass

    async def _read_body(self) -> bytes:
        """The whole body; the size limit and the read deadline are the BodyReader's."""
        chunks: list[bytes] = []
        while True:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                raise ClientGone
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                return b"".join(chunks)

    def _client_host(self) -> str | None:
        client = self.scope.get("client")
        return client[0] if client else None

    def _objective_ms(self, cls: str) -> float | None:
        """The class's first-token objective, else the gate's TTFT SLO: what "met" is judged by."""
        return self.gate.config.objective_ms(cls)

    @property
    def queued_s(self) -> float | None:
        """Every wait in the gate's queues, whatever the outcome; None if never offered."""
        if self.ticket is None:
            return self.waited_s
        return (self.waited_s or 0.0) + self.ticket.queued_s

    def _gate_headers(self) -> list[tuple[bytes, bytes]]:
        # the caller an intake refusal carries too, as the journal row reads it (conclude)
        caller = self.intake.caller if self.intake is not None else self.caller
        cls = caller.cls if caller is not None else ""
        queue_ms = (self.queued_s or 0.0) * 1000
        headers = [(b"x-request-id", self.request_id.encode())]
        if cls:  # refused before its class was known (an unknown class, a body not JSON): none to name
            headers.append((b"x-tokengate-class", cls.encode()))
        headers.append((b"x-tokengate-queue-ms", f"{queue_ms:.1f}".encode()))
        if self.model_name is not None:
            headers.append((b"x-tokengate-model", self.model_name.encode()))
        return headers

    async def _start(self, status: int, headers: list[tuple[bytes, bytes]], *, relayed: bool) -> None:
        """The answer's status and headers; `relayed`: llama-server's answer (its CORS headers as
        they are), else the gate's own (gate/http/cors.py)."""
        self.started = True
        if relayed:
            mark_relayed(self.scope)
        await self._send({"type": "http.response.start", "status": status, "headers": headers + self._gate_headers()})

    async def _body(self, data: bytes) -> None:
        await self._send({"type": "http.response.body", "body": data, "more_body": True})

    async def _last(self, data: bytes) -> None:
        """The response's last bytes, sent only once its decision row is committed (DESIGN.md 5)
        and its shared lease is released (bounded by [shared] wait_ms)."""
        await self.gate.recorder.committed(self.committed)
        if self.shared_done is not None and self.gate.shared is not None:  # the tenant's tokens back in the fleet's count
            await self.gate.shared.landed(self.shared_done)
        await self._send({"type": "http.response.body", "body": data, "more_body": False})

    async def _send(self, message: dict[str, Any]) -> None:
        await send_within(self.send, message, self.gate.config.gate.write_stall_s)

    async def _failed(self, err: GateError) -> None:
        """Answer `err` (a status and body, or an SSE error event once streaming) and record it."""
        if self.started:
            # The status line is out: the client got 200, and the journal says so.
            self.conclude(err.outcome, err.reason, 200, _detail(err))
            if err.reason is Reason.CLIENT_STALLED:
                await abort(self.scope)  # it reads nothing: drop the connection and its unsent bytes
                return
            if self.intake is not None and self.intake.stream:
                await self._guarded_end(self._error_event(err))
            return
        status, headers, body = render(err, error_shape(self.scope["path"]))
        self.conclude(err.outcome, err.reason, status, _detail(err))
        await self._guarded_start(status, headers, body, relayed=err.body is not None)

    def _error_event(self, err: GateError) -> bytes:
        """The gate's own error in the stream's format: the API's typed error event, or an OpenAI
        ``data: {"error": ...}`` one."""
        if self.events is not None:
            return self.events.error_event(err)
        return b"data: " + json.dumps(error_object(err)).encode() + b"\n\n"

    async def _guarded_start(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes, *, relayed: bool) -> None:
        try:
            await self._start(status, [*headers, _length(body)], relayed=relayed)
            await self._last(body)
        except GateError:  # the client stalled while hearing its error: nothing more to tell it
            await abort(self.scope)

    async def _guarded_end(self, event: bytes) -> None:
        try:
            await self._body(event)
            await self._last(b"")
        except GateError:
            await abort(self.scope)

    async def _server_cancelled(self) -> bool:
        """The server cancels this request (shutdown past its grace): answer, record what was answered.

        Returns True when the client got a complete answer (503, or the stream's end).
        Left to the server, an unanswered request becomes uvicorn's bare 500 while the
        journal said 499; now both say 503 shutting_down (or 200 and a cut stream, its error event
        shutting_down).
        """
        if self.concluded:
            return False
        err = GateError(Reason.SHUTTING_DOWN, "the gate shut down before this request finished", retry_after_s=1.0)
        try:
            async with asyncio.timeout(1.0):
                # journaled with the code and message the client gets (a trial grepped the journal
                # for the `shutting_down` its clients reported and found `server_cancelled`, no detail)
                if self.started:
                    self.conclude("cancelled", Reason.SHUTTING_DOWN.value, 200, err.message)
                    if self.intake is not None and self.intake.stream:
                        await self._body(self._error_event(err))
                    await self._last(b"")
                else:
                    status, headers, body = render(err, error_shape(self.scope["path"]))
                    self.conclude("cancelled", Reason.SHUTTING_DOWN.value, status, err.message)
                    await self._start(status, headers, relayed=False)
                    await self._last(body)
        except (TimeoutError, GateError, OSError):
            await abort(self.scope)
            return False
        return True

    # ---- the one ending --------------------------------------------------------

    def _refund(self, outcome: Outcome) -> tuple[int, int]:
        """(requests, tokens) the tenant's rate limits give back when the request ends."""
        intake, stats = self.intake, self.stats
        if not self.rate_charged or intake is None:
            return 0, 0
        if outcome == "refused":
            # Refused after the rate check: the tenant got nothing, so it pays nothing.
            return 1, self.rate_charged
        generated = intake.max_tokens
        if stats is not None and stats.completion_tokens is not None:
            generated = min(stats.completion_tokens, intake.max_tokens)
        return 0, intake.max_tokens - generated

    def _slot_hold_s(self, now: float) -> float:
        """How long a request cut short after dispatch may keep its llama-server slot: a stream
        lets go a moment after the gate closes it; a plain call only when llama-server notices,
        which while it decodes is when it has finished (a user's trial, 2026-12-05: a plain
        Messages call ran on 10 s after its client left, and the gate, which gave its slot back
        after 3 s, dispatched 4 chats onto 4 slots: llama-server deferred one). The hold ends as
        soon as llama-server shows the slot free; this is its bound: the rest of
        request_timeout_s (the reaper allows twice that)."""
        if not self._plain or self.stats is None:
            return _TAKE_BACK_S
        left = self.gate.config.gate.request_timeout_s - (now - self.stats.dispatched_at)
        return max(_TAKE_BACK_S, left)

    def conclude(self, outcome: Outcome, reason: str, status: int, detail: str = "") -> None:
        """Release, refund, count and record; the first call wins, later ones do nothing.
        `detail`: the gate's own message to the client (the journal's `detail`)."""
        if self.concluded:
            return
        self.concluded = True
        self._drop_early()  # a forward beside the count that nothing relays (none, on every path known)
        if self.budget_at is None and self.backend is not None and self.backend.gatekeeper is not None:
            # refused (at arrival or after a wait) or ended before admission: the budget and the
            # tokens in flight it was refused against (a trial's journal had neither for them)
            admission = self.backend.gatekeeper.admission
            self.budget_at, self.in_flight_at = admission.budget, admission.ledger.in_flight
        gate = self.gate
        now = gate.clock()
        stats = self.stats
        intake = self.intake
        refund_requests, refund_tokens = self._refund(outcome)
        # The shared lease ends with the local reservation: the tenant's tokens are in flight
        # until llama-server frees the slot, on this gate's ledger and the fleet's alike.
        end_lease = (
            None
            if self.shared_lease is None or gate.shared is None
            else functools.partial(gate.shared.release, self.shared_lease, refund_tokens=refund_tokens, refund_requests=refund_requests)
        )
        if self.ticket is not None and self.backend is not None and self.backend.gatekeeper is not None:
            if stats is not None and outcome != "admitted":
                # Cut short after dispatch: llama-server frees the slot a moment after
                # the stream closes. Releasing now would let the next request find every
                # slot busy and wait in llama-server's own queue.
                gate.release_when_slot_frees(self.backend, self.ticket, self._slot_hold_s(now), then=end_lease)
                end_lease = None
            else:
                self.backend.gatekeeper.release(self.ticket)
        if end_lease is not None:
            self.shared_done = end_lease()
        if self.rate_charged and intake is not None:
            gate.ratelimit.refund(intake.caller.tenant, refund_tokens, now, requests=refund_requests)
        reason = str(reason)
        caller = intake.caller if intake is not None else self.caller
        cls = caller.cls if caller is not None else ""
        queued_s = self.queued_s
        record = DecisionRecord(
            ts=self.wall0,
            request_id=self.request_id,
            tenant=caller.tenant if caller is not None else "",
            cls=cls,
            backend=self.backend.name if self.backend is not None else "",
            endpoint=self.scope["path"],
            stream=bool(intake.stream) if intake is not None else False,
            prompt_tokens=self.count.tokens if self.count is not None else None,
            token_count_source=self.count.source if self.count is not None else None,
            max_tokens=intake.max_tokens if intake is not None else None,
            reserved_tokens=self.ticket.request.cost if self.ticket is not None else 0,
            outcome=outcome,
            reason=reason,
            http_status=status,
            queue_ms=None if queued_s is None else queued_s * 1000,
            ttft_ms=None if stats is None or stats.ttft_s is None else stats.ttft_s * 1000,
            duration_ms=(now - self.t0) * 1000,
            completion_tokens=stats.generated if stats is not None else None,
            budget_at_decision=self.budget_at,
            in_flight_at_decision=self.in_flight_at,
            model=self.model_name or "",
            rerouted_from=self.rerouted_from or "",
            ttft_arrival_ms=None if stats is None or stats.first_token_at is None else (stats.first_token_at - self.t0) * 1000,
            detail=detail,
        )
        model = self.model_name or (intake.model if intake is not None else None)
        self.committed = gate.recorder.record(
            record,
            model=model,
            # the queue-wait histogram: what went through a queue, not a refusal at once (a
            # never-fits 400 was observed as a 0 s wait, refused, beside the queue's timeouts)
            queued_s=queued_s if self.queued else None,
            ttft_s=stats.ttft_s if stats else None,
            ttft_total_s=None if stats is None or stats.first_token_at is None else stats.first_token_at - self.t0,
            tpot_s=stats.tpot_s if stats is not None else None,
            objective_ms=self._objective_ms(cls),
        )


def json_answer(answer: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> Response:
    """The gate's own JSON answer (/health, the merged model list, a router's model operation),
    framed and spelled as llama-server's own: `Content-Type: application/json; charset=utf-8`
    and `Content-Length`, where Starlette's JSONResponse wrote `content-type: application/json`
    (a trial's header comparison)."""
    body = json.dumps(answer, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()
    response = Response(body, status_code=status)
    extra = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()]
    response.raw_headers = [(b"Content-Type", _JSON), _length(body), *extra]
    return response


def _length(body: bytes) -> tuple[bytes, bytes]:
    """The Content-Length of an answer written whole, as llama-server frames its own: without it the
    server chunks the body, which an HTTP/1.0 client (ApacheBench, `curl --http1.0`) cannot read."""
    return (b"Content-Length", str(len(body)).encode())  # spelled as llama-server does


def _detail(err: GateError) -> str:
    """The journal's `detail` of `err`: the gate's own message. A backend's error body relayed
    as is is the backend's to say, and not kept (its message may quote the request): only its
    status and its error `type`, a word of llama-server's vocabulary, so a row says whose
    mistake it was ("backend answered 400 (invalid_request_error)"; it was empty: a trial read
    callers' typos as backend faults)."""
    if err.body is None:
        return err.message
    kind = ""
    with contextlib.suppress(ValueError, UnicodeDecodeError):
        answer = json.loads(err.body)
        found = answer.get("error") if isinstance(answer, dict) else None
        found = found.get("type") if isinstance(found, dict) else None
        if isinstance(found, str) and _ERROR_TYPE.fullmatch(found):
            kind = f" ({found})"
    return err.message + kind


_ERROR_TYPE = re.compile(r"[a-z][a-z0-9_]{0,63}")


_CLOSING: set[asyncio.Future[Any]] = set()  # the loop keeps only weak references to tasks


def _close_answer(task: asyncio.Future[Any]) -> None:
    """A dropped forward's end: its answer, if one came, is closed; its failure is nobody's news."""
    if task.cancelled() or task.exception() is not None:
        return
    closing = asyncio.ensure_future(task.result().aclose())
    _CLOSING.add(closing)
    closing.add_done_callback(_CLOSING.discard)
