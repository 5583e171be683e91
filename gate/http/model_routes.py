"""Router mode: a client's ``POST /models/load`` and ``POST /models/unload`` are the gate's own
model operations (gate/fleet/model_ops.py), never forwarded blind.

A load asked of llama-server behind the gate's back would leave the gate's unit for that model
believing it unloaded (no slots, no budget) and could evict a model the gate is relaying to; an
unload could kill a model with requests in flight. So when a configured backend is a router, the
two routes do what the console's load and unload do: the same checks (already loaded, pinned,
requests in flight, ``--models-max`` with every loaded model busy), the same plan (which model to
evict), the gate's own load through its model loop. The answer is llama-server's own shape,
``{"success": true}`` (the load goes on in the background, as llama-server's does); a refusal is
a 400 saying why, a model no router of this gate serves a 404 (``model_not_found``). They stay
operator routes (403 for other tenants, each call audited). A gate with no router forwards them
as llama-server answers them.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from gate.backend.upstream import RETRY_DOWN_S
from gate.core.errors import GateError
from gate.core.reasons import Reason
from gate.fleet import model_ops
from gate.fleet.router_mode import ModelFleet

if TYPE_CHECKING:
    from gate.backend.pool import Backend, BackendPool

#: route name -> the model operation
MODEL_ROUTES = {"POST /models/load": "load", "POST /models/unload": "unload"}


def handled_here(route_name: str, backends: BackendPool) -> bool:
    """True when the gate runs this route itself: a model route, and some backend is a router."""
    return route_name in MODEL_ROUTES and any(b.fleet is not None for b in backends.configured)


def model_unit(backends: BackendPool, body: bytes) -> Backend:
    """The router-mode unit the body's ``model`` names, or the refusal."""
    try:
        parsed = json.loads(body) if body else None
    except (ValueError, UnicodeDecodeError):
        raise GateError(Reason.INVALID_REQUEST, "the body is not valid JSON", "model") from None
    model = parsed.get("model") if isinstance(parsed, dict) else None
    if not isinstance(model, str) or not model:
        raise GateError(Reason.INVALID_REQUEST, "'model' must name the model to load or unload", "model")
    unit = backends.route(model)
    if unit is None or unit.fleet is None or unit.model != model:
        served = sorted(m for b in backends.configured if b.fleet is not None for m in b.fleet.units)
        raise GateError(
            Reason.MODEL_NOT_FOUND,
            f"model {model[:100]!r} is not one this gate serves (its routers' [[backends]] models: {', '.join(served) or 'none'})",
            "model",
            status=404,
        )
    return unit


def apply(unit: Backend, route_name: str) -> dict[str, bool]:
    """Load or unload the unit's model through the gate's model operations; llama-server's answer."""
    fleet, model = unit.fleet, unit.model
    assert isinstance(fleet, ModelFleet) and model is not None  # model_unit checked both
    if not fleet.router_up:
        # 503 as for any request while the router is down; the reason (its address, the
        # connection error) is for the log and the console, never for a client (a trial got
        # "400 ... cannot be loaded: router down: ConnectError: 127.0.0.1:21001 ...")
        raise GateError(Reason.NO_BACKEND, f"the router serving model {model!r} is unreachable", "model", retry_after_s=RETRY_DOWN_S)
    try:
        if MODEL_ROUTES[route_name] == "load":
            model_ops.load(fleet, model)
        else:
            model_ops.unload(fleet, model)
    except ValueError as exc:
        raise GateError(Reason.INVALID_REQUEST, str(exc), "model") from None
    return {"success": True}
