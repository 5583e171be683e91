"""Relay to llama-server: always streamed upstream, so cancellation is reliable.

llama-server notices a closed stream at once but can miss a closed non-streaming
request for 10+ s (notes/llama-server.md). So the gate always asks upstream for
a stream: streaming clients get it relayed line by line (pings included), and
for non-streaming clients the answer is assembled (gate/http/assembly.py) into the
shape llama-server would have sent; only the few options whose stream lacks part
of that answer get a plain upstream call. Closing the upstream response frees the slot.
"""

from __future__ import annotations

import codecs
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from gate.backend.netio import BODY_EXTENSION, transport_for
from gate.core.errors import GateError
from gate.core.reasons import Reason
from gate.data.endpoints import Kind

log = logging.getLogger("tokengate.upstream")

#: request URLs an Upstream keeps parsed (one per endpoint path it has been sent)
_URLS_KEPT = 64

# Seconds a client is told to wait when the backend could not be reached or broke off:
# about what the probe loop needs to notice a dead backend (probe_interval_s = 1).
RETRY_DOWN_S = 5.0

# llama-server's own answers the gate adds that Retry-After to: the ones that may pass (a gateway
# in between failing, a backend still loading). Not its 500, which answers the request's content
# ("image input is not supported", a template error: waiting cures nothing, and straight
# llama-server sends no Retry-After), nor its 501 (not_supported_error: a route it was not started for).
PASSING = frozenset({502, 503, 504})

# Headers that describe one hop, not the message (RFC 9110 7.6.1), plus the ones
# the gate sets itself. X-Conversation-Id makes llama-server keep generating
# after a disconnect (resumable streams): never forward it.
_DROP_HEADERS = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "authorization",
        "x-api-key",
        "x-conversation-id",
        "accept-encoding",
        "x-tokengate-class",
    }
)


# Response headers never relayed back to the client: hop-by-hop (RFC 9110 7.6.1), and the
# Date the gate writes itself (`Dated`). llama-server's `Server: llama.cpp` is relayed: the gate's
# stack writes none (uvicorn's is off), and a client that reads it sees what it would straight.
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"date",
        b"via",  # a proxy between the gate and llama-server (which never sends one): its host and port
    }
)
# On an admitted answer the gate writes the body (a relayed stream, or an assembled answer):
# llama-server's framing headers describe another body.
# llama-server's error answer is relayed whole: only its framing is the gate's to write.
FRAMING = frozenset({b"content-length", b"content-encoding"})
REBUILT = FRAMING | {b"content-type", b"cache-control"}


def is_redirect(status: int) -> bool:
    return 300 <= status < 400


def redirect_error(response: httpx.Response, where: str) -> GateError:
    """A 3xx or a 401 from the backend, as the client's 502 ``upstream_error``; the detail goes to
    the log only.

    3xx: llama-server never sends one (something in between did: a proxy, a wrong scheme), and
    its Location and body name the backend's side. 401: the gate sends its own key (api_key_env)
    in place of the client's, so a 401 says the backend refused the GATE's key; relayed, it told
    a client whose key is valid that its key was invalid."""
    if response.status_code == 401:
        log.warning("backend %s refused the gate's credentials (401): check [[backends]] api_key_env against its --api-key", where)
        return GateError(Reason.UPSTREAM_ERROR, "the backend refused the gate's own credentials; see the gate's log")
    log.warning("backend %s answered %s with Location %r: not relayed", where, response.status_code, response.headers.get("location"))
    return GateError(Reason.UPSTREAM_ERROR, f"the backend answered a redirect ({response.status_code}); see the gate's log")


def relayed_headers(upstream: httpx.Headers, *, drop: frozenset[bytes] = frozenset()) -> list[tuple[bytes, bytes]]:
    """llama-server's response headers for the client (CORS, its own), repeats kept, names spelled
    as it sent them (the gate's transport writes them so: gate/http/clientguard.py); without the
    hop-by-hop ones, nor those in `drop` (lower case): REBUILT when the gate writes the body,
    FRAMING when it relays llama-server's body whole but writes its length."""
    dropped = HOP_BY_HOP | drop
    return [(k, v) for k, v in upstream.raw if k.lower() not in dropped]


