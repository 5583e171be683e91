"""What [shared] costs an admitted request: the gate with tenant limits on Redis vs without.

Starts a real redis-server (loopback, no persistence), the FAKE upstream
(bench/fake_upstream.py: answers at once, so the gate is what is measured) and two
`tokengate serve` processes in front of it, identical but for `[shared] redis_url`.
The tenant has limits (rpm, tpm, in-flight quota) far above the load, so every request
takes the whole path (the gate's own rate check, then on the shared gate one reserve
script before admission and one release script after) and none is refused.

One client connection per gate (keep-alive), requests one after another, the gates
alternated in blocks so that drift on a shared machine hits all alike. A third gate,
identical to the first (no [shared]), is the control: its difference from the first is
the noise floor of the run. Prints p50/p99 per gate and the differences (the issue's
target: p50 <= 0.5 ms added), how long the gate itself waited on Redis (its
tokengate_shared_limit_wait_seconds histogram, as bucket bounds), and the reserve round
trip alone, measured in-process (SharedLimits.reserve, then release).
Writes bench/results/shared_overhead.json.

    PYTHONPATH=. .venv/bin/python bench/shared_overhead.py [--requests 4000] [--block 200]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import http.client
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

KEY = "bench-key-shared-0001"
BODY = json.dumps({"model": "fake", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 8}).encode()
TENANT = f"""
[[tenants]]
name = "bench"
api_key_sha256 = "{hashlib.sha256(KEY.encode()).hexdigest()}"
requests_per_minute = 1000000000
tokens_per_minute = 1000000000000
max_tokens_in_flight = 1000000000
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"nothing listens on port {port} after {timeout:.0f}s")


def gate_toml(tmp: Path, name: str, port: int, upstream: int, shared: str) -> Path:
    path = tmp / f"{name}.toml"
    path.write_text(
        f'[gate]\nlisten = "127.0.0.1:{port}"\njournal = "{tmp}/{name}.db"\n\n{shared}'
        f'[[backends]]\nname = "fake"\nurl = "http://127.0.0.1:{upstream}"\nmodels = ["fake"]\n{TENANT}'
    )
    return path


def start(cmd: list[str], log: Path, **kw) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.Popen(cmd, stdout=open(log, "wb"), stderr=subprocess.STDOUT, env=env, start_new_session=True, **kw)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def one(conn: http.client.HTTPConnection) -> float:
    try:
        return _one(conn)
    except (BrokenPipeError, ConnectionResetError, http.client.RemoteDisconnected):
        conn.close()  # the gate closed an idle keep-alive connection (uvicorn: after 5 s)
        return _one(conn)


def _one(conn: http.client.HTTPConnection) -> float:
    started = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", BODY, {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    response = response_ = conn.getresponse()
    response_.read()
    elapsed = time.perf_counter() - started
    if response.status != 200:
        raise SystemExit(f"unexpected {response.status}")
    return elapsed * 1000


