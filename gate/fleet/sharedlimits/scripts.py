"""The Lua scripts Redis runs for the shared tenant limits: each one atomic, one round trip.

Keys of tenant T under prefix P (the ``{T}`` hash tag keeps them in one slot):

- ``P{T}:rate``    hash ``r`` (requests left), ``t`` (tokens left), ``ts`` (ms of the last
  update): the two token buckets of requests_per_minute and tokens_per_minute. A missing
  key is a full bucket; it expires 61 s after its last take, when it would be full anyway.
- ``P{T}:leases``  sorted set: lease id -> the moment (ms, Redis clock) it expires.
- ``P{T}:costs``   hash: lease id -> the tokens it holds; its fields are the live leases.
- ``P{T}:held``    integer: the sum of ``costs``, the tenant's in-flight tokens, fleet-wide.
- ``Pgates``       sorted set: gate id -> when it last renewed or reserved (ms); the N of
  fail_open. A renewal drops the gates silent for longer than a lease lives.

Time is Redis's own clock (``TIME``), so the gates' clocks never need to agree. A lease
lives ``ttl`` ms from its reservation or last renewal; whoever runs a script first after
that purges it (at most 256 per call; the rest on the next). The lease keys expire
``keep`` (>= ttl) after their last write, so a tenant nobody uses leaves nothing behind.

Invariants the scripts keep (``tests/integration/test_shared_scripts.py`` checks them
against a real redis-server): ``held`` equals the sum of ``costs``; a refused reservation
changes nothing; a release of a lease that is gone (released, expired) changes nothing but
the refund; a reservation is admitted only if ``held + cost <= quota`` after purging.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

__all__ = ["RELEASE", "RENEW", "RESERVE", "Script", "tenant_keys"]


@dataclass(frozen=True, slots=True)
class Script:
    """A script's text and its sha1 (EVALSHA runs it; EVAL when Redis answers NOSCRIPT)."""

    name: str
    text: str
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha", hashlib.sha1(self.text.encode()).hexdigest())


def tenant_keys(prefix: str, tenant: str) -> tuple[str, str, str, str]:
    """(rate, leases, costs, held) of ``tenant``."""
    base = f"{prefix}{{{tenant}}}"
    return (f"{base}:rate", f"{base}:leases", f"{base}:costs", f"{base}:held")


# Shared by the scripts below: the clock, and dropping one lease or every expired one.
_COMMON = """
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function drop(leases, costs, held, id)
  local c = redis.call('HGET', costs, id)
  if not c then
    return 0
  end
  redis.call('HDEL', costs, id)
  redis.call('ZREM', leases, id)
  if redis.call('DECRBY', held, c) <= 0 then
    redis.call('DEL', held)
  end
  return 1
end

local function refund(rate, tokens, requests, rpm, tpm, now)
  if tokens <= 0 and requests <= 0 then
    return
  end
  local b = redis.call('HMGET', rate, 'r', 't', 'ts')
  if not b[3] then
    return  -- a missing bucket is full: nothing to give back
  end
  local dt = math.max(0, now - tonumber(b[3]))
  local fields = {'ts', now}
  if b[1] and rpm > 0 then
    fields[#fields + 1] = 'r'
    fields[#fields + 1] = tostring(math.min(rpm, tonumber(b[1]) + dt * rpm / 60000 + requests))
  end
  if b[2] and tpm > 0 then
    fields[#fields + 1] = 't'
    fields[#fields + 1] = tostring(math.min(tpm, tonumber(b[2]) + dt * tpm / 60000 + tokens))
  end
  redis.call('HSET', rate, unpack(fields))
end

-- Releases: KEYS from k on, 4 per entry (rate, leases, costs, held); ARGV from a on, 5 per
-- entry (lease id or '' for none, refund tokens, refund requests, rpm, tpm; -1 = unset).
-- A lease that is gone (released, expired) is not dropped twice; the refund is given
-- either way (the rate charge does not depend on the lease), capped at capacity.
local function release_entries(k, a, count, now)
  local released = 0
  for _ = 1, count do
    if ARGV[a] ~= '' then
      released = released + drop(KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], ARGV[a])
    end
    refund(KEYS[k], tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4]), now)
    k = k + 4
    a = a + 5
  end
  return released
end

local function purge(leases, costs, held, now)
  local gone = redis.call('ZRANGEBYSCORE', leases, '-inf', now, 'LIMIT', 0, 256)
  for _, id in ipairs(gone) do
    if drop(leases, costs, held, id) == 0 then
      redis.call('ZREM', leases, id)
    end
  end
  return tonumber(redis.call('GET', held) or '0')
end
"""