@dataclass(slots=True)
class RelayStats:
    """What one relay measured; times are from the injected clock."""

    dispatched_at: float
    first_token_at: float | None = None
    completion_tokens: int | None = None
    finished: bool = False
    tokens: int = 0  # data events received: the request's progress
    last_token_at: float | None = None

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_at is None else self.first_token_at - self.dispatched_at

    @property
    def generated(self) -> int | None:
        """The completion tokens llama-server reported, else the tokens relayed (a stream cut short
        never gets its usage: a broken stream of ~1,200 tokens was journaled with none, a user's
        trial 2026-12-05); None when nothing was."""
        return self.completion_tokens if self.completion_tokens is not None else (self.tokens or None)

    @property
    def tpot_s(self) -> float | None:
        """Seconds per output token after the first (None with fewer than two tokens)."""
        n = self.completion_tokens if self.completion_tokens is not None else self.tokens
        if self.first_token_at is None or self.last_token_at is None or n is None or n < 2:
            return None
        return max(0.0, self.last_token_at - self.first_token_at) / (n - 1)

    def read_final(self, chunk: Mapping[str, Any]) -> None:
        """Take the completion token count from a (final) chunk, in any of the three endpoint shapes."""
        usage = chunk.get("usage")
        if isinstance(usage, Mapping):
            self.completion_tokens = _int(usage.get("completion_tokens"), self.completion_tokens)
            # the Anthropic Messages API and the Responses API name it output_tokens
            self.completion_tokens = _int(usage.get("output_tokens"), self.completion_tokens)
        timings = chunk.get("timings")
        if isinstance(timings, Mapping):
            self.completion_tokens = _int(timings.get("predicted_n"), self.completion_tokens)
        if "tokens_predicted" in chunk:
            self.completion_tokens = _int(chunk.get("tokens_predicted"), self.completion_tokens)


def _int(value: Any, default: int | None) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def json_object(raw: str | bytes) -> dict[str, Any] | None:
    """`raw` parsed when it is a JSON object, else None (not JSON, or another JSON value)."""
    try:
        parsed = json.loads(raw)
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None


def _with_timings(event: str, timings: str) -> str:
    """A held finish chunk's SSE event with `"timings":{...}` as its last key, where a stream
    without include_usage has it (the chunk's JSON object ends the event's one data line)."""
    end = event.rstrip("\n")
    if not end.endswith("}"):
        return event
    return end[:-1] + "," + timings + "}" + event[len(end) :]


def _announces_role(payload: str) -> bool:
    """A chat stream's opening chunk that only names the role (llama-server writes
    `"delta":{"role":"assistant","content":null}` before the first token's text, in its own
    chunk, a decode step or more ahead of it: 3.3 ms on the tiny model). It is not the first
    token: a client's TTFT (aiperf's, the OpenAI SDK's) is the first chunk with content, and
    batching the reads from the role on held that first content back by up to a batch
    (`stream_batch_ms`: +7 ms at p50 on an idle server, 2026-12-05)."""
    if '"role"' not in payload:
        return False
    chunk = json_object(payload)
    choices = chunk.get("choices") if chunk is not None else None
    if not isinstance(choices, list) or not choices:
        return False
    for choice in choices:
        delta = choice.get("delta") if isinstance(choice, dict) else None
        if not isinstance(delta, dict) or any(value not in (None, "", []) for key, value in delta.items() if key != "role"):
            return False
    return True


def on_the_wire(value: str) -> str | bytes:
    """A header value as the client sent it: the server decodes its bytes as latin-1, and httpx
    encodes a str as ASCII, so bytes beyond ASCII (a UTF-8 app name in X-Title, which llama-server
    takes) go as the bytes they were (a client trial's were refused with a 400)."""
    return value if value.isascii() else value.encode("latin-1")


