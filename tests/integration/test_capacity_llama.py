"""Capacity from the real llama-server: the KV layout learned, and contradictions said.

`-np 4 -c 2048` (the README's server) without `-kvu` has four slots of 512 tokens each and
2,048 in all; the gate's default config must not count them as one pool of 512.
"""

from __future__ import annotations

import asyncio
import io
from argparse import Namespace
from pathlib import Path

import httpx
import pytest

from gate.cli import _cmd_config_check
from tests.integration.gate_harness import running_gate, wait_until

pytestmark = pytest.mark.llama

CLASSES = """
[budget]
min_tokens = 1024
[classes.interactive]
priority = 2
reserved_tokens = 1024
default_max_tokens = 256
[classes.batch]
priority = 1
default_max_tokens = 256
"""


async def health(gate) -> dict:
    async with httpx.AsyncClient(timeout=10) as client:
        return (await client.get(gate.url + "/health")).json()["backends"]["b0"]


async def test_default_config_learns_the_split_pool_of_the_readme_server(llama_split):
    # no kv key: the default; gate_toml writes the one given, so give the default's value
    async with running_gate(llama_split.url, CLASSES, kv="auto") as gate:
        await gate.backends.probe_all()
        (b,) = gate.backends
        assert b.capacity.ceiling == 2048
        assert (b.layout.kv, b.layout.source) == ("split", "process")
        assert b.warnings == ()
        h = await health(gate)
        assert h["ceiling"] == 2048 and h["kv"] == {"layout": "split", "source": "process"}
        assert h["reserved"] == {"interactive": {"configured": 1024, "in_force": 1024}}  # half: kept whole (R0)
        assert "warnings" not in h


async def test_the_start_up_line_says_the_capacity_in_words(llama_split, caplog):
    """A trial read `capacity=Capacity(slots=4, slot_context=1024, ceiling=4096, ...,
    pool=None)` in the log of a gate whose pool was 4,096: a dataclass's repr, where
    `pool=None` read as "no pool". The line now says it as `config check --backends` does."""
    caplog.set_level("INFO", logger="tokengate.backends")
    async with running_gate(llama_split.url, CLASSES, kv="auto") as gate:
        await gate.backends.probe_all()
    lines = [r.getMessage() for r in caplog.records if r.name == "tokengate.backends" and "ready" in r.getMessage()]
    assert any("4 slots of 512 tokens, ceiling 2048, kv split (process:" in line for line in lines), lines
    assert not any("Capacity(" in line for line in lines)


async def test_an_operator_unified_on_a_split_server_is_overridden_and_said(llama_split):
    async with running_gate(llama_split.url, CLASSES, kv="unified") as gate:
        await gate.backends.probe_all()
        (b,) = gate.backends
        assert b.capacity.ceiling == 2048
        h = await health(gate)
        assert any('config says kv = "unified"' in w for w in h["warnings"])
        view = next(v for v in gate.snapshot().backends if v.name == "b0")
        assert view.kv == "split" and view.warnings == b.warnings


async def test_where_the_layout_cannot_be_learned_every_contradiction_is_in_health_and_snapshot(llama_split):
    async with running_gate(llama_split.url, CLASSES, kv="auto") as gate:
        gate.backends._args_finder = lambda url: None  # a remote llama-server: no command line to read
        (b,) = gate.backends
        b.state, b.layout = "down", None
        await gate.backends.probe_all()
        assert b.capacity.ceiling == 512 and b.layout.source == "assumed"
        h = await health(gate)
        text = "\n".join(h["warnings"])
        assert "assuming unified, ceiling 512" in text and "2048" in text
        assert "min_tokens 1024 is above the ceiling 512" in text
        assert "class reservations (interactive 1024) are over 50% of the ceiling 512" in text  # 256 in force (R0)
        assert h["reserved"] == {"interactive": {"configured": 1024, "in_force": 256}}  # for probes, not only in words
        assert "a batch request may hold at most 256 tokens, not its default_max_tokens 256" in text
        assert "default_max_tokens 256 is not below" not in text  # 256 fits a slot of 512


