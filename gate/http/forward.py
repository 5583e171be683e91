"""Every route the gate does not admit: authenticated, relayed as llama-server answers, recorded.

What a route is comes from the table (gate/data/endpoints.py). For each request here:

1. The route: the table's, a CORS preflight (``OPTIONS``, any path), or none: then
   ``[gate] unknown_routes`` forwards it (label ``other``) or answers 404. A path that names a
   listed one but for extra slashes (``/v1/chat/completions/``) is always the gate's 404.
2. The caller, with tenants configured: a tenant key, as on the admitted routes (401 otherwise).
   A preflight carries no credential (browsers never send one) and changes nothing: it goes
   through without one, as llama-server itself lets it.
3. Operator-only routes (they change the server): open mode and ``operator = true`` tenants
   only, each call an audit row (source ``api``); anyone else gets 403 ``operator_only``
   naming the route.
4. The relay: method, path, query and body as sent; the client's end-to-end headers (never its
   credentials: the backend's own key goes instead); the answer streamed back byte for byte with
   llama-server's status and headers (CORS, content type and encoding, its own), hop-by-hop
   headers excepted. Server-sent events (``/models/sse``, ``/v1/stream``) stream as they come.
   The backend: the one serving ``?model=`` when given, else the one serving the model the JSON
   body names (several backends: POST /tokenize of the second's model), else the first; in router mode a model
   no unit serves goes to the router (the only one; none with several) with ``autoload=false``,
   as every forwarded call to a router model does, so nothing loads behind the gate's back.
5. The record: ``tokengate_forwarded_total{route, status}`` and a decision row, outcome
   ``forwarded`` (reason ``ok``, no class, no reservation), when the answer ends; a refusal is
   a decision row ``refused`` with its reason, as on the admitted path. Unlike an admitted
   answer, a forwarded one does not wait for its row's commit (nothing was reserved, and a
   web UI's assets would each pay the group commit): a crash can lose the last rows.

Errors the gate raises are its own (``GateError``), rendered by the one renderer; a backend that
cannot be reached is a 503 that never names its address.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import anyio
import httpx
from starlette.datastructures import Headers
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse

from gate.backend.upstream import (
    RETRY_DOWN_S,
    forward_headers,
    is_redirect,
    json_object,
    on_the_wire,
    raw_headers,
    redirect_error,
    relayed_headers,
)
from gate.core.errors import GateError
from gate.core.reasons import CLIENT_DISCONNECT, Outcome, Reason
from gate.data.commands import Operator
from gate.data.endpoints import OTHER_ROUTE, PREFLIGHT, Route, known_path, lookup
from gate.data.records import DecisionRecord
from gate.http import model_routes
from gate.http.cors import mark_relayed
from gate.http.intake import check_headers
from gate.http.proxy import CLIENT_CLOSED, json_answer
from gate.http.requestids import RequestIds

#: forwarded paths llama-server answers without its --api-key (its /health is the gate's own)
KEYLESS_PATHS = frozenset({"/v1/health"})

if TYPE_CHECKING:
    from gate.backend.pool import Backend, BackendPool
    from gate.http.ports import RequestPorts
    from gate.http.tenants import Caller

_ENDPOINT_MAX = 128  # the journal's endpoint of a path the table does not list: cut, printable


def shown_path(path: str) -> str:
    """A client's path as the journal keeps it: printable, at most 128 characters."""
    clean = "".join(ch if ch.isprintable() else "?" for ch in path[:_ENDPOINT_MAX])
    return clean + ("..." if len(path) > _ENDPOINT_MAX else "")


def _only_router(backends: BackendPool) -> Backend | None:
    """Where a forwarded call naming a model no unit serves goes: the one router, which may hold
    models the gate does not list (``DELETE /models`` of one: the router's answer, as it gives
    it); none with no router or several (which one holds it is not known)."""
    routers = [b for b in backends.configured if b.fleet is not None]
    return routers[0] if len(routers) == 1 else None


async def _body_model(request: Request, backends: BackendPool) -> str | None:
    """The `model` a forwarded call's JSON body names (POST /tokenize, /detokenize,
    /apply-template ... with several backends), where it can choose among several: with
    one plain backend it chooses nothing and the body is not parsed. A body that is not a
    JSON object, or names no model, names none; a model no backend serves goes where a call
    naming none goes, as llama-server, which ignores it there, would answer it."""
    if len(backends.configured) == 1 and backends.configured[0].fleet is None:
        return None
    check_headers(request.headers)
    body = await request.body()  # through the BodyReader: limited before reading; _open reads it again from the cache
    parsed = json_object(body) if body.lstrip().startswith(b"{") else None
    model = parsed.get("model") if parsed is not None else None
    return model if isinstance(model, str) and model else None


