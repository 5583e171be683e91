"""Synthetic client traffic for ``tokengate console --demo``: interactive chat and batch summaries.

Pure part: :func:`traffic_schedule` yields the same :class:`PlannedRequest` sequence
(arrival time, class, tenant, sizes) for the same seed and rates, forever:

* interactive: Poisson arrivals at ``rate_interactive`` per second; short prompts
  (8-60 words), ``max_tokens`` 64-128, streamed, ``X-Tokengate-Class: interactive``;
* batch: Poisson arrivals at ``rate_batch`` per second; a document of 500-2000 words
  to summarise, ``max_tokens`` 256-512, not streamed, ``X-Tokengate-Class: batch``;
* a burst of ``burst_size`` requests (three in four interactive) every
  ``burst_every_s`` seconds, spread over its first 2 seconds;
* a handful of tenants, named in the OpenAI ``user`` field, one of them noisier.

Async shell: :class:`TrafficGenerator` sends the schedule to ONE base URL (the gate,
on loopback in practice), with at most ``max_in_flight`` requests at once: an
arrival beyond that is skipped (counted), the older requests keep going.  ``stop()``
cancels everything and closes the client it opened.  ``counts`` tallies outcomes
for display (``counts_by_class`` per class): the HTTP status (``"200"``, ``"429"``,
...), ``"200+error"`` for a stream that ended with an ``error`` event,
``"transport_error"`` when no answer came, ``"skipped"`` for arrivals over the
in-flight bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import json
import logging
import random
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

import httpx

__all__ = [
    "DEFAULT_TENANTS",
    "PlannedRequest",
    "TrafficGenerator",
    "build_request",
    "traffic_schedule",
]

log = logging.getLogger("tokengate.traffic")

TrafficClass = Literal["interactive", "batch"]
DEFAULT_TENANTS: tuple[str, ...] = ("acme", "globex", "initech", "umbrella", "hooli")
_TENANT_WEIGHTS = (4, 2, 1, 1, 1)  # the first tenant is the noisy one
BURST_SPREAD_S = 2.0
BURST_BATCH_SHARE = 0.25

_WORDS = (
    "the of and to in is that for it as with was on be by at this are from or an have not which but all "
    "were when we there can more if no out so said what up its about into than them only other new some "
    "time could these two may first then do any like my now over such our man me even most made after "
    "also did many before must through back years where much your way well down should because each "
    "just those people how too little state good very make world still own see men work long get here "
    "between both life being under never day same another know while last might us great old year off "
    "come since against go came right used take three cache token slot queue budget latency server "
    "request model batch stream gate tenant priority memory kernel prompt context decode"
).split()
_QUESTIONS = ("How do I", "Can you explain why", "What is the best way to", "Summarise briefly how", "Why does")


@dataclass(frozen=True, slots=True)
class PlannedRequest:
    """One request of the schedule; `at` is seconds after the start."""

    index: int
    at: float
    kind: TrafficClass
    tenant: str
    prompt_words: int
    max_tokens: int
    burst: bool


def _sizes(rng: random.Random, kind: TrafficClass) -> tuple[int, int]:
    if kind == "interactive":
        return rng.randint(8, 60), rng.randint(64, 128)
    return rng.randint(500, 2000), rng.randint(256, 512)


def _poisson(seed: int, kind: TrafficClass, rate: float, tenants: Sequence[str], weights: Sequence[int]) -> Iterator[tuple]:
    if rate <= 0:
        return
    rng = random.Random(f"traffic:{seed}:{kind}")
    t = 0.0
    while True:
        t += rng.expovariate(rate)
        tenant = rng.choices(tenants, weights)[0]
        words, max_tokens = _sizes(rng, kind)
        yield (t, kind, tenant, words, max_tokens, False)


def _bursts(seed: int, every_s: float, size: int, tenants: Sequence[str], weights: Sequence[int]) -> Iterator[tuple]:
    if every_s <= 0 or size <= 0:
        return
    rng = random.Random(f"traffic:{seed}:burst")
    for k in itertools.count(1):
        offsets = sorted(rng.uniform(0.0, BURST_SPREAD_S) for _ in range(size))
        for off in offsets:
            kind: TrafficClass = "batch" if rng.random() < BURST_BATCH_SHARE else "interactive"
            tenant = rng.choices(tenants, weights)[0]
            words, max_tokens = _sizes(rng, kind)
            yield (k * every_s + off, kind, tenant, words, max_tokens, True)


def traffic_schedule(
    seed: int = 0,
    *,
    rate_interactive: float = 2.0,
    rate_batch: float = 0.5,
    burst_every_s: float = 60.0,
    burst_size: int = 20,
    tenants: Sequence[str] = DEFAULT_TENANTS,
) -> Iterator[PlannedRequest]:
    """The endless, deterministic arrival sequence, in time order."""
    if not tenants:
        raise ValueError("at least one tenant is needed")
    weights = [(_TENANT_WEIGHTS[i] if i < len(_TENANT_WEIGHTS) else 1) for i in range(len(tenants))]
    streams = (
        _poisson(seed, "interactive", rate_interactive, tenants, weights),
        _poisson(seed, "batch", rate_batch, tenants, weights),
        _bursts(seed, burst_every_s, burst_size, tenants, weights),
    )
    for index, (at, kind, tenant, words, max_tokens, burst) in enumerate(heapq.merge(*streams, key=lambda r: r[0])):
        yield PlannedRequest(index, at, kind, tenant, words, max_tokens, burst)


def build_request(req: PlannedRequest, seed: int = 0, model: str | None = None) -> tuple[str, dict[str, str], dict]:
    """(path, headers, JSON body) of a planned request; the text is deterministic too."""
    rng = random.Random(f"traffic:{seed}:text:{req.index}")
    words = rng.choices(_WORDS, k=req.prompt_words)
    body: dict = {"user": req.tenant, "max_tokens": req.max_tokens}
    if model:
        body["model"] = model
    if req.kind == "interactive":
        question = f"{rng.choice(_QUESTIONS)} {' '.join(words)}?"
        body["messages"] = [
            {"role": "system", "content": "You are a concise, helpful assistant."},
            {"role": "user", "content": question},
        ]
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    else:
        sentences, i = [], 0
        while i < len(words):
            n = rng.randint(8, 20)
            sentences.append(" ".join(words[i : i + n]).capitalize() + ".")
            i += n
        document = " ".join(sentences)
        body["messages"] = [{"role": "user", "content": f"Summarise the following document in a few paragraphs.\n\n{document}"}]
        body["stream"] = False
    return "/v1/chat/completions", {"X-Tokengate-Class": req.kind}, body


class TrafficGenerator:
    """Sends :func:`traffic_schedule` to `base_url` until stopped."""

    def __init__(
        self,
        base_url: str,
        *,
        seed: int = 0,
        rate_interactive: float = 2.0,
        rate_batch: float = 0.5,
        burst_every_s: float = 60.0,
        burst_size: int = 20,
        client: httpx.AsyncClient | None = None,
        max_in_flight: int = 200,
        tenants: Sequence[str] = DEFAULT_TENANTS,
        model: str | None = None,
        speed: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if speed <= 0:
            raise ValueError("speed must be > 0")
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be >= 1")
        self.base_url = base_url.rstrip("/")
        self.seed = seed
        self.rates = dict(rate_interactive=rate_interactive, rate_batch=rate_batch, burst_every_s=burst_every_s, burst_size=burst_size)
        self.tenants = tuple(tenants)
        self.model = model
        self.speed = speed  # arrivals come `speed` times faster (to pair with a faster simulator)
        self.max_in_flight = max_in_flight
        self.clock = clock
        self.counts: Counter[str] = Counter()
        self.counts_by_class: dict[str, Counter[str]] = {"interactive": Counter(), "batch": Counter()}
        self.sent = 0
        self._own_client = client is None
        self._client = client
        self._runner: asyncio.Task | None = None
        self._tasks: set[asyncio.Task] = set()

    def schedule(self) -> Iterator[PlannedRequest]:
        """This generator's arrival sequence (times not yet divided by `speed`)."""
        return traffic_schedule(self.seed, tenants=self.tenants, **self.rates)

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    @property
    def running(self) -> bool:
        return self._runner is not None and not self._runner.done()

    def status_counts(self) -> dict[str, int]:
        """Outcomes so far, e.g. ``{"200": 120, "429": 14, "skipped": 0}``."""
        return dict(self.counts)

    async def start(self) -> None:
        if self.running:
            return
        if self._client is None:
            self._client = httpx.AsyncClient(
                timeout=httpx.Timeout(connect=5.0, read=None, write=30.0, pool=None),
                limits=httpx.Limits(max_connections=self.max_in_flight, max_keepalive_connections=64),
            )
        self._runner = asyncio.get_running_loop().create_task(self._run(), name="tokengate-traffic")

    async def stop(self) -> None:
        """Stop sending, cancel every request in flight, close the client it opened."""
        pending = [t for t in (self._runner, *self._tasks) if t is not None and not t.done()]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        self._runner = None
        self._tasks.clear()
        if self._own_client and self._client is not None:
            await self._client.aclose()
            self._client = None

    async def _run(self) -> None:
        start = self.clock()
        for req in self.schedule():
            delay = start + req.at / self.speed - self.clock()
            if delay > 0:
                await asyncio.sleep(delay)
            if len(self._tasks) >= self.max_in_flight:
                self._count(req, "skipped")
                continue
            self.sent += 1
            task = asyncio.get_running_loop().create_task(self._send(req), name=f"tokengate-traffic-{req.index}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _count(self, req: PlannedRequest, outcome: str) -> None:
        self.counts[outcome] += 1
        self.counts_by_class[req.kind][outcome] += 1

    async def _send(self, req: PlannedRequest) -> None:
        assert self._client is not None
        path, headers, body = build_request(req, self.seed, self.model)
        url = self.base_url + path
        try:
            if body["stream"]:
                async with self._client.stream("POST", url, json=body, headers=headers) as resp:
                    if resp.status_code != 200:
                        await resp.aread()
                        self._count(req, str(resp.status_code))
                        return
                    outcome = "200"
                    async for line in resp.aiter_lines():
                        if line.startswith("data: {") and '"error"' in line[:16]:
                            with contextlib.suppress(ValueError):
                                if "error" in json.loads(line[6:]):
                                    outcome = "200+error"
                    self._count(req, outcome)
            else:
                resp = await self._client.post(url, json=body, headers=headers)
                self._count(req, str(resp.status_code))
        except httpx.HTTPError as e:
            self._count(req, "transport_error")
            log.debug("traffic request %d failed: %s: %s", req.index, type(e).__name__, e)
