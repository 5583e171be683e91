"""The OpenAI Responses API (``POST /v1/responses``, ``POST /responses``): intake, cost, stream.

What llama-server does with the body (llama.cpp as vendored by llama-cpp-python 0.3.36,
tools/server/server-chat.cpp ``server_chat_convert_responses_to_chatcmpl``): it turns
``instructions`` and ``input`` into chat messages, renames ``max_output_tokens`` to
``max_tokens`` (overwriting one the client sent), and keeps EVERY other field, so the body
then runs as a chat request: ``n_predict``, ``max_completion_tokens`` and ``max_tokens`` are
read as on every route (server-schema.cpp: ``n_predict``, else ``max_completion_tokens``, else
``max_tokens``), and ``n`` as well.

Cost: the prompt, counted by llama-server's own ``POST /v1/responses/input_tokens`` (the same
conversion and template), plus the generation limit. The gate's rule (gate/http/intake.py
``_given_max_tokens``) covers the API's own field too, in llama-server's order: ``n_predict``,
``max_completion_tokens``, ``max_output_tokens`` (as ``max_tokens``), ``max_tokens``; the gate
reserves the most of those given as numbers. When none is present, the class's
``default_max_tokens`` is injected as ``max_output_tokens``. A ``previous_response_id`` string is
refused at once (llama-server has no stored responses and would refuse it after the gate had
reserved a slot for it); one that is not a string llama-server ignores, and so does the gate.

Stream (server-task.cpp ``to_json_oaicompat_resp*``): typed events (``event:`` + ``data:``),
relayed as sent; the ``*.delta`` events are the tokens (the first one is the first token),
``response.completed`` ends the stream with ``response.usage.output_tokens`` (no ``[DONE]``).
The gate's own mid-stream error is the API's ``error`` event followed by ``response.failed``
(the response llama-server announced in ``response.created``, status ``failed``), the gate's
reason as the ``code``. Refusals before the stream are the OpenAI error shape, the gate's own.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from gate.backend.upstream import RelayStats
from gate.config import Config
from gate.core.errors import GateError
from gate.http.intake import Intake, _copies, _invalid, _lenient, _optional, _stream_options, limited_intake
from gate.http.jsonbody import describe
from gate.http.tenants import Caller

#: the generation limit's fields, the API's own first
#: llama-server's order: the chat body it builds keeps the other names and turns
#: max_output_tokens into max_tokens (server-chat.cpp), read after n_predict and
#: max_completion_tokens (server-schema.cpp)
LIMIT_FIELDS = ("n_predict", "max_completion_tokens", "max_output_tokens", "max_tokens")

_FINAL_EVENTS = frozenset({"response.completed", "response.incomplete"})


def build(path: str, body: Mapping[str, Any], caller: Caller, config: Config) -> Intake:
    """Validate a Responses body for `caller` (400 ``invalid_request`` naming the field)."""
    cls = config.class_by_name(caller.cls)
    model = _lenient(body, "model", str)
    stream = _optional(body, "stream", bool, "a boolean (true or false)") or False
    include_usage = _stream_options(body, stream)
    copies = _copies(body)
    previous = _lenient(body, "previous_response_id", str)  # llama-server: json_value, else ""
    if previous:
        raise _invalid("previous_response_id", "is not supported: llama-server keeps no responses; send the whole conversation as 'input'")
    _check_input(body)
    return limited_intake("responses", path, body, caller, cls, model, stream, include_usage, copies, "max_output_tokens", LIMIT_FIELDS)


def _check_input(body: Mapping[str, Any]) -> None:
    value = body.get("input")
    if value is None:
        raise _invalid("input", "is required")
    if isinstance(value, str):
        return
    if not isinstance(value, list):
        raise _invalid("input", f"must be a string or an array of input items, got {describe(value)}")
    # An empty list is llama-server's to answer, as an empty Messages list is.
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise _invalid(f"input[{i}]", f"must be an input item object, got {describe(item)}")


# ---- the stream ----------------------------------------------------------------------


def _load(payload: str) -> dict[str, Any]:
    try:
        chunk = json.loads(payload)
    except ValueError:
        return {}
    return chunk if isinstance(chunk, dict) else {}


class ResponsesEvents:
    """Reads llama-server's Responses stream for the relay (gate/backend/upstream.py EventFormat);
    remembers the announced response and the events seen, for the gate's own error events."""

    __slots__ = ("response", "seen")

    def __init__(self) -> None:
        self.response: dict[str, Any] | None = None
        self.seen = 0

    def is_token(self, event: str) -> bool:
        return event.endswith(".delta")

    def inspect(self, event: str, payload: str, stats: RelayStats) -> dict[str, Any] | None:
        self.seen += 1
        if event == "response.created":
            response = _load(payload).get("response")
            self.response = response if isinstance(response, dict) else None
        elif event in _FINAL_EVENTS:
            chunk = _load(payload)
            stats.read_final(chunk)  # timings.predicted_n, when llama-server adds them
            response = chunk.get("response")
            if isinstance(response, dict):
                stats.read_final(response)  # usage.output_tokens
            stats.finished = True
        elif event in ("error", "response.failed") or (event == "" and '"error"' in payload):
            # llama-server's own mid-stream error is data: {"error": {...}}, without an event line
            chunk = _load(payload)
            error = chunk.get("error")
            if isinstance(error, dict):
                return error
            response = chunk.get("response")
            if isinstance(response, dict) and isinstance(response.get("error"), dict):
                return response["error"]
            return chunk or {"message": "backend reported an error mid-answer"}
        return None

    def error_event(self, err: GateError) -> bytes:
        error = {"type": "error", "code": err.reason.value, "message": err.message, "param": err.param, "sequence_number": self.seen}
        response = dict(self.response or {"object": "response"})
        response["status"] = "failed"
        response["error"] = {"code": err.reason.value, "message": err.message}
        failed = {"type": "response.failed", "sequence_number": self.seen + 1, "response": response}
        return (
            b"event: error\ndata: "
            + json.dumps(error).encode()
            + b"\n\nevent: response.failed\ndata: "
            + json.dumps(failed).encode()
            + b"\n\n"
        )
