"""Backend faults (#11): a dead backend means 502/503 with Retry-After on every request, and its
address only in the log.

Before the fix the first request after the backend died got a 502 without
Retry-After whose body said ``127.0.0.1:18080: [Errno 111] Connection refused``.
A llama-server of the test's own is killed, requests go out before the probe
notices, then it is started again on the same port and the gate serves again.
"""

from __future__ import annotations

import io
import json
import os
import signal

import httpx
import pytest

from gate.journal.export import export
from tests.integration.gate_harness import released, running_gate, wait_until
from tests.integration.hardening import AUTH, BACKEND_EXTRA, CHAT, ENV, TENANTS, chat, still_serves
from tests.llama.server import LlamaServer

pytestmark = pytest.mark.llama

REQUESTS = [
    ("POST", CHAT, chat(4)),
    ("POST", CHAT, chat(4, stream=True)),
    ("POST", "/completion", {"model": "tiny", "prompt": "hi", "n_predict": 4}),
    ("POST", "/tokenize", {"content": "hi"}),
    ("GET", "/props", None),
    ("GET", "/slots", None),
]


def assert_down_answer(r: httpx.Response, port: int) -> None:
    assert r.status_code in (502, 503), (r.status_code, r.text)
    assert int(r.headers["retry-after"]) >= 1, r.headers
    assert r.json()["error"]["code"] in ("no_backend", "upstream_error"), r.text
    assert "127.0.0.1" not in r.text and str(port) not in r.text and "Errno" not in r.text, r.text


async def test_backend_down_every_answer_has_retry_after_and_no_address(llama_bin, tiny_model, tmp_path):
    server = LlamaServer(llama_bin, tiny_model, mode="split", ctx=2048, n_slots=4, log_path=tmp_path / "llama.log")
    server.start()
    port = server.port
    # A slow probe: the requests below reach the gate before it knows the backend is gone.
    async with (
        running_gate(server.url, TENANTS, environ=ENV, kv="split", backend_extra=BACKEND_EXTRA, probe_interval_s=30.0) as gate,
        httpx.AsyncClient(timeout=30) as client,
    ):
        try:
            await still_serves(gate, client)
            os.kill(server._proc.pid, signal.SIGKILL)  # LlamaServer keeps its Popen private
            await wait_until(lambda: not server.running, timeout_s=10)
            for method, path, body in REQUESTS:
                r = await client.request(method, gate.url + path, json=body, headers=AUTH)
                assert_down_answer(r, port)
            health = await client.get(gate.url + "/health")
            assert "127.0.0.1" not in health.text and str(port) not in health.text
            await released(gate)
            # Back on the same port: the gate serves again once its probe sees it.
            server.stop()
            revived = LlamaServer(llama_bin, tiny_model, mode="split", ctx=2048, n_slots=4, log_path=tmp_path / "llama2.log", port=port)
            revived.start()
            server = revived
            await gate.backends.probe_all()
            await still_serves(gate, client)
        finally:
            server.stop()


async def test_llama_server_refusing_the_gates_key_is_a_502_not_the_clients_401(llama_bin, tiny_model, tmp_path):
    # The gate sends its own key (api_key_env) in place of the client's: when llama-server's
    # --api-key changed under it, its 401 "Invalid API Key" was relayed, telling a client whose
    # tenant key is valid that its key was invalid (an SDK raises AuthenticationError, no retry).
    server = LlamaServer(
        llama_bin, tiny_model, mode="split", ctx=1024, n_slots=2, extra_args=("--api-key", "key-a"), log_path=tmp_path / "a.log"
    )
    server.start()
    port = server.port
    environ = {**ENV, "UP_KEY": "key-a"}
    extra = BACKEND_EXTRA + '\napi_key_env = "UP_KEY"'
    async with (
        running_gate(server.url, TENANTS, environ=environ, kv="split", backend_extra=extra, probe_interval_s=30.0) as gate,
        httpx.AsyncClient(timeout=30) as client,
    ):
        try:
            await still_serves(gate, client)
            server.stop()  # back on the same port with another key; the probe has not looked yet
            server = LlamaServer(
                llama_bin,
                tiny_model,
                mode="split",
                ctx=1024,
                n_slots=2,
                extra_args=("--api-key", "key-b"),
                log_path=tmp_path / "b.log",
                port=port,
            )
            server.start()
            for method, path, body in (("POST", CHAT, chat(4)), ("POST", CHAT, chat(4, stream=True)), ("GET", "/props", None)):
                r = await client.request(method, gate.url + path, json=body, headers=AUTH)
                assert r.status_code == 502, (path, r.status_code, r.text)
                assert r.json()["error"]["code"] == "upstream_error" and "Invalid API Key" not in r.text, r.text
            await released(gate)
        finally:
            server.stop()


OPEN = """
[classes.interactive]
priority = 10
[classes.batch]
priority = 1
"""


