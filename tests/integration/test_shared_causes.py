"""Why Redis does not decide, said as such: a real redis-server (with a password), real gates.

A user trial (two gates sharing tenant quotas through one Redis):

- a gate with a wrong Redis password served every tenant at its whole quota, on top of the
  fleet, for ever, logged once as if Redis were out of reach. Now `tokengate serve` refuses to
  start (exit 2) naming `[shared] redis_url` and the problem, never the password; `tokengate
  config check --backends` asks Redis too; at runtime the log, the audit row and /health say
  it is the credentials.
- /health said "Redis unreachable" whatever the cause. Now its note says the cause: slow,
  refused, credentials refused.
- a Redis restart (no persistence) was warned as leases that expired while the gate held
  them, and counted (the alert TokengateSharedLeasesExpired). Now it is said as a restart.
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import redis.asyncio as aioredis

from gate.config import SharedConfig, TenantConfig
from gate.fleet.sharedlimits.client import SharedLimits
from gate.fleet.sharedlimits.health import Flip
from gate.fleet.sharedlimits.scripts import tenant_keys
from tests.integration.fake_upstream import fake_upstream
from tests.integration.gate_harness import running_gate, wait_until
from tests.llama.server import free_port
from tests.redis.server import RedisServer

REPO = Path(__file__).resolve().parents[2]
PASSWORD = "Tg-s3cret-7q"  # Redis's requirepass
WRONG = "Tg-wrong-4k"  # what a mistaken config says
CREDENTIALS = "Redis refused the gate's credentials"


@pytest.fixture
def locked_redis(tmp_path):
    """A real redis-server that asks for a password (the default user's), as the README sets one up."""
    server = RedisServer(tmp_path / "redis", password=PASSWORD).start()
    try:
        yield server
    finally:
        server.stop()


def serve_config(tmp_path: Path, redis_url: str, backend_url: str = "http://127.0.0.1:9", name: str = "tokengate") -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(
        f'[gate]\nlisten = "127.0.0.1:{free_port()}"\njournal = "{tmp_path / "journal.db"}"\n\n'
        f'[shared]\nredis_url = "{redis_url}"\n\n'
        f'[[backends]]\nurl = "{backend_url}"\nkv = "unified"\n'
    )
    return path


def secrets_in(text: str) -> list[str]:
    return [s for s in (PASSWORD, WRONG) if s in text]


@pytest.mark.parametrize(
    ("userinfo", "db", "said"),
    [
        (f":{WRONG}@", 0, (CREDENTIALS, "WRONGPASS")),  # the README's old form, a wrong password
        (f"default:{WRONG}@", 0, (CREDENTIALS, "WRONGPASS")),
        (f"alice:{WRONG}@", 0, (CREDENTIALS, "invalid username-password pair")),  # no such user
        ("", 0, (CREDENTIALS, "HELLO must be called with the client already authenticated")),  # no password at all
        (f"default:{PASSWORD}@", 99, ("Redis has no database 99", "DB index is out of range")),
    ],
    ids=["wrong-password", "wrong-password-default-user", "unknown-user", "no-password", "no-such-db"],
)
def test_serve_refuses_to_start_on_a_redis_url_redis_refuses(locked_redis, tmp_path, userinfo, db, said) -> None:
    """Exit 2, the key and the cause in one line, no password, no traceback; before: the gate
    started under fail_open at 1/1 and ran (this test's subprocess timed out)."""
    config = serve_config(tmp_path, f"redis://{userinfo}127.0.0.1:{locked_redis.port}/{db}")
    proc = subprocess.run(
        [sys.executable, "-m", "gate.cli", "serve", "--config", str(config)],
        cwd=tmp_path,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2, proc.stderr
    refusal = [line for line in proc.stderr.splitlines() if line.startswith("tokengate serve: ")]
    assert len(refusal) == 1, proc.stderr
    assert refusal[0].startswith(f"tokengate serve: [shared] redis_url (redis://127.0.0.1:{locked_redis.port}/{db}): "), refusal
    assert all(words in refusal[0] for words in said), refusal
    assert "not an outage" in refusal[0] and "redis_url" in refusal[0]
    assert "Traceback" not in proc.stderr and not secrets_in(proc.stderr + proc.stdout)
    assert "shared limits: ok -> " not in proc.stderr  # refused before the failure policy applied


async def config_check(config: Path) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gate.cli",
        "config",
        "check",
        "--backends",
        str(config),
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode()


async def test_config_check_backends_asks_redis_too(locked_redis, tmp_path) -> None:
    """ok / authentication failed / unreachable, with the backends' exit status (1 when not
    ok); before, the command contacted the backends only and said ok of a wrong password."""
    port = locked_redis.port
    async with fake_upstream("slow") as backend:  # a ready backend, so that only Redis can fail the check
        good = serve_config(tmp_path, f"redis://:{PASSWORD}@127.0.0.1:{port}/0", backend.url, "good")
        code, out = await config_check(good)
        assert code == 0, out
        assert f"shared   redis://127.0.0.1:{port}/0: ok (connected and answered PING in " in out, out
        assert "0 gates alive on key prefix 'tokengate:'" in out
        wrong = serve_config(tmp_path, f"redis://:{WRONG}@127.0.0.1:{port}/0", backend.url, "wrong")
        code, out = await config_check(wrong)
        assert code == 1, out
        assert f"shared   redis://127.0.0.1:{port}/0: authentication failed: {CREDENTIALS} (WRONGPASS" in out, out
        down = serve_config(tmp_path, f"redis://:{PASSWORD}@127.0.0.1:{free_port()}/0", backend.url, "down")
        code, out = await config_check(down)
        assert code == 1, out
        assert ": unreachable: Redis refused the connection (" in out, out
        assert not secrets_in(out)


async def health_shared(client: httpx.AsyncClient, url: str) -> dict:
    return (await client.get(url + "/health")).json()["shared"]


async def note_says(client: httpx.AsyncClient, url: str, state: str, start: str) -> bool:
    shared = await health_shared(client, url)
    return shared["state"] == state and shared["note"].startswith(start)


async def test_health_the_log_and_the_audit_say_why_redis_does_not_decide(locked_redis, tmp_path, caplog) -> None:
    """A gate that started well: Redis paused, stopped, then asking for another password. Each
    time /health's note, the flip's log line and its audit row name the cause; before, /health
    said "Redis unreachable" for all three."""
    caplog.set_level(logging.INFO, logger="tokengate.shared")
    shared = f'[shared]\nredis_url = "{locked_redis.url}"\nfailure_policy = "fail_closed"\nrenew_interval_s = 0.2\nwait_ms = 100\n'
    async with fake_upstream("slow") as backend, running_gate(backend.url, shared) as gate, httpx.AsyncClient(timeout=5.0) as client:
        assert await health_shared(client, gate.url) == {"state": "ok", "note": "tenant limits are held fleet-wide through Redis"}
        causes = {
            # a renewal's bound: max(wait_ms, renew_interval_s)
            "Redis did not answer within 200 ms": (locked_redis.pause, locked_redis.resume),
            "Redis refused the connection": (locked_redis.stop, locked_redis.start),
        }
        for cause, (trouble, mend) in causes.items():
            trouble()
            await wait_until(lambda c=cause: note_says(client, gate.url, "fail_closed", f"{c}: requests of tenants with limits get 429"))
            mend()
            await wait_until(lambda: note_says(client, gate.url, "ok", "tenant limits are held"))
        peek = aioredis.Redis.from_url(locked_redis.url)
        try:
            await peek.config_set("requirepass", WRONG)  # Redis's password changed under the gate
            await peek.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
            await wait_until(lambda: note_says(client, gate.url, "fail_closed", f"{CREDENTIALS}: requests of tenants"))
        finally:
            async with aioredis.Redis.from_url(f"redis://default:{WRONG}@127.0.0.1:{locked_redis.port}/0") as again:
                await again.config_set("requirepass", PASSWORD)
            await peek.aclose()
        rows = [a.note for a in gate.recent_audit if a.action == "shared_limits" and a.new_value == "fail_closed"]
        flips = [r.getMessage() for r in caplog.records if r.name == "tokengate.shared" and " -> fail_closed (" in r.getMessage()]
        for said in (rows, flips):
            assert [next(c for c in (*causes, CREDENTIALS) if c in line) for line in said] == [*causes, CREDENTIALS], said
        assert "(lease renewal: WRONGPASS invalid username-password pair" in rows[-1] and "unreachable" not in " ".join(rows)
        logged = " ".join(r.getMessage() for r in caplog.records)
        assert not secrets_in(logged + " ".join(rows))


def tenant(quota: int) -> TenantConfig:
    return TenantConfig(name="team-a", api_key_sha256="a" * 64, max_tokens_in_flight=quota)


async def held_on_redis(peek: aioredis.Redis, prefix: str) -> int:
    return int(await peek.get(tenant_keys(prefix, "team-a")[3]) or 0)


async def held_is(peek: aioredis.Redis, prefix: str, tokens: int) -> bool:
    return await held_on_redis(peek, prefix) == tokens


async def test_a_redis_restart_is_said_as_one_and_not_counted_as_leases_expired(redis_server, caplog) -> None:
    """Under fail_closed, Redis down for longer than a lease lives, then back empty: the renewal
    that adopts the gate's leases says Redis restarted and lost its keys. Before: "1 lease(s)
    expired on Redis while this gate held them ... the gate's event loop was too busy", counted
    in tokengate_shared_leases_expired_held_total, which files TokengateSharedLeasesExpired."""
    caplog.set_level(logging.INFO, logger="tokengate.shared")
    expired: list[int] = []
    flips: list[Flip] = []
    config = SharedConfig(redis_url=redis_server.url, key_prefix="r:", failure_policy="fail_closed", renew_interval_s=0.2, wait_ms=100.0)
    gate = SharedLimits(config, "g1", on_expired=expired.append, on_flip=flips.append)
    await gate.start()
    peek = aioredis.Redis.from_url(redis_server.url)
    try:
        lease = await gate.reserve(tenant(100), 70)
        assert lease is not None and await held_on_redis(peek, "r:") == 70
        redis_server.stop()
        down_at = time.monotonic()
        await wait_until(lambda: [f.new for f in flips] == ["fail_closed"], timeout_s=5.0)
        # down for longer than a lease lives (0.6 s): what the old code took for an expiry
        await wait_until(lambda: time.monotonic() - down_at > 1.5 * config.lease_ttl_s, timeout_s=5.0)
        redis_server.start()  # same port, empty: no persistence
        await wait_until(lambda: held_is(peek, "r:", 70), timeout_s=5.0)  # a renewal adopted it
        await wait_until(lambda: gate.state == "ok", timeout_s=5.0)
        assert gate.adopted == 1 and gate.expired_held == 0 and expired == []
        said = [r.getMessage() for r in caplog.records if r.name == "tokengate.shared"]
        assert any("Redis restarted (or was flushed) and lost its keys: 1 lease(s) re-adopted" in m for m in said), said
        assert not any("expired on Redis while this gate held them" in m for m in said), said
        gate.release(lease)
        await wait_until(lambda: held_is(peek, "r:", 0), timeout_s=5.0)
    finally:
        await gate.stop()
        await peek.aclose()


async def test_redis_started_after_the_last_renewal_is_told_by_its_uptime(redis_server) -> None:
    """When the gate's mark on Redis is too old to tell (an outage longer than `keep`, 10 s),
    Redis's uptime says whether it started since the gate's last renewal it answered."""
    gate = SharedLimits(SharedConfig(redis_url=redis_server.url, key_prefix="u:"), "g1")
    await gate.start()
    try:
        assert not await gate._restarted_since(0.5)  # up for less than a second: cannot tell, so not said
        assert not await gate._restarted_since(None)
        assert await gate._restarted_since(3600.0)  # a renewal an hour ago, a Redis up for seconds
    finally:
        await gate.stop()