RESERVE = Script(
    "reserve",
    _COMMON
    + """
-- One reservation: KEYS[k..k+3] its tenant's rate, leases, costs, held; ARGV[a..a+4] its
-- lease id, cost, rpm, tpm, quota (each -1 when unset).
-- -> {'ok', held} | {'rate', 'requests'|'tokens', wait ms} | {'quota', held}
local function reserve_one(k, a, ttl, keep, now)
  local rate, leases, costs, held_key = KEYS[k], KEYS[k + 1], KEYS[k + 2], KEYS[k + 3]
  local id, cost = ARGV[a], tonumber(ARGV[a + 1])
  local rpm, tpm, quota = tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
  local req, tok
  if rpm > 0 or tpm > 0 then
    local b = redis.call('HMGET', rate, 'r', 't', 'ts')
    local dt = 0
    if b[3] then
      dt = math.max(0, now - tonumber(b[3]))
    end
    local wait_r, wait_t = 0, 0
    if rpm > 0 then
      req = math.min(rpm, (tonumber(b[1]) or rpm) + dt * rpm / 60000)
      if req < 1 then
        wait_r = (1 - req) * 60000 / rpm
      end
    end
    if tpm > 0 then
      tok = math.min(tpm, (tonumber(b[2]) or tpm) + dt * tpm / 60000)
      if tok < cost then
        wait_t = (cost - tok) * 60000 / tpm
      end
    end
    if wait_r > 0 or wait_t > 0 then
      if wait_r >= wait_t then
        return {'rate', 'requests', tostring(wait_r)}
      end
      return {'rate', 'tokens', tostring(wait_t)}
    end
  end

  local held = 0
  if quota >= 0 then
    held = purge(leases, costs, held_key, now)
    if held + cost > quota then
      return {'quota', tostring(held)}
    end
  end

  if req or tok then
    local fields = {'ts', now}
    if req then
      fields[#fields + 1] = 'r'
      fields[#fields + 1] = tostring(req - 1)
    end
    if tok then
      fields[#fields + 1] = 't'
      fields[#fields + 1] = tostring(tok - cost)
    end
    redis.call('HSET', rate, unpack(fields))
    redis.call('PEXPIRE', rate, 61000)
  end
  if quota >= 0 then
    redis.call('ZADD', leases, now + ttl, id)
    redis.call('HSET', costs, id, cost)
    held = redis.call('INCRBY', held_key, cost)
    redis.call('PEXPIRE', leases, keep)
    redis.call('PEXPIRE', costs, keep)
    redis.call('PEXPIRE', held_key, keep)
  end
  return {'ok', tostring(held)}
end

-- KEYS: gates, then 4 per reservation (rate, leases, costs, held), then 4 per release entry
-- ARGV: gate id, lease ttl ms, keep ms, reservations r, release entries e, then 5 per
--       reservation (see reserve_one), then 5 per release entry (see release_entries)
-- -> {gates, reply of reservation 1, ..., reply of reservation r}
-- The reservations of one turn of the gate's loop come in one call, in the order they were
-- made, each seeing the ones before it; the releases that waited for a ride (requests that
-- ended since the last call) go first. The gate is counted as alive (it may hold leases
-- from now on) and told how many gates are: fail_open's N from every answer, not only from
-- the renewals.
local gate, ttl, keep = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local r, e = tonumber(ARGV[4]), tonumber(ARGV[5])
local now = now_ms()
release_entries(2 + 4 * r, 6 + 5 * r, e, now)
redis.call('ZADD', KEYS[1], now, gate)
redis.call('PEXPIRE', KEYS[1], keep)
local out = {redis.call('ZCARD', KEYS[1])}
for i = 0, r - 1 do
  out[#out + 1] = reserve_one(2 + 4 * i, 6 + 5 * i, ttl, keep, now)
end
return out
""",
)

