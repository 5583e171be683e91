"""Added latency and throughput of the gate against a fast FAKE upstream, driven by wrk.

Starts bench/fake_upstream.py and `tokengate serve` (journal on, metrics on) on
loopback ports, then runs wrk against each target in alternating rounds so
machine noise hits all alike:
  direct    the fake upstream itself (the floor)
  nginx     nginx as a plain reverse proxy to the fake (the physical floor for a
            proxy hop; Debian package `nginx`, started here on a loopback port
            with a generated config, HTTP/1.1 keep-alive upstream, no buffering)
  litellm   the LiteLLM proxy (PyPI `litellm[proxy]`, the Python peer people reach
            for) as an OpenAI-compatible passthrough to the fake: one worker, no
            database, drop_params on, access log left at its default (one line per
            request, into a log file here); needs its master key on every request
  gate-hit  through tokengate, the same prompt every time (token count cached)
  gate-miss through tokengate, a new prompt every request (exact tokenization each time)
at 1, 32 and 128 connections. Every body carries "model":"fake": LiteLLM routes
on it, the gate's only backend is a catch-all and the fake ignores it. Per cell:
p50/p99 latency, the latency added over direct, requests/s, and CPU seconds per
1,000 requests of the target's own process(es) (utime+stime from
/proc/<pid>/stat, plus cutime+cstime of children they reaped: direct = the fake,
nginx = master + workers, litellm = its process and descendants, gate = the
tokengate process; the fake behind a proxy is not counted). For the gate, the
ratios gate/litellm of added p50 and of CPU per 1k at 1 and 32 connections
(the issue's target: each at most 1/5). Then, per target, relayed SSE chunks/s
(streamed requests of max_tokens 64 at 32 connections; chunks/s = streams/s x
the `data:` events counted in one response through that target: the fake sends
64 content chunks + finish + usage + [DONE] in one write, and the gate drops the
usage chunk unless the client asked for stream_options.include_usage, so it
relays 66). Through
tokengate only:
  refusals/s  a second gate whose backend token_budget (16) is smaller than any
              request's cost, so every request is refused at once (400
              context_length_exceeded, never queued): a refusal flood
  hold RSS    a third gate in front of a stub that never answers completions
              (1 slot): 10,000 requests are held in its queue, and its resident
              memory (VmRSS) is read before and while they wait
Prints tables and writes bench/results/overhead.json.

    .venv/bin/python bench/overhead.py [--duration 10] [--rounds 2] [--hold 10000] [--litellm PATH]
Needs wrk (Debian package `wrk`); nginx (Debian package `nginx`) for the nginx
target. LiteLLM pins many packages of its own, so it lives in its own venv:
`bash bench/install_litellm.sh` makes one (under $TOKENGATE_CACHE, default
~/.cache/tokengate) and prints the executable's path. --litellm defaults to
$TOKENGATE_BENCH_LITELLM, else that venv's litellm if present, else `litellm`
on PATH; without one, the litellm target is reported as not measured, and why.
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
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
BODY = '{"model":"fake","messages":[{"role":"user","content":"hello there"}],"max_tokens":8}'
# Streams of 64 tokens (the fake sends one event per token, like llama-server): long
# enough that relaying events, not starting requests, is what is measured.
STREAM_BODY = '{"model":"fake","messages":[{"role":"user","content":"hello there"}],"max_tokens":64,"stream":true}'
CONNS = (1, 32, 128)
RATIO_CONNS = (1, 32)
RATIO_TARGET = 0.2  # the issue: the gate's added latency and CPU at most 1/5 of LiteLLM's
CHUNKS = 8
SSE_EVENTS = 64 + 3  # STREAM_BODY's 64 content chunks + finish chunk + usage chunk + [DONE]
LITELLM_VERSION = "1.108.7"  # keep in step with bench/install_litellm.sh
# The proxy refuses to start without a master key; then every request must carry it.
LITELLM_KEY = "sk-bench-0123456789abcdef"
LITELLM_AUTH = {"Authorization": f"Bearer {LITELLM_KEY}"}
LITELLM_CONF = """model_list:
  - model_name: fake
    litellm_params: {{model: openai/fake, api_base: "http://127.0.0.1:{up_port}/v1", api_key: none}}
