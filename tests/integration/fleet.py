"""Several real gates sharing tenant limits through one real redis-server (test helpers).

Each gate is a real GateService on its own loopback port (`running_gate`), or a real
`tokengate serve` process, in front of the real llama-server. They share llama-server's
2048-token pool, so each gate gets a static budget that is its part of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from gate.service import GateService
from tests.integration.gate_harness import gate_toml, running_gate, wait_until, words

# The shared limits alone: the automatic prefill cap (#13) serialises prompts when a starved
# CPU makes the measured prefill rate low, which only adds queue time to these tests.
NO_PREFILL_CAP = "max_prefill_tokens = 0"
from tests.llama.server import free_port

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Tenant:
    name: str
    rpm: int | None = None
    tpm: int | None = None
    quota: int | None = None
    cls: str | None = None

    @property
    def key(self) -> str:
        return f"test-key-{self.name}"

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}

    def toml(self) -> str:
        lines = [
            "[[tenants]]",
            f'name = "{self.name}"',
            f'api_key_sha256 = "{hashlib.sha256(self.key.encode()).hexdigest()}"',
        ]
        for key, value in (("requests_per_minute", self.rpm), ("tokens_per_minute", self.tpm), ("max_tokens_in_flight", self.quota)):
            if value is not None:
                lines.append(f"{key} = {value}")
        if self.cls is not None:
            lines.append(f'class = "{self.cls}"')
        return "\n".join(lines) + "\n"


def fleet_extra(
    redis_url: str | None,
    tenants: Sequence[Tenant],
    *,
    prefix: str = "fleet:",
    policy: str = "fail_open",
    renew_s: float = 0.5,
    wait_ms: float = 250.0,
    queue_timeout_s: float | None = None,
) -> str:
    """The config before [[backends]]: [shared] (unless redis_url is None), a static budget, the
    tenants; with `queue_timeout_s`, the default classes with that queue timeout for both."""
    shared = (
        ""
        if redis_url is None
        else (
            f'[shared]\nredis_url = "{redis_url}"\nkey_prefix = "{prefix}"\nfailure_policy = "{policy}"\n'
            f"renew_interval_s = {renew_s}\nwait_ms = {wait_ms}\n\n"
        )
    )
    # slo_ttft_p95_ms: far out of the way, so the TTFT objective every class takes from it (#25)
    # refuses nothing early: these tests count the tenants' limits, whose refusals they expect.
    budget = '[budget]\nmode = "static"\nmin_tokens = 256\nslo_ttft_p95_ms = 600000\n\n'
    classes = (
        ""
        if queue_timeout_s is None
        else (
            f"[classes.interactive]\npriority = 10\nqueue_timeout_s = {queue_timeout_s}\n\n"
            f"[classes.batch]\npriority = 1\nqueue_timeout_s = {queue_timeout_s}\n\n"
        )
    )
    return shared + budget + classes + "\n".join(t.toml() for t in tenants)


@contextlib.asynccontextmanager
async def fleet(llama_url: str, extras: Sequence[str], *, budget: int) -> AsyncIterator[list[GateService]]:
    """One in-process gate per config in `extras`, all in front of the same llama-server."""
    async with contextlib.AsyncExitStack() as stack:
        gates = []
        for extra in extras:
            gates.append(
                await stack.enter_async_context(running_gate(llama_url, extra, backend_extra=f"token_budget = {budget}\n{NO_PREFILL_CAP}"))
            )
        yield gates


def tenant_in_flight(gates: Sequence[GateService], tenant: str) -> int:
    """Tokens `tenant` holds on the gates' own ledgers right now (one loop: an atomic sample)."""
    return sum(b.admission.ledger.tenant_tokens(tenant) for g in gates for b in g.backends if b.admission is not None)


@dataclass
class Sampler:
    """Samples a number every `interval_s` until stopped; keeps the largest and the count."""

    probe: object
    interval_s: float = 0.002
    largest: int = 0
    samples: int = 0
    _task: asyncio.Task | None = field(default=None, repr=False)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            self.take()
            await asyncio.sleep(self.interval_s)

    def take(self) -> None:
        value = self.probe()  # type: ignore[operator]
        self.samples += 1
        self.largest = max(self.largest, value)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


async def complete(client: httpx.AsyncClient, gate_url: str, tenant: Tenant, max_tokens: int, prompt_words: int = 5) -> httpx.Response:
    """One /v1/completions that generates exactly `max_tokens` (ignore_eos)."""
    body = {"prompt": words(prompt_words), "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0.0}
    return await client.post(gate_url + "/v1/completions", json=body, headers=tenant.auth)


class ServeProcess:
    """`tokengate serve` as a real process (the gate that gets SIGKILLed)."""

    def __init__(self, llama_url: str, extra: str, *, budget: int) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="tokengate-fleet-"))
        self.port = free_port()
        config = f'[gate]\nlisten = "127.0.0.1:{self.port}"\njournal = "{self.dir}/journal.db"\n\n' + gate_toml(
            [llama_url], extra, backend_extra=f"token_budget = {budget}\n{NO_PREFILL_CAP}"
        )
        self.config_path = self.dir / "tokengate.toml"
        self.config_path.write_text(config)
        self.log_path = self.dir / "serve.log"
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        env = dict(os.environ, PYTHONPATH=str(REPO))
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "gate.cli", "serve", "--config", str(self.config_path)],
                cwd=self.dir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

        async def healthy() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"tokengate serve exited {self.proc.returncode}:\n{self.log_path.read_text()}")
            try:
                async with httpx.AsyncClient(timeout=1.0) as c:
                    return (await c.get(self.url + "/health")).status_code == 200
            except httpx.TransportError:
                return False

        await wait_until(healthy, timeout_s=30.0, interval_s=0.1)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
