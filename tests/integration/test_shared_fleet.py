"""Tenant limits across a fleet: three real gates, one real redis-server, the real llama-server.

- Random traffic of three tenants through three gates for a minute: the in-flight quota
  holds across the gates at every sample; requests and tokens per minute come within 5%
  of the configured rates above (10% below, where a loaded host's stalls leave them). A negative control (no [shared]) shows the same traffic takes
  the tenant past its quota, so the harness can see a violation.
- A gate SIGKILLed while holding quota: its leases expire within 3 renewal intervals of its
  last renewal (read from Redis's own data), then another gate admits the tenant again.
- Redis slow (SIGSTOP) and down (SIGTERM) mid-run: fail_open admits under 1/N local limits,
  fail_closed answers 429 shared_limit_unavailable with Retry-After; both are counted,
  audited when they flip, shown in the snapshot; both recover when Redis answers again.

Figures print with `pytest -s` (the report quotes them).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import Counter
from collections.abc import Sequence

import httpx
import pytest
import redis.asyncio as aioredis

from gate.data.records import AuditRecord
from gate.fleet.sharedlimits.scripts import tenant_keys
from gate.service import GateService
from tests.integration.fleet import NO_PREFILL_CAP, Sampler, ServeProcess, Tenant, complete, fleet, fleet_extra, tenant_in_flight
from tests.integration.gate_harness import running_gate, wait_until

pytestmark = pytest.mark.llama

# The rate tenants run in the batch class (a 120 s queue timeout): a request charged and then
# refused by a slow llama-server's queue would be refunded, and blur the count.
# (The client waits as long as the gate may: on a crowded 2-core machine llama-server can
# take a minute for what it does in a second alone.)
RPM = Tenant("rpm", rpm=40, cls="batch")
TPM = Tenant("tpm", tpm=1600, cls="batch")  # 40 requests of ~40 tokens a minute
QUOTA = Tenant("quota", quota=300)
TENANTS = (RPM, TPM, QUOTA)
BUDGET = 680  # three gates share llama-server's 2048-token pool


async def redis_held(peek: aioredis.Redis, tenant: str, prefix: str = "fleet:") -> int:
    return int(await peek.get(tenant_keys(prefix, tenant)[3]) or 0)


class Load:
    """Random traffic through several gates; every answer is logged with when it was sent."""

    def __init__(self, client: httpx.AsyncClient, gates: Sequence[GateService], seed: int = 14) -> None:
        self.client = client
        self.gates = gates
        self.rng = random.Random(seed)
        self.log: list[tuple[float, str, int, str, str | None]] = []  # (sent, tenant, status, code, retry-after)
        self.stop = asyncio.Event()
        self.first_limited: dict[str, float] = {}
        self.stragglers: list[asyncio.Task] = []
        self.messages: dict[tuple[str, str], str] = {}

    async def send(self, tenant: Tenant, max_tokens: int, *, steady: bool = True) -> httpx.Response:
        gate = self.rng.choice(self.gates)
        sent = time.time()
        r = await complete(self.client, gate.url, tenant, max_tokens)
        code = "" if r.status_code == 200 else r.json()["error"]["code"]
        if code:
            self.messages[(tenant.name, code)] = r.json()["error"]["message"]  # the last of each, for a failure's context
        self.log.append((sent, tenant.name, r.status_code, code, r.headers.get("retry-after")))
        assert r.status_code in (200, 429), r.text
        if code == "rate_limited" and steady:
            self.first_limited.setdefault(tenant.name, sent)
        return r

    async def burst(self, tenant: Tenant, max_tokens: int, workers: int = 16) -> None:
        """Spend the tenant's initial allowance (a bucket starts full) until it is refused;
        returns at the first refusal, leaving the admitted requests to finish."""
        done = asyncio.Event()

        async def worker() -> None:
            while not done.is_set():
                if (await self.send(tenant, max_tokens, steady=False)).status_code == 429:
                    done.set()

        self.stragglers += [asyncio.create_task(worker()) for _ in range(workers)]
        await done.wait()

    async def poisson(self, tenant: Tenant, per_s: float, max_tokens: int) -> None:
        """Open-loop arrivals at `per_s`, whatever the answers."""
        pending: set[asyncio.Task] = set()
        while not self.stop.is_set():
            await asyncio.sleep(self.rng.expovariate(per_s))
            task = asyncio.create_task(self.send(tenant, max_tokens))
            pending.add(task)
            task.add_done_callback(pending.discard)
        await asyncio.gather(*pending)

    async def closed_loop(self, tenant: Tenant, workers: int) -> None:
        """Each worker sends again as soon as it is answered (after a short pause on a 429)."""

        async def worker() -> None:
            while not self.stop.is_set():
                r = await self.send(tenant, self.rng.randint(40, 120))
                if r.status_code == 429:
                    await asyncio.sleep(self.rng.uniform(0.05, 0.15))

        await asyncio.gather(*(worker() for _ in range(workers)))


def charged(gates: Sequence[GateService], tenant: str, start: float, end: float) -> tuple[int, int]:
    """(requests, tokens) the tenant was charged for among requests that arrived in [start, end)."""
    requests = tokens = 0
    for g in gates:
        for r in g.records:
            if r.tenant == tenant and start <= r.ts < end and r.outcome != "refused":
                requests += 1
                generated = r.completion_tokens if r.completion_tokens is not None else r.max_tokens
                tokens += (r.prompt_tokens or 0) + min(generated or 0, r.max_tokens or 0)
    return requests, tokens


async def test_three_gates_hold_a_tenant_to_its_fleet_limits_under_random_traffic(llama_unified, redis_server) -> None:
    peek = aioredis.Redis.from_url(redis_server.url, decode_responses=True)
    # A wait bound that the load on a shared 2-core machine never reaches: this test is about
    # the limits holding while Redis answers (the bound itself: the test below, and bench/).
    # And a queue timeout it never reaches either: a CI run at load saw a quota request wait out
    # the default class's 10 s behind the tpm tenant's burst (a local refusal, not a limit's).
    extra = fleet_extra(redis_server.url, TENANTS, renew_s=1.0, wait_ms=1000, queue_timeout_s=120.0)
    async with fleet(llama_unified.url, [extra] * 3, budget=BUDGET) as gates, httpx.AsyncClient(timeout=600) as client:
        for g in gates:
            assert await g.shared.renew()
        assert [g.shared.health.gates for g in gates] == [3, 3, 3]
        load = Load(client, gates)
        sampler = Sampler(lambda: tenant_in_flight(gates, QUOTA.name))
        sampler.start()
        quota_load = asyncio.create_task(load.closed_loop(QUOTA, workers=5))
        await asyncio.gather(load.burst(RPM, 1), load.burst(TPM, 200))
        # Offered at 2.5x the rates, so that the buckets stay empty and every refill is used.
        steady = [asyncio.create_task(load.poisson(RPM, 40 / 60 * 2.5, 1)), asyncio.create_task(load.poisson(TPM, 40 / 60 * 2.5, 33))]
        try:
            await wait_until(lambda: RPM.name in load.first_limited and TPM.name in load.first_limited, timeout_s=30)
        except AssertionError:
            print(Counter((e[1], e[2], e[3]) for e in load.log), load.first_limited)
            raise
        window_end = max(load.first_limited.values()) + 60.0
        await asyncio.sleep(window_end - time.time())  # the minute the rates are measured over
        load.stop.set()
        await asyncio.gather(quota_load, *steady, *load.stragglers)
        await sampler.stop()

        start = load.first_limited[RPM.name]
        rpm_requests, _ = charged(gates, RPM.name, start, start + 60.0)
        start = load.first_limited[TPM.name]
        _, tpm_tokens = charged(gates, TPM.name, start, start + 60.0)
        quota_refusals = [e for e in load.log if e[1] == QUOTA.name and e[3] == "tenant_quota"]
        print(
            f"\nfleet of 3: quota tenant max in flight {sampler.largest} of {QUOTA.quota} over {sampler.samples} samples; "
            f"{sum(1 for e in load.log if e[1] == QUOTA.name and e[2] == 200)} admitted, {len(quota_refusals)} refused tenant_quota; "
            f"rpm: {rpm_requests} requests in the minute (limit {RPM.rpm}); tpm: {tpm_tokens} tokens in the minute (limit {TPM.tpm}); "
            f"leases expired while held: {[g.shared.expired_held for g in gates]}"
        )
        # Past the quota only if a gate's leases expired on Redis while it held them (its
        # renewals later than a lease lives: a loop stalled on a loaded host), which it counts.
        assert sampler.largest <= QUOTA.quota, [g.shared.expired_held for g in gates]
        assert sampler.largest >= 0.6 * QUOTA.quota and quota_refusals  # the quota was contended
        # Never past a rate by more than 5% (the limit); under it by up to 10% (the load): on a
        # quiet host the minute holds 1,599 of 1,600 tokens, and a CI run whose gates' loops
        # stalled 1.07 s at once (2 cores, three gates, llama-server) charged 1,482, none over
        assert -0.10 * RPM.rpm <= rpm_requests - RPM.rpm <= 0.05 * RPM.rpm
        assert -0.10 * TPM.tpm <= tpm_tokens - TPM.tpm <= 0.05 * TPM.tpm
        refusals = [e for e in load.log if e[2] == 429]
        assert refusals and all(e[4] is not None and int(e[4]) >= 1 for e in refusals)  # Retry-After on each
        assert {e[3] for e in refusals} <= {"rate_limited", "tenant_quota"}, (Counter((e[1], e[3]) for e in refusals), load.messages)
        # Redis answered every time: nothing was decided by the failure policy.
        assert all(g.shared_state == "ok" for g in gates)
        assert not [a for g in gates for a in g.recent_audit if a.action == "shared_limits"]
        # Every reservation came back: the gates' ledgers and Redis's count are both zero.
        await wait_until(lambda: tenant_in_flight(gates, QUOTA.name) == 0)
        await wait_until(lambda: _zero(peek, QUOTA.name))
    await peek.aclose()


async def _zero(peek: aioredis.Redis, tenant: str) -> bool:
    return await redis_held(peek, tenant) == 0


async def test_negative_control_without_shared_limits_the_gates_let_the_tenant_past_its_quota(llama_unified) -> None:
    extra = fleet_extra(None, TENANTS)
    async with fleet(llama_unified.url, [extra] * 3, budget=BUDGET) as gates, httpx.AsyncClient(timeout=600) as client:
        load = Load(client, gates)
        sampler = Sampler(lambda: tenant_in_flight(gates, QUOTA.name))
        sampler.start()
        task = asyncio.create_task(load.closed_loop(QUOTA, workers=5))
        await wait_until(lambda: sampler.largest > QUOTA.quota, timeout_s=30)
        load.stop.set()
        await task
        await sampler.stop()
        print(f"\nno [shared]: quota tenant max in flight {sampler.largest} of {QUOTA.quota}")


async def test_a_killed_gate_leases_expire_within_three_renewals_and_free_the_quota(llama_unified, redis_server) -> None:
    holder = Tenant("holder", quota=1200)
    renew_s = 0.5
    peek = aioredis.Redis.from_url(redis_server.url, decode_responses=True)
    victim = ServeProcess(llama_unified.url, fleet_extra(redis_server.url, [holder], renew_s=renew_s), budget=1300)
    await victim.start()
    try:
        async with (
            fleet(llama_unified.url, [fleet_extra(redis_server.url, [holder], renew_s=renew_s)], budget=700) as (gate,),
            httpx.AsyncClient(timeout=600) as client,
        ):
            # A long request holds most of the tenant's quota on the victim.
            long_request = asyncio.create_task(complete(client, victim.url, holder, 1100))
            _, leases, costs, _ = tenant_keys("fleet:", holder.name)
            await wait_until(lambda: _held_by_other(peek, costs, gate.shared.member), timeout_s=30)
            r = await complete(client, gate.url, holder, 200)
            assert r.status_code == 429 and r.json()["error"]["code"] == "tenant_quota"
            assert "across the gates" in r.json()["error"]["message"] and r.headers["retry-after"] == "1"

            victim.kill()  # no drain, no goodbye
            killed_at = await _redis_ms(peek)
            with pytest.raises(httpx.HTTPError):
                await long_request
            expiry = max(score for _, score in await peek.zrange(leases, 0, -1, withscores=True))
            print(f"\nSIGKILL: the victim's lease expires {expiry - killed_at:.0f} ms after the kill (bound {3 * renew_s * 1000:.0f} ms)")
            assert expiry - killed_at <= 3 * renew_s * 1000

            attempts: list[tuple[float, int, float]] = []  # (sent, status, answered), Redis clock

            async def admitted() -> bool:
                sent = await _redis_ms(peek)
                status = (await complete(client, gate.url, holder, 200)).status_code
                attempts.append((sent, status, await _redis_ms(peek)))
                return status == 200

            await wait_until(admitted, timeout_s=30, interval_s=0.05)
            sent, _, answered = attempts[-1]
            print(
                f"SIGKILL: the other gate admitted the tenant again with a request sent {sent - killed_at:.0f} ms "
                f"after the kill ({len(attempts) - 1} refused before; answered after {answered - sent:.0f} ms)"
            )
            # Refused while the lease lived, admitted once it ran out: it was the lease that held it.
            assert all(status == 429 and sent_ < expiry for sent_, status, _ in attempts[:-1])
            assert answered >= expiry
            await wait_until(lambda: _zero(peek, holder.name))
            await wait_until(lambda: _only_gate(peek, gate), timeout_s=10)  # the dead gate drops out of Redis's count
            await wait_until(lambda: gate.shared.health.gates == 1, timeout_s=10)  # and out of N, a lease's life later
    finally:
        victim.stop()
        await peek.aclose()


async def _held_by_other(peek: aioredis.Redis, costs: str, mine: str) -> bool:
    return any(not lease.startswith(mine) for lease in await peek.hkeys(costs))


async def _redis_ms(peek: aioredis.Redis) -> float:
    sec, usec = await peek.time()
    return sec * 1000 + usec / 1000


async def _only_gate(peek: aioredis.Redis, gate: GateService) -> bool:
    return await peek.zrange("fleet:gates", 0, -1) == [gate.shared.member]


def _flips(gate: GateService) -> list[tuple[str | None, str | None]]:
    return [(a.old_value, a.new_value) for a in gate.recent_audit if a.action == "shared_limits"]


def _metric(gate: GateService, line_start: str) -> float:
    gate.refresh_metrics()
    body = gate.metrics.render()[0].decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in body.splitlines() if line.startswith(line_start))


async def test_redis_slow_or_down_applies_the_policy_and_the_gates_recover(llama_unified, redis_server) -> None:
    team = Tenant("team", rpm=6000, quota=300)
    open_extra = fleet_extra(redis_server.url, [team], policy="fail_open", renew_s=0.3, wait_ms=100)
    closed_extra = fleet_extra(redis_server.url, [team], policy="fail_closed", renew_s=0.3, wait_ms=100)
    async with (
        fleet(llama_unified.url, [open_extra, closed_extra], budget=BUDGET) as (opened, closed),
        httpx.AsyncClient(timeout=600) as client,
    ):
        flipped = asyncio.Event()

        def on_audit(record: AuditRecord) -> None:
            if record.action == "shared_limits":
                flipped.set()

        peek = aioredis.Redis.from_url(redis_server.url, decode_responses=True)
        for g in (opened, closed):
            g.audit_listeners.append(on_audit)
            assert await g.shared.renew() and g.shared.health.gates == 2
            assert g.snapshot().shared == "ok" and _metric(g, "tokengate_shared_limit_fallback") == 0
            assert (await complete(client, g.url, team, 20)).status_code == 200
            assert _metric(g, "tokengate_shared_limit_wait_seconds_count") >= 1  # the wait is measured
            # The answer's last bytes waited for the release: the quota is whole again, fleet-wide.
            assert await redis_held(peek, team.name) == 0
        await peek.aclose()

        async def degraded(how) -> None:
            """Redis made slow or dead by `how`: both gates apply their policy, then come back."""
            how()
            for _ in range(3):  # both flip at the first call: refused, or no answer in the bound
                r = await complete(client, opened.url, team, 20)
                assert r.status_code == 200  # fail_open: admitted under the gate's own limits
            await wait_until(lambda: opened.shared_state == "fail_open", timeout_s=10)
            r = await complete(client, closed.url, team, 20)
            assert r.status_code == 429 and r.json()["error"]["code"] == "shared_limit_unavailable"
            assert int(r.headers["retry-after"]) >= 1 and r.json()["error"]["type"] == "rate_limit_error"
            await wait_until(lambda: closed.shared_state == "fail_closed", timeout_s=10)
            # fail_open: 1/N of the quota locally (N = 2 gates seen): 150 tokens.
            assert opened.shared.divisor == 2
            big = await complete(client, opened.url, team, 180)
            assert big.status_code == 429 and big.json()["error"]["code"] == "tenant_quota"
            assert (await complete(client, opened.url, team, 100)).status_code == 200
            for g, state in ((opened, "fail_open"), (closed, "fail_closed")):
                assert g.snapshot().shared == state
                # /health says it too, still 200: the gate serves (a trial's probe read a bare "ok")
                health = await client.get(f"{g.url}/health")
                assert health.status_code == 200 and health.json()["shared"]["state"] == state, health.text
                assert ("1/2 of each tenant" if state == "fail_open" else "429 shared_limit_unavailable") in health.json()["shared"]["note"]
                assert _metric(g, "tokengate_shared_limit_fallback") == 1
                assert _metric(g, f'tokengate_shared_limit_policy_total{{policy="{state}"}}') >= 1

        async def recovered(how) -> None:
            how()
            await wait_until(lambda: opened.shared_state == "ok" and closed.shared_state == "ok", timeout_s=15)
            for g in (opened, closed):
                assert g.snapshot().shared == "ok" and _metric(g, "tokengate_shared_limit_fallback") == 0
                assert (await client.get(f"{g.url}/health")).json()["shared"]["state"] == "ok"
                big = await complete(client, g.url, team, 180)  # the whole quota is shared again
                assert big.status_code == 200, big.text

        await degraded(redis_server.pause)  # slow: connections open, no answer
        await recovered(redis_server.resume)
        await degraded(redis_server.stop)  # down: refused connections
        await recovered(redis_server.start)  # back on the same port, empty
        assert flipped.is_set()
        assert _flips(opened) == [("ok", "fail_open"), ("fail_open", "ok")] * 2
        assert _flips(closed) == [("ok", "fail_closed"), ("fail_closed", "ok")] * 2
        journal_rows = [a for a in closed.recent_audit if a.action == "shared_limits"]
        assert all(a.source == "gate" and a.target == "gate" and a.note for a in journal_rows)
        assert "429 shared_limit_unavailable" in journal_rows[0].note
        assert tenant_in_flight([opened, closed], team.name) == 0


async def test_a_gate_restarted_while_redis_is_down_divides_by_the_count_its_journal_kept(llama_unified, redis_server, tmp_path) -> None:
    """Two gates count each other on Redis; Redis goes down and one gate restarts: fail_open
    must still run it on 1/2 of the quota, as its journal last counted, not take the whole
    quota on every restarted gate (N = 1 was a guess: a fleet restarted during an outage ran
    at N x the quota). Negative control: a gate on a fresh journal takes it whole, and says so."""
    team = Tenant("team", quota=300)
    extra = fleet_extra(redis_server.url, [team], policy="fail_open", renew_s=0.3, wait_ms=100)
    journal = str(tmp_path / "a.db")
    async with running_gate(
        llama_unified.url, extra, backend_extra=f"token_budget = {BUDGET}\n{NO_PREFILL_CAP}", journal_path=journal
    ) as a:
        async with running_gate(llama_unified.url, extra, backend_extra=f"token_budget = {BUDGET}\n{NO_PREFILL_CAP}"):
            await wait_until(lambda: a.shared.health.gates == 2, timeout_s=10)
            await wait_until(lambda: _journal_says(journal, "2"), timeout_s=10)  # the count is journaled
    redis_server.stop()
    try:
        await _restarted_during_the_outage(llama_unified, extra, journal, team)
    finally:
        redis_server.start()


async def _restarted_during_the_outage(llama_unified, extra: str, journal: str, team: Tenant) -> None:
    async with (
        running_gate(llama_unified.url, extra, backend_extra=f"token_budget = {BUDGET}\n{NO_PREFILL_CAP}", journal_path=journal) as again,
        running_gate(llama_unified.url, extra, backend_extra=f"token_budget = {BUDGET}\n{NO_PREFILL_CAP}") as fresh,
        httpx.AsyncClient(timeout=600) as client,
    ):
        assert again.shared_state == "fail_open" and again.shared.divisor == 2 and again.shared.health.known == "journal"
        big = await complete(client, again.url, team, 180)  # 1/2 of 300 is 150
        assert big.status_code == 429 and big.json()["error"]["code"] == "tenant_quota", big.text
        assert (await complete(client, again.url, team, 100)).status_code == 200
        note = (await client.get(f"{again.url}/health")).json()["shared"]["note"]
        assert "1/2 of each tenant" in note and "journal last counted" in note, note
        flip = [a for a in again.recent_audit if a.action == "shared_limits"][-1]
        assert "N = 2 gates, as this gate's journal last counted them" in flip.note, flip.note
        # negative control: nothing remembered, N = 1, and the answer and the audit say it is a guess
        assert fresh.shared.divisor == 1 and fresh.shared.health.known == "none"
        assert (await complete(client, fresh.url, team, 180)).status_code == 200
        note = (await client.get(f"{fresh.url}/health")).json()["shared"]["note"]
        assert "journal holds no count" in note, note
        assert tenant_in_flight([again, fresh], team.name) == 0


def _journal_says(path: str, gates: str) -> bool:
    import sqlite3

    with contextlib.closing(sqlite3.connect(path)) as conn:
        row = conn.execute("SELECT new_value FROM audit WHERE action = 'shared_gates' ORDER BY ts DESC, id DESC LIMIT 1").fetchone()
    return row is not None and row[0] == gates
