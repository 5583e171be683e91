"""CORS on the gate's own answers, as llama-server sets it on its own.

llama-server's pre-routing middleware (tools/server/server-http.cpp at the version the project
builds) puts ``Access-Control-Allow-Origin`` on EVERY answer, before routing: with its defaults
(``--cors-origins *`` and ``--cors-credentials``) it echoes the request's ``Origin``; with a
list of origins it sends that list as is; with ``localhost`` it echoes localhost origins only.
``Access-Control-Allow-Credentials``, ``-Methods`` and ``-Headers`` go only on an ``OPTIONS``
preflight, which the gate forwards (so those come from llama-server itself).

The gate relays llama-server's headers on everything llama-server answers, as they are: an
answer llama-server left without the header (``--cors-origins localhost`` and a foreign origin,
preflight included) stays without it. The gate's own answers (a 429 or 503 from admission, a
401, a never-fits 400, ``/health``, ``/metrics``, the merged model list) would otherwise carry
none, and a browser app would see a CORS error where it should see a 429. :class:`CorsMirror`
adds the header to those, for a request with an ``Origin``, by the rule llama-server was last
seen to follow on an answer the gate relayed: the origin echoed (llama-server's default, also
before anything was relayed), or a fixed value. The code that relays an answer marks its scope
(:func:`mark_relayed`) before it starts it; the mirror never touches such an answer.
``--cors-origins localhost`` cannot be told from the default by what it sends to a localhost
origin; a gate in front of such a server echoes on its own refusals (a foreign origin then reads
those, never llama-server's answers, which carry nothing for it). A request without ``Origin``
costs nothing.

An answer a browser may read (one with ``Access-Control-Allow-Origin``, a preflight's aside) also
gets ``Access-Control-Expose-Headers`` naming the gate's headers (:data:`EXPOSED`): without it a
browser app's script reads none of them, ``Retry-After`` included (not a CORS-safelisted
header), and a web UI behind the gate could not tell when to come back after a 429. A list
llama-server sent is kept, with the gate's names added.
"""

from __future__ import annotations

from collections.abc import Awaitable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

ALLOW_ORIGIN = b"access-control-allow-origin"
#: as llama-server spells it (clients that keep headers in a plain dict look it up so)
ALLOW_ORIGIN_SPELLED = b"Access-Control-Allow-Origin"
#: set in the scope of a request whose answer is llama-server's, relayed
RELAYED = "tokengate.relayed"
EXPOSE = b"access-control-expose-headers"
EXPOSE_SPELLED = b"Access-Control-Expose-Headers"
#: the headers the gate adds to an answer (gate/http/proxy.py, gate/core/errors.py render)
EXPOSED = b"Retry-After, Retry-After-Ms, X-Request-Id, X-Tokengate-Class, X-Tokengate-Queue-Ms, X-Tokengate-Model"


def mark_relayed(scope: Scope) -> None:
    """The answer about to start is llama-server's: its CORS headers are relayed as they are."""
    scope[RELAYED] = True


class CorsMirror:
    """ASGI wrapper: ``Access-Control-Allow-Origin`` on the gate's own answers (module docstring)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.fixed: bytes | None = None  # None: echo the Origin (llama-server's default)

    def __call__(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        if scope["type"] != "http":
            return self.app(scope, receive, send)
        origin = next((v for k, v in scope["headers"] if k == b"origin"), None)
        if origin is None:
            return self.app(scope, receive, send)
        return self.app(scope, receive, _Send(self, origin, scope, send))

    def learn(self, origin: bytes, sent: bytes) -> None:
        """llama-server answered ``sent`` to ``origin``: follow its rule from now on."""
        self.fixed = None if sent == origin else sent

    def value(self, origin: bytes) -> bytes:
        return origin if self.fixed is None else self.fixed


class _Send:
    __slots__ = ("mirror", "origin", "scope", "send")

    def __init__(self, mirror: CorsMirror, origin: bytes, scope: Scope, send: Send) -> None:
        self.mirror, self.origin, self.scope, self.send = mirror, origin, scope, send

    def __call__(self, message: Message) -> Awaitable[None]:
        if message["type"] == "http.response.start":
            headers = list(message.get("headers", ()))
            if self.scope.get(RELAYED):  # llama-server's own answer: as it is, and its rule learned
                sent = next((v for k, v in headers if k.lower() == ALLOW_ORIGIN), None)
                if sent is not None:
                    self.mirror.learn(self.origin, sent)
            elif not any(k.lower() == ALLOW_ORIGIN for k, _ in headers):
                headers.append((ALLOW_ORIGIN_SPELLED, self.mirror.value(self.origin)))
            if self.scope.get("method") != "OPTIONS" and any(k.lower() == ALLOW_ORIGIN for k, _ in headers):
                message = {**message, "headers": _exposed(headers)}
            else:
                message = {**message, "headers": headers}
        return self.send(message)


def _exposed(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """`headers` with the gate's own names exposed to a browser's script (module docstring)."""
    for i, (name, value) in enumerate(headers):
        if name.lower() == EXPOSE:
            if value.strip() != b"*":  # `*` exposes every header already
                headers[i] = (name, value + b", " + EXPOSED if value.strip() else EXPOSED)
            return headers
    headers.append((EXPOSE_SPELLED, EXPOSED))
    return headers
