"""Open-loop Poisson load against the gate, from its own process (benchmarks only).

Arrivals are exponential gaps at --rate per second for --duration seconds,
scheduled in advance and sent whether or not earlier requests have answered
(open loop: a slow gate meets the same arrivals, as a real one would). Each
request is one connection with `Connection: close`, raw asyncio on uvloop, so
the generator costs ~0.1 ms of CPU per request. Latency is measured from the
*scheduled* arrival time, so the generator's own lateness counts against the
gate, never for it. Prints one JSON object: count, statuses, p50/p90/p99/max ms,
how late the generator itself was (lag p99).

    python bench/poisson_load.py --url http://127.0.0.1:18081 --rate 200 --duration 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from urllib.parse import urlsplit

BODY = b'{"messages":[{"role":"user","content":"hello there, how are you"}],"max_tokens":8}'


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * len(s) + 0.5) - 1))]


async def one(host: str, port: int, path: str, cls: str, timeout: float, split: list[float] | None = None) -> int:
    """One request on its own connection; `split` gets the ms to connect, then to the status
    line, then to the answer's end (EOF)."""
    began = time.monotonic()
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    connected = time.monotonic()
    request = (
        f"POST {path} HTTP/1.1\r\nhost: {host}:{port}\r\ncontent-type: application/json\r\n"
        f"x-tokengate-class: {cls}\r\nconnection: close\r\ncontent-length: {len(BODY)}\r\n\r\n"
    ).encode() + BODY
    try:
        writer.write(request)
        status_line = await asyncio.wait_for(reader.readline(), timeout)
        headed = time.monotonic()
        status = int(status_line.split()[1])
        await asyncio.wait_for(reader.read(), timeout)  # to EOF: the whole answer
        if split is not None:
            split.extend(((connected - began) * 1000, (headed - connected) * 1000, (time.monotonic() - headed) * 1000))
        return status
    finally:
        writer.close()


async def run(url: str, rate: float, duration: float, seed: int, cls: str, timeout: float) -> dict:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    path = "/v1/chat/completions"
    rng = random.Random(seed)
    arrivals, t = [], 0.0
    while True:
        t += rng.expovariate(rate)
        if t >= duration:
            break
        arrivals.append(t)
    loop = asyncio.get_running_loop()
    start = loop.time() + 0.2
    latencies: list[float] = []
    lags: list[float] = []
    splits: dict[float, list[float]] = {}  # scheduled moment -> connect, to status, to EOF (ms)
    statuses: dict[str, int] = {}

    async def fire(at: float) -> None:
        lags.append((loop.time() - at) * 1000)
        split: list[float] = []
        splits[at] = split
        try:
            status = str(await one(host, port, path, cls, timeout, split))
        except (TimeoutError, OSError, ValueError, IndexError) as exc:
            status = f"error:{type(exc).__name__}"
        statuses[status] = statuses.get(status, 0) + 1
        latencies.append((loop.time() - at) * 1000)
        split.append(latencies[-1])

    tasks = []
    for offset in arrivals:
        at = start + offset
        delay = at - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(fire(at)))
    await asyncio.gather(*tasks)
    ok = statuses.get("200", 0)
    return {
        "rate": rate,
        "duration_s": duration,
        "seed": seed,
        "sent": len(arrivals),
        "ok": ok,
        "non_200": len(arrivals) - ok,
        "statuses": statuses,
        "p50_ms": pct(latencies, 50),
        "p90_ms": pct(latencies, 90),
        "p99_ms": pct(latencies, 99),
        "max_ms": max(latencies) if latencies else None,
        "generator_lag_p99_ms": pct(lags, 99),
        # a slow request's time split: the generator's own lateness (its loop) and the TCP
        # connect (the gate's accept queue), beside the rest (the gate's answer)
        "generator_lag_max_ms": max(lags) if lags else None,
        "generator_late_50ms": sum(1 for x in lags if x > 50.0),
        "connect_p99_ms": pct([v[0] for v in splits.values() if len(v) == 4], 99),
        "connect_max_ms": max((v[0] for v in splits.values() if len(v) == 4), default=None),
        # the slowest 1%: where their time went (medians): connect, then the status line, then EOF
        "slowest_split_ms": slowest_split(list(splits.values())),
    }


def slowest_split(splits: list[list[float]]) -> dict | None:
    done = sorted((v for v in splits if len(v) == 4), key=lambda v: v[3])
    top = done[-max(1, len(done) // 100) :] if done else []
    if not top:
        return None
    return {name: round(sorted(v[i] for v in top)[len(top) // 2], 1) for i, name in enumerate(("connect", "to_status", "to_eof", "total"))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True)
    ap.add_argument("--rate", type=float, required=True)
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--cls", default="interactive")
    ap.add_argument("--timeout", type=float, default=120.0)
    args = ap.parse_args(argv)
    try:
        import uvloop

        result = uvloop.run(run(args.url, args.rate, args.duration, args.seed, args.cls, args.timeout))
    except ImportError:
        result = asyncio.run(run(args.url, args.rate, args.duration, args.seed, args.cls, args.timeout))
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    started = time.monotonic()
    sys.exit(main())
