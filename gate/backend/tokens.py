"""Prompt token counts from the backend's own tokenizer, with an LRU cache and a safe estimate.

Exact counts (checked against llama.cpp 0c1e570's ``usage.prompt_tokens`` and
``tokens_evaluated``):

* chat: ``POST /v1/chat/completions/input_tokens`` with the prompt-bearing
  fields of the request -> ``{"input_tokens": N}``.  Builds without that route
  (404/405/501) are remembered per backend and counted with ``POST
  /apply-template`` -> ``{"prompt"}`` then ``POST /tokenize`` (``add_special``
  and ``parse_special`` both true, as the server tokenizes a templated prompt);
  the route is probed again after ``reprobe_s`` in case the backend was upgraded.
* ``/v1/completions`` and ``/completion``: the prompt goes through ``/tokenize``
  with the same flags.  A list of ints is already tokens (no BOS is added); a
  list mixing strings and ints is one prompt (only a leading string gets BOS);
  any other list is several prompts, each its own task on the server, so the
  count is their sum (the KV cost; the server's own ``usage`` reports less).
* the Anthropic Messages API and the Responses API: their own counting routes,
  ``POST /v1/messages/count_tokens`` and ``POST /v1/responses/input_tokens``
  (``{"input_tokens": N}``), which convert the body to a chat request and template it
  exactly as the generation routes do (llama.cpp 0.3.36, server-context.cpp
  ``handle_count_tokens``). A build without the route (404/405/501) gets estimates.

Only a digest of the prompt-bearing fields is kept (``sha256`` of the backend
URL, the kind and their canonical JSON), never the prompt text.  When the
backend cannot answer (down, timing out, loading, 5xx, malformed answer, or
refusing the body) the count is an estimate, ``ceil(bytes of that canonical
JSON / 3)``, which is not cached so the next request tries the backend again.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeGuard

import httpx

__all__ = [
    "CHAT_PROMPT_FIELDS",
    "COMPLETION_PROMPT_FIELDS",
    "COUNT_ROUTES",
    "INPUT_TOKENS_PATH",
    "TokenCount",
    "TokenCounter",
    "TokenKind",
    "TokenSource",
    "cache_key",
    "canonical_json",
    "estimate_tokens",
    "prompt_fields",
]

logger = logging.getLogger("tokengate.tokens")

TokenSource = Literal["exact", "estimate"]
TokenKind = Literal["chat", "completions", "completion", "messages", "responses"]

# Everything llama-server's chat parsing (oaicompat_chat_params_parse) feeds into
# the template or its inputs; extra fields only cost cache hits, missing ones a
# wrong count, so this errs on the side of including.
CHAT_PROMPT_FIELDS: tuple[str, ...] = (
    "messages",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "add_generation_prompt",
    "chat_template_kwargs",
    "enable_thinking",
    "reasoning_format",
    "response_format",
    "json_schema",
    "grammar",
)
COMPLETION_PROMPT_FIELDS: tuple[str, ...] = ("prompt",)
# What llama-server's server_chat_convert_anthropic_to_oai (server-chat.cpp) keeps for the
# template: it builds a new body from these alone (plus sampling fields that change no token).
MESSAGES_PROMPT_FIELDS: tuple[str, ...] = ("system", "messages", "tools", "tool_choice", "chat_template_kwargs", "thinking")
# server_chat_convert_responses_to_chatcmpl keeps every field of the body: its own
# prompt-bearing ones, and every chat field a Responses body may also carry.
RESPONSES_PROMPT_FIELDS: tuple[str, ...] = ("input", "instructions", "reasoning", "previous_response_id") + tuple(
    f for f in CHAT_PROMPT_FIELDS if f != "messages"
)
_PROMPT_FIELDS: dict[str, tuple[str, ...]] = {
    "chat": CHAT_PROMPT_FIELDS,
    "messages": MESSAGES_PROMPT_FIELDS,
    "responses": RESPONSES_PROMPT_FIELDS,
}

INPUT_TOKENS_PATH = "/v1/chat/completions/input_tokens"
#: the APIs counted by their own route alone (no template-and-tokenize fallback)
COUNT_ROUTES: dict[str, str] = {"messages": "/v1/messages/count_tokens", "responses": "/v1/responses/input_tokens"}
APPLY_TEMPLATE_PATH = "/apply-template"
TOKENIZE_PATH = "/tokenize"

# Statuses by which a backend says "no such route" rather than "bad request".
_NO_ROUTE = frozenset({404, 405, 501})
_ESTIMATE_BYTES_PER_TOKEN = 3


@dataclass(frozen=True, slots=True)
class TokenCount:
    """A prompt's token count, where it came from, and whether the cache answered."""

    tokens: int
    source: TokenSource
    cached: bool