def raw_headers(headers: Mapping[str, str | bytes]) -> list[tuple[bytes, bytes]]:
    """`headers` as httpx takes bytes beyond ASCII (its typed str form is ASCII only)."""
    return [(k.encode("latin-1"), v if isinstance(v, bytes) else v.encode("latin-1")) for k, v in headers.items()]


def forward_headers(incoming: Mapping[str, str], upstream_auth: str | None) -> dict[str, str | bytes]:
    """The client's end-to-end headers, with the gate's own upstream credentials."""
    out: dict[str, str | bytes] = {k: on_the_wire(v) for k, v in incoming.items() if k.lower() not in _DROP_HEADERS}
    if upstream_auth:
        out["Authorization"] = f"Bearer {upstream_auth}"
    return out


def upstream_body(kind: Kind, body: Mapping[str, Any]) -> dict[str, Any]:
    """The client's body, switched to streaming with usage, whatever the client asked (the
    Messages and Responses streams carry their usage in their last events unasked)."""
    out = dict(body)
    out["stream"] = True
    # id_slot goes as sent (issue 21: a client pinning its slot, say to reuse a saved cache, gets
    # it). The gate admits by free slots, not by which one: a pinned slot that is busy while
    # others are free makes llama-server defer the request in its own queue (README "Clients").
    if kind in ("chat", "completions"):
        given = out.get("stream_options")  # llama-server ignores one that is not an object
        options = dict(given) if isinstance(given, dict) else {}
        options["include_usage"] = True
        out["stream_options"] = options
    return out


@dataclass(slots=True)
class Upstream:
    """One backend's base URL and the shared httpx client."""

    client: httpx.AsyncClient
    base_url: str
    clock: Callable[[], float] = time.monotonic
    _transport: httpx.AsyncBaseTransport | None = field(default=None, init=False, repr=False)
    _urls: dict[str, httpx.URL] = field(default_factory=dict, init=False, repr=False)

    async def open(self, path: str, body: Mapping[str, Any], headers: Mapping[str, str | bytes]) -> httpx.Response:
        """Send the request and wait for the status line; the caller must `aclose()` it.

        Straight to the client's transport, with the client's timeouts: what `client.send` adds
        around it (a cookie jar shared by every request, auth and redirect hooks, the default
        headers, a URL merged and parsed per request) is nothing an admitted request wants, and
        was 12% of the gate's CPU per request at 200 req/s (py-spy, fake upstream)."""
        url = self._urls.get(path)
        if url is None:
            url = httpx.URL(self.base_url + path)
            if len(self._urls) < _URLS_KEPT:  # the endpoints' paths: a few, but never unbounded
                self._urls[path] = url
        if self._transport is None:
            self._transport = transport_for(self.client, url)
        request = httpx.Request(
            "POST",
            url,
            content=json.dumps(body).encode(),
            # llama-server closes the connection after every streamed answer without saying so; pooled, it fails the next request (502).
            headers=raw_headers({**headers, "Content-Type": "application/json", "Connection": "close"}),
            extensions={"timeout": self.client.timeout.as_dict()},
        )
        try:
            response = await self._transport.handle_async_request(request)
            response.request = request
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            # Never reached the backend: nothing ran, so the request may simply be retried.
            # The address is for the log only, never the client's answer.
            log.warning("backend %s unreachable: %s: %s", self.base_url, type(exc).__name__, exc)
            raise GateError(Reason.NO_BACKEND, "the backend is unreachable", retry_after_s=RETRY_DOWN_S) from exc
        except httpx.TimeoutException as exc:
            raise GateError(Reason.UPSTREAM_TIMEOUT, f"backend did not answer: {type(exc).__name__}") from exc
        except httpx.HTTPError as exc:
            log.warning("backend %s failed: %s: %s", self.base_url, type(exc).__name__, exc)
            raise GateError(Reason.UPSTREAM_ERROR, f"backend failed: {type(exc).__name__}", retry_after_s=RETRY_DOWN_S) from exc
        if is_redirect(response.status_code) or response.status_code == 401:
            await response.aclose()
            raise redirect_error(response, self.base_url)
        if response.status_code != 200:
            try:
                raw = await response.aread()
            except httpx.HTTPError:
                raw = b""
            finally:
                await response.aclose()
            err = GateError(
                Reason.UPSTREAM_ERROR,
                f"backend answered {response.status_code}",
                retry_after_s=RETRY_DOWN_S if response.status_code in PASSING else None,
                status=response.status_code,
                body=raw[:65536] or None,
            )
            # its own head, its content type as spelled (application/json; charset=utf-8), not the framing
            err.headers = relayed_headers(response.headers, drop=FRAMING)
            raise err
        return response


