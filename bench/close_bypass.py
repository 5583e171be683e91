"""Client-side CPU per `Connection: close` request: the gate's upstream client (each such
request on a connection of its own, gate/backend/netio.py) against the same client with
httpcore's plain pool. A uvloop server in another process answers each request and closes;
3,000 requests per run at 1, 32, 128 and 256 in flight, 3 rounds in alternating order,
the median of the client process's CPU (time.process_time) per request printed.

    .venv/bin/python bench/close_bypass.py
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import httpcore  # noqa: E402
import httpx  # noqa: E402
import uvloop  # noqa: E402

from gate.backend import netio  # noqa: E402

SERVER = r"""
import asyncio, uvloop
A = b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\nconnection: close\r\n\r\n{"ok":true}'
class P(asyncio.Protocol):
    def connection_made(self, t): self.t = t; self.b = b""
    def data_received(self, d):
        self.b += d
        if b"\r\n\r\n" in self.b and self.b.endswith(b"x"):
            self.t.write(A); self.t.close()
async def main():
    s = await asyncio.get_running_loop().create_server(P, "127.0.0.1", 18931, backlog=4096)
    await s.serve_forever()
uvloop.run(main())
"""


def client(bypass):
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=256, keepalive_expiry=2.0)
    plain, mounts = netio.client_transports(limits)
    if not bypass:
        plain._pool = httpcore.AsyncConnectionPool(
            max_connections=None,
            max_keepalive_connections=256,
            keepalive_expiry=2.0,
            http1=True,
            http2=False,
            network_backend=netio.AsyncioBackend(),
        )
    return httpx.AsyncClient(transport=plain, mounts=mounts, timeout=httpx.Timeout(connect=5.0, read=None, write=30.0, pool=30.0))


async def run(bypass, inflight, total):
    c = client(bypass)
    sem = asyncio.Semaphore(inflight)

    async def one():
        async with sem:
            r = await c.post("http://127.0.0.1:18931/v", content=b"x", headers={"Connection": "close"})
            assert r.status_code == 200

    await asyncio.gather(*(one() for _ in range(200)))  # warm
    t0 = time.process_time()
    await asyncio.gather(*(one() for _ in range(total)))
    cpu = time.process_time() - t0
    await c.aclose()
    return 1e6 * cpu / total


srv = subprocess.Popen([sys.executable, "-c", SERVER])
time.sleep(1.0)
try:
    for inflight in (1, 32, 128, 256):
        res = {True: [], False: []}
        for rnd in range(3):
            for b in (True, False) if rnd % 2 == 0 else (False, True):
                res[b].append(uvloop.run(run(b, inflight, 3000)))
        med = {k: sorted(v)[1] for k, v in res.items()}
        print(
            f"in flight {inflight:3d}: pool {med[False]:.0f} us/req, own connection {med[True]:.0f} us/req ({100 * (med[True] / med[False] - 1):+.0f}%)  rounds pool {[round(x) for x in res[False]]} own {[round(x) for x in res[True]]}",
            flush=True,
        )
finally:
    srv.kill()