class _CountFailed(Exception):
    """The backend gave no usable count; ``backend_fault`` is false when it refused the body."""

    def __init__(self, reason: str, *, backend_fault: bool) -> None:
        super().__init__(reason)
        self.reason = reason
        self.backend_fault = backend_fault


def prompt_fields(kind: TokenKind, body: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of a request body that determine its prompt tokens (those present)."""
    names = _PROMPT_FIELDS.get(kind, COMPLETION_PROMPT_FIELDS)
    return {name: body[name] for name in names if name in body}


def canonical_json(fields: Mapping[str, Any]) -> bytes:
    """Compact UTF-8 JSON with sorted keys: equal fields always give equal bytes."""
    return json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def cache_key(base_url: str, kind: str, canonical: bytes) -> bytes:
    """SHA-256 over backend, kind and canonical fields (NUL-separated so parts cannot run together)."""
    h = hashlib.sha256()
    h.update(base_url.rstrip("/").encode())
    h.update(b"\0")
    h.update(kind.encode())
    h.update(b"\0")
    h.update(canonical)
    return h.digest()


#: a prompt forwarded beside its count (gate/http/proxy.py) holds its estimate x its backend's
#: ratio, plus this many tokens for what a chat template adds (roles, turn markers, a default
#: system text), until the count settles it
BOUND_MARGIN = 64
#: the most the ratio grows to: 3 x (bytes / 3) is a token per byte, the most a byte-level
#: tokenizer makes of text (its specials aside)
_RATIO_MAX = 3.0
#: each exact count eases the ratio this much of the way back to 1 (a burst of one script does
#: not inflate every bound after it for long)
_RATIO_EASE = 0.01
#: how far one exact count moves the typical tokens per estimated token (`TokenCounter.likely`)
_TYPICAL_WEIGHT = 0.1
#: the chat `TokenCounter.chat_template_tokens` counts to learn the template's size
_TEMPLATE_PROBE_TEXT = "hello"
_TEMPLATE_PROBE: dict[str, Any] = {"messages": [{"role": "user", "content": _TEMPLATE_PROBE_TEXT}]}


def estimate_tokens(canonical: bytes) -> int:
    """Conservative stand-in for an exact count: one token per 3 bytes of JSON, at least 1."""
    return max(1, math.ceil(len(canonical) / _ESTIMATE_BYTES_PER_TOKEN))


def _is_token(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _subprompt_plan(prompt: Any) -> tuple[list[tuple[str, bool]], int]:
    """One prompt as (texts to tokenize with their add_special flag, literal token count)."""
    if isinstance(prompt, str):
        return [(prompt, True)], 0
    if isinstance(prompt, list) and all(isinstance(p, str) or _is_token(p) for p in prompt):
        # (empty: one entry of a prompt list with no tokens; the whole prompt never is, intake refuses it)
        # Mixed strings and ids: llama-server adds BOS only to a string in first place.
        texts = [(p, i == 0) for i, p in enumerate(prompt) if isinstance(p, str)]
        return texts, sum(1 for p in prompt if _is_token(p))
    raise ValueError("unsupported prompt shape")


def _prompt_plan(prompt: Any) -> tuple[list[tuple[str, bool]], int]:
    """Mirror llama-server's tokenize_input_prompts: one prompt, or a list of prompts (summed)."""
    if isinstance(prompt, list) and prompt:
        tokens = [_is_token(p) for p in prompt]
        if all(tokens) or (any(tokens) and any(isinstance(p, str) for p in prompt)):
            return _subprompt_plan(prompt)  # token ids, or strings mixed with ids: one prompt
        # Every other list is several prompts, each run as its own task.
        texts: list[tuple[str, bool]] = []
        literal = 0
        for sub in prompt:
            sub_texts, sub_literal = _subprompt_plan(sub)
            texts.extend(sub_texts)
            literal += sub_literal
        return texts, literal
    if prompt == []:
        raise ValueError("an empty prompt list")  # llama-server refuses it (400)
    return _subprompt_plan(prompt)


class TokenCounter:
    """Counts prompt tokens on the backend, caches exact counts, falls back to an estimate.

    ``stats()``: ``hits``/``misses`` count cache look-ups (a prompt that is only
    token ids needs none), ``exact``/``estimate`` count answers by source,
    ``errors`` counts failed backend look-ups, ``coalesced`` counts callers that
    joined an identical look-up already in flight.
    """

    def __init__(
        self,
        client: httpx.AsyncClient,
        *,
        cache_size: int = 4096,
        timeout_s: float = 2.0,
        reprobe_s: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if cache_size < 0:
            raise ValueError(f"cache_size must be >= 0, got {cache_size!r}")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        self._client = client
        self._cache_size = cache_size
        self._timeout_s = timeout_s
        self._reprobe_s = reprobe_s
        self._clock = clock
        self._cache: OrderedDict[bytes, int] = OrderedDict()
        self._inflight: dict[bytes, asyncio.Task[int | None]] = {}
        # Per backend: False while input_tokens is known missing, with the time to probe again.
        self._input_tokens: dict[str, bool] = {}
        self._reprobe_at: dict[str, float] = {}
        self._healthy: dict[str, bool] = {}
        # Per backend (and model): the most tokens per estimated token its counts gave lately,
        # the margin aside; at least 1 (see `bound`).
        self._ratio: dict[str, float] = {}
        self._typical: dict[str, float] = {}  # mean exact tokens per estimated token, lately (`likely`)
        self._stats = {"hits": 0, "misses": 0, "exact": 0, "estimate": 0, "errors": 0, "coalesced": 0}

    def stats(self) -> dict[str, int]:
        """A copy of the counters (see the class docstring)."""
        return dict(self._stats)

    def __len__(self) -> int:
        return len(self._cache)

    async def count(
        self,
        base_url: str,
        kind: TokenKind,
        body: Mapping[str, Any],
        headers: Mapping[str, str] | None = None,
        *,
        model: str | None = None,
    ) -> TokenCount:
        """The prompt tokens of ``body`` on the backend at ``base_url``; never raises for backend trouble.

        ``model``: a llama-server in router mode; every look-up names that model and asks
        with ``autoload=false`` (counting must never load a model behind the gate's back).
        """
        base_url = base_url.rstrip("/")
        fields = prompt_fields(kind, body)
        canonical = canonical_json(fields)
        if kind in ("completions", "completion"):
            try:
                texts, literal = _prompt_plan(fields.get("prompt"))
            except ValueError:
                logger.debug("prompt shape not understood; estimating")
                return self._estimate(canonical)
            if not texts:  # only token ids: nothing to ask
                self._stats["exact"] += 1
                return TokenCount(literal, "exact", False)

        key = cache_key(base_url if model is None else f"{base_url}#{model}", kind, canonical)
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            self._stats["hits"] += 1
            self._stats["exact"] += 1
            return TokenCount(hit, "exact", True)
        self._stats["misses"] += 1

        task = self._inflight.get(key)
        if task is None:
            task = asyncio.create_task(
                self._lookup(key, base_url, kind, fields, canonical, dict(headers or {}), model),
                name="tokengate-count",
            )
            self._inflight[key] = task
            task.add_done_callback(functools.partial(self._lookup_done, key))
        else:
            self._stats["coalesced"] += 1
        try:
            # Shielded: a caller that gives up must not cancel the look-up others wait on.
            tokens = await asyncio.shield(task)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if task.cancelled() and current is not None and not current.cancelling():
                tokens = None  # only the look-up was cancelled (aclose): answer anyway
            else:
                raise
        if tokens is None:
            return self._estimate(canonical)
        self._stats["exact"] += 1
        self._learn(base_url, model, canonical, tokens)
        return TokenCount(tokens, "exact", False)

    def bound(self, base_url: str, kind: TokenKind, body: Mapping[str, Any], *, model: str | None = None) -> int:
        """An upper bound of `count`'s answer, without asking the backend: the estimate (JSON
        bytes / 3) x the most tokens per estimated token its exact counts gave lately (1 until a
        count needed more: text whose tokens are shorter than 3 bytes, as some non-Latin scripts
        make; at most 3, a token per byte) + BOUND_MARGIN. What a request forwarded beside its
        count holds until the count comes back; a count above it takes the request back."""
        est = estimate_tokens(canonical_json(prompt_fields(kind, body)))
        return math.ceil(est * self._ratio.get(_ratio_key(base_url, model), 1.0)) + BOUND_MARGIN

    def likely(self, base_url: str, kind: TokenKind, body: Mapping[str, Any], *, model: str | None = None) -> TokenCount:
        """A count without asking the backend, for the journal of a request refused before its
        count: the estimate (JSON bytes / 3) x the tokens per estimated token the backend's exact
        counts gave on average lately (1 before any: the plain estimate, which runs 1.5-3x over
        English text; a replay reads these prompts as the requests' sizes)."""
        est = estimate_tokens(canonical_json(prompt_fields(kind, body)))
        return TokenCount(max(1, round(est * self._typical.get(_ratio_key(base_url, model), 1.0))), "estimate", False)

    def _learn(self, base_url: str, model: str | None, canonical: bytes, tokens: int) -> None:
        """An exact count: the bound's ratio grows to cover it, or eases back toward 1; the
        typical ratio (`likely`) moves a tenth of the way to it."""
        key = _ratio_key(base_url, model)
        seen = tokens / estimate_tokens(canonical)
        typical = self._typical.get(key)
        self._typical[key] = seen if typical is None else typical + (seen - typical) * _TYPICAL_WEIGHT
        old = self._ratio.get(key, 1.0)
        need = (tokens - BOUND_MARGIN) / estimate_tokens(canonical)
        ratio = min(_RATIO_MAX, max(need, old - (old - 1.0) * _RATIO_EASE))
        if ratio > 1.0:
            self._ratio[key] = ratio
        else:
            self._ratio.pop(key, None)

    async def count_text(
        self,
        base_url: str,
        text: str,
        *,
        add_special: bool,
        parse_special: bool,
        headers: Mapping[str, str] | None = None,
        model: str | None = None,
    ) -> int | None:
        """The tokens of one text as the server tokenizes it with these flags (cached), or None
        when the backend gives no count (the caller estimates). For the task counts of
        :mod:`gate.backend.taskcount`: infill, embeddings, rerank and prompt lists."""
        base_url = base_url.rstrip("/")
        flags = f"text:{int(add_special)}{int(parse_special)}"
        key = cache_key(base_url if model is None else f"{base_url}#{model}", flags, text.encode("utf-8", "surrogatepass"))
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            self._stats["hits"] += 1
            return hit
        self._stats["misses"] += 1
        try:
            async with asyncio.timeout(self._timeout_s):
                tokens = await self._tokenize(base_url, text, add_special, dict(headers or {}), model, parse_special=parse_special)
        except _CountFailed as exc:
            return self._failed(base_url, exc.reason, backend_fault=exc.backend_fault)
        except TimeoutError:
            return self._failed(base_url, f"no answer within {self._timeout_s:g}s", backend_fault=True)
        except httpx.HTTPError as exc:
            return self._failed(base_url, f"{type(exc).__name__}: {exc}", backend_fault=True)
        self._set_health(base_url, True, "")
        self._remember(key, tokens)
        return tokens

    async def chat_template_tokens(self, base_url: str, headers: Mapping[str, str] | None = None) -> int | None:
        """What the backend's chat template adds to a chat's prompt count: a one-user-message chat
        counted as `count` counts chat requests, less its content's own tokens (tokenized as text
        inside a prompt is: no BOS, no special tokens). None when the backend gives no count.

        The prompt counts the journal keeps for chat requests include it, and `tokengate log
        --format aiperf` takes it off again: aiperf synthesizes input_length tokens of text and
        the server templates them once more (the test model's ChatML template is 40 tokens on a
        prompt of 1, "hello": a trial's re-run sent every prompt ~40 tokens larger, +43%).
        Not cached, and not a count the bound's or the estimate's ratios learn from (a 1-token
        message is all template: 41 tokens for a 16-byte estimate would lift every later
        estimate 2.6x); a failure logs at debug and marks no backend unhealthy. The content is
        tokenized first: a backend without /tokenize is never asked the chat count."""
        base_url = base_url.rstrip("/")
        plain = dict(headers or {})
        try:
            async with asyncio.timeout(self._timeout_s):
                content = await self._tokenize(base_url, _TEMPLATE_PROBE_TEXT, False, plain, parse_special=False)
                chat = await self._count_chat(base_url, canonical_json(_TEMPLATE_PROBE), plain)
        except (_CountFailed, TimeoutError, httpx.HTTPError) as exc:
            logger.debug("chat template size on %s not measured: %s", base_url, exc)
            return None
        return max(0, chat - content)

    async def aclose(self) -> None:
        """Cancel look-ups still in flight (their callers get estimates); the client stays open."""
        tasks = list(self._inflight.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # --- internals ----------------------------------------------------------

    def _estimate(self, canonical: bytes) -> TokenCount:
        self._stats["estimate"] += 1
        return TokenCount(estimate_tokens(canonical), "estimate", False)

    def _lookup_done(self, key: bytes, task: asyncio.Task[int | None]) -> None:
        if self._inflight.get(key) is task:
            del self._inflight[key]

    def _remember(self, key: bytes, tokens: int) -> None:
        if self._cache_size == 0:
            return
        self._cache[key] = tokens
        self._cache.move_to_end(key)
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)

    async def _lookup(
        self,
        key: bytes,
        base_url: str,
        kind: TokenKind,
        fields: dict[str, Any],
        canonical: bytes,
        headers: dict[str, str],
        model: str | None = None,
    ) -> int | None:
        """One backend look-up; caches and returns the count, or None after a failure."""
        if model is not None:
            canonical = canonical_json({**fields, "model": model})
        try:
            async with asyncio.timeout(self._timeout_s):
                if kind == "chat":
                    tokens = await self._count_chat(base_url, canonical, headers, model)
                elif kind in COUNT_ROUTES:
                    path = COUNT_ROUTES[kind]
                    tokens = _count_field(_answer(await self._post(base_url, path, canonical, headers, model), path), "input_tokens")
                else:
                    tokens = await self._count_prompt(base_url, fields["prompt"], headers, model)
        except _CountFailed as exc:
            return self._failed(base_url, exc.reason, backend_fault=exc.backend_fault)
        except TimeoutError:
            return self._failed(base_url, f"no answer within {self._timeout_s:g}s", backend_fault=True)
        except httpx.HTTPError as exc:
            return self._failed(base_url, f"{type(exc).__name__}: {exc}", backend_fault=True)
        except Exception:  # a bug here must not fail admission: estimate instead
            logger.exception("token count on %s failed unexpectedly", base_url)
            return self._failed(base_url, "unexpected error", backend_fault=False)
        self._set_health(base_url, True, "")
        self._remember(key, tokens)
        return tokens

    def _failed(self, base_url: str, reason: str, *, backend_fault: bool) -> int | None:
        """Count the failure (a backend fault marks it unhealthy); None: the caller estimates."""
        self._stats["errors"] += 1
        if backend_fault:
            self._set_health(base_url, False, reason)
        else:
            # The backend refused this body (4xx): it says nothing about the backend's health.
            logger.debug("token count on %s refused (%s); estimating", base_url, reason)
        return None

    def _set_health(self, base_url: str, healthy: bool, reason: str) -> None:
        before = self._healthy.get(base_url)
        self._healthy[base_url] = healthy
        if before is healthy:
            return
        if not healthy:
            logger.warning("token counting on %s failing (%s); using estimates", base_url, reason)
        elif before is False:
            logger.warning("token counting on %s recovered; exact counts again", base_url)

    def _set_input_tokens(self, base_url: str, available: bool, status: int) -> None:
        before = self._input_tokens.get(base_url)
        self._input_tokens[base_url] = available
        if available:
            self._reprobe_at.pop(base_url, None)
        else:
            self._reprobe_at[base_url] = self._clock() + self._reprobe_s
        if before is available:
            return
        if not available:
            logger.warning(
                "%s has no %s (HTTP %d); counting chat prompts with %s + %s",
                base_url,
                INPUT_TOKENS_PATH,
                status,
                APPLY_TEMPLATE_PATH,
                TOKENIZE_PATH,
            )
        elif before is False:
            logger.warning("%s now answers %s; using it again", base_url, INPUT_TOKENS_PATH)

    def _try_input_tokens(self, base_url: str) -> bool:
        if self._input_tokens.get(base_url, True):
            return True
        return self._clock() >= self._reprobe_at.get(base_url, 0.0)

    async def _post(self, base_url: str, path: str, content: bytes, headers: dict[str, str], model: str | None = None) -> httpx.Response:
        return await self._client.post(
            base_url + path + ("" if model is None else "?autoload=false"),
            content=content,
            headers={**headers, "Content-Type": "application/json"},
            timeout=self._timeout_s,
        )

    async def _count_chat(self, base_url: str, canonical: bytes, headers: dict[str, str], model: str | None = None) -> int:
        if self._try_input_tokens(base_url):
            resp = await self._post(base_url, INPUT_TOKENS_PATH, canonical, headers, model)
            if resp.status_code in _NO_ROUTE:
                self._set_input_tokens(base_url, False, resp.status_code)
            else:
                tokens = _count_field(_answer(resp, INPUT_TOKENS_PATH), "input_tokens")
                self._set_input_tokens(base_url, True, resp.status_code)
                return tokens
        resp = await self._post(base_url, APPLY_TEMPLATE_PATH, canonical, headers, model)
        prompt = _answer(resp, APPLY_TEMPLATE_PATH).get("prompt")
        if not isinstance(prompt, str):
            raise _CountFailed(f"{APPLY_TEMPLATE_PATH} answer has no prompt string", backend_fault=True)
        return await self._tokenize(base_url, prompt, True, headers, model)

    async def _count_prompt(self, base_url: str, prompt: Any, headers: dict[str, str], model: str | None = None) -> int:
        texts, literal = _prompt_plan(prompt)
        total = literal
        for text, add_special in texts:
            total += await self._tokenize(base_url, text, add_special, headers, model)
        return total

    async def _tokenize(
        self, base_url: str, text: str, add_special: bool, headers: dict[str, str], model: str | None = None, *, parse_special: bool = True
    ) -> int:
        # parse_special: the server parses special tokens in prompts it runs, so count them as it does
        # (infill and rerank tokenize their texts without: those pieces say so).
        fields: dict[str, Any] = {"content": text, "add_special": add_special, "parse_special": parse_special}
        if model is not None:
            fields["model"] = model
        payload = canonical_json(fields)
        resp = await self._post(base_url, TOKENIZE_PATH, payload, headers, model)
        tokens = _answer(resp, TOKENIZE_PATH).get("tokens")
        if not isinstance(tokens, list):
            raise _CountFailed(f"{TOKENIZE_PATH} answer has no token list", backend_fault=True)
        return len(tokens)


def _answer(resp: httpx.Response, path: str) -> dict[str, Any]:
    """The JSON object of a 200 answer, else a failure saying whose fault it was."""
    if resp.status_code != 200:
        raise _CountFailed(f"{path} answered HTTP {resp.status_code}", backend_fault=_backend_fault(resp))
    try:
        data = resp.json()
    except ValueError:
        raise _CountFailed(f"{path} answered malformed JSON", backend_fault=True) from None
    if not isinstance(data, dict):
        raise _CountFailed(f"{path} answered {type(data).__name__}, not an object", backend_fault=True)
    return data


def _backend_fault(resp: httpx.Response) -> bool:
    """Whether a refused count says something about the backend's health: not a 4xx, and not
    the 500 that llama-server answers, with its error object, for an exception thrown while it
    read this body (server-http.cpp: an image without an mmproj, a message it cannot parse;
    the same request straight gets the same 500). One client's body must not mark the backend's
    counting as failing for everyone; a 502-504, or a 500 without the object, still does."""
    if resp.status_code < 500:
        return False
    if resp.status_code != 500:
        return True
    try:
        error = resp.json().get("error")
    except (ValueError, AttributeError):
        return True
    return not (isinstance(error, dict) and isinstance(error.get("message"), str))


def _count_field(data: dict[str, Any], name: str) -> int:
    value = data.get(name)
    if not _is_token(value) or value < 0:
        raise _CountFailed(f"answer has no valid {name!r}", backend_fault=True)
    return value


def _ratio_key(base_url: str, model: str | None) -> str:
    base_url = base_url.rstrip("/")
    return base_url if model is None else f"{base_url}#{model}"
