"""llama-server's whole route table through the gate (issue 21, first part).

Real gate in front of the real llama-server: the aliases admitted like their /v1 twins,
every other route forwarded with its status, headers and body, operator-only routes refused
(403) or allowed and audited, X-Api-Key as a credential, the unknown-route policy both ways,
CORS preflight, and several listen addresses. Every row checks that nothing is left reserved.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket

import httpx
import pytest

from tests.integration.gate_harness import busy_slots, released, running_gate, wait_until
from tests.integration.hardening import AUTH, BACKEND_EXTRA, ENV, KEY, MODEL, TENANTS, assert_error, chat, record_of
from tests.llama.server import LlamaServer

pytestmark = pytest.mark.llama

OPS_KEY = "sk-ops-999"
WITH_OPERATOR = (
    TENANTS
    + """
[[tenants]]
name = "ops"
api_key_env = "OPS_KEY"
operator = true
"""
)
OPS_ENV = {**ENV, "OPS_KEY": OPS_KEY}
OPS = {"Authorization": f"Bearer {OPS_KEY}"}
CLOSE = {"Connection": "close"}


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one series in Prometheus text, 0 when absent."""
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in text.splitlines():
        if line.startswith(f"{name}{{{want}}} "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/chat/completions", chat(4)),
        ("/completions", {"prompt": "the quick brown fox", "n_predict": 4, "ignore_eos": True}),
        ("/chat/completions", chat(4, stream=True)),
    ],
    ids=["chat", "completions", "chat-stream"],
)
async def test_aliases_are_admitted_like_their_twins(llama_unified, path, body):
    async with running_gate(llama_unified.url) as gate, httpx.AsyncClient(timeout=60) as client:
        r = await client.post(gate.url + path, json=body, headers={"X-Request-Id": "t21-alias"})
        assert r.status_code == 200, r.text
        record = gate.records.find("t21-alias")
        assert record is not None and (record.outcome, record.endpoint) == ("admitted", path), record
        assert record.reserved_tokens > 0
        await released(gate)


async def test_get_models_is_the_merged_list_with_llama_servers_models_key(llama_unified):
    async with running_gate(llama_unified.url, backend_extra=BACKEND_EXTRA) as gate, httpx.AsyncClient(timeout=30) as client:
        direct = (await client.get(llama_unified.url + "/v1/models")).json()
        for path in ("/models", "/v1/models"):
            r = await client.get(gate.url + path)
            assert r.status_code == 200, r.text
            answer = r.json()
            assert list(answer) == ["models", "object", "data"]
            assert answer["models"] == direct["models"]
            assert {m["id"] for m in answer["data"]} >= {MODEL}


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/props", None),
        ("GET", "/v1/health", None),
        ("GET", "/", None),
        ("GET", "/slots", None),
        ("POST", "/apply-template", {"messages": [{"role": "user", "content": "hi"}]}),
        ("POST", "/tokenize", {"content": "hello world"}),
        ("POST", "/v1/chat/completions/input_tokens", {"messages": [{"role": "user", "content": "hi"}]}),
        ("POST", "/chat/completions/input_tokens", {"messages": [{"role": "user", "content": "hi"}]}),
        ("GET", "/lora-adapters", None),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
async def test_other_routes_are_forwarded_as_llama_server_answers(llama_unified, method, path, body):
    async with running_gate(llama_unified.url) as gate, httpx.AsyncClient(timeout=30) as client:
        direct = await client.request(method, llama_unified.url + path, json=body, headers=CLOSE)
        r = await client.request(method, gate.url + path, json=body, headers={**CLOSE, "X-Request-Id": "t21-fwd"})
        assert r.status_code == direct.status_code, r.text
        assert r.headers.get("content-type") == direct.headers.get("content-type")
        if path not in ("/props", "/slots"):  # these two say what changes between calls
            assert r.content == direct.content
        record = gate.records.find("t21-fwd")
        assert record is not None and record.outcome == "forwarded" and record.http_status == direct.status_code
        assert record.reserved_tokens == 0 and record.cls == ""
        name = f"{method} {path}"
        scraped = (await client.get(gate.url + "/metrics")).text
        assert metric(scraped, "tokengate_forwarded_total", route=name, status=f"{direct.status_code // 100}xx") == 1
        await released(gate)


