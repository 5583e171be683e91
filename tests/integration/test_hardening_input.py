"""Input encoding (#11): what the gate cannot forward faithfully is a 400 naming the field, never a 5xx.

Real gate (tenants configured) in front of the real llama-server. Before the fix a
lone surrogate was a 502 "internal error in the gate" (the token counter's
UnicodeEncodeError, journaled as the backend's fault), a non-ASCII header byte a
502 after admission (httpx refuses it; now it goes as sent, as llama-server takes it), and ``1e309`` was forwarded as
``Infinity`` (llama-server: 500). Each row: status, code, param, a "refused"
decision row (not "failed"), the ledger back at 0, and a normal request after.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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
    record_of,
    still_serves,
)

pytestmark = pytest.mark.llama

MSG = b'"messages": [{"role": "user", "content": "hi"}]'


def body(*fields: bytes) -> bytes:
    return b'{"model": "tiny", "max_tokens": 4, ' + b", ".join((MSG, *fields)) + b"}"


@dataclass(frozen=True)
class Case:
    id: str
    content: bytes
    param: str | None
    fragment: str
    headers: dict[str, str | bytes] = field(default_factory=dict)
    path: str = CHAT


CASES = [
    # lone UTF-16 surrogates: valid JSON text, no UTF-8 encoding
    Case(
        "surrogate-in-content",
        b'{"model": "tiny", "messages": [{"role": "user", "content": "a\\ud800b"}]}',
        "messages[0].content",
        "surrogate",
    ),
    Case(
        "low-surrogate-alone",
        b'{"model": "tiny", "messages": [{"role": "user", "content": "\\udc00"}]}',
        "messages[0].content",
        "surrogate",
    ),
    Case("surrogate-in-model", b'{"model": "\\ud800", ' + MSG + b"}", "model", "surrogate"),
    Case("surrogate-in-extra-field", body(b'"stop": ["\\udbff"]'), "stop[0]", "surrogate"),
    Case("surrogate-in-key", body(b'"\\ud800": 1'), None, "surrogate"),
    # non-finite and out-of-range numbers, anywhere in the body
    Case("float-overflow", body(b'"temperature": 1e309'), "temperature", "out of range"),
    Case("negative-overflow", body(b'"top_p": -1e400'), "top_p", "out of range"),
    Case("nested-overflow", body(b'"logit_bias": [[15, 1e999]]'), "logit_bias[0][1]", "out of range"),
    Case("nan-literal", body(b'"temperature": NaN'), None, "NaN"),
    Case("infinity-literal", body(b'"temperature": -Infinity'), None, "Infinity"),
    Case("int-above-uint64", body(b'"seed": 18446744073709551616'), "seed", "out of range"),
    Case("int-thousands-of-digits", body(b'"seed": ' + b"7" * 5000), None, "digits"),
    # bytes that are not JSON text
    Case("invalid-utf8", b'{"model": "tiny", "messages": [{"role": "user", "content": "\xed\xa0\x80"}]}', None, "UTF-8"),
    Case("raw-nul-in-string", b'{"model": "tiny", "messages": [{"role": "user", "content": "a\x00b"}]}', None, "invalid JSON"),
    Case("deep-nesting", body(b'"x": ' + b"[" * 100 + b"]" * 100), None, "nested deeper"),
    Case("number-body", b"42", None, "JSON object"),
    Case("duplicate-key", body(b'"max_tokens": 400'), None, "duplicate key"),
    Case("wrong-type", b'{"model": "tiny", "messages": {"role": "user"}}', "messages", "array"),
    # (a header with control bytes never reaches the gate: the HTTP server's parser refuses it)
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
async def test_unforwardable_input_is_400_naming_the_field(llama_split, case):
    async with (
        running_gate(llama_split.url, TENANTS, environ=ENV, kv="split", backend_extra=BACKEND_EXTRA) as gate,
        httpx.AsyncClient(timeout=30) as client,
    ):
        headers = {**AUTH, "Content-Type": "application/json", "X-Request-Id": case.id, **case.headers}
        r = await client.post(gate.url + case.path, content=case.content, headers=headers)
        err = assert_error(r, 400, "invalid_request", case.param)
        assert case.fragment in err["message"], err
        if case.path == CHAT:
            record = await record_of(gate, case.id)
            # The client's fault, journaled as such: never "failed"/upstream_error.
            assert (record.outcome, record.reason, record.http_status) == ("refused", "invalid_request", 400)
        await still_serves(gate, client)


@pytest.mark.parametrize(
    ("path", "content", "headers"),
    [
        (CHAT, body(), {"X-Title": "café".encode(), "User-Agent": b"\xff\xfe"}),
        ("/tokenize", b'{"content": "hi"}', {"Content-Type": b"application/json; charset=\xe9"}),
    ],
    ids=["chat-utf8-title", "tokenize-latin1-content-type"],
)
async def test_header_bytes_beyond_ascii_are_forwarded_as_llama_server_takes_them(llama_split, path, content, headers):
    """A client trial: `X-Title: café` (UTF-8) was a 400 "bytes outside printable ASCII" where
    llama-server answers 200. The gate's answer is llama-server's own, and the ledger is back at 0."""
    async with (
        running_gate(llama_split.url, TENANTS, environ=ENV, kv="split", backend_extra=BACKEND_EXTRA) as gate,
        httpx.AsyncClient(timeout=30) as client,
    ):
        sent = {"Content-Type": "application/json", **headers}
        direct = await client.post(llama_split.url + path, content=content, headers=sent)
        gated = await client.post(gate.url + path, content=content, headers={**AUTH, **sent})
        assert direct.status_code == 200 and gated.status_code == direct.status_code, gated.text
        await still_serves(gate, client)


async def test_escaped_nul_and_valid_pairs_are_forwarded_faithfully(llama_split):
    """The other side of the line: JSON llama-server can read is not refused."""
    async with (
        running_gate(llama_split.url, TENANTS, environ=ENV, kv="split", backend_extra=BACKEND_EXTRA) as gate,
        httpx.AsyncClient(timeout=30) as client,
    ):
        content = b'{"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "a\\u0000b \\ud83d\\ude00 caf\xc3\xa9"}]}'
        r = await client.post(gate.url + CHAT, content=content, headers={**AUTH, "Content-Type": "application/json"})
        assert r.status_code == 200, r.text
        await still_serves(gate, client)
