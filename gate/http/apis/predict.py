"""``POST /predict``: Vertex AI's prediction envelope, admitted instance by instance.

llama-server registers it only with ``AIP_MODE=PREDICTION`` (tools/server/server-http.cpp,
``register_gcp_compat``, at the version the project builds). The body is
``{"instances": [...]}``, at most 128; each instance is an object naming a route in
``@requestFormat``, either as a path (``"/v1/chat/completions"``) or as its camelCase alias
(``"chatCompletions"``: the path without ``/v1``, ``/``, ``-`` and ``_`` turned into capitals);
the rest of the instance is that route's body, run with ``stream`` false. llama-server runs all
instances in parallel and answers ``{"predictions": [...]}``.

So the gate admits the envelope for every instance at once: each instance on an admitted route
is checked and planned as that route's own request (its tasks, its generation limit, injected
when absent), and the envelope holds them all (a slot per task; every task reserved for the
largest generation limit among the instances, an upper bound). An instance naming an
operator-only route is refused (403) for a tenant that is not an operator, since llama-server
would run it behind the gate's back; one naming a generation route the gate cannot count yet
(Messages, Responses, transcriptions) is refused (400) rather than run outside admission;
other routes (``/tokenize``, ``/apply-template``, ...) cost nothing and go as sent, as does a
name llama-server does not know (it answers that instance with its own error).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeVar

from gate.core.errors import GateError
from gate.core.reasons import Reason
from gate.data.endpoints import ENDPOINTS, ROUTES, Kind


class _Part(Protocol):
    """What this module reads of an instance's intake (gate.http.intake.Intake is one)."""

    @property
    def body(self) -> dict[str, Any]: ...


P = TypeVar("P", bound=_Part)

__all__ = ["MAX_INSTANCES", "gcp_alias", "predict_parts"]

MAX_INSTANCES = 128  # llama-server's own limit


def gcp_alias(path: str) -> str:
    """llama-server's camelCase ``@requestFormat`` alias of a path (``path_to_gcp_format``)."""
    s = path[3:] if len(path) > 3 and path.startswith("/v1") else path
    s = s[1:] if s.startswith("/") else s
    out: list[str] = []
    cap = False
    for c in s:
        if c == ":":
            break
        if c in "/-_":
            cap = True
        else:
            out.append(c.upper() if cap else c)
            cap = False
    return "".join(out)


# First registration wins on a collision, as in llama-server (its handlers in route order).
_ALIASES: dict[str, str] = {}
for _route in ROUTES:
    if _route.method == "POST":
        _ALIASES.setdefault(gcp_alias(_route.path), _route.path)
_POST = {r.path: r for r in ROUTES if r.method == "POST"}
#: admitted kinds an envelope cannot hold: Messages and Responses are counted by their own
#: counting routes (gate/http/apis/dispatch.py), which take a whole request, not an instance
_NOT_IN_ENVELOPE = frozenset({"messages", "responses"})


def predict_parts(
    body: Mapping[str, Any],
    build: Callable[[Kind, str, Mapping[str, Any]], P],
    operator: bool,
) -> tuple[tuple[P, ...], dict[str, Any]]:
    """The admitted parts of a ``/predict`` body and the body to forward (limits injected)."""
    instances = body.get("instances")
    if not isinstance(instances, list):
        raise GateError(Reason.INVALID_REQUEST, "'instances' must be an array (the /predict envelope)", "instances")
    if len(instances) > MAX_INSTANCES:
        raise GateError(
            Reason.INVALID_REQUEST, f"'instances' holds {len(instances)}, llama-server takes at most {MAX_INSTANCES}", "instances"
        )
    parts: list[P] = []
    forwarded: list[Any] = []
    for k, instance in enumerate(instances):
        where = f"instances[{k}]"
        fmt = instance.get("@requestFormat") if isinstance(instance, dict) else None
        if not isinstance(fmt, str):
            forwarded.append(instance)  # llama-server answers this instance with its own error
            continue
        path = _ALIASES.get(fmt, fmt)
        route = _POST.get(path)
        kind = ENDPOINTS.get(path)
        if kind is not None and kind not in _NOT_IN_ENVELOPE:
            payload = {key: v for key, v in instance.items() if key != "@requestFormat"}
            payload.pop("stream", None)  # llama-server runs every instance unstreamed
            payload.pop("stream_options", None)
            try:
                part = build(kind, path, payload)
            except GateError as err:
                err.param = f"{where}.{err.param}" if err.param else where
                err.message = f"{where} ({fmt}): {err.message}"
                raise
            parts.append(part)
            forwarded.append({**part.body, "@requestFormat": fmt})
        elif route is not None and route.access == "operator" and not operator:
            raise GateError(
                Reason.OPERATOR_ONLY,
                f"{where} names {route.name}, which changes llama-server: only operators may call it",
                f"{where}.@requestFormat",
            )
        elif route is not None and route.generation:
            raise GateError(
                Reason.INVALID_REQUEST,
                f"{where} names {route.name}, which the gate cannot admit inside /predict yet; call the route itself",
                f"{where}.@requestFormat",
            )
        else:
            forwarded.append(instance)
    return tuple(parts), {**body, "instances": forwarded}
