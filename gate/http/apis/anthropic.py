"""The Anthropic Messages API (``POST /v1/messages``): its intake, its cost model, its stream.

What llama-server does with the body (llama.cpp as vendored by llama-cpp-python 0.3.36,
tools/server/server-chat.cpp ``server_chat_convert_anthropic_to_oai``): it builds a NEW chat
body from ``system``, ``messages``, ``tools``, ``tool_choice``, ``stop_sequences``,
``max_tokens`` (4096 when absent), ``temperature``, ``top_p``, ``top_k``, ``stream``,
``chat_template_kwargs``, ``thinking`` and ``metadata.user_id``, and drops every other field.

Cost: the prompt, counted by llama-server's own ``POST /v1/messages/count_tokens`` (the same
conversion and template), plus ``max_tokens``. Anthropic requires ``max_tokens``; llama-server
does not (4096), so neither does the gate: when it is absent the class's ``default_max_tokens``
is injected, as on the OpenAI routes, so the worst case is the class's, not llama-server's.
The anti-bypass rule of gate/http/intake.py holds here too: llama-server reads ``max_tokens``
alone here, so the gate injects it whenever it is absent, even beside an ``n_predict`` (which
this llama-server drops: 471 tokens ran on a reservation of 5 before), and ``n_predict`` or
``max_completion_tokens`` given as numbers count toward the reservation (a llama.cpp that
passed them through would otherwise run past it).

Stream (server-task.cpp ``to_json_anthropic*``): ``event:`` + ``data:`` pairs, relayed as sent;
``content_block_delta`` events are the tokens (the first one is the first token), the last
``message_delta`` carries ``usage.output_tokens``, ``message_stop`` ends it (no ``[DONE]``).
The gate's own mid-stream error is Anthropic's ``event: error`` with an ``overloaded_error``
(a shed, a stall, a shutdown; ``timeout_error`` past ``request_timeout_s``, ``api_error`` for a
broken backend), the gate's reason as its ``code``. Refusals before the stream are Anthropic-shaped too (gate/core/errors.py,
``shape="anthropic"``), with ``retry-after``: the SDK backs off by itself.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from gate.backend.upstream import RelayStats
from gate.config import Config
from gate.core.errors import GateError, anthropic_error_object
from gate.http.intake import MAX_TOKENS_FIELDS, Intake, _copies, _invalid, _lenient, _optional, limited_intake
from gate.http.jsonbody import describe
from gate.http.tenants import Caller

#: the generation limit's fields, the API's own first
LIMIT_FIELDS = ("max_tokens",)
#: the names llama-server reads on every other route and drops here (server-chat.cpp builds a new
#: body): a number there still counts (intake._given_max_tokens), a llama.cpp may pass them on
UNREAD_FIELDS = tuple(f for f in MAX_TOKENS_FIELDS if f != "max_tokens")


def open_user(body: Mapping[str, Any]) -> str | None:
    """The caller's own name in open mode: ``metadata.user_id`` (the API has no ``user``)."""
    metadata = body.get("metadata")
    user = metadata.get("user_id") if isinstance(metadata, dict) else None
    return user if isinstance(user, str) else None


def build(path: str, body: Mapping[str, Any], caller: Caller, config: Config) -> Intake:
    """Validate a Messages body for `caller` (400 ``invalid_request`` naming the field)."""
    cls = config.class_by_name(caller.cls)
    model = _lenient(body, "model", str)
    stream = _optional(body, "stream", bool, "a boolean (true or false)") or False
    # `system` and `metadata` are llama-server's to read: it skips what it cannot use
    # (server-chat.cpp server_chat_convert_anthropic_to_oai), so the gate refuses neither.
    _check_messages(body)
    # llama-server's new body has no n / n_cmpl: one task; a number there still counts (_copies)
    copies = _copies(body, read=False)
    return limited_intake(
        "messages", path, body, caller, cls, model, stream, False, copies, "max_tokens", LIMIT_FIELDS, unread=UNREAD_FIELDS
    )


def _check_messages(body: Mapping[str, Any]) -> None:
    """What llama-server refuses (400), or answers 500 for (a role that is not a string, a text
    block without its text), refused here with the field named; the rest passes as llama-server
    reads it: a block it cannot use is skipped, a missing assistant content is dropped."""
    if "messages" not in body:  # (a null is there: llama-server reads it as no messages, 200)
        raise _invalid("messages", "is required")
    messages = body["messages"]
    if not isinstance(messages, list):
        return  # llama-server reads it as no messages (server-chat.cpp: only an array is converted): 200
    # An empty list is llama-server's to answer (it does, 200: its own test_anthropic_empty_messages).
    for i, msg in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise _invalid(where, f"must be a message object, got {describe(msg)}")
        role = msg.get("role")
        if not isinstance(role, str):
            raise _invalid(f"{where}.role", f'must be a string ("user" or "assistant"), got {describe(role)}')
        if "content" not in msg:
            if role == "assistant":
                continue  # llama-server skips it
            raise _invalid(f"{where}.content", f"is required for a {role} message")
        content = msg["content"]
        if content is None or isinstance(content, str):
            continue
        if not isinstance(content, list):
            raise _invalid(f"{where}.content", f"must be a string or an array of content blocks, got {describe(content)}")
        for j, block in enumerate(content):
            if isinstance(block, dict) and block.get("type") == "text" and not isinstance(block.get("text"), str):
                raise _invalid(f"{where}.content[{j}].text", f"must be a string in a text block, got {describe(block.get('text'))}")


# ---- the stream ----------------------------------------------------------------------


def _load(payload: str) -> dict[str, Any]:
    try:
        chunk = json.loads(payload)
    except ValueError:
        return {}
    return chunk if isinstance(chunk, dict) else {}


class MessagesEvents:
    """Reads llama-server's Messages stream for the relay (gate/backend/upstream.py EventFormat)."""

    __slots__ = ()

    def is_token(self, event: str) -> bool:
        return event == "content_block_delta"

    def inspect(self, event: str, payload: str, stats: RelayStats) -> dict[str, Any] | None:
        if event == "message_delta":
            stats.read_final(_load(payload))  # usage.output_tokens
        elif event == "message_stop":
            stats.finished = True
        elif event == "error" or (event == "" and '"error"' in payload):
            # llama-server's own: event: error, its error object as the data
            chunk = _load(payload)
            error = chunk.get("error")
            return error if isinstance(error, dict) else chunk or {"message": "backend reported an error mid-answer"}
        return None

    def error_event(self, err: GateError) -> bytes:
        # By the status the refusal would have had: a shed or a stall (503) is an
        # overloaded_error, request_timeout_s a timeout_error, a broken backend an api_error.
        return b"event: error\ndata: " + json.dumps(anthropic_error_object(err)).encode() + b"\n\n"
