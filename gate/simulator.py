"""A llama-server stand-in for ``tokengate console --demo`` and the benchmarks.

NOT used by the integration tests (those run the real llama-server).  It answers
the endpoints the gate uses with llama-server's shapes (llama.cpp 0c1e570, see
notes/llama-server.md) and models what makes overload hurt:

Scheduling model (:class:`Simulator`, pure: every method takes ``now``)
    * ``slots`` slots.  A request takes a free slot when the next decode step
      starts; with none free it waits in an unbounded FIFO (``requests_deferred``),
      never refused, never reordered.
    * Work runs in decode steps, like llama.cpp's batches: each step carries one
      token for every generating slot plus up to ``n_batch`` prompt tokens of the
      slots still prefilling (in slot order).  Its duration is
      ``ms_per_token(generating) + prompt_tokens / prefill_tps``, where the per-token
      time grows linearly from ``ms_per_token_alone`` (1 slot) to
      ``ms_per_token_full`` (all slots): a long prompt stalls every running decode.
      A slot whose prompt completes in a step samples its first token at the step's
      end.  Every duration is divided by ``speed``; timings and metrics report the
      scaled (real) time.
    * KV ``unified``: every slot reports the whole ``ctx`` and all share it.  A slot
      holds prompt + generated tokens (the token sampled last joins the cache with the
      next step).  When a step's tokens do not fit, EVERY active request fails with
      500 "Context size has been exceeded." (the incident the gate prevents).
    * KV ``split``: each slot has ``ctx // slots``; a prompt that does not fit is
      refused with 400 ``exceed_context_size_error`` once it reaches a slot (so it can
      first wait in the FIFO); generation stops (``truncated``) when the slot is full.
    * Output: deterministic pseudo-words (seeded per request); ``n_predict`` /
      ``max_tokens`` respected; unless ``ignore_eos``, EOS comes at random
      (geometric with ``eos_probability``).
    * ``cancel`` frees the slot at once (a streaming client that disconnects).

HTTP shell (:func:`build_simulator_app`, :func:`serve_simulator`)
    ``GET /health /props /slots /metrics /v1/models``, ``POST /tokenize /detokenize
    /apply-template /v1/chat/completions/input_tokens`` and the three completion
    endpoints, streaming (OpenAI SSE chunks, a usage chunk when
    ``stream_options.include_usage``, then ``data: [DONE]``; native ``/completion``
    sends ``stop: false`` chunks and a final ``stop: true`` one with ``timings`` and no
    ``[DONE]``) or not.  An error before the first token is a plain HTTP error, after
    it ``data: {"error": {...}}`` ends the stream.  A streaming client's disconnect
    frees its slot at once; a non-streaming one is noticed as llama-server does, only
    once 1 s passes with no result posted by ANY request.

Fake tokenizer: ``ceil(utf-8 bytes / 4)`` tokens, +1 BOS when ``add_special``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import random
import socket
import string
import time
import zlib
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "Done",
    "Failed",
    "SimEvent",
    "SimulatorConfig",
    "Simulator",
    "SimulatorHandle",
    "SimulatorRuntime",
    "Token",
    "apply_template",
    "build_simulator_app",
    "count_tokens",
    "fake_tokenize",
    "serve_simulator",
]

MODEL_NAME = "simulated"
BUILD_INFO = "b0-tokengate-simulator"
VOCAB_SIZE = 32000
BOS_ID, EOS_ID = 1, 2
CONTEXT_EXCEEDED = "Context size has been exceeded."
# llama-server's HTTP_POLLING_SECONDS: how often a non-streaming request looks for a
# disconnected client (real time, not scaled: it is the HTTP layer, not the model).
NONSTREAM_DISCONNECT_POLL_S = 1.0


@dataclass(frozen=True, slots=True)
class SimulatorConfig:
    """The simulated server.  Defaults: an A10G running an 8B Q4 model, 4 slots, unified KV."""

    slots: int = 4
    ctx: int = 8192  # total context: the pool (unified) or slots x per-slot context (split)
    kv: Literal["unified", "split"] = "unified"
    ms_per_token_alone: float = 45.0  # per generated token with one slot generating
    ms_per_token_full: float = 180.0  # per generated token, each, with every slot generating
    prefill_tps: float = 1500.0  # prompt tokens per second, shared by the slots prefilling
    n_batch: int = 2048  # most tokens one decode step carries (llama-server's -b)
    seed: int = 0
    speed: float = 1.0  # divides every duration (10 = ten times faster than the model)
    eos_probability: float = 0.01  # per generated token, unless ignore_eos

    def __post_init__(self) -> None:
        if self.slots < 1:
            raise ValueError("slots must be >= 1")
        if self.kv not in ("unified", "split"):
            raise ValueError("kv must be 'unified' or 'split'")
        if self.ctx < self.slots:
            raise ValueError("ctx must be >= slots")
        for name in ("ms_per_token_alone", "ms_per_token_full", "prefill_tps", "speed"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0")
        if self.n_batch < 1:
            raise ValueError("n_batch must be >= 1")
        if not 0.0 <= self.eos_probability < 1.0:
            raise ValueError("eos_probability must be in [0, 1)")

    @property
    def slot_ctx(self) -> int:
        """Context one slot reports (/props, /slots): the pool when unified, a share when split."""
        return self.ctx if self.kv == "unified" else self.ctx // self.slots

    def ms_per_token(self, generating: int) -> float:
        """Unscaled time of one decode step with `generating` slots generating (linear in between)."""
        if generating <= 1 or self.slots == 1:
            return self.ms_per_token_alone
        frac = (min(generating, self.slots) - 1) / (self.slots - 1)
        return self.ms_per_token_alone + (self.ms_per_token_full - self.ms_per_token_alone) * frac


# --- fake tokenizer, template and words ------------------------------------------------


def count_tokens(text: str, add_special: bool = False) -> int:
    """Tokens :func:`fake_tokenize` gives: one per 4 bytes of UTF-8 (rounded up), +1 BOS."""
    return math.ceil(len(text.encode("utf-8")) / 4) + (1 if add_special else 0)


def fake_tokenize(text: str, add_special: bool = False) -> list[tuple[int, str]]:
    """Deterministic fake tokens as (id, piece): BOS when `add_special`, then one per 4 bytes."""
    data = text.encode("utf-8")
    out = [(BOS_ID, "<s>")] if add_special else []
    for i in range(0, len(data), 4):
        chunk = data[i : i + 4]
        out.append((259 + zlib.crc32(chunk) % (VOCAB_SIZE - 259), chunk.decode("utf-8", errors="replace")))
    return out


def _message_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return "" if content is None else str(content)


def apply_template(messages: list[Any], add_generation_prompt: bool = True) -> str:
    """A ChatML rendering of `messages` (llama-server applies the model's template)."""
    parts = []
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ValueError("each message needs a string 'role'")
        parts.append(f"<|im_start|>{m['role']}\n{_message_text(m.get('content'))}<|im_end|>\n")
    if add_generation_prompt:
        parts.append("<|im_start|>assistant\n")
    return "".join(parts)


def _make_vocab(seed: int, n: int = 512) -> list[str]:
    rng = random.Random(f"vocab:{seed}")
    onsets, vowels, codas = "bcdfghklmnprstvz", "aeiou", ["", "", "n", "r", "s", "l", "th", "m"]
    words = set()
    while len(words) < n:
        syllables = rng.choice((1, 1, 2, 2, 2, 3))
        words.add("".join(rng.choice(onsets) + rng.choice(vowels) + rng.choice(codas) for _ in range(syllables)))
    return sorted(words)


def _fmt_metric(value: float) -> str:
    # Exact for counters (llama-server prints 6 significant digits, which loses counts past 1e6).
    return str(value) if isinstance(value, int) else format(value, ".12g")


# --- the pure scheduling model ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Token:
    """One generated token of request `task`."""

    task: int
    id: int
    text: str
    n_decoded: int
    id_slot: int


@dataclass(frozen=True, slots=True)
class Done:
    """Request `task` finished normally (EOS, its n_predict, or a full slot)."""

    task: int
    stop_type: Literal["eos", "limit"]
    truncated: bool
    n_prompt: int
    n_decoded: int
    n_cached: int
    id_slot: int
    timings: dict[str, float]


@dataclass(frozen=True, slots=True)
class Failed:
    """Request `task` failed; `error` is llama-server's ``{"code", "message", "type", ...}``."""

    task: int
    status: int
    error: dict[str, Any]


SimEvent = Token | Done | Failed


@dataclass(eq=False, slots=True)
class _Task:
    id: int
    prompt_tokens: int
    n_predict: int  # -1: until EOS or the slot is full
    ignore_eos: bool
    eos_after: int | None
    rng: random.Random
    submitted_at: float
    params: dict[str, Any]
    slot: int | None = None
    started_at: float | None = None  # slot assigned: prefill begins
    n_prompt_done: int = 0
    n_decoded: int = 0
    first_token_at: float | None = None
    last_token_at: float | None = None
    sentence_start: bool = True

    @property
    def cells(self) -> int:
        """KV cells held: the prompt processed so far + generated tokens but the last sampled."""
        return self.n_prompt_done + max(0, self.n_decoded - 1)

    @property
    def prefilling(self) -> bool:
        return self.n_prompt_done < self.prompt_tokens


@dataclass(slots=True)
class _Slot:
    id: int
    task: _Task | None = None
    last: _Task | None = None  # the request served last (/slots keeps showing it)
    last_cells: int = 0


@dataclass(frozen=True, slots=True)
class _Step:
    start: float
    end: float
    decoding: tuple[_Task, ...]
    prefill: tuple[tuple[_Task, int], ...]  # (task, prompt tokens in this step)
    prompt_s: float  # the prompt part of the step's duration (scaled)


@dataclass(slots=True)
class _Counters:
    prompt_tokens: int = 0
    prompt_seconds: float = 0.0
    tokens_predicted: int = 0
    tokens_predicted_seconds: float = 0.0
    n_decode: int = 0
    n_busy_slots: int = 0
    n_tokens_max: int = 0
    # Since the previous /metrics scrape (llama-server's buckets, reset by each scrape).
    bucket_prompt_tokens: int = 0
    bucket_prompt_seconds: float = 0.0
    bucket_predicted_tokens: int = 0
    bucket_predicted_seconds: float = 0.0


class Simulator:
    """The pure scheduling model: slots, FIFO, KV pool, decode steps.  Time is an argument.

    Drive it with :meth:`submit`, :meth:`cancel` and :meth:`advance`; :meth:`next_event_at`
    says when the running step ends (None when idle).  Events come out of :meth:`advance`
    in the order they happened.
    """

    def __init__(self, config: SimulatorConfig | None = None) -> None:
        self.config = config or SimulatorConfig()
        self.slots = [_Slot(i) for i in range(self.config.slots)]
        self.waiting: deque[_Task] = deque()
        self.tasks: dict[int, _Task] = {}  # waiting or running
        self.counters = _Counters()
        self._step: _Step | None = None
        self._next_id = 0
        self._events: list[SimEvent] = []
        self._vocab = _make_vocab(self.config.seed)

    # -- inputs ---------------------------------------------------------------------

    def submit(
        self,
        prompt_tokens: int,
        n_predict: int = -1,
        *,
        now: float,
        ignore_eos: bool = False,
        params: dict[str, Any] | None = None,
    ) -> int:
        """Queue a request; returns its task id.  It takes a slot when the next step starts."""
        task_id = self._next_id
        self._next_id += 1
        rng = random.Random(f"{self.config.seed}:{task_id}")
        eos_after = None
        p = self.config.eos_probability
        if not ignore_eos and p > 0:
            eos_after = 1 + int(math.log(1.0 - rng.random()) / math.log(1.0 - p))
        task = _Task(
            id=task_id,
            prompt_tokens=max(1, int(prompt_tokens)),
            n_predict=int(n_predict),
            ignore_eos=ignore_eos,
            eos_after=eos_after,
            rng=rng,
            submitted_at=now,
            params={"n_predict": int(n_predict), "ignore_eos": ignore_eos, **(params or {})},
        )
        self.tasks[task_id] = task
        self.waiting.append(task)
        if self._step is None:
            self._start_step(now)
        return task_id

    def cancel(self, task_id: int, *, now: float) -> bool:
        """Drop a waiting or running request (its client went away); frees its slot.  No event."""
        task = self.tasks.pop(task_id, None)
        if task is None:
            return False
        if task.slot is None:
            self.waiting.remove(task)
        else:
            self._release(task, now)
        if self._step is None:
            self._start_step(now)
        return True

    def advance(self, now: float) -> list[SimEvent]:
        """Run every step that ends by `now`; returns the events since the last call."""
        while self._step is not None and self._step.end <= now:
            step = self._step
            self._step = None
            self._finish_step(step)
            self._start_step(step.end)
        events, self._events = self._events, []
        return events

    def next_event_at(self) -> float | None:
        """When the running step ends, or None when idle (nothing waits, nothing runs)."""
        if self._step is not None:
            return self._step.end
        return None if not self._events else float("-inf")

    # -- views ----------------------------------------------------------------------

    @property
    def busy_slots(self) -> int:
        return sum(1 for s in self.slots if s.task is not None)

    @property
    def deferred(self) -> int:
        """Requests waiting for a slot (llama-server's ``requests_deferred``)."""
        free = self.config.slots - self.busy_slots
        return max(0, len(self.waiting) - free)

    @property
    def kv_used(self) -> int:
        return sum(s.task.cells for s in self.slots if s.task is not None)

    def slots_json(self) -> list[dict[str, Any]]:
        """``GET /slots``."""
        out = []
        for s in self.slots:
            item: dict[str, Any] = {
                "id": s.id,
                "n_ctx": self.config.slot_ctx,
                "speculative": False,
                "is_processing": s.task is not None,
            }
            task = s.task or s.last
            if task is not None:
                running = s.task is not None
                n_remain = -1
                if running and task.n_predict >= 0:
                    n_remain = max(0, task.n_predict - task.n_decoded)
                item.update(
                    id_task=task.id,
                    n_prompt_tokens=task.cells if running else s.last_cells,
                    n_prompt_tokens_processed=task.n_prompt_done,
                    n_prompt_tokens_cache=0,
                    params=dict(task.params),
                    next_token=[
                        {
                            "has_next_token": running,
                            "has_new_line": False,
                            "n_remain": n_remain,
                            "n_decoded": task.n_decoded if running else 0,
                        }
                    ],
                )
            out.append(item)
        return out

    def metrics_text(self) -> str:
        """``GET /metrics`` (Prometheus text 0.0.4, llama-server's names); resets the rate buckets."""
        c = self.counters

        def rate(tokens: int, seconds: float) -> float:
            return tokens / seconds if seconds > 0 else 0.0

        counters = [
            ("prompt_tokens_total", "Number of prompt tokens processed, excluding cached tokens", c.prompt_tokens),
            ("prompt_tokens_cached_total", "Number of prompt tokens reused from the cache", 0),
            ("prompt_seconds_total", "Total time spent processing prompts", c.prompt_seconds),
            ("tokens_predicted_total", "Number of generation tokens processed", c.tokens_predicted),
            ("tokens_predicted_seconds_total", "Total time spent generating tokens", c.tokens_predicted_seconds),
            (
                "n_decode_total",
                "Total number of llama_decode() calls, excluding speculative decoding and multimodal decoding",
                c.n_decode,
            ),
            ("n_tokens_max", "Largest observed sequence length (prompt + generation)", c.n_tokens_max),
        ]
        gauges = [
            (
                "prompt_tokens_seconds",
                "Average prompt throughput in tokens/s",
                rate(c.bucket_prompt_tokens, c.bucket_prompt_seconds),
            ),
            (
                "predicted_tokens_seconds",
                "Average generation throughput in tokens/s",
                rate(c.bucket_predicted_tokens, c.bucket_predicted_seconds),
            ),
            ("requests_processing", "Number of requests processing", self.busy_slots),
            ("requests_deferred", "Number of requests deferred", self.deferred),
            (
                "n_busy_slots_per_decode",
                "Average number of busy slots per llama_decode() call",
                c.n_busy_slots / max(c.n_decode, 1),
            ),
        ]
        c.bucket_prompt_tokens = c.bucket_predicted_tokens = 0
        c.bucket_prompt_seconds = c.bucket_predicted_seconds = 0.0
        lines = []
        for kind, items in (("counter", counters), ("gauge", gauges)):
            for name, help_text, value in items:
                lines.append(f"# HELP llamacpp:{name} {help_text}")
                lines.append(f"# TYPE llamacpp:{name} {kind}")
                lines.append(f"llamacpp:{name} {_fmt_metric(value)}")
        return "\n".join(lines) + "\n"

    def word(self, token_id: int) -> str:
        """The pseudo-word a generated token id stands for (``/detokenize``)."""
        return self._vocab[(token_id - 259) % len(self._vocab)]

    # -- the step machine -------------------------------------------------------------

    def _assign(self, now: float) -> None:
        for slot in self.slots:
            while slot.task is None and self.waiting:
                task = self.waiting.popleft()
                n_ctx = self.config.slot_ctx
                if task.prompt_tokens >= n_ctx:  # checked only once a slot is assigned, as upstream
                    self.tasks.pop(task.id, None)
                    self._fail(
                        task,
                        400,
                        f"request ({task.prompt_tokens} tokens) exceeds the available context size "
                        f"({n_ctx} tokens), try increasing it",
                        "exceed_context_size_error",
                        n_prompt_tokens=task.prompt_tokens,
                        n_ctx=n_ctx,
                    )
                    continue
                task.slot, task.started_at = slot.id, now
                slot.task = task

    def _start_step(self, now: float) -> None:
        cfg = self.config
        self._assign(now)
        active = [s.task for s in self.slots if s.task is not None]
        if not active:
            return
        decoding = tuple(t for t in active if not t.prefilling)
        room = max(0, cfg.n_batch - len(decoding))
        prefill = []
        for t in active:
            if t.prefilling and room > 0:
                n = min(room, t.prompt_tokens - t.n_prompt_done)
                prefill.append((t, n))
                room -= n
        n_prompt = sum(n for _, n in prefill)
        if cfg.kv == "unified" and self.kv_used + len(decoding) + n_prompt > cfg.ctx:
            # llama.cpp halves the batch down to 1, then fails every active slot.
            for t in active:
                self.tasks.pop(t.id, None)
                self._release(t, now)
                self._fail(t, 500, CONTEXT_EXCEEDED, "server_error")
            self._start_step(now)
            return
        prompt_s = n_prompt / cfg.prefill_tps / cfg.speed
        decode_s = cfg.ms_per_token(len(decoding)) / 1000.0 / cfg.speed if decoding else 0.0
        self._step = _Step(now, now + decode_s + prompt_s, decoding, tuple(prefill), prompt_s)

    def _finish_step(self, step: _Step) -> None:
        c = self.counters
        end = step.end
        c.n_decode += 1
        c.n_busy_slots += len(step.decoding) + len(step.prefill)
        n_prompt = sum(n for _, n in step.prefill)
        if n_prompt:
            c.prompt_tokens += n_prompt
            c.prompt_seconds += step.prompt_s
            c.bucket_prompt_tokens += n_prompt
            c.bucket_prompt_seconds += step.prompt_s
        for task, n in step.prefill:
            if task.id not in self.tasks:  # cancelled during the step
                continue
            task.n_prompt_done += n
            if not task.prefilling:
                task.first_token_at = end
                self._emit_token(task, end)
        for task in step.decoding:
            if task.id in self.tasks:
                self._emit_token(task, end)
        for s in self.slots:
            if s.task is not None:
                c.n_tokens_max = max(c.n_tokens_max, s.task.cells)

    def _emit_token(self, task: _Task, now: float) -> None:
        task.n_decoded += 1
        task.last_token_at = now
        index = task.rng.randrange(len(self._vocab))
        word = self._vocab[index]
        if task.sentence_start:
            word = word.capitalize()
        task.sentence_start = task.rng.random() < 0.08
        text = (" " if task.n_decoded > 1 else "") + word + ("." if task.sentence_start else "")
        self._events.append(Token(task.id, 259 + index, text, task.n_decoded, task.slot or 0))
        stop: Literal["eos", "limit"] | None = None
        truncated = False
        if task.eos_after is not None and task.n_decoded >= task.eos_after:
            stop = "eos"
        elif 0 <= task.n_predict <= task.n_decoded:
            stop = "limit"
        elif task.cells + 1 >= self.config.slot_ctx:  # the slot is full: llama-server truncates
            stop, truncated = "limit", True
        if stop is not None:
            self.tasks.pop(task.id, None)
            self._release(task, now)
            self._events.append(
                Done(
                    task.id,
                    stop,
                    truncated,
                    task.prompt_tokens,
                    task.n_decoded,
                    task.cells,
                    task.slot or 0,
                    self._timings(task),
                )
            )

    def _timings(self, task: _Task) -> dict[str, float]:
        prompt_ms = ((task.first_token_at or 0.0) - (task.started_at or 0.0)) * 1000.0
        predicted_ms = ((task.last_token_at or 0.0) - (task.first_token_at or 0.0)) * 1000.0
        n_gen = task.n_decoded
        return {
            "cache_n": 0,
            "prompt_n": task.n_prompt_done,
            "prompt_ms": prompt_ms,
            "prompt_per_token_ms": prompt_ms / task.n_prompt_done if task.n_prompt_done else 0.0,
            "prompt_per_second": 1e3 * task.n_prompt_done / prompt_ms if prompt_ms > 0 else 0.0,
            "predicted_n": n_gen,
            "predicted_ms": predicted_ms,
            "predicted_per_token_ms": predicted_ms / n_gen if n_gen else 0.0,
            "predicted_per_second": 1e3 * n_gen / predicted_ms if predicted_ms > 0 else 0.0,
        }

    def _release(self, task: _Task, now: float) -> None:
        if task.slot is None:
            return
        slot = self.slots[task.slot]
        if slot.task is task:
            slot.task, slot.last, slot.last_cells = None, task, task.cells
        if task.n_decoded > 0 and task.first_token_at is not None:
            seconds = max(0.0, (task.last_token_at or now) - task.first_token_at)
            c = self.counters
            c.tokens_predicted += task.n_decoded
            c.tokens_predicted_seconds += seconds
            c.bucket_predicted_tokens += task.n_decoded
            c.bucket_predicted_seconds += seconds

    def _fail(self, task: _Task, status: int, message: str, type_: str, **extra: Any) -> None:
        self._events.append(Failed(task.id, status, {"code": status, "message": message, "type": type_, **extra}))


# --- the asyncio runtime ---------------------------------------------------------------

_DISCONNECTED = object()


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

    def submit(
        self, prompt_tokens: int, n_predict: int, *, ignore_eos: bool, params: dict[str, Any]
    ) -> tuple[int, asyncio.Queue]:
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
                    await asyncio.wait_for(wake.wait(), delay)

    async def aclose(self) -> None:
        """Stop the driver (waiting requests get no more events)."""
        if self._driver is not None and not self._driver.done():
            self._driver.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._driver
        self._driver = None


# --- HTTP ------------------------------------------------------------------------------


class _BadRequest(Exception):
    pass


def _error_body(status: int, message: str, type_: str, **extra: Any) -> dict[str, Any]:
    return {"error": {"code": status, "message": message, "type": type_, **extra}}


async def _send_json(send: Any, status: int, payload: Any) -> None:
    body = json.dumps(payload, separators=(",", ":")).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})