litellm_settings: {{drop_params: true}}
"""


def lua_fixed(body: str, headers: dict[str, str] | None = None) -> str:
    """A wrk script that POSTs the same JSON body on every request."""
    lines = ['wrk.method = "POST"', 'wrk.headers["Content-Type"] = "application/json"']
    lines += [f'wrk.headers["{k}"] = "{v}"' for k, v in (headers or {}).items()]
    return "\n".join(lines + [f"wrk.body = '{body}'", ""])


LUA_HIT = lua_fixed(BODY)
LUA_STREAM = lua_fixed(STREAM_BODY)
LUA_MISS = """wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local counter = 0
local tid = 0
function setup(thread) tid = tid + 1; thread:set("tid", tid) end
function init(args) tid = wrk.thread:get("tid") or 0 end
request = function()
  counter = counter + 1
  return wrk.format(nil, nil, nil, '{"model":"fake","messages":[{"role":"user","content":"hello there ' .. tid .. '-' .. counter .. '"}],"max_tokens":8}')
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
f.FakeLlama.answer_completions = False
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
    sock = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    return {
        **lat,
        "rps": float(rps.group(1)) if rps else None,
        "non_2xx": int(non2xx.group(1)) if non2xx else 0,
        "errors": sum(int(n) for n in sock.groups()) if sock else 0,
        "requests": int(done.group(1)) if done else 0,
    }


def children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def descendants(pid: int) -> list[int]:
    """The process and everything below it (a proxy's workers, say)."""
    out = [pid]
    for child in children(pid):
        out += descendants(child)
    return out


def cpu_seconds(pids: list[int]) -> float:
    """utime + stime of the processes, plus cutime + cstime of children they reaped
    (so a helper that exits mid-run is still counted), from their own /proc accounting."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(f) for f in fields[11:15])  # utime, stime, cutime, cstime (fields 14-17)
    return total / CLK_TCK


def rss_kib(pid: int) -> int:
    m = re.search(r"VmRSS:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text())
    return int(m.group(1)) if m else 0


def run_wrk(url: str, lua: Path, conns: int, duration: int, pids: list[int]) -> dict:
    threads = 1 if conns == 1 else 2
    before = cpu_seconds(pids)
    # wrk leaves answers slower than its timeout (2 s by default) out of the latency histogram,
    # which would flatter a slow target's p99 at 128 connections.
    out = subprocess.run(
        ["wrk", f"-t{threads}", f"-c{conns}", f"-d{duration}s", "--timeout", "30s", "--latency", "-s", str(lua), url],
        capture_output=True,
        text=True,
        check=True,
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
    proc = subprocess.Popen(
        [exe, "-p", str(tmp), "-c", str(conf), "-e", str(tmp / "nginx-error.log")], stderr=open(tmp / "nginx.stderr", "wb")
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/health", 10)
    except RuntimeError:
        proc.kill()
        return None, None, "nginx did not start: " + (tmp / "nginx.stderr").read_text(errors="replace")[-300:]
    return proc, port, None


def cache_root() -> Path:
    """Where bench/install_litellm.sh keeps its venv (the same root as tests/llama/build_llama_server.sh)."""
    if os.environ.get("TOKENGATE_CACHE"):
        return Path(os.environ["TOKENGATE_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tokengate"


def default_litellm() -> str | None:
    """--litellm's default: $TOKENGATE_BENCH_LITELLM, else install_litellm.sh's venv, else PATH."""
    if os.environ.get("TOKENGATE_BENCH_LITELLM"):
        return os.environ["TOKENGATE_BENCH_LITELLM"]
    cached = cache_root() / f"litellm-{LITELLM_VERSION}" / "bin" / "litellm"
    return str(cached) if cached.exists() else shutil.which("litellm")


def find_litellm(choice: str | None) -> tuple[str | None, str | None]:
    """(executable, None), or (None, why it is not measured and how to install it)."""
    install = (
        f"install it with `bash bench/install_litellm.sh` (litellm[proxy]=={LITELLM_VERSION} in its own venv, "
        "never the project's: it pins many packages) and rerun, or pass --litellm PATH"
    )
    if not choice:
        where = cache_root() / f"litellm-{LITELLM_VERSION}"
        return (
            None,
            f"litellm: not measured: no litellm executable ($TOKENGATE_BENCH_LITELLM unset, no venv at {where}, none on PATH); {install}",
        )
    exe = shutil.which(choice)
    if exe is None:
        return None, f"litellm: not measured: {choice} is not an executable; {install}"
    return exe, None


def litellm_version(exe: str) -> str | None:
    """From the installed package's metadata: `litellm --version` costs seconds of imports."""
    root = Path(exe).parent.parent
    found = sorted(root.glob("lib/python*/site-packages/litellm-*.dist-info"))
    return found[0].name.removeprefix("litellm-").removesuffix(".dist-info") if found else None


