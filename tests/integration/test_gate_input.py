"""Malformed and unauthorised requests through the real gate in front of the real llama-server.

Every row of the table is sent to a started gate (tenants configured, the backend
serving only model "tiny", ``max_body_bytes = 1024``) and must get its documented
4xx (DESIGN.md 5, "HTTP"), never a 5xx, in OpenAI's error shape
``{"error": {"message", "type", "code", "param"}}`` with ``code`` the DESIGN reason.
Every refusal leaves one decision record (outcome "refused") and no reservation;
routing errors (a method the gate never forwards, 405) are not requests and leave none.
Nothing in the table may reach llama-server's generation.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from tests.integration.gate_harness import busy_slots, released, running_gate

pytestmark = pytest.mark.llama

KEY = "sk-alice-123"
ENV = {"ALICE_KEY": KEY}
MAX_BODY = 1024
CAP = 256  # interactive's max_tokens_cap

EXTRA = f"""
[gate]
max_body_bytes = {MAX_BODY}

[classes.interactive]
priority = 10
default_max_tokens = 16
max_tokens_cap = {CAP}

[classes.batch]
priority = 1

[[tenants]]
name = "alice"
api_key_env = "ALICE_KEY"
class = "interactive"
"""
BACKEND_EXTRA = 'models = ["tiny"]'

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
COMPLETION = "/completion"
AUTH = {"Authorization": f"Bearer {KEY}"}
MESSAGES = [{"role": "user", "content": "hi"}]

# The type OpenAI clients branch on, per status.
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",  # as llama-server's own 404
    405: "invalid_request_error",
    413: "invalid_request_error",
}

_UNSET = object()


def chat(**fields: Any) -> dict[str, Any]:
    """A valid chat body (model tiny, 8 tokens) with `fields` overriding; None deletes a field."""
    body: dict[str, Any] = {"model": "tiny", "messages": MESSAGES, "max_tokens": 8}
    body.update(fields)
    return {k: v for k, v in body.items() if v is not None}


@dataclass(frozen=True)
class Case:
    id: str
    status: int
    code: str
    body: Any = None  # dict/list -> JSON; bytes -> sent raw
    path: str = CHAT
    method: str = "POST"
    headers: dict[str, str] = field(default_factory=lambda: dict(AUTH))
    param: Any = _UNSET  # the expected error.param (unchecked when unset)
    chunked: bool = False  # send the body without Content-Length

    @property
    def rid(self) -> str:
        return f"case-{self.id}"

    @property
    def routing(self) -> bool:
        """405 from the router: not a request, so no decision record."""
        return self.status == 405


def _nested(depth: int) -> bytes:
    return b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "x": ' + b"[" * depth + b"]" * depth + b"}"


CASES: list[Case] = [
    # --- the body is not a JSON object ------------------------------------------------------
    Case("bad-json", 400, "invalid_request", b'{"messages": [', param=None),
    Case("invalid-utf8", 400, "invalid_request", b'{"model": "tiny", "messages": [{"role": "user", "content": "\xff\xfe"}]}', param=None),
    Case("array-body", 400, "invalid_request", [{"role": "user", "content": "hi"}], param=None),
    Case("string-body", 400, "invalid_request", "hello", param=None),
    Case("empty-body", 400, "invalid_request", b"", param=None),
    Case(
        "nan-constant",
        400,
        "invalid_request",
        b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": NaN}',
        param=None,
    ),
    Case(
        "duplicate-key",
        400,
        "invalid_request",
        b'{"model": "tiny", "max_tokens": 8, "max_tokens": 4000, "messages": [{"role": "user", "content": "hi"}]}',
        param=None,
    ),
    Case("nested-too-deep", 400, "invalid_request", _nested(70), param=None),
    # --- wrong types --------------------------------------------------------------------------
    Case("messages-string", 400, "invalid_request", chat(messages="hi"), param="messages"),
    # (what llama-server answers 200, the gate forwards: a model or user of another type, stream
    # options without streaming, max_tokens 0, an empty list, any role: test_apis_llama.py SHAPES)
    Case("stream-yes", 400, "invalid_request", chat(stream="yes"), param="stream"),
    Case(
        "include-usage-not-bool",
        400,
        "invalid_request",
        chat(stream=True, stream_options={"include_usage": "yes"}),
        param="stream_options.include_usage",
    ),
    # --- the generation limit -----------------------------------------------------------------
    Case("max-tokens-above-cap", 400, "invalid_request", chat(max_tokens=10**12), param="max_tokens"),
    Case(
        "max-completion-tokens-above-cap",
        400,
        "invalid_request",
        chat(max_tokens=None, max_completion_tokens=CAP + 1),
        param="max_completion_tokens",
    ),
    Case("n-predict-negative", 400, "invalid_request", chat(max_tokens=None, n_predict=-5), param="n_predict"),
    Case("n-predict-unlimited", 400, "invalid_request", chat(max_tokens=None, n_predict=-1), param="n_predict"),
    Case("max-tokens-string", 400, "invalid_request", chat(max_tokens="10"), param="max_tokens"),
    # a small max_tokens for the gate and a big n_predict for llama-server: refused
    Case("unlimited-under-another-name", 400, "invalid_request", chat(n_predict=8, max_tokens=-1), param="max_tokens"),
    Case(
        "n-predict-on-completions-above-cap",
        400,
        "invalid_request",
        {"model": "tiny", "prompt": "hi", "n_predict": CAP + 1},
        path=COMPLETIONS,
        param="n_predict",
    ),
    # --- messages -----------------------------------------------------------------------------
    Case("messages-missing", 400, "invalid_request", chat(messages=None), param="messages"),
    Case("message-not-object", 400, "invalid_request", chat(messages=["hi"]), param="messages[0]"),
    Case("message-without-content", 400, "invalid_request", chat(messages=[{"role": "user"}]), param="messages[0].content"),
    Case("message-without-role", 400, "invalid_request", chat(messages=[{"content": "hi"}]), param="messages[0].role"),
    Case(
        "content-part-without-text",
        400,
        "invalid_request",
        chat(messages=[{"role": "user", "content": [{"type": "text"}]}]),
        param="messages[0].content[0].text",
    ),
    # --- prompts (completions endpoints) --------------------------------------------------------
    Case("prompt-missing-v1-completions", 400, "invalid_request", {"model": "tiny", "max_tokens": 8}, path=COMPLETIONS, param="prompt"),
    Case("prompt-missing-completion", 400, "invalid_request", {"n_predict": 8}, path=COMPLETION, param="prompt"),
    Case(
        "prompt-object-without-text",
        400,
        "invalid_request",
        {"model": "tiny", "prompt": {"x": 1}, "max_tokens": 8},
        path=COMPLETIONS,
        param="prompt",
    ),
    Case("prompt-negative-token", 400, "invalid_request", {"prompt": [1, -3], "n_predict": 8}, path=COMPLETION, param="prompt[1]"),
    # --- completions per prompt: at least one (admission bounds them by the slots) ---------------
    Case("n-0", 400, "invalid_request", chat(n=0), param="n"),
    Case("n-cmpl-0", 400, "invalid_request", {"prompt": "hi", "n_predict": 8, "n_cmpl": 0}, path=COMPLETION, param="n_cmpl"),
    # --- routing by model -----------------------------------------------------------------------
    Case("unknown-model", 400, "model_not_found", chat(model="gpt-4o"), param="model"),
    # --- who is calling, and in which class -----------------------------------------------------
    Case("unknown-class", 400, "invalid_request", chat(), headers={**AUTH, "X-Tokengate-Class": "platinum"}, param="X-Tokengate-Class"),
    Case("bad-api-key", 401, "invalid_api_key", chat(), headers={"Authorization": "Bearer sk-mallory-999"}, param=None),
    Case("missing-api-key", 401, "invalid_api_key", chat(), headers={}, param=None),
    Case("basic-auth", 401, "invalid_api_key", chat(), headers={"Authorization": "Basic YWxpY2U6c2VjcmV0"}, param=None),
    # authentication comes before the body: a bad key with a bad body is still 401
    Case("bad-key-and-bad-json", 401, "invalid_api_key", b"{not json", headers={"Authorization": "Bearer nope"}, param=None),
    Case("class-not-allowed", 403, "class_not_allowed", chat(), headers={**AUTH, "X-Tokengate-Class": "batch"}, param="X-Tokengate-Class"),
    # --- size ---------------------------------------------------------------------------------
    Case("body-too-large", 413, "body_too_large", chat(messages=[{"role": "user", "content": "x" * 2 * MAX_BODY}]), param=None),
    Case(
        "body-too-large-chunked",
        413,
        "body_too_large",
        chat(messages=[{"role": "user", "content": "x" * 2 * MAX_BODY}]),
        chunked=True,
        param=None,
    ),
    # --- routing errors (not requests) ----------------------------------------------------------
    # (A GET on an admitted route, or a path the route table does not list, is forwarded to
    # llama-server now: tests/integration/test_routes.py. A method the gate never forwards is its own 405.)
    Case("trace-on-a-route", 405, "invalid_request", None, method="TRACE"),
]


def _content(case: Case) -> bytes | None:
    if case.body is None:
        return None
    if isinstance(case.body, bytes):
        return case.body
    return json.dumps(case.body).encode()


async def _chunks(data: bytes) -> AsyncIterator[bytes]:
    for i in range(0, len(data), 256):
        yield data[i : i + 256]


async def send(client: httpx.AsyncClient, base: str, case: Case) -> httpx.Response:
    headers = {**case.headers, "X-Request-Id": case.rid}
    content = _content(case)
    if content is not None:
        headers["Content-Type"] = "application/json"
    body: Any = _chunks(content) if case.chunked and content is not None else content
    return await client.request(case.method, base + case.path, content=body, headers=headers)


def check_response(response: httpx.Response, case: Case) -> None:
    assert response.status_code == case.status, (case.id, response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/json")
    payload = response.json()
    assert set(payload) <= {"error", "retry_after_s"}, payload
    error = payload["error"]
    assert set(error) == {"message", "type", "code", "param"}, error
    assert error["code"] == case.code, (case.id, error)
    assert error["type"] == ERROR_TYPES[case.status], (case.id, error)
    assert isinstance(error["message"], str) and error["message"], error
    if case.param is not _UNSET:
        assert error["param"] == case.param, (case.id, error)
    if case.status == 401:
        assert KEY not in response.text and "sk-mallory-999" not in response.text
    if not case.routing:
        assert response.headers["x-request-id"] == case.rid


def check_record(gate, case: Case, response: httpx.Response) -> None:
    record = gate.records.find(case.rid)
    if case.routing:
        assert record is None, record
        return
    assert record is not None, f"no decision record for {case.id}"
    assert (record.outcome, record.reason, record.http_status) == ("refused", case.code, case.status), record
    assert record.reserved_tokens == 0, record
    assert record.endpoint == case.path
    identified = case.headers.get("Authorization") == AUTH["Authorization"] and "X-Tokengate-Class" not in case.headers
    if identified and case.status in (400, 413):
        # Refused for what it sent, not for who sent it: the journal and the console name them.
        assert (record.tenant, record.cls) == ("alice", "interactive"), record


def gate_for(llama):
    return running_gate(llama.url, EXTRA, backend_extra=BACKEND_EXTRA, environ=ENV)


def test_table_is_big_enough():
    assert len(CASES) >= 25
    assert len({c.id for c in CASES}) == len(CASES)
    assert {c.status for c in CASES} == {400, 401, 403, 405, 413}  # the gate's own 404s: test_routes.py


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
async def test_malformed_request(llama_unified, case: Case):
    async with gate_for(llama_unified) as gate, httpx.AsyncClient(timeout=30) as client:
        response = await send(client, gate.url, case)
        check_response(response, case)
        check_record(gate, case, response)
        assert len(gate.records) == (0 if case.routing else 1)
        await released(gate)
        assert gate.in_flight_requests() == 0


def _llama_counters(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line.startswith(("llamacpp:prompt_tokens_total", "llamacpp:tokens_predicted_total", "llamacpp:n_decode_total")):
            name, value = line.split()
            out[name] = float(value)
    return out


async def test_whole_table_at_once_leaves_nothing_behind(llama_unified):
    """All rows concurrently through one gate: a record for each request, no leak, no generation."""
    async with gate_for(llama_unified) as gate, httpx.AsyncClient(timeout=30) as client:
        before = _llama_counters((await client.get(llama_unified.url + "/metrics")).text)
        responses = await asyncio.gather(*(send(client, gate.url, c) for c in CASES))
        for case, response in zip(CASES, responses):
            check_response(response, case)
            check_record(gate, case, response)
        requests = [c for c in CASES if not c.routing]
        assert len(gate.records) == len(requests)
        assert {r.request_id for r in gate.records} == {c.rid for c in requests}
        await released(gate)
        assert gate.in_flight_requests() == 0
        # A valid request still goes through afterwards (the gate is not wedged).
        ok = await client.post(gate.url + CHAT, json=chat(max_tokens=4, ignore_eos=True), headers={**AUTH, "X-Request-Id": "after-table"})
        assert ok.status_code == 200, ok.text
        assert gate.records.find("after-table").outcome == "admitted"
        await released(gate)
        after = _llama_counters((await client.get(llama_unified.url + "/metrics")).text)
        # Only the one valid request generated anything.
        assert after["llamacpp:tokens_predicted_total"] - before["llamacpp:tokens_predicted_total"] == 4
        assert await busy_slots(client, llama_unified.url) == 0