class EventFormat(Protocol):
    """A stream of typed events (``event:`` lines): the Anthropic Messages API, the Responses
    API (gate/http/apis/). One instance per request; it may remember what it saw."""

    def is_token(self, event: str) -> bool:
        """The event carries generated content (one token's text, reasoning or tool input)."""
        ...

    def inspect(self, event: str, payload: str, stats: RelayStats) -> dict[str, Any] | None:
        """Read one data line of `event`: mark the stream finished, take its usage; the error
        object when it reports an error."""
        ...

    def error_event(self, err: GateError) -> bytes:
        """The gate's own mid-stream error (a shed, a stall, a shutdown) as this API's event."""
        ...


@dataclass(slots=True)
class SseRelay:
    """Reads an upstream SSE stream, recording first token and usage, one network read at a time."""

    response: httpx.Response
    stats: RelayStats
    clock: Callable[[], float]
    on_first_token: Callable[[], None]
    keep_usage_chunk: bool = True
    chunks: list[dict[str, Any]] = field(default_factory=list)
    collect: bool = False  # keep parsed chunks (for assembling a non-streaming answer)
    error: dict[str, Any] | None = None
    events: EventFormat | None = None  # a typed event stream (Messages, Responses): its reader
    _event: str = ""  # the current event's name (its ``event:`` line)
    #: /completion's stop chunks that end the stream: one per task (a prompt list, n_cmpl > 1)
    stops_left: int = 1
    #: the tasks llama-server runs for the request; with several, each ends with its own count
    #: (a usage chunk, or /completion's stop chunk) and the request's is their sum
    tasks: int = 1
    _counted: int = 0  # completion tokens of the tasks ended so far (tasks > 1)
    #: after the first token, read llama-server at most this often and relay what came as one
    #: write ([gate] stream_batch_ms; 0: each read as it comes)
    batch_s: float = 0.0
    #: a chat stream's finish chunk, held until the next event: llama-server moves the chunk's
    #: `timings` into the usage chunk the gate asked for (include_usage) and the client did not,
    #: so the gate puts them back where a straight stream has them (a trial: a stream through
    #: the gate had no `timings`, which tokens/s readouts such as llama.cpp's web UI read)
    _finish: str | None = None
    _finish_is_token: bool = False
    _timings: str | None = None  # the dropped usage chunk's `"timings":{...}`, as llama-server wrote it

    async def reads(self) -> AsyncIterator[tuple[str, str]]:
        """Per upstream read, the complete events to relay: (now, held back).

        Events from the terminal one on ([DONE], or /completion's stop chunk) are
        "held back": the caller sends them only once the decision row is committed.
        Everything that arrived in one read goes out in one write, so a fast
        upstream costs one ASGI send per read rather than one per token.

        After the first token (which goes out as soon as it is read), the socket is read
        at most every `batch_s` and the events already received are joined into one
        write: llama-server sends each token as a chunk of its own, and one wake-up, h11
        event, send and write per token was what a stream cost the gate (gate/backend/netio.py).
        A token waits at most `batch_s` longer than it would have.
        """
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        partial = ""
        event: list[str] = []
        now: list[str] = []
        held: list[str] = []
        body = self.response.extensions.get(BODY_EXTENSION) if self.batch_s > 0 else None
        batching = False  # the first token is out and `body` reads in batches

        def emit(text: str) -> None:
            (held if self.stats.finished else now).append(text)

        def take(lines: list[str]) -> None:
            nonlocal event
            for line in lines:
                if line.endswith("\r"):
                    line = line[:-1]
                if line != "":
                    if self._keep(line):
                        event.append(line)
                    continue
                self._event = ""
                finish = self._finish
                if finish is not None and (event or self._timings is not None):
                    # the event after a held finish chunk: the dropped usage chunk gives its timings back
                    self._finish = None
                    emit(finish if self._timings is None else _with_timings(finish, self._timings))
                    self._timings = None
                if event:  # an SSE event ends at a blank line
                    text = "\n".join(event) + "\n\n"
                    event = []
                    if self._finish_is_token:
                        self._finish, self._finish_is_token = text, False
                    else:
                        emit(text)

        try:
            async for raw in self.response.aiter_bytes():
                lines = (partial + decoder.decode(raw)).split("\n")
                partial = lines.pop()
                seen = self.stats.tokens
                take(lines)
                if self.stats.tokens != seen:
                    self.stats.last_token_at = self.clock()
                if batching and not held and body is not None and body.pending():
                    continue  # more of this batch is here already: one write for all of it
                if held and batching and body is not None:
                    batching = False
                    body.batch_reads(0.0)  # the terminal event is in: its end (and the slot's release) without a wait
                if now or held:
                    yield "".join(now), "".join(held)
                    now.clear()
                    held.clear()
                    if body is not None and not batching and not self.stats.finished and self.stats.first_token_at is not None:
                        batching = True
                        body.batch_reads(self.batch_s)
        except httpx.TimeoutException as exc:
            raise GateError(Reason.UPSTREAM_TIMEOUT, "backend stalled mid-answer") from exc
        except httpx.HTTPError as exc:
            log.warning("backend %s: stream broke: %s: %s", self._where(), type(exc).__name__, exc)
            raise GateError(Reason.UPSTREAM_ERROR, f"backend stream broke: {type(exc).__name__}", retry_after_s=RETRY_DOWN_S) from exc
        take([partial + decoder.decode(b"", final=True), ""])  # a last event without its blank line
        if self._finish is not None:  # the stream ended after it: as it came
            emit(self._finish)
            self._finish = None
        if now or held:
            yield "".join(now), "".join(held)

    async def whole(self) -> bytes:
        """A plain (non-streamed) answer, read whole, for the options whose stream lacks part of it (gate/http/assembly.py)."""
        try:
            raw = await self.response.aread()
        except httpx.TimeoutException as exc:
            raise GateError(Reason.UPSTREAM_TIMEOUT, "backend stalled mid-answer") from exc
        except httpx.HTTPError as exc:
            log.warning("backend %s: answer broke: %s: %s", self._where(), type(exc).__name__, exc)
            raise GateError(Reason.UPSTREAM_ERROR, f"backend answer broke: {type(exc).__name__}", retry_after_s=RETRY_DOWN_S) from exc
        try:
            answer = json.loads(raw)
        except ValueError:
            raise GateError(Reason.UPSTREAM_ERROR, "backend answer is not JSON") from None
        # /completion of several prompts (or n_cmpl > 1) answers an array: one object per task
        parts = answer if isinstance(answer, list) else [answer]
        if not parts or not all(isinstance(p, dict) for p in parts):
            raise GateError(Reason.UPSTREAM_ERROR, "backend answer is not a JSON object")
        generated = 0
        for part in parts:
            self.stats.completion_tokens = None
            self.stats.read_final(part)
            generated += self.stats.completion_tokens or 0
        if len(parts) > 1:
            self.stats.completion_tokens = generated
        # No token is seen arriving: llama-server's own decode time dates the first one,
        # so TTFT stays upstream queueing + prefill, as on the streamed path.
        now = self.clock()
        times = [p["timings"].get("predicted_ms") for p in parts if isinstance(p.get("timings"), Mapping)]
        predicted_ms = max((t for t in times if isinstance(t, (int, float))), default=None)
        if isinstance(predicted_ms, (int, float)) and predicted_ms >= 0:
            self.stats.first_token_at = max(self.stats.dispatched_at, now - predicted_ms / 1000.0)
        # else (the Messages and Responses answers carry no timings): TTFT stays unmeasured
        # rather than the whole answer's time, which would read as a slow first token.
        self.on_first_token()
        self.stats.last_token_at = now
        self.stats.finished = True
        return raw

    def _where(self) -> str:
        """The backend's host and port, for the log only: two llama-servers on one host, or a
        router's models, differ by port alone."""
        return self.response.url.netloc.decode("ascii", "replace")

    def _keep(self, line: str) -> bool:
        """Record what the line says; False drops it (a usage chunk the client did not ask for)."""
        if self.events is not None:
            return self._typed(self.events, line)
        if not line.startswith("data:"):
            return True  # comments (pings), event:, id:
        payload = line[5:].strip()
        if payload == "[DONE]":
            self.stats.finished = True
            return True
        if self.stats.first_token_at is None:
            if _announces_role(payload):
                return self._inspect(payload)  # not a token: the first token is yet to come
            self.stats.first_token_at = self.clock()
            self.on_first_token()
        self.stats.tokens += 1
        if not self.keep_usage_chunk and '"finish_reason":"' in payload and '"timings"' not in payload:
            # held until the next event (`reads`): its timings may follow. With several tasks
            # (n > 1) too: llama-server writes each task's finish chunk and its usage chunk one
            # after the other (a trial's n = 2 stream lost both tasks' timings)
            self._finish_is_token = True
        return self._inspect(payload)

    def _typed(self, events: EventFormat, line: str) -> bool:
        """A typed event stream: only content events are tokens (TTFT is the first of them);
        every line is relayed as sent."""
        if line.startswith("event:"):
            self._event = line[6:].strip()
            return True
        if not line.startswith("data:"):
            return True  # comments (pings), id:
        if events.is_token(self._event):
            self.stats.tokens += 1
            if self.stats.first_token_at is None:
                self.stats.first_token_at = self.clock()
                self.on_first_token()
        error = events.inspect(self._event, line[5:].strip(), self.stats)
        if error is not None:
            self.error = error
        return True

    def _inspect(self, payload: str) -> bool:
        """Parse what matters; False drops the line (a usage chunk the client did not ask for)."""
        # Most chunks are one token: parse only the ones that carry accounting or errors.
        interesting = self.collect or '"usage"' in payload or '"timings"' in payload or '"error"' in payload or '"stop":true' in payload
        if not interesting:
            return True
        try:
            chunk = json.loads(payload)
        except ValueError:
            return True
        if not isinstance(chunk, dict):
            return True
        if "error" in chunk and isinstance(chunk["error"], dict):
            self.error = chunk["error"]
        if self.tasks > 1 and (chunk.get("stop") is True or (chunk.get("choices") == [] and isinstance(chunk.get("usage"), dict))):
            # One task's end, with that task's own count (llama-server's chat usage for n = 2 is
            # each task's, not the request's): the request generated their sum.
            self.stats.completion_tokens = None
            self.stats.read_final(chunk)
            self._counted += self.stats.completion_tokens or 0
            self.stats.completion_tokens = self._counted
        else:
            self.stats.read_final(chunk)
        if chunk.get("stop") is True:
            self.stops_left -= 1
            if self.stops_left <= 0:
                self.stats.finished = True  # /completion ends without [DONE]: after every task's stop
        if self.collect:
            self.chunks.append(chunk)
        if not self.keep_usage_chunk and chunk.get("choices") == [] and "usage" in chunk:
            at = payload.rfind(',"timings":{')
            if at >= 0 and payload.endswith("}}") and "timings" in chunk:  # its last key, as llama-server writes it
                self._timings = payload[at + 1 : -1]
            return False
        return True
