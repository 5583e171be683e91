"""The asyncio runtime: :class:`SimulatorRuntime` drives the pure model on the loop's clock."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable
from typing import Any

from gate.tools.simulator.config import SimulatorConfig
from gate.tools.simulator.model import SimEvent, Simulator, Token


class SimulatorRuntime:
    """Drives a :class:`Simulator` on the running loop's clock and routes events to requests.

    The driver task runs only while there is work, so an idle simulator holds no task.
    """

    def __init__(self, config: SimulatorConfig | None = None, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config or SimulatorConfig()
        self.core = Simulator(self.config)
        self.clock = clock
        self.last_result_at = clock()
        self._queues: dict[int, asyncio.Queue] = {}
        self._streaming: set[int] = set()  # only these post a result per token (llama-server)
        self._driver: asyncio.Task | None = None
        self._wake: asyncio.Event | None = None

    def submit(self, prompt_tokens: int, n_predict: int, *, ignore_eos: bool, params: dict[str, Any]) -> tuple[int, asyncio.Queue]:
        task_id = self.core.submit(prompt_tokens, n_predict, now=self.clock(), ignore_eos=ignore_eos, params=params)
        queue: asyncio.Queue = asyncio.Queue()
        self._queues[task_id] = queue
        if params.get("stream"):
            self._streaming.add(task_id)
        self._kick()
        return task_id, queue

    def finish(self, task_id: int) -> None:
        """The request's handler is done with it: cancel it if it still runs or waits."""
        self._queues.pop(task_id, None)
        self._streaming.discard(task_id)
        if self.core.cancel(task_id, now=self.clock()):
            self._kick()

    def sync(self) -> None:
        """Bring the model up to now (before answering /slots or /metrics)."""
        self._dispatch(self.core.advance(self.clock()))

    def _kick(self) -> None:
        if self._driver is None or self._driver.done():
            self._wake = asyncio.Event()
            self._driver = asyncio.get_running_loop().create_task(self._drive(), name="tokengate-simulator")
        elif self._wake is not None:
            self._wake.set()

    def _dispatch(self, events: Iterable[SimEvent]) -> None:
        for ev in events:
            if not isinstance(ev, Token) or ev.task in self._streaming:
                self.last_result_at = self.clock()
            queue = self._queues.get(ev.task)
            if queue is not None:
                queue.put_nowait(ev)

    async def _drive(self) -> None:
        assert self._wake is not None
        wake = self._wake
        while True:
            self._dispatch(self.core.advance(self.clock()))
            at = self.core.next_event_at()
            if at is None:
                return  # idle: the next submit starts a new driver
            delay = at - self.clock()
            if delay > 0:
                wake.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await wake.wait()

    async def aclose(self) -> None:
        """Stop the driver (waiting requests get no more events)."""
        if self._driver is not None and not self._driver.done():
            self._driver.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._driver
        self._driver = None
