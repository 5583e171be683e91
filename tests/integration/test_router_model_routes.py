"""Router mode, against a REAL llama-server router: a client's ``POST /models/load`` and
``/models/unload`` go through the gate's own model operations, so its units stay true (a model
loaded this way has slots and a budget in the gate; an unload with requests in flight is refused),
and llama-server's own view agrees."""

from __future__ import annotations

import math
from collections import Counter

import httpx
import pytest

from tests.integration.gate_harness import released, running_gate, wait_until
from tests.integration.test_router_mode import CHAT, NO_KEEPALIVE, backend, chat, config, listed, status, unit

pytestmark = pytest.mark.llama

TENANTS = """
[[tenants]]
name = "ops"
api_key_env = "OPS_KEY"
operator = true

[[tenants]]
name = "app"
api_key_env = "APP_KEY"
"""
OPS = {"Authorization": "Bearer ops-key"}
APP = {"Authorization": "Bearer app-key"}


async def test_a_client_load_and_unload_are_the_gates_own_model_operations(llama_router) -> None:
    router = llama_router(extra_args=("--no-models-autoload",))
    # the auto floor (min_tokens 0), as in the example config: see the console's floor below
    async with (
        running_gate(
            router.url,
            TENANTS + config().replace("min_tokens = 256", "min_tokens = 0"),
            kv="split",
            backend_extra=backend(),
            environ={"OPS_KEY": "ops-key", "APP_KEY": "app-key"},
        ) as gate,
        httpx.AsyncClient(timeout=60, limits=NO_KEEPALIVE) as client,
    ):
        await wait_until(lambda: status(gate, "tiny2") == "unloaded")
        # not an operator: 403 naming the route, nothing loaded
        r = await client.post(gate.url + "/models/load", json={"model": "tiny2"}, headers=APP)
        assert r.status_code == 403 and "POST /models/load" in r.text
        assert (await listed(client, router))["tiny2"] == "unloaded"

        r = await client.post(gate.url + "/models/load", json={"model": "tiny2"}, headers=OPS)
        assert r.status_code == 200 and r.json() == {"success": True}, r.text
        await wait_until(lambda: status(gate, "tiny2") == "loaded", timeout_s=60)
        assert unit(gate, "tiny2").admission.capacity.slots > 0  # the gate's unit knows it is loaded
        # no model named: llama-server's router answers 400 and its own /props; so does the gate
        # (it served the router's first model, and answered that model's /props)
        nameless = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        for path in (CHAT, "/completion", "/tokenize", "empty"):
            body = {"prompt": "hi", "n_predict": 2} if path == "/completion" else {"content": "hi"} if path == "/tokenize" else nameless
            if path == "empty":  # "model": "" is no model either, for the router
                path, body = CHAT, {**nameless, "model": ""}
            direct = await client.post(router.url + path, json=body)
            r = await client.post(gate.url + path, json=body, headers=OPS)
            assert r.status_code == direct.status_code == 400, (path, r.text, direct.text)
            assert r.json()["error"]["message"] == direct.json()["error"]["message"] == "model name is missing from the request", r.text
        props = await client.get(gate.url + "/props", headers=OPS)
        assert props.status_code == 200 and props.json()["role"] == "router", props.text
        # the model list: a tenant does not see the children's command lines (host paths, ports);
        # an operator sees the router's entries as they are
        for headers, shown in ((APP, False), (OPS, True)):
            entries = {e["id"]: e for e in (await client.get(gate.url + "/v1/models", headers=headers)).json()["data"]}
            assert entries["tiny2"]["status"]["value"] == "loaded"
            assert ("args" in entries["tiny2"]["status"]) is shown and ("preset" in entries["tiny2"]["status"]) is shown, entries
        # the console's floor counts the loaded model only: the others have no capacity yet (a
        # trial's header read budget 4,096 [268,436,480..4,096], and the retune form refused it)
        view = gate.snapshot().controller
        assert view.ceiling is not None and 0 < view.min_tokens <= view.ceiling, view
        # and the model never loaded shows no budget (its line read "budget 1,073,741,824/n/a")
        lines = {b.name: b for b in gate.snapshot().backends}
        assert lines["b0/tiny"].budget is None and lines["b0/tiny2"].budget == lines["b0/tiny2"].ceiling, lines
        assert (await listed(client, router))["tiny2"] == "loaded"
        audit = [a for a in gate.recent_audit if a.action == "POST /models/load"]
        assert len(audit) == 1 and audit[0].operator == "ops" and audit[0].target == "backend:b0/tiny2"

        # already loaded: refused with why, as llama-server refuses "model is already running"
        r = await client.post(gate.url + "/models/load", json={"model": "tiny2"}, headers=OPS)
        assert r.status_code == 400 and "already loaded" in r.json()["error"]["message"]
        # a model this gate does not serve: 404, never a load behind its back
        r = await client.post(gate.url + "/models/load", json={"model": "nope"}, headers=OPS)
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
        r = await client.post(gate.url + "/models/load", content=b"{not json", headers={**OPS, "content-type": "application/json"})
        assert r.status_code == 400

        # served through the gate, then unloaded through the gate's operation
        assert (await client.post(gate.url + CHAT, json=chat("tiny2"), headers=OPS)).status_code == 200
        await released(gate)
        r = await client.post(gate.url + "/models/unload", json={"model": "tiny2"}, headers=OPS)
        assert r.status_code == 200 and r.json() == {"success": True}, r.text
        await wait_until(lambda: status(gate, "tiny2") == "unloaded", timeout_s=30)

        async def router_says_unloaded() -> bool:
            return (await listed(client, router))["tiny2"] == "unloaded"

        await wait_until(router_says_unloaded, timeout_s=30)
        r = await client.post(gate.url + "/models/unload", json={"model": "tiny2"}, headers=OPS)
        assert r.status_code == 400 and "not loaded" in r.json()["error"]["message"]
        health = (await client.get(gate.url + "/health")).json()
        assert health["status"] == "ok" and health["loaded"] == {"b0": []}
        # every call journaled once, a refusal too (a trial found two rows per refusal, one
        # without the unit it named, and the denials counted twice)
        ids = Counter(r.request_id for r in gate.records if r.endpoint.startswith("POST /models/"))
        assert len(ids) == 7 and set(ids.values()) == {1}, ids

        # the router down: 503 as for any request, never its address or the connection error
        router.stop()
        await wait_until(lambda: gate.backends.configured[0].fleet.router_up is False, timeout_s=10)
        host_port = router.url.removeprefix("http://")
        for route in ("/models/load", "/models/unload"):
            r = await client.post(gate.url + route, json={"model": "tiny2"}, headers=OPS)
            assert r.status_code == 503 and r.json()["error"]["code"] == "no_backend", r.text
            assert host_port not in r.text and "Error" not in r.text, r.text
        # the audit holds the calls that happened, not the refused ones (they read as done)
        done = Counter(a.action for a in gate.recent_audit if a.action.startswith("POST /models/"))
        assert done == {"POST /models/load": 1, "POST /models/unload": 1}, done


