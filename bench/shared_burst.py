"""Shared tenant limits during bursts on a busy host (#23): the wait on Redis, and the quota held.

Two parts, both beside CPU hogs (busy loops, --hogs of them, each ending by itself after
the run's length plus a margin, killed at the end) and a real redis-server on loopback:

1. Fleet: two `tokengate serve` processes ([shared] as tests/integration/fleet.py's
   fleet_extra writes it: wait_ms 250, renew_interval_s 0.5, fail_open; not the defaults,
   as this said before) in front of a FAKE upstream (tests/integration/
   fake_upstream.py, slow mode: not llama-server; it answers after --delay-ms and counts
   the requests in progress). One tenant may hold 3 requests' worth of tokens fleet-wide.
   Every --wave-ms, --burst requests to each gate at once, for --seconds. Reports the most
   requests in progress (the quota is 3), the gates' wait on Redis per reservation (their
   tokengate_shared_limit_wait_seconds histograms merged, as bucket bounds), requests the
   failure policy decided and flips (both must be 0: Redis answered), script calls per
   reservation and Redis's own time per call (INFO commandstats).
2. In-process: SharedLimits alone on this process's loop, bursts of --inprocess-burst
   reservations (each after 0.3 ms of CPU work, as a request's token count and body
   checks cost) every 100 ms for --inprocess-seconds: the exact p50/p99 of each
   reservation's wait (what admission waits: the rest of the burst's turn, the round trip
   and the loop's lag), of the round trip alone (the script call sent to its answer
   read), the loop's lag measured beside it (a 5 ms timer's lateness), script calls per
   reservation, flips.

    PYTHONPATH=. .venv/bin/python bench/shared_burst.py [--seconds 20] [--hogs 3]

Writes bench/results/shared_burst.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

import httpx  # noqa: E402
import redis.asyncio as aioredis  # noqa: E402

from bench.shared_overhead import bucket_quantiles, percentile  # noqa: E402
from tests.integration.fake_upstream import fake_upstream  # noqa: E402
from tests.integration.fleet import ServeProcess, Tenant, fleet_extra  # noqa: E402
from tests.redis.server import RedisServer  # noqa: E402

MAX_TOKENS = 20
COST = 12 + MAX_TOKENS  # the fake's prompt tokens + max_tokens
QUOTED = 3
TENANT = Tenant("bench", quota=QUOTED * COST)
BODY = {"messages": [{"role": "user", "content": "bench"}], "max_tokens": MAX_TOKENS}


def hogs(n: int, limit_s: float) -> list[subprocess.Popen]:
    code = f"import time\nend = time.monotonic() + {limit_s}\nwhile time.monotonic() < end:\n    pass\n"
    return [subprocess.Popen([sys.executable, "-c", code], start_new_session=True) for _ in range(n)]


def metric_lines(body: str, prefix: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in body.splitlines() if line.startswith(prefix))


def merged_histogram(bodies: list[str], name: str) -> str:
    """Two gates' bucket lines summed, as one exposition body for bucket_quantiles."""
    buckets: dict[str, float] = {}
    for body in bodies:
        for line in body.splitlines():
            if line.startswith(name + "_bucket{"):
                le = line.split('le="', 1)[1].split('"', 1)[0]
                buckets[le] = buckets.get(le, 0.0) + float(line.rsplit(" ", 1)[1])
    return "\n".join(f'{name}_bucket{{le="{le}"}} {v}' for le, v in buckets.items())


async def redis_scripts(url: str) -> tuple[int, int]:
    peek = aioredis.Redis.from_url(url, decode_responses=True)
    try:
        stats = await peek.info("commandstats")
        rows = [stats.get(f"cmdstat_{c}", {}) for c in ("evalsha", "eval")]
        return sum(r.get("calls", 0) for r in rows), sum(r.get("usec", 0) for r in rows)
    finally:
        await peek.aclose()


