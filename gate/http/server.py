"""The gate's HTTP surface: admitted routes, the merged model list, health, metrics, and
everything else forwarded (gate/http/forward.py, by the table in gate/data/endpoints.py).

Auth: with ``[[tenants]]`` configured, every route that reaches a backend needs a
tenant key (forwarded routes and ``GET /v1/models`` included); ``/health``, ``/metrics`` and
``/metrics/inference`` (the endpoint picker's three gauges alone) stay open for probes and
scrapers. Every route reads its body through
:class:`gate.clientguard.BodyReader` (size limit before reading, read deadline),
and every error is a :class:`gate.errors.GateError` rendered by one function.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from email.utils import formatdate
from typing import TYPE_CHECKING, Any

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gate.core.errors import GateError, render
from gate.core.reasons import Reason
from gate.fleet.sharedlimits import Known, gates_phrase
from gate.fleet.sharedlimits.causes import UNKNOWN
from gate.http.apis.dispatch import error_shape
from gate.http.clientguard import BodyReader, abort, guarded_protocol, send_within, too_large
from gate.http.cors import CorsMirror, mark_relayed
from gate.http.forward import ForwardEndpoint
from gate.http.intake import ENDPOINTS
from gate.http.proxy import AdmittedEndpoint, json_answer
from gate.observe.backend_metrics import START_HEADER, backend_series
from gate.observe.snapshots import ObjectiveGapsMemo

if TYPE_CHECKING:
    from gate.http.ports import RequestPorts

FORWARDED_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]

log = logging.getLogger("tokengate.server")


def build_app(gate: RequestPorts) -> ASGIApp:
    """The ASGI app for one gate service: admitted POSTs direct, the rest through Starlette."""
    admitted = AdmittedEndpoint(gate)
    objective_gaps = ObjectiveGapsMemo()  # /health's objective_below_ttft, once a second at most

    def authenticate(request: Request) -> bool:
        """With tenants configured, a valid key (sent once) or 401; open mode lets everyone in,
        unless a backend has a key: then that key, as llama-server asks for it here. True for
        an operator (open mode: every caller)."""
        if not gate.tenants.open:
            client = request.client
            return gate.tenants.is_operator(gate.tenants.identify(request.headers, client.host if client else None, None))
        gate.tenants.check_key(request.headers)
        return True

    async def health(request: Request) -> Response:
        # State only: a backend's detail may name its address, which is for the log and the console.
        backends: dict[str, dict[str, Any]] = {}
        for b in gate.backends:
            backends[b.name] = {"state": b.state, "slots": b.capacity.slots if b.capacity else None}
            if b.capacity is not None:
                backends[b.name]["ceiling"] = b.capacity.ceiling
            if b.layout is not None:
                backends[b.name]["kv"] = {"layout": b.layout.kv, "source": b.layout.source}
            adm = b.admission
            if adm is not None and adm.reserved_total:
                # the reservations in force, configured beside them (R0 scales them to a small
                # pool: a trial found the values in force only inside a warning's text)
                backends[b.name]["reserved"] = {
                    c: {"configured": adm.policy(c).reserved_tokens, "in_force": adm.reserved(c)}
                    for c in adm.class_names
                    if adm.policy(c).reserved_tokens
                }
            if b.warnings:  # what the capacity contradicts: loud where probes and people look
                backends[b.name]["warnings"] = list(b.warnings)
            bypassing = gate.bypass_slots().get(b.name)
            if bypassing:  # another gate or a client in front of the same llama-server (a trial: silent)
                backends[b.name]["bypassing_slots"] = bypassing
            if b.fleet is not None and b.model is not None:  # router mode: the model's own status
                backends[b.name]["model_status"] = b.fleet.info[b.model].status
        # Router mode: an up router is ready with nothing loaded (it loads on demand, or an operator
        # does), as llama-server's own /health says; "loaded" names what is loaded, per router.
        routers = {b.name: b.fleet for b in gate.backends.configured if b.fleet is not None}
        for name, fleet in routers.items():
            if not fleet.info:  # a router with no model listed in [[backends]] models: no units
                backends.setdefault(name, {"state": "ready" if fleet.router_up else "down", "slots": None})
        loaded = {name: sorted(m for m, i in f.info.items() if i.status == "loaded") for name, f in routers.items()}
        ready = (gate.backends.any_ready or any(f.router_up for f in routers.values())) and not gate.shutting_down
        status = "ok" if ready else ("shutting_down" if gate.shutting_down else "no_backend")
        answer: dict[str, Any] = {"status": status, "backends": backends}
        if loaded:
            answer["loaded"] = loaded
        # a class whose TTFT objective is below the first token llama-server delivers now: missed
        # by admitted requests whatever the queue does (the classes table said "13%", not why)
        gaps = objective_gaps(gate.config, gate.backends, gate.recorder)
        if gaps:
            answer["objective_below_ttft"] = gaps
        if gate.shared is not None:
            # the fleet's tenant limits: a trial's health check read "ok" while fail_closed
            # answered every limited tenant 429 (the console and /metrics said it, /health not)
            health = gate.shared.health
            answer["shared"] = shared_health(gate.shared.state, gate.shared.divisor, health.known, health.cause)
        return json_answer(answer, 200 if ready else 503)

    async def metrics(request: Request) -> Response:
        gate.refresh_metrics()
        body, content_type = gate.metrics.render()
        # then each backend's llamacpp:* series (gate/observe/backend_metrics.py)
        relayed, start = await backend_series(gate.backends.configured, list(gate.backends), gate.rate_windows)
        response = Response(body + relayed, media_type=content_type)
        response.raw_headers.append((START_HEADER.encode(), start.encode()))  # spelled as llama-server does
        return response

    async def inference_metrics(request: Request) -> Response:
        # The endpoint picker's three gauges alone: it scrapes every pod many times a second.
        gate.refresh_inference_gauges()
        body, content_type = gate.metrics.render_inference()
        return Response(body, media_type=content_type)

    async def models(request: Request) -> Response:
        operator = authenticate(request)
        configured = gate.backends.configured
        results = await asyncio.gather(*(_get_json(gate, b, "/v1/models") for b in configured))
        data: list[Any] = []
        listing: list[Any] = []  # llama-server's own top-level "models" list, merged the same way
        for backend, result in zip(configured, results):
            for entry in (result.get("models") if isinstance(result, dict) else None) or []:
                if isinstance(entry, dict):
                    name = entry.get("model") or entry.get("name")
                    if backend.fleet is None or name in backend.config.models:
                        listing.append(entry)
            entries = result.get("data") if isinstance(result, dict) else None
            for entry in entries or []:
                if backend.fleet is not None and isinstance(entry, dict) and entry.get("id") not in backend.config.models:
                    continue  # a router lists every model it has; the gate serves those configured
                if isinstance(entry, dict):
                    data.append({**_for_tenants(entry, operator), "owned_by": entry.get("owned_by") or backend.name})
            listed = {e.get("id") for e in data if isinstance(e, dict)}
            for name in backend.config.models:
                if name not in listed:
                    data.append({"id": name, "object": "model", "owned_by": backend.name})
        if not data and all(r is None for r in results):
            # An empty list read as "this server has no model" (a user's trial, backend down): a
            # client retries a 503 instead. The detail names no backend address.
            raise GateError(Reason.NO_BACKEND, "no backend answered the model list", retry_after_s=5.0)
        # llama-server's order: "models" (its Ollama-style list) first, then the OpenAI list.
        answer: dict[str, Any] = ({"models": listing} if listing else {}) | {"object": "list", "data": data}
        return json_answer(answer)

    async def gate_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, GateError)
        status, headers, body = render(exc, error_shape(request.url.path))  # count_tokens: Anthropic's
        if exc.body is not None:  # llama-server's own answer, relayed
            mark_relayed(request.scope)
        request_id = getattr(request.state, "request_id", None)  # a forwarded route's: its journal row's id
        if request_id is not None:
            headers.append((b"x-request-id", request_id.encode()))
        return _own(status, headers, body)

    async def not_found(request: Request, exc: Exception) -> Response:
        status = getattr(exc, "status_code", 404)
        message = f"{request.method} {request.url.path} is not a tokengate endpoint"
        if status == 405:
            message = f"{request.method} is not allowed on {request.url.path}"
        code, headers, body = render(GateError(Reason.INVALID_REQUEST, message, status=status))
        allow = getattr(exc, "headers", None) or {}  # Allow on 405
        return _own(code, headers + [(k.encode(), v.encode()) for k, v in allow.items()], body)

    routes = [Route(path, admitted, methods=["POST"]) for path in ENDPOINTS]
    routes += [
        Route("/v1/models", models, methods=["GET"]),
        Route("/models", models, methods=["GET"]),  # llama-server's alias: the same merged list
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/metrics/inference", inference_metrics, methods=["GET"]),
        # Everything else, OPTIONS on the routes above included: forwarded (gate/http/forward.py).
        Route("/{path:path}", ForwardEndpoint(gate).handle, methods=FORWARDED_METHODS),
    ]
    app = Starlette(routes=routes, exception_handlers={HTTPException: not_found, GateError: gate_error})
    # A trailing slash is a 404, never a redirect: Starlette would build its Location from the
    # client's Host header (an open redirect).
    app.router.redirect_slashes = False
    # CORS on the gate's own answers as llama-server sets it on its own (gate/http/cors.py).
    return Dated(CorsMirror(_FastPath(admitted, app, gate)))


class Dated:
    """ASGI wrapper: a ``Date`` header of when the answer starts, as llama-server dates its own.
    uvicorn's is the request's arrival (it takes its default headers when a request comes), so a
    trial's 502 sent 34 s after its request said a time 34 s old; uvicorn's is turned off."""

    __slots__ = ("app", "clock", "_second", "_text")

    def __init__(self, app: ASGIApp, clock: Callable[[], float] = time.time) -> None:
        self.app, self.clock = app, clock
        self._second, self._text = -1, b""

    def __call__(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        if scope["type"] != "http":
            return self.app(scope, receive, send)
        return self.app(scope, receive, _DatedSend(self, send))

    def now(self) -> bytes:
        second = int(self.clock())
        if second != self._second:  # formatted once a second, as uvicorn does
            self._second, self._text = second, formatdate(second, usegmt=True).encode()
        return self._text


class _DatedSend:
    __slots__ = ("dated", "send")

    def __init__(self, dated: Dated, send: Send) -> None:
        self.dated, self.send = dated, send

    def __call__(self, message: Message) -> Awaitable[None]:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [(b"date", self.dated.now()), *message.get("headers", ())]}
        return self.send(message)


class _FastPath:
    """Sends POSTs on the admitted endpoints straight to their handler; guards the rest.

    The handler catches everything itself, so Starlette's routing and its error
    middlewares add nothing there but a wrapper around every `send`: about a fifth
    of the gate's CPU on a refused request (py-spy, bench/overhead.py flood).
    """

    def __init__(self, admitted: AdmittedEndpoint, app: Starlette, gate: RequestPorts) -> None:
        self.admitted = admitted
        self.app = app
        self.gate = gate
        self.paths = frozenset(ENDPOINTS)

    def __call__(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        # Hands over the handler's coroutine (no frame of its own held while a request
        # waits); uvicorn is told the interface, since it cannot infer asgi3 from a def.
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] in self.paths:
            return self.admitted(scope, receive, send)  # guards its own reads and writes
        if scope["type"] != "http":
            return self.app(scope, receive, send)
        limits = self.gate.config.gate
        reader = BodyReader(receive, scope["headers"], limits.max_body_bytes, limits.body_timeout_s)
        if reader.declared is not None and reader.declared > limits.max_body_bytes:
            # Every route, even one that never reads a body (GET /slots): not one byte is read.
            return _answer(send, too_large(reader.declared, limits.max_body_bytes), scope["path"])

        async def guarded_send(message: Message) -> None:
            try:
                await send_within(send, message, limits.write_stall_s)
            except GateError:
                await abort(scope)  # the client reads nothing: drop it; later sends see a closed connection

        return self.app(scope, reader, guarded_send)


def _own(status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> Response:
    """An error answer with `headers` as given: names spelled as render() spells them (Starlette's
    `headers=` writes them in lower case) and a relayed answer's repeated headers kept."""
    response = Response(body, status_code=status)
    response.raw_headers = [*headers, (b"Content-Length", str(len(body)).encode())]
    return response


