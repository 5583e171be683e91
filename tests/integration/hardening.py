"""Shared parts of the hardening tests (issue #11): one tenant config, the checks every row ends with.

Every row of every table asserts the status, the error code, that the ledger is back
at 0, and that the gate still answers a normal request afterwards (`still_serves`).
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from tests.integration.gate_harness import ledger_total, wait_until, words

KEY = "sk-alice-123"
ENV = {"ALICE_KEY": KEY}
AUTH = {"Authorization": f"Bearer {KEY}"}
CHAT = "/v1/chat/completions"
MODEL = "tiny"

TENANTS = """
[classes.interactive]
priority = 10
[classes.batch]
priority = 1

[[tenants]]
name = "alice"
api_key_env = "ALICE_KEY"
class = "interactive"
allowed_classes = ["interactive", "batch"]
"""
BACKEND_EXTRA = f'models = ["{MODEL}"]'


def chat(max_tokens: int = 8, stream: bool = False, **extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": words(8)}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": stream,
        **extra,
    }


def assert_error(r: httpx.Response, status: int, code: str, param: str | None = None) -> dict[str, Any]:
    """An OpenAI-shaped error with this status and code, and nothing that names a backend."""
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["content-type"].startswith("application/json"), r.headers
    body = r.json()
    err = body["error"]
    assert err["code"] == code, body
    assert set(err) >= {"message", "type", "code", "param"}, body
    if param is not None:
        assert err["param"] == param, body
    assert "127.0.0.1" not in r.text and "localhost" not in r.text, r.text
    return err


async def still_serves(gate, client: httpx.AsyncClient, headers: dict[str, str] | None = None) -> None:
    """The ledger is back at 0 and a normal request is answered 200."""
    await wait_until(lambda: ledger_total(gate) == 0 and gate.in_flight_requests() == 0, timeout_s=10)
    r = await client.post(gate.url + CHAT, json=chat(4), headers=headers if headers is not None else AUTH)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] is not None
    await wait_until(lambda: ledger_total(gate) == 0, timeout_s=10)


async def record_of(gate, request_id: str, timeout_s: float = 5.0):
    await wait_until(lambda: gate.records.find(request_id) is not None, timeout_s=timeout_s)
    return gate.records.find(request_id)


def data_events(lines: list[str]) -> list[str]:
    return [line[5:].strip() for line in lines if line.startswith("data:")]


def last_event_error(lines: list[str]) -> dict[str, Any]:
    events = data_events(lines)
    assert events and "[DONE]" not in events, events[-3:]
    return json.loads(events[-1])["error"]
