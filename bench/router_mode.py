"""Router mode: model load time, and what a burst meets while its model loads (REAL llama-server).

llama-server in router mode (``--models-dir`` with the tests' two tiny models, ``-c 2048 -np 2
-t 2``) with ``tokengate serve`` in front (its own process, journal on). Measured:

1. Load time: llama-server's own (``POST /models/load`` until ``GET /models`` says loaded,
   polled every 10 ms) and the gate's (``tokengate_model_load_seconds``: from its load call
   to the refresh that sees the model loaded), each model unloaded before every round; and
   what the first request to an unloaded model waited in the gate (``X-Tokengate-Queue-Ms``).
2. A burst of ``--burst`` chat requests (max_tokens 16) to an unloaded model, through the gate
   and then straight to llama-server (autoload on, as a client would): answers, the time
   each waited, llama-server's own queue for the model (``requests_deferred``, sampled every
   20 ms) and the router's hidden load queue (its log lines "queued at position" / "joined
   the queue").

    PYTHONPATH=. .venv/bin/python bench/router_mode.py [--rounds 5] [--burst 8]

Prints a table; writes bench/results/router_mode.json. Timings on a shared 2-core machine are
noisy; the counts (deferred, hidden queue) are not.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

from tests.llama.make_model import cached_model  # noqa: E402
from tests.llama.server import LlamaRouter, find_llama_server, free_port  # noqa: E402

CHAT = "/v1/chat/completions"
HIDDEN_QUEUE = ("queued at position", "joined the queue")
MODELS = ("tiny", "tiny2")


def gate_toml(port: int, router_url: str, workdir: Path) -> str:
    return f"""
