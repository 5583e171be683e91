"""What one scrape costs the gate: GET /metrics (everything) against GET /metrics/inference
(the endpoint picker's three gauges), over real HTTP on loopback.

An endpoint picker of the Gateway API Inference Extension scrapes every pod every 50 ms by
default (its --refresh-metrics-interval); the gate answers on the same event loop as its
requests, so a scrape's cost is latency for them. Starts a gate (`tokengate serve`'s service,
in this process) in front of the built-in simulator, sends it a few requests of each class so
the series carry values, then times sequential scrapes of each path, alternating.
Writes bench/results/metrics_scrape.json.

    .venv/bin/python bench/metrics_scrape.py [--scrapes N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from gate.config import parse_config
from gate.service import GateService
from gate.tools.simulator import serve_simulator
from gate.tools.simulator.config import SimulatorConfig

PATHS = ("/metrics", "/metrics/inference")


async def run(scrapes: int) -> dict:
    sim = await serve_simulator(SimulatorConfig(), port=0)
    with tempfile.TemporaryDirectory() as tmp:
        config = parse_config(f'[gate]\njournal = "{tmp}/j.db"\n[[backends]]\nname = "sim"\nurl = "{sim.url}"\nmodels = ["m"]\n')
        gate = GateService(config, environ={})
        await gate.start(port=0)
        try:
            async with httpx.AsyncClient(base_url=gate.url, timeout=30) as client:
                for i in range(20):
                    for cls in ("interactive", "batch"):
                        body = {"messages": [{"role": "user", "content": f"hello {i}"}], "max_tokens": 4}
                        resp = await client.post("/v1/chat/completions", json=body, headers={"X-Tokengate-Class": cls})
                        assert resp.status_code == 200, resp.text
                for path in PATHS:  # warm up
                    assert (await client.get(path)).status_code == 200
                times: dict[str, list[float]] = {p: [] for p in PATHS}
                sizes = {p: len((await client.get(p)).content) for p in PATHS}
                for _ in range(scrapes):
                    for path in PATHS:
                        t = time.perf_counter()
                        resp = await client.get(path)
                        times[path].append((time.perf_counter() - t) * 1000)
                        assert resp.status_code == 200
                # the server side alone: refresh + render, no HTTP
                render = {}
                for path, fn in (
                    ("/metrics", lambda: (gate.refresh_metrics(), gate.metrics.render())),
                    ("/metrics/inference", lambda: (gate.refresh_inference_gauges(), gate.metrics.render_inference())),
                ):
                    t = time.perf_counter()
                    for _ in range(scrapes):
                        fn()
                    render[path] = (time.perf_counter() - t) / scrapes * 1000
        finally:
            await gate.stop(grace_s=1)
            await sim.stop()
    out = {}
    for path in PATHS:
        ts = sorted(times[path])
        out[path] = {
            "bytes": sizes[path],
            "http_p50_ms": round(statistics.median(ts), 3),
            "http_p99_ms": round(ts[int(len(ts) * 0.99) - 1], 3),
            "render_ms": round(render[path], 3),
            "loop_ms_per_s_at_20_scrapes_per_s": round(render[path] * 20, 1),
        }
    return {"scrapes": scrapes, "python": platform.python_version(), "machine": platform.machine(), "paths": out}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scrapes", type=int, default=2000)
    args = parser.parse_args()
    result = asyncio.run(run(args.scrapes))
    print(f"{'path':<20} {'bytes':>7} {'HTTP p50 ms':>12} {'HTTP p99 ms':>12} {'render ms':>10} {'loop ms/s at 20/s':>18}")
    for path, r in result["paths"].items():
        print(
            f"{path:<20} {r['bytes']:>7} {r['http_p50_ms']:>12} {r['http_p99_ms']:>12} {r['render_ms']:>10} {r['loop_ms_per_s_at_20_scrapes_per_s']:>18}"
        )
    out = Path(__file__).with_name("results") / "metrics_scrape.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