async def test_cors_preflight_and_headers_come_from_llama_server(llama_unified):
    origin = {"Origin": "http://app.example", "Access-Control-Request-Method": "POST", **CLOSE}
    async with (
        running_gate(llama_unified.url, TENANTS, environ=ENV, backend_extra=BACKEND_EXTRA) as gate,
        httpx.AsyncClient(timeout=30) as client,
    ):
        for path in ("/v1/chat/completions", "/props", "/nope"):
            direct = await client.options(llama_unified.url + path, headers=origin)
            r = await client.options(gate.url + path, headers=origin)  # no credential: browsers send none
            assert r.status_code == direct.status_code and r.status_code < 400, (path, r.status_code, r.text)
            cors = {k: v for k, v in direct.headers.items() if k.startswith("access-control-")}
            assert cors and {k: r.headers.get(k) for k in cors} == cors, (path, r.headers)
        # On an admitted answer, streamed or not, llama-server's CORS headers come back too.
        for body in (chat(4), chat(4, stream=True)):
            r = await client.post(gate.url + "/v1/chat/completions", json=body, headers={**AUTH, **origin})
            assert r.status_code == 200, r.text
            assert r.headers["access-control-allow-origin"] == "http://app.example"
            # the gate's headers readable by a browser's script (Retry-After on a 429 above all)
            assert "retry-after" in r.headers["access-control-expose-headers"].lower()
            if not body.get("stream"):  # assembled from the gate's stream: none of the stream's own headers
                assert "x-accel-buffering" not in r.headers and r.headers["content-type"].startswith("application/json"), r.headers
        r = await client.get(gate.url + "/props", headers={**AUTH, **origin})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://app.example"
        await released(gate)


async def test_id_slot_goes_to_llama_server_untouched(llama_unified):
    async with running_gate(llama_unified.url) as gate, httpx.AsyncClient(timeout=60) as client:
        for stream in (False, True):
            body = {"prompt": "the quick brown fox", "n_predict": 4, "id_slot": 2, "stream": stream}
            r = await client.post(gate.url + "/completion", json=body)
            assert r.status_code == 200, r.text
            if not stream:
                assert r.json()["id_slot"] == 2
            else:
                assert '"id_slot":2' in r.text.replace(" ", "")
        await released(gate)


async def test_operator_routes_need_an_operator_and_are_audited(llama_unified):
    async with (
        running_gate(llama_unified.url, WITH_OPERATOR, environ=OPS_ENV, backend_extra=BACKEND_EXTRA) as gate,
        httpx.AsyncClient(timeout=30) as client,
    ):
        r = await client.post(gate.url + "/slots/0?action=erase", headers={**AUTH, "X-Request-Id": "t21-op-no"})
        err = assert_error(r, 403, "operator_only")
        assert "POST /slots/:id_slot" in err["message"] and "alice" in err["message"]
        assert err["type"] == "permission_error"
        r = await client.post(gate.url + "/props", json={}, headers=AUTH)
        assert_error(r, 403, "operator_only")
        assert not [a for a in gate.recent_audit if a.source == "api"]
        record = gate.records.find("t21-op-no")
        assert record is not None and (record.outcome, record.reason, record.http_status) == ("refused", "operator_only", 403)

        # This llama-server runs without --slot-save-path: its own 501 comes back, as it sent it.
        direct = await client.post(llama_unified.url + "/slots/0?action=erase", headers=CLOSE)
        r = await client.post(gate.url + "/slots/0?action=erase", headers=OPS)
        assert (r.status_code, r.content) == (direct.status_code, direct.content), r.text
        audit = [a for a in gate.recent_audit if a.source == "api"]
        assert len(audit) == 1 and audit[0].action == "POST /slots/:id_slot" and audit[0].operator == "ops"
        assert "action=erase" in audit[0].note and audit[0].target == "backend:b0"
        await released(gate)


