"""Auth coverage (#11): with [[tenants]], every route that reaches a backend needs a key.

Before the fix /slots, /props, /tokenize, /detokenize and /apply-template answered
anonymous callers. /health and /metrics stay open for probes and scrapers. Real
gate in front of the real llama-server.
"""

from __future__ import annotations

import httpx
import pytest

from tests.integration.gate_harness import running_gate
from tests.integration.hardening import AUTH, BACKEND_EXTRA, ENV, TENANTS, assert_error, chat, still_serves

pytestmark = pytest.mark.llama

ROUTES = [
    ("POST", "/v1/chat/completions", chat(4)),
    ("POST", "/v1/completions", {"model": "tiny", "prompt": "hi", "max_tokens": 4}),
    ("POST", "/completion", {"model": "tiny", "prompt": "hi", "n_predict": 4}),
    ("POST", "/tokenize", {"content": "hello"}),
    ("POST", "/detokenize", {"tokens": [300, 301]}),
    ("POST", "/apply-template", {"messages": [{"role": "user", "content": "hi"}]}),
    ("GET", "/props", None),
    ("GET", "/slots", None),
    ("GET", "/v1/models", None),
]
CREDENTIALS = [
    ("none", {}),
    ("wrong-key", {"Authorization": "Bearer sk-not-a-tenant"}),
    ("not-bearer", {"Authorization": f"Basic {AUTH['Authorization'][7:]}"}),
    ("valid-then-invalid", [("Authorization", AUTH["Authorization"]), ("Authorization", "Bearer sk-nope")]),
    ("invalid-then-valid", [("Authorization", "Bearer sk-nope"), ("Authorization", AUTH["Authorization"])]),
    ("valid-twice", [("Authorization", AUTH["Authorization"]), ("Authorization", AUTH["Authorization"])]),
]


@pytest.mark.parametrize(("method", "path", "body"), ROUTES, ids=[p for _, p, _ in ROUTES])
async def test_every_backend_route_needs_one_valid_key(llama_split, method, path, body):
    async with (
        running_gate(llama_split.url, TENANTS, environ=ENV, kv="split", backend_extra=BACKEND_EXTRA) as gate,
        httpx.AsyncClient(timeout=30) as client,
    ):
        for name, headers in CREDENTIALS:
            r = await client.request(method, gate.url + path, json=body, headers=headers)
            err = assert_error(r, 401, "invalid_api_key")
            assert err["type"] == "authentication_error", name
            assert "sk-" not in r.text, (name, r.text)  # never echoes a key
        r = await client.request(method, gate.url + path, json=body, headers=AUTH)
        assert r.status_code == 200, (path, r.text)
        await still_serves(gate, client)


async def test_health_and_metrics_stay_open(llama_split):
    async with (
        running_gate(llama_split.url, TENANTS, environ=ENV, kv="split", backend_extra=BACKEND_EXTRA) as gate,
        httpx.AsyncClient(timeout=30) as client,
    ):
        assert (await client.get(gate.url + "/health")).status_code == 200
        metrics = await client.get(gate.url + "/metrics")
        assert metrics.status_code == 200 and "tokengate_token_budget" in metrics.text
        health = (await client.get(gate.url + "/health")).json()
        assert llama_split.url not in str(health) and "127.0.0.1" not in str(health)
        await still_serves(gate, client)