def _sse(payload: Any) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


@dataclass(slots=True)
class _Job:
    kind: Literal["chat", "completions", "completion"]
    prompt: str
    prompt_tokens: int
    n_predict: int
    ignore_eos: bool
    stream: bool
    include_usage: bool
    model: str
    created: int = field(default_factory=lambda: int(time.time()))
    cmpl_id: str = ""


def _int_field(body: dict[str, Any], *names: str, default: int) -> int:
    for name in names:
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _BadRequest(f"'{name}' must be a number")
        return int(value)
    return default


def _prompt_of(body: dict[str, Any]) -> tuple[str, int]:
    """(prompt text, tokens) of a completion prompt: a string, token ids, or a list of those."""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt, count_tokens(prompt, add_special=True)
    if isinstance(prompt, list) and prompt:
        if all(isinstance(x, int) and not isinstance(x, bool) for x in prompt):
            return "", len(prompt)
        text, n = [], 0
        for item in prompt:
            if isinstance(item, str):
                text.append(item)
                n += count_tokens(item, add_special=True)
            elif isinstance(item, list) and all(isinstance(x, int) for x in item):
                n += len(item)
            elif isinstance(item, int) and not isinstance(item, bool):
                n += 1
            else:
                raise _BadRequest("'prompt' must be a string, token ids, or a list of those")
        return "".join(text), n
    raise _BadRequest("'prompt' must be provided")