async def _answer(send: Send, err: GateError, path: str) -> None:
    """`err` in the API shape of `path` (count_tokens: Anthropic's; a client trial's 413 there
    came in OpenAI's when the body declared its length, Anthropic's when it was chunked)."""
    status, headers, body = render(err, error_shape(path))
    await send({"type": "http.response.start", "status": status, "headers": [*headers, (b"Content-Length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def _for_tenants(entry: dict[str, Any], operator: bool) -> dict[str, Any]:
    """A router's model entry as a tenant that is not an operator sees it: without ``status``'s
    ``args`` and ``preset``, the child process's command line (host paths, its port on the
    router's host), which a trial read through the gate as any tenant."""
    status = entry.get("status")
    if operator or not isinstance(status, dict) or not ({"args", "preset"} & status.keys()):
        return entry
    return {**entry, "status": {k: v for k, v in status.items() if k not in ("args", "preset")}}


def shared_health(state: str, divisor: int, known: Known = "counted", cause: str = "") -> dict[str, Any]:
    """/health's `shared`: the state of the tenant limits shared through Redis, and what it means.
    ``cause``: why Redis does not decide (gate/fleet/sharedlimits/causes.py), never a password: a
    trial's /health said "Redis unreachable" of a Redis that was slow, and of one that refused
    the gate's password."""
    why = cause or UNKNOWN
    notes = {
        "ok": "tenant limits are held fleet-wide through Redis",
        "fail_open": f"{why}: this gate enforces 1/{divisor} of each tenant's limits on its own (fail_open; {gates_phrase(divisor, known)})",
        "fail_closed": f"{why}: requests of tenants with limits get 429 shared_limit_unavailable (fail_closed)",
    }
    return {"state": state, "note": notes.get(state, "")}


async def _get_json(gate: RequestPorts, backend, path: str) -> Any:
    try:
        response = await backend.get(path, timeout=5.0)
        response.raise_for_status()
        return response.json()
    except (httpx.HTTPError, json.JSONDecodeError, ValueError):
        return None


#: How long an idle client connection is kept open between requests (uvicorn's default: 5 s).
#: A server that closes an idle connection at the moment its client reuses it makes that request
#: fail with a reset: HTTP/1.1 has no way to say "closing" first, and a POST is not retried. httpx
#: (and so the OpenAI SDK) keeps an idle connection for 5 s, exactly uvicorn's default: a CI run
#: of three gates saw one such httpx.ReadError in a minute of traffic, and a loop of requests
#: 0-30 ms inside the expiry failed 1 in 30 with the two equal, 0 in 30 with the server's longer
#: (2026-12-07). nginx keeps 75 s, longer than the clients and load balancers in front of it
#: (60 s idle timeouts are common): the same here.
KEEP_ALIVE_S = 75

#: past the grace period, how long uvicorn waits before it cancels what still runs (a moment
#: for the connections that just finished to close)
CUT_WAIT_S = 0.2


class _EmbeddedServer(uvicorn.Server):
    """uvicorn without its own signal handlers: the host process owns signals."""

    @contextlib.contextmanager
    def capture_signals(self):  # uvicorn's own signature
        yield


def _listening_socket(host: str, port: int, *, v6only: bool) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY on accepted connections only
    # when the listening socket says so, and without it every keep-alive response
    # waits ~40 ms for the client's delayed ACK (Nagle).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if family == socket.AF_INET6 and v6only:
        # With several addresses, "[::]:P" is IPv6 only, so "0.0.0.0:P" can be listed beside it
        # (alone, it stays dual-stack as before).
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        why = "in use by another process" if exc.errno == errno.EADDRINUSE else (exc.strerror or str(exc))
        raise ListenError(
            f"cannot listen on {shown} ([gate] listen): the address is {why}"
            + (f"; see who holds it: ss -ltnp 'sport = :{port}'" if exc.errno == errno.EADDRINUSE else "")
        ) from None
    sock.setblocking(False)
    return sock


class ListenError(Exception):
    """The gate's listen address cannot be bound: the message names it and the key."""


class HttpServer:
    """The gate's listening socket and its uvicorn server, on the running loop."""

    def __init__(self, app: ASGIApp, *, header_timeout_s: float) -> None:
        self.app = app
        self.header_timeout_s = header_timeout_s
        self.port: int | None = None
        #: the other addresses listened on, "host:port" with the ports bound (``[gate] listen`` as a list)
        self.also_bound: list[str] = []
        self.task: asyncio.Task[None] | None = None
        self._server: _EmbeddedServer | None = None

    async def start(self, host: str, port: int, also: Sequence[tuple[str, int]] = ()) -> int:
        """Bind, listen, and return the first address's port once uvicorn serves (port 0 picks a
        free one); `also`: more addresses, one uvicorn server on all of them (llama-server's
        ``--host A,B``)."""
        sockets = []
        try:
            for h, p in ((host, port), *also):
                sockets.append(_listening_socket(h, p, v6only=bool(also)))
        except (OSError, ListenError):
            for sock in sockets:
                sock.close()
            raise
        self.port = sockets[0].getsockname()[1]
        self.also_bound = [
            f"[{s.getsockname()[0]}]:{s.getsockname()[1]}" if s.family == socket.AF_INET6 else f"{s.getsockname()[0]}:{s.getsockname()[1]}"
            for s in sockets[1:]
        ]
        config = uvicorn.Config(
            self.app,
            interface="asgi3",
            log_level="warning",
            lifespan="off",
            access_log=False,
            server_header=False,  # no "server: uvicorn": the stack behind the gate is nobody's business
            date_header=False,  # the app's own (`Dated`): uvicorn's is the request's arrival
            timeout_graceful_shutdown=5,
            timeout_keep_alive=KEEP_ALIVE_S,  # longer than the clients' own (above)
            http=guarded_protocol(self.header_timeout_s),  # slow clients: gate/http/clientguard.py
        )
        self._server = server = _EmbeddedServer(config)
        self.task = asyncio.create_task(server.serve(sockets=sockets), name="tokengate-http")
        while not server.started:
            if self.task.done():
                self.task.result()  # surface why the server did not start
            await asyncio.sleep(0.01)
        return self.port

    def stop(self, *, cut: bool = False) -> None:
        """Stop accepting; the task ends once the connections are done (await `task`).

        `cut`: the gate's grace period is over, so what is still running is cancelled now, not
        after uvicorn's own graceful wait (5 s more: a trial's `serve --grace 3` took 8.3 s)."""
        if self._server is not None:
            if cut:
                # typed int | None; uvicorn passes it to asyncio.wait_for, which takes a float
                self._server.config.timeout_graceful_shutdown = CUT_WAIT_S  # type: ignore[assignment]
            self._server.should_exit = True
