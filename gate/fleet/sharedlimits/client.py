"""Tenant limits shared by every gate on one Redis: reserve, release, renew (the I/O shell).

The pure parts live beside it: the scripts Redis runs (:mod:`.scripts`) and the health
state machine with its failure policy (:mod:`.health`). This module owns the only Redis
connection pool, the only timers and the renewal task.

The request path (``gate/http/proxy.py``) calls :meth:`SharedLimits.reserve` once, after the
gate's own rate check and before local admission, and :meth:`SharedLimits.release` exactly
once when the request ends, whatever the path. A reservation is atomic: both rate buckets
and the in-flight quota are checked, and all are charged or none. The reservations made in
one turn of the loop go to Redis in one script call (a burst costs one round trip, not one
per request), with the releases waiting for a ride.

Redis is judged by what Redis did, not by how busy the gate is: the wait bound ``wait_ms``
counts only the time the gate's loop was free to hear the answer (:mod:`.heard`), so the
gate's own lag in a burst makes admission wait longer and does not flip the gate (Redis's own
delay does: a Redis starved of CPU on the same loaded host missed 20 ms in a trial, hence the
100 ms default). When Redis cannot be
reached, or had the whole bound and said nothing, the gate switches to its failure policy
at once and stops asking Redis until a renewal answers in time again (:mod:`.health`).

In-flight reservations are leases. Every ``renew_interval_s`` the gate renews all it holds
in one script, which also says it is alive and counts the gates alive (fail_open's N, also
counted in every reservation answer). A gate that dies stops renewing: its leases expire
within 3 x ``renew_interval_s`` of its last renewal, and the next reservation of that
tenant on any gate purges them. What a gate holds stays counted across a flip: under
fail_open the leases admitted through Redis count against the gate's local share with
those the policy admits, and the renewal that brings the gate back hands the latter to
Redis before the gate asks Redis again.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import itertools
import logging
import re
import secrets
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import AuthenticationError, AuthorizationError, NoPermissionError, NoScriptError, RedisError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from gate.config import SharedConfig, TenantConfig
from gate.core.errors import GateError
from gate.core.reasons import Reason
from gate.fleet.sharedlimits.causes import Cause, SharedStartError, scrub, slow
from gate.fleet.sharedlimits.health import Flip, SharedHealth, SharedState, fits_local_share, gates_phrase, local_share
from gate.fleet.sharedlimits.heard import Heard, hear
from gate.fleet.sharedlimits.scripts import RELEASE, RENEW, RESERVE, Script, tenant_keys

__all__ = ["Lease", "SharedLimits", "cause_of", "check_redis", "shown_redis_url"]

log = logging.getLogger("tokengate.shared")

#: lease ids waiting to be dropped from Redis while it is out of reach; past this the
#: oldest are forgotten (their leases expire by themselves)
MAX_PENDING_DROPS = 10_000
#: reservations in one script call; a larger burst goes in several (a call of 256 runs
#: in about a millisecond in Redis, which serves nobody else meanwhile)
MAX_BATCH = 256
#: recovery: renewals in a row that may find leases the policy made while they were on
#: their way, before the gate goes back to Redis anyway (the next renewal adopts the rest)
MAX_CATCH_UP = 3
#: connections opened at start. Every loop turn with reservations is one script call that holds
#: a connection until Redis answers, so a burst has several out at once; a connection opened
#: then costs two more round trips (CLIENT SETNAME, CLIENT SETINFO) inside the wait bound, and
#: on a busy host the first burst after each start flipped the gate while Redis was fine
WARM_CONNECTIONS = 16

#: what a reservation's answer is when Redis did not decide it
_BY_POLICY = "by_policy"  # Redis is out of reach or had the whole bound: the failure policy
_UNHEARD = "unheard"  # its fate is unknown and Redis is not to blame (see _reserve_batch)


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


@dataclass(slots=True, eq=False)
class _Reservation:
    lease: Lease
    quota: int | None
    #: the script's reply for it, or _BY_POLICY / _UNHEARD; cancelled if the request left
    answer: asyncio.Future[Any]


def shown_redis_url(url: str) -> str:
    """The Redis URL for the log: scheme, host, port and database, never a user or password."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return f"unix://{parts.path}"
    try:
        host = parts.hostname or "?"
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return f"{parts.scheme}://?"
    return f"{parts.scheme}://{host}{port}{parts.path}"


def _arg(limit: int | None) -> int:
    return -1 if limit is None else limit


#: Redis's words for a refusal of the gate's credentials, whatever class redis-py gives them
#: (WRONGPASS, NOAUTH, a HELLO without AUTH, ERR invalid password of old Redis versions)
_AUTH_WORDS = ("WRONGPASS", "NOAUTH", "HELLO must be called", "invalid username-password pair", "invalid password")
#: ... and for a database index it does not have (SELECT 99 on a Redis of 16)
_DB_WORDS = ("DB index is out of range", "invalid DB index", "Invalid Database")
_CREDENTIALS_HINT = (
    "correct the user and password in [shared] redis_url (redis://USER:PASSWORD@HOST:PORT/DB, or "
    "redis://:PASSWORD@HOST:PORT/DB for Redis's default user)"
)


