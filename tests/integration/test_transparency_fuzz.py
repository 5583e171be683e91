"""Odd bodies answer through the gate as llama-server answers them straight (the real one).

A deterministic mutation set: a valid body of each admitted API, with one field set to each
of a palette of odd values (a number where a string goes, a string where a number goes, a
float, a boolean, an empty list or object, null) or removed, for the fields llama-server or the
gate reads. Each goes straight to llama-server and through the gate. Where llama-server answers
2xx or 4xx the gate must answer the same class (4xx with the same status); where llama-server
answers 5xx for the caller's mistake the gate may answer its own 400 naming the field instead.
The only other differences allowed are the gate's admission rules, each named below. A scan of
this kind found 19 such bodies refused by the gate on 2026-12-05 (an empty `messages`, a role no
template knows, `max_tokens: 0`, ...), then 151 more and a limit llama-server dropped on
/v1/messages (471 tokens ran on a reservation of 5): tests/integration/test_apis_llama.py SHAPES
holds those cases one by one; this is the net for the ones nobody has thought of.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from tests.integration.gate_harness import released, running_gate
from tests.llama.server import LlamaServer

pytestmark = pytest.mark.llama

CLASSES = """
[classes.interactive]
priority = 10
default_max_tokens = 4
max_tokens_cap = 64
"""
CAP = 64
MSG = [{"role": "user", "content": "hi there"}]
BASES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"messages": MSG, "max_tokens": 2},
    "/v1/completions": {"prompt": "hi there", "max_tokens": 2},
    "/completion": {"prompt": "hi there", "n_predict": 2},
    "/v1/messages": {"messages": MSG, "max_tokens": 2},
    "/v1/responses": {"input": "hi there", "max_output_tokens": 2},
}
_ABSENT = object()
PALETTE: list[Any] = [0, -1, 1.5, "x", [], {}, [1], True, None, 10**6, _ABSENT]
#: the fields the gate reads (on every admitted API, then each API's own): a field it never
#: reads it forwards as sent, so llama-server's answer to it is the gate's by construction
COMMON = ("stream", "stream_options", "n", "n_cmpl", "n_predict", "max_completion_tokens", "max_tokens", "model", "user")
OWN = {
    "/v1/chat/completions": ("messages",),
    "/v1/completions": ("prompt",),
    "/completion": ("prompt",),
    "/v1/messages": ("messages", "system", "metadata"),
    "/v1/responses": ("input", "max_output_tokens", "previous_response_id", "instructions"),
}
LIMITS = ("n_predict", "max_completion_tokens", "max_tokens", "max_output_tokens")


def _cases() -> list[tuple[str, str, dict[str, Any]]]:
    out = []
    for path, base in BASES.items():
        for name in (*COMMON, *OWN[path]):
            for value in PALETTE:
                body = dict(base)
                if value is _ABSENT:
                    body.pop(name, None)
                else:
                    body[name] = value
                label = f"{name}={'<absent>' if value is _ABSENT else json.dumps(value)}"
                out.append((path, label, body))
        if "messages" in base:
            for name in ("role", "content", "name", "tool_calls"):
                for value in PALETTE:
                    message = dict(MSG[0])
                    if value is _ABSENT:
                        message.pop(name, None)
                    else:
                        message[name] = value
                    out.append(
                        (
                            path,
                            f"messages[0].{name}={json.dumps(value) if value is not _ABSENT else '<absent>'}",
                            {**base, "messages": [message]},
                        )
                    )
    return out


def _admission_rule(path: str, body: dict[str, Any]) -> bool:
    """The gate's own refusals where llama-server answers: a generation limit of -1 ("until the
    context is full": the gate needs a bound) or over the class cap, under any name."""
    for name in LIMITS:
        value = body.get(name)
        if isinstance(value, (int, float)) and (int(value) == -1 or int(value) > CAP):
            return True
    return False


@pytest.fixture(scope="module")
def llama_short(llama_bin, tmp_path_factory):
    """llama-server on the fast tiny model whose own default limit is short (`-n 4`): a body
    without a limit (the gate injects the class's 4) must not run to the end of the context
    straight, or this takes minutes."""
    from tests.llama.make_model import cached_model

    log = tmp_path_factory.mktemp("llama") / "llama-server-short.log"
    model = cached_model("fast")
    server = LlamaServer(llama_bin, model, mode="unified", ctx=2048, n_slots=4, log_path=log, extra_args=("-n", "4"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


async def test_odd_bodies_answer_as_llama_server_answers_them(llama_short):
    cases = _cases()
    assert len(cases) > 500
    unexpected = []
    async with running_gate(llama_short.url, CLASSES) as gate, httpx.AsyncClient(timeout=60) as client:
        for path, label, body in cases:
            straight, through = await asyncio.gather(
                client.post(llama_short.url + path, json=body), client.post(gate.url + path, json=body)
            )
            s, g = straight.status_code, through.status_code
            assert g < 500 or s >= 500, (path, label, s, g, through.text[:200])  # never a 5xx of the gate's own
            same = s == g or (s // 100 == g // 100 == 2)
            if same or (s >= 500 and g == 400):
                continue
            if g == 400 and s < 300 and _admission_rule(path, body):
                continue
            unexpected.append((path, label, s, g, through.text[:120]))
        await released(gate)
    assert not unexpected, "\n".join(map(str, unexpected))
