"""How fast can a minimal Python relay be with each HTTP client? (httpx vs aiohttp)

DESIGN.md's stack has the gate make every upstream call with httpx. When the
gate misses a throughput or CPU target, this measures how much of that is the
client library rather than the gate: a bare Starlette app on uvicorn (uvloop +
httptools, log level warning, one process) whose one POST route forwards the
request body to bench/fake_upstream.py and returns the upstream's JSON answer
as is. Nothing else: no token counting, no admission, no journal. Variants,
each in its own server process:
  httpx          one shared httpx.AsyncClient, keep-alive pool (the gate's
                 client settings: unbounded pool, 256 idle, 2 s keep-alive)
  httpx-close    the same, sending `Connection: close` on every upstream request,
                 as the gate must: llama-server drops kept-alive connections
                 after a streamed answer without saying so
  httpx_asyncio  httpx with the same settings, its connection pool given a
                 PROTOTYPE network backend on plain asyncio streams instead of
                 anyio (how much of httpx's cost is anyio); `-close` as above
  aiohttp        one shared aiohttp.ClientSession, keep-alive (unbounded pool)
  aiohttp-close  the same with `Connection: close`
plus `direct`, wrk straight at the fake (the floor). wrk drives each at 1 and
32 connections, variants alternated within each round so machine noise hits
all alike (median over rounds). Per cell: p50/p99, latency added over direct,
requests/s, and CPU seconds per 1,000 requests of the relay process
(utime+stime from /proc/<pid>/stat; for direct, the fake's). The fake behind a
relay is not counted. Without aiohttp installed, only the httpx variants run
and the output says why. Prints a table and writes
bench/results/upstream_clients.json.

    .venv/bin/pip install -e '.[bench]'     # aiohttp, for its variants
    .venv/bin/python bench/upstream_clients.py [--duration 10] [--rounds 2]
Needs wrk (Debian package `wrk`). One relay alone, for poking at by hand:
    .venv/bin/python bench/upstream_clients.py serve VARIANT PORT UPSTREAM_URL
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import itertools
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from overhead import (  # noqa: E402  (bench/ is not a package)
    CHUNKS,
    LUA_HIT,
    Target,
    fmt,
    free_port,
    measure,
    post_status,
    print_table,
    ratio,
    stop,
    wait_http,
)

VARIANTS = ("httpx", "httpx-close", "httpx_asyncio", "httpx_asyncio-close", "aiohttp", "aiohttp-close")
CONN_COUNTS = (1, 32)
CHAT = "/v1/chat/completions"
Forward = Callable[[bytes], Awaitable[tuple[int, bytes]]]


def upstream_headers(close: bool) -> dict[str, str]:
    # What the gate sends: llama-server drops kept-alive connections after a streamed answer.
    return {"Content-Type": "application/json", **({"Connection": "close"} if close else {})}


@asynccontextmanager
async def httpx_forwarder(url: str, close: bool) -> AsyncIterator[Forward]:
    import httpx

    headers = upstream_headers(close)  # h11 closes its end after an answer to a `Connection: close` request

    # The gate's own client settings (gate/service.py), so the figures carry over to it.
    async with httpx.AsyncClient(
        timeout=httpx.Timeout(connect=5.0, read=None, write=30.0, pool=30.0),
        limits=httpx.Limits(max_connections=None, max_keepalive_connections=256, keepalive_expiry=2.0),
    ) as client:

        async def forward(body: bytes) -> tuple[int, bytes]:
            r = await client.post(url, content=body, headers=headers)
            return r.status_code, r.content

        yield forward


def asyncio_network_backend():
    """PROTOTYPE (bench only): an httpcore network backend on plain asyncio streams.

    httpx sits on httpcore, which does its socket I/O through anyio (a cancel scope
    and a sniffio lookup around every read and write). This backend keeps httpx and
    httpcore and swaps only that layer, to measure how much of httpx's cost is anyio.
    """
    import asyncio

    import httpcore

    class Stream(httpcore.AsyncNetworkStream):
        def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self._reader, self._writer = reader, writer

        async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
            try:
                async with asyncio.timeout(timeout):
                    return await self._reader.read(max_bytes)
            except TimeoutError:
                raise httpcore.ReadTimeout("read timed out") from None
            except OSError as e:
                raise httpcore.ReadError(str(e)) from e

        async def write(self, buffer: bytes, timeout: float | None = None) -> None:
            if not buffer:
                return
            try:
                self._writer.write(buffer)
                async with asyncio.timeout(timeout):
                    await self._writer.drain()
            except TimeoutError:
                raise httpcore.WriteTimeout("write timed out") from None
            except OSError as e:
                raise httpcore.WriteError(str(e)) from e

        async def aclose(self) -> None:
            self._writer.close()

        def get_extra_info(self, info: str):
            if info == "is_readable":  # httpcore asks before reusing a pooled connection
                return self._reader.at_eof()
            return self._writer.get_extra_info({"client_addr": "sockname", "server_addr": "peername"}.get(info, info))

    class Backend(httpcore.AsyncNetworkBackend):
        async def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
            try:
                async with asyncio.timeout(timeout):
                    reader, writer = await asyncio.open_connection(host, port)
            except TimeoutError:
                raise httpcore.ConnectTimeout("connect timed out") from None
            except OSError as e:
                raise httpcore.ConnectError(str(e)) from e
            return Stream(reader, writer)

        async def sleep(self, seconds: float) -> None:
            await asyncio.sleep(seconds)

    return Backend()


@asynccontextmanager
async def httpx_asyncio_forwarder(url: str, close: bool) -> AsyncIterator[Forward]:
    import httpcore
    import httpx

    headers = upstream_headers(close)
    transport = httpx.AsyncHTTPTransport()
    # httpx has no public way to give its transport a network backend: swap the pool.
    transport._pool = httpcore.AsyncConnectionPool(
        max_connections=None,
        max_keepalive_connections=256,
        keepalive_expiry=2.0,
        network_backend=asyncio_network_backend(),
    )
    async with httpx.AsyncClient(transport=transport, timeout=httpx.Timeout(connect=5.0, read=None, write=30.0, pool=30.0)) as client:

        async def forward(body: bytes) -> tuple[int, bytes]:
            r = await client.post(url, content=body, headers=headers)
            return r.status_code, r.content

        yield forward


@asynccontextmanager
async def aiohttp_forwarder(url: str, close: bool) -> AsyncIterator[Forward]:
    import aiohttp

    headers = upstream_headers(close)
    # limit=0: unbounded like the httpx pool above, so neither waits for a pooled connection.
    # aiohttp sends a `Connection: close` header but still pools the connection unless the
    # server closes it (the fake does not); force_close makes it open one per request, like h11.
    pooling = {"force_close": True} if close else {"keepalive_timeout": 2.0}  # aiohttp refuses both at once
    connector = aiohttp.TCPConnector(limit=0, **pooling)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=5.0)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def forward(body: bytes) -> tuple[int, bytes]:
            async with session.post(url, data=body, headers=headers) as r:
                return r.status, await r.read()

        yield forward


def build_app(variant: str, upstream: str):
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    lib, _, mode = variant.partition("-")
    open_forwarder = {"httpx": httpx_forwarder, "httpx_asyncio": httpx_asyncio_forwarder, "aiohttp": aiohttp_forwarder}[lib]
    state: dict[str, Forward] = {}

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with open_forwarder(upstream, mode == "close") as forward:
            state["forward"] = forward
            yield

    async def relay(request: Request) -> Response:
        status, body = await state["forward"](await request.body())
        return Response(body, status_code=status, media_type="application/json")

    async def health(request: Request) -> Response:
        return Response(b'{"status":"ok"}', media_type="application/json")

    return Starlette(routes=[Route(CHAT, relay, methods=["POST"]), Route("/health", health)], lifespan=lifespan)


def serve(variant: str, port: str, upstream: str) -> None:
    """One relay process: `upstream_clients.py serve VARIANT PORT UPSTREAM_URL`."""
    import uvicorn

    uvicorn.run(build_app(variant, upstream), host="127.0.0.1", port=int(port), loop="uvloop", http="httptools", log_level="warning")


def versions(names: list[str]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def start_relay(tmp: Path, variant: str, up_port: int) -> tuple[subprocess.Popen, int]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "serve", variant, str(port), f"http://127.0.0.1:{up_port}{CHAT}"],
        stderr=open(tmp / f"{variant}.log", "wb"),
    )
    return proc, port


def compare(table: dict[str, dict], variants: list[str]) -> dict[str, dict]:
    """Each alternative over plain httpx, like for like (keep-alive with keep-alive, close with close)."""
    out = {}
    for alt, mode in itertools.product(("httpx_asyncio", "aiohttp"), ("", "-close")):
        a, h = f"{alt}{mode}", f"httpx{mode}"
        if a not in variants or h not in variants:
            continue
        for conns in CONN_COUNTS:
            ra, rh = table[f"{a}@{conns}"], table[f"{h}@{conns}"]
            row = {
                "rps_ratio": ratio(ra["rps"], rh["rps"]),
                "cpu_per_1k_ratio": ratio(ra["cpu_s_per_1k"], rh["cpu_s_per_1k"]),
                "added_p50_ratio": ratio(ra["added_p50_ms"], rh["added_p50_ms"]),
            }
            out[f"{a}/{h}@{conns}"] = row
            print(
                f"{a} / {h} @{conns}: req/s x{fmt(row['rps_ratio'])}, cpu s/1k x{fmt(row['cpu_per_1k_ratio'])}, "
                f"added p50 x{fmt(row['added_p50_ratio'])}"
            )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=int, default=10, help="seconds per wrk run")
    ap.add_argument("--rounds", type=int, default=2, help="alternating rounds per cell (median reported)")
    args = ap.parse_args()
    if shutil.which("wrk") is None:
        print("wrk not found: apt-get install wrk", file=sys.stderr)
        return 2
    notes: list[str] = []
    variants = list(VARIANTS)
    if importlib.util.find_spec("aiohttp") is None:
        variants = [v for v in variants if not v.startswith("aiohttp")]
        notes.append(
            f"aiohttp variants not measured: aiohttp is not importable in {sys.executable} "
            "(install it with `.venv/bin/pip install -e '.[bench]'`)"
        )
    tmp = Path(tempfile.mkdtemp(prefix="tokengate-clients-"))
    lua = tmp / "hit.lua"
    lua.write_text(LUA_HIT)
    up_port = free_port()
    fake = subprocess.Popen(
        [sys.executable, str(HERE / "fake_upstream.py"), "--port", str(up_port), "--slots", "256", "--chunks", str(CHUNKS)]
    )
    procs = [fake]
    relays: dict[str, tuple[subprocess.Popen, int]] = {}
    for v in variants:
        relays[v] = start_relay(tmp, v, up_port)
        procs.append(relays[v][0])
    try:
        wait_http(f"http://127.0.0.1:{up_port}/health")
        targets = {"direct": Target(f"http://127.0.0.1:{up_port}{CHAT}", lua, [fake.pid])}
        for v, (proc, port) in relays.items():
            wait_http(f"http://127.0.0.1:{port}/health")
            answer = post_status(f"http://127.0.0.1:{port}{CHAT}")
            if answer != "200":
                raise RuntimeError(f"relay {v} answered {answer}: {(tmp / f'{v}.log').read_text(errors='replace')[-500:]}")
            targets[v] = Target(f"http://127.0.0.1:{port}{CHAT}", lua, [proc.pid])
        table = measure(targets, args.rounds, args.duration, CONN_COUNTS)
        print_table(table, list(targets), CONN_COUNTS)
        print()
        comparison = compare(table, variants)
        for n in notes:
            print(n)
        out = {
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
            "versions": versions(["httpx", "httpcore", "h11", "aiohttp", "starlette", "uvicorn", "uvloop", "httptools"]),
            "duration_s": args.duration,
            "rounds": args.rounds,
            "variants": variants,
            "table": table,
            "comparison": comparison,
            "notes": notes,
        }
        (HERE / "results").mkdir(exist_ok=True)
        (HERE / "results" / "upstream_clients.json").write_text(json.dumps(out, indent=2) + "\n")
    finally:
        stop(procs)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        serve(*sys.argv[2:5])
    else:
        sys.exit(main())