async def fleet_part(redis: RedisServer, args: argparse.Namespace) -> dict:
    async with fake_upstream("slow", delay_s=args.delay_ms / 1000) as fake, httpx.AsyncClient(timeout=60) as client:
        gates = [ServeProcess(fake.url, fleet_extra(redis.url, [TENANT], prefix="bench:"), budget=2000) for _ in range(2)]
        try:
            await asyncio.gather(*(g.start() for g in gates))
            peek = aioredis.Redis.from_url(redis.url)
            await peek.config_resetstat()
            await peek.aclose()
            answers: dict[str, int] = {}

            async def one(gate: ServeProcess) -> None:
                r = await client.post(gate.url + "/v1/chat/completions", json=BODY, headers=TENANT.auth)
                code = "ok" if r.status_code == 200 else r.json()["error"]["code"]
                answers[code] = answers.get(code, 0) + 1

            end = time.monotonic() + args.seconds
            pending: set[asyncio.Task] = set()
            while time.monotonic() < end:  # bounded by time; each wave by --burst
                for g in gates:
                    for _ in range(args.burst):
                        task = asyncio.create_task(one(g))
                        pending.add(task)
                        task.add_done_callback(pending.discard)
                await asyncio.sleep(args.wave_ms / 1000)  # the arrival process: a wave every wave_ms
            await asyncio.gather(*pending)
            bodies = [(await client.get(g.url + "/metrics")).text for g in gates]
            calls, usec = await redis_scripts(redis.url)
        finally:
            for g in gates:
                g.stop()
        flips = [line for g in gates for line in g.log_path.read_text().splitlines() if "shared limits:" in line and " -> " in line]
        reservations = sum(metric_lines(b, "tokengate_shared_limit_wait_seconds_count") for b in bodies)
        waited = bucket_quantiles(merged_histogram(bodies, "tokengate_shared_limit_wait_seconds"), "tokengate_shared_limit_wait_seconds")
        over_bound = reservations - sum(metric_lines(b, 'tokengate_shared_limit_wait_seconds_bucket{le="0.02"}') for b in bodies)
        return {
            "requests": sum(answers.values()),
            "answers": answers,
            "most_in_progress": fake.most_in_progress,
            "quota_requests": QUOTED,
            "reservations": reservations,
            "waited_over_20ms": over_bound,
            "wait_bucket_bounds_ms": {"p50": waited["p50_ms"], "p99": waited["p99_ms"]},
            "decided_by_policy": sum(metric_lines(b, "tokengate_shared_limit_policy_total") for b in bodies),
            "flips": flips,
            "script_calls": calls,
            "script_calls_per_reservation": calls / max(1.0, reservations),
            "redis_us_per_call": usec / max(1, calls),
        }


async def inprocess_part(redis: RedisServer, args: argparse.Namespace) -> dict:
    from gate.config import SharedConfig, TenantConfig
    from gate.fleet.sharedlimits.client import SharedLimits

    waits: list[float] = []
    flips: list[str] = []
    shared = SharedLimits(
        SharedConfig(redis_url=redis.url, key_prefix="bench-in:"),
        "bench",
        on_wait=waits.append,
        on_flip=lambda f: flips.append(f"{f.old} -> {f.new}: {f.why}"),
    )
    # The round trip alone: from the script call going out (after the turn that made the
    # batch) to its answer read, the loop's lag on the way back included.
    trips: list[float] = []
    call = shared._call

    async def timed_call(script, keys, argv):
        started = time.perf_counter()
        try:
            return await call(script, keys, argv)
        finally:
            if script.name == "reserve":
                trips.append((time.perf_counter() - started) * 1000)

    shared._call = timed_call  # type: ignore[method-assign]
    tenant = TenantConfig("bench", api_key_sha256="a" * 64, requests_per_minute=10**9, tokens_per_minute=10**12, max_tokens_in_flight=10**9)
    loop = asyncio.get_running_loop()
    lags: list[float] = []
    stop = asyncio.Event()

    async def lag_monitor() -> None:
        while not stop.is_set():
            planned = time.perf_counter() + 0.005
            await asyncio.sleep(0.005)
            lags.append(max(0.0, time.perf_counter() - planned))

    async def request() -> None:
        spin = time.perf_counter() + 0.0003  # a request's own CPU before it reserves
        while time.perf_counter() < spin:
            pass
        lease = await shared.reserve(tenant, 28)
        await asyncio.sleep(0.02)  # in flight a moment
        shared.release(lease)

    await shared.start()
    before, _ = await redis_scripts(redis.url)
    monitor = loop.create_task(lag_monitor())
    try:
        end = time.monotonic() + args.inprocess_seconds
        while time.monotonic() < end:
            await asyncio.gather(*(request() for _ in range(args.inprocess_burst)))
            await asyncio.sleep(0.1)
    finally:
        stop.set()
        await monitor
        after, _ = await redis_scripts(redis.url)
        state = shared.state
        await shared.stop()
    ms = [w * 1000 for w in waits]
    lag_ms = [x * 1000 for x in lags]
    return {
        "reservations": len(ms),
        "wait_p50_ms": percentile(ms, 0.5),
        "wait_p99_ms": percentile(ms, 0.99),
        "wait_max_ms": max(ms),
        "waited_over_20ms": sum(1 for w in ms if w > 20.0),
        "loop_lag_p50_ms": percentile(lag_ms, 0.5),
        "loop_lag_p99_ms": percentile(lag_ms, 0.99),
        "loop_lag_max_ms": max(lag_ms),
        "reserve_calls": len(trips),
        "round_trip_p50_ms": percentile(trips, 0.5),
        "round_trip_p99_ms": percentile(trips, 0.99),
        "script_calls_per_reservation": (after - before) / max(1, len(ms)),
        "flips": flips,
        "state_at_end": state,
    }