async def reserve_round_trips(url: str, n: int) -> dict[str, float]:
    """SharedLimits.reserve alone (what admission waits for), in this process."""
    from gate.config import SharedConfig, TenantConfig
    from gate.fleet.sharedlimits.client import SharedLimits

    shared = SharedLimits(SharedConfig(redis_url=url, key_prefix="bench-rt:"), "bench")
    await shared.start()
    tenant = TenantConfig("bench", api_key_sha256="a" * 64, requests_per_minute=10**9, tokens_per_minute=10**12, max_tokens_in_flight=10**9)
    times = []
    try:
        for _ in range(n):
            started = time.perf_counter()
            lease = await shared.reserve(tenant, 28)
            times.append((time.perf_counter() - started) * 1000)
            shared.release(lease, refund_tokens=0)
            await asyncio.sleep(0)  # let the release go out, as between two requests
        assert shared.state == "ok", shared.state
    finally:
        await shared.stop()
    return {"p50_ms": percentile(times, 0.5), "p99_ms": percentile(times, 0.99), "n": n}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=4000, help="per gate (default 4000)")
    parser.add_argument("--block", type=int, default=200, help="requests to one gate before switching (default 200)")
    parser.add_argument("--warmup", type=int, default=300)
    parser.add_argument("--out", default=str(HERE / "results" / "shared_overhead.json"))
    args = parser.parse_args()
    redis_bin = shutil.which("redis-server")
    if redis_bin is None:
        raise SystemExit("redis-server is not installed (tests/redis/ensure_redis.sh installs it)")

    tmp = Path(tempfile.mkdtemp(prefix="tokengate-shared-bench-"))
    redis_port, upstream, plain_port, shared_port, control_port = (free_port() for _ in range(5))
    url = f"redis://127.0.0.1:{redis_port}/0"
    procs = [
        start(
            [redis_bin, "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(tmp)],
            tmp / "redis.log",
        ),
        start([sys.executable, str(HERE / "fake_upstream.py"), "--port", str(upstream)], tmp / "fake.log"),
    ]
    try:
        wait_port(redis_port)
        wait_port(upstream)
        shared_table = f'[shared]\nredis_url = "{url}"\n\n'
        ports = {"plain": plain_port, "shared": shared_port, "control": control_port}
        for name, port, shared in (("plain", plain_port, ""), ("shared", shared_port, shared_table), ("control", control_port, "")):
            procs.append(
                start(
                    [
                        sys.executable,
                        "-m",
                        "gate.cli",
                        "serve",
                        "--config",
                        str(gate_toml(tmp, name, port, upstream, shared)),
                        "--log-level",
                        "warning",
                    ],
                    tmp / f"{name}.log",
                    cwd=tmp,
                )
            )
        for port in ports.values():
            wait_port(port)
        conns = {name: http.client.HTTPConnection("127.0.0.1", port) for name, port in ports.items()}
        for conn in conns.values():
            for _ in range(args.warmup):
                one(conn)
        times: dict[str, list[float]] = {name: [] for name in conns}
        gate_pids = dict(zip(ports, (p.pid for p in procs[2:])))
        cpu0 = {name: cpu_seconds(pid) for name, pid in gate_pids.items()}
        redis_cpu0 = cpu_seconds(procs[0].pid)
        while min(len(t) for t in times.values()) < args.requests:
            for name, conn in conns.items():
                times[name].extend(one(conn) for _ in range(args.block))
        cpu_ms = {name: (cpu_seconds(pid) - cpu0[name]) * 1000 / len(times[name]) for name, pid in gate_pids.items()}
        redis_cpu_ms = (cpu_seconds(procs[0].pid) - redis_cpu0) * 1000 / len(times["shared"])
        with urllib_open(f"http://127.0.0.1:{shared_port}/metrics") as body:
            fallback = [line for line in body.splitlines() if line.startswith("tokengate_shared_limit_policy_total")]
            waited = bucket_quantiles(body, "tokengate_shared_limit_wait_seconds")
        scripts = script_calls(redis_port)
        round_trip = run_on_uvloop(reserve_round_trips(url, args.requests))
    finally:
        for proc in reversed(procs):
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()

    rows = {
        name: {
            "p50_ms": percentile(t, 0.5),
            "p99_ms": percentile(t, 0.99),
            "mean_ms": statistics.fmean(t),
            "n": len(t),
            "gate_cpu_ms_per_request": cpu_ms[name],
        }
        for name, t in times.items()
    }
    added = {k: rows["shared"][k] - rows["plain"][k] for k in ("p50_ms", "p99_ms", "mean_ms")}
    noise = {k: rows["control"][k] - rows["plain"][k] for k in ("p50_ms", "p99_ms", "mean_ms")}
    print(f"{'gate':<28} {'p50 ms':>8} {'p99 ms':>8} {'mean ms':>8} {'n':>6} {'gate CPU ms/req':>16}")
    labels = {"plain": "without [shared]", "shared": "[shared] on loopback Redis", "control": "without [shared], again"}
    for name, row in rows.items():
        print(
            f"{labels[name]:<28} {row['p50_ms']:8.3f} {row['p99_ms']:8.3f} {row['mean_ms']:8.3f} {row['n']:6d} {row['gate_cpu_ms_per_request']:16.3f}"
        )
    print(f"{'added by [shared]':<28} {added['p50_ms']:8.3f} {added['p99_ms']:8.3f} {added['mean_ms']:8.3f}")
    print(f"{'noise floor (control)':<28} {noise['p50_ms']:8.3f} {noise['p99_ms']:8.3f} {noise['mean_ms']:8.3f}")
    print(f"{'reserve alone (in-process)':<28} {round_trip['p50_ms']:8.3f} {round_trip['p99_ms']:8.3f}")
    print(
        f"{'the gate waited on Redis':<28} {'<=' + format(waited['p50_ms'], 'g'):>8} {'<=' + format(waited['p99_ms'], 'g'):>8}"
        "   (tokengate_shared_limit_wait_seconds, bucket bounds)"
    )
    print(f"Redis CPU per request of the shared gate: {redis_cpu_ms:.3f} ms")
    served = rows["shared"]["n"] + args.warmup
    print(f"Redis script calls per admitted request: {scripts / served:.2f} (reserve, releases riding along, renewals)")
    verdict = "met" if added["p50_ms"] <= 0.5 else "NOT met"
    print(f"target p50 added <= 0.5 ms: {verdict}; requests decided by the failure policy: {fallback}")
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()} {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "requests_per_gate": args.requests,
        "block": args.block,
        "gates": rows,
        "added": added,
        "control_minus_plain": noise,
        "load_average": os.getloadavg(),
        "redis_cpu_ms_per_request": redis_cpu_ms,
        "reserve_round_trip": round_trip,
        "gate_waited_on_redis_bucket_bounds": waited,
        "script_calls_per_request": scripts / (rows["shared"]["n"] + args.warmup),
        "target_p50_added_ms": 0.5,
        "met": added["p50_ms"] <= 0.5,
        "policy_counters": fallback,
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


def bucket_quantiles(body: str, name: str) -> dict[str, float]:
    """p50/p99 of a Prometheus histogram as the upper bounds of the buckets that hold them."""
    buckets = []
    for line in body.splitlines():
        if line.startswith(name + "_bucket{"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            buckets.append((float(le), float(line.rsplit(" ", 1)[1])))
    total = buckets[-1][1] if buckets else 0.0
    out = {}
    for key, q in (("p50_ms", 0.5), ("p99_ms", 0.99)):
        out[key] = next((le * 1000 for le, count in buckets if total and count >= q * total), float("nan"))
    out["n"] = total
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far (/proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_on_uvloop(coro):
    """As `tokengate serve` runs: on uvloop where it is installed."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def script_calls(port: int) -> int:
    """EVALSHA + EVAL calls Redis has served (INFO commandstats)."""
    import redis

    stats = redis.Redis(port=port).info("commandstats")
    return sum(stats.get(f"cmdstat_{name}", {}).get("calls", 0) for name in ("evalsha", "eval"))


def urllib_open(url: str):
    import contextlib
    import urllib.request

    @contextlib.contextmanager
    def opened():
        with urllib.request.urlopen(url, timeout=5) as r:
            yield r.read().decode()

    return opened()


if __name__ == "__main__":
    main()
