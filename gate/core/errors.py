"""The gate's one error type and its one renderer.

Like Starlette's `HTTPException(status_code, detail)`: whatever refuses or fails
a request (intake, tenants, the gatekeeper, rate limits, the upstream relay,
the client guard) raises a `GateError`; `render` turns it into the body and
headers of the caller's API, for the admitted path (proxy.py) and every other
route (server.py) alike: the OpenAI shape (`error_object`) everywhere but on the
Anthropic Messages routes, which get Anthropic's (`anthropic_error_object`,
``shape="anthropic"``), so an Anthropic client reads the error type it branches
and backs off on. Either shape carries the gate's reason as the error's `code`.

Messages go to clients: they never carry a backend's address or a secret (the
log and the journal keep the details).
"""

from __future__ import annotations

import json
import math
from typing import Literal, Protocol

from gate.core.reasons import Outcome, Reason


class Who(Protocol):
    """Who asked: what a refusal needs to name its tenant and class (`gate.http.tenants.Caller` is one)."""

    @property
    def tenant(self) -> str: ...

    @property
    def cls(self) -> str: ...


# The `type` OpenAI clients branch on, per status.
_TYPES: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",  # llama-server's own 404 says so ("File Not Found")
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    503: "unavailable_error",
}


# Anthropic's error types, per status (its API's "Errors" page): its SDK retries 408, 409,
# 429 and 5xx, honouring retry-after-ms and retry-after.
_ANTHROPIC_TYPES: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}

#: the API whose error body a caller reads
ErrorShape = Literal["openai", "anthropic"]


class GateError(Exception):
    """A request the gate refuses or could not complete.

    `status` overrides the reason's own status (a backend's 4xx relayed as is);
    `body` is the backend's own error body, relayed verbatim when present.
    """

    def __init__(
        self,
        reason: Reason,
        message: str,
        param: str | None = None,
        retry_after_s: float | None = None,
        *,
        status: int | None = None,
        body: bytes | None = None,
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.param = param
        self.retry_after_s = retry_after_s
        self.status = status if status is not None else reason.status
        self.body = body
        #: who asked, when known before the request was refused: the journal and the console
        #: then name its tenant and class
        self.caller: Who | None = None
        #: the backend's own response headers (CORS, its own) when `body` is its answer
        self.headers: list[tuple[bytes, bytes]] = []
        #: fields added to (or replacing) the error object's, e.g. llama-server's own context-error
        #: shape for never-fits (`type`, `n_prompt_tokens`, `n_ctx`); `code` stays the gate's reason
        self.extra: dict[str, object] = {}

    @property
    def outcome(self) -> Outcome:
        if self.reason is Reason.UPSTREAM_ERROR and (self.status < 500 or self.status == 501):
            # the backend refused it (say, its own context check), or cannot do it at all (501,
            # llama-server's not_supported_error: /v1/embeddings without --embeddings): nothing failed
            return "refused"
        return self.reason.outcome

    def __repr__(self) -> str:
        return f"GateError({self.reason.value!r}, {self.message!r}, param={self.param!r})"


def error_object(err: GateError) -> dict[str, object]:
    """`{"error": {"message", "type", "code", "param"}}`, plus `retry_after_s` where waiting helps."""
    body: dict[str, object] = {
        "error": {
            "message": err.message,
            "type": _TYPES.get(err.status, "invalid_request_error" if err.status < 500 else "server_error"),
            "code": err.reason.value,
            "param": err.param,
        }
    }
    if err.extra:
        body["error"].update({k: v for k, v in err.extra.items() if k != "code"})  # type: ignore[attr-defined]
    if err.retry_after_s is not None:
        body["retry_after_s"] = round(err.retry_after_s, 3)  # not 0.0030000000000001 (a trial's body)
    return body


def anthropic_error_object(err: GateError) -> dict[str, object]:
    """Anthropic's `{"type": "error", "error": {"type", "message"}}`, with the gate's reason as
    `error.code` and `retry_after_s` where waiting helps (extra fields its clients ignore)."""
    kind = _ANTHROPIC_TYPES.get(err.status, "invalid_request_error" if err.status < 500 else "api_error")
    body: dict[str, object] = {"type": "error", "error": {"type": kind, "message": err.message, "code": err.reason.value}}
    if err.retry_after_s is not None:
        body["retry_after_s"] = round(err.retry_after_s, 3)  # not 0.0030000000000001 (a trial's body)
    return body


def render(err: GateError, shape: ErrorShape = "openai") -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """Status, headers (content type, Retry-After, connection) and body of the error response,
    in the caller's API shape (a backend's own body is relayed as it is, whatever the shape).

    Header names are spelled as llama-server spells its own (`Content-Type`, `Connection`), and
    the gate's Retry-After as RFC 9110 does: the transport writes them so on the wire
    (gate/http/clientguard.py), for clients that look headers up in a case-sensitive dict."""
    # llama-server's answer relayed whole keeps its own content type, as it sent it
    relayed = err.headers if err.body is not None else []
    own_type = any(k.lower() == b"content-type" for k, _ in relayed)
    headers = [] if own_type else [(b"Content-Type", b"application/json")]
    if err.retry_after_s is not None:
        headers.append((b"Retry-After", str(max(1, math.ceil(err.retry_after_s))).encode()))
        headers.append((b"Retry-After-Ms", str(max(1, int(err.retry_after_s * 1000))).encode()))
    if err.reason in (Reason.BODY_TOO_LARGE, Reason.CLIENT_STALLED):
        # The unread rest of the body must not be read (and parsed) as the next request.
        headers.append((b"Connection", b"close"))
    shaped = anthropic_error_object(err) if shape == "anthropic" else error_object(err)
    body = err.body if err.body is not None else json.dumps(shaped).encode()
    headers.extend(relayed)  # llama-server's answer: its headers too (no framing ones)
    return err.status, headers, body
