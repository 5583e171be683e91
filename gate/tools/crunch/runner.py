"""The runner (async, httpx): :func:`run_crunch` reads the server's slots from ``/props``,
sizes each context's prompt with ``/tokenize``, runs every cell's streaming requests and
returns the :class:`CrunchReport`."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

import httpx

from gate.tools.crunch.errors import CrunchError, CrunchUnreachable, CrunchUsageError
from gate.tools.crunch.inputs import rotated_text, word_sequence
from gate.tools.crunch.plan import (
    DEFAULT_MAX_TOKENS,
    ENDPOINT_PATHS,
    Cell,
    CellResult,
    Endpoint,
    RequestResult,
    Slo,
    build_grid,
    evaluate_cell,
    max_tokens_for,
    prompt_target,
    recommend,
    requests_for,
)
from gate.tools.crunch.progress import Progress
from gate.tools.crunch.report import CrunchReport, ServerInfo, ctx_label, report_to_json


@dataclass(frozen=True, slots=True)
class CrunchSettings:
    url: str = "http://127.0.0.1:8080"
    ctx: tuple[int, ...] | None = None
    concurrency: tuple[int, ...] | None = None
    requests: int | None = None
    max_tokens: int = DEFAULT_MAX_TOKENS
    endpoint: Endpoint = "chat"
    slo: Slo = field(default_factory=Slo)
    timeout_s: float = 300.0
    api_key: str | None = None


def _error_text(status: int, body: bytes) -> str:
    message = ""
    try:
        data = json.loads(body)
        err = data.get("error") if isinstance(data, dict) else None
        if isinstance(err, dict):
            message = str(err.get("message") or "")
        elif isinstance(err, str):
            message = err
    except (ValueError, UnicodeDecodeError):
        message = body.decode(errors="replace").strip()[:200]
    return f"HTTP {status}: {message}" if message else f"HTTP {status}"


def _stream_error_text(obj: dict[str, Any]) -> str:
    err = obj.get("error")
    if isinstance(err, dict):
        code = err.get("code")
        msg = err.get("message") or "error"
        return f"stream error {code}: {msg}" if code else f"stream error: {msg}"
    return f"stream error: {err}"


class _Runner:
    def __init__(self, settings: CrunchSettings, client: httpx.AsyncClient, clock: Callable[[], float]) -> None:
        self.s = settings
        self.client = client
        self.clock = clock
        self.path = ENDPOINT_PATHS[settings.endpoint]
        self.slots: int | None = None  # from /props

    # --- server facts -------------------------------------------------------------------

    async def props(self) -> ServerInfo:
        url = self.s.url
        try:
            resp = await self.client.get("/props", timeout=10.0)
        except httpx.TransportError as e:
            raise CrunchUnreachable(f"cannot reach llama-server at {url}: {_transport_text(e)}") from e
        if any(h.lower().startswith("x-tokengate") for h in resp.headers):
            raise CrunchUsageError(f"{url} is a tokengate gate: point crunch at llama-server itself, not through the gate")
        if resp.status_code == 503:
            raise CrunchError(f"{url}/props answered 503 (model still loading?): try again when /health is 200")
        if resp.status_code != 200:
            raise CrunchError(f"{url}/props answered HTTP {resp.status_code}: is this llama-server?")
        try:
            data = resp.json()
            slots = int(data["total_slots"])
            slot_ctx = int(data["default_generation_settings"]["n_ctx"])
        except (ValueError, KeyError, TypeError):
            raise CrunchError(f"{url}/props lacks total_slots or default_generation_settings.n_ctx: is this llama-server?") from None
        if slots < 1 or slot_ctx < 1:
            raise CrunchError(f"{url}/props reports {slots} slots of {slot_ctx} tokens")
        model = data.get("model_path")
        if isinstance(model, str) and model:
            model = model.replace("\\", "/").rsplit("/", 1)[-1]
        else:
            model = None
        build = data.get("build_info") if isinstance(data.get("build_info"), str) else None
        # The layout as the gate learns it (kv = "auto"): /props kv_unified where a build says
        # it, one slot, or a llama-server on this host by its command line; else not known.
        from gate.backend.layout import learn_layout, local_server_args

        layout = learn_layout(data, "auto", local_server_args(url))
        kv = layout.kv if layout.source != "assumed" else None
        pool = layout.pool if kv == "unified" else None
        return ServerInfo(url=url, total_slots=slots, slot_ctx=slot_ctx, model=model, build=build, kv=kv, pool=pool)

    # --- prompts -------------------------------------------------------------------------

    async def _post_json(self, path: str, body: dict[str, Any]) -> httpx.Response:
        try:
            return await self.client.post(path, json=body, timeout=30.0)
        except httpx.TransportError as e:
            raise CrunchUnreachable(f"cannot reach llama-server at {self.s.url}: {_transport_text(e)}") from e

    async def count_tokens(self, text: str) -> int:
        """Prompt tokens the server will see for ``text`` (chat: after its template)."""
        content = text
        if self.s.endpoint == "chat":
            resp = await self._post_json("/apply-template", {"messages": [{"role": "user", "content": text}]})
            if resp.status_code == 200:
                content = resp.json().get("prompt", text)
        resp = await self._post_json("/tokenize", {"content": content, "add_special": True})
        if resp.status_code != 200:
            raise CrunchError(f"{self.s.url}/tokenize answered {_error_text(resp.status_code, resp.content)}")
        return len(resp.json()["tokens"])

    async def fit_prompt(self, target: int) -> tuple[list[str], int]:
        """The most words whose prompt is at most ``target`` tokens (binary search on /tokenize)."""
        words = word_sequence(target + 1)
        lo, lo_tokens = 1, await self.count_tokens(" ".join(words[:1]))
        if lo_tokens >= target:
            return words[:1], lo_tokens
        hi = target + 1  # every word is at least one token
        while hi - lo > 1:
            mid = (lo + hi) // 2
            n = await self.count_tokens(" ".join(words[:mid]))
            if n <= target:
                lo, lo_tokens = mid, n
            else:
                hi = mid
        return words[:lo], lo_tokens

    # --- one request ---------------------------------------------------------------------

    def body(self, text: str, max_tokens: int) -> dict[str, Any]:
        common = {"stream": True, "ignore_eos": True, "cache_prompt": False}
        if self.s.endpoint == "chat":
            return {
                "messages": [{"role": "user", "content": text}],
                "max_tokens": max_tokens,
                "stream_options": {"include_usage": True},
                **common,
            }
        return {"prompt": text, "n_predict": max_tokens, **common}

    async def one(self, text: str, max_tokens: int, on_token: Callable[[], None] | None = None) -> RequestResult:
        chat = self.s.endpoint == "chat"
        t0 = self.clock()
        first: float | None = None
        last: float | None = None
        counted = 0
        reported_tokens: int | None = None
        reported_prompt: int | None = None
        try:
            # llama-server closes the connection after a streamed answer without saying so; a
            # pooled connection then fails the next request ("Server disconnected"): never reuse.
            async with self.client.stream("POST", self.path, json=self.body(text, max_tokens), headers={"Connection": "close"}) as resp:
                if "x-tokengate-class" in resp.headers:
                    raise CrunchUsageError(f"{self.s.url} is a tokengate gate: point crunch at llama-server itself, not through the gate")
                if resp.status_code != 200:
                    return RequestResult(ok=False, error=_error_text(resp.status_code, await resp.aread()))
                async for line in resp.aiter_lines():
                    if not line.startswith("data:"):
                        continue  # blank separators, ": ping" comments
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    now = self.clock()
                    try:
                        obj = json.loads(data)
                    except ValueError:
                        return RequestResult(ok=False, error=f"bad stream chunk: {data[:80]!r}")
                    if not isinstance(obj, dict):
                        continue
                    if "error" in obj:
                        return RequestResult(ok=False, error=_stream_error_text(obj))
                    if first is None:
                        first = now
                    usage = obj.get("usage")
                    if isinstance(usage, dict):
                        reported_tokens = _int_or(usage.get("completion_tokens"), reported_tokens)
                        reported_prompt = _int_or(usage.get("prompt_tokens"), reported_prompt)
                    timings = obj.get("timings")
                    if isinstance(timings, dict) and reported_tokens is None:
                        reported_tokens = _int_or(timings.get("predicted_n"), None)
                    if chat:
                        choices = obj.get("choices") or []
                        if choices:
                            last = now
                            delta = choices[0].get("delta") or {}
                            if delta.get("content"):
                                counted += 1
                                if on_token is not None:
                                    on_token()
                    else:
                        last = now
                        if obj.get("stop"):
                            reported_tokens = _int_or(obj.get("tokens_predicted"), reported_tokens)
                            reported_prompt = _int_or(obj.get("tokens_evaluated"), reported_prompt)
                        else:
                            counted += 1
                            if on_token is not None:
                                on_token()
        except httpx.TimeoutException:
            return RequestResult(ok=False, error=f"timed out after {self.s.timeout_s:g} s")
        except httpx.ConnectError as e:
            raise CrunchUnreachable(f"lost llama-server at {self.s.url}: {_transport_text(e)}") from e
        except httpx.TransportError as e:
            return RequestResult(ok=False, error=f"connection error: {_transport_text(e)}")
        if first is None:
            return RequestResult(ok=False, error="the stream ended without data")
        tokens = reported_tokens if reported_tokens is not None else counted
        ttft_ms = (first - t0) * 1000.0
        tpot_ms = None
        if tokens > 1 and last is not None and last > first:
            tpot_ms = (last - first) * 1000.0 / (tokens - 1)
        return RequestResult(ok=True, ttft_ms=ttft_ms, tpot_ms=tpot_ms, tokens=tokens, prompt_tokens=reported_prompt)

    # --- one cell ------------------------------------------------------------------------

    async def cell(
        self,
        cell: Cell,
        words: list[str],
        prompt_tokens: int,
        max_tokens: int,
        n_requests: int,
        first_rotation: int,
        progress: Progress,
    ) -> CellResult:
        queue = iter(range(n_requests))
        results: list[RequestResult] = []

        async def worker() -> None:
            for i in queue:  # a shared iterator: each index goes to exactly one worker
                # Each request of a context length gets its own rotation of the words, so no two
                # prompts share a prefix (the prompt cache would flatter TTFT) until they run out.
                r = await self.one(rotated_text(words, first_rotation + i), max_tokens, progress.token)
                results.append(r)
                progress.advance()

        started = self.clock()
        await asyncio.gather(*(worker() for _ in range(min(cell.concurrency, n_requests))))
        wall = self.clock() - started
        return evaluate_cell(cell, prompt_tokens, max_tokens, results, self.s.slo, wall_s=wall, slots=self.slots)


def _int_or(value: Any, default: int | None) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _transport_text(e: Exception) -> str:
    text = str(e).strip()
    return text or type(e).__name__


async def run_crunch(
    settings: CrunchSettings,
    *,
    err: TextIO | None = None,
    clock: Callable[[], float] = time.perf_counter,
    transport: httpx.AsyncBaseTransport | None = None,
) -> CrunchReport:
    """Run the sweep against ``settings.url`` and return the report. Progress goes to ``err``."""
    headers = {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}
    timeout = httpx.Timeout(settings.timeout_s, connect=10.0)
    # Shorter than llama-server's own 5 s keep-alive (for /props, /tokenize; streams never pool).
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=8, keepalive_expiry=2.0)
    async with httpx.AsyncClient(base_url=settings.url, headers=headers, timeout=timeout, limits=limits, transport=transport) as client:
        runner = _Runner(settings, client, clock)
        server = await runner.props()
        runner.slots = server.total_slots
        grid = build_grid(server.total_slots, server.slot_ctx, ctx=settings.ctx, concurrency=settings.concurrency)
        skipped = tuple(x for x in (settings.ctx or ()) if x > server.slot_ctx)
        if not grid:
            raise CrunchUsageError(
                "no --ctx value fits one slot's context of "
                f"{server.slot_ctx:,} tokens ({server.total_slots} slots): use --ctx {server.slot_ctx} or less"
            )
        plan = [(c, requests_for(c.concurrency, settings.requests)) for c in grid]
        progress = Progress(err, sum(n for _, n in plan))
        progress.note(f"crunch: {server.url}: {server.layout}; {len(grid)} cells, {progress.total} requests")
        prompts: dict[int, tuple[list[str], int]] = {}
        for x in sorted({c.ctx for c in grid}):
            progress.cell_started(f"sizing a ~{prompt_target(x)}-token prompt for ctx {ctx_label(x)}")
            prompts[x] = await runner.fit_prompt(prompt_target(x))
        # One short request first, so no cell pays for a cold server.
        warm_words = prompts[min(prompts)][0]
        await runner.one(rotated_text(warm_words, 0), 2)
        results = []
        rotations = dict.fromkeys(prompts, 1)  # rotation 0 was the warm-up's
        try:
            for cell, n in plan:
                words, tokens = prompts[cell.ctx]
                progress.cell_started(
                    f"concurrency {cell.concurrency}, ctx {ctx_label(cell.ctx)}",
                    expected_tokens=n * max_tokens_for(cell.ctx, settings.max_tokens),
                )
                result = await runner.cell(
                    cell, words, tokens, max_tokens_for(cell.ctx, settings.max_tokens), n, rotations[cell.ctx], progress
                )
                rotations[cell.ctx] += n
                results.append(result)
                progress.cell_finished(result)
        finally:
            progress.close()
    return CrunchReport(
        server=server,
        endpoint=settings.endpoint,
        slo=settings.slo,
        max_tokens_cap=settings.max_tokens,
        cells=tuple(results),
        recommendation=recommend(results, slot_ctx=server.slot_ctx),
        measured_at=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        skipped_ctx=skipped,
    )


def write_json(report: CrunchReport, out: TextIO = sys.stdout) -> None:
    json.dump(report_to_json(report), out, indent=2)
    out.write("\n")
