"""Backend capacity from /props, model routing, and the probe's state machine."""

from __future__ import annotations

import httpx
import pytest

from gate.backend.pool import BackendPool, capacity_from_props
from gate.config import BackendConfig, parse_config
from gate.core.admission import TenantPolicy

PROPS = {"total_slots": 4, "default_generation_settings": {"n_ctx": 512}}


def test_split_kv_ceiling_is_slots_times_per_slot_context():
    cap = capacity_from_props(PROPS, BackendConfig(kv="split"))
    assert (cap.slots, cap.slot_context, cap.ceiling) == (4, 512, 2048)


def test_unified_kv_ceiling_is_the_shared_pool_each_slot_reports():
    cap = capacity_from_props({**PROPS, "default_generation_settings": {"n_ctx": 2048}}, BackendConfig(kv="unified"))
    assert (cap.slots, cap.slot_context, cap.ceiling) == (4, 2048, 2048)


def test_configured_token_budget_overrides_the_ceiling_and_prefill_limit_passes_through():
    cap = capacity_from_props(PROPS, BackendConfig(kv="split", token_budget=1000, max_prefill_tokens=300))
    assert cap.ceiling == 1000 and cap.max_prefill_tokens == 300


@pytest.mark.parametrize("props", [{}, {"total_slots": 0, "default_generation_settings": {"n_ctx": 5}}, {"total_slots": 4}])
def test_props_without_slots_or_context_are_rejected(props):
    with pytest.raises(ValueError):
        capacity_from_props(props, BackendConfig())


def pool(toml: str, handler=None) -> BackendPool:
    config = parse_config(toml)
    transport = httpx.MockTransport(handler or (lambda request: httpx.Response(404)))
    return BackendPool(
        config.backends,
        httpx.AsyncClient(transport=transport),
        classes=config.classes,
        tenant_policy=lambda _t: TenantPolicy(),
        environ={"UP_KEY": "secret"},
    )


TWO = """
[[backends]]
name = "big"
url = "http://big:8080"
models = ["llama-70b"]
api_key_env = "UP_KEY"
[[backends]]
name = "small"
url = "http://small:8080"
models = ["llama-8b", "qwen"]
"""


def test_routing_by_declared_model_and_first_backend_when_absent():
    p = pool(TWO)
    assert p.route("qwen").name == "small"
    assert p.route("llama-70b").name == "big"
    assert p.route(None).name == "big"
    assert p.route("unknown") is None  # every backend declares its models: 404


def test_backend_without_declared_models_catches_unknown_models():
    p = pool(TWO + '\n[[backends]]\nname = "any"\nurl = "http://any:8080"\n')
    assert p.route("whatever").name == "any"


def test_upstream_key_comes_from_the_environment_variable():
    p = pool(TWO)
    assert p.by_name("big").auth_headers() == {"Authorization": "Bearer secret"}
    assert p.by_name("small").auth_headers() == {}


async def test_probe_moves_through_loading_ready_and_down_and_builds_the_gatekeeper():
    state = {"health": 503}

    def fake_llama(request: httpx.Request) -> httpx.Response:  # a fake upstream (unit test only)
        if state["health"] is None:
            raise httpx.ConnectError("refused", request=request)
        if request.url.path == "/health":
            return httpx.Response(state["health"], json={})
        return httpx.Response(200, json=PROPS)

    p = pool('[[backends]]\nurl = "http://llama:8080"\nkv = "split"\n', fake_llama)
    backend = p.backends[0]
    await p.probe(backend)
    assert backend.state == "loading" and backend.gatekeeper is None
    state["health"] = 200
    await p.probe(backend)
    assert backend.state == "ready"
    assert backend.admission.capacity.ceiling == 2048
    assert p.any_ready
    state["health"] = None
    await p.probe(backend)
    assert backend.state == "down" and "ConnectError" in backend.detail
    assert backend.gatekeeper is not None  # kept: in-flight work still needs its ledger