async def test_a_router_with_no_model_listed_is_ready_forwards_reads_and_serves_no_model(llama_router) -> None:
    router = llama_router()
    async with (
        running_gate(router.url, config(), kv="split") as gate,
        httpx.AsyncClient(timeout=60, limits=NO_KEEPALIVE) as client,
    ):
        health = await client.get(gate.url + "/health")
        assert health.status_code == 200 and health.json()["backends"]["b0"]["state"] == "ready", health.text
        props = await client.get(gate.url + "/props")  # forwarded to the router itself
        assert props.status_code == 200 and props.json()["role"] == "router"
        r = await client.post(gate.url + CHAT, json=chat("tiny"))
        assert r.status_code == 400 and r.json()["error"]["code"] == "model_not_found"  # as the router's 400
        r = await client.post(gate.url + CHAT, json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        assert r.status_code == 400 and r.json()["error"]["message"] == "model name is missing from the request", r.text
        r = await client.post(gate.url + "/models/load", json={"model": "tiny"})
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
        # a forwarded call naming a model the gate does not list goes to the router, as it answers
        for method, path in (("DELETE", "/models?model=nope"), ("GET", "/props?model=tiny")):
            direct = await client.request(method, router.url + path + "&autoload=false")
            r = await client.request(method, gate.url + path, headers={"X-Request-Id": f"t21-{method}"})
            assert (r.status_code, r.content) == (direct.status_code, direct.content), (path, r.text)
            record = gate.records.find(f"t21-{method}")
            assert r.status_code >= 400 and record is not None and record.outcome == "forwarded", record  # nothing deleted or loaded
        assert (await listed(client, router)) == {"tiny": "unloaded", "tiny2": "unloaded"}  # nothing loaded behind its back
        await released(gate)


async def test_models_max_taken_by_pins_or_by_models_loaded_straight_refuses_at_once_and_evicts_nothing(llama_router) -> None:
    """Every --models-max place held by what the gate may not evict: a pinned model, or one
    loaded on the router straight that the gate does not serve. A trial's gate loaded tiny2
    into what it took for a free place and llama-server evicted the pinned model itself; with
    the pin alone filling the places, requests waited out their queue and were told to retry
    in a second, forever. Now: 503 model_unavailable at once, saying what holds the places."""
    # a pin filling the place, then more pins than places (tiny2, pinned too, is left out: it
    # waited out its queue as well)
    for pins in ('["tiny"]', '["tiny", "tiny2"]'):
        router = llama_router(models_max=1)
        async with (
            running_gate(router.url, config(), kv="split", backend_extra=backend(extra=f"pin = {pins}")) as gate,
            httpx.AsyncClient(timeout=60, limits=NO_KEEPALIVE) as client,
        ):
            await wait_until(lambda: status(gate, "tiny") == "loaded", timeout_s=60)
            r = await client.post(gate.url + CHAT, json=chat("tiny2"))
            assert r.status_code == 503 and r.json()["error"]["code"] == "model_unavailable", (pins, r.text)
            assert "tiny (pinned)" in r.json()["error"]["message"] and int(r.headers["retry-after"]) >= 30
            assert (await client.post(gate.url + CHAT, json=chat("tiny"))).status_code == 200
            await released(gate)

    router = llama_router(models_max=1)
    async with (
        running_gate(router.url, config(), kv="split", backend_extra=backend(models='["tiny2"]')) as gate,
        httpx.AsyncClient(timeout=60, limits=NO_KEEPALIVE) as client,
    ):
        assert (await client.post(router.url + "/models/load", json={"model": "tiny"})).status_code == 200

        async def tiny_loaded() -> bool:
            return (await listed(client, router))["tiny"] == "loaded"

        await wait_until(tiny_loaded, timeout_s=60)
        fleet = unit(gate, "tiny2").fleet
        await wait_until(lambda: fleet.held == ("tiny",), timeout_s=10)
        r = await client.post(gate.url + CHAT, json=chat("tiny2"))
        assert r.status_code == 503 and "tiny (loaded straight, not served by this gate)" in r.json()["error"]["message"], r.text
        assert await listed(client, router) == {"tiny": "loaded", "tiny2": "unloaded"}  # nothing evicted behind anyone's back
        await released(gate)


async def test_a_request_queued_for_a_model_not_loaded_is_counted_once_it_loads(llama_router) -> None:
    """Before its first load a model cannot count (asking would load it): the gate admits on an
    estimate, JSON bytes / 3 without the chat template. A trial's 31-message chat was estimated
    at 350 tokens and held 360 through its run although llama-server counted 776; a 61-message
    one estimated at 685 reached llama-server at 1,511 tokens, over the slot, and came back as
    its 400 (journaled upstream_error). Now the count settles the reservation at dispatch."""
    router = llama_router()
    many = [{"role": "user" if i % 2 == 0 else "assistant", "content": "hi"} for i in range(31)]
    async with (
        running_gate(router.url, config(), kv="split", backend_extra=backend()) as gate,
        httpx.AsyncClient(timeout=120, limits=NO_KEEPALIVE) as client,
    ):
        assert status(gate, "tiny2") == "unloaded"
        r = await client.post(
            gate.url + CHAT, json={"model": "tiny2", "messages": many, "max_tokens": 4}, headers={"X-Request-Id": "cold-1"}
        )
        assert r.status_code == 200, r.text
        await released(gate)
        record = gate.records.find("cold-1")
        assert record is not None and record.token_count_source == "exact", record
        assert record.prompt_tokens == r.json()["usage"]["prompt_tokens"], (record, r.json()["usage"])

        # one that never fits the slot once counted: the gate's own 400, before llama-server
        await client.post(router.url + "/models/unload", json={"model": "tiny2"})
        await wait_until(lambda: status(gate, "tiny2") == "unloaded", timeout_s=30)
        longer = [{"role": "user" if i % 2 == 0 else "assistant", "content": "hi"} for i in range(91)]
        r = await client.post(
            gate.url + CHAT, json={"model": "tiny2", "messages": longer, "max_tokens": 4}, headers={"X-Request-Id": "cold-2"}
        )
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
        record = gate.records.find("cold-2")
        assert record is not None and record.reason == "context_length_exceeded" and record.token_count_source == "exact", record
        await released(gate)


async def test_an_estimate_over_the_slot_is_not_refused_before_the_count(llama_router) -> None:
    """A model not loaded cannot count: its requests hold the estimate (JSON bytes / 3), about
    twice English text. A trial's 290-token chat with max_tokens 16 on 512-token slots was
    refused as 514 + 16 > 512: at the load, to a model never loaded, and at once, to one loaded
    before. It fits, so it is served, counted at dispatch."""
    router = llama_router()
    text = " ".join(["hello"] * 600)
    body = {"model": "tiny2", "messages": [{"role": "user", "content": text}], "max_tokens": 16}
    async with (
        running_gate(router.url, config(), kv="split", backend_extra=backend()) as gate,
        httpx.AsyncClient(timeout=120, limits=NO_KEEPALIVE) as client,
    ):
        slot = None
        for attempt in ("never-loaded", "loaded-before"):
            assert status(gate, "tiny2") == "unloaded", attempt
            r = await client.post(gate.url + CHAT, json=body, headers={"X-Request-Id": f"est-{attempt}"})
            assert r.status_code == 200, (attempt, r.text)
            real = r.json()["usage"]["prompt_tokens"]
            slot = unit(gate, "tiny2").admission.capacity.slot_context
            record = gate.records.find(f"est-{attempt}")
            assert record.token_count_source == "exact" and record.prompt_tokens == real, record
            assert len(text.encode()) // 3 + 16 > slot > real + 16, (
                len(text) // 3,
                slot,
                real,
            )  # the estimate would not fit; the count does
            await released(gate)
            await client.post(router.url + "/models/unload", json={"model": "tiny2"})
            await wait_until(lambda: status(gate, "tiny2") == "unloaded", timeout_s=30)
        assert slot is not None