[gate]
listen = "127.0.0.1:{port}"
journal = "{workdir / "journal.db"}"
[[backends]]
name = "router"
url = "{router_url}"
models = ["tiny", "tiny2"]
kv = "split"
[budget]
mode = "static"
min_tokens = 256
[classes.interactive]
priority = 10
queue_depth = 64
queue_timeout_s = 120
default_max_tokens = 16
"""


def start_gate(toml: str, port: int, workdir: Path) -> subprocess.Popen:
    config = workdir / "gate.toml"
    config.write_text(toml)
    exe = Path(sys.executable).with_name("tokengate")
    log = open(workdir / "gate.log", "ab")
    proc = subprocess.Popen(
        [str(exe), "serve", "--config", str(config), "--grace", "2", "--log-level", "warning"],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError((workdir / "gate.log").read_text()[-2000:])
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError("gate not ready")


def chat(model: str) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": "the quick brown fox jumps"}], "max_tokens": 16, "ignore_eos": True}


async def status(client: httpx.AsyncClient, router: LlamaRouter, model: str) -> str:
    data = (await client.get(router.url + "/models")).json()["data"]
    return next(m["status"]["value"] for m in data if m["id"] == model)


async def until(client: httpx.AsyncClient, router: LlamaRouter, model: str, wanted: str, poll_s: float = 0.01) -> None:
    deadline = time.monotonic() + 120
    while await status(client, router, model) != wanted:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{model} never {wanted}")
        await asyncio.sleep(poll_s)


async def unload(client: httpx.AsyncClient, router: LlamaRouter, model: str, gate_url: str | None = None) -> None:
    if await status(client, router, model) != "unloaded":
        await client.post(router.url + "/models/unload", json={"model": model})
        await until(client, router, model, "unloaded")
    if gate_url is not None:  # the gate sees it too before the next round
        deadline = time.monotonic() + 10
        while '"model_status": "unloaded"' not in json.dumps(
            (await client.get(gate_url + "/health")).json()["backends"][f"router/{model}"]
        ):
            if time.monotonic() > deadline:
                raise RuntimeError("gate did not see the unload")
            await asyncio.sleep(0.05)


def gate_metric(text: str, name: str, model: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + "{") and f'model="{model}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return None


async def burst(client: httpx.AsyncClient, router: LlamaRouter, url: str, model: str, n: int) -> dict:
    deferred: list[int] = []
    done = asyncio.Event()

    async def watch() -> None:
        while not done.is_set():
            r = await client.get(router.url + f"/metrics?model={model}&autoload=false")
            if r.status_code == 200:
                deferred.extend(int(float(x.split()[-1])) for x in r.text.splitlines() if x.startswith("llamacpp:requests_deferred"))
            await asyncio.sleep(0.02)

    before = len([x for x in router.log_text().splitlines() if any(p in x for p in HIDDEN_QUEUE)])
    watcher = asyncio.create_task(watch())
    t0 = time.monotonic()

    async def one() -> tuple[int, float, float | None]:
        start = time.monotonic()
        r = await client.post(url + CHAT, json=chat(model))
        queue = r.headers.get("x-tokengate-queue-ms")
        return r.status_code, time.monotonic() - start, None if queue is None else float(queue)

    answers = await asyncio.gather(*(one() for _ in range(n)))
    done.set()
    await watcher
    hidden = len([x for x in router.log_text().splitlines() if any(p in x for p in HIDDEN_QUEUE)]) - before
    return {
        "statuses": sorted(a[0] for a in answers),
        "latency_s": sorted(round(a[1], 3) for a in answers),
        "gate_queue_ms": sorted(round(a[2], 1) for a in answers if a[2] is not None),
        "wall_s": round(time.monotonic() - t0, 3),
        "deferred_max": max(deferred) if deferred else None,
        "deferred_samples": len(deferred),
        "hidden_queue_lines": hidden,
    }


async def run(args: argparse.Namespace) -> dict:
    binary = find_llama_server()
    with tempfile.TemporaryDirectory(prefix="tokengate-router-bench-") as tmp:
        work = Path(tmp)
        models = work / "models"
        models.mkdir()
        (models / "tiny.gguf").symlink_to(cached_model("default"))
        (models / "tiny2.gguf").symlink_to(cached_model("default", seed=4321))
        router = LlamaRouter(binary, models_dir=models, ctx=2048, n_slots=2, log_path=work / "router.log").start()
        port = free_port()
        gate_url = f"http://127.0.0.1:{port}"
        gate = start_gate(gate_toml(port, router.url, work), port, work)
        result: dict = {"rounds": []}
        try:
            async with httpx.AsyncClient(timeout=180) as client:
                for i in range(args.rounds):
                    model = MODELS[i % 2]
                    await unload(client, router, model)
                    t = time.monotonic()
                    await client.post(router.url + "/models/load", json={"model": model})
                    await until(client, router, model, "loaded")
                    direct_s = time.monotonic() - t
                    await unload(client, router, model, gate_url)
                    t = time.monotonic()
                    r = await client.post(gate_url + CHAT, json=chat(model))
                    first_s = time.monotonic() - t
                    text = (await client.get(gate_url + "/metrics")).text
                    result["rounds"].append(
                        {
                            "model": model,
                            "llama_load_s": round(direct_s, 3),
                            "gate_load_s": round(gate_metric(text, "tokengate_model_load_seconds", model) or -1, 3),
                            "first_request_queue_ms": float(r.headers["x-tokengate-queue-ms"]),
                            "first_request_s": round(first_s, 3),
                            "status": r.status_code,
                        }
                    )
                    print(f"round {i + 1}: {result['rounds'][-1]}", flush=True)
                await unload(client, router, "tiny", gate_url)
                result["burst_gate"] = await burst(client, router, gate_url, "tiny", args.burst)
                print(f"burst through the gate: {result['burst_gate']}", flush=True)
                await unload(client, router, "tiny2", gate_url)
                result["burst_direct"] = await burst(client, router, router.url, "tiny2", args.burst)
                print(f"burst straight to llama-server: {result['burst_direct']}", flush=True)
        finally:
            gate.send_signal(signal.SIGTERM)
            gate.wait(20)
            router.stop()
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--burst", type=int, default=8)
    args = ap.parse_args()
    result = asyncio.run(run(args))
    rounds = result["rounds"]
    med = lambda key: statistics.median(r[key] for r in rounds)  # noqa: E731
    print("\n| measure | median | all |\n| --- | --- | --- |")
    for key in ("llama_load_s", "gate_load_s", "first_request_queue_ms", "first_request_s"):
        print(f"| {key} | {med(key)} | {', '.join(str(r[key]) for r in rounds)} |")
    print("\n| burst of %d to an unloaded model | answers | waited (s) | llama-server deferred max | hidden-queue lines |" % args.burst)
    print("| --- | --- | --- | --- | --- |")
    for name in ("burst_gate", "burst_direct"):
        b = result[name]
        print(
            f"| {name.split('_')[1]} | {b['statuses']} | {b['latency_s'][0]}..{b['latency_s'][-1]} | {b['deferred_max']} ({b['deferred_samples']} samples) | {b['hidden_queue_lines']} |"
        )
    result["machine"] = {"python": platform.python_version(), "platform": platform.platform(), "date": time.strftime("%Y-%m-%d")}
    out = HERE / "results" / "router_mode.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