async def test_operator_routes_are_open_in_open_mode_and_audited(llama_unified):
    async with running_gate(llama_unified.url) as gate, httpx.AsyncClient(timeout=30) as client:
        r = await client.post(gate.url + "/slots/1?action=erase")
        assert r.status_code == 501 and "slot-save-path" in r.text  # llama-server's own answer
        assert [a.action for a in gate.recent_audit if a.source == "api"] == ["POST /slots/:id_slot"]


async def test_x_api_key_is_a_credential_like_authorization(llama_unified):
    async with (
        running_gate(llama_unified.url, TENANTS, environ=ENV, backend_extra=BACKEND_EXTRA) as gate,
        httpx.AsyncClient(timeout=30) as client,
    ):
        xkey = {"X-Api-Key": KEY}
        r = await client.post(gate.url + "/v1/chat/completions", json=chat(4), headers={**xkey, "X-Request-Id": "t21-x"})
        assert r.status_code == 200, r.text
        assert gate.records.find("t21-x").tenant == "alice"
        assert (await client.get(gate.url + "/props", headers=xkey)).status_code == 200
        assert (await client.get(gate.url + "/props", headers={**xkey, **AUTH})).status_code == 200
        for headers in ({"X-Api-Key": "sk-nope"}, {**AUTH, "X-Api-Key": "sk-nope"}, [("X-Api-Key", KEY), ("X-Api-Key", KEY)]):
            for method, path, body in (("POST", "/v1/chat/completions", chat(4)), ("GET", "/props", None)):
                r = await client.request(method, gate.url + path, json=body, headers=headers)
                assert_error(r, 401, "invalid_api_key")
                assert KEY not in r.text and "sk-nope" not in r.text
        await released(gate)


async def test_unknown_routes_forwarded_by_default_and_counted(llama_unified):
    async with running_gate(llama_unified.url) as gate, httpx.AsyncClient(timeout=30) as client:
        direct = await client.get(llama_unified.url + "/no/such/route", headers=CLOSE)
        r = await client.get(gate.url + "/no/such/route", headers={"X-Request-Id": "t21-unknown"})
        assert r.status_code == direct.status_code == 404
        assert r.content == direct.content  # llama-server's own 404, not the gate's
        record = gate.records.find("t21-unknown")
        assert record is not None and record.outcome == "forwarded" and record.endpoint == "GET /no/such/route"
        scraped = (await client.get(gate.url + "/metrics")).text
        assert metric(scraped, "tokengate_forwarded_total", route="other", status="4xx") == 1
        assert "/no/such/route" not in scraped  # labels are the table's names only


async def test_a_forwarded_call_goes_to_the_backend_of_the_model_its_body_names(llama_unified, llama_split):
    # Two backends, one model each: POST /tokenize names its model in the body, as the admitted
    # routes do; it went to the first backend whatever it named.
    models = ('models = ["first"]', 'models = ["second"]')
    async with running_gate([llama_unified.url, llama_split.url], backend_extra=models) as gate, httpx.AsyncClient(timeout=30) as client:
        for rid, body, backend in (
            ("t-body-second", {"model": "second", "content": "hello"}, "b1"),
            ("t-body-first", {"model": "first", "content": "hello"}, "b0"),
            ("t-body-none", {"content": "hello"}, "b0"),  # no model: the first, as before
            ("t-body-unknown", {"model": "nope", "content": "hello"}, "b0"),  # served by none: as with none
        ):
            r = await client.post(gate.url + "/tokenize", json=body, headers={"X-Request-Id": rid})
            assert r.status_code == 200 and r.json()["tokens"], (rid, r.text)
            record = await record_of(gate, rid)
            assert record.outcome == "forwarded" and record.backend == backend, (rid, record.backend)
        # ?model= still decides when given, and a body that is not JSON is relayed as sent
        r = await client.post(gate.url + "/tokenize?model=second", json={"model": "first", "content": "x"}, headers={"X-Request-Id": "t-q"})
        assert r.status_code == 200 and (await record_of(gate, "t-q")).backend == "b1"
        direct = await client.post(
            llama_unified.url + "/tokenize", content=b"{not json", headers={"Content-Type": "application/json", **CLOSE}
        )
        r = await client.post(
            gate.url + "/tokenize", content=b"{not json", headers={"Content-Type": "application/json", "X-Request-Id": "t-bad"}
        )
        assert r.status_code == direct.status_code and (await record_of(gate, "t-bad")).backend == "b0"
        await released(gate)