async def test_a_model_unloaded_outside_the_gate_is_a_503_and_loaded_again(llama_router) -> None:
    """A model unloaded on the router straight (or its process killed) between two of the gate's
    reads of GET /models: the request it dispatched got llama-server's 400 "model is not loaded",
    relayed, and the client was told its request was wrong (a trial). Now 503 model_unavailable
    with Retry-After, the model list read again at once, and the next request loads it."""
    router = llama_router()
    async with (
        running_gate(router.url, config(), kv="split", backend_extra=backend()) as gate,
        httpx.AsyncClient(timeout=120, limits=NO_KEEPALIVE) as client,
    ):
        assert (await client.post(gate.url + CHAT, json=chat("tiny2"))).status_code == 200
        await released(gate)
        fleet = unit(gate, "tiny2").fleet
        fleet._next_refresh = math.inf  # the gate has not read GET /models since: the race, made certain
        assert (await client.post(router.url + "/models/unload", json={"model": "tiny2"})).status_code == 200

        async def router_says_unloaded() -> bool:
            return (await listed(client, router))["tiny2"] == "unloaded"

        await wait_until(router_says_unloaded, timeout_s=30)
        assert status(gate, "tiny2") == "loaded"  # what the gate still believes
        r = await client.post(gate.url + CHAT, json=chat("tiny2"))
        assert r.status_code == 503 and r.json()["error"]["code"] == "model_unavailable", r.text
        assert int(r.headers["retry-after"]) >= 1 and "no longer loaded" in r.json()["error"]["message"]
        await wait_until(lambda: status(gate, "tiny2") == "unloaded", timeout_s=10)  # read again at once
        assert (await client.post(gate.url + CHAT, json=chat("tiny2"))).status_code == 200
        await released(gate)
