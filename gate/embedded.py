"""A gate on its own event loop, in its own thread: what the embedded console runs.

The console renders in the main thread; the gate (HTTP server, admission, journal,
pollers) keeps a loop of its own, so a layout or a chart never delays a request.
Measured before this split (issue #10, one loop for both, 2 cores, 200 req/s of
open-loop load): p50 0.5-3 s and p99 18-35 s with the console open, against
7 ms / 35 ms headless. The console reaches the gate only through an
`InProcessLink` bound to this thread's loop.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Awaitable, Callable

from gate.service import GateService

#: the GIL handoff interval while a console shares the process: a render holds the
#: GIL for at most this long before the gate's thread gets it (Python's default: 5 ms)
SWITCH_INTERVAL_S = 0.001

Hook = Callable[[GateService], Awaitable[None]]


class GateThread:
    """Start a GateService on a new thread's loop; stop it (drain) from any thread."""

    def __init__(
        self, gate_factory: Callable[[], Awaitable[GateService]], *, port: int | None = None,
        after_start: Hook | None = None, before_stop: Hook | None = None, after_stop: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._factory = gate_factory
        self._port = port
        self._after_start = after_start
        self._before_stop = before_stop
        self._after_stop = after_stop
        self.gate: GateService | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._stop: asyncio.Event | None = None
        self._why = "console quit"
        self._thread = threading.Thread(target=self._run, name="tokengate-gate", daemon=True)

    def start(self) -> GateService:
        """Start the thread and wait until the gate listens; its start-up error is raised here."""
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            self._thread.join()
            raise self._error
        assert self.gate is not None
        return self.gate

    def stop(self, why: str = "console quit", timeout: float | None = None) -> None:
        """Drain the gate (its grace period) and end the thread; safe to call twice."""
        if self.loop is not None and self._stop is not None and self._thread.is_alive():
            self._why = why
            self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        try:
            import uvloop
        except ImportError:  # pragma: no cover - uvloop is a dependency off Windows
            asyncio.run(self._main())
        else:
            uvloop.run(self._main())

    async def _main(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        try:
            self.gate = await self._factory()
            await self.gate.start(port=self._port)
            if self._after_start is not None:
                await self._after_start(self.gate)
        except BaseException as exc:  # noqa: BLE001 - handed to the thread that called start()
            self._error = exc
            if self._after_stop is not None:
                await self._after_stop()
            self._ready.set()
            return
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            if self._before_stop is not None:
                await self._before_stop(self.gate)
            await self.gate.stop(why=self._why)
            if self._after_stop is not None:
                await self._after_stop()
