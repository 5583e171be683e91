"""Tenant limits shared across gates through Redis (``[shared]``; README "Running a fleet").

- ``health``: PURE: is Redis usable for admission, the failure policy, fail_open's 1/N
  and what a gate may hold under it, N from the fleet's counts, recovery.
- ``heard``: how long Redis has had to answer, in time the gate's loop could hear it
  (the arithmetic is pure; the wait itself knows asyncio, not Redis).
- ``scripts``: the Lua scripts Redis runs (reserve, release, renew) and the key layout.
- ``client``: ``SharedLimits``, the I/O shell: the Redis pool, the wait bound, the leases
  and their renewal task. Imports ``redis``: the service imports it only when
  ``[shared] redis_url`` is set.
"""

from gate.fleet.sharedlimits.health import Flip, Known, SharedHealth, SharedState, gates_phrase, local_share

__all__ = ["Flip", "Known", "SharedHealth", "SharedState", "gates_phrase", "local_share"]
