"""The admitted endpoints: which paths the gate admits, and the kind of API each one speaks.

Plain data, read by the HTTP side (which routes and validates) and by the backend side (which
shapes the upstream body and its stream by kind).
"""

from __future__ import annotations

from typing import Literal

Kind = Literal["chat", "completions", "completion"]

ENDPOINTS: dict[str, Kind] = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/completion": "completion",
}