def launch_litellm(tmp: Path, exe: str, up_port: int) -> tuple[subprocess.Popen, int]:
    """Start the proxy without waiting: it takes 7-25 s to boot, time the other targets use."""
    port = free_port()
    conf = tmp / "litellm.yaml"
    conf.write_text(LITELLM_CONF.format(up_port=up_port))
    env = {
        **os.environ,
        "LITELLM_MASTER_KEY": LITELLM_KEY,
        # Without it, startup fetches a model cost map from the internet and waits for it.
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    }
    proc = subprocess.Popen(
        [exe, "--config", str(conf), "--host", "127.0.0.1", "--port", str(port), "--num_workers", "1"],
        stdout=open(tmp / "litellm.log", "wb"),
        stderr=subprocess.STDOUT,
        env=env,
        cwd=tmp,
        start_new_session=True,  # its own process group, so nothing it spawns outlives the benchmark
    )
    return proc, port


def log_tail(path: Path, n: int = 300) -> str:
    try:
        return path.read_text(errors="replace")[-n:].strip()
    except OSError:
        return ""


def await_litellm(proc: subprocess.Popen, port: int, tmp: Path, timeout: float = 180.0) -> str | None:
    """None once it serves a chat completion, else why not (with its log's tail)."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            wait_http(f"http://127.0.0.1:{port}/health/liveliness", 1.0)
            break
        except RuntimeError:
            continue
    else:
        state = f"exited with status {proc.returncode}" if proc.poll() is not None else f"not ready after {timeout:.0f} s"
        return f"litellm: not measured: it {state}: {log_tail(tmp / 'litellm.log') or '(its log is empty)'}"
    answer = post_status(f"http://127.0.0.1:{port}/v1/chat/completions", LITELLM_AUTH)
    return None if answer == "200" else f"litellm: not measured: a chat completion through it answered {answer}"


def post_status(url: str, headers: dict[str, str] | None = None) -> str:
    """The status of one chat request, with the error body's start when it is not 200."""
    req = urllib.request.Request(url, data=BODY.encode(), headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return str(r.status)
    except urllib.error.HTTPError as e:
        return f"{e.code} {e.read()[:200].decode(errors='replace')}"
    except OSError as e:
        return f"no answer ({e})"


def kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


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


def stream_events(url: str, headers: dict[str, str] | None = None) -> int:
    """SSE events (`data:` lines) in one streamed response, to check what is relayed."""
    req = urllib.request.Request(url, data=STREAM_BODY.encode(), headers={"Content-Type": "application/json", **(headers or {})})
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


@dataclass(frozen=True)
class Target:
    url: str
    lua: Path
    pids: list[int]
    stream_lua: Path | None = None  # None: not measured for SSE (gate-miss streams like gate-hit)
    headers: dict[str, str] = field(default_factory=dict)


def measure(targets: dict[str, Target], rounds: int, duration: int, conn_counts: tuple[int, ...] = CONNS) -> dict[str, dict]:
    """Alternate targets within each round, so machine noise hits all alike; median per cell.
    Latency added is over the target named "direct"."""
    results: dict[str, dict[int, list[dict]]] = {t: {c: [] for c in conn_counts} for t in targets}
    for _ in range(rounds):
        for conns in conn_counts:
            for name, t in targets.items():
                results[name][conns].append(run_wrk(t.url, t.lua, conns, duration, t.pids))
    table = {}
    for name in targets:
        for conns in conn_counts:
            runs = results[name][conns]
            table[f"{name}@{conns}"] = {
                k: statistics.median([r[k] for r in runs if r[k] is not None]) for k in ("p50_ms", "p99_ms", "rps", "cpu_s_per_1k")
            } | {"non_2xx": sum(r["non_2xx"] for r in runs), "errors": sum(r["errors"] for r in runs)}
    for key, row in table.items():
        floor = table[f"direct@{key.split('@')[1]}"]
        row["added_p50_ms"] = round(row["p50_ms"] - floor["p50_ms"], 3)
        row["added_p99_ms"] = round(row["p99_ms"] - floor["p99_ms"], 3)
    return table


def print_table(table: dict[str, dict], names: list[str], conn_counts: tuple[int, ...] = CONNS) -> None:
    """One block per connection count, so every target sits next to the others at that load."""
    print(
        f"{'target':<16}{'p50 ms':>9}{'p99 ms':>10}{'req/s':>10}{'non-2xx':>9}{'sock err':>9}"
        f"{'added p50':>11}{'added p99':>11}{'cpu s/1k':>10}"
    )
    for conns in conn_counts:
        for name in names:
            row = table[f"{name}@{conns}"]
            print(
                f"{name + '@' + str(conns):<16}{row['p50_ms']:>9.2f}{row['p99_ms']:>10.2f}{row['rps']:>10.0f}"
                f"{row['non_2xx']:>9}{row['errors']:>9}{row['added_p50_ms']:>11.2f}{row['added_p99_ms']:>11.2f}"
                f"{row['cpu_s_per_1k']:>10.3f}"
            )
        if conns != conn_counts[-1]:
            print()


def ratio(num: float | None, den: float | None) -> float | None:
    return round(num / den, 4) if num is not None and den else None


def vs_litellm(table: dict[str, dict]) -> dict[str, dict]:
    """Gate over LiteLLM, added p50 and CPU per 1k requests; the issue wants each <= RATIO_TARGET."""
    out = {}
    for gate in ("gate-hit", "gate-miss"):
        for conns in RATIO_CONNS:
            g, lite = table[f"{gate}@{conns}"], table[f"litellm@{conns}"]
            p50 = ratio(g["added_p50_ms"], lite["added_p50_ms"])
            cpu = ratio(g["cpu_s_per_1k"], lite["cpu_s_per_1k"])
            out[f"{gate}@{conns}"] = {
                "added_p50_ratio": p50,
                "cpu_per_1k_ratio": cpu,
                "target": RATIO_TARGET,
                "met": p50 is not None and cpu is not None and p50 <= RATIO_TARGET and cpu <= RATIO_TARGET,
            }
            print(
                f"{gate}@{conns} / litellm@{conns}: added p50 {g['added_p50_ms']:.2f} / {lite['added_p50_ms']:.2f} ms = {fmt(p50)}, "
                f"cpu s/1k {g['cpu_s_per_1k']:.3f} / {lite['cpu_s_per_1k']:.3f} = {fmt(cpu)} "
                f"(target <= {RATIO_TARGET:g} each: {'met' if out[f'{gate}@{conns}']['met'] else 'NOT met'})"
            )
    return out


def fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def measure_sse(targets: dict[str, Target], duration: int) -> dict[str, dict]:
    """Relayed SSE chunks/s at 32 connections, one run per target."""
    sse = {}
    for name, t in targets.items():
        if t.stream_lua is None:
            continue
        events = stream_events(t.url, t.headers)
        r = run_wrk(t.url, t.stream_lua, 32, duration, t.pids)
        sse[name.replace("-hit", "")] = {
            "rps": r["rps"],
            "chunks_per_s": r["rps"] * events,
            "events_seen": events,
            "p99_ms": r["p99_ms"],
            "non_2xx": r["non_2xx"],
            "errors": r["errors"],
            "cpu_s_per_1k": r["cpu_s_per_1k"],
        }
    return sse


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=int, default=10, help="seconds per wrk run")
    ap.add_argument("--rounds", type=int, default=2, help="alternating rounds per cell (median reported)")
    ap.add_argument("--nginx-workers", type=int, default=1, help="nginx worker_processes (default 1, like the one gate process)")
    ap.add_argument("--hold", type=int, default=10000, help="requests held in the queue for the RSS measurement (0 skips)")
    ap.add_argument(
        "--litellm",
        default=default_litellm(),
        metavar="PATH",
        help="litellm executable (default: $TOKENGATE_BENCH_LITELLM, else the venv bench/install_litellm.sh makes, else litellm on PATH)",
    )
    args = ap.parse_args()
    if shutil.which("wrk") is None:
        print("wrk not found: apt-get install wrk", file=sys.stderr)
        return 2
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    tmp = Path(tempfile.mkdtemp(prefix="tokengate-bench-"))
    up_port, gate_port, flood_port, hold_port, stub_port = (free_port() for _ in range(5))
    for name, lua in (
        ("hit", LUA_HIT),
        ("miss", LUA_MISS),
        ("stream", LUA_STREAM),
        ("litellm-hit", lua_fixed(BODY, LITELLM_AUTH)),
        ("litellm-stream", lua_fixed(STREAM_BODY, LITELLM_AUTH)),
    ):
        (tmp / f"{name}.lua").write_text(lua)
    classes = "[classes.interactive]\npriority = 10\nqueue_depth = 4096\nqueue_timeout_s = 60\n"
    procs = [
        subprocess.Popen(
            [sys.executable, str(HERE / "fake_upstream.py"), "--port", str(up_port), "--slots", "256", "--chunks", str(CHUNKS)]
        ),
        gate_proc(
            tmp,
            "gate",
            f'[gate]\nlisten = "127.0.0.1:{gate_port}"\njournal = "{tmp / "journal.db"}"\n'
            f'[[backends]]\nurl = "http://127.0.0.1:{up_port}"\n'
            '[budget]\nmode = "static"\n' + classes,
        ),
    ]
    notes: list[str] = []
    out: dict = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "duration_s": args.duration,
        "rounds": args.rounds,
        "nginx_workers": args.nginx_workers,
    }
    litellm_exe, why = find_litellm(args.litellm)
    litellm_proc = litellm = None
    if litellm_exe is None:
        notes.append(why)
    else:
        litellm_proc, litellm_port = launch_litellm(tmp, litellm_exe, up_port)
        procs.append(litellm_proc)
    nginx, nginx_port, why = start_nginx(tmp, up_port, args.nginx_workers)
    if nginx is not None:
        procs.append(nginx)
    else:
        notes.append(why)
    try:
        wait_http(f"http://127.0.0.1:{up_port}/health")
        wait_http(f"http://127.0.0.1:{gate_port}/health")
        if litellm_proc is not None:
            why = await_litellm(litellm_proc, litellm_port, tmp)
            if why is None:
                litellm = litellm_proc
            else:
                notes.append(why)
                stop([litellm_proc])
        fake_pid, gate_pid = procs[0].pid, procs[1].pid
        chat = "/v1/chat/completions"
        hit, miss, stream = tmp / "hit.lua", tmp / "miss.lua", tmp / "stream.lua"
        targets = {"direct": Target(f"http://127.0.0.1:{up_port}{chat}", hit, [fake_pid], stream)}
        if nginx:
            targets["nginx"] = Target(f"http://127.0.0.1:{nginx_port}{chat}", hit, [nginx.pid] + children(nginx.pid), stream)
        if litellm:
            targets["litellm"] = Target(
                f"http://127.0.0.1:{litellm_port}{chat}",
                tmp / "litellm-hit.lua",
                descendants(litellm.pid),
                tmp / "litellm-stream.lua",
                LITELLM_AUTH,
            )
            out["litellm"] = {
                "executable": litellm_exe,
                "version": litellm_version(litellm_exe),
                "workers": 1,
                "pids_counted": len(targets["litellm"].pids),
            }
            notes.append(
                f"litellm {out['litellm']['version'] or '(version unknown)'} ({litellm_exe}): one worker, no database, "
                "drop_params on, access log left at its default (a line per request, to a log file); "
                "CPU = its process and descendants"
            )
        targets["gate-hit"] = Target(f"http://127.0.0.1:{gate_port}{chat}", hit, [gate_pid], stream)
        targets["gate-miss"] = Target(f"http://127.0.0.1:{gate_port}{chat}", miss, [gate_pid])
        table = measure(targets, args.rounds, args.duration)
        print_table(table, list(targets))
        out["table"] = table
        out["saturation_rps"] = {name: max(table[f"{name}@{c}"]["rps"] for c in CONNS) for name in targets}
        out["vs_litellm"] = None  # not measured: the notes say why
        if litellm:
            print()
            out["vs_litellm"] = vs_litellm(table)

        sse = measure_sse(targets, args.duration)
        out["sse_at_32"] = {"events_per_response": SSE_EVENTS, **sse}
        print("\nsaturation req/s: " + ", ".join(f"{k} {v:.0f}" for k, v in out["saturation_rps"].items()))
        print(f"SSE @32 conns ({SSE_EVENTS} events/response from the fake):")
        for k, v in sse.items():
            print(
                f"  {k:<8} {v['chunks_per_s']:>8.0f} chunks/s ({v['rps']:.0f} streams/s, {v['events_seen']} events seen, "
                f"non-2xx {v['non_2xx']}, sock err {v['errors']}, cpu s/1k {v['cpu_s_per_1k']:.3f})"
            )
        stop([p for p in procs if p is not procs[0] and p is not procs[1]])  # nginx and litellm done

        # Refusal flood: every request is a never-fits refusal (400), answered at once.
        flood = gate_proc(
            tmp,
            "flood",
            f'[gate]\nlisten = "127.0.0.1:{flood_port}"\njournal = "{tmp / "flood.db"}"\n'
            f'[[backends]]\nurl = "http://127.0.0.1:{up_port}"\ntoken_budget = 16\n'
            '[budget]\nmode = "static"\nmin_tokens = 16\n' + classes,
        )
        procs.append(flood)
        wait_http(f"http://127.0.0.1:{flood_port}/health")
        out["refusal_flood"] = {"sample": refusal_sample(f"http://127.0.0.1:{flood_port}{chat}")}
        print(f"\nrefusal flood sample answer: {out['refusal_flood']['sample']}")
        for conns in (32, 128):
            r = run_wrk(f"http://127.0.0.1:{flood_port}{chat}", tmp / "hit.lua", conns, args.duration, [flood.pid])
            out["refusal_flood"][f"gate@{conns}"] = r
            print(
                f"refusal flood @{conns} (400 never-fits): {r['rps']:.0f} refusals/s, p50 {r['p50_ms']:.2f} ms, "
                f"p99 {r['p99_ms']:.2f} ms, refused {r['non_2xx']}/{r['requests']}, cpu s/1k {r['cpu_s_per_1k']:.3f}"
            )
        stop([flood])

        # Resident memory with N requests held in the queue.
        if args.hold:
            stub = subprocess.Popen([sys.executable, "-c", HOLD_STUB.format(here=str(HERE), port=stub_port)])
            procs.append(stub)
            wait_http(f"http://127.0.0.1:{stub_port}/health")
            hold = gate_proc(
                tmp,
                "hold",
                f'[gate]\nlisten = "127.0.0.1:{hold_port}"\njournal = "{tmp / "hold.db"}"\n'
                f'[[backends]]\nurl = "http://127.0.0.1:{stub_port}"\n'
                '[budget]\nmode = "static"\n'
                f"[classes.interactive]\npriority = 10\nqueue_depth = {args.hold + 1000}\nqueue_timeout_s = 600\n",
            )
            procs.append(hold)
            wait_http(f"http://127.0.0.1:{hold_port}/health")
            time.sleep(1.0)
            idle = rss_kib(hold.pid)
            t0 = time.monotonic()
            opened, queued, held = asyncio.run(hold_requests(hold_port, args.hold, f"http://127.0.0.1:{hold_port}/metrics", hold.pid))
            out["hold_rss"] = {
                "requests": args.hold,
                "connections_open": opened,
                "queued": queued,
                "rss_idle_mib": idle / 1024,
                "rss_held_mib": held / 1024,
                "per_request_kib": (held - idle) / max(queued, 1),
                "fill_s": time.monotonic() - t0,
            }
            print(
                f"hold: {queued} queued ({opened} connections): RSS {idle / 1024:.1f} MiB idle -> "
                f"{held / 1024:.1f} MiB held ({(held - idle) / max(queued, 1):.1f} KiB/request)"
            )
            stop([hold, stub])
        for n in notes:
            print(n)
        out["notes"] = notes
        (HERE / "results").mkdir(exist_ok=True)
        (HERE / "results" / "overhead.json").write_text(json.dumps(out, indent=2) + "\n")
    finally:
        stop(procs)
        if litellm_proc is not None:
            kill_group(litellm_proc)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
