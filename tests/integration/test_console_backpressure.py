"""A console that stops reading neither delays the gate nor grows its memory.

A real gate on this test's loop (`running_gate`), its real control socket, a client on that
socket that asks for 400 snapshots, subscribes to audit events and never reads a byte
(what a SIGSTOPped or wedged console is to the gate), and a console that reads. The gate's
side of the stuck session is inspected directly: what it holds for it is one reply and the
newest OUTBOX events, whatever it is sent meanwhile.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time

import httpx

from gate.data.commands import Pause
from gate.ops.control_socket import OUTBOX
from gate.ops.link import SocketLink
from tests.integration.gate_harness import running_gate, wait_until

NOTHING_LISTENS = "http://127.0.0.1:9"  # every request is a quick 503 no_backend: a decision each
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def _lines(*requests: dict) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in requests)


async def test_a_console_that_never_reads_holds_one_reply_and_the_newest_events_and_delays_nobody(tmp_path):
    sock_path = str(tmp_path / "control.sock")
    async with running_gate(NOTHING_LISTENS, f'[gate]\ncontrol_socket = "{sock_path}"\n') as gate, httpx.AsyncClient(timeout=30) as http:
        server = gate.control_server
        assert server is not None
        for _ in range(200):  # 200 decisions: every snapshot now carries ~90 kB of them
            assert (await http.post(gate.url + "/v1/chat/completions", json=CHAT)).status_code == 503

        loop = asyncio.get_running_loop()
        stuck = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        stuck.setblocking(False)
        try:
            await loop.sock_connect(stuck, sock_path)
            asks = [{"id": 3 + i, "op": "snapshot", "after": 0} for i in range(400)]
            await loop.sock_sendall(stuck, _lines({"id": 1, "op": "hello", "v": 1}, {"id": 2, "op": "subscribe"}, *asks))
            await wait_until(lambda: server.sessions == 1, timeout_s=10)
            (session,) = server._sessions
            # It fills the socket's kernel buffer, then the gate stops writing to it (and stops
            # reading its asks): the rest of what it would send waits in the session's transport.
            await wait_until(lambda: session.writer.transport.get_write_buffer_size() > 0, timeout_s=10)
            reply_size = len(server.feed.reply(0, 0))
            assert reply_size > 80_000

            link = await SocketLink.connect(sock_path, environ={})
            slowest = 0.0
            heard: list = []
            link.subscribe(heard.append)
            try:
                await link.snapshot()  # the subscription went out while this waited: it precedes every command
                for i in range(1000):  # 1,000 audit rows, each an event for both consoles
                    results = await link.command(Pause("batch", i % 2 == 0))
                    assert results[0].new_value == str(i % 2 == 0)
                    if i % 100 == 0:  # the gate answers its clients meanwhile, promptly
                        started = time.monotonic()
                        assert (await http.post(gate.url + "/v1/chat/completions", json=CHAT)).status_code == 503
                        slowest = max(slowest, time.monotonic() - started)
                snap = await link.snapshot()
                assert not next(c for c in snap.classes if c.name == "batch").paused  # the last command's state
                await wait_until(lambda: len(heard) >= 1000, timeout_s=10, interval_s=0.05)  # the console that reads hears all
            finally:
                await link.close()

            assert session in server._sessions  # not dropped: a console that resumes carries on
            assert len(session.events) <= OUTBOX and session.missed > 0  # the newest events, the oldest lost
            # One reply (and one event) past the transport's high-water mark, not 400 replies (~37 MB).
            assert session.writer.transport.get_write_buffer_size() <= 2 * reply_size + 64 * 1024
            # The gate built snapshots for consoles a few times, not once per ask or per event.
            assert server.feed.builds <= 10
            # Bounded, not merely finished: the gate's loop (this test's, which also runs the
            # reading console and pytest) never stalled a second, and no request waited one. A
            # gate that waited for the stuck reader would hang here. (Not 0.5 s, where the gate
            # warns: a CI run on a loaded 2-core runner saw 0.54 s once, before the harness
            # froze the test session's heap out of full collections as `serve` does; speed is
            # bench/'s to measure, this bound tells a bounded loop from a blocked one.)
            assert gate.loop_lag.quantiles()[1.0] < 1.0
            assert slowest < 1.0
        finally:
            stuck.close()
        await wait_until(lambda: server.sessions == 0, timeout_s=10)  # closing it frees what it held
