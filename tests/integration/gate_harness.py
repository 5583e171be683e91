"""Run a real GateService in the test's event loop, in front of real (or fault) backends."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import signal
import tempfile
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path

import httpx

from gate.config import parse_config
from gate.service import GateService


def gate_toml(backend_urls: Sequence[str], extra: str = "", *, kv: str = "unified", backend_extra: str | Sequence[str] = "") -> str:
    """A config with one [[backends]] table per URL; `extra` goes first, so top-level keys stay
    top-level; `backend_extra` goes in every table, or one each when a sequence."""
    each = [backend_extra] * len(backend_urls) if isinstance(backend_extra, str) else list(backend_extra)
    tables = "\n".join(
        f'[[backends]]\nname = "b{i}"\nurl = "{url}"\nkv = "{kv}"\n{more}\n'
        for i, (url, more) in enumerate(zip(backend_urls, each, strict=True))
    )
    return extra + "\n" + tables


@contextlib.asynccontextmanager
async def running_gate(
    backend_urls: Sequence[str] | str,
    extra: str = "",
    *,
    kv: str = "unified",
    backend_extra: str | Sequence[str] = "",
    environ: Mapping[str, str] | None = None,
    probe_interval_s: float = 0.2,
    journal_path: str | None = None,
) -> AsyncIterator[GateService]:
    """A started gate on a free loopback port; stopped (and checked for leaks) on exit.

    The journal goes to a fresh temporary directory unless `journal_path` names the file.
    """
    urls = [backend_urls] if isinstance(backend_urls, str) else list(backend_urls)
    config = parse_config(gate_toml(urls, extra, kv=kv, backend_extra=backend_extra), "test.toml")
    with tempfile.TemporaryDirectory(prefix="tokengate-test-") as tmp:
        journal = journal_path or str(Path(tmp) / "journal.db")
        gate = GateService(config, environ=environ or {}, probe_interval_s=probe_interval_s, journal_path=journal)
        await gate.start(port=0)
        # As `tokengate serve` does after start-up: what exists now stays out of full
        # collections. Without it the gate's loop here is paused by collections of the whole
        # test session's heap (measured: gen-2 pauses of 0.55-0.73 s with ~341k objects
        # tracked after tests/console; a CI run's loop-lag bound tripped at 0.54 s).
        gc.freeze()
        try:
            yield gate
        finally:
            gc.unfreeze()
            await gate.stop(grace_s=10)


def ledger_total(gate: GateService) -> int:
    """Tokens reserved over all backends (0 when nothing leaked)."""
    return sum(b.admission.ledger.in_flight for b in gate.backends if b.admission is not None)


async def released(gate: GateService, timeout_s: float = 5.0) -> None:
    """Every reservation is back. A request's reservation goes back when its handler ends,
    which can be just after the client read the last byte (a CI run asserted in between and
    saw 11 tokens still held): wait for it, bounded, so that a leak still fails."""
    await wait_until(lambda: ledger_total(gate) == 0, timeout_s=timeout_s)


async def wait_until(predicate, timeout_s: float = 5.0, interval_s: float = 0.02) -> float:
    """Poll an observable condition of an external process; returns the seconds it took.

    For state outside this process (llama-server's /slots), polling is the only
    way to observe it; the timeout makes a failure explicit.
    """
    loop = asyncio.get_running_loop()
    start = loop.time()
    while True:
        result = predicate()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return loop.time() - start
        if loop.time() - start > timeout_s:
            raise AssertionError(f"condition not met within {timeout_s}s")
        await asyncio.sleep(interval_s)


async def busy_slots(client: httpx.AsyncClient, llama_url: str) -> int:
    slots = (await client.get(llama_url + "/slots")).json()
    return sum(1 for s in slots if s.get("is_processing"))


WORDS = "the quick brown fox jumps over the lazy dog and then some more words follow here".split()


def words(n: int) -> str:
    """A prompt of n words the tiny model's vocabulary holds (about one token each)."""
    return " ".join(WORDS[i % len(WORDS)] for i in range(n))


async def terminate(proc, timeout_s: float = 30.0) -> None:
    """SIGTERM a child process (a gate drains), then SIGKILL if it is not gone in `timeout_s`."""
    proc.send_signal(signal.SIGTERM)
    try:
        await asyncio.wait_for(proc.wait(), timeout_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
