"""llama-server's whole HTTP surface, and what the gate does with each route.

Plain data, read by the HTTP side (which routes, authenticates, counts and validates) and by the
backend side (which shapes the upstream body and its stream by kind). One table, checked by
``tests/unit/test_endpoints.py`` against the routes of llama-server's ``tools/server/server.cpp``
at the version the project builds (``tests/data/llama_server_routes.txt``), so a llama.cpp
upgrade that adds a route fails a test instead of silently falling to the unknown-route policy.

What the gate does with a route (``Access``):

* ``admitted``: generation, through admission (count, reserve, queue, relay, release, record).
  The ``Kind`` names the API the body speaks, and so its cost model and stream format: OpenAI
  chat and completions, llama's native ``/completion``, the Anthropic Messages API
  (``messages``: ``max_tokens``) and the OpenAI Responses API (``responses``:
  ``max_output_tokens``); see gate/http/apis/.
* ``forwarded``: relayed as is with the caller's tenant authentication; counted
  (``tokengate_forwarded_total{route}``) and journaled (a decision row, outcome ``forwarded``).
  Generation routes the gate cannot admit yet (``generation=True``: audio
  transcriptions) are forwarded this way until their cost models exist (issue #21):
  they bypass admission, and the counter shows how much.

Admitted kinds and their cost (``gate.http.apis.tasks`` has the details, from the server source):
``infill`` (FIM prefix, suffix, prompt and extra context, with the tokens the server adds, plus
the generation limit, ``n_predict`` injected as for ``/completion``); ``embeddings`` (one task
per input: its tokens, no decode); ``rerank`` (one task per document: query + document + 4
special tokens, no decode). A request llama-server runs as several tasks (a list of prompts,
``n``/``n_cmpl`` > 1, several inputs or documents) holds one slot per task, all at once.
``predict`` (Vertex AI's envelope, served only with ``AIP_MODE=PREDICTION``: every instance
on an admitted route costed as that route, all held at once; ``gate/http/apis/predict.py``).
Not admitted: transcriptions (the build serves them only with an audio-capable multimodal
projector; the audio's tokens cannot be counted before the projector has run).
* ``operator``: changes the server (its props, LoRA scales, a slot's cache, the router's models):
  forwarded in open mode and for ``operator = true`` tenants, audited; 403 naming the route for
  everyone else.
* ``gate``: the gate answers itself (``GET /health``, ``GET /metrics``).

A path not in the table follows ``[gate] unknown_routes``. Route names (``"POST /props"``) are
the only metric labels a forwarded request gets, so the label set is bounded by this table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["chat", "completions", "completion", "messages", "responses", "infill", "embeddings", "rerank", "predict"]
Access = Literal["admitted", "forwarded", "operator", "gate"]

#: the metric label of a request on a path the table does not list
OTHER_ROUTE = "other"


@dataclass(frozen=True, slots=True)
class Route:
    method: str
    path: str  # llama-server's pattern; ":name" is one path segment
    access: Access
    kind: Kind | None = None  # admitted routes: the API the body speaks
    generation: bool = False  # runs a model: admitted once its cost model exists

    @property
    def name(self) -> str:
        """The route's metric label and journal endpoint, e.g. ``"POST /slots/:id_slot"``."""
        return f"{self.method} {self.path}"


def _r(method: str, path: str, access: Access, kind: Kind | None = None, *, generation: bool = False) -> Route:
    return Route(method, path, access, kind, generation or kind is not None)


