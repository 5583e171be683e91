"""Check gate.gpu on a real host: print the console lines and the raw reading as JSON.

    .venv/bin/python bench/gpu_check.py [--async] [--timeout S]

Without a GPU it prints ``n/a: <reason>`` (e.g. ``n/a: NVML library not found``)
and exits 0: a missing GPU is a reading, not a failure.  Also prints how long
the first (init) and a second read took.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import time

from gate.observe.gpu import GpuMonitor, format_reading


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--async", dest="use_async", action="store_true", help="use read_async (daemon thread + timeout)")
    ap.add_argument("--timeout", type=float, default=2.0, help="read_async timeout in seconds")
    args = ap.parse_args()

    monitor = GpuMonitor(timeout_s=args.timeout)
    timings = []
    try:
        for _ in range(2):
            t0 = time.perf_counter()
            reading = asyncio.run(monitor.read_async()) if args.use_async else monitor.read()
            timings.append(round((time.perf_counter() - t0) * 1000, 2))
    finally:
        monitor.close()
    for line in format_reading(reading):
        print(line)
    print(json.dumps({"reading": dataclasses.asdict(reading), "read_ms": timings}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
