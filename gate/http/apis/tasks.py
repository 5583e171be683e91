"""What llama-server will run for a request, as tasks of text pieces to count (no I/O).

llama-server splits some requests into several tasks, each in its own slot (tools/server of
the llama.cpp the project builds, 0.3.36's vendored copy): a ``prompt`` list of several prompts
(``tokenize_input_prompts``), ``n``/``n_cmpl`` copies of each (``n_cmpl`` child tasks),
every embedding input (``handle_embeddings_impl``), every rerank document
(``post_rerank``). A :class:`TaskPlan` is one such task: the texts the server tokenizes for
it, each with the flags it tokenizes them with, plus the tokens it adds itself (BOS, FIM and
separator tokens, literal token ids). :mod:`gate.backend.taskcount` counts the pieces with the
backend's own ``/tokenize``; the request is admitted for every task at once.

Cost models, from the server source:

* ``/completion``, ``/v1/completions`` with a list of prompts: each string prompt is
  tokenized with BOS and special tokens parsed; a list of token ids is those tokens; a list
  mixing strings and ids is ONE prompt (only a leading string gets BOS). The prompt object
  ``{"prompt_string": ..., "multimodal_data": [...]}`` is one prompt: its text is counted,
  its media cannot be (their tokens depend on the projector), so the count is an estimate.
* ``/infill`` (``format_prompt_infill``): [extra context] FIM_PRE prefix prompt FIM_SUF suffix
  FIM_MID, BOS first; the extra context is FIM_REP "myproject\\n", then per chunk FIM_SEP
  filename "\\n" text (or, without FIM_SEP tokens, a "--- snippet ---" line), then FIM_SEP
  "filename\\n". Prefix, suffix and extra text are tokenized without special tokens; the prompt
  with them parsed. The gate counts both chunk headers (an upper bound either way) and the
  untruncated input: llama-server cuts the prefix to 3/4 of its batch, the suffix to 1/4 and
  the extra context to what the context leaves, which the gate cannot see (``n_batch`` is not
  in ``/props``), so it may reserve more than llama-server then holds, never less.
* embeddings: each input a task, tokenized with BOS and special tokens parsed; no decode.
* rerank (``format_prompt_rerank``, without a model rerank template): BOS query EOS SEP
  document EOS, query and document without special tokens: 4 tokens added per document. A
  model with its own rerank template adds that template's text per document, which no route
  serves, so it is not counted.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gate.core.errors import GateError
from gate.core.reasons import Reason
from gate.data.tasks import Piece, TaskPlan
from gate.http.jsonbody import describe

__all__ = [
    "FIM_SNIPPET",
    "Piece",
    "TaskPlan",
    "embedding_plans",
    "infill_plan",
    "prompt_plans",
    "rerank_plans",
]

_TOKEN_ID_MAX = 2**31 - 1

#: infill's chunk separator when the model has no FIM_SEP token (server-common.cpp)
FIM_SNIPPET = "\n\n--- snippet ---\n\n"
_FIM_REPO = "myproject\n"
_FIM_FILE = "filename\n"
#: tokens infill adds itself: BOS, FIM_PRE, FIM_SUF, FIM_MID, FIM_REP and the closing FIM_SEP
_INFILL_SPECIALS = 6
#: tokens rerank adds around each query/document pair: BOS, EOS, SEP, EOS
_RERANK_SPECIALS = 4


def _invalid(param: str, problem: str) -> GateError:
    return GateError(Reason.INVALID_REQUEST, f"'{param}' {problem}", param)


def _is_token(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_ids(param: str, items: list[Any]) -> None:
    for k, t in enumerate(items):
        if _is_token(t) and not 0 <= t <= _TOKEN_ID_MAX:
            raise _invalid(f"{param}[{k}]", f"must be a token id (0 to {_TOKEN_ID_MAX}), got {t}")


def _subprompt(param: str, p: Any, *, add_special: bool = True) -> TaskPlan:
    """One prompt as llama-server's ``tokenize_input_subprompt`` reads it."""
    if isinstance(p, str):
        return TaskPlan((Piece(p, add_special, True),))
    if isinstance(p, dict):
        if "prompt_string" not in p:
            raise _invalid(param, "must hold 'prompt_string' (llama-server's multimodal prompt object)")
        text = p["prompt_string"]
        if not isinstance(text, str):
            raise _invalid(f"{param}.prompt_string", f"must be a string, got {describe(text)}")
        media = p.get("multimodal_data")
        if media is not None and not (isinstance(media, list) and all(isinstance(m, str) for m in media)):
            raise _invalid(f"{param}.multimodal_data", "must be an array of base64 strings")
        return TaskPlan((Piece(text, add_special, True),), estimate=bool(media))
    if isinstance(p, list) and p and all(isinstance(x, str) or _is_token(x) for x in p):
        _check_ids(param, p)
        pieces = tuple(Piece(x, add_special and i == 0, True) for i, x in enumerate(p) if isinstance(x, str))
        return TaskPlan(pieces, sum(1 for x in p if _is_token(x)))
    if isinstance(p, list) and not p:
        raise _invalid(param, "must not be an empty array")
    raise _invalid(param, f"must be a string, an array of token ids, or a prompt object, got {describe(p)}")


