"""Added latency and throughput of the gate against a fast FAKE upstream, driven by wrk.

Starts bench/fake_upstream.py and `tokengate serve` (journal on, metrics on) on
loopback ports, then runs wrk against each target in alternating rounds so
machine noise hits all alike:
  direct    the fake upstream itself (the floor)
  gate-hit  through tokengate, the same prompt every time (token count cached)
  gate-miss through tokengate, a new prompt every request (exact tokenization each time)
at 1 and 32 connections. Prints a table and writes bench/results/overhead.json.

    .venv/bin/python bench/overhead.py [--duration 10] [--rounds 2]
Needs wrk (Debian package `wrk`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
BODY = '{"messages":[{"role":"user","content":"hello there"}],"max_tokens":8}'
LUA_HIT = f"""wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{BODY}'
"""
LUA_MISS = """wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local counter = 0
local tid = 0
function setup(thread) tid = tid + 1; thread:set("tid", tid) end
function init(args) tid = wrk.thread:get("tid") or 0 end
request = function()
  counter = counter + 1
  return wrk.format(nil, nil, nil, '{"messages":[{"role":"user","content":"hello there ' .. tid .. '-' .. counter .. '"}],"max_tokens":8}')
end
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1000.0}


def parse_wrk(out: str) -> dict:
    """p50/p99 latency in ms and requests/s from `wrk --latency` output."""
    lat = {}
    for pct in ("50", "99"):
        m = re.search(rf"^\s+{pct}%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
        lat[f"p{pct}_ms"] = float(m.group(1)) * _UNITS[m.group(2)] if m else None
    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    return {**lat, "rps": float(rps.group(1)) if rps else None, "non_2xx": int(non2xx.group(1)) if non2xx else 0}


def run_wrk(url: str, lua: Path, conns: int, duration: int) -> dict:
    threads = 1 if conns == 1 else 2
    out = subprocess.run(
        ["wrk", f"-t{threads}", f"-c{conns}", f"-d{duration}s", "--latency", "-s", str(lua), url],
        capture_output=True, text=True, check=True,
    ).stdout
    return parse_wrk(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=int, default=10, help="seconds per wrk run")
    ap.add_argument("--rounds", type=int, default=2, help="alternating rounds per cell (median reported)")
    args = ap.parse_args()
    if shutil.which("wrk") is None:
        print("wrk not found: apt-get install wrk", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="tokengate-bench-"))
    up_port, gate_port = free_port(), free_port()
    (tmp / "hit.lua").write_text(LUA_HIT)
    (tmp / "miss.lua").write_text(LUA_MISS)
    (tmp / "gate.toml").write_text(
        f'[gate]\nlisten = "127.0.0.1:{gate_port}"\njournal = "{tmp / "journal.db"}"\n'
        f'[[backends]]\nurl = "http://127.0.0.1:{up_port}"\n'
        '[budget]\nmode = "static"\n'
        '[classes.interactive]\npriority = 10\nqueue_depth = 4096\nqueue_timeout_s = 60\n'
    )
    procs = [
        subprocess.Popen([sys.executable, str(HERE / "fake_upstream.py"), "--port", str(up_port), "--slots", "256"]),
        subprocess.Popen(
            [str(Path(sys.executable).with_name("tokengate")), "serve", "--config", str(tmp / "gate.toml"), "--log-level", "warning"],
            stderr=open(tmp / "gate.log", "wb"),
        ),
    ]
    try:
        wait_http(f"http://127.0.0.1:{up_port}/health")
        wait_http(f"http://127.0.0.1:{gate_port}/health")
        targets = {
            "direct": (f"http://127.0.0.1:{up_port}/v1/chat/completions", tmp / "hit.lua"),
            "gate-hit": (f"http://127.0.0.1:{gate_port}/v1/chat/completions", tmp / "hit.lua"),
            "gate-miss": (f"http://127.0.0.1:{gate_port}/v1/chat/completions", tmp / "miss.lua"),
        }
        results: dict[str, dict[int, list[dict]]] = {t: {1: [], 32: []} for t in targets}
        for _ in range(args.rounds):
            for conns in (1, 32):
                for name, (url, lua) in targets.items():
                    results[name][conns].append(run_wrk(url, lua, conns, args.duration))
        table = {}
        for name in targets:
            for conns in (1, 32):
                runs = results[name][conns]
                table[f"{name}@{conns}"] = {
                    k: statistics.median([r[k] for r in runs if r[k] is not None]) for k in ("p50_ms", "p99_ms", "rps")
                } | {"non_2xx": sum(r["non_2xx"] for r in runs)}
        print(f"{'target':<16}{'p50 ms':>9}{'p99 ms':>9}{'req/s':>10}{'non-2xx':>9}{'added p50':>11}")
        for key, row in table.items():
            conns = key.split("@")[1]
            added = row["p50_ms"] - table[f"direct@{conns}"]["p50_ms"]
            row["added_p50_ms"] = round(added, 3)
            print(f"{key:<16}{row['p50_ms']:>9.2f}{row['p99_ms']:>9.2f}{row['rps']:>10.0f}{row['non_2xx']:>9}{added:>11.2f}")
        out = {
            "table": table,
            "duration_s": args.duration,
            "rounds": args.rounds,
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        }
        (HERE / "results").mkdir(exist_ok=True)
        (HERE / "results" / "overhead.json").write_text(json.dumps(out, indent=2) + "\n")
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
