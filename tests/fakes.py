"""A FAKE llama-server for unit and console tests (no HTTP server): an httpx transport.

Integration tests use the real llama-server; this stands in only where a test
needs a healthy backend's capacity and nothing it would generate.
"""

from __future__ import annotations

import contextlib
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


def fake_llama_transport(slots: Sequence[dict[str, Any]] = ()) -> httpx.MockTransport:
    """Healthy, 4 slots x 2048 tokens, `slots` on /slots, /metrics off (501)."""

    def handle(request: httpx.Request) -> httpx.Response:
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
    config: str, *, environ: Mapping[str, str] | None = None, slots: Sequence[dict[str, Any]] = ()
) -> AsyncIterator[Any]:
    """A REAL GateService (not started: no HTTP server) in front of the fake llama-server,
    probed once; its gatekeepers and upstream client are closed on exit."""
    from gate.config import parse_config
    from gate.service import GateService

    g = GateService(parse_config(config), environ=dict(environ or {}), transport=fake_llama_transport(slots))
    try:
        await g.backends.probe_all()
        yield g
    finally:
        for b in g.backends:
            if b.gatekeeper is not None:
                b.gatekeeper.close()
        await g.client.aclose()