async def test_unknown_routes_refused_when_configured(llama_unified):
    async with running_gate(llama_unified.url, '[gate]\nunknown_routes = "refuse"\n') as gate, httpx.AsyncClient(timeout=30) as client:
        r = await client.post(gate.url + "/no/such/route", json={}, headers={"X-Request-Id": "t21-refused"})
        err = assert_error(r, 404, "invalid_request")
        assert "unknown_routes" in err["message"]
        record = gate.records.find("t21-refused")
        assert record is not None and (record.outcome, record.http_status) == ("refused", 404)
        # the table's routes still go through
        assert (await client.get(gate.url + "/props")).status_code == 200


async def test_dot_segments_never_reach_llama_server_as_another_route(llama_unified):
    # httpx resolves "/x/../props" to "/props" when it builds the backend's URL ("%2e%2e" is
    # decoded to ".." first): a tenant reached POST /props (operator-only) and ran generations
    # the gate never admitted. The client's path goes as raw bytes: httpx would resolve it here too.
    chat_body = json.dumps(chat(4)).encode()
    auth = f"Authorization: Bearer {KEY}\r\n"
    async with running_gate(llama_unified.url, WITH_OPERATOR, environ=OPS_ENV, backend_extra=BACKEND_EXTRA) as gate:
        for method, path, body in (
            ("POST", "/x/../props", b"{}"),
            ("POST", "/x/%2e%2e/slots/0?action=erase", b""),
            ("POST", "/x/..%2fv1/chat/completions", chat_body),
            ("POST", "/%2E%2E/v1/chat/completions", chat_body),
            ("GET", "/./props", b""),
        ):
            head = await _head(gate.url, method, path, body, auth)
            # the status llama-server gives such a path itself (no route of its has one)
            straight = await _head(llama_unified.url, method, path, body, auth)
            assert head.startswith(b"HTTP/1.1 404 ") and straight.startswith(b"HTTP/1.1 404 "), (path, head, straight)
        assert not [a for a in gate.recent_audit if a.source == "api"]
        await released(gate)


async def test_a_client_leaving_mid_body_on_a_forwarded_route_is_cancelled_not_a_traceback(llama_unified, caplog):
    # uvicorn logged "Exception in ASGI application" and starlette's ClientDisconnect traceback
    # for each: any caller could fill the gate's log at 45 lines a request.
    async with running_gate(llama_unified.url) as gate:
        host, port = gate.url.removeprefix("http://").rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"POST /tokenize HTTP/1.1\r\nHost: x\r\nX-Request-Id: t-gone\r\nContent-Length: 100\r\n\r\n{")
        await writer.drain()
        await asyncio.sleep(0.2)
        writer.close()
        await wait_until(lambda: gate.records.find("t-gone") is not None, timeout_s=5)
        record = gate.records.find("t-gone")
        assert (record.outcome, record.reason, record.http_status) == ("cancelled", "client_disconnect", 499)
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR], [r.getMessage() for r in caplog.records]


