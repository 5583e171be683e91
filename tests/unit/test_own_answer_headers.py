"""The gate's own answers spell their header names as llama-server spells its own.

A user's trial: answers relayed from llama-server kept its `Content-Type`, but the gate's own
400/429/503 said `content-type` and `retry-after` (uvicorn's lower case; Starlette's `headers=`
lowers them too), where the README promises llama-server's spelling to clients that keep headers
in a case-sensitive dict. The names the app gives are the ones the transport writes on the wire
(gate/http/clientguard.py, tested in test_clientguard.py), so the app's `http.response.start`
is checked here, over ASGI in front of the fake llama-server. A refusal before the request's
class is known also sent an empty `x-tokengate-class:`; now none.
"""

from __future__ import annotations

import httpx

from tests.fakes import GATE_CONFIG, gate_on_fake_llama

CHAT = "/v1/chat/completions"


def names(response: httpx.Response) -> list[bytes]:
    return [k for k, _ in response.headers.raw]


async def test_the_gates_own_refusals_spell_content_type_retry_after_and_content_length():
    async with gate_on_fake_llama(GATE_CONFIG) as g:
        g.backends.backends[0].gatekeeper.pause("batch")
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=g.app), base_url="http://gate") as c:
            invalid = await c.post(CHAT, content=b"{")  # refused before it is read: no class
            paused = await c.post(CHAT, json={"messages": [{"role": "user", "content": "hi"}]}, headers={"X-Tokengate-Class": "batch"})
    assert invalid.status_code == 400 and invalid.json()["error"]["code"] == "invalid_request"
    assert {b"Content-Type", b"Content-Length"} <= set(names(invalid)), names(invalid)
    assert b"x-tokengate-class" not in names(invalid) and b"x-request-id" in names(invalid)
    assert paused.status_code == 503 and paused.json()["error"]["code"] == "class_paused"
    assert {b"Content-Type", b"Retry-After", b"Retry-After-Ms", b"Content-Length"} <= set(names(paused)), names(paused)
    assert paused.headers["x-tokengate-class"] == "batch"
    for r in (invalid, paused):  # one of each, none in lower case beside it
        lower = [n.lower() for n in names(r)]
        assert len(lower) == len(set(lower)), names(r)
        assert int(r.headers["content-length"]) == len(r.content)


async def test_a_refusal_on_the_gates_other_routes_is_spelled_so_too():
    """/v1/models and the forwarded routes answer through Starlette's error handler
    (gate/http/server.py gate_error), whose `headers=` wrote every name in lower case."""
    config = GATE_CONFIG + '[[tenants]]\nname = "t"\napi_key_sha256 = "' + "a" * 64 + '"\n'
    async with gate_on_fake_llama(config) as g:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=g.app), base_url="http://gate") as c:
            models = await c.get("/v1/models")
            props = await c.get("/props")
    for r in (models, props):
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", r.text
        assert {b"Content-Type", b"Content-Length"} <= set(names(r)), names(r)
        assert int(r.headers["content-length"]) == len(r.content)


async def test_the_gates_own_json_answers_are_framed_as_llama_servers():
    """/health and the merged model list came from Starlette's JSONResponse:
    `content-type: application/json` and `content-length`, where llama-server sends
    `Content-Type: application/json; charset=utf-8` and `Content-Length` (a trial's comparison)."""
    async with gate_on_fake_llama(GATE_CONFIG) as g:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=g.app), base_url="http://gate") as c:
            health = await c.get("/health")
            models = await c.get("/v1/models")
    for r in (health, models):
        assert r.status_code == 200, r.text
        assert [n for n in names(r) if n.lower() in (b"content-type", b"content-length")] == [b"Content-Type", b"Content-Length"]
        assert r.headers["content-type"] == "application/json; charset=utf-8"
        assert int(r.headers["content-length"]) == len(r.content)
    assert health.json()["status"] == "ok" and models.json()["object"] == "list"
    assert b'": ' not in health.content  # compact, as llama-server writes its JSON


async def test_a_stream_carries_no_header_llama_server_does_not_send():
    """The gate added `Cache-Control: no-cache` to every stream; llama-server sends none."""
    async with gate_on_fake_llama(GATE_CONFIG) as g:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=g.app), base_url="http://gate") as c:
            r = await c.post(CHAT, json={"messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 4})
    assert r.status_code == 200 and r.headers["content-type"] == "text/event-stream"
    assert b"cache-control" not in [n.lower() for n in names(r)]
