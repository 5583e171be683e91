"""`tokengate replay` against the real llama-server (#24): record a run at config A, replay
it at A and under config B (a smaller token budget).

Load: 40 requests alternating interactive and batch, each
30 prompt words and 24 generated tokens (ignore_eos), arriving at OVERLOAD (3x) the rate the
4 slots serve them as measured just before, so the burst queues and refuses (queue_full,
queue_timeout) at A on a quiet host and a busy one alike. A: static budget 1,400 tokens on the
4-slot, 2,048-token unified pool; B: the same with a budget of 200 (two requests at once).

What is asserted: the gate writes what replay needs (schema v4); every recorded arrival gets
one outcome in each scenario; the replay is deterministic; B is predicted to admit no more than
A. Not asserted, because the replay is not yet close enough on a shared 2-core machine (issue
#24 stays open on it): the calibration against what happened (printed; measured: refusals per
class off by 0-16 of 20, interactive queue-wait p95 off by 7-120%), and B run for real (the
same arrivals at B admitted 5 to 43 of 43 in three runs: the host's speed moved more than B).
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import time
from pathlib import Path

import httpx
import pytest

from gate.tools.replay import load_window, proposal_from_set, run_replay
from tests.integration.gate_harness import released, running_gate, words

pytestmark = pytest.mark.llama

CHAT = "/v1/chat/completions"
N, GEN, PROMPT_WORDS = 40, 24, 30
#: arrivals at this multiple of what the 4 slots serve (measured by _warm), whatever the host's
#: speed: a fixed spacing (80 ms) overloaded a busy host and left a quiet one idle (no refusal)
OVERLOAD = 3.0


def config(budget: int) -> str:
    return """
[budget]
mode = "static"
min_tokens = 128
slo_ttft_p95_ms = 3000
aging_s = 0

[classes.interactive]
priority = 10
reserved_tokens = 64
queue_depth = 8
queue_timeout_s = 4

[classes.batch]
priority = 1
queue_depth = 4
queue_timeout_s = 3
"""


BACKEND = {"A": "token_budget = 1400"}


def _body() -> dict:
    return {"messages": [{"role": "user", "content": words(PROMPT_WORDS)}], "max_tokens": GEN, "ignore_eos": True, "stream": True}


async def one_now(client: httpx.AsyncClient, url: str, cls: str) -> int:
    async with client.stream("POST", url + CHAT, json=_body(), headers={"X-Tokengate-Class": cls}) as r:
        await r.aread()
        return r.status_code


async def _run(url: str, journal: str, which: str, spacing_s: float) -> None:
    async with running_gate(url, config(0), backend_extra=BACKEND[which], journal_path=journal) as gate:
        async with httpx.AsyncClient(timeout=60) as client:
            t0 = time.monotonic()

            async def one(i: int) -> int:
                await asyncio.sleep(max(0.0, t0 + i * spacing_s - time.monotonic()))
                cls = "interactive" if i % 2 == 0 else "batch"
                body = {
                    "messages": [{"role": "user", "content": words(PROMPT_WORDS)}],
                    "max_tokens": GEN,
                    "ignore_eos": True,
                    "stream": True,
                }
                async with client.stream("POST", gate.url + CHAT, json=body, headers={"X-Tokengate-Class": cls}) as r:
                    body_bytes = b"".join([chunk async for chunk in r.aiter_bytes()])
                    assert r.status_code != 400, body_bytes[:300]
                    return r.status_code

            # A quiet prelude (one request alone, then two at once), as an incident window has
            # before its burst: it shows the fit how decode speed depends on occupancy.
            prelude = [await one_now(client, gate.url, "interactive")]
            prelude += await asyncio.gather(one_now(client, gate.url, "interactive"), one_now(client, gate.url, "batch"))
            t0 = time.monotonic()
            codes = prelude + list(await asyncio.gather(*(one(i) for i in range(N))))
        assert set(codes) <= {200, 429, 503}, codes
        await released(gate)


async def _warm(url: str) -> float:
    """A fresh llama-server's first requests are slow (a first run fitted a 4.7 s TTFT from them,
    against ~0.25 s after): warm every slot before recording, straight at llama-server. Returns
    the arrival spacing that loads the 4 slots OVERLOAD times over, from the last round's time."""
    async with httpx.AsyncClient(timeout=60) as client:
        body = {"messages": [{"role": "user", "content": words(PROMPT_WORDS)}], "max_tokens": GEN, "ignore_eos": True}
        took = 0.0
        for _ in range(3):
            start = time.monotonic()
            await asyncio.gather(*(client.post(url + CHAT, json=body) for _ in range(4)))
            took = time.monotonic() - start
    return min(0.2, max(0.005, took / 4 / OVERLOAD))


async def test_a_real_journal_replays_completely_and_deterministically(llama_unified, tmp_path: Path) -> None:
    ja = str(tmp_path / "a.db")
    spacing_s = await _warm(llama_unified.url)
    await _run(llama_unified.url, ja, "A", spacing_s)
    window = load_window(ja)
    # Schema v4 as the gate writes it: the first token from arrival and from dispatch, apart by
    # the queue wait; the thresholds in force recorded once, before the window.
    with sqlite3.connect(ja) as conn:
        rows = conn.execute("SELECT queue_ms, ttft_ms, ttft_arrival_ms FROM decisions WHERE outcome = 'admitted'").fetchall()
        (in_force,) = conn.execute("SELECT count(*) FROM audit WHERE action = 'config_in_force'").fetchone()
    assert rows and in_force == 1
    for queue_ms, ttft_ms, ttft_arrival_ms in rows:
        assert ttft_arrival_ms >= queue_ms + ttft_ms - 1.0, (queue_ms, ttft_ms, ttft_arrival_ms)
    b = proposal_from_set("backend.token_budget=200", window.config)
    answer = run_replay(window, [b])
    rec_a, rep_a, pred_b = (s["classes"] for s in answer["scenarios"])
    report = {"fit": answer["fit"], "A": rec_a, "A_replayed": rep_a, "B_predicted": pred_b}
    if os.environ.get("TOKENGATE_REPLAY_REPORT"):
        Path(os.environ["TOKENGATE_REPLAY_REPORT"]).write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=1))
    # The burst must have queued and refused at A, or the test proves nothing.
    assert sum(sum(c["refused"].values()) for c in rec_a.values()) >= 4, rec_a
    # Every recorded arrival gets exactly one outcome in each scenario.
    for scenario in (rep_a, pred_b):
        for cls in rec_a:
            assert scenario[cls]["arrivals"] == rec_a[cls]["arrivals"], (cls, rec_a[cls], scenario[cls])
            assert scenario[cls]["admitted"] + sum(scenario[cls]["refused"].values()) == scenario[cls]["arrivals"]
    # The same journal and thresholds give the same answer.
    assert run_replay(window, [b])["scenarios"] == answer["scenarios"]
    # B (two requests at once where A held four) is predicted to admit no more than A replayed.
    assert sum(c["admitted"] for c in pred_b.values()) <= sum(c["admitted"] for c in rep_a.values()), report
