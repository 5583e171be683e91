"""Serving: :func:`serve_simulator` runs the app on an embedded uvicorn; :class:`SimulatorHandle` stops it."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gate.tools.simulator.config import SimulatorConfig
from gate.tools.simulator.http import build_simulator_app
from gate.tools.simulator.runtime import SimulatorRuntime


@dataclass
class SimulatorHandle:
    """A served simulator: ``url``, ``port``, ``runtime``; ``await stop()`` to shut it down."""

    host: str
    port: int
    runtime: SimulatorRuntime
    _server: Any
    _task: asyncio.Task

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def stop(self) -> None:
        self._server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        await self.runtime.aclose()

    async def wait(self) -> None:
        """Until the server exits."""
        await asyncio.shield(self._task)


async def serve_simulator(
    config: SimulatorConfig | None = None,
    host: str = "127.0.0.1",
    port: int = 8080,
    *,
    clock: Callable[[], float] = time.monotonic,
) -> SimulatorHandle:
    """Serve the simulator with an embedded uvicorn (no signal handlers of its own).

    Returns once it listens; ``port=0`` picks a free port (see ``handle.port``).
    """
    import uvicorn

    class _Embedded(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self):  # the host process owns signals
            yield

    app = build_simulator_app(config, clock=clock)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    bound_port = sock.getsockname()[1]
    uv_config = uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False, timeout_graceful_shutdown=2)
    server = _Embedded(uv_config)
    task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]), name="tokengate-simulator-http")
    while not server.started:
        if task.done():
            task.result()  # why it did not start
            raise RuntimeError("the simulator's server exited before it started")
        await asyncio.sleep(0.01)
    return SimulatorHandle(host, bound_port, app.state.simulator, server, task)
