"""The router-mode shell (gate/fleet/router_mode.py) on a FAKE llama-server router (an httpx transport)
and a hand-driven clock: the transitions the real one is slow or awkward to show (back-off
after failures, autoload off, a model that vanishes, a sleeping model, the first load's
context). The real router is in tests/integration/test_router_mode.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import httpx
import pytest

from gate.backend.gatekeeper import Refused
from gate.config import parse_config
from gate.core.errors import GateError
from gate.core.ledger import Request
from gate.core.reasons import Reason
from gate.data.commands import CommandError, ModelAction
from gate.fleet.router_mode import FAIL_BACKOFF_S
from gate.ops.control import Operator
from gate.service import GateService

CONFIG = """
[budget]
mode = "static"
min_tokens = 256
[[backends]]
name = "r"
url = "http://router:8080"
models = ["a", "b"]
kv = "split"
{extra}
[classes.interactive]
priority = 10
queue_depth = 4
queue_timeout_s = 30
"""


class FakeRouter:
    """GET /models, /props (router or ?model=), POST /models/load|unload, /tokenize."""

    def __init__(self, autoload: bool = True, models_max: int = 4) -> None:
        self.models: dict[str, dict[str, Any]] = {"a": {"value": "unloaded"}, "b": {"value": "unloaded"}}
        self.autoload, self.models_max = autoload, models_max
        self.calls: list[str] = []
        self.up = True
        self.awake = asyncio.Event()  # /tokenize answers once set (a sleeping child wakes first)
        self.awake.set()

    async def handle(self, request: httpx.Request) -> httpx.Response:
        path, model = request.url.path, request.url.params.get("model")
        self.calls.append(f"{request.method} {path}" + (f"?{request.url.query.decode()}" if request.url.query else ""))
        if not self.up:
            raise httpx.ConnectError("refused", request=request)
        if path == "/health":
            return httpx.Response(200, json={"status": "ok"})
        if path == "/props" and model is None:
            return httpx.Response(
                200,
                json={
                    "role": "router",
                    "max_instances": self.models_max,
                    "models_autoload": self.autoload,
                    "default_generation_settings": {"n_ctx": 0},
                },
            )
        if path == "/props":
            if self.models[model]["value"] != "loaded":
                return httpx.Response(400, json={"error": {"code": 400, "message": "model is not loaded"}})
            return httpx.Response(200, json={"total_slots": 2, "default_generation_settings": {"n_ctx": 512}, "model_path": ""})
        if path == "/models":
            return httpx.Response(200, json={"data": [{"id": k, "status": dict(v)} for k, v in self.models.items()]})
        if path in ("/models/load", "/models/unload", "/tokenize"):
            name = json.loads(await request.aread())["model"]
            if path == "/tokenize":
                await self.awake.wait()
            elif path == "/models/load":
                self.models[name] = {"value": "loading"}
            elif path == "/models/unload":
                self.models[name] = {"value": "unloaded"}
            return httpx.Response(200, json={"success": True})
        return httpx.Response(400, json={"error": {"code": 400, "message": "model is not loaded"}})


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def gate_on(router: FakeRouter, extra: str = "") -> tuple[GateService, Clock]:
    clock = Clock()
    gate = GateService(parse_config(CONFIG.format(extra=extra)), environ={}, transport=httpx.MockTransport(router.handle), clock=clock)
    await gate.backends.probe_all()
    return gate, clock


async def close(gate: GateService) -> None:
    for b in gate.backends:
        if b.gatekeeper is not None:
            b.gatekeeper.close()
    await gate.client.aclose()


def request(rid: str, cost: int = 100) -> Request:
    return Request(rid, "interactive", "t", 10, cost - 10, 0.0)


async def test_a_router_becomes_one_held_unit_per_configured_model() -> None:
    router = FakeRouter()
    gate, _ = await gate_on(router)
    try:
        assert [b.name for b in gate.backends] == ["r/a", "r/b"]
        fleet = gate.backends.configured[0].fleet
        assert fleet.max_loaded == 4 and fleet.autoload
        assert {m: i.status for m, i in fleet.info.items()} == {"a": "unloaded", "b": "unloaded"}
        a = gate.backends.route("a")
        assert a.capacity is None and a.admission.capacity.slots == 0  # held: no slots until loaded
        assert gate.backends.route(None) is a  # no model named: the router's first model
        assert gate.backends.route("zzz") is None
        assert gate.backends.any_ready  # requests may queue for a loadable model
        assert not any(c.startswith("POST") for c in router.calls)  # nothing loaded by probing
    finally:
        await close(gate)


async def test_queued_requests_load_the_model_and_one_that_never_fits_its_context_is_refused() -> None:
    router = FakeRouter()
    gate, _ = await gate_on(router)
    try:
        fleet, a = gate.backends.configured[0].fleet, gate.backends.route("a")
        small = asyncio.create_task(a.gatekeeper.acquire(request("small", 100)))
        huge = asyncio.create_task(a.gatekeeper.acquire(request("huge", 600)))  # the slot holds 512
        await asyncio.sleep(0)
        assert a.admission.waiting() == 2
        await fleet.step()
        assert router.calls[-1] == "POST /models/load" and fleet.info["a"].status == "loading"
        router.models["a"] = {"value": "loaded"}
        await fleet.refresh()
        ticket = await small
        assert ticket.request.id == "small"
        with pytest.raises(Refused) as err:
            await huge
        assert err.value.reason.value == "context_length_exceeded" and "512" in err.value.message
        assert (a.capacity.slots, a.capacity.slot_context) == (2, 512)
        assert fleet.info["a"].loads == 1 and any(x.action == "model_loaded" for x in gate.recent_audit)
        a.gatekeeper.release(ticket)
    finally:
        await close(gate)


async def test_a_failed_model_is_refused_with_retry_after_and_retried_with_growing_back_off(caplog: pytest.LogCaptureFixture) -> None:
    router = FakeRouter()
    gate, clock = await gate_on(router)
    try:
        fleet, a = gate.backends.configured[0].fleet, gate.backends.route("a")
        router.models["a"] = {"value": "loaded"}
        await fleet.refresh()
        t1 = asyncio.create_task(a.gatekeeper.acquire(request("t1")))
        t2 = asyncio.create_task(a.gatekeeper.acquire(request("t2")))
        await asyncio.sleep(0)
        waiting = asyncio.create_task(a.gatekeeper.acquire(request("w1")))
        await asyncio.sleep(0)
        assert a.admission.waiting() == 1  # two slots busy, one waits
        router.models["a"] = {"value": "unloaded", "failed": True, "exit_code": 1}
        await fleet.refresh()
        with pytest.raises(Refused) as err:
            await waiting
        assert err.value.reason.value == "model_unavailable" and err.value.retry_after_s == FAIL_BACKOFF_S
        with pytest.raises(GateError) as now:
            fleet.check(a)
        assert "exited with code 1" in now.value.message and now.value.status == 503
        for t in (t1, t2):
            a.gatekeeper.release(await t)
        clock.now += FAIL_BACKOFF_S
        fleet.check(a)  # due again: requests may queue and load it
        queued = asyncio.create_task(a.gatekeeper.acquire(request("w2")))
        await asyncio.sleep(0)
        await fleet.step()
        assert fleet.info["a"].status == "loading"
        router.models["a"] = {"value": "unloaded", "failed": True, "exit_code": 1}
        await fleet.refresh()
        assert fleet.info["a"].retry_at - clock.now == 2 * FAIL_BACKOFF_S  # the second failure in a row
        with pytest.raises(Refused):
            await queued
        assert [x.action for x in gate.recent_audit].count("model_failed") == 2
        # a failed load is a WARNING in the log (it was INFO, among the loads)
        assert [r.levelno for r in caplog.records if "model_failed" in r.getMessage()] == [logging.WARNING] * 2
    finally:
        await close(gate)


async def test_autoload_off_refuses_unloaded_models_but_an_operator_or_a_pin_loads_them() -> None:
    router = FakeRouter(autoload=False)
    gate, _ = await gate_on(router, 'pin = ["b"]')
    try:
        fleet, a = gate.backends.configured[0].fleet, gate.backends.route("a")
        with pytest.raises(GateError) as err:
            fleet.check(a)
        assert "--no-models-autoload" in err.value.message
        await fleet.step()
        assert fleet.info["b"].status == "loading" and fleet.info["b"].load_cause == "pinned"
        router.models["b"] = {"value": "loaded"}
        await fleet.refresh()
        (result,) = gate.control.execute(ModelAction("a", "load"), operator=Operator("op", "local"))
        assert result.action == "model_load" and result.new_value == "loading"
        fleet.check(a)  # asked: it may queue now
        await fleet.step()
        assert fleet.info["a"].status == "loading" and fleet.info["a"].load_cause == "operator"
    finally:
        await close(gate)


async def test_operator_commands_are_validated_whole() -> None:
    router = FakeRouter(models_max=1)
    gate, _ = await gate_on(router)
    op = Operator("op", "local")
    try:
        fleet, a = gate.backends.configured[0].fleet, gate.backends.route("a")
        with pytest.raises(CommandError, match="not a router-mode model"):
            gate.control.execute(ModelAction("zzz", "load"), operator=op)
        with pytest.raises(CommandError, match="not loaded"):
            gate.control.execute(ModelAction("a", "unload"), operator=op)
        router.models["a"] = {"value": "loaded"}
        await fleet.refresh()
        ticket = await a.gatekeeper.acquire(request("busy"))
        with pytest.raises(CommandError, match="1 requests in flight"):
            gate.control.execute(ModelAction("a", "unload"), operator=op)
        with pytest.raises(CommandError, match="a busy"):
            gate.control.execute(ModelAction("b", "load"), operator=op)  # models_max 1, a busy
        a.gatekeeper.release(ticket)
        (pin,) = gate.control.execute(ModelAction("a", "pin"), operator=op)
        assert (pin.old_value, pin.new_value) == ("False", "True")
        with pytest.raises(CommandError, match="pinned"):
            gate.control.execute(ModelAction("a", "unload"), operator=op)
        gate.control.execute(ModelAction("a", "unpin"), operator=op)
        (unload,) = gate.control.execute(ModelAction("a", "unload"), operator=op)
        assert fleet.info["a"].status == "evicting" and unload.action == "model_unload"
        await asyncio.sleep(0.01)  # the unload call
        await fleet.refresh()
        assert fleet.info["a"].status == "unloaded" and fleet.info["a"].evictions == 0  # an operator's, not the gate's
        # an unload whose child exits non-zero (seen: exit code 1 on a loaded host) is an unload,
        # not a failure that refuses the model 503 for the back-off
        router.models["a"] = {"value": "loaded"}
        await fleet.refresh()
        gate.control.execute(ModelAction("a", "unload"), operator=op)
        await asyncio.sleep(0.01)
        router.models["a"] = {"value": "unloaded", "failed": True, "exit_code": 1}
        await fleet.refresh()
        assert fleet.info["a"].status == "unloaded"
        fleet.check(a)  # loadable at once
    finally:
        await close(gate)


async def test_a_model_the_router_no_longer_lists_is_refused_and_its_waiters_too() -> None:
    router = FakeRouter()
    gate, _ = await gate_on(router)
    try:
        fleet, b = gate.backends.configured[0].fleet, gate.backends.route("b")
        waiting = asyncio.create_task(b.gatekeeper.acquire(request("w")))
        await asyncio.sleep(0)
        del router.models["b"]
        await fleet.refresh()
        with pytest.raises(Refused) as err:
            await waiting
        assert err.value.reason.value == "model_unavailable"
        with pytest.raises(GateError, match="lists no model 'b'"):
            fleet.check(b)
    finally:
        await close(gate)


async def test_a_sleeping_model_is_woken_by_one_task_while_its_requests_wait() -> None:
    router = FakeRouter()
    gate, _ = await gate_on(router)
    try:
        fleet, a = gate.backends.configured[0].fleet, gate.backends.route("a")
        router.models["a"] = {"value": "loaded"}
        await fleet.refresh()
        router.models["a"] = {"value": "sleeping"}
        await fleet.refresh()
        assert a.admission.capacity.slots == 0 and a.capacity.slots == 2  # held, capacity remembered
        waiting = asyncio.create_task(a.gatekeeper.acquire(request("w")))
        await asyncio.sleep(0)
        router.awake.clear()
        await fleet.step()
        await asyncio.sleep(0.01)
        assert "POST /tokenize?autoload=false" in router.calls  # one task wakes it
        await fleet.refresh()  # still sleeping as far as the router says: waking goes on
        assert fleet.info["a"].status == "loading" and a.admission.waiting() == 1
        router.models["a"] = {"value": "loaded"}
        router.awake.set()
        await asyncio.sleep(0.01)
        await fleet.refresh()
        a.gatekeeper.release(await waiting)
        assert fleet.info["a"].loads == 1
    finally:
        await close(gate)


async def test_a_router_that_goes_down_takes_its_units_down() -> None:
    router = FakeRouter()
    gate, _ = await gate_on(router)
    try:
        router.up = False
        await gate.backends.probe_all()
        a = gate.backends.route("a")
        assert a.state == "down" and not gate.backends.any_ready
        with pytest.raises(GateError) as err:
            a.fleet.check(a)
        assert err.value.reason.value == "no_backend" and "router:8080" not in err.value.message
        router.up = True
        await gate.backends.probe_all()
        await a.fleet.refresh()
        assert gate.backends.any_ready and a.state == "unloaded"
    finally:
        await close(gate)


async def test_a_router_without_configured_models_is_up_and_serves_no_model() -> None:
    # llama-server's router with nothing to serve answers /health 200; so does the gate, and
    # every model is refused (404) until [[backends]] models lists it.
    router = FakeRouter()
    config = parse_config('[[backends]]\nname = "r"\nurl = "http://router:8080"\n')
    gate = GateService(config, environ={}, transport=httpx.MockTransport(router.handle))
    await gate.backends.probe_all()
    try:
        assert list(gate.backends) == []  # no units
        (r,) = gate.backends.configured
        assert r.state == "ready" and "[[backends]] models" in r.detail and r.fleet is not None
        assert r.fleet.router_up
        assert gate.backends.route("tiny") is None
    finally:
        await close(gate)


def test_a_model_command_crosses_the_wire_and_a_bad_one_is_refused_whole() -> None:
    from gate.data.commands import from_wire, to_wire

    command = ModelAction("tiny2", "pin", note="keep it warm")
    wire = to_wire(command)
    assert wire == {"v": 1, "op": "model", "model": "tiny2", "action": "pin", "note": "keep it warm"}
    assert from_wire(json.loads(json.dumps(wire))) == command
    with pytest.raises(CommandError, match="action must be load or unload or pin or unpin"):
        from_wire({**wire, "action": "delete"})
    with pytest.raises(CommandError, match="unknown field"):
        from_wire({**wire, "force": True})


async def test_retune_and_freeze_reach_units_whose_capacity_is_not_known_yet() -> None:
    from gate.data.commands import Freeze, Retune

    router = FakeRouter()
    gate, _ = await gate_on(router)
    op = Operator("op", "local")
    try:
        gate.control.execute(Retune(settings={"slo_ttft_p95_ms": 900.0}), operator=op)
        gate.control.execute(Freeze(True), operator=op)
        for b in gate.backends:
            assert b.capacity is None and b.controller.frozen
            assert b.controller.settings.slo_ttft_p95_s == 0.9
        assert gate.snapshot().controller.budget is None  # no unit's budget is known: none is summed
    finally:
        await close(gate)


async def test_model_metrics_take_only_configured_names() -> None:
    router = FakeRouter()
    gate, _ = await gate_on(router)
    try:
        gate.model_metrics.rerouted("a", "b", "saturated")
        gate.model_metrics.rerouted("x" * 500, "b", "because")
        text = gate.metrics.render()[0].decode()
        assert 'tokengate_model_reroutes_total{from_model="a",to_model="b",why="saturated"} 1.0' in text
        assert 'tokengate_model_reroutes_total{from_model="other",to_model="b",why="other"} 1.0' in text
        assert 'tokengate_model_status{backend="r",model="a",status="unloaded"} 1.0' in text
        assert "x" * 50 not in text
    finally:
        await close(gate)


async def test_a_refusal_while_the_model_loads_retries_after_its_remaining_measured_load_time() -> None:
    router = FakeRouter()
    gate, clock = await gate_on(router, "cold_start_s = 0")
    try:
        fleet, a = gate.backends.configured[0].fleet, gate.backends.route("a")
        waiters = [asyncio.create_task(a.gatekeeper.acquire(request(f"w{i}"))) for i in range(4)]  # queue_depth 4
        await asyncio.sleep(0)
        await fleet.step()  # loading, started now
        clock.now += 1.0
        with pytest.raises(Refused) as full:
            await a.gatekeeper.acquire(request("one-too-many"))
        assert full.value.reason.value == "queue_full"
        fleet.refused(a, full.value)
        assert full.value.retry_after_s == 30.0  # the class's own wait bound says more than a guess of 10 s
        clock.now += 5.0
        router.models["a"] = {"value": "loaded"}
        await fleet.refresh()
        assert fleet.info["a"].last_load_s == 6.0  # from the load call to the refresh that saw it
        for w in waiters:
            a.gatekeeper.release(await w)
        err = GateError(Reason.QUEUE_FULL, "x", retry_after_s=1.0)
        fleet.refused(a, err)
        assert err.retry_after_s == 1.0  # loaded: the queue's own estimate stands
        fleet._set("a", "loading", "")  # noqa: SLF001 - as if it were reloading, 2 s in
        fleet.info["a"].load_started = clock.now - 2.0
        fleet.refused(a, err)
        assert err.retry_after_s == 4.0  # 6 s measured, 2 s gone
    finally:
        await close(gate)
