"""The console's look in one table: what each outcome, state and level is drawn in.

Every widget and screen takes its colours from here, so one thing looks the same
everywhere (the live tail drew a refused request bold red and the review drew it
yellow). Rich style strings; the `?` screen's legend (console/screens/help.py) says
what the levels mean.
"""

from __future__ import annotations

#: a decision's outcome, in the live tail and in the review
OUTCOME = {"admitted": "green", "refused": "bold red", "shed": "magenta", "cancelled": "dim", "failed": "red", "forwarded": "cyan"}

#: a backend's state (header, capacity panel); router mode adds a model's own "unloaded"
#: and "sleeping" (loaded on demand, not a fault)
BACKEND_STATE = {"ready": "bold green", "loading": "bold yellow", "down": "bold red", "unloaded": "dim", "sleeping": "cyan"}

#: a router-mode model's status (models panel and dialog)
MODEL_STATUS = {
    "loaded": "bold green",
    "loading": "bold yellow",
    "evicting": "yellow",
    "unloaded": "dim",
    "sleeping": "cyan",
    "failed": "bold red",
    "missing": "bold red",
    "unknown": "dim",
}

#: badges: a word on a background, for a state that changes what the console or gate does
WARN_BADGE = "bold black on yellow"  # READ-ONLY, PAUSED class, shared limits failing open
ALARM_BADGE = "bold white on red"  # journal trouble, gate stopping, failing closed, deferred > 0
NOTE_BADGE = "bold black on cyan"  # the controller FROZEN
VIEW_PAUSED_BADGE = "bold white on blue"  # rendering paused (the gate goes on)

#: the gate's label in the header: what it is in front of
LABEL = {"LIVE": "bold black on green", "SIMULATED": "bold black on magenta", "REVIEW": "bold black on cyan"}

#: shared tenant limits (Redis): ok, or the failure policy applying; "off" is drawn quiet
SHARED = {"off": "dim", "ok": "bold green", "fail_open": WARN_BADGE, "fail_closed": ALARM_BADGE}


#: the empty part of a bar (capacity, KV)
BAR_EMPTY = "grey37"


def http_status_style(status: int) -> str:
    """5xx red, 4xx yellow, the rest plain."""
    return "red" if status >= 500 else "yellow" if status >= 400 else ""


def fill_style(frac: float, *, full: str = "bold red") -> str:
    """How full a bar or share is: green below 70%, yellow below 90%, then `full`."""
    return "green" if frac < 0.7 else "yellow" if frac < 0.9 else full


def ttft_style(p95_ms: float | None, slo_ms: float | None) -> str:
    """green below 0.7 x SLO, yellow up to the SLO, red above it."""
    if p95_ms is None or not slo_ms:
        return "dim"
    if p95_ms < 0.7 * slo_ms:
        return "green"
    if p95_ms <= slo_ms:
        return "yellow"
    return "bold red"
