"""Tenant limits shared by every gate on one Redis: reserve, release, renew (the I/O shell).

The pure parts live beside it: the scripts Redis runs (:mod:`.scripts`) and the health
state machine with its failure policy (:mod:`.health`). This module owns the only Redis
connection pool, the only timers and the renewal task.

The request path (``gate/http/proxy.py``) calls :meth:`SharedLimits.reserve` once, after the
gate's own rate check and before local admission, and :meth:`SharedLimits.release` exactly
once when the request ends, whatever the path. A reservation is one atomic script and one
round trip: both rate buckets and the in-flight quota are checked, and all are charged or
none. Admission never waits on Redis longer than ``wait_ms``; past it, or when Redis cannot
be reached, the failure policy decides that request, and after repeated trouble the gate
stops asking Redis until a renewal answers in time again (:mod:`.health`).

In-flight reservations are leases. Every ``renew_interval_s`` the gate renews all it holds
in one script, which also says it is alive and counts the gates alive (fail_open's N). A
gate that dies stops renewing: its leases expire within 3 x ``renew_interval_s`` of its
last renewal, and the next reservation of that tenant on any gate purges them.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import re
import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import NoScriptError, RedisError

from gate.config import SharedConfig, TenantConfig
from gate.core.errors import GateError
from gate.core.reasons import Reason
from gate.fleet.sharedlimits.health import Flip, SharedHealth, SharedState
from gate.fleet.sharedlimits.scripts import RELEASE, RENEW, RESERVE, Script, tenant_keys

__all__ = ["Lease", "SharedLimits"]

log = logging.getLogger("tokengate.shared")

#: lease ids waiting to be dropped from Redis while it is out of reach; past this the
#: oldest are forgotten (their leases expire by themselves)
MAX_PENDING_DROPS = 10_000


@dataclass(slots=True, eq=False)
class Lease:
    """One request's shared reservation; :meth:`SharedLimits.release` ends it exactly once."""

    id: str
    tenant: str
    cost: int
    rpm: int | None
    tpm: int | None
    #: counts against the tenant's in-flight quota (renewed, adopted, dropped)
    leased: bool
    #: the Redis rate buckets were charged for it, so refunds go there
    charged: bool
    released: bool = field(default=False, init=False)


@dataclass(slots=True, eq=False)
class _Release:
    lease: Lease
    refund_tokens: int
    refund_requests: int
    #: True once Redis has it, False if it could not be told (the lease then expires)
    done: asyncio.Future[bool]

    def settle(self, landed: bool) -> None:
        if not self.done.done():
            self.done.set_result(landed)


def _arg(limit: int | None) -> int:
    return -1 if limit is None else limit


