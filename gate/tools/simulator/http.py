"""The HTTP shell: llama-server's endpoints and shapes over a :class:`SimulatorRuntime`.

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
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import string
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from gate.tools.simulator.config import SimulatorConfig
from gate.tools.simulator.model import Done, Failed, Token
from gate.tools.simulator.runtime import SimulatorRuntime
from gate.tools.simulator.tokenizer import BOS_ID, EOS_ID, VOCAB_SIZE, apply_template, count_tokens, fake_tokenize

MODEL_NAME = "simulated"
BUILD_INFO = "b0-tokengate-simulator"
# llama-server's HTTP_POLLING_SECONDS: how often a non-streaming request looks for a
# disconnected client (real time, not scaled: it is the HTTP layer, not the model).
NONSTREAM_DISCONNECT_POLL_S = 1.0

_DISCONNECTED = object()


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
                    async with asyncio.timeout(NONSTREAM_DISCONNECT_POLL_S - idle_for):
                        ev = await queue.get()
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
