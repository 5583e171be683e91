"""The pure scheduling model: slots, FIFO, KV pool, decode steps; time is an argument.

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
"""

from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import dataclass
from typing import Any, Literal

from gate.tools.simulator.config import SimulatorConfig
from gate.tools.simulator.tokenizer import _make_vocab

CONTEXT_EXCEEDED = "Context size has been exceeded."


def _fmt_metric(value: float) -> str:
    # Exact for counters (llama-server prints 6 significant digits, which loses counts past 1e6).
    return str(value) if isinstance(value, int) else format(value, ".12g")


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
                        f"request ({task.prompt_tokens} tokens) exceeds the available context size ({n_ctx} tokens), try increasing it",
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
