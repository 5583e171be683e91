"""What a chaos run against the gate in front of the real llama-server found (hostile input
and client behaviour mixed under load): each test is one finding, kept as a regression test."""

from __future__ import annotations

import httpx
import pytest

from tests.integration.gate_harness import released, running_gate, wait_until
from tests.llama.server import LlamaServer

pytestmark = pytest.mark.llama

EXTRA = """
[classes.interactive]
priority = 10
default_max_tokens = 16
max_tokens_cap = 256
"""

MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def llama_embed(llama_bin, tmp_path_factory):
    """The fast test model, serving chat and embeddings (`--embeddings --pooling mean`)."""
    from tests.llama.make_model import cached_model

    log = tmp_path_factory.mktemp("llama") / "llama-server-chaos.log"
    server = LlamaServer(
        llama_bin, cached_model("fast"), mode="split", ctx=2048, n_slots=4, log_path=log, extra_args=("--embeddings", "--pooling", "mean")
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.parametrize("n", [2**62, 2**63, 1e300])
@pytest.mark.parametrize("path", ["/completion", "/v1/chat/completions", "/v1/responses"])
async def test_a_huge_n_is_not_expanded_task_by_task(llama_unified, path, n):
    """A client's `"n": 2147483648` made the gate list every copy of the prompt (a tuple of
    2^31 counts): 19 GB and the gate OOM-killed; 2^63 or 1e300 answered 500 internal_error
    (OverflowError). The request holds every slot (more tasks than slots) and llama-server
    answers it, as it answers n = 5 on 4 slots: its own 400."""
    body = {"prompt": "hi", "messages": MESSAGES, "input": "hi", "max_tokens": 4, "n_predict": 4, "max_output_tokens": 4, "n": n}
    async with running_gate(llama_unified.url, EXTRA) as gate:
        async with httpx.AsyncClient(timeout=30) as client:
            r = await client.post(gate.url + path, json=body)
            assert r.status_code == 400, r.text
            assert "internal" not in r.text
        await released(gate)


TOOLS = [
    None,
    [],
    1,
    "x",
    {},
    [1],
    [None],
    [{}],
    [{"type": None}],
    [{"type": "function"}],
    [{"type": "other", "function": {"name": "f"}}],
    [{"type": "function", "function": None}],
    [{"type": "function", "function": []}],
    [{"type": "function", "function": {}}],
    [{"type": "function", "function": {"name": 1}}],
    [{"type": "function", "function": {"name": "f"}}],
    [{"type": "function", "function": {"name": "f", "description": 1}}],
    [{"type": "function", "function": {"name": "f", "description": None}}],
    [{"type": "function", "function": {"name": "f", "description": "d", "parameters": 1}}],
    [{"type": "function", "function": {"name": "f", "parameters": None}}],
]
ENCODING_FORMATS = [0, None, [], {}, "x", "float", "base64"]


async def test_malformed_tools_and_encoding_format_are_the_callers_400_not_a_backend_failure(llama_embed):
    """llama-server answers 500 server_error for a chat's malformed `tools` ("Failed to parse
    tools: ...") and an embedding's `encoding_format` that is not a string. Relayed, each was
    journaled `failed upstream_error` and paged the on-call (TokengateUpstream5xx) for a
    caller's typo. The gate answers those 400 invalid_request; what llama-server serves still
    passes, checked value by value against llama-server itself."""
    chat = {"messages": MESSAGES, "max_tokens": 1}
    async with running_gate(llama_embed.url, EXTRA) as gate:
        async with httpx.AsyncClient(timeout=30) as client:
            cases = [("/v1/chat/completions", {**chat, "tools": t}) for t in TOOLS]
            cases += [("/v1/embeddings", {"input": "hi", "encoding_format": e}) for e in ENCODING_FORMATS]
            for i, (path, body) in enumerate(cases):
                direct = await client.post(llama_embed.url + path, json=body)
                r = await client.post(gate.url + path, json=body, headers={"X-Request-Id": f"case-{i}"})
                if direct.status_code == 500:
                    assert r.status_code == 400, (body, r.text)
                    assert r.json()["error"]["code"] == "invalid_request", r.text
                else:
                    assert r.status_code == direct.status_code, (body, r.text)
                await wait_until(lambda i=i: gate.records.find(f"case-{i}") is not None)
                assert gate.records.find(f"case-{i}").outcome != "failed", body
        await released(gate)