async def main_async(args: argparse.Namespace) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="tokengate-shared-burst-"))
    redis = RedisServer(tmp / "redis").start()
    busy = hogs(args.hogs, args.seconds + args.inprocess_seconds + 60)
    try:
        fleet = await fleet_part(redis, args)
        inproc = await inprocess_part(redis, args)
    finally:
        for hog in busy:
            hog.kill()
        for hog in busy:
            hog.wait(10)
        redis.stop()
    return {"fleet": fleet, "in_process": inproc}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=20.0, help="fleet part length (default 20)")
    ap.add_argument("--hogs", type=int, default=3, help="CPU hogs beside the gates (default 3)")
    ap.add_argument("--burst", type=int, default=6, help="requests per gate per wave (default 6)")
    ap.add_argument("--wave-ms", type=float, default=250.0)
    ap.add_argument("--delay-ms", type=float, default=1000.0, help="the fake upstream's time per request")
    ap.add_argument("--inprocess-seconds", type=float, default=10.0)
    ap.add_argument("--inprocess-burst", type=int, default=20)
    ap.add_argument("--out", default=str(HERE / "results" / "shared_burst.json"))
    args = ap.parse_args()
    load0 = os.getloadavg()
    try:
        import uvloop

        result = uvloop.run(main_async(args))  # as `tokengate serve` runs
    except ImportError:
        result = asyncio.run(main_async(args))
    fleet, inproc = result["fleet"], result["in_process"]
    print(f"fleet: 2 gates, {args.hogs} CPU hogs, {args.burst} requests per gate every {args.wave_ms:g} ms for {args.seconds:g} s")
    print(f"  {fleet['requests']} requests {fleet['answers']}; most in progress {fleet['most_in_progress']} (quota {QUOTED})")
    print(
        f"  {fleet['reservations']:.0f} reservations: the gates waited on Redis p50 <= {fleet['wait_bucket_bounds_ms']['p50']:g} ms, "
        f"p99 <= {fleet['wait_bucket_bounds_ms']['p99']:g} ms (bucket bounds); {fleet['waited_over_20ms']:.0f} over 20 ms"
    )
    print(f"  decided by the policy: {fleet['decided_by_policy']:.0f}; flips: {fleet['flips'] or 'none'}")
    print(
        f"  Redis: {fleet['script_calls']} script calls ({fleet['script_calls_per_reservation']:.2f} per reservation, renewals and "
        f"lone releases included), {fleet['redis_us_per_call']:.0f} us each"
    )
    print(
        f"in-process: {inproc['reservations']} reservations in bursts of {args.inprocess_burst}: wait p50 {inproc['wait_p50_ms']:.2f} ms, "
        f"p99 {inproc['wait_p99_ms']:.2f} ms, max {inproc['wait_max_ms']:.1f} ms ({inproc['waited_over_20ms']} over 20 ms)"
    )
    print(
        f"  {inproc['reserve_calls']} reserve calls, round trip (sent to answer read) p50 {inproc['round_trip_p50_ms']:.2f} ms, "
        f"p99 {inproc['round_trip_p99_ms']:.2f} ms"
    )
    print(
        f"  the loop's own lag beside it: p50 {inproc['loop_lag_p50_ms']:.2f} ms, p99 {inproc['loop_lag_p99_ms']:.2f} ms, "
        f"max {inproc['loop_lag_max_ms']:.1f} ms; {inproc['script_calls_per_reservation']:.3f} script calls per reservation; "
        f"flips: {inproc['flips'] or 'none'}"
    )
    result.update(
        {
            "date": time.strftime("%Y-%m-%d"),
            "machine": f"{platform.machine()} {os.cpu_count()} CPUs, Python {platform.python_version()}",
            "load_average_before": load0,
            "load_average_after": os.getloadavg(),
            "args": vars(args),
        }
    )
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
