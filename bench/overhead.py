"""Added latency and throughput of the gate against a fast FAKE upstream, driven by wrk.

Starts bench/fake_upstream.py and `tokengate serve` (journal on, metrics on) on
loopback ports, then runs wrk against each target in alternating rounds so
machine noise hits all alike:
  direct    the fake upstream itself (the floor)
  nginx     nginx as a plain reverse proxy to the fake (the physical floor for a
            proxy hop; Debian package `nginx`, started here on a loopback port
            with a generated config, HTTP/1.1 keep-alive upstream, no buffering)
  gate-hit  through tokengate, the same prompt every time (token count cached)
  gate-miss through tokengate, a new prompt every request (exact tokenization each time)
at 1, 32 and 128 connections. Per cell: p50/p99 latency, the latency added over
direct, requests/s, and CPU seconds per 1,000 requests of the target's own
process(es) (utime+stime from /proc/<pid>/stat: direct = the fake, nginx =
master + workers, gate = the tokengate process; the fake behind a proxy is not
counted). Then, per target, relayed SSE chunks/s (streamed requests at 32
connections; chunks/s = streams/s x the `data:` events counted in one response
through that target: the fake sends 8 content chunks + finish + usage + [DONE],
and the gate drops the usage chunk unless the client asked for
stream_options.include_usage, so it relays 10). Through tokengate only:
  refusals/s  a second gate whose backend token_budget (16) is smaller than any
              request's cost, so every request is refused at once (400
              context_length_exceeded, never queued): a refusal flood
  hold RSS    a third gate in front of a stub that never answers completions
              (1 slot): 10,000 requests are held in its queue, and its resident
              memory (VmRSS) is read before and while they wait
LiteLLM is reported as not measured (with the reason) unless it is installed.
Prints tables and writes bench/results/overhead.json.

    .venv/bin/python bench/overhead.py [--duration 10] [--rounds 2] [--hold 10000]
Needs wrk (Debian package `wrk`); nginx (Debian package `nginx`) for the nginx target.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
BODY = '{"messages":[{"role":"user","content":"hello there"}],"max_tokens":8}'
STREAM_BODY = '{"messages":[{"role":"user","content":"hello there"}],"max_tokens":8,"stream":true}'
CONNS = (1, 32, 128)
CHUNKS = 8
SSE_EVENTS = CHUNKS + 3  # content chunks + finish chunk + usage chunk + [DONE]
LUA_HIT = f"""wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{BODY}'
"""
LUA_STREAM = f"""wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{STREAM_BODY}'
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
NGINX_CONF = """worker_processes {workers};
daemon off;
master_process on;
pid {tmp}/nginx.pid;
error_log {tmp}/nginx-error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {tmp}/nginx-body;
    proxy_temp_path {tmp}/nginx-proxy;
    fastcgi_temp_path {tmp}/nginx-fastcgi;
    uwsgi_temp_path {tmp}/nginx-uwsgi;
    scgi_temp_path {tmp}/nginx-scgi;
    keepalive_requests 1000000;
    upstream fake {{ server 127.0.0.1:{up_port}; keepalive 256; keepalive_requests 1000000; }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://fake;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_request_buffering off;
        }}
    }}
}}
"""
# A stub llama-server that answers everything but completions, which it holds forever.
HOLD_STUB = """import asyncio, sys
sys.path.insert(0, {here!r})
import fake_upstream as f
r = f.build_responses(8, 1, 1 << 20)
r["stream"] = b""; r["plain"] = b""
async def main():
    s = await asyncio.get_running_loop().create_server(lambda: f.FakeLlama(r), "127.0.0.1", {port})
    async with s:
        await s.serve_forever()
asyncio.run(main())
"""
CLK_TCK = os.sysconf("SC_CLK_TCK")


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
    """p50/p99 latency in ms, requests/s and requests completed from `wrk --latency` output."""
    lat = {}
    for pct in ("50", "99"):
        m = re.search(rf"^\s+{pct}%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
        lat[f"p{pct}_ms"] = float(m.group(1)) * _UNITS[m.group(2)] if m else None
    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    done = re.search(r"^\s*(\d+) requests in", out, re.M)
    return {
        **lat,
        "rps": float(rps.group(1)) if rps else None,
        "non_2xx": int(non2xx.group(1)) if non2xx else 0,
        "requests": int(done.group(1)) if done else 0,
    }


def children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def cpu_seconds(pids: list[int]) -> float:
    """utime + stime of the processes, from their own /proc accounting."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)
    return total / CLK_TCK


def rss_kib(pid: int) -> int:
    m = re.search(r"VmRSS:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text())
    return int(m.group(1)) if m else 0


def run_wrk(url: str, lua: Path, conns: int, duration: int, pids: list[int]) -> dict:
    threads = 1 if conns == 1 else 2
    before = cpu_seconds(pids)
    out = subprocess.run(
        ["wrk", f"-t{threads}", f"-c{conns}", f"-d{duration}s", "--latency", "-s", str(lua), url],
        capture_output=True, text=True, check=True,
    ).stdout
    cpu = cpu_seconds(pids) - before
    r = parse_wrk(out)
    r["cpu_s_per_1k"] = cpu / r["requests"] * 1000 if r["requests"] else None
    return r


def start_nginx(tmp: Path, up_port: int, workers: int) -> tuple[subprocess.Popen | None, int | None, str | None]:
    exe = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx", "/sbin/nginx") if os.access(p, os.X_OK)), None)
    if exe is None:
        return None, None, "nginx not installed (apt-get install nginx); nginx target skipped"
    port = free_port()
    conf = tmp / "nginx.conf"
    conf.write_text(NGINX_CONF.format(workers=workers, tmp=tmp, up_port=up_port, port=port))
    proc = subprocess.Popen([exe, "-p", str(tmp), "-c", str(conf), "-e", str(tmp / "nginx-error.log")],
                            stderr=open(tmp / "nginx.stderr", "wb"))
    try:
        wait_http(f"http://127.0.0.1:{port}/health", 10)
    except RuntimeError:
        proc.kill()
        return None, None, "nginx did not start: " + (tmp / "nginx.stderr").read_text(errors="replace")[-300:]
    return proc, port, None


def gate_proc(tmp: Path, name: str, toml: str) -> subprocess.Popen:
    (tmp / f"{name}.toml").write_text(toml)
    return subprocess.Popen(
        [str(Path(sys.executable).with_name("tokengate")), "serve", "--config", str(tmp / f"{name}.toml"), "--log-level", "warning"],
        stderr=open(tmp / f"{name}.log", "wb"),
    )


def metric(url: str, name: str) -> float:
    with urllib.request.urlopen(url, timeout=5) as r:
        text = r.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{") or line.startswith(name + " "))


async def hold_requests(port: int, n: int, metrics_url: str, pid: int, timeout: float = 120.0) -> tuple[int, int, int]:
    """Open n connections, send one chat request on each, wait until they are queued, read the
    gate's RSS, then drop them. Returns (connections opened, queued, RSS KiB while held)."""
    req = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(BODY)}\r\n\r\n{BODY}"
    ).encode()
    sem = asyncio.Semaphore(256)
    writers: list = []

    async def one() -> None:
        async with sem:
            for _ in range(5):
                try:
                    _, w = await asyncio.open_connection("127.0.0.1", port)
                    break
                except OSError:
                    await asyncio.sleep(0.2)
            else:
                return
            w.write(req)
            await w.drain()
            writers.append(w)

    await asyncio.gather(*(one() for _ in range(n)))
    deadline = time.monotonic() + timeout
    queued = 0
    while time.monotonic() < deadline:
        queued = int(await asyncio.to_thread(metric, metrics_url, "tokengate_queue_depth"))
        if queued >= n - 1:  # one request holds the single slot
            break
        await asyncio.sleep(0.5)
    await asyncio.sleep(1.0)
    held = rss_kib(pid)
    for w in writers:
        w.transport.abort()
    await asyncio.sleep(0.1)
    return len(writers), queued, held