class SharedLimits:
    """The shared tenant limits of one gate; ``state`` is ``ok``, ``fail_open`` or ``fail_closed``."""

    def __init__(
        self,
        config: SharedConfig,
        gate_id: str,
        *,
        on_flip: Callable[[Flip], None] = lambda flip: None,
        on_policy: Callable[[str], None] = lambda policy: None,
        on_wait: Callable[[float], None] = lambda seconds: None,
    ) -> None:
        self.config = config
        #: this gate on Redis: its gate id (host:pid:start, to the second) and a random tail,
        #: so that two gates started in one second by one process stay two
        self.member = f"{gate_id}/{secrets.token_hex(4)}"
        self.health = SharedHealth(config.failure_policy)
        self._on_flip = on_flip
        self._on_policy = on_policy
        self._on_wait = on_wait
        self._wait_s = config.wait_ms / 1000.0
        self._ttl_ms = int(config.lease_ttl_s * 1000)
        self._keep_ms = max(2 * self._ttl_ms, 10_000)
        self._ids = itertools.count(1)
        self._held: dict[str, Lease] = {}  # leased, not yet released
        self._drops: dict[str, list[str]] = {}  # tenant -> lease ids Redis should forget
        self._releases: list[_Release] = []  # sent together on the next loop turn
        self._release_handle: asyncio.Handle | None = None
        self._background: set[asyncio.Task[Any]] = set()
        self._runner: asyncio.Task[None] | None = None
        self._redis: aioredis.Redis | None = None
        self.adopted = 0  # leases Redis had lost and a renewal put back (a restart, fail_open)

    # ---- state ---------------------------------------------------------------

    @property
    def state(self) -> SharedState:
        return self.health.state

    @property
    def divisor(self) -> int:
        """What the gate's own tenant limits are divided by now (N under fail_open, else 1)."""
        return self.health.divisor

    @property
    def held(self) -> tuple[Lease, ...]:
        """The leases this gate holds now."""
        return tuple(self._held.values())

    # ---- life ----------------------------------------------------------------

    async def start(self) -> None:
        """Connect, say this gate is alive, start renewing. Never raises for Redis being out
        of reach: the gate then starts under its failure policy and recovers by itself."""
        socket_timeout = max(1.0, 2 * self.config.renew_interval_s)
        pool = aioredis.BlockingConnectionPool.from_url(
            self.config.redis_url,
            max_connections=64,
            timeout=socket_timeout,  # waiting for a free connection
            socket_timeout=socket_timeout,
            socket_connect_timeout=socket_timeout,
            decode_responses=True,
            retry=Retry(NoBackoff(), 0),  # the failure policy decides, not a retry loop
            client_name="tokengate-" + re.sub(r"[^A-Za-z0-9._:@-]", "_", self.member),  # CLIENT LIST shows it
        )
        self._redis = aioredis.Redis.from_pool(pool)
        if await self.renew():
            try:  # so that the first requests do not pay for NOSCRIPT
                for script in (RESERVE, RELEASE, RENEW):
                    await self._redis.script_load(script.text)
            except (RedisError, OSError) as exc:
                log.warning("shared limits: cannot load the scripts (%s); EVAL will", exc)
        self._runner = asyncio.get_running_loop().create_task(self._run(), name="tokengate-shared-renew")

    async def stop(self) -> None:
        """Stop renewing, hand back what is still held and leave the gate count; bounded."""
        if self._runner is not None:
            self._runner.cancel()
            _, running = await asyncio.wait((self._runner,), timeout=5.0)
            if running:  # a lost cancellation must not hold the gate's shutdown for ever
                log.error("shared limits: the renewal loop did not stop within 5 s of its cancel; left behind")
            self._runner = None
        if self._background:
            await asyncio.wait(tuple(self._background), timeout=1.0)
        for task in tuple(self._background):
            task.cancel()
        if self._redis is None:
            return
        for lease in tuple(self._held.values()):
            lease.released = True
            self._queue_drop(lease)
        self._held.clear()
        for item in self._take_releases():
            self._queue_drop(item.lease)  # refunds at shutdown are not worth a wait
            item.settle(False)
        drops, self._drops = self._drops, {}
        try:
            async with asyncio.timeout(1.0):
                await self._renew_call(drops=drops, leaving=True)
        except (TimeoutError, RedisError, OSError) as exc:
            log.warning("shared limits: could not say goodbye to Redis (%s); this gate's leases expire by themselves", exc)
        await self._redis.aclose()
        self._redis = None

    # ---- the request path -------------------------------------------------------

    async def reserve(self, tenant: TenantConfig, cost: int) -> Lease | None:
        """Check and charge ``tenant``'s shared limits for a request of ``cost`` tokens.

        Returns the lease to release when the request ends, or None when nothing was held
        (a tenant without limits). Raises :class:`GateError` with 429 ``rate_limited``,
        ``tenant_quota`` or, under fail_closed, ``shared_limit_unavailable``.
        """
        rpm, tpm, quota = tenant.requests_per_minute, tenant.tokens_per_minute, tenant.max_tokens_in_flight
        if rpm is None and tpm is None and quota is None:
            return None
        name = tenant.name
        if quota is not None and cost > quota:
            raise GateError(Reason.TENANT_QUOTA, f"request needs {cost} tokens; tenant {name!r} may hold at most {quota}")
        if tpm is not None and cost > tpm:
            raise GateError(Reason.TENANT_QUOTA, f"request needs {cost} tokens, more than tenant {name!r} may use per minute")
        leased = quota is not None
        if self.health.degraded or self._redis is None:
            return self._by_policy(name, cost, rpm, tpm, leased)
        lease = Lease(self._new_id(), name, cost, rpm, tpm, leased=leased, charged=True)
        riders = self._take_releases()
        keys = [*tenant_keys(self.config.key_prefix, name)]
        args = [lease.id, cost, _arg(rpm), _arg(tpm), _arg(quota), self._ttl_ms, self._keep_ms, len(riders)]
        self._add_releases(keys, args, riders)
        # A task of its own, so that giving up on it (the wait bound, a client that left)
        # does not lose its answer: a reservation that lands late is handed back at once.
        loop = asyncio.get_running_loop()
        started = time.perf_counter()  # not loop.time(): uvloop's clock moves in whole milliseconds
        call = loop.create_task(self._call(RESERVE, keys, args))
        if riders:
            call.add_done_callback(functools.partial(self._releases_landed, riders))
        try:
            await asyncio.wait((call,), timeout=self._wait_s)
        except asyncio.CancelledError:
            call.add_done_callback(functools.partial(self._undo_late, lease))
            raise
        self._on_wait(time.perf_counter() - started)
        if not call.done():
            call.add_done_callback(functools.partial(self._undo_late, lease))
            self._flip(self.health.timed_out(f"over {self.config.wait_ms:g} ms"))
            return self._by_policy(name, cost, rpm, tpm, leased)
        try:
            reply = call.result()
        except (RedisError, OSError) as exc:
            self._flip(self.health.failed(f"Redis: {exc}"))
            return self._by_policy(name, cost, rpm, tpm, leased)
        self.health.answered()
        if reply[0] == "ok":
            if lease.leased:
                self._held[lease.id] = lease
            return lease
        if reply[0] == "rate":
            raise GateError(
                Reason.RATE_LIMITED,
                f"tenant {name!r} is over its {reply[1]}-per-minute limit across the gates",
                retry_after_s=float(reply[2]) / 1000.0,
            )
        raise GateError(
            Reason.TENANT_QUOTA,
            f"tenant {name!r} holds {reply[1]} of its {quota} in-flight tokens across the gates; this request needs {cost}",
            retry_after_s=1.0,
        )

    def release(self, lease: Lease, *, refund_tokens: int = 0, refund_requests: int = 0) -> asyncio.Future[bool] | None:
        """End ``lease`` (a second call does nothing) and refund what the request did not use.

        Returns a future that says whether Redis has it (:meth:`landed` waits for it, bounded),
        or None when there was nothing to tell Redis. The release goes out on the next turn of
        the loop, with the others of that turn, riding on a reservation if one goes out too.
        """
        if lease.released:
            return None
        lease.released = True
        self._held.pop(lease.id, None)
        refund = lease.charged and (refund_tokens > 0 or refund_requests > 0)
        if not lease.leased and not refund:
            return None
        if self.health.degraded or self._redis is None:
            self._queue_drop(lease)  # the refund is lost; the lease goes with the next renewal
            return None
        loop = asyncio.get_running_loop()
        item = _Release(lease, refund_tokens if lease.charged else 0, refund_requests if lease.charged else 0, loop.create_future())
        self._releases.append(item)
        if self._release_handle is None:
            self._release_handle = loop.call_soon(self._send_releases)
        return item.done

    async def landed(self, done: asyncio.Future[bool] | None) -> None:
        """Wait until a release is in Redis, at most the wait bound (a request's last bytes
        wait for it, so a client that has its answer finds its tokens back, fleet-wide)."""
        if done is not None and not done.done():
            await asyncio.wait((done,), timeout=self._wait_s)

    # ---- renewal ---------------------------------------------------------------

    async def renew(self) -> bool:
        """One renewal: keep every held lease alive (adopting those Redis lost), drop the
        released ones it may still hold, count the gates. True when Redis answered."""
        sent = tuple(self._held.values())
        drops, self._drops = self._drops, {}
        started = time.perf_counter()
        try:
            async with asyncio.timeout(max(self._wait_s, self.config.renew_interval_s)):
                gates, adopted = await self._renew_call(leases=sent, drops=drops)
        except (TimeoutError, RedisError, OSError) as exc:
            for tenant, ids in drops.items():
                self._drops.setdefault(tenant, []).extend(ids)
            self._trim_drops()
            self._flip(self.health.failed(f"lease renewal: {exc or type(exc).__name__}"))
            return False
        in_time = (time.perf_counter() - started) <= self._wait_s
        if adopted:
            self.adopted += adopted
            log.info("shared limits: Redis had lost %d of this gate's leases; adopted them again", adopted)
        self._flip(self.health.probed(gates, in_time))
        # Released while the renewal was on its way: it may have put them back.
        for lease in sent:
            if lease.released:
                self._queue_drop(lease)
        return True

    async def _run(self) -> None:
        # Stopped by cancel(). Every timed wait on this path is `asyncio.timeout`, never
        # `asyncio.wait_for`: on Python 3.11 wait_for returns the answer instead of the
        # cancellation when both come in the same loop turn, and this loop then renewed
        # forever while stop() waited for it (a CI run hung at a gate's shutdown).
        while True:
            await asyncio.sleep(self.config.renew_interval_s)
            await self.renew()

    async def _renew_call(
        self, *, leases: Iterable[Lease] = (), drops: dict[str, list[str]] | None = None, leaving: bool = False
    ) -> tuple[int, int]:
        assert self._redis is not None
        by_tenant: dict[str, tuple[list[Lease], list[str]]] = {}
        for lease in leases:
            by_tenant.setdefault(lease.tenant, ([], []))[0].append(lease)
        for tenant, ids in (drops or {}).items():
            by_tenant.setdefault(tenant, ([], []))[1].extend(ids)
        prefix = self.config.key_prefix
        keys: list[str] = [f"{prefix}gates"]
        args: list[Any] = [self.member, self._ttl_ms, self._keep_ms, self._ttl_ms, 1 if leaving else 0]
        for tenant, (held, dropped) in by_tenant.items():
            keys.extend(tenant_keys(prefix, tenant)[1:])
            args.append(len(held))
            for lease in held:
                args.extend((lease.id, lease.cost))
            args.append(len(dropped))
            args.extend(dropped)
        gates, adopted = await self._call(RENEW, keys, args)
        return int(gates), int(adopted)

    # ---- internals ---------------------------------------------------------------

    async def _call(self, script: Script, keys: list[str], args: list[Any]) -> Any:
        assert self._redis is not None
        try:
            return await self._redis.evalsha(script.sha, len(keys), *keys, *args)
        except NoScriptError:  # a restarted or flushed Redis: EVAL sends the text and caches it
            return await self._redis.eval(script.text, len(keys), *keys, *args)

    def _by_policy(self, tenant: str, cost: int, rpm: int | None, tpm: int | None, leased: bool) -> Lease | None:
        """Redis cannot decide this request: the failure policy does."""
        policy = self.health.policy
        self._on_policy(policy)
        if policy == "fail_closed":
            raise GateError(
                Reason.SHARED_LIMIT_UNAVAILABLE,
                f"tenant {tenant!r}'s limits are shared across gates and cannot be checked right now; retry shortly",
                retry_after_s=max(1.0, self.config.renew_interval_s),
            )
        # fail_open: the gate's own limits, at 1/N, decide (the service divides them). The
        # lease is held so that the next renewal adopts it: the fleet's count stays true.
        # Its own id: a reservation given up on may still land, and is handed back by that id.
        if not leased:
            return None
        lease = Lease(self._new_id(), tenant, cost, rpm, tpm, leased=True, charged=False)
        self._held[lease.id] = lease
        return lease

    def _new_id(self) -> str:
        return f"{self.member}#{next(self._ids)}"

    def _take_releases(self) -> list[_Release]:
        batch, self._releases = self._releases, []
        if self._release_handle is not None:
            self._release_handle.cancel()
            self._release_handle = None
        return batch

    def _add_releases(self, keys: list[str], args: list[Any], batch: list[_Release]) -> None:
        for item in batch:
            lease = item.lease
            keys.extend(tenant_keys(self.config.key_prefix, lease.tenant))
            args.extend((lease.id if lease.leased else "", item.refund_tokens, item.refund_requests, _arg(lease.rpm), _arg(lease.tpm)))

    def _send_releases(self) -> None:
        """No reservation went out this turn to carry them: the releases go on their own."""
        self._release_handle = None
        batch = self._take_releases()
        if batch:
            self._spawn(self._release(batch))

    async def _release(self, batch: list[_Release]) -> None:
        keys: list[str] = []
        args: list[Any] = []
        self._add_releases(keys, args, batch)
        try:
            async with asyncio.timeout(max(self._wait_s, self.config.renew_interval_s)):
                await self._call(RELEASE, keys, args)
        except (TimeoutError, RedisError, OSError) as exc:
            self._releases_failed(batch)
            self._flip(self.health.failed(f"release: {exc or type(exc).__name__}"))
        else:
            for item in batch:
                item.settle(True)

    def _releases_landed(self, batch: list[_Release], call: asyncio.Task[Any]) -> None:
        """The reservation that carried ``batch`` is done."""
        if call.cancelled() or call.exception() is not None:
            self._releases_failed(batch)
        else:
            for item in batch:
                item.settle(True)

    def _releases_failed(self, batch: list[_Release]) -> None:
        """Whether they landed is unknown: the leases go again with the next renewal
        (dropping twice is harmless; a refund is not given twice, so it is given up)."""
        for item in batch:
            self._queue_drop(item.lease)
            item.settle(False)

    def _undo_late(self, lease: Lease, call: asyncio.Task[Any]) -> None:
        """A reservation answered after admission stopped waiting for it: hand it back."""
        if call.cancelled() or call.exception() is not None:
            return  # never made, or its fate unknown: a lease nobody renews expires
        reply = call.result()
        if reply[0] != "ok":
            return
        lease.released = True  # never handed to the request: only this hands it back
        refund_tokens, refund_requests = (lease.cost if lease.tpm is not None else 0), (1 if lease.rpm is not None else 0)
        self._spawn(self._release([_Release(lease, refund_tokens, refund_requests, call.get_loop().create_future())]))

    def _queue_drop(self, lease: Lease) -> None:
        if lease.leased:
            self._drops.setdefault(lease.tenant, []).append(lease.id)
            self._trim_drops()

    def _trim_drops(self) -> None:
        total = sum(len(ids) for ids in self._drops.values())
        while total > MAX_PENDING_DROPS:
            tenant = next(iter(self._drops))
            excess = min(total - MAX_PENDING_DROPS, len(self._drops[tenant]))
            del self._drops[tenant][:excess]
            if not self._drops[tenant]:
                del self._drops[tenant]
            total -= excess

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _flip(self, flip: Flip | None) -> None:
        if flip is None:
            return
        log.warning("shared limits: %s -> %s (%s; %d gates seen)", flip.old, flip.new, flip.why, flip.gates)
        self._on_flip(flip)