async def test_one_health_probe_that_times_out_leaves_a_ready_backend_ready_and_two_mark_it_down():
    # A probe's timeout counts the gate's own stalls too: three gates whose loop stalled 2.28 s
    # each marked a healthy llama-server down (503 no_backend to every caller until the next probe).
    state = {"health": "ok"}

    def fake_llama(request: httpx.Request) -> httpx.Response:  # a fake upstream (unit test only)
        if request.url.path == "/health" and state["health"] == "timeout":
            raise httpx.ReadTimeout("timed out", request=request)
        if request.url.path == "/health" and state["health"] == "refused":
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(200, json={} if request.url.path == "/health" else PROPS)

    p = pool('[[backends]]\nurl = "http://llama:8080"\nkv = "split"\n', fake_llama)
    backend = p.backends[0]
    await p.probe(backend)
    assert backend.state == "ready"
    state["health"] = "timeout"
    await p.probe(backend)
    assert backend.state == "ready" and backend.detail == "ok"  # one timeout: no verdict
    state["health"] = "ok"
    await p.probe(backend)
    state["health"] = "timeout"
    await p.probe(backend)
    assert backend.state == "ready"  # the count starts again after an answer
    await p.probe(backend)
    assert backend.state == "down" and "ReadTimeout" in backend.detail  # a hung llama-server: the second in a row
    state["health"] = "ok"
    await p.probe(backend)
    assert backend.state == "ready"
    state["health"] = "refused"
    await p.probe(backend)
    assert backend.state == "down" and "ConnectError" in backend.detail  # a refused connection: at once


def test_the_floor_and_the_reservations_follow_a_backend_whose_pool_changes():
    # llama-server restarted with a smaller -c: the controller kept the first pool's floor
    # (a quarter of 8,192), clamped to the new ceiling of 1,024, so it had no room; and the
    # reservations in force (R0) must follow the new ceiling as well.
    from gate.core.admission import Capacity

    p = pool(
        '[[backends]]\nname = "a"\nurl = "http://a:8080"\n'
        "[classes.interactive]\npriority = 10\nreserved_tokens = 1024\n[classes.batch]\npriority = 1\n"
    )
    (b,) = p
    p.apply_capacity(b, Capacity(slots=4, slot_context=2048, ceiling=8192))
    assert b.controller is not None and b.admission is not None
    assert (b.controller.min_tokens, b.controller.ceiling_tokens) == (2048, 8192)
    assert b.admission.reserved("interactive") == 1024
    p.apply_capacity(b, Capacity(slots=2, slot_context=512, ceiling=1024))
    assert b.admission.reserved("interactive") == 512
    assert (b.controller.min_tokens, b.controller.ceiling_tokens) == (512, 1024)  # room: 512..1024
    b.controller.set_budget(0.0, 600)  # the controller had closed to near its floor
    p.apply_capacity(b, Capacity(slots=4, slot_context=2048, ceiling=8192))  # and back
    assert (b.controller.min_tokens, b.admission.reserved("interactive")) == (2048, 1024)
    # A new llama-server starts at the ceiling, as at the gate's start (a trial: the budget left
    # at the old pool's 1,024, the new floor and interactive's reservation: batch was refused
    # with every slot idle)...
    assert b.controller.budget == b.admission.budget == 8192
    # ... unless an operator's budget holds (frozen): then it is only clamped
    b.controller.set_budget(0.0, 3000)
    b.controller.freeze()
    p.apply_capacity(b, Capacity(slots=2, slot_context=512, ceiling=1024))
    p.apply_capacity(b, Capacity(slots=4, slot_context=2048, ceiling=8192))
    # clamped to 1,024, then back to the operator's 3,000, not reseated at the ceiling (7: a
    # trial's frozen 1,200 stayed at a smaller pool's 1,024 for good)
    assert b.controller.budget == 3000


def test_config_check_backends_says_1_slot_not_1_slots(monkeypatch):
    # A first-day trial's `-np 1` server: `config check --backends` printed "1 slots of 2048 tokens".
    from gate.backend.pool import check_backend
    from gate.config import DEFAULT_CLASSES, BudgetConfig

    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            return httpx.Response(200, json={"status": "ok"})
        return httpx.Response(200, json={"total_slots": 1, "default_generation_settings": {"n_ctx": 2048}})

    real = httpx.Client
    monkeypatch.setattr(httpx, "Client", lambda **kw: real(transport=httpx.MockTransport(handle), **kw))
    line, _, _ = check_backend(
        BackendConfig(url="http://llama:8080"), BudgetConfig(), DEFAULT_CLASSES, environ={}, args_finder=lambda url: None
    )
    assert line.startswith("1 slot of 2048 tokens, kv unified"), line
