"""A FAKE llama-server for unit and console tests (no HTTP server): an httpx transport.

Integration tests use the real llama-server; this stands in only where a test
needs a healthy backend's capacity and nothing it would generate.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import httpx

# Two classes, a split 4 x 2048 backend: the gate config most unit and console tests drive.
GATE_CONFIG = """
[budget]
min_tokens = 1024
[[backends]]
url = "http://llama:8080"
kv = "split"
[classes.interactive]
priority = 10
reserved_tokens = 512
queue_depth = 4
[classes.batch]
priority = 1
queue_depth = 8
"""

# The same on a pool of 800 tokens (token_budget) with the auto floor: interactive's 512 is over
# half the ceiling, so R0 puts 400 in force (the tests of what is said about it).
SMALL_POOL_CONFIG = GATE_CONFIG.replace('kv = "split"', 'kv = "split"\ntoken_budget = 800').replace("min_tokens = 1024", "min_tokens = 0")


def fake_llama_transport(slots: Sequence[dict[str, Any]] = (), *, chat_template: int | None = None) -> httpx.MockTransport:
    """Healthy, 4 slots x 2048 tokens, `slots` on /slots, /metrics off (501). `chat_template`:
    it counts tokens too, a word a token (BOS with add_special), and a chat's as its messages'
    words plus that many for the template (None: no count answered)."""

    def handle(request: httpx.Request) -> httpx.Response:
        if chat_template is not None and request.url.path == "/tokenize":
            body = json.loads(request.content)
            return httpx.Response(200, json={"tokens": [1] * bool(body.get("add_special")) + [7] * len(body["content"].split())})
        if chat_template is not None and request.url.path == "/v1/chat/completions/input_tokens":
            words = sum(len(str(m.get("content", "")).split()) for m in json.loads(request.content)["messages"])
            return httpx.Response(200, json={"input_tokens": chat_template + words})
        if request.url.path == "/health":
            return httpx.Response(200, json={"status": "ok"})
        if request.url.path == "/slots":
            return httpx.Response(200, json=list(slots))
        if request.url.path == "/metrics":
            return httpx.Response(501, json={"error": {"message": "metrics disabled"}})
        return httpx.Response(200, json={"total_slots": 4, "default_generation_settings": {"n_ctx": 2048}})

    return httpx.MockTransport(handle)


@contextlib.asynccontextmanager
async def gate_on_fake_llama(
    config: str,
    *,
    environ: Mapping[str, str] | None = None,
    slots: Sequence[dict[str, Any]] = (),
    chat_template: int | None = None,
    journal: str | None = None,
) -> AsyncIterator[Any]:
    """A REAL GateService (not started: no HTTP server) in front of the fake llama-server,
    probed once; its gatekeepers and upstream client are closed on exit. `journal`: its
    recorder writes that file from before the probe (closed on exit)."""
    from gate.config import parse_config
    from gate.journal import Journal
    from gate.service import GateService

    g = GateService(parse_config(config), environ=dict(environ or {}), transport=fake_llama_transport(slots, chat_template=chat_template))
    if journal is not None:
        g.recorder.journal = await Journal.open(journal)
    try:
        await g.backends.probe_all()
        yield g
    finally:
        if g.recorder.journal is not None:
            await g.recorder.journal.close()
        for b in g.backends:
            if b.gatekeeper is not None:
                b.gatekeeper.close()
        await g.client.aclose()