def stream_events(url: str) -> int:
    """SSE events (`data:` lines) in one streamed response, to check what is relayed."""
    req = urllib.request.Request(url, data=STREAM_BODY.encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return sum(1 for line in r.read().decode().splitlines() if line.startswith("data:"))


def refusal_sample(url: str) -> str:
    """Status and error code of one request to the refusing gate (to show what the flood is)."""
    req = urllib.request.Request(url, data=BODY.encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return f"{r.status} (not refused)"
    except urllib.error.HTTPError as e:
        body = e.read().decode(errors="replace")
        try:
            code = json.loads(body)["error"].get("code") or json.loads(body)["error"].get("type")
        except (ValueError, KeyError, AttributeError):
            code = body[:80]
        return f"{e.code} {code}"


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=int, default=10, help="seconds per wrk run")
    ap.add_argument("--rounds", type=int, default=2, help="alternating rounds per cell (median reported)")
    ap.add_argument("--nginx-workers", type=int, default=1, help="nginx worker_processes (default 1, like the one gate process)")
    ap.add_argument("--hold", type=int, default=10000, help="requests held in the queue for the RSS measurement (0 skips)")
    args = ap.parse_args()
    if shutil.which("wrk") is None:
        print("wrk not found: apt-get install wrk", file=sys.stderr)
        return 2
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    tmp = Path(tempfile.mkdtemp(prefix="tokengate-bench-"))
    up_port, gate_port, flood_port, hold_port, stub_port = (free_port() for _ in range(5))
    for name, lua in (("hit", LUA_HIT), ("miss", LUA_MISS), ("stream", LUA_STREAM)):
        (tmp / f"{name}.lua").write_text(lua)
    classes = '[classes.interactive]\npriority = 10\nqueue_depth = 4096\nqueue_timeout_s = 60\n'
    procs = [
        subprocess.Popen([sys.executable, str(HERE / "fake_upstream.py"), "--port", str(up_port), "--slots", "256", "--chunks", str(CHUNKS)]),
        gate_proc(tmp, "gate",
                  f'[gate]\nlisten = "127.0.0.1:{gate_port}"\njournal = "{tmp / "journal.db"}"\n'
                  f'[[backends]]\nurl = "http://127.0.0.1:{up_port}"\n'
                  '[budget]\nmode = "static"\n' + classes),
    ]
    notes: list[str] = []
    nginx, nginx_port, why = start_nginx(tmp, up_port, args.nginx_workers)
    if nginx is not None:
        procs.append(nginx)
    else:
        notes.append(why)
    if shutil.which("litellm") is None and not (Path(sys.executable).with_name("litellm")).exists():
        notes.append("litellm: not measured: LiteLLM is not installed in this environment (litellm[proxy] not in the venv)")
    else:
        notes.append("litellm: installed but not wired into this benchmark yet; not measured")
    out: dict = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
                 "duration_s": args.duration, "rounds": args.rounds, "nginx_workers": args.nginx_workers}
    try:
        wait_http(f"http://127.0.0.1:{up_port}/health")
        wait_http(f"http://127.0.0.1:{gate_port}/health")
        fake_pid, gate_pid = procs[0].pid, procs[1].pid
        nginx_pids = ([nginx.pid] + children(nginx.pid)) if nginx else []
        chat = "/v1/chat/completions"
        targets = {"direct": (f"http://127.0.0.1:{up_port}{chat}", tmp / "hit.lua", [fake_pid])}
        if nginx:
            targets["nginx"] = (f"http://127.0.0.1:{nginx_port}{chat}", tmp / "hit.lua", nginx_pids)
        targets["gate-hit"] = (f"http://127.0.0.1:{gate_port}{chat}", tmp / "hit.lua", [gate_pid])
        targets["gate-miss"] = (f"http://127.0.0.1:{gate_port}{chat}", tmp / "miss.lua", [gate_pid])
        results: dict[str, dict[int, list[dict]]] = {t: {c: [] for c in CONNS} for t in targets}
        for _ in range(args.rounds):
            for conns in CONNS:
                for name, (url, lua, pids) in targets.items():
                    results[name][conns].append(run_wrk(url, lua, conns, args.duration, pids))
        table = {}
        for name in targets:
            for conns in CONNS:
                runs = results[name][conns]
                table[f"{name}@{conns}"] = {
                    k: statistics.median([r[k] for r in runs if r[k] is not None])
                    for k in ("p50_ms", "p99_ms", "rps", "cpu_s_per_1k")
                } | {"non_2xx": sum(r["non_2xx"] for r in runs)}
        print(f"{'target':<16}{'p50 ms':>9}{'p99 ms':>9}{'req/s':>10}{'non-2xx':>9}{'added p50':>11}{'added p99':>11}{'cpu s/1k':>10}")
        for key, row in table.items():
            conns = key.split("@")[1]
            added = row["p50_ms"] - table[f"direct@{conns}"]["p50_ms"]
            added99 = row["p99_ms"] - table[f"direct@{conns}"]["p99_ms"]
            row["added_p50_ms"] = round(added, 3)
            row["added_p99_ms"] = round(added99, 3)
            print(f"{key:<16}{row['p50_ms']:>9.2f}{row['p99_ms']:>9.2f}{row['rps']:>10.0f}{row['non_2xx']:>9}"
                  f"{added:>11.2f}{added99:>11.2f}{row['cpu_s_per_1k']:>10.3f}")
        out["table"] = table
        out["saturation_rps"] = {name: max(table[f"{name}@{c}"]["rps"] for c in CONNS) for name in targets}

        # Relayed SSE chunks per second (streamed requests, 32 connections, one run per target).
        sse = {}
        for name, (url, _, pids) in targets.items():
            if name == "gate-miss":
                continue
            events = stream_events(url)
            r = run_wrk(url, tmp / "stream.lua", 32, args.duration, pids)
            sse[name.replace("-hit", "")] = {"rps": r["rps"], "chunks_per_s": r["rps"] * events, "events_seen": events, "p99_ms": r["p99_ms"],
                                              "non_2xx": r["non_2xx"], "cpu_s_per_1k": r["cpu_s_per_1k"]}
        out["sse_at_32"] = {"events_per_response": SSE_EVENTS, **sse}
        print(f"\nsaturation req/s: " + ", ".join(f"{k} {v:.0f}" for k, v in out["saturation_rps"].items()))
        print(f"SSE @32 conns ({SSE_EVENTS} events/response): "
              + ", ".join(f"{k} {v['chunks_per_s']:.0f} chunks/s ({v['rps']:.0f} streams/s, {v['events_seen']} events seen, "
                             f"non-2xx {v['non_2xx']}, cpu s/1k {v['cpu_s_per_1k']:.3f})" for k, v in sse.items()))
        stop([p for p in procs if p is not procs[0] and p is not procs[1]])  # nginx done

        # Refusal flood: every request is a never-fits refusal (400), answered at once.
        flood = gate_proc(tmp, "flood",
                          f'[gate]\nlisten = "127.0.0.1:{flood_port}"\njournal = "{tmp / "flood.db"}"\n'
                          f'[[backends]]\nurl = "http://127.0.0.1:{up_port}"\ntoken_budget = 16\n'
                          '[budget]\nmode = "static"\nmin_tokens = 16\n' + classes)
        procs.append(flood)
        wait_http(f"http://127.0.0.1:{flood_port}/health")
        out["refusal_flood"] = {"sample": refusal_sample(f"http://127.0.0.1:{flood_port}{chat}")}
        print(f"\nrefusal flood sample answer: {out['refusal_flood']['sample']}")
        for conns in (32, 128):
            r = run_wrk(f"http://127.0.0.1:{flood_port}{chat}", tmp / "hit.lua", conns, args.duration, [flood.pid])
            out["refusal_flood"][f"gate@{conns}"] = r
            print(f"refusal flood @{conns} (400 never-fits): {r['rps']:.0f} refusals/s, p50 {r['p50_ms']:.2f} ms, "
                  f"p99 {r['p99_ms']:.2f} ms, refused {r['non_2xx']}/{r['requests']}, cpu s/1k {r['cpu_s_per_1k']:.3f}")
        stop([flood])

        # Resident memory with N requests held in the queue.
        if args.hold:
            stub = subprocess.Popen([sys.executable, "-c", HOLD_STUB.format(here=str(HERE), port=stub_port)])
            procs.append(stub)
            wait_http(f"http://127.0.0.1:{stub_port}/health")
            hold = gate_proc(tmp, "hold",
                             f'[gate]\nlisten = "127.0.0.1:{hold_port}"\njournal = "{tmp / "hold.db"}"\n'
                             f'[[backends]]\nurl = "http://127.0.0.1:{stub_port}"\n'
                             '[budget]\nmode = "static"\n'
                             f'[classes.interactive]\npriority = 10\nqueue_depth = {args.hold + 1000}\nqueue_timeout_s = 600\n')
            procs.append(hold)
            wait_http(f"http://127.0.0.1:{hold_port}/health")
            time.sleep(1.0)
            idle = rss_kib(hold.pid)
            t0 = time.monotonic()
            opened, queued, held = asyncio.run(
                hold_requests(hold_port, args.hold, f"http://127.0.0.1:{hold_port}/metrics", hold.pid))
            out["hold_rss"] = {"requests": args.hold, "connections_open": opened, "queued": queued,
                               "rss_idle_mib": idle / 1024, "rss_held_mib": held / 1024,
                               "per_request_kib": (held - idle) / max(queued, 1), "fill_s": time.monotonic() - t0}
            print(f"hold: {queued} queued ({opened} connections): RSS {idle / 1024:.1f} MiB idle -> "
                  f"{held / 1024:.1f} MiB held ({(held - idle) / max(queued, 1):.1f} KiB/request)")
            stop([hold, stub])
        for n in notes:
            print(n)
        out["notes"] = notes
        (HERE / "results").mkdir(exist_ok=True)
        (HERE / "results" / "overhead.json").write_text(json.dumps(out, indent=2) + "\n")
    finally:
        stop(procs)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
