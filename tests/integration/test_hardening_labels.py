"""Bounded metric labels (#11): label values come only from configured names, anything else is "other".

Before the fix the client's ``model`` became a label of
``admission_control_denials_total``: 300 refused requests with random 20 kB model
names grew /metrics from 16 kB to 12.4 MB.
"""

from __future__ import annotations

import os

import httpx
import pytest

from tests.integration.gate_harness import running_gate
from tests.integration.hardening import AUTH, BACKEND_EXTRA, CHAT, ENV, TENANTS, assert_error, chat, still_serves

pytestmark = pytest.mark.llama

HOSTILE = [
    # (id, request fields / headers that vary per request, expected status, code)
    ("random-model", lambda i: ({"model": os.urandom(10_000).hex()}, {}), 400, "model_not_found"),
    ("random-class", lambda i: ({}, {"X-Tokengate-Class": f"c{i}-" + "x" * 2000}), 400, "invalid_request"),
    ("random-key", lambda i: ({}, {"Authorization": f"Bearer sk-{i}-" + "k" * 2000}), 401, "invalid_api_key"),
]


@pytest.mark.parametrize(("name", "vary", "status", "code"), HOSTILE, ids=[h[0] for h in HOSTILE])
async def test_hostile_names_do_not_grow_metrics(llama_split, name, vary, status, code):
    async with (
        running_gate(llama_split.url, TENANTS, environ=ENV, kv="split", backend_extra=BACKEND_EXTRA) as gate,
        httpx.AsyncClient(timeout=30) as client,
    ):
        await still_serves(gate, client)
        before = len((await client.get(gate.url + "/metrics")).content)
        for i in range(300):
            fields, headers = vary(i)
            r = await client.post(gate.url + CHAT, json=chat(4, **fields), headers={**AUTH, **headers})
            assert_error(r, status, code)
        text = (await client.get(gate.url + "/metrics")).text
        # One new series per counter at most (the "other"/"" value), never one per request.
        assert len(text) < before + 8_000, (before, len(text))
        for line in text.splitlines():
            if line.startswith("admission_control_denials_total{"):
                labels = line[line.index("{") + 1 : line.index("}")]
                model = labels.split('model="')[1].split('"')[0]
                assert model in ("tiny", "other", ""), line
                cls = labels.split('priority_class="')[1].split('"')[0]
                assert cls in ("interactive", "batch", "other", ""), line
        await still_serves(gate, client)
