"""A herd that obeys Retry-After (R1, gate/core/admission.py): how many tries it takes to be served.

Against the REAL llama-server (tests/llama: the tiny model, 4 slots, the unified 2,048-token
pool) and ``tokengate serve`` with ``tokengate config example`` (only the addresses changed):
first 8 rounds of 4 requests, so the gate has measured its slots' holds; then N clients sent at
one instant, each a streamed chat completion of 24 tokens that, on a 429 or 503, sleeps the
``retry-after-ms`` it was told and tries again, up to 20 tries. A herd told one figure comes back
as one and is refused as one again; R1 tells the k-th refusal of a second k slot-frees more.

Per herd: tries in all, the most one client needed, how many distinct figures the first refusals
were told (and their range), when the last client was served. Writes bench/results/retry_herd.json.

    PYTHONPATH=. .venv/bin/python bench/retry_herd.py [--herds 40,60]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path

import httpx

from bench.overload import Gate, start_llama
from bench.served_in_time import gate_toml
from tests.llama.make_model import cached_model
from tests.llama.server import find_llama_server

MAX_TRIES = 20
CHAT = "/v1/chat/completions"


def _body(tag: str) -> dict:
    return {"messages": [{"role": "user", "content": f"herd {tag} " * 12}], "max_tokens": 24, "stream": True}


async def _client(c: httpx.AsyncClient, url: str, i: int, t0: float, first_told: list[int]) -> tuple[int, float | None]:
    """(tries, seconds until served, None if never) for one obeying client."""
    for k in range(1, MAX_TRIES + 1):
        r = await c.post(url + CHAT, json=_body(str(i)))
        if r.status_code not in (429, 503):
            return k, time.perf_counter() - t0
        ms = int(r.headers["retry-after-ms"])
        if k == 1:
            first_told.append(ms)
        await asyncio.sleep(ms / 1000)
    return MAX_TRIES, None


async def herd(url: str, n: int) -> dict:
    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=n + 8)) as c:
        for round_ in range(8):  # holds measured past the cold start: R1's spacing is the mean hold / slots
            await asyncio.gather(*(c.post(url + CHAT, json=_body(f"warm{round_}.{j}")) for j in range(4)))
        first_told: list[int] = []
        t0 = time.perf_counter()
        results = await asyncio.gather(*(_client(c, url, i, t0, first_told) for i in range(n)))
    tries = sorted(t for t, _ in results)
    served = [s for _, s in results if s is not None]
    return {
        "clients": n,
        "served": len(served),
        "tries_in_all": sum(tries),
        "most_tries_by_one": tries[-1],
        "tries_p50": tries[len(tries) // 2],
        "first_retry_after_ms_distinct": len(set(first_told)),
        "first_retry_after_ms_range": [min(first_told), max(first_told)] if first_told else None,
        "last_served_s": round(max(served), 2) if served else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--herds", default="40,60", help="herd sizes, comma-separated (default 40,60)")
    args = ap.parse_args()
    binary, model = find_llama_server(), cached_model("default")
    out = {"command": "PYTHONPATH=. .venv/bin/python bench/retry_herd.py --herds " + args.herds, "herds": []}
    for n in (int(x) for x in args.herds.split(",")):
        srv = start_llama(binary, model)
        gate = Gate(gate_toml(srv.url, None), Path(tempfile.mkdtemp(prefix="tg-herd-"))).start()
        try:
            result = asyncio.run(herd(gate.url, n))
        finally:
            gate.stop()
            srv.stop()
        result["load_average"] = round(os.getloadavg()[0], 2)
        print(json.dumps(result), flush=True)
        out["herds"].append(result)
    path = Path(__file__).parent / "results" / "retry_herd.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
