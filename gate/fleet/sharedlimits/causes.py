"""Why Redis did not decide: the short cause that /health, the log and the audit say. Pure.

A trial's /health said "Redis unreachable" for every cause: a Redis slow to answer, one that
refused the connection, and one that refused the gate's password, which is a config mistake
and no outage (that gate served every tenant at its whole quota on top of the fleet, for
ever). Each cause is said here once, in the words an operator acts on; the I/O layer
(:mod:`.client`) tells which one an exception is (:func:`gate.fleet.sharedlimits.client.cause_of`).

Kinds: ``slow`` (no answer within the bound), ``refused`` (the connection was refused:
nothing listens there), ``unreachable`` (no route, no such host or socket, the connection
dropped), ``auth`` (Redis refused the gate's credentials, its user's rights, or the
database the URL names: a config mistake; at start the gate refuses to run, :class:`SharedStartError`),
``error`` (Redis answered with another error). No text here holds a password: Redis's own
words are passed through :func:`scrub` first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal
from urllib.parse import unquote, urlsplit

__all__ = ["Cause", "CauseKind", "SharedStartError", "scrub", "slow"]

CauseKind = Literal["slow", "refused", "unreachable", "auth", "error"]

#: what /health says while degraded when no cause was recorded (never expected)
UNKNOWN = "Redis could not decide"


@dataclass(frozen=True, slots=True)
class Cause:
    """``text``: the short cause (/health's note); ``detail``: Redis's or the socket's own
    words, for the log and the audit (never a password)."""

    kind: CauseKind
    text: str
    detail: str = ""
    #: what to change, for a cause that is a config mistake (kind ``auth``)
    hint: str = ""

    def why(self, where: str) -> str:
        """The cause for the log and the audit row: ``text (where: detail)``."""
        said = f"{where}: {self.detail}" if self.detail else where
        return f"{self.text} ({said})" if said else self.text


def slow(bound_ms: float) -> Cause:
    """No answer within ``bound_ms`` of the gate's attention (:mod:`.heard`)."""
    return Cause("slow", f"Redis did not answer within {bound_ms:g} ms")


def scrub(text: str, url: str) -> str:
    """``text`` with the password of ``url`` cut out, should it ever quote it (Redis's and
    redis-py's messages do not, as seen; this keeps it so if one ever does)."""
    try:
        password = urlsplit(url).password
    except ValueError:
        return text
    if not password:
        return text
    for secret in sorted({password, unquote(password)}, key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


class SharedStartError(Exception):
    """``[shared] redis_url`` names a Redis that refuses this gate (credentials, rights, the
    database index): a config mistake, not an outage. ``tokengate serve`` exits 2 with it."""
