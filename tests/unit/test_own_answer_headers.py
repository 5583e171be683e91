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