async def test_bad_input_on_forwarded_routes_is_a_4xx_without_backend_addresses(llama_unified):
    async with running_gate(llama_unified.url, "[gate]\nmax_body_bytes = 1024\n") as gate, httpx.AsyncClient(timeout=30) as client:
        r = await client.post(gate.url + "/tokenize", content=b"x" * 4096, headers={"content-type": "application/json"})
        assert_error(r, 413, "body_too_large")
        # a header byte beyond ASCII goes as sent, as llama-server takes it (it was a 400 here)
        r = await client.post(gate.url + "/tokenize", json={"content": "hi"}, headers={"X-Odd": "caf\xe9".encode("latin-1")})
        assert r.status_code == 200 and r.json()["tokens"], r.text
        r = await client.request("TRACE", gate.url + "/props")
        assert r.status_code == 405
    async with running_gate("http://127.0.0.1:9") as gate, httpx.AsyncClient(timeout=30) as client:
        r = await client.get(gate.url + "/props")
        assert_error(r, 503, "no_backend")
        assert ":9" not in r.text
        # nor the gate's own stack: no "server: uvicorn" on its own answers (llama-server's
        # `Server: llama.cpp` is relayed on its answers, as the test below checks)
        assert "server" not in r.headers, r.headers
        assert len(r.headers.get_list("date")) == 1  # the gate's own (`Dated`), not uvicorn's beside it


async def test_several_listen_addresses_ipv6_included(llama_unified):
    probe = socket.socket(socket.AF_INET6)
    probe.bind(("::1", 0))
    v6_port = probe.getsockname()[1]
    probe.close()
    extra = f'[gate]\nlisten = ["127.0.0.1:8081", "[::1]:{v6_port}"]\n'
    async with running_gate(llama_unified.url, extra) as gate, httpx.AsyncClient(timeout=60) as client:
        assert gate.http.also_bound == [f"[::1]:{v6_port}"]
        for base in (gate.url, f"http://[::1]:{v6_port}"):
            assert (await client.get(base + "/health")).status_code == 200
            r = await client.post(base + "/v1/chat/completions", json=chat(4))
            assert r.status_code == 200, (base, r.text)
        await released(gate)


async def test_a_client_leaving_a_messages_stream_frees_llama_servers_slot_and_is_recorded(llama_unified):
    """/v1/messages (admitted since issue 21's second part) streams: the client leaves after one read."""
    body = {
        "model": MODEL,
        "max_tokens": 400,
        "ignore_eos": True,
        "stream": True,
        "messages": [{"role": "user", "content": "tell me a long story"}],
    }
    async with running_gate(llama_unified.url) as gate, httpx.AsyncClient(timeout=60) as client:
        async with client.stream("POST", gate.url + "/v1/messages", json=body, headers={"X-Request-Id": "t21-left"}) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            async for chunk in r.aiter_bytes():
                assert chunk
                break
        record = await record_of(gate, "t21-left")
        assert (record.outcome, record.endpoint) == ("cancelled", "/v1/messages")
        waited = 0.0
        while await busy_slots(client, llama_unified.url) and waited < 5:
            await asyncio.sleep(0.1)
            waited += 0.1
        assert await busy_slots(client, llama_unified.url) == 0
        await released(gate)


async def test_llama_servers_own_refusal_keeps_its_cors_headers(llama_unified):
    origin = {"Origin": "http://app.example", **CLOSE}
    body = {"prompt": [1, 450, 4996], "n_predict": 4}  # token ids the model does not have: llama-server's 400
    async with running_gate(llama_unified.url) as gate, httpx.AsyncClient(timeout=30) as client:
        direct = await client.post(llama_unified.url + "/completion", json=body, headers=origin)
        r = await client.post(gate.url + "/completion", json=body, headers=origin)
        assert r.status_code == direct.status_code == 400 and r.json() == direct.json()
        assert r.headers["access-control-allow-origin"] == direct.headers["access-control-allow-origin"]
        await released(gate)