RELEASE = Script(
    "release",
    _COMMON
    + """
-- KEYS: 4 per entry (rate, leases, costs, held); ARGV: 5 per entry (see release_entries)
-- -> how many leases were live and are now gone
return release_entries(1, 1, #KEYS / 4, now_ms())
""",
)

RENEW = Script(
    "renew",
    _COMMON
    + """
-- KEYS: gates, renewed, then for each tenant: leases, costs, held
-- ARGV: gate id, lease ttl ms, keep ms, gate window ms, leaving (1|0), since ms (-1: now),
--       composed ms (-1: now), then for each tenant: n, n x (lease id, cost), d, d x lease id to drop
-- -> {gates seen within the window, leases adopted, now ms, gates renewed since `since`, knew}
-- knew: 1 when `renewed` held this gate before this call, 0 when not: its first renewal, or
-- Redis lost the key (a restart without persistence, a flush), which the gate tells from a
-- lease that expired while Redis ran: it knows when its last renewal left its mark there.
-- Renewing is idempotent and self-healing: a lease this gate holds that Redis lost (a
-- restart without persistence, an expiry while Redis was out of reach, a reservation made
-- under fail_open) is adopted with its cost, so the fleet's count is true again. A gate
-- coming back from its failure policy asks how many gates have renewed since Redis first
-- answered it again: until all have, some may hold leases Redis does not count. `renewed`
-- keeps, for each gate, when its latest renewal was composed (the gate's estimate of this
-- clock, never later than now): what counts as renewed since is a renewal that carried
-- every lease the gate held at that moment. Not a reservation (gates: a gate degraded
-- since holds leases no reservation carries), and not a renewal composed before the outage
-- that Redis ran only when it came back (SIGSTOP, then SIGCONT: the calls wait in its
-- socket); either counted a gate as renewed whose policy leases Redis did not have, and the
-- other gate went back to Redis alone (#23's test saw 4 of a quota of 3 in progress).
local gate, ttl, keep, window = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local now = now_ms()
local since = tonumber(ARGV[6])
if since < 0 then
  since = now
end
local composed = tonumber(ARGV[7])
if composed < 0 or composed > now then
  composed = now
end
local knew = 1
if ARGV[5] == '1' then
  redis.call('ZREM', KEYS[1], gate)
  redis.call('ZREM', KEYS[2], gate)
else
  redis.call('ZADD', KEYS[1], now, gate)
  local last = redis.call('ZSCORE', KEYS[2], gate)
  if not last then
    knew = 0
  end
  if not last or tonumber(last) < composed then
    redis.call('ZADD', KEYS[2], composed, gate)
  end
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - keep)
redis.call('PEXPIRE', KEYS[1], keep)
redis.call('PEXPIRE', KEYS[2], keep)
local gates = redis.call('ZCARD', KEYS[1])
local fresh = redis.call('ZCOUNT', KEYS[2], since, '+inf')
local adopted = 0
local a = 8
local k = 3
while k <= #KEYS do
  local leases, costs, held = KEYS[k], KEYS[k + 1], KEYS[k + 2]
  purge(leases, costs, held, now)
  local n = tonumber(ARGV[a])
  a = a + 1
  for _ = 1, n do
    local id, cost = ARGV[a], ARGV[a + 1]
    a = a + 2
    if redis.call('HSETNX', costs, id, cost) == 1 then
      redis.call('INCRBY', held, cost)
      adopted = adopted + 1
    end
    redis.call('ZADD', leases, now + ttl, id)
  end
  local d = tonumber(ARGV[a])
  a = a + 1
  for _ = 1, d do
    drop(leases, costs, held, ARGV[a])
    a = a + 1
  end
  if n > 0 then
    redis.call('PEXPIRE', leases, keep)
    redis.call('PEXPIRE', costs, keep)
    redis.call('PEXPIRE', held, keep)
  end
  k = k + 3
end
return {gates, adopted, now, fresh, knew}
""",
)