async def test_an_open_gate_before_a_keyed_llama_server_asks_clients_for_its_key(llama_bin, tiny_model, tmp_path):
    # Without [[tenants]] the gate was open while it sent llama-server's --api-key with every
    # request: a key-protected llama-server behind it answered anyone, its operator routes too
    # (POST /slots/0?action=erase reached it; a trial). Now a client presents the key it would
    # present to llama-server straight, as llama-server asks for it.
    server = LlamaServer(
        llama_bin, tiny_model, mode="split", ctx=1024, n_slots=2, extra_args=("--api-key", "key-a"), log_path=tmp_path / "a.log"
    )
    server.start()
    extra = BACKEND_EXTRA + '\napi_key_env = "UP_KEY"'
    try:
        async with (
            running_gate(server.url, OPEN, environ={"UP_KEY": "key-a"}, kv="split", backend_extra=extra) as gate,
            httpx.AsyncClient(timeout=30) as client,
        ):
            requests = [*REQUESTS, ("GET", "/v1/models", None), ("POST", "/slots/0?action=erase", {})]
            for headers in ({}, {"Authorization": "Bearer key-b"}, {"X-Api-Key": "nope"}):
                for method, path, body in requests:
                    r = await client.request(method, gate.url + path, json=body, headers=headers)
                    straight = await client.request(method, server.url + path, json=body, headers=headers)
                    assert (r.status_code, straight.status_code) == (401, 401), (path, headers, r.text, straight.text)
                    assert r.json()["error"]["code"] == "invalid_api_key" and "key-a" not in r.text, r.text
            for headers in ({"Authorization": "Bearer key-a"}, {"X-Api-Key": "key-a"}):
                r = await client.post(gate.url + CHAT, json=chat(4), headers=headers)
                assert r.status_code == 200, r.text
                r = await client.get(gate.url + "/props", headers=headers)
                assert r.status_code == 200 and "default_generation_settings" in r.json(), r.text
            # probes and scrapers stay open, as with tenants; /v1/health too, as llama-server answers it
            assert (await client.get(gate.url + "/health")).status_code == 200
            health = await client.get(gate.url + "/v1/health")
            assert health.status_code == (await client.get(server.url + "/v1/health")).status_code == 200, health.text
            assert (await client.get(gate.url + "/metrics")).status_code == 200
            await released(gate)
    finally:
        server.stop()


async def test_llama_servers_refusal_of_an_admitted_request_is_journaled_with_its_status_and_type(llama_bin, tiny_model, tmp_path):
    # llama-server's 400 for a caller's mistake was journaled refused / upstream_error with an
    # empty detail: a trial read callers' typos as backend faults. The detail now says the
    # status and llama-server's error type, never its message (it may quote the request).
    server = LlamaServer(llama_bin, tiny_model, mode="split", ctx=1024, n_slots=2, log_path=tmp_path / "a.log")
    server.start()
    journal = str(tmp_path / "journal.db")
    try:
        async with (
            running_gate(server.url, OPEN, kv="split", backend_extra=BACKEND_EXTRA, journal_path=journal) as gate,
            httpx.AsyncClient(timeout=30) as client,
        ):
            body = {"prompt": [999999], "n_predict": 3, "user": "typo"}
            r = await client.post(gate.url + "/completion", json=body)
            straight = await client.post(server.url + "/completion", json=body)
            assert (r.status_code, r.json()) == (straight.status_code, straight.json()), (r.text, straight.text)
            kind = straight.json()["error"]["type"]
            await released(gate)
        out = io.StringIO()
        export(journal, out, fmt="json")
        (row,) = [row for row in map(json.loads, out.getvalue().splitlines()) if row["tenant"] == "typo"]
        assert (row["outcome"], row["http_status"]) == ("refused", straight.status_code), row
        assert row["detail"] == f"backend answered {straight.status_code} ({kind})", row
    finally:
        server.stop()


async def test_an_operators_budget_is_clamped_by_a_smaller_llama_server_said_and_back_with_the_pool(llama_bin, tiny_model, tmp_path):
    # A trial froze the budget at 1,200 on a 2,048 pool, restarted llama-server with -c 1024 and
    # again with 2,048: the budget became 1,024 with no audit row, the console still saying
    # 1,200, and stayed at 1,024 for good. Now the clamp is audited and the 1,200 comes back.
    from gate.data.commands import Retune
    from gate.ops.control import Operator

    def start(ctx: int, name: str, port: int | None = None) -> LlamaServer:
        s = LlamaServer(llama_bin, tiny_model, mode="split", ctx=ctx, n_slots=2, log_path=tmp_path / name, port=port)
        s.start()
        return s

    server = start(2048, "a.log")
    port = server.port
    budget_rows = lambda: [a for a in gate.recent_audit if a.action == "budget_ceiling_changed"]  # noqa: E731
    try:
        async with running_gate(server.url, OPEN, kv="split", backend_extra=BACKEND_EXTRA, probe_interval_s=30.0) as gate:
            (backend,) = gate.backends
            assert backend.capacity.ceiling == 2048
            gate.control.execute(Retune(budget=1200, freeze=True), operator=Operator("ops", "local"))
            assert backend.admission.budget == 1200
            for ctx, name, expected in ((1024, "b.log", 1024), (2048, "c.log", 1200)):
                server.stop()
                await gate.backends.probe_all()  # down
                server = start(ctx, name, port)
                await gate.backends.probe_all()  # back, another pool
                assert backend.capacity.ceiling == ctx
                assert backend.admission.budget == expected, (ctx, backend.admission.budget)
            clamped, back = budget_rows()
            assert (clamped.old_value, clamped.new_value) == ("1200", "1024")
            assert "operator's budget of 1200" in clamped.note and "until they allow 1200 again" in clamped.note, clamped.note
            assert (back.old_value, back.new_value) == ("1024", "1200") and "in force again" in back.note, back.note
            assert gate.control.overrides.lines()  # the operator's word is still the override
    finally:
        server.stop()