def _refused(exc: BaseException) -> bool:
    """A refused connection, anywhere in ``exc``'s chain (redis-py keeps the OSError as its cause)."""
    seen: set[int] = set()
    at: BaseException | None = exc
    while at is not None and id(at) not in seen:
        seen.add(id(at))
        if isinstance(at, ConnectionRefusedError) or (isinstance(at, OSError) and at.errno == errno.ECONNREFUSED):
            return True
        at = at.__cause__ or at.__context__
    return "Error 111 " in str(exc) or "Connection refused" in str(exc)


def cause_of(exc: BaseException, url: str, *, bound_ms: float | None = None) -> Cause:
    """What ``exc`` of a call to the Redis at ``url`` says of Redis, shortly (:mod:`.causes`).
    ``bound_ms``: the heard-time bound a builtin TimeoutError (no answer in it) stands for."""
    words = str(exc)
    code = getattr(exc, "status_code", None)
    detail = scrub(
        f"{code} {words}" if isinstance(code, str) and code and not words.startswith(code) else (words or type(exc).__name__), url
    )
    if any(w in words for w in _DB_WORDS):
        db = urlsplit(url).path.strip("/") or "0"
        return Cause(
            "auth",
            f"Redis has no database {db}",
            detail,
            "name a database Redis has at the end of [shared] redis_url (0 to 15 unless its `databases` says more)",
        )
    if isinstance(exc, (AuthenticationError, AuthorizationError)) or any(w in words for w in _AUTH_WORDS):
        return Cause("auth", "Redis refused the gate's credentials", detail, _CREDENTIALS_HINT)
    if isinstance(exc, NoPermissionError):
        return Cause(
            "auth",
            "Redis refused the gate's user a command it needs",
            detail,
            "give the user of [shared] redis_url the commands the gate runs (EVALSHA, EVAL, SCRIPT LOAD, and the commands its "
            "scripts run on the keys under key_prefix), or name another user",
        )
    if isinstance(exc, TimeoutError) and not isinstance(exc, RedisError):
        return slow(bound_ms) if bound_ms is not None else Cause("slow", "Redis did not answer in time", detail)
    if isinstance(exc, RedisTimeoutError):
        return Cause("slow", "Redis did not answer in time", detail)
    if _refused(exc):
        return Cause("refused", "Redis refused the connection", detail)
    if isinstance(exc, (RedisConnectionError, OSError)):
        if "closed" in words.lower():
            return Cause("unreachable", "Redis closed the connection", detail)
        return Cause("unreachable", "Redis could not be reached", detail)
    if isinstance(exc, ResponseError):
        return Cause("error", "Redis answered with an error", detail)
    return Cause("error", "the call to Redis failed", f"{type(exc).__name__}: {detail}")


def start_refused(cause: Cause, url: str) -> SharedStartError:
    """The error that stops ``tokengate serve`` (exit 2): the key, the Redis, the cause, the fix."""
    return SharedStartError(
        f"[shared] redis_url ({shown_redis_url(url)}): {cause.text} ({cause.detail}). That is a mistake in the config, not "
        f"an outage: the gate does not start on it; {cause.hint}"
    )