def _parse_job(kind: Literal["chat", "completions", "completion"], body: Any) -> _Job:
    if not isinstance(body, dict):
        raise _BadRequest("the body must be a JSON object")
    if kind == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise _BadRequest("'messages' is required and must be a non-empty list")
        try:
            prompt = apply_template(messages, bool(body.get("add_generation_prompt", True)))
        except ValueError as e:
            raise _BadRequest(str(e)) from None
        n_prompt = count_tokens(prompt, add_special=True)
    else:
        prompt, n_prompt = _prompt_of(body)
    if kind == "completion":
        n_predict = _int_field(body, "n_predict", "max_tokens", default=-1)
    else:
        n_predict = _int_field(body, "max_completion_tokens", "max_tokens", "n_predict", default=-1)
    options = body.get("stream_options")
    model = body.get("model")
    return _Job(
        kind=kind,
        prompt=prompt,
        prompt_tokens=n_prompt,
        n_predict=n_predict,
        ignore_eos=bool(body.get("ignore_eos", False)),
        stream=bool(body.get("stream", False)),
        include_usage=isinstance(options, dict) and bool(options.get("include_usage")),
        model=model if isinstance(model, str) and model else MODEL_NAME,
    )


class _CompletionEndpoint:
    """One of the three completion routes, as a raw ASGI app (status sent at the first token)."""

    def __init__(self, runtime: SimulatorRuntime, kind: Literal["chat", "completions", "completion"]) -> None:
        self.runtime = runtime
        self.kind = kind

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        chunks = []
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        try:
            job = _parse_job(self.kind, json.loads(b"".join(chunks) or b"null"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            await _send_json(send, 400, _error_body(400, f"invalid JSON: {e}", "invalid_request_error"))
            return
        except _BadRequest as e:
            await _send_json(send, 400, _error_body(400, str(e), "invalid_request_error"))
            return
        rt = self.runtime
        params = {"stream": job.stream}
        task_id, queue = rt.submit(job.prompt_tokens, job.n_predict, ignore_eos=job.ignore_eos, params=params)
        prefix = "cmpl-" if job.kind == "completions" else "chatcmpl-"
        id_rng = random.Random(f"id:{rt.config.seed}:{task_id}")
        job.cmpl_id = prefix + "".join(id_rng.choices(string.ascii_letters + string.digits, k=32))

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            queue.put_nowait(_DISCONNECTED)

        watcher = asyncio.get_running_loop().create_task(watch())
        try:
            if job.stream:
                await self._stream(job, queue, send)
            else:
                await self._whole(job, queue, send)
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await watcher
            rt.finish(task_id)

    async def _whole(self, job: _Job, queue: asyncio.Queue, send: Any) -> None:
        rt = self.runtime
        text: list[str] = []
        token_ids: list[int] = []
        disconnected_at: float | None = None
        while True:
            if disconnected_at is None:
                ev = await queue.get()
            else:
                # llama-server notices a gone non-streaming client only once a 1 s wait for a
                # result times out, and any request's result restarts that wait.
                idle_for = rt.clock() - max(disconnected_at, rt.last_result_at)
                if idle_for >= NONSTREAM_DISCONNECT_POLL_S:
                    return
                try:
                    ev = await asyncio.wait_for(queue.get(), NONSTREAM_DISCONNECT_POLL_S - idle_for)
                except TimeoutError:
                    continue
            if ev is _DISCONNECTED:
                disconnected_at = rt.clock()
            elif isinstance(ev, Token):
                text.append(ev.text)
                token_ids.append(ev.id)
            elif isinstance(ev, Failed):
                if disconnected_at is None:
                    await _send_json(send, ev.status, {"error": ev.error})
                return
            elif isinstance(ev, Done):
                if disconnected_at is None:
                    await _send_json(send, 200, self._final_whole(job, ev, "".join(text), token_ids))
                return

    async def _stream(self, job: _Job, queue: asyncio.Queue, send: Any) -> None:
        started = False
        while True:
            ev = await queue.get()
            if ev is _DISCONNECTED:
                return
            if isinstance(ev, Failed):
                if not started:  # before the first token: a plain HTTP error
                    await _send_json(send, ev.status, {"error": ev.error})
                else:
                    await send({"type": "http.response.body", "body": _sse({"error": ev.error}), "more_body": False})
                return
            if not started:
                started = True
                await send(
                    {
                        "type": "http.response.start",
                        "status": 200,
                        "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")],
                    }
                )
            if isinstance(ev, Token):
                await send({"type": "http.response.body", "body": self._partial(job, ev), "more_body": True})
            elif isinstance(ev, Done):
                await send({"type": "http.response.body", "body": self._final_stream(job, ev), "more_body": False})
                return

    # -- payloads ---------------------------------------------------------------------

    def _head(self, job: _Job, obj: str) -> dict[str, Any]:
        return {
            "created": job.created,
            "id": job.cmpl_id,
            "model": job.model,
            "system_fingerprint": BUILD_INFO,
            "object": obj,
        }

    @staticmethod
    def _usage(ev: Done) -> dict[str, Any]:
        return {
            "completion_tokens": ev.n_decoded,
            "prompt_tokens": ev.n_prompt,
            "total_tokens": ev.n_decoded + ev.n_prompt,
            "prompt_tokens_details": {"cached_tokens": 0},
        }

    @staticmethod
    def _finish_reason(ev: Done) -> str:
        return "stop" if ev.stop_type == "eos" else "length"

    def _partial(self, job: _Job, ev: Token) -> bytes:
        if job.kind == "completion":
            return _sse(
                {
                    "index": 0,
                    "content": ev.text,
                    "tokens": [ev.id],
                    "stop": False,
                    "id_slot": ev.id_slot,
                    "tokens_predicted": ev.n_decoded,
                    "tokens_evaluated": job.prompt_tokens,
                }
            )
        if job.kind == "completions":
            choice = {"text": ev.text, "index": 0, "logprobs": None, "finish_reason": None}
            return _sse({"choices": [choice], **self._head(job, "text_completion")})
        head = self._head(job, "chat.completion.chunk")
        out = b""
        if ev.n_decoded == 1:  # OpenAI's initial role delta
            role = {"role": "assistant", "content": None}
            out += _sse({"choices": [{"finish_reason": None, "index": 0, "delta": role}], **head})
        return out + _sse({"choices": [{"finish_reason": None, "index": 0, "delta": {"content": ev.text}}], **head})

    def _native_final(self, job: _Job, ev: Done, content: str, tokens: list[int]) -> dict[str, Any]:
        return {
            "index": 0,
            "content": content,
            "tokens": tokens,
            "id_slot": ev.id_slot,
            "stop": True,
            "model": job.model,
            "tokens_predicted": ev.n_decoded,
            "tokens_evaluated": ev.n_prompt,
            "generation_settings": {"n_predict": job.n_predict, "ignore_eos": job.ignore_eos, "stream": job.stream},
            "prompt": job.prompt,
            "has_new_line": False,
            "truncated": ev.truncated,
            "stop_type": ev.stop_type,
            "stopping_word": "",
            "tokens_cached": ev.n_cached,
            "timings": ev.timings,
        }

    def _final_stream(self, job: _Job, ev: Done) -> bytes:
        if job.kind == "completion":
            return _sse(self._native_final(job, ev, "", []))  # no [DONE] on the native route
        if job.kind == "completions":
            choice = {"text": "", "index": 0, "logprobs": None, "finish_reason": self._finish_reason(ev)}
            final = {
                "choices": [choice],
                **self._head(job, "text_completion"),
                "usage": self._usage(ev),
                "timings": ev.timings,
            }
            return _sse(final) + b"data: [DONE]\n\n"
        head = self._head(job, "chat.completion.chunk")
        chunks = [{"choices": [{"finish_reason": self._finish_reason(ev), "index": 0, "delta": {}}], **head}]
        if job.include_usage:
            chunks.append({"choices": [], **head, "usage": self._usage(ev)})
        chunks[-1]["timings"] = ev.timings
        return b"".join(_sse(c) for c in chunks) + b"data: [DONE]\n\n"

    def _final_whole(self, job: _Job, ev: Done, text: str, tokens: list[int]) -> dict[str, Any]:
        if job.kind == "completion":
            return self._native_final(job, ev, text, tokens)
        if job.kind == "completions":
            choice = {"text": text, "index": 0, "logprobs": None, "finish_reason": self._finish_reason(ev)}
            head = self._head(job, "text_completion")
            return {"choices": [choice], **head, "usage": self._usage(ev), "timings": ev.timings}
        message = {"role": "assistant", "content": text}
        choice = {"finish_reason": self._finish_reason(ev), "index": 0, "message": message}
        head = self._head(job, "chat.completion")
        return {"choices": [choice], **head, "usage": self._usage(ev), "timings": ev.timings}


