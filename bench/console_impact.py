"""Does an open console slow the gate? Headless vs embedded console vs attached console.

The user's path, measured as an on-call engineer has it: `tokengate serve` alone; the
embedded console (`tokengate console --config F`) in a real terminal (tmux, 160x48);
`tokengate serve` with `tokengate console --attach` in tmux. The same FAKE upstream
(bench/fake_upstream.py, answers at once), the same config, and the same open-loop
Poisson load from a separate process (bench/poisson_load.py) at each rate, 20 s a
cell; the arms alternate within each rate so drift hits them alike. Reported per cell:
p50/p99 and non-200.

Then, under load at --key-rate req/s, key press -> visible change in each console arm:
`space` (rendering paused: the header shows PAUSED) and `space` again (it goes),
sent with `tmux send-keys` and seen with `tmux capture-pane` polled every ~5 ms.

Then the capacity of each arm: the highest rate of --capacity-rates with p99 < 100 ms
and no non-200 (10 s a step).

    .venv/bin/python bench/console_impact.py [--rates 100,200,400] [--duration 20] [--no-capacity]

`--upstream llama`: the same arms in front of the REAL llama-server (the tiny `fast` test
model, unified 2048-token pool, 4 slots, `-t` = every CPU, as on a host where llama-server
has the CPUs to itself), latency only, at --rates (default 20 req/s), --rounds times
alternating. There the console competes with llama-server for the CPU, and what the
console costs per second shows up in the gate's p99; the console's own CPU (from /proc)
is reported per cell. Writes bench/results/console_impact_llama.json.

    .venv/bin/python bench/console_impact.py --upstream llama [--rates 20] [--rounds 3]
Needs tmux (Debian package `tmux`). Writes bench/results/console_impact.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PY = sys.executable
TOKENGATE = str(Path(sys.executable).with_name("tokengate"))
ARMS = ("headless", "embedded", "attached")
SESSION = "tokengate-bench"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait(predicate, timeout: float, what: str, interval: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise RuntimeError(f"timed out waiting for {what}")


def healthy(port: int) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
            return r.status == 200
    except OSError:
        return False


def tmux(*args: str) -> str:
    return subprocess.run(["tmux", *args], check=False, capture_output=True, text=True).stdout


class Arm:
    """One way of running the gate: started, loaded, stopped."""

    def __init__(self, kind: str, workdir: Path, config: Path, port: int) -> None:
        self.kind, self.workdir, self.config, self.port = kind, workdir, config, port
        self.serve: subprocess.Popen | None = None
        self.sock = str(workdir / "gate.sock")

    def start(self) -> None:
        for leftover in self.workdir.glob("gate.db*"):
            leftover.unlink()
        if self.kind in ("headless", "attached"):
            log = open(self.workdir / f"serve-{self.kind}.log", "ab")  # noqa: SIM115
            self.serve = subprocess.Popen(
                [TOKENGATE, "serve", "--config", str(self.config), "--log-level", "warning"],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                cwd=self.workdir,
            )
            wait(lambda: healthy(self.port), 30, "tokengate serve")
        if self.kind == "embedded":
            tmux(
                "new-session",
                "-d",
                "-s",
                SESSION,
                "-x",
                "160",
                "-y",
                "48",
                f"cd {self.workdir} && {TOKENGATE} console --config {self.config}",
            )
        elif self.kind == "attached":
            tmux(
                "new-session",
                "-d",
                "-s",
                SESSION,
                "-x",
                "160",
                "-y",
                "48",
                f"cd {self.workdir} && {TOKENGATE} console --attach {self.sock}",
            )
        if self.kind != "headless":
            wait(lambda: healthy(self.port), 30, "the gate behind the console")
            wait(lambda: "classes" in tmux("capture-pane", "-p", "-t", SESSION), 30, "the console's first frame")
        time.sleep(1.0)  # past start-up: the first ticks, the journal's first batch

    def stop(self) -> None:
        if self.kind != "headless":
            tmux("kill-session", "-t", SESSION)  # a hang-up: the embedded console drains its gate
        if self.serve is not None:
            self.serve.send_signal(signal.SIGTERM)
            self.serve.wait(60)
            self.serve = None
        wait(lambda: not healthy(self.port) and not Path(self.sock).exists(), 60, "the gate to stop")


def cpu_ticks(pattern: str) -> int | None:
    """utime + stime (clock ticks) of the newest process whose command line matches."""
    pids = subprocess.run(["pgrep", "-n", "-f", pattern], capture_output=True, text=True).stdout.split()
    try:
        fields = Path(f"/proc/{pids[0]}/stat").read_text().rsplit(")", 1)[1].split()
    except (IndexError, OSError):
        return None
    return int(fields[11]) + int(fields[12])


def load(port: int, rate: float, duration: float, seed: int) -> dict:
    out = subprocess.run(
        [
            PY,
            str(HERE / "poisson_load.py"),
            "--url",
            f"http://127.0.0.1:{port}",
            "--rate",
            str(rate),
            "--duration",
            str(duration),
            "--seed",
            str(seed),
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out)


def key_latencies(port: int, rate: float, presses: int, seed: int) -> list[float]:
    """Under load: space (PAUSED shows), space (it goes); ms from send-keys to the changed screen."""
    rng = random.Random(seed)
    duration = presses * 1.2 + 6
    background = subprocess.Popen(
        [
            PY,
            str(HERE / "poisson_load.py"),
            "--url",
            f"http://127.0.0.1:{port}",
            "--rate",
            str(rate),
            "--duration",
            str(duration),
            "--seed",
            str(seed),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(2.0)
    out = []
    try:
        for i in range(presses):
            want_paused = i % 2 == 0
            sent = time.monotonic()
            tmux("send-keys", "-t", SESSION, "Space")
            while time.monotonic() - sent < 5.0:
                header = tmux("capture-pane", "-p", "-t", SESSION, "-S", "0", "-E", "1")  # the header may wrap
                if (re.search(r"\bPAUSED\b", header) is not None) == want_paused:  # tmux trims the trailing blank
                    out.append((time.monotonic() - sent) * 1000)
                    break
                time.sleep(0.005)
            else:
                out.append(float("inf"))
            time.sleep(rng.uniform(0.3, 0.8))
    finally:
        background.wait(duration + 60)
    return out


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * len(s) + 0.5) - 1))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", default="100,200,400")
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--key-rate", type=float, default=200.0)
    ap.add_argument("--presses", type=int, default=20)
    ap.add_argument("--capacity-rates", default="200,300,400,500,600,700,800")
    ap.add_argument("--no-capacity", action="store_true")
    ap.add_argument(
        "--phases",
        default="latency,keys,capacity",
        help="which parts to run; the others are kept from an existing --out file (default: all)",
    )
    ap.add_argument(
        "--upstream",
        choices=("fake", "llama"),
        default="fake",
        help="fake: bench/fake_upstream.py (the gate's own cost); llama: the real llama-server",
    )
    ap.add_argument("--rounds", type=int, default=1, help="repeat each rate's arms this many times, alternating")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if shutil.which("tmux") is None:
        sys.exit("needs tmux (apt-get install tmux)")
    real = args.upstream == "llama"
    if args.out is None:
        args.out = HERE / "results" / ("console_impact_llama.json" if real else "console_impact.json")
    if real and args.rates == ap.get_default("rates"):
        args.rates = "20"
    rates = [float(r) for r in args.rates.split(",")]
    workdir = Path(tempfile.mkdtemp(prefix="tokengate-console-impact-"))
    gate_port = free_port()
    if real:
        sys.path.insert(0, str(ROOT))
        from tests.llama.make_model import cached_model
        from tests.llama.server import LlamaServer, find_llama_server

        llama = LlamaServer(
            find_llama_server(), cached_model("fast"), mode="unified", ctx=2048, n_slots=4, threads=os.cpu_count() or 2
        ).start()
        upstream_url, kv, stop_upstream = llama.url, "unified", llama.stop
    else:
        fake_port = free_port()
        fake = subprocess.Popen(
            [PY, str(HERE / "fake_upstream.py"), "--port", str(fake_port), "--slots", "256"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        upstream_url, kv = f"http://127.0.0.1:{fake_port}", "split"

        def stop_upstream() -> None:
            fake.terminate()
            fake.wait(10)

    config = workdir / "gate.toml"
    config.write_text(
        f'[gate]\nlisten = "127.0.0.1:{gate_port}"\njournal = "{workdir / "gate.db"}"\n'
        f'[budget]\nmode = "static"\n[[backends]]\nurl = "{upstream_url}"\nkv = "{kv}"\n'
        "[classes.interactive]\npriority = 10\nqueue_depth = 4096\n[classes.batch]\npriority = 1\n"
    )
    phases = set(args.phases.split(","))
    if args.no_capacity:
        phases.discard("capacity")
    if real:
        phases = {"latency"}
    results: dict = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, {platform.system()} {platform.release()}",
        "upstream": "llama-server, tiny fast model, unified 2048, 4 slots" if real else "fake",
        "duration_s": args.duration,
        "cells": [],
        "keys": {},
        "capacity": {},
    }
    if not real and phases != {"latency", "keys", "capacity"} and args.out.exists():
        kept = json.loads(args.out.read_text())
        results.update({k: kept[k] for k in ("duration_s", "cells", "keys", "capacity") if k in kept})
    arms = {kind: Arm(kind, workdir, config, gate_port) for kind in ARMS}
    try:
        if not real:
            wait(lambda: _listening(fake_port), 10, "the fake upstream")
        for rate in rates if "latency" in phases else ():
            results["cells"] = [c for c in results["cells"] if c["rate"] != rate]
            for round_ in range(args.rounds):
                for kind in ARMS:
                    arms[kind].start()
                    try:
                        before = cpu_ticks(f"{TOKENGATE} console")
                        cell = load(gate_port, rate, args.duration, seed=int(rate) + round_)
                        after = cpu_ticks(f"{TOKENGATE} console")
                    finally:
                        arms[kind].stop()
                    cell["arm"], cell["round"] = kind, round_
                    if before is not None and after is not None:
                        cell["console_cpu_pct"] = 100.0 * (after - before) / os.sysconf("SC_CLK_TCK") / args.duration
                    results["cells"].append(cell)
                    cpu = f"  console CPU {cell['console_cpu_pct']:.1f}%" if "console_cpu_pct" in cell else ""
                    print(
                        f"{kind:9s} {rate:5.0f} req/s  p50 {cell['p50_ms']:8.1f} ms  p99 {cell['p99_ms']:8.1f} ms  non-200 {cell['non_200']}{cpu}",
                        flush=True,
                    )
        for kind in ("embedded", "attached") if "keys" in phases else ():
            arms[kind].start()
            try:
                ms = key_latencies(gate_port, args.key_rate, args.presses, seed=7)
            finally:
                arms[kind].stop()
            results["keys"][kind] = {
                "rate": args.key_rate,
                "presses": len(ms),
                "p50_ms": pct(ms, 50),
                "p99_ms": pct(ms, 99),
                "max_ms": max(ms),
                "raw_ms": ms,
            }
            print(f"{kind:9s} key -> screen at {args.key_rate:.0f} req/s: p50 {pct(ms, 50):.0f} ms  p99 {pct(ms, 99):.0f} ms", flush=True)
        if "capacity" in phases:
            for kind in ARMS:
                best = 0.0
                steps = []
                for rate in (float(r) for r in args.capacity_rates.split(",")):
                    arms[kind].start()
                    try:
                        cell = load(gate_port, rate, 10.0, seed=int(rate) + 1)
                    finally:
                        arms[kind].stop()
                    steps.append({"rate": rate, "p99_ms": cell["p99_ms"], "non_200": cell["non_200"]})
                    if cell["p99_ms"] >= 100.0 or cell["non_200"]:
                        break
                    best = rate
                results["capacity"][kind] = {"rate": best, "steps": steps}
                print(f"{kind:9s} capacity (p99 < 100 ms, all 200): {best:.0f} req/s", flush=True)
    finally:
        tmux("kill-session", "-t", SESSION)
        stop_upstream()
    summarize(results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    shutil.rmtree(workdir, ignore_errors=True)
    return 0


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def summarize(results: dict) -> None:
    """Each console arm against the targets: +3 ms p50, 2x + 10 ms p99, no extra non-200."""
    by = {(c["arm"], c["rate"], c.get("round", 0)): c for c in results["cells"]}
    verdicts = []
    for (arm, rate, round_), cell in sorted(by.items()):
        if arm == "headless":
            continue
        base = by[("headless", rate, round_)]  # the same round: drift hits both alike
        ok = cell["p50_ms"] <= base["p50_ms"] + 3 and cell["p99_ms"] <= 2 * base["p99_ms"] + 10 and cell["non_200"] <= base["non_200"]
        verdicts.append(
            {
                "arm": arm,
                "rate": rate,
                "round": round_,
                "met": ok,
                "p99_ms": round(cell["p99_ms"], 1),
                "headless_p99_ms": round(base["p99_ms"], 1),
            }
        )
    results["verdicts"] = verdicts
    keys = results.get("keys", {})
    results["keys_met"] = all(k["p99_ms"] <= 150 for k in keys.values()) if keys else None
    cap = results.get("capacity", {})
    if cap.get("headless", {}).get("rate"):
        results["capacity_ratio"] = {k: v["rate"] / cap["headless"]["rate"] for k, v in cap.items()}
    print(json.dumps({"verdicts": verdicts, "keys_met": results["keys_met"], "capacity_ratio": results.get("capacity_ratio")}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
