"""Headers (#11): ambiguous credentials or classes are refused; no redirect is built from Host.

Before the fix two Authorization headers (invalid, then valid) got 200 (the last
one won), two different X-Tokengate-Class headers let the last win, and
``POST /v1/chat/completions/`` answered 307 with a Location built from the
client's Host header. Real gate, real llama-server.
"""

from __future__ import annotations

import httpx
import pytest

from tests.integration.gate_harness import running_gate
from tests.integration.hardening import (
    AUTH,
    BACKEND_EXTRA,
    CHAT,
    ENV,
    TENANTS,
    assert_error,
    chat,
    record_of,
    still_serves,
)

pytestmark = pytest.mark.llama

BAD = AUTH["Authorization"].replace("alice", "mallory")
CASES = [
    # (id, headers as a list of pairs, status, code, param)
    ("auth-invalid-then-valid", [("Authorization", BAD), ("Authorization", AUTH["Authorization"])], 401, "invalid_api_key", None),
    ("auth-valid-then-invalid", [("Authorization", AUTH["Authorization"]), ("Authorization", BAD)], 401, "invalid_api_key", None),
    ("auth-same-twice", [("Authorization", AUTH["Authorization"])] * 2, 401, "invalid_api_key", None),
    (
        "class-twice-different",
        [*AUTH.items(), ("X-Tokengate-Class", "batch"), ("X-Tokengate-Class", "interactive")],
        400,
        "invalid_request",
        "X-Tokengate-Class",
    ),
    (
        "class-twice-same",
        [*AUTH.items(), ("X-Tokengate-Class", "batch"), ("x-tokengate-class", "batch")],
        400,
        "invalid_request",
        "X-Tokengate-Class",
    ),
    ("class-unknown", [*AUTH.items(), ("X-Tokengate-Class", "vip" * 1000)], 400, "invalid_request", "X-Tokengate-Class"),
    ("class-not-allowed-header-bytes", [*AUTH.items(), ("X-Tokengate-Class", b"b\xe4tch")], 400, "invalid_request", "X-Tokengate-Class"),
]


@pytest.mark.parametrize(("rid", "headers", "status", "code", "param"), CASES, ids=[c[0] for c in CASES])
async def test_ambiguous_headers_are_refused(llama_split, rid, headers, status, code, param):
    async with (
        running_gate(llama_split.url, TENANTS, environ=ENV, kv="split", backend_extra=BACKEND_EXTRA) as gate,
        httpx.AsyncClient(timeout=30) as client,
    ):
        r = await client.post(gate.url + CHAT, json=chat(4), headers=[*headers, ("X-Request-Id", rid)])
        assert_error(r, status, code, param)
        record = await record_of(gate, rid)
        assert (record.outcome, record.http_status) == ("refused", status)
        await still_serves(gate, client)


@pytest.mark.parametrize("path", ["/v1/chat/completions/", "/tokenize/", "/health/", "/v1/models/"])
async def test_trailing_slash_is_404_never_a_redirect_from_host(llama_split, path):
    async with (
        running_gate(llama_split.url, TENANTS, environ=ENV, kv="split", backend_extra=BACKEND_EXTRA) as gate,
        httpx.AsyncClient(timeout=30, follow_redirects=False) as client,
    ):
        method = "GET" if path in ("/health/", "/v1/models/") else "POST"
        r = await client.request(method, gate.url + path, json=chat(4), headers={**AUTH, "Host": "evil.example"})
        assert_error(r, 404, "invalid_request")
        assert "location" not in r.headers
        assert "evil.example" not in r.text
        await still_serves(gate, client)
