"""Request intake: raw body + headers -> a validated :class:`Intake`, or a :class:`GateError`.

Pure: no I/O, no HTTP framework. The HTTP layer hands over the path, the body bytes (already
limited to ``gate.max_body_bytes`` by :mod:`gate.guard`), the headers and the client's address;
it renders a :class:`GateError` with :func:`gate.errors.render`.

Order of checks (the first failure is the answer):

1. With tenants configured: authentication (401 ``invalid_api_key``), then the class (400 for an
   unknown class, 403 ``class_not_allowed``). These come before anything in the body, so a
   caller without a valid key learns nothing about what the gate would accept.
2. The headers the gate forwards: no control bytes (400 ``invalid_request`` naming the header;
   bytes beyond ASCII go as the client sent them, as llama-server takes them); a ``Content-Encoding``
   other than identity is 415 (llama-server reads none: its own answer).
3. The body (:mod:`gate.jsonbody`): UTF-8, JSON llama-server can read back (no NaN/Infinity or
   overflowing numbers, no duplicate keys, no lone surrogates, nesting at most
   :data:`MAX_JSON_DEPTH`), a JSON object. All 400 ``invalid_request``.
4. Open mode (no tenants): the caller, from the ``user`` field or the client address, and the
   class (400 for an unknown class). The body is parsed first because ``user`` is in it.
5. Fields, each 400 ``invalid_request`` with ``param`` naming it: ``model``, ``user``,
   ``stream``, ``stream_options``, ``n``/``n_cmpl``, then ``messages`` (chat) or ``prompt``,
   then the max-tokens fields.

A JSON ``null`` counts as absent for every optional field, as in llama-server (which skips null
values) and the OpenAI API (which declares these fields nullable).

Max tokens. llama-server (tools/server/server-schema.cpp at the pinned commit 0c1e570) reads
the generation limit on EVERY endpoint from ``n_predict``, else ``max_completion_tokens``, else
``max_tokens``. So the gate reads all three on every endpoint, whatever the endpoint's own name
for it, as llama-server does: the first one present and not null, as nlohmann reads an integer
(a number truncated toward zero: 2.7 is 2; a boolean 1 or 0; 0 still decodes one token, and is
reserved as 1), in [0, class cap] (-1, "until the context is full", is refused: the gate needs a
bound); a string there is llama-server's 400 and the gate's. The names after it llama-server
does not read, and a value there that is not a number is ignored as llama-server ignores it; but
a number there counts (the gate reserves the most of them, and refuses -1 or over the cap there
too), so that no spelling, in this llama.cpp or one that read another name first, runs past the
reservation. When none is present, the class's ``default_max_tokens`` is injected into the
forwarded body as ``max_tokens`` (``n_predict`` for ``/completion``), lowered once the prompt
is counted to what one slot holds after it when the default does not fit (`fit_injected`).


Several tasks per request: llama-server runs ``n`` (llama's ``n_cmpl``, read first) copies of
each prompt, and one task per prompt of a ``prompt`` list, each in its own slot. The gate
reads both (an integer of at least 1) and admits the request for all of its tasks (``copies`` x
``plans``; more tasks than a backend's slots hold every slot: llama-server runs them in waves).
Infill, embeddings and rerank bodies are checked and planned by :mod:`gate.http.apis.tasks`
(``plans``: the tasks, their text pieces); embeddings and rerank do not decode
(``max_tokens`` 0, nothing injected).

The Anthropic Messages API and the Responses API have their own intake and limit field
(gate/http/apis/, each module's docstring): the same rule, over the API's own field and these
three.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from gate.config import ClassConfig, Config
from gate.core.errors import GateError
from gate.core.reasons import Reason
from gate.data.endpoints import ENDPOINTS, Kind
from gate.http.apis.predict import predict_parts
from gate.http.apis.tasks import TaskPlan, embedding_plans, infill_plan, prompt_plans, rerank_plans
from gate.http.jsonbody import MAX_JSON_DEPTH, decode_body, describe

if TYPE_CHECKING:
    from gate.http.tenants import Caller, TenantDirectory

__all__ = [
    "ENDPOINTS",
    "Intake",
    "Kind",
    "MAX_JSON_DEPTH",
    "MESSAGE_ROLES",
    "build_intake",
    "check_headers",
    "decode_body",
    "parse_request",
]


#: the roles chat templates know; only named in errors (llama-server accepts any role name)
MESSAGE_ROLES = ("system", "user", "assistant", "tool", "developer")

#: kinds whose tasks only read their input: no generation limit, nothing injected
NO_DECODE: frozenset[str] = frozenset({"embeddings", "rerank"})

# llama-server's names for the generation limit, in the order it reads them.
MAX_TOKENS_FIELDS = ("n_predict", "max_completion_tokens", "max_tokens")
COUNT_FIELDS = ("n", "n_cmpl")

_TOKEN_ID_MAX = 2**31 - 1  # llama_token is int32

# Header values as decoded by the server (latin-1): control bytes cannot be forwarded (h11 refuses
# to write them); bytes beyond ASCII go as sent (upstream.on_the_wire), as llama-server takes them.
_UNSENDABLE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,64}")


@dataclass(frozen=True, slots=True)
class Intake:
    """A validated request, ready for counting and admission.

    ``body`` is the JSON to forward: a new dict with the client's fields, plus the injected
    limit when the client gave none (``max_tokens_injected``). ``max_tokens`` is the limit
    llama-server will apply. ``include_usage`` is the client's ``stream_options.include_usage``.
    """

    kind: Kind
    path: str
    body: dict[str, Any]
    model: str | None
    stream: bool
    max_tokens: int
    max_tokens_injected: bool
    caller: Caller
    include_usage: bool
    copies: int = 1  # n / n_cmpl: tasks per prompt
    #: the tasks to count piece by piece (infill, embeddings, rerank, several prompts, prompt
    #: objects); None: one prompt, counted whole by gate.backend.tokens
    plans: tuple[TaskPlan, ...] | None = None
    #: /predict: the admitted instances, each its own route's intake (held all at once)
    parts: tuple[Intake, ...] = ()
    #: the body's field the class default went in as (``max_tokens_injected``): `fit_injected`
    injected_as: str | None = None

    @property
    def unstreamed(self) -> bool:
        """Sent as is and answered whole (embeddings, rerank, the /predict envelope)."""
        return self.kind in NO_DECODE or self.kind == "predict"

    @property
    def several(self) -> bool:
        """Does llama-server run it as several tasks (a prompt list, n > 1)?"""
        return self.copies > 1 or (self.plans is not None and len(self.plans) > 1)

    @property
    def decodes(self) -> bool:
        """Does llama-server generate tokens for it (False: embeddings, rerank)?"""
        return self.kind not in NO_DECODE


# --------------------------------------------------------------------------------------------
# Entry points


def check_headers(headers: Mapping[str, str]) -> None:
    """400 for a header value the gate could not forward (control bytes)."""
    for name, value in headers.items():
        if _UNSENDABLE.search(value):
            shown = name if _TOKEN.fullmatch(name) else "with an invalid name"
            raise GateError(
                Reason.INVALID_REQUEST,
                f"header {shown} holds control bytes; the gate cannot forward it",
                name if _TOKEN.fullmatch(name) else None,
            )


def parse_request(
    path: str,
    raw: bytes,
    headers: Mapping[str, str],
    client_host: str | None,
    config: Config,
    tenants: TenantDirectory,
    caller: Caller | None = None,
    *,
    build: Callable[[Kind, str, Mapping[str, Any], Caller, Config], Intake] | None = None,
    open_user: Callable[[Mapping[str, Any]], Any] | None = None,
) -> Intake:
    """Validate one request to an admitted endpoint (see the module docstring for the order).

    ``build`` and ``open_user``: an API adapter's field checks and where its body names the
    caller in open mode (gate/http/apis/ passes its own; default: :func:`build_intake`, ``user``).

    ``path`` must be a key of :data:`ENDPOINTS` (anything else is the caller's bug:
    ``ValueError``). ``caller``: the tenant already identified (the HTTP layer does it
    before reading the body, so an anonymous caller costs no body read; in open mode it
    checks the backends' key there, :meth:`TenantDirectory.check_key`). Raises
    :class:`GateError` for anything the client got wrong.
    """
    kind = ENDPOINTS.get(path)
    if kind is None:
        raise ValueError(f"not an admitted endpoint: {path!r}")
    if caller is None and not tenants.open:
        caller = tenants.identify(headers, client_host, None)
    try:
        check_headers(headers)
        _check_content_encoding(headers)
        body = decode_body(raw)
        if caller is None:
            user = body.get("user") if open_user is None else open_user(body)
            # open mode: the HTTP layer checked the key before reading the body (proxy.run)
            caller = tenants.identify(headers, client_host, user if isinstance(user, str) else None, key_checked=True)
        return (build or build_intake)(kind, path, body, caller, config)
    except GateError as exc:
        exc.caller = caller  # the request was wrong, but who asked (and in which class) is known
        raise


def build_intake(kind: Kind, path: str, body: Mapping[str, Any], caller: Caller, config: Config) -> Intake:
    """Validate the fields of a parsed body for ``caller``; never mutates ``body``."""
    if kind in ("messages", "responses"):
        raise ValueError(f"{kind} requests are built by gate.http.apis.dispatch (its parse_request)")
    cls = config.class_by_name(caller.cls)
    model = _lenient(body, "model", str)
    if kind in NO_DECODE:  # no stream there: llama-server never reads `stream`, so it goes as sent
        if kind == "embeddings":
            _check_encoding_format(body)
        inputs = embedding_plans(body) if kind == "embeddings" else rerank_plans(body)
        return Intake(kind, path, dict(body), model, False, 0, False, caller, False, 1, inputs)
    stream = _optional(body, "stream", bool, "a boolean (true or false)") or False
    if kind == "predict":
        operator = not config.tenants or (caller.tenant_config is not None and caller.tenant_config.operator)
        parts, sent = predict_parts(body, lambda k, p, b: build_intake(k, p, b, caller, config), operator)
        limit = max((p.max_tokens for p in parts), default=0)
        injected = any(p.max_tokens_injected for p in parts)
        return Intake(kind, path, sent, model, False, limit, injected, caller, False, 1, None, parts)
    include_usage = _stream_options(body, stream)
    copies = _copies(body)
    plans: tuple[TaskPlan, ...] | None = None
    if kind == "chat":
        _check_messages(body)
        _check_tools(body)
    elif kind == "infill":
        plans = (infill_plan(body),)
    else:
        _check_prompt(body)
        planned = prompt_plans(body.get("prompt"))
        if len(planned) > 1 or _has_object(body.get("prompt")):
            plans = planned  # several prompts, or a prompt object: counted task by task
    inject_as = "n_predict" if kind in ("completion", "infill") else "max_tokens"
    return limited_intake(kind, path, body, caller, cls, model, stream, include_usage, copies, inject_as, plans=plans)


def limited_intake(
    kind: Kind,
    path: str,
    body: Mapping[str, Any],
    caller: Caller,
    cls: ClassConfig,
    model: str | None,
    stream: bool,
    include_usage: bool,
    copies: int,
    inject_as: str,
    fields: tuple[str, ...] = MAX_TOKENS_FIELDS,
    plans: tuple[TaskPlan, ...] | None = None,
    unread: tuple[str, ...] = (),
) -> Intake:
    """The intake of a generating request once its own fields are checked: its generation limit
    as llama-server reads it on the route (`fields`, in its order; `unread`: names it drops
    here), else the class default injected into the forwarded body as `inject_as`; reserved as
    the most any of them asks (`_given_max_tokens`)."""
    given, most = _given_max_tokens(body, cls, fields, unread)
    forwarded = dict(body)
    if given is None:
        forwarded[inject_as] = cls.default_max_tokens
    most = max(most, cls.default_max_tokens if given is None else given)
    return Intake(
        kind=kind,
        path=path,
        body=forwarded,
        model=model,
        stream=stream,
        # 0: llama-server still decodes one token (server-context.cpp stops on the budget only
        # once a token is generated), so the worst case holds one
        max_tokens=max(most, 1),
        max_tokens_injected=given is None,
        caller=caller,
        include_usage=include_usage,
        copies=copies,
        plans=plans,
        injected_as=inject_as if given is None else None,
    )


def fit_injected(intake: Intake, prompt_tokens: int, slot_context: int) -> Intake:
    """`intake` with the limit the gate injected (the client gave none) lowered to what one slot
    holds after the prompt, when the class default does not fit: llama-server, asked without a
    limit, generates until the slot's context is full, so straight at it such a request is
    served, and the gate refused it 400 for a max_tokens the client never sent (a trial: the
    built-in batch default, 512, on `-np 4 -c 2048` without `-kvu`, slots of 512). One task
    only; a prompt that fills the slot alone is left to be refused as it is."""
    room = slot_context - prompt_tokens
    if intake.injected_as is None or intake.several or intake.parts or not 1 <= room < intake.max_tokens:
        return intake
    return replace(intake, body={**intake.body, intake.injected_as: room}, max_tokens=room)


def _has_object(prompt: Any) -> bool:
    return isinstance(prompt, dict) or (isinstance(prompt, list) and any(isinstance(p, dict) for p in prompt))


# --------------------------------------------------------------------------------------------
# Helpers


def _check_content_encoding(headers: Mapping[str, str]) -> None:
    """415 for a compressed body, as llama-server answers it: it reads no Content-Encoding, and the
    gate reads the body as JSON before admission (a gzip body was a misleading "not valid UTF-8";
    a plain one labelled br was admitted, then refused by llama-server as "backend answered 415")."""
    coding = headers.get("content-encoding", "").strip()
    if coding and coding.lower() != "identity":
        raise GateError(
            Reason.INVALID_REQUEST,
            f"request bodies with Content-Encoding: {coding} are not accepted; send the body uncompressed",
            "content-encoding",
            status=415,
        )


def _invalid(param: str, problem: str) -> GateError:
    return GateError(Reason.INVALID_REQUEST, f"'{param}' {problem}", param)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _llama_int(value: Any) -> int | None:
    """An integer field as llama-server reads it (nlohmann's get<int>): an integer, a number
    truncated toward zero (2.0 and 2.7 are 2: it answers 200 with two), a boolean as 1 or 0;
    None for anything else (a string, an array: llama-server's 400 on a field it reads)."""
    if isinstance(value, int):  # bool included: true is 1
        return int(value)
    if isinstance(value, float) and math.isfinite(value):
        return int(value)
    return None


# --------------------------------------------------------------------------------------------
# Field checks


def _optional(body: Mapping[str, Any], name: str, typ: type, what: str) -> Any:
    value = body.get(name)
    if value is not None and not isinstance(value, typ):
        raise _invalid(name, f"must be {what}, got {describe(value)}")
    return value


def _lenient(body: Mapping[str, Any], name: str, typ: type) -> Any:
    """A field the gate reads but llama-server ignores when it is malformed (``model`` outside
    router mode, ``user``): the value when it has the type, else absent, and llama-server
    answers the request as it would have without the gate."""
    value = body.get(name)
    return value if isinstance(value, typ) else None


def _stream_options(body: Mapping[str, Any], stream: bool) -> bool:
    # llama-server reads stream_options only when streaming, and only as an object; it refuses
    # a non-boolean include_usage (400) and so does the gate.
    options = body.get("stream_options")
    if not stream or not isinstance(options, dict):
        return False
    usage = options.get("include_usage")
    if usage is not None and not isinstance(usage, bool):
        raise _invalid("stream_options.include_usage", f"must be a boolean (true or false), got {describe(usage)}")
    return bool(usage)


def _copies(body: Mapping[str, Any], *, read: bool = True) -> int:
    """How many completions llama-server runs per prompt: ``n_cmpl``, else its alias ``n``
    (server-schema.cpp: the first present and not null), read as an integer is (`_llama_int`);
    refused (400) where llama-server refuses it, under 1 or not a number. The alias it does not
    read counts too when it is a number, as the generation limit's names do (`_given_max_tokens`):
    the gate admits the most of them. `read` False: a route where llama-server reads neither
    (/v1/messages builds a new body without them), so neither is refused."""
    first: int | None = None
    most = 1
    for name in reversed(COUNT_FIELDS):
        given = body.get(name)
        if given is None:
            continue
        value = _llama_int(given)
        if value is None or value < 1:
            if read and first is None:
                problem = "must be an integer" if value is None else "must be at least 1 (completions per prompt)"
                raise _invalid(name, f"{problem}, got {describe(given)}")
            continue
        first = value if first is None else first
        most = max(most, value)
    return most


def _check_tools(body: Mapping[str, Any]) -> None:
    """What llama-server answers 500 for in a chat's ``tools`` (common/chat.cpp
    ``common_chat_tools_parse_oaicompat``: "Failed to parse tools: ..."), refused 400 here with
    the field named: the caller's mistake, not a backend failure (relayed, it was journaled
    `failed upstream_error` and paged the on-call through TokengateUpstream5xx). What it
    accepts passes: null, an empty list, any `parameters`."""
    tools = body.get("tools")
    if tools is None:
        return
    for where, tool in _objects(tools, "tools", "tool"):
        if "type" not in tool:
            raise _invalid(f"{where}.type", "is required ('function')")
        if tool["type"] != "function":
            raise _invalid(f"{where}.type", f"must be 'function', got {describe(tool['type'])}")
        function = tool.get("function")
        if not isinstance(function, dict):
            problem = "is required" if "function" not in tool else f"must be an object, got {describe(function)}"
            raise _invalid(f"{where}.function", problem)
        if not isinstance(function.get("name"), str):
            problem = "is required" if "name" not in function else f"must be a string, got {describe(function['name'])}"
            raise _invalid(f"{where}.function.name", problem)
        if "description" in function and not isinstance(function["description"], str):
            raise _invalid(f"{where}.function.description", f"must be a string, got {describe(function['description'])}")


def _objects(value: Any, field: str, what: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, item) for each item of the array `value` at `field`, each a `what` object: a
    400 naming the field otherwise (`tools[2]`, `messages[0].content[1]`)."""
    if not isinstance(value, list):
        raise _invalid(field, f"must be an array of {what} objects, got {describe(value)}")
    for i, item in enumerate(value):
        where = f"{field}[{i}]"
        if not isinstance(item, dict):
            raise _invalid(where, f"must be a {what} object, got {describe(item)}")
        yield where, item


def _check_encoding_format(body: Mapping[str, Any]) -> None:
    """An embedding's ``encoding_format`` that is not a string: llama-server answers 500 (a JSON
    type error), the gate 400 (a string it does not know is its own 400, relayed)."""
    if "encoding_format" in body and not isinstance(body["encoding_format"], str):
        raise _invalid("encoding_format", f"must be 'float' or 'base64', got {describe(body['encoding_format'])}")


def _check_messages(body: Mapping[str, Any]) -> None:
    """What llama-server refuses in ``messages`` (server-common.cpp ``oaicompat_chat_params_parse``,
    common/chat.cpp ``common_chat_msgs_parse_oaicompat``), refused here with the field named;
    what it accepts passes: an empty list, any role name, a ``null`` content. Where llama-server
    answers 500 for the caller's mistake (a role missing or not a string, a content part
    without its type or text), the gate answers 400 instead."""
    messages = body.get("messages")
    if messages is None:
        raise _invalid("messages", "is required")
    for where, msg in _objects(messages, "messages", "message"):
        role = msg.get("role")
        if not isinstance(role, str):
            problem = "is required" if role is None else f"must be a string, got {describe(role)}"
            raise _invalid(f"{where}.role", f"{problem} (such as {', '.join(MESSAGE_ROLES)})")
        if "content" not in msg:
            if role != "assistant":
                raise _invalid(f"{where}.content", f"is required for a {role} message (null is accepted)")
            if "tool_calls" not in msg:
                raise _invalid(f"{where}.content", "is required unless the assistant message has tool_calls")
            continue
        content = msg["content"]
        if content is None or isinstance(content, str):
            continue
        if not isinstance(content, list):
            raise _invalid(
                f"{where}.content",
                f"must be a string or an array of content parts, got {describe(content)}",
            )
        for pwhere, part in _objects(content, f"{where}.content", "content part"):
            ptype = part.get("type")
            if ptype is None:
                raise _invalid(f"{pwhere}.type", 'is required (a string such as "text")')
            if not isinstance(ptype, str):
                raise _invalid(f"{pwhere}.type", f"must be a string, got {describe(ptype)}")
            if ptype == "text" and not isinstance(part.get("text"), str):
                raise _invalid(
                    f"{pwhere}.text",
                    f"must be a string in a text part, got {describe(part.get('text'))}",
                )


def _check_prompt(body: Mapping[str, Any]) -> None:
    prompt = body.get("prompt")
    if prompt is None:
        raise _invalid("prompt", "is required")
    if isinstance(prompt, (str, dict)):
        return  # a dict: llama-server's multimodal prompt object, checked by prompt_plans
    shapes = "a string, an array of token ids, a prompt object, or an array of prompts"
    if not isinstance(prompt, list):
        raise _invalid("prompt", f"must be {shapes}, got {describe(prompt)}")
    if not prompt:
        raise _invalid("prompt", "must not be an empty array")
    if all(_is_int(t) for t in prompt):
        for k, t in enumerate(prompt):
            if not 0 <= t <= _TOKEN_ID_MAX:
                raise _invalid(f"prompt[{k}]", f"must be a token id (0 to {_TOKEN_ID_MAX}), got {t}")
        return
    if not any(_is_int(p) for p in prompt):
        return  # several prompts (strings, id lists, objects): each a task, checked by prompt_plans
    # token ids mixed with strings: one prompt, as llama-server reads it (each string tokenized
    # in place), planned as such by prompt_plans
    for k, p in enumerate(prompt):
        if not (isinstance(p, str) or _is_int(p)):
            raise _invalid(f"prompt[{k}]", f"must be a string or a token id, got {describe(p)}")
        if _is_int(p) and not 0 <= p <= _TOKEN_ID_MAX:
            raise _invalid(f"prompt[{k}]", f"must be a token id (0 to {_TOKEN_ID_MAX}), got {p}")


def _given_max_tokens(
    body: Mapping[str, Any], cls: ClassConfig, fields: tuple[str, ...] = MAX_TOKENS_FIELDS, unread: tuple[str, ...] = ()
) -> tuple[int | None, int]:
    """(The generation limit llama-server reads, or None when the client set none; the most any
    limit field of the body asks for, the one read included.)

    `fields`: the names llama-server reads it from on this route, in its order (server-schema.cpp:
    the first present and not null wins); `unread`: names it drops on this route. llama-server
    refuses (400) the one it reads when that is not a number, or under -1, and so does the gate;
    a name it does not read it ignores, whatever it holds, and so does the gate, but a number
    there counts: the gate reserves the most of them, and -1 or a number over the class cap is
    refused wherever it is sent (a llama.cpp that read another name first would run past the
    reservation otherwise), so no spelling gets more than the gate reserved."""
    cap = cls.max_tokens_cap
    limit = f"0 to {cap}, the cap of class {cls.name!r}"
    read: int | None = None
    most = 0
    for name in (*fields, *unread):
        given = body.get(name)
        if given is None:
            continue
        value = _llama_int(given)
        first = read is None and name in fields
        if value is None or value < -1:
            if first:
                problem = (
                    f"must be an integer ({limit}), got {describe(given)}"
                    if value is None
                    else f"must be at least 0 ({limit}), got {value}"
                )
                raise _invalid(name, problem)
            continue  # a name llama-server does not read here: it ignores it, as would one that read it (400)
        if value == -1:  # llama-server reads -1 as "until the context is full"
            raise _invalid(name, f"-1 (unlimited) is not accepted: the gate needs a bound ({limit})")
        if value > cap:
            raise _invalid(name, f"must be at most {cap} (the cap of class {cls.name!r}), got {describe(value)}")
        if first:
            read = value
        most = max(most, value)
    return read, most