async def test_a_default_max_tokens_that_fills_a_slot_is_noted_at_start_not_warned(llama_split, caplog):
    """Such a request starts and is served (the gate lowers its limit to what its slot holds
    after the prompt): a note in the log, not a warning in /health or on the console."""
    caplog.set_level("INFO", logger="tokengate.backends")
    async with running_gate(
        llama_split.url,
        CLASSES.replace("default_max_tokens = 256\n[classes.batch]", "default_max_tokens = 512\n[classes.batch]"),
        kv="auto",
    ) as gate:
        await gate.backends.probe_all()
        h = await health(gate)
        assert not any("default_max_tokens" in w for w in h.get("warnings", ()))
        (b,) = gate.backends
        assert any("classes.interactive.default_max_tokens 512 fills one slot's context 512" in n for n in b.notes)
        snap = gate.snapshot()
        assert snap.controller.min_tokens <= snap.controller.ceiling  # the floor in force, never inverted
    logged = [r.getMessage() for r in caplog.records if "note: classes.interactive.default_max_tokens 512" in r.getMessage()]
    assert len(logged) == 1, logged  # once, not on every probe


def test_config_check_of_the_example_against_the_readme_server_exits_0_with_a_note(llama_split, tmp_path: Path):
    """#25, tried as a user: `tokengate config example` on the README's `-np 4 -c 2048` exited 1
    (batch's default_max_tokens 512 fills a slot of 512): the defaults must pass their own check."""
    from gate.config.example import EXAMPLE_CONFIG

    f = tmp_path / "tokengate.toml"
    f.write_text(EXAMPLE_CONFIG.replace('url = "http://127.0.0.1:8080"', f'url = "{llama_split.url}"'))
    assert llama_split.url in f.read_text()
    out, err = io.StringIO(), io.StringIO()
    rc = _cmd_config_check(Namespace(file=str(f), verbose=False, backends=True), out, err)
    text = out.getvalue()
    assert rc == 0, text
    assert "warning:" not in text
    assert "note: backend default: classes.batch.default_max_tokens 512 fills one slot's context 512" in text


def test_config_check_against_the_running_backend_says_what_contradicts_it(llama_split, tmp_path: Path):
    f = tmp_path / "tokengate.toml"
    f.write_text(CLASSES + f'\n[[backends]]\nname = "b0"\nurl = "{llama_split.url}"\nkv = "unified"\n')
    out, err = io.StringIO(), io.StringIO()
    rc = _cmd_config_check(Namespace(file=str(f), verbose=False, backends=True), out, err)
    text = out.getvalue()
    assert rc == 1, text
    assert "4 slots of 512 tokens, kv split" in text and "ceiling 2048" in text
    assert "the adaptive budget moves within 1024..2048" in text  # min_tokens 1024: the floor as a number
    assert 'warning: backend b0: config says kv = "unified"' in text
    f.write_text(CLASSES + f'\n[[backends]]\nname = "b0"\nurl = "{llama_split.url}"\n')
    out = io.StringIO()
    assert _cmd_config_check(Namespace(file=str(f), verbose=False, backends=True), out, err) == 0, out.getvalue()


async def test_a_class_default_that_does_not_fit_a_slot_is_lowered_to_what_fits(llama_split):
    # Slots of 512 and batch's default_max_tokens 512: straight at llama-server a request with no
    # limit is served (it generates until the slot is full); the gate refused it 400 for a
    # max_tokens the client never sent (a trial of the built-in defaults on the README's server).
    # Now the default it injects is what fits after the prompt; a limit the client gave is its own.
    classes = CLASSES.replace("priority = 1\ndefault_max_tokens = 256", "priority = 1\ndefault_max_tokens = 512")
    async with running_gate(llama_split.url, classes, kv="auto") as gate:
        await gate.backends.probe_all()
        body = {"messages": [{"role": "user", "content": "hello there"}], "ignore_eos": True}
        # up to ~470 tokens decoded with ignore_eos: 60 s was too short twice on a loaded 2-core host
        async with httpx.AsyncClient(timeout=300) as client:
            r = await client.post(gate.url + "/v1/chat/completions", json=body, headers={"X-Tokengate-Class": "batch"})
            assert r.status_code == 200, r.text
            usage = r.json()["usage"]
            assert usage["prompt_tokens"] + usage["completion_tokens"] <= 512
            r = await client.post(
                gate.url + "/v1/chat/completions", json={**body, "max_tokens": 512}, headers={"X-Tokengate-Class": "batch"}
            )
            assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
        (b,) = gate.backends
        assert b.gatekeeper.admission.ledger.in_flight == 0