ROUTES: tuple[Route, ...] = (
    # generation, admitted: OpenAI chat and completions under both spellings, and llama's own.
    # /completions is llama-server's alias of /completion (its native API), not of /v1/completions.
    _r("POST", "/v1/chat/completions", "admitted", "chat"),
    _r("POST", "/chat/completions", "admitted", "chat"),
    _r("POST", "/v1/completions", "admitted", "completions"),
    _r("POST", "/completions", "admitted", "completion"),
    _r("POST", "/completion", "admitted", "completion"),
    # the OpenAI Responses API and the Anthropic Messages API (gate/http/apis/)
    _r("POST", "/v1/responses", "admitted", "responses"),
    _r("POST", "/responses", "admitted", "responses"),
    _r("POST", "/v1/messages", "admitted", "messages"),
    # infill, embeddings and rerank: their own cost models (gate/http/apis/tasks.py)
    _r("POST", "/infill", "admitted", "infill"),
    _r("POST", "/embedding", "admitted", "embeddings"),  # llama-server's legacy spelling
    _r("POST", "/embeddings", "admitted", "embeddings"),
    _r("POST", "/v1/embeddings", "admitted", "embeddings"),
    _r("POST", "/rerank", "admitted", "rerank"),
    _r("POST", "/reranking", "admitted", "rerank"),
    _r("POST", "/v1/rerank", "admitted", "rerank"),
    _r("POST", "/v1/reranking", "admitted", "rerank"),
    # Vertex AI's envelope (llama-server with AIP_MODE=PREDICTION only): every instance admitted
    _r("POST", "/predict", "admitted", "predict"),
    # generation without a cost model yet: forwarded (and counted); see the docstring
    _r("POST", "/v1/audio/transcriptions", "forwarded", generation=True),
    _r("POST", "/audio/transcriptions", "forwarded", generation=True),
    # read-only or per-request, forwarded
    _r("GET", "/v1/health", "forwarded"),
    _r("GET", "/props", "forwarded"),
    _r("GET", "/models", "forwarded"),  # answered by the gate's merged model list, as /v1/models
    _r("GET", "/v1/models", "forwarded"),
    _r("GET", "/models/sse", "forwarded"),
    _r("POST", "/v1/chat/completions/control", "forwarded"),  # a running completion's reasoning_end
    _r("POST", "/tokenize", "forwarded"),
    _r("POST", "/detokenize", "forwarded"),
    _r("POST", "/apply-template", "forwarded"),
    _r("POST", "/chat/completions/input_tokens", "forwarded"),
    _r("POST", "/v1/chat/completions/input_tokens", "forwarded"),
    _r("POST", "/responses/input_tokens", "forwarded"),
    _r("POST", "/v1/responses/input_tokens", "forwarded"),
    _r("POST", "/v1/messages/count_tokens", "forwarded"),
    _r("GET", "/lora-adapters", "forwarded"),
    _r("GET", "/slots", "forwarded"),
    _r("GET", "/v1/stream", "forwarded"),  # resumable streams
    _r("DELETE", "/v1/stream", "forwarded"),
    _r("POST", "/v1/streams/lookup", "forwarded"),
    _r("GET", "/cors-proxy", "forwarded"),
    _r("POST", "/cors-proxy", "forwarded"),
    _r("GET", "/tools", "forwarded"),
    _r("POST", "/tools", "forwarded"),
    # the web UI; its bundled assets (computed names) are the GET /* entry below
    _r("GET", "/", "forwarded"),
    _r("GET", "/index.html", "forwarded"),
    _r("GET", "/sw.js", "forwarded"),
    # change the server: operators only, audited
    _r("POST", "/props", "operator"),
    _r("POST", "/lora-adapters", "operator"),
    _r("POST", "/slots/:id_slot", "operator"),  # ?action=save|restore|erase
    _r("POST", "/models", "operator"),  # router: download a model
    _r("DELETE", "/models", "operator"),  # router: remove a model
    _r("POST", "/models/load", "operator"),
    _r("POST", "/models/unload", "operator"),
    # the gate's own
    _r("GET", "/health", "gate"),
    _r("GET", "/metrics", "gate"),
)

#: the web UI's assets: any other GET of one path segment with a dot (``/bundle.js``)
UI_ASSET = Route("GET", "/*", "forwarded")

#: a CORS preflight (OPTIONS, any path): forwarded without a credential, as browsers send none
PREFLIGHT = Route("OPTIONS", "*", "forwarded")

#: admitted path -> the API its body speaks
ENDPOINTS: dict[str, Kind] = {r.path: r.kind for r in ROUTES if r.access == "admitted" and r.kind is not None}

_EXACT: dict[tuple[str, str], Route] = {(r.method, r.path): r for r in ROUTES if ":" not in r.path}
_PATTERNS: tuple[tuple[Route, tuple[str, ...]], ...] = tuple((r, tuple(r.path.split("/"))) for r in ROUTES if ":" in r.path)
_PATHS: frozenset[str] = frozenset(r.path for r in ROUTES)


def lookup(method: str, path: str) -> Route | None:
    """The table's route for a request, or None (the unknown-route policy decides)."""
    route = _EXACT.get((method, path))
    if route is not None:
        return route
    parts = path.split("/")
    for candidate, pattern in _PATTERNS:
        if (
            candidate.method == method
            and len(parts) == len(pattern)
            and all(p.startswith(":") and part != "" or p == part for p, part in zip(pattern, parts))
        ):
            return candidate
    if method == "GET" and path.count("/") == 1 and "." in path and path not in _PATHS:
        return UI_ASSET
    return None


def known_path(path: str) -> bool:
    """True when the table lists the path under some method (OPTIONS and HEAD are forwarded there)."""
    return path in _PATHS or lookup("POST", path) is not None
