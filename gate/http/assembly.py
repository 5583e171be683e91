"""The non-streaming answer llama-server would have sent, built from its stream.

The gate streams from llama-server even for non-streaming clients (reliable
cancel, see gate/backend/upstream.py) and rebuilds the plain answer here. What the plain
answer holds is decided by llama.cpp 0c1e570, tools/server/server-task.cpp
(`to_json_non_oaicompat`, `to_json_oaicompat`, `to_json_oaicompat_chat`) and
server-context.cpp (`send_partial_response`, `send_final_response`):

* the final stream chunk carries every closing field (usage with its details,
  timings, stop_type, stopping_word, truncated, tokens_cached, generation
  settings, ...), but in stream mode its text, token ids and probabilities are
  empty: they rode on the per-token chunks, so they are gathered from those;
* a few answers cannot be rebuilt from the stream at all (`stream_loses`): the
  gate then asks llama-server for a plain answer and relays it as is;
* llama-server started with ``--verbose`` adds ``__verbose`` (its native answer, with the
  prompt it built) to the OpenAI answers, plain or streamed; the stream's is its final's, whose
  text and probabilities rode on the per-token chunks too: :func:`_verbose` puts them back.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from gate.data.endpoints import Kind


def stream_loses(kind: Kind, body: Mapping[str, Any]) -> bool:
    """True when llama-server's stream lacks something its plain answer to `body` holds.

    Each case comes from the source named above; "seen" marks the ones also
    observed on the real server with the test model:
    * `return_tokens`: a token that ends inside a multi-byte character is never
      streamed (`process_token` sends only complete UTF-8), so its id is missing;
    * `n_indent`: the last line is cut from the plain answer after it was streamed
      (not seen: the test model writes no indented lines);
    * `response_fields`: the final chunk is filtered, and may lose `stop` itself;
    * `verbose`: `__verbose` is built from the whole text, which the stream's final lacks (seen);
    * chat with `tools`, `json_schema` or a JSON `response_format`: the text is parsed
      into a message; when the parse comes out empty (text that does not follow the
      format: seen with `response_format: json_object`, content "```json"), the plain
      answer falls back to the raw text, which the chat stream never carries;
    * probabilities on chat: a token that adds no text (end of generation, held-back
      stop-string text) gets no chunk, so its logprobs entry is missing (seen: 10
      entries streamed, 11 in the plain answer, the last one the end token);
    * probabilities with `stop` strings: the plain answer drops the entries of the
      stop string's tokens, counted by tokenizing it, which the gate does not do (seen);
    * the Messages and Responses APIs, always: their plain answer is relayed as llama-server
      sends it, byte for byte (gate/http/apis/), never rebuilt.
    """
    if kind in ("messages", "responses"):
        return True
    if body.get("verbose") or (kind in ("completion", "infill") and (body.get("return_tokens") or body.get("response_fields"))):
        return True
    if _positive(body.get("n_indent")):
        return True
    if kind == "chat" and (body.get("tools") or body.get("json_schema") is not None or _json_format(body)):
        return True
    if not _wants_probs(kind, body):
        return False
    return kind == "chat" or bool(body.get("stop"))


def _json_format(body: Mapping[str, Any]) -> bool:
    fmt = body.get("response_format")
    return isinstance(fmt, Mapping) and fmt.get("type") not in (None, "text")


def _wants_probs(kind: Kind, body: Mapping[str, Any]) -> bool:
    if kind == "chat":  # logprobs: true sets n_probs from top_logprobs; n_probs also passes through
        return body.get("logprobs") is True or _positive(body.get("n_probs"))
    # llama.cpp's schema: `logprobs` is an alias of `n_probs`, used when n_probs is absent.
    return _positive(body["n_probs"] if "n_probs" in body else body.get("logprobs"))


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def plain_body(body: Mapping[str, Any]) -> dict[str, Any]:
    """The client's body for a plain (non-streaming) upstream call (``id_slot`` as sent, as upstream_body)."""
    out = {k: v for k, v in body.items() if k != "stream_options"}
    out["stream"] = False
    return out


