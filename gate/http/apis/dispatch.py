"""Which adapter answers a route: the intake, stream reader and error shape of each admitted API, by
the route's ``Kind`` (the package docstring lists the adapters)."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from gate.core.errors import ErrorShape
from gate.data.endpoints import ENDPOINTS
from gate.http import intake
from gate.http.apis import anthropic, responses

if TYPE_CHECKING:
    from gate.backend.upstream import EventFormat
    from gate.config import Config
    from gate.data.endpoints import Kind
    from gate.http.intake import Intake
    from gate.http.tenants import Caller, TenantDirectory

#: the kinds these adapters take
KINDS = frozenset({"messages", "responses"})

_ANTHROPIC_PREFIX = "/v1/messages"


def parse_request(
    path: str,
    raw: bytes,
    headers: Mapping[str, str],
    client_host: str | None,
    config: Config,
    tenants: TenantDirectory,
    caller: Caller | None = None,
) -> Intake:
    """:func:`gate.http.intake.parse_request`, with the adapter's checks on its routes."""
    kind = ENDPOINTS.get(path)
    if kind in KINDS:
        return intake.parse_request(
            path, raw, headers, client_host, config, tenants, caller, build=build_intake, open_user=functools.partial(open_user, kind)
        )
    return intake.parse_request(path, raw, headers, client_host, config, tenants, caller)


def build_intake(kind: Kind, path: str, body: Mapping[str, Any], caller: Caller, config: Config) -> Intake:
    """The validated request of one of :data:`KINDS` (``ValueError`` for another kind)."""
    if kind == "messages":
        return anthropic.build(path, body, caller, config)
    if kind == "responses":
        return responses.build(path, body, caller, config)
    raise ValueError(f"not an API adapter's kind: {kind!r}")


def open_user(kind: Kind, body: Mapping[str, Any]) -> str | None:
    """The caller's own name in open mode, where the API says it (``user``, or Anthropic's
    ``metadata.user_id``)."""
    if kind == "messages":
        return anthropic.open_user(body)
    user = body.get("user")
    return user if isinstance(user, str) else None


def event_format(kind: Kind) -> EventFormat | None:
    """A new reader of the API's typed event stream, or None for the OpenAI chat/completions
    and llama's own streams (``data:`` lines only, read by the relay itself)."""
    if kind == "messages":
        return anthropic.MessagesEvents()
    if kind == "responses":
        return responses.ResponsesEvents()
    return None


def error_shape(path: str) -> ErrorShape:
    """The error body a caller of `path` reads: Anthropic's on its Messages routes
    (``/v1/messages`` and ``/v1/messages/count_tokens``), else OpenAI's."""
    if path == _ANTHROPIC_PREFIX or path.startswith(_ANTHROPIC_PREFIX + "/"):
        return "anthropic"
    return "openai"