async def _head(url: str, method: str, path: str, body: bytes = b"", headers: str = "") -> bytes:
    """The status line and header lines of one answer, as the bytes that came over the socket."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(
            f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n{headers}"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        await writer.drain()
        return await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
    finally:
        writer.close()


#: written by each server itself (uvicorn's own spelling through the gate)
FRAMING = (b"content-length", b"transfer-encoding", b"keep-alive", b"connection")


def _names(head: bytes) -> set[bytes]:
    return {line.split(b":", 1)[0] for line in head.split(b"\r\n")[1:] if b":" in line}


async def test_relayed_header_names_keep_llama_servers_spelling_on_the_wire(llama_unified):
    # llama.cpp's own tests copy the headers into a plain dict: "Access-Control-Allow-Origin" and
    # "Process-Start-Time-Unix" must be spelled so (uvicorn's httptools writes lower case).
    origin = "Origin: http://app.example\r\n"
    chat_body = json.dumps(chat(4)).encode()
    stream_body = json.dumps(chat(4, stream=True)).encode()
    async with running_gate(llama_unified.url) as gate:
        for method, path, body in (
            ("GET", "/props", b""),
            ("POST", "/v1/chat/completions", chat_body),
            ("POST", "/v1/chat/completions", stream_body),
        ):
            direct = _names(await _head(llama_unified.url, method, path, body, origin))
            through = _names(await _head(gate.url, method, path, body, origin))
            spelled = {n for n in direct if n != n.lower() and n.lower() not in FRAMING}
            assert {b"Access-Control-Allow-Origin", b"Server"} <= spelled <= through, (path, direct, through)
        assert b"Process-Start-Time-Unix" in _names(await _head(gate.url, "GET", "/metrics"))
        # the gate's own answers (a 400 here: the body is not JSON) spell the CORS header and their
        # Content-Type as llama-server does (a trial: `content-type`), and name no class they never read
        own = _names(await _head(gate.url, "POST", "/v1/chat/completions", b"{", origin))
        assert {b"Access-Control-Allow-Origin", b"Content-Type"} <= own and b"content-type" not in own, own
        assert not any(n.lower() == b"x-tokengate-class" for n in own), own
        await released(gate)


async def test_cors_of_llama_server_is_relayed_as_is_and_the_gates_own_answers_get_the_mirror(llama_bin, tiny_model, tmp_path):
    # --cors-origins localhost: a foreign origin gets no Access-Control-Allow-Origin from
    # llama-server, preflight or not; the gate must not add one to what it relays.
    server = LlamaServer(
        llama_bin, tiny_model, ctx=512, n_slots=1, extra_args=("--cors-origins", "localhost"), log_path=tmp_path / "llama.log"
    )
    preflight = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "Authorization", **CLOSE}
    with server:
        async with running_gate(server.url) as gate, httpx.AsyncClient(timeout=30) as client:
            for origin, allowed in (("http://evil.example", False), ("http://localhost:8080", True)):
                for method, path in (("OPTIONS", "/completions"), ("GET", "/props")):
                    headers = {"Origin": origin, **(preflight if method == "OPTIONS" else CLOSE)}
                    direct = await client.request(method, server.url + path, headers=headers)
                    r = await client.request(method, gate.url + path, headers=headers)
                    assert r.status_code == direct.status_code == 200, (path, r.text)
                    assert r.headers.get("access-control-allow-origin") == direct.headers.get("access-control-allow-origin")
                    assert ("access-control-allow-origin" in r.headers) is allowed, (origin, path, r.headers)
            # the gate's own answer (its 400 for a body that is not JSON) gets the mirror's echo: a
            # browser app reads the refusal
            r = await client.post(gate.url + "/v1/chat/completions", content=b"{", headers={"Origin": "http://localhost:8080", **CLOSE})
            assert r.status_code == 400 and r.headers["access-control-allow-origin"] == "http://localhost:8080", r.text
            await released(gate)