def assemble(kind: Kind, chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """Build the non-streaming answer llama-server would have sent from its stream chunks."""
    if kind in ("completion", "infill"):  # infill answers in /completion's shape
        return _assemble_completion(chunks)
    if kind == "completions":
        return _assemble_text_completion(chunks)
    return _assemble_chat(chunks)


def _first(chunks: list[dict[str, Any]], key: str) -> Any:
    return next((c[key] for c in chunks if key in c), None)


def _extras(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in ("usage", "timings"):
        value = next((c[key] for c in reversed(chunks) if c.get(key) is not None), None)
        if value is not None:
            out[key] = value
    return out


def _head(chunks: list[dict[str, Any]], obj: str) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": _first(chunks, "id"),
        "object": obj,
        "created": _first(chunks, "created") or int(time.time()),
        "model": _first(chunks, "model"),
    }
    if (fp := _first(chunks, "system_fingerprint")) is not None:
        out["system_fingerprint"] = fp
    return out


def _assemble_chat(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    content: list[str] = []
    reasoning: list[str] = []
    tool_calls: dict[int, dict[str, Any]] = {}
    finish_reason = None
    role = "assistant"
    for chunk in chunks:
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            role = delta.get("role") or role
            if isinstance(delta.get("content"), str):
                content.append(delta["content"])
            if isinstance(delta.get("reasoning_content"), str):
                reasoning.append(delta["reasoning_content"])
            for call in delta.get("tool_calls") or []:
                slot = tool_calls.setdefault(call.get("index", 0), {"type": "function", "function": {"name": "", "arguments": ""}})
                if call.get("id"):
                    slot["id"] = call["id"]
                fn = call.get("function") or {}
                slot["function"]["name"] += fn.get("name") or ""
                slot["function"]["arguments"] += fn.get("arguments") or ""
            finish_reason = choice.get("finish_reason") or finish_reason
    # common_chat_msg::to_json_oaicompat: content is always a string, "" when empty
    # (tool calls included); reasoning_content and tool_calls only when present.
    message: dict[str, Any] = {"role": role, "content": "".join(content)}
    if reasoning:
        message["reasoning_content"] = "".join(reasoning)
    if tool_calls:
        message["tool_calls"] = [tool_calls[i] for i in sorted(tool_calls)]
    out = _head(chunks, "chat.completion")
    out["choices"] = [{"index": 0, "message": message, "finish_reason": finish_reason}]
    out.update(_extras(chunks))
    if (verbose := _verbose(chunks, message["content"])) is not None:
        out["__verbose"] = verbose
    return out


def _assemble_text_completion(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    text: list[str] = []
    probs: list[Any] = []
    finish_reason = None
    for chunk in chunks:
        for choice in chunk.get("choices") or []:
            if isinstance(choice.get("text"), str):
                text.append(choice["text"])
            logprobs = choice.get("logprobs")
            if isinstance(logprobs, Mapping) and isinstance(logprobs.get("content"), list):
                probs.extend(logprobs["content"])
            finish_reason = choice.get("finish_reason") or finish_reason
    out = _head(chunks, "text_completion")
    # to_json_oaicompat: logprobs is null unless some token carried probabilities.
    logprobs_out = {"content": probs} if probs else None
    out["choices"] = [{"text": "".join(text), "index": 0, "logprobs": logprobs_out, "finish_reason": finish_reason}]
    out.update(_extras(chunks))
    if (verbose := _verbose(chunks, out["choices"][0]["text"])) is not None:
        out["__verbose"] = verbose
    return out


def _verbose(chunks: list[dict[str, Any]], text: str) -> dict[str, Any] | None:
    """The plain answer's ``__verbose`` (llama-server ``--verbose``): the stream's last one (its
    final result's, ``to_json_non_oaicompat``) with the whole text, and the native probabilities
    that each streamed /v1/completions token's own ``__verbose`` carried; ``tokens`` stays as
    sent (the plain answer has ids there only with ``return_tokens``). A chat answer's reasoning
    text is not in it: the raw text is never streamed as such."""
    found = [c["__verbose"] for c in chunks if isinstance(c.get("__verbose"), Mapping)]
    if not found:
        return None
    out = dict(found[-1])
    out["content"] = text
    probs = [p for v in found[:-1] for p in v.get("completion_probabilities") or []]
    if probs:
        out["completion_probabilities"] = probs
    settings = out.get("generation_settings")
    if isinstance(settings, Mapping) and "stream" in settings:
        out["generation_settings"] = {**settings, "stream": False}
    return out


def _assemble_completion(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    # The stop: true chunk carries every final field; per-token chunks (stop: false)
    # carry the text and the probabilities. Prompt-progress chunks carry neither.
    final = dict(next((c for c in reversed(chunks) if c.get("stop") is True), chunks[-1] if chunks else {}))
    tokens = [c for c in chunks if c.get("stop") is False and "prompt_progress" not in c]
    final["content"] = "".join(c["content"] for c in tokens if isinstance(c.get("content"), str))
    probs = [p for c in tokens for p in c.get("completion_probabilities") or []]
    if probs:
        final["completion_probabilities"] = probs
    settings = final.get("generation_settings")
    if isinstance(settings, Mapping) and "stream" in settings:
        final["generation_settings"] = {**settings, "stream": False}  # the gate's upstream call streamed, the client's did not
    final["stop"] = True
    return final
