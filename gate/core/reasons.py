"""Reason codes: the one vocabulary shared by HTTP errors, the journal and metrics.

Each value is the snake_case string of DESIGN.md "Outside contracts"; it is the
OpenAI-style error `code`, the journal's `reason` and the metric label alike.
A reason knows the HTTP status it is answered with and the journal outcome it
stands for; `gate.errors` turns one into a response.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

#: what became of a request, the journal's `outcome` column
#: ("forwarded": a route the gate relays without admission, gate/data/endpoints.py)
Outcome = Literal["admitted", "refused", "shed", "cancelled", "failed", "forwarded"]


class Reason(StrEnum):
    CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
    INVALID_REQUEST = "invalid_request"
    INVALID_API_KEY = "invalid_api_key"
    CLASS_NOT_ALLOWED = "class_not_allowed"
    OPERATOR_ONLY = "operator_only"  # a route that changes llama-server, asked by a tenant that is not an operator
    MODEL_NOT_FOUND = "model_not_found"
    CLIENT_STALLED = "client_stalled"
    BODY_TOO_LARGE = "body_too_large"
    QUEUE_FULL = "queue_full"
    QUEUE_TIMEOUT = "queue_timeout"
    TOKEN_BUDGET_EXCEEDED = "token_budget_exceeded"
    RATE_LIMITED = "rate_limited"
    TENANT_QUOTA = "tenant_quota"
    SHARED_LIMIT_UNAVAILABLE = "shared_limit_unavailable"
    CLASS_PAUSED = "class_paused"
    DRAINED = "drained"
    NO_BACKEND = "no_backend"
    MODEL_UNAVAILABLE = "model_unavailable"  # router mode: the model failed, or may not be loaded
    SHED_OVERRUN = "shed_overrun"
    SHUTTING_DOWN = "shutting_down"
    UPSTREAM_ERROR = "upstream_error"
    UPSTREAM_TIMEOUT = "upstream_timeout"
    # a fault in the gate itself (a bug): named for what it is, not blamed on llama-server
    INTERNAL_ERROR = "internal_error"

    @property
    def status(self) -> int:
        """The HTTP status this reason is answered with."""
        return _STATUS[self]

    @property
    def outcome(self) -> Outcome:
        """The journal outcome of a request that ends for this reason."""
        if self is Reason.SHED_OVERRUN:
            return "shed"
        if self is Reason.CLIENT_STALLED:
            return "cancelled"
        if self in (Reason.UPSTREAM_ERROR, Reason.UPSTREAM_TIMEOUT, Reason.INTERNAL_ERROR):
            return "failed"
        return "refused"


_STATUS: dict[Reason, int] = {
    Reason.CONTEXT_LENGTH_EXCEEDED: 400,
    Reason.INVALID_REQUEST: 400,
    Reason.INVALID_API_KEY: 401,
    Reason.CLASS_NOT_ALLOWED: 403,
    Reason.OPERATOR_ONLY: 403,
    Reason.MODEL_NOT_FOUND: 400,  # llama-server's router: 400 "model 'x' not found"
    Reason.CLIENT_STALLED: 408,
    Reason.BODY_TOO_LARGE: 413,
    Reason.QUEUE_FULL: 429,
    Reason.QUEUE_TIMEOUT: 429,
    Reason.TOKEN_BUDGET_EXCEEDED: 429,
    Reason.RATE_LIMITED: 429,
    Reason.TENANT_QUOTA: 429,
    Reason.SHARED_LIMIT_UNAVAILABLE: 429,  # [shared] fail_closed while Redis is out of reach
    Reason.CLASS_PAUSED: 503,
    Reason.DRAINED: 503,
    Reason.NO_BACKEND: 503,
    Reason.MODEL_UNAVAILABLE: 503,
    Reason.SHED_OVERRUN: 503,
    Reason.SHUTTING_DOWN: 503,
    Reason.UPSTREAM_ERROR: 502,
    Reason.UPSTREAM_TIMEOUT: 504,
    Reason.INTERNAL_ERROR: 500,
}

# Reasons a request ends with that are not errors answered to the client.
CLIENT_DISCONNECT = "client_disconnect"