class ForwardEndpoint:
    """The Starlette endpoint for everything not admitted and not the gate's own."""

    def __init__(self, gate: RequestPorts) -> None:
        self.gate = gate
        self.new_id = RequestIds()

    async def handle(self, request: Request) -> Response:
        gate = self.gate
        given = request.headers.get("x-request-id", "")
        request_id = given if 0 < len(given) <= 64 and given.isascii() and given.isprintable() else self.new_id()
        request.state.request_id = request_id  # the gate's refusal names it too (server.py gate_error)
        t0, wall0 = gate.clock(), time.time()
        route, caller, backend = None, None, None
        try:
            route = self._route(request)
            caller = self._caller(request, route)
            if model_routes.handled_here(route.name, gate.backends):
                # Router mode's load and unload: the gate's own model operations; a refusal is
                # journaled once, below, with the unit it named (a trial found two rows each)
                backend = model_routes.model_unit(gate.backends, await request.body())
                self._require_operator(route, caller)
                answer = model_routes.apply(backend, route.name)
                # audited once done: a refused load read in the audit as one that happened (a trial)
                self._audit_call(request, route, caller, backend)
                gate.metrics.forwarded(route.name, 200)
                self._record(request, request_id, route.name, caller, backend, "forwarded", "ok", 200, t0, wall0)
                return json_answer(answer, headers={"x-request-id": request_id})
            model = request.query_params.get("model")
            if model is not None:
                backend = gate.backends.route(model) or _only_router(gate.backends)
            else:
                named = await _body_model(request, gate.backends)
                # No model named: the first backend, a router itself (its own GET /props, with
                # "role": "router"; a POST /tokenize gets its 400 "model name is missing"), never
                # its first model behind its back (a trial read tiny's props at /props).
                backend = (
                    gate.backends.configured[0]
                    if named is None
                    else gate.backends.route(named) or gate.backends.route(None) or gate.backends.configured[0]
                )
            if backend is None:
                raise GateError(Reason.MODEL_NOT_FOUND, "no backend serves that model", "model")
            if route.access == "operator":
                self._require_operator(route, caller)
                self._audit_call(request, route, caller, backend)
            upstream = await self._open(request, backend, credential=route is not PREFLIGHT)
        except GateError as err:
            label = route.name if route is not None else OTHER_ROUTE
            self._record(request, request_id, label, caller, backend, err.outcome, err.reason.value, err.status, t0, wall0)
            raise
        except ClientDisconnect:
            # Gone before its body was in: nobody reads an answer (uvicorn logged each as an
            # "Exception in ASGI application" with a 45-line traceback, at a caller's will).
            label = route.name if route is not None else OTHER_ROUTE
            self._record(request, request_id, label, caller, backend, "cancelled", CLIENT_DISCONNECT, CLIENT_CLOSED, t0, wall0)
            return Response(status_code=CLIENT_CLOSED)
        label = route.name if route is not None else OTHER_ROUTE
        headers = relayed_headers(upstream.headers) + [(b"x-request-id", request_id.encode())]

        async def body() -> AsyncIterator[bytes]:
            outcome: Outcome = "forwarded"
            try:
                async for chunk in upstream.aiter_raw():
                    yield chunk
            except httpx.HTTPError as exc:
                # The status line is out: all the gate can do is end the answer early.
                gate.log.warning("forwarded %s %s: backend broke off: %s", request.method, label, type(exc).__name__)
                outcome = "failed"
            finally:
                # Recorded first: when the client leaves, Starlette cancels this scope, and every
                # await in it (the close below) is cancelled again unless shielded.
                gate.metrics.forwarded(label, upstream.status_code)
                reason = "ok" if outcome == "forwarded" else Reason.UPSTREAM_ERROR.value
                self._record(request, request_id, label, caller, backend, outcome, reason, upstream.status_code, t0, wall0)
                with anyio.CancelScope(shield=True):
                    await upstream.aclose()  # frees llama-server's connection (an SSE stream ends there)

        response = StreamingResponse(body(), status_code=upstream.status_code)
        response.raw_headers = headers  # as llama-server sent them (its content-length included)
        mark_relayed(request.scope)  # its CORS headers too, as they are (gate/http/cors.py)
        return response

    # ---- the steps --------------------------------------------------------------------

    def _route(self, request: Request) -> Route:
        method, path = request.method, request.url.path
        if any(part in (".", "..") for part in path.split("/")):
            # httpx resolves dot segments when it builds the backend's URL ("/x/../props" is sent
            # as "/props", "%2e%2e" too, once decoded): the route checked here would not be the one
            # llama-server runs (a generation never admitted, an operator-only call by a tenant).
            # llama-server has no route with such a segment: its 404, as it would answer (not a 400).
            raise GateError(
                Reason.INVALID_REQUEST, f"{method} {shown_path(path)}: a path with '.' or '..' segments is not forwarded", status=404
            )
        if method == "OPTIONS":
            return PREFLIGHT
        route = lookup("GET" if method == "HEAD" else method, path)
        if route is not None:
            return route
        normal = "/" + "/".join(part for part in path.split("/") if part)
        if normal != path and known_path(normal):
            # "/v1/chat/completions/" is not llama-server's route, but a server that normalized
            # it would run a generation the gate never admitted: the gate's own 404, never forwarded.
            raise GateError(Reason.INVALID_REQUEST, f"{method} {shown_path(path)} is not a route; did you mean {normal}?", status=404)
        if self.gate.config.gate.unknown_routes == "refuse":
            raise GateError(
                Reason.INVALID_REQUEST,
                f"{method} {shown_path(path)} is not a llama-server route; this gate refuses unknown routes "
                '([gate] unknown_routes = "refuse")',
                status=404,
            )
        return Route(method, OTHER_ROUTE, "forwarded")

    def _caller(self, request: Request, route: Route) -> Caller | None:
        tenants = self.gate.tenants
        if route is PREFLIGHT:
            return None
        if tenants.open and route.path in KEYLESS_PATHS:
            # llama-server answers its health without a key: so does an open gate before a keyed
            # one (a load balancer's check of /v1/health must not turn 401)
            return None
        client = request.client
        return tenants.identify(Headers(raw=request.scope["headers"]), client.host if client else None, None)

    def _require_operator(self, route: Route, caller: Caller | None) -> None:
        """403 for a tenant that is not an operator."""
        if not self.gate.tenants.is_operator(caller):
            who = caller.tenant if caller is not None else "this caller"
            raise GateError(
                Reason.OPERATOR_ONLY,
                f"{route.name} changes llama-server: only operators may call it (tenant {who!r} is not one)",
            )

    def _audit_call(self, request: Request, route: Route, caller: Caller | None, backend: Backend) -> None:
        """An operator route's audit row: before a forwarded call, once done for a model operation."""
        gate = self.gate
        client = request.client
        query = request.url.query
        gate.recorder.audit_event(
            route.name,
            f"backend:{backend.name}",
            f"{request.method} {shown_path(request.url.path)}" + (f"?{query[:200]}" if query else "") + " through the gate",
            operator=Operator(caller.tenant if caller is not None else "open", client.host if client else "local"),
            source="api",
        )

    async def _open(self, request: Request, backend: Backend, *, credential: bool = True) -> httpx.Response:
        """The backend's answer; `credential`: send the gate's own key (never for a preflight, which
        came without a tenant's key and which llama-server answers without one)."""
        content_type = request.headers.get("content-type")
        check_headers(request.headers)
        body = await request.body()  # through the BodyReader: limited before reading
        params: list[tuple[str, str | int | float | bool | None]] = list(request.query_params.multi_items())
        if backend.model is not None or (backend.fleet is not None and any(k == "model" for k, _ in params)):
            # Router mode: llama-server must not load a model for a forwarded call either.
            params = [(k, v) for k, v in params if k != "autoload"] + [("autoload", "false")]
            if backend.model is not None and not any(k == "model" for k, _ in params):
                params.append(("model", backend.model))
        headers = forward_headers(dict(request.headers), None)
        headers.pop("accept-encoding", None)
        headers.update(backend.auth_headers())
        if not credential:
            headers.pop("Authorization", None)
        if content_type is not None:
            headers["content-type"] = on_the_wire(content_type)
        limits = self.gate.config.gate
        client = backend.upstream.client
        upstream_request = client.build_request(
            request.method,
            backend.url + request.url.path,
            params=params,
            content=body or None,
            headers=raw_headers(headers),
            # Server-sent events (/models/sse, /v1/stream) may be quiet for long: the request's own limit.
            timeout=httpx.Timeout(30.0, read=limits.request_timeout_s),
        )
        try:
            response = await client.send(upstream_request, stream=True)
        except httpx.TimeoutException:
            raise GateError(Reason.UPSTREAM_TIMEOUT, f"backend {backend.name!r} did not answer", retry_after_s=RETRY_DOWN_S) from None
        except httpx.HTTPError as exc:
            self.gate.log.warning("backend %s at %s unreachable: %s: %s", backend.name, backend.url, type(exc).__name__, exc)
            raise GateError(Reason.NO_BACKEND, f"backend {backend.name!r} is unreachable", retry_after_s=RETRY_DOWN_S) from None
        if is_redirect(response.status_code) or response.status_code == 401:
            await response.aclose()
            raise redirect_error(response, f"{backend.name} at {backend.url}")
        return response

    def _record(
        self,
        request: Request,
        request_id: str,
        label: str,
        caller: Caller | None,
        backend: Backend | None,
        outcome: Outcome,
        reason: str,
        status: int,
        t0: float,
        wall0: float,
    ) -> None:
        gate = self.gate
        record = DecisionRecord(
            ts=wall0,
            request_id=request_id,
            tenant=caller.tenant if caller is not None else "",
            cls="",  # no class: nothing was admitted or queued
            backend=backend.name if backend is not None else "",
            endpoint=f"{request.method} {shown_path(request.url.path)}",
            stream=False,
            prompt_tokens=None,
            token_count_source=None,
            max_tokens=None,
            reserved_tokens=0,
            outcome=outcome,
            reason=reason,
            http_status=status,
            queue_ms=None,
            ttft_ms=None,
            duration_ms=(gate.clock() - t0) * 1000,
            completion_tokens=None,
            budget_at_decision=None,
            in_flight_at_decision=None,
            model=backend.model or "" if backend is not None else "",
        )
        gate.recorder.record(record, model=None, queued_s=None, ttft_s=None)