def prompt_plans(prompt: Any, param: str = "prompt") -> tuple[TaskPlan, ...]:
    """The tasks of a ``prompt`` (``tokenize_input_prompts``): one prompt, or one per list entry."""
    if prompt is None:
        raise _invalid(param, "is required")
    if isinstance(prompt, list):
        if not prompt:
            raise _invalid(param, "must not be an empty array")
        if any(_is_token(x) for x in prompt):
            for k, x in enumerate(prompt):
                if not (isinstance(x, str) or _is_token(x)):
                    raise _invalid(f"{param}[{k}]", f"must be a string or a token id, got {describe(x)}")
            return (_subprompt(param, prompt),)  # ids, or strings mixed with ids: one prompt
        # An empty entry is a prompt of no tokens: llama-server runs it (200), as it refuses (400)
        # only an empty list as the whole prompt.
        return tuple(TaskPlan() if x == [] else _subprompt(f"{param}[{k}]", x) for k, x in enumerate(prompt))
    return (_subprompt(param, prompt),)


def _text_or_mixed(body: Mapping[str, Any], name: str) -> tuple[list[Piece], int]:
    value = body.get(name)
    if value is None:
        raise _invalid(name, "is required")
    if isinstance(value, str):
        return [Piece(value, False, False)], 0
    if isinstance(value, list) and all(isinstance(x, str) or _is_token(x) for x in value):
        _check_ids(name, value)
        return [Piece(x, False, False) for x in value if isinstance(x, str)], sum(1 for x in value if _is_token(x))
    raise _invalid(name, f"must be a string (or an array of strings and token ids), got {describe(value)}")


def infill_plan(body: Mapping[str, Any]) -> TaskPlan:
    """The one task of an ``/infill`` request (see the module docstring); 400 for bad fields."""
    prefix, prefix_ids = _text_or_mixed(body, "input_prefix")
    suffix, suffix_ids = _text_or_mixed(body, "input_suffix")
    pieces = [*prefix, *suffix]
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        # (llama-server reads any other prompt as none: its "must be a string" error is not
        # returned, server-context.cpp post_infill, and the request runs without it: 200)
        pieces.append(Piece(prompt, False, True))
    extra = body.get("input_extra")
    literal = prefix_ids + suffix_ids + _INFILL_SPECIALS
    pieces.extend((Piece(_FIM_REPO, False, False), Piece(_FIM_FILE, False, False)))
    if extra is not None:
        if not isinstance(extra, list):
            raise _invalid("input_extra", 'must be an array of {"filename": string, "text": string}')
        for k, chunk in enumerate(extra):
            where = f"input_extra[{k}]"
            if not isinstance(chunk, dict) or not isinstance(chunk.get("text"), str):
                raise _invalid(f"{where}.text", "is required, a string")
            filename = chunk.get("filename", "tmp")
            if not isinstance(filename, str):
                raise _invalid(f"{where}.filename", f"must be a string, got {describe(filename)}")
            # Both chunk headers (FIM_SEP + filename, or the snippet line): an upper bound either way.
            pieces.extend((Piece(filename + "\n", False, False), Piece(FIM_SNIPPET, False, False), Piece(chunk["text"], False, False)))
            literal += 1
    return TaskPlan(tuple(pieces), literal)


def embedding_plans(body: Mapping[str, Any]) -> tuple[TaskPlan, ...]:
    """One task per embedding input (``input``, or ``content`` on llama's own routes)."""
    name = "input" if "input" in body else "content"
    value = body.get(name)
    if value is None:
        raise _invalid("input", "is required ('input', or 'content')")
    entries = value if isinstance(value, list) and value and not any(_is_token(x) for x in value) else [value]
    if isinstance(value, list) and not value:
        raise _invalid(name, "must not be empty")
    plans = []
    for k, entry in enumerate(entries):
        where = name if entries is not value else f"{name}[{k}]"
        if isinstance(entry, dict) and "content" in entry:
            plans.append(_oai_content(where, entry["content"]))
        else:
            plans.append(_subprompt(where, entry))
    return tuple(plans)


def _oai_content(param: str, content: Any) -> TaskPlan:
    """An embedding input given as OpenAI content parts: text counted, media estimated."""
    if isinstance(content, str):
        return TaskPlan((Piece(content, True, True),))
    if not isinstance(content, list):
        raise _invalid(f"{param}.content", f"must be a string or an array of content parts, got {describe(content)}")
    pieces: list[Piece] = []
    media = False
    for j, part in enumerate(content):
        if not isinstance(part, dict):
            raise _invalid(f"{param}.content[{j}]", f"must be a content part object, got {describe(part)}")
        if part.get("type") == "text":
            text = part.get("text")
            if not isinstance(text, str):
                raise _invalid(f"{param}.content[{j}].text", f"must be a string, got {describe(text)}")
            pieces.append(Piece(text, not pieces, True))
        else:
            media = True
    return TaskPlan(tuple(pieces), estimate=media)


def rerank_plans(body: Mapping[str, Any]) -> tuple[TaskPlan, ...]:
    """One task per document: query and document, and the 4 tokens around them."""
    query = body.get("query")
    if query is None:
        raise _invalid("query", "is required")
    if not isinstance(query, str):
        raise _invalid("query", f"must be a string, got {describe(query)}")
    name = "documents" if "documents" in body else "texts"
    docs = body.get(name)
    if not isinstance(docs, list) or not docs:
        raise _invalid("documents", "must be a non-empty array of strings ('documents', or 'texts')")
    for k, d in enumerate(docs):
        if not isinstance(d, str):
            raise _invalid(f"{name}[{k}]", f"must be a string, got {describe(d)}")
    # (`top_n` is llama-server's to read: it ignores one that is not an integer, 200)
    q = Piece(query, False, False)
    return tuple(TaskPlan((q, Piece(d, False, False)), _RERANK_SPECIALS) for d in docs)
