"""The admitted request path: intake, count, admit or wait, relay, release, record.

A raw ASGI endpoint rather than a Starlette Response, because one task must own
the whole life of a request: it watches for the client leaving while the
request waits in a queue, while llama-server prefills and while tokens stream,
and its `finally` releases the reservation exactly once and writes the record.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import os
import re
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from starlette.types import Receive, Scope, Send

from gate.assembly import assemble, plain_body, stream_loses
from gate.backends import Backend
from gate.gatekeeper import Refused, Ticket
from gate.intake import Intake, IntakeError, check_size, parse_request
from gate.ledger import Request
from gate.reasons import Reason, error_body
from gate.records import DecisionRecord, Outcome
from gate.tokens import TokenCount
from gate.upstream import RelayStats, SseRelay, UpstreamFailure, forward_headers, upstream_body

if TYPE_CHECKING:
    from gate.service import GateService

_REQUEST_ID_RE = re.compile(r"[A-Za-z0-9._:-]{1,64}")
CLIENT_CLOSED = 499  # nginx's convention for "client closed the request"


class ClientGone(Exception):
    """The client disconnected before the answer was complete."""


class _Shed(Exception):
    pass


class AdmittedEndpoint:
    """ASGI app for /v1/chat/completions, /v1/completions and /completion."""

    def __init__(self, gate: GateService) -> None:
        self.gate = gate
        self.new_id = RequestIds()
        self.header_name = HeaderNames()

    def __call__(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        # Returns the flow's coroutine rather than awaiting it: one coroutine frame
        # less for each of the thousands of requests a queue may hold.
        return _Flow(self.gate, scope, receive, send, self.new_id, self.header_name).run()


class RequestIds:
    """Request ids shaped like uuid4().hex: a random per-process prefix and a counter.

    Unique within the process by construction, across processes by 64 random bits;
    os.urandom per request was a syscall and ~5% of a refused request's CPU.
    """

    def __init__(self) -> None:
        self._prefix = os.urandom(8).hex()
        self._next = itertools.count(1).__next__

    def __call__(self) -> str:
        return f"{self._prefix}{self._next():016x}"


class HeaderNames:
    """Decoded header names, one shared str per distinct name instead of one per request."""

    def __init__(self, limit: int = 512) -> None:
        self._known: dict[bytes, str] = {}
        self._limit = limit  # clients choose names: the table must not grow without bound

    def __call__(self, raw: bytes) -> str:
        name = self._known.get(raw)
        if name is None:
            name = raw.decode("latin-1").lower()
            if len(self._known) < self._limit:
                self._known[raw] = name
        return name


class _Flow:
    """One request's journey; every exit path goes through `conclude` exactly once."""

    # Thousands may wait in a queue at once: no per-request __dict__.
    __slots__ = (
        "gate", "scope", "receive", "send", "headers", "request_id", "t0", "wall0", "intake", "backend",
        "count", "ticket", "stats", "rate_charged", "started", "concluded", "committed", "budget_at",
        "in_flight_at", "_task", "_gone",
    )

    def __init__(
        self, gate: GateService, scope: Scope, receive: Receive, send: Send,
        new_id: Callable[[], str], header_name: Callable[[bytes], str],
    ) -> None:
        self.gate = gate
        self.scope = scope
        self.receive = receive
        self.send = send
        self.headers = {header_name(k): v.decode("latin-1") for k, v in scope["headers"]}
        given = self.headers.get("x-request-id", "")
        self.request_id = given if _REQUEST_ID_RE.fullmatch(given) else new_id()
        self.t0 = gate.clock()
        self.wall0 = time.time()
        self.intake: Intake | None = None
        self.backend: Backend | None = None
        self.count: TokenCount | None = None
        self.ticket: Ticket | None = None
        self.stats: RelayStats | None = None
        self.rate_charged = 0
        self.started = False  # response headers sent
        self.concluded = False
        self.committed: asyncio.Future[bool] | None = None  # the decision row's commit
        self.budget_at: int | None = None
        self.in_flight_at: int | None = None
        self._task: asyncio.Task[Any] | None = None  # this request's task, while `_race` runs its work
        self._gone = False

    # ---- the path ------------------------------------------------------------

    async def run(self) -> None:
        try:
            raw = await self._read_body()
            if self.gate.shutting_down:
                raise _Refusal(Reason.SHUTTING_DOWN, "the gate is shutting down; retry against another instance", 1.0)
            self.intake = parse_request(
                self.scope["path"], raw, self.headers, self._client_host(), self.gate.config, self.gate.tenants
            )
            await self._race(self._serve())
        except IntakeError as exc:
            await self._error(exc.reason, exc.message, param=exc.param)
        except _Refusal as r:
            await self._error(r.reason, r.message, retry_after_s=r.retry_after_s)
        except Refused as exc:
            refusal = exc.refusal
            await self._error(refusal.reason, refusal.detail, retry_after_s=refusal.retry_after_s)
        except UpstreamFailure as exc:
            await self._upstream_failed(exc)
        except ClientGone:
            self.conclude("cancelled", "client_disconnect", CLIENT_CLOSED)
        except asyncio.CancelledError:
            self.conclude("cancelled", "server_cancelled", CLIENT_CLOSED)
            raise
        except Exception:
            self.gate.log.exception("request %s failed inside the gate", self.request_id)
            if not self.started:
                await self._error(Reason.UPSTREAM_ERROR, "internal error in the gate; the request was not completed")
            else:
                self.conclude("failed", Reason.UPSTREAM_ERROR, 200)
        finally:
            if not self.concluded:
                self.conclude("failed", Reason.UPSTREAM_ERROR, 500)

    async def _serve(self) -> None:
        intake = self.intake
        assert intake is not None
        backend = self.gate.backends.route(intake.model)
        if backend is None:
            raise IntakeError(Reason.MODEL_NOT_FOUND, f"model {intake.model!r} is not served by this gate", "model")
        self.backend = backend
        if backend.state != "ready" or backend.gatekeeper is None:
            raise _Refusal(Reason.NO_BACKEND, f"backend {backend.name!r} is {backend.state}: {backend.detail}", 5.0)
        self.count = await self.gate.tokens.count(backend.url, intake.kind, intake.body, backend.auth_headers())
        cost = self.count.tokens + intake.max_tokens
        self._rate_check(intake.caller.tenant, cost)
        # Arrival is now: queue time is time spent waiting for admission, not counting tokens.
        request = Request(self.request_id, intake.caller.cls, intake.caller.tenant, self.count.tokens, intake.max_tokens, self.gate.clock())
        gatekeeper = backend.gatekeeper
        self.ticket = await gatekeeper.acquire(request)
        admission = gatekeeper.admission
        self.budget_at, self.in_flight_at = admission.budget, admission.ledger.in_flight
        expected = backend.durations.expected_s(self.count.tokens, intake.max_tokens)
        self.ticket.expected_s = expected if expected is not None else self.gate.config.gate.request_timeout_s
        await self._relay(backend, intake, expected)

    def _rate_check(self, tenant: str, cost: int) -> None:
        verdict = self.gate.ratelimit.check(tenant, cost, self.gate.clock())
        if verdict.never:
            raise _Refusal(Reason.TENANT_QUOTA, f"request needs {cost} tokens, more than tenant {tenant!r} may use per minute", None)
        if not verdict.allowed:
            raise _Refusal(Reason.RATE_LIMITED, f"tenant {tenant!r} is over its {verdict.limit}-per-minute limit", verdict.wait_s)
        self.rate_charged = cost

    # ---- relaying ------------------------------------------------------------

    async def _relay(self, backend: Backend, intake: Intake, expected_s: float | None) -> None:
        ticket = self.ticket
        assert ticket is not None and backend.gatekeeper is not None
        gate = self.gate
        loop = asyncio.get_running_loop()
        now = gate.clock()
        self.stats = stats = RelayStats(dispatched_at=now)
        timeout_at = loop.time() + gate.config.gate.request_timeout_s
        shed_at = None if expected_s is None else loop.time() + gate.config.gate.shed_factor * expected_s
        deadline = timeout_at if shed_at is None else min(timeout_at, shed_at)
        headers = forward_headers(self.headers, backend.auth_token)
        # The few options whose answer llama-server's stream lacks get a plain call (no fast cancel).
        plain = not intake.stream and stream_loses(intake.kind, intake.body)
        body = plain_body(intake.body) if plain else upstream_body(intake.kind, intake.body)
        try:
            async with asyncio.timeout_at(deadline):
                response = await backend.upstream.open(intake.path, body, headers)
        except TimeoutError:
            raise self._overrun(loop, shed_at) from None
        relay = SseRelay(
            response, stats, gate.clock, lambda: backend.gatekeeper.first_token(ticket),
            keep_usage_chunk=intake.include_usage, collect=not intake.stream,
        )
        try:
            if plain:
                await self._relay_plain(relay, loop, deadline, shed_at)
            elif intake.stream:
                await self._relay_stream(relay, loop, deadline, shed_at)
            else:
                await self._relay_collect(relay, intake, loop, deadline, shed_at)
        finally:
            await response.aclose()  # frees the llama-server slot on every path

    async def _relay_stream(self, relay: SseRelay, loop, deadline: float, shed_at: float | None) -> None:
        await self._start(200, "text/event-stream", {"cache-control": "no-cache"})
        reads = relay.reads().__aiter__()
        final = ""  # the terminal event ([DONE], or /completion's stop chunk) and anything after it
        try:
            while True:
                try:
                    async with asyncio.timeout_at(deadline):
                        now, held = await anext(reads)
                except StopAsyncIteration:
                    break
                # The terminal event waits for the decision row's commit, so a client
                # never sees the end of a request the journal could still lose.
                final += held
                if now:
                    await self._body(now.encode())
        except TimeoutError:
            await relay.response.aclose()  # stop llama-server first, then tell the client
            await self._sse_error(self._overrun(loop, shed_at))
            return
        except UpstreamFailure as exc:
            await relay.response.aclose()
            await self._sse_error(exc)
            return
        if relay.error is not None or not relay.stats.finished:
            self.conclude("failed", Reason.UPSTREAM_ERROR, 200)
        else:
            self._finish_ok()
        await self._last(final.encode())

    async def _relay_collect(self, relay: SseRelay, intake: Intake, loop, deadline: float, shed_at: float | None) -> None:
        try:
            async with asyncio.timeout_at(deadline):
                async for _ in relay.reads():
                    pass
        except TimeoutError:
            raise self._overrun(loop, shed_at) from None
        if relay.error is not None:
            message = str(relay.error.get("message") or "backend reported an error mid-answer")
            raise UpstreamFailure(Reason.UPSTREAM_ERROR, message)
        if not relay.stats.finished or not relay.chunks:
            raise UpstreamFailure(Reason.UPSTREAM_ERROR, "backend closed the stream before finishing")
        payload = json.dumps(assemble(intake.kind, relay.chunks)).encode()
        self._finish_ok()
        await self._start(200, "application/json", {})
        await self._last(payload)

    async def _relay_plain(self, relay: SseRelay, loop, deadline: float, shed_at: float | None) -> None:
        try:
            async with asyncio.timeout_at(deadline):
                payload = await relay.whole()
        except TimeoutError:
            raise self._overrun(loop, shed_at) from None
        self._finish_ok()
        await self._start(200, "application/json", {})
        await self._last(payload)  # llama-server's own answer, byte for byte

    def _overrun(self, loop, shed_at: float | None) -> UpstreamFailure:
        if shed_at is not None and loop.time() >= shed_at:
            return UpstreamFailure(Reason.SHED_OVERRUN, "request ran past shed_factor x its expected duration and was aborted")
        return UpstreamFailure(Reason.UPSTREAM_TIMEOUT, f"no complete answer within request_timeout_s={self.gate.config.gate.request_timeout_s:g}")

    def _finish_ok(self) -> None:
        if self.backend is not None and self.stats is not None and self.intake is not None:
            self.gate.observe_success(self.backend, self.intake.caller.cls, self.stats)
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
            if self._gone and me.uncancel() == 0:
                raise ClientGone from None
            raise  # the server is cancelling this request (shutdown)
        finally:
            self._task = None
            watcher.cancel()

    def _client_left(self, watcher: asyncio.Future[None]) -> None:
        # Only while the work runs: a cancel requested after it returned would land
        # on whatever this task awaits next.
        task = self._task
        if task is not None and not watcher.cancelled() and watcher.exception() is None:
            self._gone = True
            task.cancel()

    async def _disconnected(self) -> None:
        while (await self.receive())["type"] != "http.disconnect":
            pass

    async def _read_body(self) -> bytes:
        limit = self.gate.config.gate.max_body_bytes
        declared = self.headers.get("content-length")
        if declared is not None and declared.isdigit():
            check_size(int(declared), limit)
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                raise ClientGone
            chunk = message.get("body", b"")
            size += len(chunk)
            check_size(size, limit)
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    def _client_host(self) -> str | None:
        client = self.scope.get("client")
        return client[0] if client else None

    def _gate_headers(self) -> list[tuple[bytes, bytes]]:
        cls = self.intake.caller.cls if self.intake is not None else ""
        queue_ms = 0.0 if self.ticket is None else self.ticket.queued_s * 1000
        return [
            (b"x-request-id", self.request_id.encode()),
            (b"x-tokengate-class", cls.encode()),
            (b"x-tokengate-queue-ms", f"{queue_ms:.1f}".encode()),
        ]

    async def _start(self, status: int, content_type: str, extra: dict[str, str]) -> None:
        headers = [(b"content-type", content_type.encode()), *self._gate_headers()]
        headers += [(k.encode(), v.encode()) for k, v in extra.items()]
        self.started = True
        await self.send({"type": "http.response.start", "status": status, "headers": headers})

    async def _body(self, data: bytes) -> None:
        await self.send({"type": "http.response.body", "body": data, "more_body": True})

    async def _last(self, data: bytes) -> None:
        """The response's last bytes, sent only once its decision row is committed (DESIGN.md 5)."""
        await self.gate.committed(self.committed)
        await self.send({"type": "http.response.body", "body": data, "more_body": False})

    async def _end(self) -> None:
        await self._last(b"")

    async def _error(self, reason: Reason, message: str, *, param: str | None = None, retry_after_s: float | None = None, status: int | None = None, raw: bytes | None = None) -> None:
        status = status or reason.status
        outcome: Outcome = "refused" if status < 500 or reason in _REFUSALS_5XX else "failed"
        if reason is Reason.SHED_OVERRUN:
            outcome = "shed"
        self.conclude(outcome, reason, status)
        extra: dict[str, str] = {}
        if retry_after_s is not None:
            extra["retry-after"] = str(max(1, math.ceil(retry_after_s)))
            extra["retry-after-ms"] = str(int(retry_after_s * 1000))
        payload = raw if raw is not None else json.dumps(error_body(reason, message, param=param, retry_after_s=retry_after_s, status=status)).encode()
        await self._start(status, "application/json", extra)
        await self._last(payload)

    async def _upstream_failed(self, exc: UpstreamFailure) -> None:
        if self.started:
            self.conclude("shed" if exc.reason is Reason.SHED_OVERRUN else "failed", exc.reason, 200)
            return
        await self._error(exc.reason, exc.message, status=exc.status, raw=exc.body)

    async def _sse_error(self, exc: UpstreamFailure) -> None:
        outcome: Outcome = "shed" if exc.reason is Reason.SHED_OVERRUN else "failed"
        self.conclude(outcome, exc.reason, 200)
        event = error_body(exc.reason, exc.message)
        await self._body(b"data: " + json.dumps(event).encode() + b"\n\n")
        await self._end()

    # ---- the one ending --------------------------------------------------------

    def conclude(self, outcome: Outcome, reason: str, status: int) -> None:
        """Release, refund, count and record; the first call wins, later ones do nothing."""
        if self.concluded:
            return
        self.concluded = True
        gate = self.gate
        now = gate.clock()
        stats = self.stats
        intake = self.intake
        if self.ticket is not None and self.backend is not None and self.backend.gatekeeper is not None:
            if stats is not None and outcome != "admitted":
                # Cut short after dispatch: llama-server frees the slot a moment after
                # the stream closes. Releasing now would let the next request find every
                # slot busy and wait in llama-server's own queue.
                gate.release_when_slot_frees(self.backend, self.ticket)
            else:
                self.backend.gatekeeper.release(self.ticket)
        if self.rate_charged and intake is not None:
            if outcome == "refused":
                # Refused after the rate check: the tenant got nothing, so it pays nothing.
                gate.ratelimit.refund(intake.caller.tenant, self.rate_charged, now, requests=1)
            else:
                generated = intake.max_tokens
                if stats is not None and stats.completion_tokens is not None:
                    generated = min(stats.completion_tokens, intake.max_tokens)
                gate.ratelimit.refund(intake.caller.tenant, intake.max_tokens - generated, now)
        reason = str(reason)
        cls = intake.caller.cls if intake is not None else ""
        queued_s = self.ticket.queued_s if self.ticket is not None else None
        record = DecisionRecord(
            ts=self.wall0,
            request_id=self.request_id,
            tenant=intake.caller.tenant if intake is not None else "",
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
            completion_tokens=stats.completion_tokens if stats is not None else None,
            budget_at_decision=self.budget_at,
            in_flight_at_decision=self.in_flight_at,
        )
        self.committed = gate.record(
            record, model=intake.model if intake is not None else None, queued_s=queued_s, ttft_s=stats.ttft_s if stats else None
        )


_REFUSALS_5XX = frozenset({Reason.CLASS_PAUSED, Reason.DRAINED, Reason.NO_BACKEND, Reason.SHUTTING_DOWN})


class _Refusal(Exception):
    """A refusal decided by the shell (rate limits, readiness, shutdown), not the core."""

    def __init__(self, reason: Reason, message: str, retry_after_s: float | None) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.retry_after_s = retry_after_s
