"""The gate's HTTP surface: routes, pass-through, health, metrics, error mapping."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

import httpx
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from gate.intake import ENDPOINTS
from gate.proxy import AdmittedEndpoint
from gate.reasons import Reason, error_body

if TYPE_CHECKING:
    from gate.service import GateService

PASS_THROUGH_POST = ("/tokenize", "/detokenize", "/apply-template")
PASS_THROUGH_GET = ("/props", "/slots")


def build_app(gate: GateService) -> ASGIApp:
    """The ASGI app for one gate service: admitted POSTs direct, the rest through Starlette."""
    admitted = AdmittedEndpoint(gate)

    async def health(request: Request) -> Response:
        backends = {
            b.name: {"state": b.state, "detail": b.detail, "slots": b.capacity.slots if b.capacity else None}
            for b in gate.backends
        }
        ready = gate.backends.any_ready and not gate.shutting_down
        status = "ok" if ready else ("shutting_down" if gate.shutting_down else "no_backend")
        return JSONResponse({"status": status, "backends": backends}, status_code=200 if ready else 503)

    async def metrics(request: Request) -> Response:
        gate.refresh_metrics()
        body, content_type = gate.metrics.render()
        return Response(body, media_type=content_type)

    async def models(request: Request) -> Response:
        results = await asyncio.gather(*(_get_json(gate, b, "/v1/models") for b in gate.backends))
        data: list[Any] = []
        for backend, result in zip(gate.backends, results):
            entries = result.get("data") if isinstance(result, dict) else None
            for entry in entries or []:
                if isinstance(entry, dict):
                    data.append({**entry, "owned_by": entry.get("owned_by") or backend.name})
            listed = {e.get("id") for e in data if isinstance(e, dict)}
            for name in backend.config.models:
                if name not in listed:
                    data.append({"id": name, "object": "model", "owned_by": backend.name})
        return JSONResponse({"object": "list", "data": data})

    async def pass_through(request: Request) -> Response:
        backend = gate.backends.route(request.query_params.get("model"))
        if backend is None:
            return _error(Reason.MODEL_NOT_FOUND, "no backend serves that model", param="model")
        body = await request.body()
        if len(body) > gate.config.gate.max_body_bytes:
            return _error(Reason.BODY_TOO_LARGE, f"body exceeds {gate.config.gate.max_body_bytes} bytes")
        try:
            upstream = await gate.client.request(
                request.method,
                backend.url + request.url.path,
                params=request.query_params,
                content=body or None,
                headers={"content-type": request.headers.get("content-type", "application/json"), **backend.auth_headers()},
                timeout=30.0,
            )
        except httpx.TimeoutException:
            return _error(Reason.UPSTREAM_TIMEOUT, f"backend {backend.name!r} did not answer")
        except httpx.HTTPError as exc:
            return _error(Reason.NO_BACKEND, f"backend {backend.name!r} unreachable: {type(exc).__name__}", retry_after_s=5.0)
        return Response(upstream.content, status_code=upstream.status_code, media_type=upstream.headers.get("content-type"))

    async def not_found(request: Request, exc: Exception) -> Response:
        status = getattr(exc, "status_code", 404)
        message = f"{request.method} {request.url.path} is not a tokengate endpoint"
        if status == 405:
            message = f"{request.method} is not allowed on {request.url.path}"
        body = error_body(Reason.INVALID_REQUEST, message, status=status)
        return JSONResponse(body, status_code=status, headers=getattr(exc, "headers", None))  # Allow on 405

    routes = [Route(path, admitted, methods=["POST"]) for path in ENDPOINTS]
    routes += [Route(path, pass_through, methods=["POST"]) for path in PASS_THROUGH_POST]
    routes += [Route(path, pass_through, methods=["GET"]) for path in PASS_THROUGH_GET]
    routes += [
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
    return _FastPath(admitted, Starlette(routes=routes, exception_handlers={HTTPException: not_found}))


class _FastPath:
    """Sends POSTs on the admitted endpoints straight to their handler.

    The handler catches everything itself, so Starlette's routing and its error
    middlewares add nothing there but a wrapper around every `send`: about a fifth
    of the gate's CPU on a refused request (py-spy, bench/overhead.py flood).
    """

    def __init__(self, admitted: AdmittedEndpoint, app: Starlette) -> None:
        self.admitted = admitted
        self.app = app
        self.paths = frozenset(ENDPOINTS)

    def __call__(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        # Hands over the handler's coroutine (no frame of its own held while a request
        # waits); uvicorn is told the interface, since it cannot infer asgi3 from a def.
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] in self.paths:
            return self.admitted(scope, receive, send)
        return self.app(scope, receive, send)


def _error(reason: Reason, message: str, *, param: str | None = None, retry_after_s: float | None = None) -> Response:
    headers = {"retry-after": str(int(max(1, retry_after_s)))} if retry_after_s else None
    return JSONResponse(error_body(reason, message, param=param, retry_after_s=retry_after_s), status_code=reason.status, headers=headers)


async def _get_json(gate: GateService, backend, path: str) -> Any:
    try:
        response = await gate.client.get(backend.url + path, headers=backend.auth_headers(), timeout=5.0)
        response.raise_for_status()
        return response.json()
    except (httpx.HTTPError, json.JSONDecodeError, ValueError):
        return None