def build_simulator_app(config: SimulatorConfig | None = None, *, clock: Callable[[], float] = time.monotonic):
    """The simulator as a Starlette app; ``app.state.simulator`` is its :class:`SimulatorRuntime`."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, PlainTextResponse
    from starlette.routing import Route

    runtime = SimulatorRuntime(config, clock=clock)
    cfg = runtime.config

    def error(status: int, message: str, type_: str) -> JSONResponse:
        return JSONResponse(_error_body(status, message, type_), status_code=status)

    async def body_of(request: Request) -> dict[str, Any]:
        try:
            body = json.loads(await request.body() or b"null")
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise _BadRequest(f"invalid JSON: {e}") from None
        if not isinstance(body, dict):
            raise _BadRequest("the body must be a JSON object")
        return body

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    async def props(request: Request) -> JSONResponse:
        return JSONResponse(
            {
                "default_generation_settings": {"params": {"n_predict": -1, "seed": cfg.seed}, "n_ctx": cfg.slot_ctx},
                "total_slots": cfg.slots,
                "model_alias": MODEL_NAME,
                "model_path": MODEL_NAME,
                "modalities": {"vision": False, "video": False, "audio": False},
                "endpoint_slots": True,
                "endpoint_props": True,
                "endpoint_metrics": True,
                "chat_template": "chatml (simulated)",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "build_info": BUILD_INFO,
                "is_sleeping": False,
            }
        )

    async def slots(request: Request) -> JSONResponse:
        runtime.sync()
        if request.query_params.get("fail_on_no_slot") and runtime.core.busy_slots >= cfg.slots:
            return error(503, "no slot available", "unavailable_error")
        return JSONResponse(runtime.core.slots_json())

    async def metrics(request: Request) -> PlainTextResponse:
        runtime.sync()
        return PlainTextResponse(runtime.core.metrics_text(), media_type="text/plain; version=0.0.4")

    async def models(request: Request) -> JSONResponse:
        meta = {
            "n_vocab": VOCAB_SIZE,
            "n_ctx_train": cfg.ctx,
            "n_embd": 4096,
            "n_params": 8_030_261_248,
            "size": 4_920_000_000,
            "n_ctx": cfg.slot_ctx,
        }
        model = {"id": MODEL_NAME, "object": "model", "created": 0, "owned_by": "llamacpp", "meta": meta}
        return JSONResponse({"object": "list", "data": [model]})

    async def tokenize(request: Request) -> JSONResponse:
        try:
            body = await body_of(request)
        except _BadRequest as e:
            return error(400, str(e), "invalid_request_error")
        content = body.get("content", "")
        if not isinstance(content, str):
            return error(400, "'content' must be a string", "invalid_request_error")
        pairs = fake_tokenize(content, bool(body.get("add_special", False)))
        if body.get("with_pieces"):
            return JSONResponse({"tokens": [{"id": i, "piece": p} for i, p in pairs]})
        return JSONResponse({"tokens": [i for i, _ in pairs]})

    async def detokenize(request: Request) -> JSONResponse:
        try:
            body = await body_of(request)
        except _BadRequest as e:
            return error(400, str(e), "invalid_request_error")
        tokens = body.get("tokens", [])
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            return error(400, "'tokens' must be a list of ints", "invalid_request_error")
        words = [runtime.core.word(t) for t in tokens if t not in (BOS_ID, EOS_ID)]
        return JSONResponse({"content": " ".join(words)})

    async def chat_prompt(request: Request) -> str | JSONResponse:
        try:
            body = await body_of(request)
            messages = body.get("messages")
            if not isinstance(messages, list):
                raise _BadRequest("'messages' is required and must be a list")
            return apply_template(messages, bool(body.get("add_generation_prompt", True)))
        except (_BadRequest, ValueError) as e:
            return error(400, str(e), "invalid_request_error")

    async def template(request: Request) -> JSONResponse:
        prompt = await chat_prompt(request)
        return prompt if isinstance(prompt, JSONResponse) else JSONResponse({"prompt": prompt})

    async def input_tokens(request: Request) -> JSONResponse:
        prompt = await chat_prompt(request)
        if isinstance(prompt, JSONResponse):
            return prompt
        return JSONResponse({"input_tokens": count_tokens(prompt, add_special=True)})

    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/props", props, methods=["GET"]),
        Route("/slots", slots, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/models", models, methods=["GET"]),
        Route("/tokenize", tokenize, methods=["POST"]),
        Route("/detokenize", detokenize, methods=["POST"]),
        Route("/apply-template", template, methods=["POST"]),
        Route("/v1/chat/completions/input_tokens", input_tokens, methods=["POST"]),
        Route("/v1/chat/completions", _CompletionEndpoint(runtime, "chat"), methods=["POST"]),
        Route("/chat/completions", _CompletionEndpoint(runtime, "chat"), methods=["POST"]),
        Route("/v1/completions", _CompletionEndpoint(runtime, "completions"), methods=["POST"]),
        Route("/completion", _CompletionEndpoint(runtime, "completion"), methods=["POST"]),
        Route("/completions", _CompletionEndpoint(runtime, "completion"), methods=["POST"]),
    ]
    app = Starlette(routes=routes)
    app.state.simulator = runtime
    return app


# --- serving ---------------------------------------------------------------------------


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
