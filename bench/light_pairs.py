"""What the gate adds to a first token at light load, in quiet pairs (#25's light-load target).

One llama-server (the test model, as bench/overload.py starts it) and one `tokengate serve`
with the example config in front of it. Requests go one at a time, alternating straight and
through the gate (the order flipped every pair, so neither arm always follows the other; each
request its own prompt, so none finds another's KV cached), so no request overlaps another: what differs within a pair is the gate, not the host's load at
that moment. TTFT is the time to the first chunk with content, as aiperf and the OpenAI SDK
read it; each request a new connection (llama-server closes one after a streamed answer).

Reports each arm's TTFT p50/p95, the paired differences (gate - straight) p50/mean, and from
the gate's journal where its part went: arrival to dispatch, and dispatch to first token.
Sequential pairs take the CPU contention of overlapping requests out: bench/aiperf_client.py's
light cells measure that (Poisson arrivals, aiperf's own workers on the same 2 cores).

    PYTHONPATH=. .venv/bin/python bench/light_pairs.py [--pairs 100] [--model-size default]

Writes bench/results/light_pairs.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from bench.overload import CHAT, Gate, pct, start_llama  # noqa: E402
from bench.served_in_time import gate_toml, prompt  # noqa: E402
from tests.llama.make_model import cached_model  # noqa: E402
from tests.llama.server import find_llama_server  # noqa: E402


async def ttft(client: httpx.AsyncClient, url: str, i: int, words: int, max_tokens: int) -> float | None:
    body = {"messages": [{"role": "user", "content": prompt(i, words)}], "max_tokens": max_tokens, "stream": True, "ignore_eos": True}
    t = time.perf_counter()
    first = None
    async with client.stream("POST", url + CHAT, json=body) as r:
        async for line in r.aiter_lines():
            # the first chunk with text: the role-only opening chunk is not a token
            if first is None and line.startswith("data:") and '"content":"' in line and '"content":""' not in line:
                first = time.perf_counter() - t
    return first


async def pairs(straight: str, gated: str, n: int, words: int, max_tokens: int) -> tuple[list[float], list[float]]:
    a: list[float] = []
    b: list[float] = []
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_keepalive_connections=0)) as client:
        for i in range(3):  # warm both paths (the gate's first request opens its pools)
            await ttft(client, straight, 10_000 + i, words, max_tokens)
            await ttft(client, gated, 20_000 + i, words, max_tokens)
        for i in range(n):
            order = ((straight, a), (gated, b)) if i % 2 else ((gated, b), (straight, a))
            # each its own prompt: the same one twice would find the first's KV cached for the second
            got = [(arm, await ttft(client, url, 2 * i + (arm is b), words, max_tokens)) for url, arm in order]
            if all(v is not None for _, v in got):
                for arm, v in got:
                    arm.append(v)  # type: ignore[arg-type]
    return a, b


def journal_parts(journal: Path, last: int) -> dict:
    conn = sqlite3.connect(f"file:{journal}?mode=ro", uri=True)
    try:
        rows = conn.execute(
            "SELECT queue_ms, ttft_ms, ttft_arrival_ms FROM decisions WHERE ttft_ms IS NOT NULL ORDER BY ts DESC LIMIT ?", (last,)
        ).fetchall()
    finally:
        conn.close()
    waits = [r[0] or 0.0 for r in rows]
    dispatch = [r[1] for r in rows]
    arrival = [r[2] for r in rows if r[2] is not None]
    return {
        "requests": len(rows),
        "arrival_to_dispatch_ms_p50": statistics.median([a - d for a, d in zip(arrival, dispatch, strict=False)]) if arrival else None,
        "queue_ms_p50": statistics.median(waits) if waits else None,
        "dispatch_to_first_token_ms_p50": statistics.median(dispatch) if dispatch else None,
        "arrival_to_first_token_ms_p50": statistics.median(arrival) if arrival else None,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=100)
    ap.add_argument("--words", type=int, default=30)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--model-size", default="default")
    ap.add_argument("--count-first", action="store_true", help="forward_beside_count = false: count, then forward")
    ap.add_argument("--out", default=str(HERE / "results" / "light_pairs.json"))
    args = ap.parse_args(argv)
    load_before = round(os.getloadavg()[0], 2)
    srv = start_llama(find_llama_server(), cached_model(args.model_size))
    workdir = Path(tempfile.mkdtemp(prefix="tokengate-light-pairs-"))
    gate = Gate(gate_toml(srv.url, None, beside=not args.count_first), workdir).start()
    try:
        a, b = asyncio.run(pairs(srv.url, gate.url, args.pairs, args.words, args.max_tokens))
        time.sleep(1.0)  # the last rows' group commit
        parts = journal_parts(workdir / "journal.db", len(b))
    finally:
        gate.stop()
        srv.stop()
    diffs = [y - x for x, y in zip(a, b, strict=True)]
    report = {
        "command": " ".join(["PYTHONPATH=. .venv/bin/python bench/light_pairs.py", *(argv if argv is not None else sys.argv[1:])]),
        "pairs": len(a),
        "loadavg_1m_before": load_before,
        "loadavg_1m_after": round(os.getloadavg()[0], 2),
        "straight_ttft_ms": {"p50": 1000 * (pct(a, 0.5) or 0), "p95": 1000 * (pct(a, 0.95) or 0)},
        "gate_ttft_ms": {"p50": 1000 * (pct(b, 0.5) or 0), "p95": 1000 * (pct(b, 0.95) or 0)},
        "added_ms": {
            "p50_of_arms": 1000 * ((pct(b, 0.5) or 0) - (pct(a, 0.5) or 0)),
            "p95_of_arms": 1000 * ((pct(b, 0.95) or 0) - (pct(a, 0.95) or 0)),
            "paired_median": 1000 * statistics.median(diffs),
            "paired_mean": 1000 * statistics.mean(diffs),
        },
        "gate_journal": parts,
    }
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
