"""CORS on the gate's own answers (gate/http/cors.py) and the never-fits error shape (issue 21)."""

from __future__ import annotations

import asyncio
import json

from gate.backend.gatekeeper import Gatekeeper, Refused
from gate.core.admission import Admission, Capacity
from gate.core.errors import GateError, error_object
from gate.core.ledger import Request
from gate.core.reasons import Reason
from gate.http.cors import CorsMirror, mark_relayed
from tests.unit.core_helpers import Cls


def _app(headers, *, relayed: bool = False):
    async def app(scope, receive, send):
        if relayed:
            mark_relayed(scope)
        await send({"type": "http.response.start", "status": 429, "headers": list(headers)})
        await send({"type": "http.response.body", "body": b"{}"})

    return app


def _call(mirror_or_app, origin: bytes | None, headers=()):
    sent = []

    async def send(message):
        sent.append(message)

    async def receive():
        return {"type": "http.request"}

    mirror = mirror_or_app if isinstance(mirror_or_app, CorsMirror) else CorsMirror(mirror_or_app)
    scope = {"type": "http", "headers": [] if origin is None else [(b"origin", origin)]}
    asyncio.run(mirror(scope, receive, send))
    return {k.lower(): v for k, v in sent[0]["headers"]} if sent[0].get("headers") is not None else {}


def test_the_gates_own_answer_echoes_the_origin_as_llama_server_does_by_default():
    assert _call(_app([]), b"http://a.example")[b"access-control-allow-origin"] == b"http://a.example"


def test_no_origin_no_header():
    assert b"access-control-allow-origin" not in _call(_app([]), None)


def test_a_relayed_llama_server_header_is_kept_and_its_fixed_value_learned():
    relayed = CorsMirror(_app([(b"Access-Control-Allow-Origin", b"https://ui.example")], relayed=True))
    assert _call(relayed, b"http://a.example")[b"access-control-allow-origin"] == b"https://ui.example"
    assert relayed.fixed == b"https://ui.example"
    own = CorsMirror(_app([]))
    own.fixed = relayed.fixed
    assert _call(own, b"http://other.example")[b"access-control-allow-origin"] == b"https://ui.example"
    relayed.learn(b"http://b.example", b"http://b.example")  # an echo seen again: back to echoing
    assert relayed.fixed is None


def test_a_relayed_answer_without_the_header_stays_without_it():
    # llama-server --cors-origins localhost answers a foreign origin's preflight with no header
    mirror = CorsMirror(_app([(b"Content-Length", b"0")], relayed=True))
    assert b"access-control-allow-origin" not in _call(mirror, b"http://evil.example")
    assert mirror.fixed is None  # nothing learned from what was not sent


def test_error_extra_fields_join_the_error_object_but_never_replace_the_gates_code():
    err = GateError(Reason.CONTEXT_LENGTH_EXCEEDED, "too long")
    err.extra = {"type": "exceed_context_size_error", "n_prompt_tokens": 600, "n_ctx": 512, "code": 400}
    body = error_object(err)["error"]
    assert body == {
        "message": "too long",
        "type": "exceed_context_size_error",
        "code": "context_length_exceeded",
        "param": None,
        "n_prompt_tokens": 600,
        "n_ctx": 512,
    }
    json.dumps(body)


def _refusal(request: Request, *, slots: int = 4, ctx: int = 512, reserved_elsewhere: int = 0):
    classes = [Cls("c", 10)] + ([Cls("other", 1, reserved_tokens=reserved_elsewhere)] if reserved_elsewhere else [])
    keeper = Gatekeeper(Admission(classes, Capacity(slots=slots, slot_context=ctx, ceiling=slots * ctx)))

    async def run():
        try:
            await keeper.acquire(request)
        except Refused as exc:
            return exc
        raise AssertionError("admitted")

    return asyncio.run(run())


def test_never_fits_carries_llama_servers_context_fields():
    err = _refusal(Request("x", "c", "t", prompt_tokens=300, max_tokens=300, arrival=0.0))
    assert err.status == 400 and err.extra == {"type": "exceed_context_size_error", "n_prompt_tokens": 300, "n_ctx": 512}
    many = _refusal(Request("y", "c", "t", 900, 100, 0.0, tasks=3, slot_tokens=550))
    assert many.extra["n_prompt_tokens"] == 450 and many.extra["n_ctx"] == 512  # its largest task
    # fits a slot but not what its class can ever hold (the other class's reservation): that limit
    reach = _refusal(Request("z", "c", "t", 800, 100, 0.0, tasks=4, slot_tokens=300), reserved_elsewhere=1000)
    assert reach.extra["n_ctx"] == 4 * 512 - 1000


def test_too_many_tasks_is_invalid_request_not_the_context_shape():
    err = _refusal(Request("x", "c", "t", 50, 5, 0.0, tasks=5, slot_tokens=15))
    assert err.reason is Reason.INVALID_REQUEST and err.extra == {}


def test_a_browser_may_read_retry_after_and_the_gates_headers_on_an_answer_it_may_read():
    # Retry-After is not CORS-safelisted: unexposed, a web UI's script reads null after a 429
    exposed = _call(_app([(b"retry-after", b"3")]), b"http://a.example")[b"access-control-expose-headers"]
    assert {n.strip().lower() for n in exposed.split(b",")} >= {b"retry-after", b"retry-after-ms", b"x-request-id", b"x-tokengate-queue-ms"}
    # llama-server's own list is kept, the gate's names added; `*` already exposes all
    kept = _call(
        _app([(b"Access-Control-Allow-Origin", b"*"), (b"Access-Control-Expose-Headers", b"X-Own")], relayed=True), b"http://a.example"
    )
    assert kept[b"access-control-expose-headers"].startswith(b"X-Own, Retry-After")
    star = _call(
        _app([(b"Access-Control-Allow-Origin", b"*"), (b"Access-Control-Expose-Headers", b"*")], relayed=True), b"http://a.example"
    )
    assert star[b"access-control-expose-headers"] == b"*"


def test_nothing_exposed_where_a_browser_may_not_read_the_answer():
    assert b"access-control-expose-headers" not in _call(_app([]), None)  # no Origin
    relayed_without = _app([(b"Content-Length", b"0")], relayed=True)  # llama-server refused the origin
    assert b"access-control-expose-headers" not in _call(relayed_without, b"http://evil.example")


def test_the_date_header_is_when_the_answer_starts_not_when_the_request_came():
    """uvicorn dates an answer at its request's arrival: a trial's 502, sent 34 s after its
    request (llama-server hung while stopping), said a time 34 s old. `Dated` dates the start."""
    from email.utils import parsedate_to_datetime

    from gate.http.server import Dated

    now = [1_800_000_000.4]
    sent: list[dict] = []

    async def slow_app(scope, receive, send):
        now[0] += 34.0  # the answer starts 34 s after the request came
        await send({"type": "http.response.start", "status": 502, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": b"{}", "more_body": False})

    async def send(message):
        sent.append(message)

    app = Dated(slow_app, clock=lambda: now[0])
    asyncio.run(app({"type": "http", "headers": []}, None, send))
    (date,) = [v for k, v in sent[0]["headers"] if k == b"date"]
    assert parsedate_to_datetime(date.decode()).timestamp() == 1_800_000_034
    assert sent[0]["headers"][1:] == [(b"content-type", b"application/json")] and sent[1]["body"] == b"{}"
