"""Reason codes: the one vocabulary shared by HTTP errors, the journal and metrics.

Each value is the snake_case string of DESIGN.md "Outside contracts"; it is the
OpenAI-style error `code`, the journal's `reason` and the metric label alike.
"""

from __future__ import annotations

from enum import StrEnum


class Reason(StrEnum):
    CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
    INVALID_REQUEST = "invalid_request"
    INVALID_API_KEY = "invalid_api_key"
    CLASS_NOT_ALLOWED = "class_not_allowed"
    MODEL_NOT_FOUND = "model_not_found"
    BODY_TOO_LARGE = "body_too_large"
    QUEUE_FULL = "queue_full"
    QUEUE_TIMEOUT = "queue_timeout"
    TOKEN_BUDGET_EXCEEDED = "token_budget_exceeded"
    RATE_LIMITED = "rate_limited"
    TENANT_QUOTA = "tenant_quota"
    CLASS_PAUSED = "class_paused"
    DRAINED = "drained"
    NO_BACKEND = "no_backend"
    SHED_OVERRUN = "shed_overrun"
    SHUTTING_DOWN = "shutting_down"
    UPSTREAM_ERROR = "upstream_error"
    UPSTREAM_TIMEOUT = "upstream_timeout"

    @property
    def status(self) -> int:
        """The HTTP status this reason is answered with."""
        return _STATUS[self]

    @property
    def retryable(self) -> bool:
        """True when waiting can change the answer (the response carries Retry-After)."""
        return self in _RETRYABLE


_STATUS: dict[Reason, int] = {
    Reason.CONTEXT_LENGTH_EXCEEDED: 400,
    Reason.INVALID_REQUEST: 400,
    Reason.INVALID_API_KEY: 401,
    Reason.CLASS_NOT_ALLOWED: 403,
    Reason.MODEL_NOT_FOUND: 404,
    Reason.BODY_TOO_LARGE: 413,
    Reason.QUEUE_FULL: 429,
    Reason.QUEUE_TIMEOUT: 429,
    Reason.TOKEN_BUDGET_EXCEEDED: 429,
    Reason.RATE_LIMITED: 429,
    Reason.TENANT_QUOTA: 429,
    Reason.CLASS_PAUSED: 503,
    Reason.DRAINED: 503,
    Reason.NO_BACKEND: 503,
    Reason.SHED_OVERRUN: 503,
    Reason.SHUTTING_DOWN: 503,
    Reason.UPSTREAM_ERROR: 502,
    Reason.UPSTREAM_TIMEOUT: 504,
}

_RETRYABLE = frozenset(
    {
        Reason.QUEUE_FULL,
        Reason.QUEUE_TIMEOUT,
        Reason.TOKEN_BUDGET_EXCEEDED,
        Reason.RATE_LIMITED,
        Reason.CLASS_PAUSED,
        Reason.DRAINED,
        Reason.NO_BACKEND,
        Reason.SHUTTING_DOWN,
    }
)


_ERROR_TYPES: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    502: "server_error",
    503: "unavailable_error",
    504: "server_error",
}


def error_body(
    reason: Reason, message: str, *, param: str | None = None, retry_after_s: float | None = None, status: int | None = None
) -> dict[str, object]:
    """The OpenAI-shaped error object, plus `retry_after_s` where waiting helps."""
    body: dict[str, object] = {
        "error": {
            "message": message,
            "type": _ERROR_TYPES.get(status or reason.status, "server_error"),
            "code": reason.value,
            "param": param,
        }
    }
    if retry_after_s is not None:
        body["retry_after_s"] = retry_after_s
    return body