async def check_redis(config: SharedConfig, *, timeout_s: float = 3.0) -> tuple[str, bool]:
    """What ``tokengate config check --backends`` says of ``[shared] redis_url``: ``ok (...)``,
    ``unreachable: ...``, ``authentication failed: ...`` or ``error: ...``; True when ok.
    One connection (its AUTH, SELECT and CLIENT SETNAME as the gate's), PING, and the count of
    gates alive on the key prefix; never writes."""
    url = config.redis_url
    try:
        client = aioredis.Redis.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            decode_responses=True,
            retry=Retry(NoBackoff(), 0),
            client_name="tokengate-config-check",
        )
    except ValueError as exc:
        return f"error: {scrub(str(exc), url)}", False
    try:
        started = time.perf_counter()
        await client.ping()
        took_ms = (time.perf_counter() - started) * 1000.0
        gates = int(await client.zcard(f"{config.key_prefix}gates"))
    except (RedisError, OSError) as exc:
        cause = cause_of(exc, url, bound_ms=timeout_s * 1000.0)
        if cause.kind == "auth":
            return f"authentication failed: {cause.text} ({cause.detail}); {cause.hint}", False
        if cause.kind in ("refused", "unreachable", "slow"):
            return f"unreachable: {cause.text} ({cause.detail})", False
        return f"error: {cause.text} ({cause.detail})", False
    finally:
        await client.aclose()
    alive = f"{gates} gate{'' if gates == 1 else 's'} alive on key prefix {config.key_prefix!r}"
    return f"ok (connected and answered PING in {took_ms:.1f} ms; {alive})", True


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
        on_expired: Callable[[int], None] = lambda count: None,
        on_gates: Callable[[int | None, int], None] = lambda old, new: None,
    ) -> None:
        self.config = config
        #: this gate on Redis: its gate id (host:pid:start, to the second) and a random tail,
        #: so that two gates started in one second by one process stay two
        self.member = f"{gate_id}/{secrets.token_hex(4)}"
        # N is the most gates counted within a lease's life (3 renewal intervals), so one
        # count taken before another gate's first renewal cannot lower it (#23).
        self.health = SharedHealth(config.failure_policy, window_s=config.lease_ttl_s)
        self._on_flip = on_flip
        self._on_policy = on_policy
        self._on_wait = on_wait
        self._on_expired = on_expired
        #: N as counted on Redis changed (old None: the first count since start): the service
        #: journals it, so a gate restarted while Redis is out of reach remembers it (rule 5)
        self._on_gates = on_gates
        self._told_gates: int | None = None
        self._wait_s = config.wait_ms / 1000.0
        self._ttl_ms = int(config.lease_ttl_s * 1000)
        self._keep_ms = max(2 * self._ttl_ms, 10_000)
        self._ids = itertools.count(1)
        self._held: dict[str, Lease] = {}  # leased, not yet released
        self._held_tokens: dict[str, int] = {}  # tenant -> the sum of its held leases' costs
        self._pending_tokens: dict[str, int] = {}  # tenant -> the costs of reservations awaiting Redis
        self._reserves: list[_Reservation] = []  # sent together on the next loop turn
        self._reserve_handle: asyncio.Handle | None = None
        self._drops: dict[str, list[str]] = {}  # tenant -> lease ids Redis should forget
        self._releases: list[_Release] = []  # sent together on the next loop turn
        self._release_handle: asyncio.Handle | None = None
        self._background: set[asyncio.Task[Any]] = set()
        self._runner: asyncio.Task[None] | None = None
        self._redis: aioredis.Redis | None = None
        self.adopted = 0  # leases Redis had lost and a renewal put back (a restart, fail_open)
        #: leases that expired on Redis while this gate held them: its renewals came too late
        self.expired_held = 0
        #: Redis's clock (ms) when it ran the last renewal that answered (None before the first)
        self._renewed_ms: float | None = None
        #: this gate's score in `renewed` after the last renewal that answered: while it is
        #: younger than `keep`, only a Redis that lost its keys can have lost it
        self._renewed_score: float | None = None
        self._redis_clock: tuple[float, float] | None = None  # (Redis's ms, monotonic s) at the last renewal answer
        self._cold = False  # the pool's connections may be dead (a failure): open them again once Redis answers
        self._starting = False  # start()'s first renewal: a refusal of the credentials raises

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
        of reach: the gate then starts under its failure policy and recovers by itself.

        Raises :class:`SharedStartError` when the first contact is refused for the gate's
        credentials, its user's rights or the database index: a config mistake, not an outage.
        A trial's gate with a wrong password served every tenant at its whole quota on top of
        the fleet, for ever, said once in the log."""
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
        self._starting = True  # a first contact refused for its credentials stops the gate (renew raises)
        try:
            answered = await self.renew()
        except SharedStartError:
            await self._redis.aclose()
            self._redis = None
            raise
        finally:
            self._starting = False
        if answered:
            gates = self.health.gates
            log.info(
                "shared limits: tenant limits shared through Redis %s (key prefix %r, %s, renewal every %g s, "
                "wait bound %g ms); %d gate%s seen",
                shown_redis_url(self.config.redis_url),
                self.config.key_prefix,
                self.config.failure_policy,
                self.config.renew_interval_s,
                self.config.wait_ms,
                gates,
                "" if gates == 1 else "s",
            )
            try:  # so that the first requests do not pay for NOSCRIPT
                for script in (RESERVE, RELEASE, RENEW):
                    await self._redis.script_load(script.text)
            except (RedisError, OSError) as exc:
                log.warning("shared limits: cannot load the scripts (%s); EVAL will", exc)
            await self._warm(WARM_CONNECTIONS)
        self._runner = asyncio.get_running_loop().create_task(self._run(), name="tokengate-shared-renew")

    async def _warm(self, count: int) -> None:
        """Open ``count`` connections now, so that a burst's calls find them in the pool."""
        assert self._redis is not None
        pool = self._redis.connection_pool
        opened: list[Any] = []
        try:
            for _ in range(count):
                opened.append(await pool.get_connection())
        except (RedisError, OSError) as exc:
            log.warning("shared limits: opened %d of %d connections to Redis (%s); the rest open when needed", len(opened), count, exc)
        finally:
            for connection in opened:
                await pool.release(connection)

    async def stop(self) -> None:
        """Stop renewing, hand back what is still held and leave the gate count; bounded."""
        if self._runner is not None:
            self._runner.cancel()
            _, running = await asyncio.wait((self._runner,), timeout=5.0)
            if running:  # a lost cancellation must not hold the gate's shutdown for ever
                log.error("shared limits: the renewal loop did not stop within 5 s of its cancel; left behind")
            self._runner = None
        for item in self._take_reserves():
            self._settle(item, _UNHEARD)  # never sent: nothing to hand back
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
        self._held_tokens.clear()
        for release in self._take_releases():
            self._queue_drop(release.lease)  # refunds at shutdown are not worth a wait
            release.settle(False)
        drops, self._drops = self._drops, {}
        try:
            async with asyncio.timeout(1.0):
                await self._renew_call(drops=drops, leaving=True)
        except (TimeoutError, RedisError, OSError) as exc:
            why = "no answer within 1 s" if isinstance(exc, TimeoutError) else (str(exc) or type(exc).__name__)
            log.warning("shared limits: could not say goodbye to Redis (%s); this gate's leases expire by themselves", why)
        await self._redis.aclose()
        self._redis = None

    # ---- the request path -------------------------------------------------------

    async def reserve(self, tenant: TenantConfig, cost: int) -> Lease | None:
        """Check and charge ``tenant``'s shared limits for a request of ``cost`` tokens.

        Returns the lease to release when the request ends, or None when nothing was held
        (a tenant without limits). Raises :class:`GateError` with 429 ``rate_limited``,
        ``tenant_quota`` or ``shared_limit_unavailable`` (fail_closed; or a gate too busy
        to hear Redis's answer for a second or more).
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
        health = self.health
        if self._redis is None or (health.degraded and not (health.recovering and health.policy == "fail_open")):
            return self._by_policy(name, cost, rpm, tpm, quota)
        if health.degraded:
            # Recovering under fail_open: Redis decides, and the gate keeps to its local share
            # too, since Redis may not count yet what the other gates admitted on their own.
            self._check_local_share(name, cost, quota, self._pending_tokens.get(name, 0))
        lease = Lease(self._new_id(), name, cost, rpm, tpm, leased=leased, charged=True)
        loop = asyncio.get_running_loop()
        item = _Reservation(lease, quota, loop.create_future())
        self._reserves.append(item)
        if self._reserve_handle is None:
            self._reserve_handle = loop.call_soon(self._send_reserves)
        started = time.perf_counter()  # not loop.time(): uvloop's clock moves in whole milliseconds
        self._pending_tokens[name] = self._pending_tokens.get(name, 0) + cost
        try:
            # Not shielded: a request that leaves cancels its answer, and the batch hands
            # back a reservation that lands for nobody (_settle).
            answer = await item.answer
        except asyncio.CancelledError:
            if item.answer.done() and not item.answer.cancelled():
                self._undo(lease, item.answer.result())  # answered in the turn the request left
            raise
        finally:
            left = self._pending_tokens[name] - cost
            if left > 0:
                self._pending_tokens[name] = left
            else:
                del self._pending_tokens[name]
        self._on_wait(time.perf_counter() - started)
        if answer == _BY_POLICY:
            return self._by_policy(name, cost, rpm, tpm, quota)
        if answer == _UNHEARD:
            raise GateError(
                Reason.SHARED_LIMIT_UNAVAILABLE,
                f"the limits of tenant {name!r} are shared across gates and this gate was too busy to hear Redis's "
                "answer in time; retry shortly",
                retry_after_s=1.0,
            )
        reply = answer
        if reply[0] == "ok":
            if lease.leased:
                self._hold(lease)
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
        the loop, with the others of that turn, riding on the reservations if some go out too.
        """
        if lease.released:
            return None
        lease.released = True
        self._unhold(lease)
        refund = lease.charged and (refund_tokens > 0 or refund_requests > 0)
        if not lease.leased and not refund:
            return None
        if (self.health.degraded and not self.health.recovering) or self._redis is None:
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
        released ones it may still hold, count the gates. True when Redis answered.

        A degraded gate that this renewal brings back (or makes recovering: rule 3 of
        .health) first makes sure Redis has every lease it holds: leases the policy made
        while the renewal was on its way go in another one right away (at most MAX_CATCH_UP
        in all), so that the count the gate and the others go back to is true."""
        for _ in range(MAX_CATCH_UP):
            sent = tuple(self._held.values())
            drops, self._drops = self._drops, {}
            composed = self._redis_now_ms()  # when `sent` was taken, on Redis's clock
            call = asyncio.get_running_loop().create_task(self._renew_call(leases=sent, drops=drops, composed_ms=composed))
            heard, answered = await self._answer(call)
            try:
                if not answered or call.cancelled():
                    raise TimeoutError(f"no answer in {heard.heard_s * 1000:.0f} ms")
                gates, adopted, redis_ms, fresh, knew = call.result()
            except (TimeoutError, RedisError, OSError) as exc:
                for tenant, ids in drops.items():
                    self._drops.setdefault(tenant, []).extend(ids)
                self._trim_drops()
                if isinstance(exc, RedisTimeoutError) and not heard.spent:
                    return False  # the gate was too busy to read it in time: not Redis's fault
                cause = cause_of(exc, self.config.redis_url, bound_ms=heard.bound_s * 1000.0)
                if self._starting and cause.kind == "auth":
                    raise start_refused(cause, self.config.redis_url) from None
                self._failed(exc, "lease renewal", cause=cause)
                return False
            # Redis's part of it: the gate's own lag does not keep it degraded.
            in_time = heard.heard_s <= self._wait_s
            # How long Redis went without a renewal from this gate, on Redis's own clock: a
            # lease lives from the renewal Redis ran, and the gate's clock at composing said
            # less (a renewal composed on time can wait in a busy loop before it goes out).
            since_s = None if self._renewed_ms is None else (redis_ms - self._renewed_ms) / 1000.0
            # Redis lost its keys (a restart without persistence, a flush) if this gate's mark in
            # `renewed`, young enough that no renewal trimmed it, is gone.
            wiped = not knew and self._renewed_score is not None and self._renewed_score >= redis_ms - self._keep_ms
            self._renewed_ms = redis_ms
            self._renewed_score = float(composed) if 0 <= composed <= redis_ms else redis_ms
            if adopted:
                self.adopted += adopted
                await self._adopted(adopted, sent, since_s, wiped=wiped, knew=knew)
            # Released while the renewal was on its way: it may have put them back.
            for lease in sent:
                if lease.released:
                    self._queue_drop(lease)
            given = set(map(id, sent))
            unsent = any(not lease.charged and id(lease) not in given for lease in self._held.values())
            if not (self.health.degraded and in_time and unsent):
                break
            self._counted(gates)
        self._flip(self.health.probed(gates, in_time, now=time.monotonic(), redis_ms=redis_ms, fresh=fresh))
        self._tell_gates()
        if self._cold and in_time:
            # Back from a failure (a Redis restart leaves every pooled connection dead): the
            # pool is opened again now, not by the next burst inside its wait bound.
            self._cold = False
            self._spawn(self._warm(WARM_CONNECTIONS))
        return True

    async def _run(self, *, clock: Callable[[], float] | None = None, sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        # Stopped by cancel(). Every timed wait on this path is `asyncio.timeout`, never
        # `asyncio.wait_for`: on Python 3.11 wait_for returns the answer instead of the
        # cancellation when both come in the same loop turn, and this loop then renewed
        # forever while stop() waited for it (a CI run hung at a gate's shutdown).
        # At a fixed rate, from one renewal's start to the next: a renewal that waited on a
        # busy loop (or on Redis) does not push the next one back by as long. Slept after
        # each renewal instead, the gap between two was the interval plus the renewal's own
        # time, and on a loaded host (load 8 on 2 cores, three gates in one process) leases
        # of a gate that held them expired on Redis between two renewals: another gate then
        # admitted past the tenant's quota (389 in flight of 300, tests/integration/test_shared_fleet.py).
        now = clock or asyncio.get_running_loop().time
        interval = self.config.renew_interval_s
        due = now() + interval
        while True:
            await sleep(max(0.0, due - now()))
            due = now() + interval
            await self.renew()

    async def _renew_call(
        self,
        *,
        leases: Iterable[Lease] = (),
        drops: dict[str, list[str]] | None = None,
        leaving: bool = False,
        composed_ms: int = -1,
    ) -> tuple[int, int, float, int, bool]:
        """(gates counted, leases adopted, Redis's clock in ms, gates renewed since recovering
        began, whether Redis knew this gate from an earlier renewal)."""
        assert self._redis is not None
        by_tenant: dict[str, tuple[list[Lease], list[str]]] = {}
        for lease in leases:
            by_tenant.setdefault(lease.tenant, ([], []))[0].append(lease)
        for tenant, ids in (drops or {}).items():
            by_tenant.setdefault(tenant, ([], []))[1].extend(ids)
        prefix = self.config.key_prefix
        keys: list[str] = [f"{prefix}gates", f"{prefix}renewed"]
        since = -1 if self.health.heard_since is None else self.health.heard_since
        args: list[Any] = [self.member, self._ttl_ms, self._keep_ms, self._ttl_ms, 1 if leaving else 0, since, composed_ms]
        for tenant, (held, dropped) in by_tenant.items():
            keys.extend(tenant_keys(prefix, tenant)[1:])
            args.append(len(held))
            for lease in held:
                args.extend((lease.id, lease.cost))
            args.append(len(dropped))
            args.extend(dropped)
        gates, adopted, redis_ms, fresh, knew = await self._call(RENEW, keys, args)
        self._redis_clock = (float(redis_ms), time.monotonic())
        return int(gates), int(adopted), float(redis_ms), int(fresh), bool(int(knew))

    async def _restarted_since(self, since_s: float | None) -> bool:
        """Did Redis start after this gate's last renewal that answered, ``since_s`` ago (on
        Redis's clock)? Asked (INFO server) only when Redis did not know this gate and that
        renewal was too long ago to tell from its mark; False when Redis does not say (an ACL
        without INFO, no answer within the renewal bound)."""
        if since_s is None or self._redis is None:
            return False
        try:
            async with asyncio.timeout(max(self._wait_s, self.config.renew_interval_s)):
                info = await self._redis.info("server")
            uptime_s = int(info["uptime_in_seconds"])
        except (TimeoutError, RedisError, OSError, KeyError, TypeError, ValueError):
            return False
        return uptime_s + 1 <= since_s  # whole seconds: up less than since_s for certain

    async def _adopted(
        self, adopted: int, sent: tuple[Lease, ...], since_s: float | None, *, wiped: bool = False, knew: bool = True
    ) -> None:
        """Say what the `adopted` leases of a renewal that carried `sent` were: those the failure
        policy admitted (handed over: the plan), those released while the renewal was on its
        way (put back by it, dropped by the next one), and the rest, which Redis had lost: by
        a restart or a flush (``wiped``: Redis no longer knew this gate), an eviction, or
        because they expired there while this gate held them, its renewals `since_s` apart
        being later than a lease lives. The last is the one that breaks the quota (another gate
        may admit what they held), so it is a warning, counted; a restart is said as such (a
        trial's restart of Redis under fail_closed was warned and counted as expiries, and
        filed TokengateSharedLeasesExpired, which sent the reader to the gate's CPU)."""
        # Those the failure policy admitted were never in Redis: handing them over is the
        # plan, not a loss (a log saying "lost" sent the reader looking for an eviction).
        ours = min(adopted, sum(1 for lease in sent if lease.leased and not lease.charged))
        if ours:
            log.info(
                "shared limits: handed Redis %d lease(s) admitted under %s while it was out of reach", ours, self.config.failure_policy
            )
        # A release that reached Redis before this renewal: the renewal put the lease back.
        raced = min(adopted - ours, sum(1 for lease in sent if lease.released))
        lost = adopted - ours - raced
        if not lost:
            return
        ttl_s = self.config.lease_ttl_s
        if not wiped and not knew:  # its mark too old to tell: did Redis start since?
            wiped = await self._restarted_since(since_s)
        if wiped:
            log.warning(
                "shared limits: Redis restarted (or was flushed) and lost its keys: %d lease(s) re-adopted (each gate puts "
                "its leases back at its next renewal; not leases that expired while held)",
                lost,
            )
        elif since_s is not None and since_s >= ttl_s:
            self.expired_held += lost
            self._on_expired(lost)
            log.warning(
                "shared limits: %d lease(s) expired on Redis while this gate held them: its last two renewals Redis "
                "answered were %.1f s apart and a lease lives %g s (3 renewal intervals). The gate's event loop was too "
                "busy, or Redis out of reach, to renew in time; meanwhile other gates could admit past those tenants' "
                "quotas. Adopted them again",
                lost,
                since_s,
                ttl_s,
            )
        else:
            log.info("shared limits: Redis had lost %d of this gate's leases (a restart, or an eviction); adopted them again", lost)

    def _redis_now_ms(self) -> int:
        """Redis's clock now, as this gate can tell (-1 before any renewal answered): the
        last renewal's ``now`` plus the time since its answer was read. Never ahead of
        Redis (the answer was read after Redis ran it), so a renewal is never taken for
        one composed later than it was (the RENEW script's ``renewed``)."""
        if self._redis_clock is None:
            return -1
        redis_ms, read_at = self._redis_clock
        return int(redis_ms + (time.monotonic() - read_at) * 1000.0)

    # ---- internals ---------------------------------------------------------------

    async def _call(self, script: Script, keys: list[str], args: list[Any]) -> Any:
        assert self._redis is not None
        try:
            return await self._redis.evalsha(script.sha, len(keys), *keys, *args)
        except NoScriptError:  # a restarted or flushed Redis: EVAL sends the text and caches it
            return await self._redis.eval(script.text, len(keys), *keys, *args)

    def _by_policy(self, tenant: str, cost: int, rpm: int | None, tpm: int | None, quota: int | None) -> Lease | None:
        """Redis cannot decide this request: the failure policy does."""
        policy = self.health.policy
        self._on_policy(policy)
        if policy == "fail_closed":
            raise GateError(
                Reason.SHARED_LIMIT_UNAVAILABLE,
                f"the limits of tenant {tenant!r} are shared across gates and cannot be checked right now; retry shortly",
                retry_after_s=max(1.0, self.config.renew_interval_s),
            )
        # fail_open: the gate's own limits, at 1/N, decide (the service divides them), and
        # the in-flight share counts everything this gate holds for the tenant, what Redis
        # admitted before the flip included (rule 6 of .health). The lease is held so that
        # the next renewal adopts it: the fleet's count stays true. Its own id: a reservation
        # given up on may still land, and is handed back by that id.
        if quota is None:
            return None
        self._check_local_share(tenant, cost, quota, self._pending_tokens.get(tenant, 0))
        lease = Lease(self._new_id(), tenant, cost, rpm, tpm, leased=True, charged=False)
        self._hold(lease)
        return lease

    def _check_local_share(self, tenant: str, cost: int, quota: int | None, pending: int) -> None:
        """fail_open's in-flight rule: all the gate holds for ``tenant``, the reservations it
        is still waiting on included, plus ``cost`` must fit 1/N of the quota."""
        held, divisor = self._held_tokens.get(tenant, 0), self.divisor
        if not fits_local_share(held + pending, cost, quota, divisor):
            waiting = f", {pending} more awaiting Redis's answer," if pending else ""
            raise GateError(
                Reason.TENANT_QUOTA,
                f"tenant {tenant!r} holds {held} of its {local_share(quota, divisor)} in-flight tokens on this gate{waiting} "
                f"while its limits cannot be checked across the gates (1/{divisor} of {quota}); this request needs {cost}",
                retry_after_s=1.0,
            )

    def _hold(self, lease: Lease) -> None:
        self._held[lease.id] = lease
        self._held_tokens[lease.tenant] = self._held_tokens.get(lease.tenant, 0) + lease.cost

    def _unhold(self, lease: Lease) -> None:
        if self._held.pop(lease.id, None) is None:
            return
        left = self._held_tokens.get(lease.tenant, 0) - lease.cost
        if left > 0:
            self._held_tokens[lease.tenant] = left
        else:
            self._held_tokens.pop(lease.tenant, None)

    def _new_id(self) -> str:
        return f"{self.member}#{next(self._ids)}"

    # ---- reservations, in batches --------------------------------------------------

    def _take_reserves(self) -> list[_Reservation]:
        batch, self._reserves = self._reserves, []
        if self._reserve_handle is not None:
            self._reserve_handle.cancel()
            self._reserve_handle = None
        return batch

    def _send_reserves(self) -> None:
        """The reservations of the last turn go out, MAX_BATCH to a call, with the releases."""
        self._reserve_handle = None
        batch = [item for item in self._take_reserves() if not item.answer.cancelled()]  # not for a request gone
        riders = self._take_releases()
        for start in range(0, len(batch), MAX_BATCH):
            self._spawn(self._reserve_batch(batch[start : start + MAX_BATCH], riders))
            riders = []
        if riders:
            self._spawn(self._release(riders))

    async def _reserve_batch(self, batch: list[_Reservation], riders: list[_Release]) -> None:
        """One script call for ``batch``; every reservation in it gets exactly one answer."""
        prefix = self.config.key_prefix
        keys: list[str] = [f"{prefix}gates"]
        args: list[Any] = [self.member, self._ttl_ms, self._keep_ms, len(batch), len(riders)]
        for item in batch:
            lease = item.lease
            keys.extend(tenant_keys(prefix, lease.tenant))
            args.extend((lease.id, lease.cost, _arg(lease.rpm), _arg(lease.tpm), _arg(item.quota)))
        self._add_releases(keys, args, riders)
        # A task of its own, so that giving up on it does not lose its answer: reservations
        # that land late are handed back at once.
        call = asyncio.get_running_loop().create_task(self._call(RESERVE, keys, args))
        if riders:
            call.add_done_callback(functools.partial(self._releases_landed, riders))
        try:
            heard = await hear(call, self._wait_s)
        except asyncio.CancelledError:  # stop(): their fate is unknown; made, they expire unrenewed
            call.cancel()
            for item in batch:
                self._settle(item, _UNHEARD)
            raise
        if not call.done():
            # Redis had the whole bound of the gate's attention and said nothing: slow or hung.
            call.add_done_callback(functools.partial(self._landed_late, batch))
            self._flip(
                self.health.timed_out(
                    f"{self.config.wait_ms:g} ms, {heard.lag_s * 1000:.0f} ms of the gate's own lag beside it",
                    slow(self.config.wait_ms).text,
                )
            )
            for item in batch:
                self._settle(item, _BY_POLICY)
            return
        exc = asyncio.CancelledError() if call.cancelled() else call.exception()
        if exc is not None:
            if isinstance(exc, RedisTimeoutError) and not heard.spent:
                # redis-py's own socket timeout (at least a second) passed while the loop was
                # too busy to read: whether Redis made them is unknown, and not Redis's fault.
                # No flip, and no policy either (it could admit past the quota while Redis
                # answers): these requests are refused; their leases, if made, expire.
                log.warning("shared limits: %d reservations unread after %.0f ms of loop lag; refused", len(batch), heard.lag_s * 1000)
                answer = _UNHEARD
            else:
                self._failed(exc, "reservation")
                answer = _BY_POLICY
            for item in batch:
                self._settle(item, answer)
            return
        gates, *replies = call.result()
        self.health.answered()
        self._counted(int(gates))
        for item, reply in zip(batch, replies, strict=True):
            self._settle(item, reply)

    def _settle(self, item: _Reservation, answer: Any) -> None:
        """Give a reservation its answer; one whose request has left is handed back."""
        if not item.answer.done():
            item.answer.set_result(answer)
        elif item.answer.cancelled():
            self._undo(item.lease, answer)

    def _landed_late(self, batch: list[_Reservation], call: asyncio.Task[Any]) -> None:
        """A batch answered after admission stopped waiting for it: hand back what it made."""
        if call.cancelled() or call.exception() is not None:
            return  # never made, or its fate unknown: a lease nobody renews expires
        gates, *replies = call.result()
        self._counted(int(gates))
        for item, reply in zip(batch, replies, strict=True):
            self._undo(item.lease, reply)

    def _undo(self, lease: Lease, reply: Any) -> None:
        """A reservation Redis made for a request that does not have it: hand it back."""
        if not isinstance(reply, list) or reply[0] != "ok" or lease.released:
            return
        lease.released = True  # never handed to the request: only this hands it back
        refund_tokens, refund_requests = (lease.cost if lease.tpm is not None else 0), (1 if lease.rpm is not None else 0)
        self._spawn(self._release([_Release(lease, refund_tokens, refund_requests, asyncio.get_running_loop().create_future())]))

    # ---- releases ------------------------------------------------------------------

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
        if self._reserves:
            return  # reservations go out this turn too and take them along
        batch = self._take_releases()
        if batch:
            self._spawn(self._release(batch))

    async def _answer(self, call: asyncio.Task[Any]) -> tuple[Heard, bool]:
        """Wait for a renewal's or a release's call within the renewal bound, counted in heard
        time; one that did not answer in it is cancelled. (how long it was heard, answered)."""
        try:
            heard = await hear(call, max(self._wait_s, self.config.renew_interval_s))
        except asyncio.CancelledError:
            call.cancel()
            raise
        answered = call.done()
        if not answered:
            call.cancel()
        return heard, answered

    async def _release(self, batch: list[_Release]) -> None:
        keys: list[str] = []
        args: list[Any] = []
        self._add_releases(keys, args, batch)
        call = asyncio.get_running_loop().create_task(self._call(RELEASE, keys, args))
        heard, answered = await self._answer(call)
        if not answered:
            exc: BaseException | None = TimeoutError(f"no answer in {heard.heard_s * 1000:.0f} ms")
        else:
            exc = asyncio.CancelledError() if call.cancelled() else call.exception()
        if exc is None:
            for item in batch:
                item.settle(True)
            return
        self._releases_failed(batch)
        if not (isinstance(exc, RedisTimeoutError) and not heard.spent):  # else the gate's lag, not Redis
            self._failed(exc, "release", bound_ms=heard.bound_s * 1000.0)

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

    def _counted(self, gates: int) -> None:
        """Redis counted ``gates`` gates now (rule 5)."""
        self.health.seen(gates, time.monotonic())
        self._tell_gates()

    def _tell_gates(self) -> None:
        if self.health.ever_seen and self.health.gates != self._told_gates:
            old, self._told_gates = self._told_gates, self.health.gates
            self._on_gates(old, self._told_gates)

    def _failed(self, exc: BaseException, where: str, *, bound_ms: float | None = None, cause: Cause | None = None) -> None:
        """A call to Redis (``where``) failed with ``exc``: the failure policy, said with its
        cause (a refused password is not an outage; /health says which). Degraded already, a
        new cause is logged once (Redis stopped answering, then refused the connection)."""
        cause = cause or cause_of(exc, self.config.redis_url, bound_ms=bound_ms)
        before = self.health.cause if self.health.degraded else None
        flip = self.health.failed(cause.why(where), cause.text)
        if flip is None and before is not None and before != self.health.cause:
            log.warning("shared limits: still %s, now: %s", self.health.state, cause.why(where))
        self._flip(flip)

    def _flip(self, flip: Flip | None) -> None:
        if flip is None:
            return
        if flip.new != "ok":
            self._cold = True
        log.warning("shared limits: %s -> %s (%s; %s)", flip.old, flip.new, flip.why, gates_phrase(flip.gates, flip.known))
        self._on_flip(flip)
