"""SnapshotFeed: the gate's snapshots for attached consoles, built at most every MIN_INTERVAL_S
and encoded once, whatever the number of consoles, how often they ask, or the request rate.

A console asks for a snapshot with the sequence number of the last decision it has
(`after`). Building one and turning it into JSON costs the gate's loop ~5 ms with 200
decisions in it (measured: 4.1 ms `encode` + 1.0 ms `json.dumps` for 93 kB, 2 cores);
done per console and per ask, that work grew with the number of consoles and with how
fast they asked. Here it is done once per MIN_INTERVAL_S at most and shared:

* the head (everything but the decisions) is JSON once per build;
* each decision is JSON once, when the first build after its end picks it up, into a ring
  of the newest MAX_DECISIONS (a decision finished between two builds waits for the next);
* a reply is the head plus the decisions after the asker's `after`, joined as bytes.

So the gate's work for consoles per second is at most 1 / MIN_INTERVAL_S builds, each
encoding at most MAX_DECISIONS decisions, plus one join per reply (the control socket
paces each console's asks). `invalidate()` makes the next ask build afresh (after a
command or an audit row, so a console sees what it just did): one more build per change.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from gate.data.snapshot import SNAPSHOT_VERSION, GateSnapshot
from gate.data.wire import encode

MIN_INTERVAL_S = 0.25  # the console's fastest refresh (`+`) is 4 a second
MAX_DECISIONS = 200  # per snapshot, as GateService.snapshot gives them


def _json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


class SnapshotFeed:
    """Snapshot replies for the control socket, from one shared, rate-limited build."""

    def __init__(
        self,
        build: Callable[[int, int], GateSnapshot],
        *,
        clock: Callable[[], float] = time.monotonic,
        min_interval_s: float = MIN_INTERVAL_S,
        max_decisions: int = MAX_DECISIONS,
    ) -> None:
        self._build = build  # (decisions_after, max_decisions) -> GateSnapshot
        self.clock = clock
        self.min_interval_s = min_interval_s
        self.max_decisions = max_decisions
        self._decisions: deque[tuple[int, bytes]] = deque(maxlen=max_decisions)  # (sequence number, JSON)
        self._head = b""  # the snapshot's JSON object without its decisions and closing brace
        self._seq = 0  # decisions_seq of the last build
        self._built_at = -math.inf
        self.builds = 0

    def invalidate(self) -> None:
        """The next reply builds afresh (the gate changed in a way a console must see now)."""
        self._built_at = -math.inf

    def reply(self, rid: Any, after: int) -> bytes:
        """The whole reply line for `{"id": rid, "op": "snapshot", "after": after}`."""
        self._refresh()
        picked = [line for seq, line in self._decisions if seq > after]
        return b"".join((
            b'{"id":', _json(rid), b',"ok":true,"v":', str(SNAPSHOT_VERSION).encode(), b',"snapshot":', self._head,
            b',"decisions":[', b",".join(picked), b"]}}\n",
        ))  # fmt: skip

    def _refresh(self) -> None:
        now = self.clock()
        if now - self._built_at < self.min_interval_s:
            return
        snap = self._build(self._seq, self.max_decisions)
        first = snap.decisions_seq - len(snap.decisions) + 1  # the sequence number of the first one given
        for i, record in enumerate(snap.decisions):
            self._decisions.append((first + i, _json(encode(record))))
        head = encode(dataclasses.replace(snap, decisions=()))
        del head["decisions"]
        self._head = _json(head)[:-1]
        self._seq = snap.decisions_seq
        self._built_at = now
        self.builds += 1
