"""What a chaos run against the gate in front of the real llama-server found (hostile input
and client behaviour mixed under load): each test is one finding, kept as a regression test."""

from __future__ import annotations

import httpx
import pytest

from tests.integration.gate_harness import released, running_gate

pytestmark = pytest.mark.llama

EXTRA = """
[classes.interactive]
priority = 10
default_max_tokens = 16
max_tokens_cap = 256
"""

MESSAGES = [{"role": "user", "content": "hi"}]


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