@pytest.fixture
def capped_unified(llama_bin, tiny_model, tmp_path):
    """`-c 8192 -np 4 -kvu` on the tiny model, trained for 4,096 tokens: llama-server logs
    "n_ctx_slot = 4096, kv_unified = 'true'": one pool of 8,192 whose slots are each capped at 4,096."""
    from tests.llama.server import LlamaServer

    server = LlamaServer(llama_bin, tiny_model, mode="unified", ctx=8192, n_slots=4, threads=1, log_path=tmp_path / "capped.log")
    server.start()
    try:
        yield server
    finally:
        server.stop()


async def test_a_unified_pool_with_slots_capped_below_it_is_admitted_to_the_pool_never_beyond(capped_unified):
    """An on-call trial: counted as split (4 x 4,096 >= 8,192) the ceiling was 16,384, and four
    2,600-token requests admitted together all failed with llama-server's 'Context size has been
    exceeded'. The pool is the whole -c, each request at most one slot's 4,096: three run at
    once (7,800 tokens), the fourth waits in the gate, not in llama-server's overflowing cache."""
    assert capped_unified.n_ctx == 4096 and capped_unified.kv_unified is True  # the server's own view
    async with running_gate(capped_unified.url, CLASSES, kv="auto") as gate, httpx.AsyncClient(timeout=60) as client:
        await gate.backends.probe_all()
        (b,) = gate.backends
        assert (b.layout.kv, b.capacity.ceiling, b.capacity.slot_context) == ("unified", 8192, 4096), b.layout.detail
        adm = b.admission
        body = {"prompt": " ".join(["hello"] * 40), "n_predict": 2560, "ignore_eos": True, "stream": True}
        sent = [asyncio.create_task(client.post(gate.url + "/completion", json=body)) for _ in range(4)]
        try:
            await wait_until(lambda: len(adm.ledger) == 3 and adm.waiting() == 1, timeout_s=30)
            assert adm.ledger.in_flight <= 8192
        finally:
            for task in sent:
                task.cancel()
            await asyncio.gather(*sent, return_exceptions=True)
        await wait_until(lambda: len(adm.ledger) == 0 and adm.waiting() == 0, timeout_s=30)


def test_config_check_backends_refuses_two_backends_on_one_llama_server(llama_split, tmp_path: Path, capsys):
    """A first-day trial: `default` and `b2` on one llama-server (127.0.0.1 and localhost) passed
    `config check --backends` with exit 0, both lines "llama-server pid N ... ceiling 2048": its
    capacity counted twice. Resolving tells localhost; its process (the pid in /proc) tells [::1]."""
    from gate.cli import main

    port = llama_split.url.rsplit(":", 1)[1]
    f = tmp_path / "tokengate.toml"
    table = '[[backends]]\nname = "{}"\nurl = "http://{}:{}"\n'
    f.write_text(CLASSES + table.format("default", "127.0.0.1", port) + table.format("b2", "localhost", port))
    assert main(["config", "check", "--backends", str(f)]) == 2
    out, err = capsys.readouterr()
    assert f"resolve to the same address, 127.0.0.1 port {port}" in err and "ok:" not in out and "backend  " not in out
    f.write_text(CLASSES + table.format("default", "127.0.0.1", port) + table.format("b2", "[::1]", port))
    assert main(["config", "check", "--backends", str(f)]) == 2
    out, err = capsys.readouterr()
    assert "backend  default" in out and "backend  b2" in out
    assert (
        f'{f}: backends[1].url: backends "default" (http://127.0.0.1:{port}) and "b2" (http://[::1]:{port}) reach the same llama-server, llama-server pid '
        in err
    )
