"""Synthetic journals for the replay tests and bench: a seeded workload, "recorded" by running
it through the replay engine under a known backend model, written as a real v4 journal file
(the writer's own schema and row layout). NOT a recording of a real gate: the calibration of
such a journal against itself measures the engine's consistency, not its realism.
"""

from __future__ import annotations

import random
import sqlite3
from collections.abc import Mapping, Sequence

from gate.config import config_digest
from gate.config.schema import Config
from gate.config.thresholds import CONFIG_IN_FORCE, thresholds_json
from gate.data.records import AuditRecord, DecisionRecord, SampleRecord
from gate.journal.rows import _INSERT, _TABLE_OF
from gate.journal.schema import migrate_sync
from gate.tools.replay.engine import Arrival, BackendFit, Outcome, replay

#: a small llama-server as the tests' journals model it: 4 slots of 2,048 tokens, a fast tiny model
SMALL_FIT = BackendFit(
    slots=4,
    slot_context=2048,
    ceiling=2048,
    ttft_base_s=0.03,
    ttft_per_busy_s=0.01,
    prefill_tps=3000,
    tpot_alone_s=0.01,
    tpot_per_busy_s=0.004,
)


def synthetic_arrivals(n: int, duration_s: float, *, seed: int = 0, classes: Sequence[str] = ("interactive", "batch")) -> list[Arrival]:
    """`n` Poisson-ish arrivals over `duration_s`: 70% the first class (short prompts), the rest the second."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        at = rng.random() * duration_s
        first = rng.random() < 0.7
        cls = classes[0] if first or len(classes) == 1 else classes[1]
        prompt = rng.randint(20, 200) if first else rng.randint(200, 800)
        max_tokens = rng.choice((32, 64, 128))
        out.append(
            Arrival(f"r{i}", at, f"tenant{rng.randrange(8)}", cls, prompt, max_tokens, rng.randint(1, max_tokens), True, "admitted", "ok")
        )
    out.sort(key=lambda a: (a.at, a.id))
    return out


def write_journal(
    path: str,
    config: Config,
    fit: BackendFit,
    arrivals: Sequence[Arrival],
    outcomes: Mapping[str, Outcome],
    *,
    start: float = 1_800_000_000.0,
) -> None:
    """A v4 journal holding `arrivals` with `outcomes` as the recorded ones, a config_in_force
    row before them and one sample a second (slots, budget at the ceiling)."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        migrate_sync(conn, path)
        conn.execute("BEGIN")
        audit = AuditRecord(
            start - 1.0, "tokengate", "local", "gate", CONFIG_IN_FORCE, "gate", None, thresholds_json(config), config_digest(config)
        )
        conn.execute(_INSERT["audit"], _TABLE_OF[AuditRecord][1](audit))
        to_row = _TABLE_OF[DecisionRecord][1]
        rows = []
        for a in arrivals:
            o = outcomes[a.id]
            ttft_dispatch = None if o.ttft_arrival_ms is None or o.queue_ms is None else o.ttft_arrival_ms - o.queue_ms
            rows.append(
                to_row(
                    DecisionRecord(
                        ts=start + a.at,
                        request_id=a.id,
                        tenant=a.tenant,
                        cls=a.cls,
                        backend="default",
                        endpoint="/v1/chat/completions",
                        stream=True,
                        prompt_tokens=a.prompt_tokens,
                        token_count_source="exact",
                        max_tokens=a.max_tokens,
                        reserved_tokens=a.prompt_tokens + a.max_tokens,
                        outcome="admitted" if o.admitted else "refused",
                        reason=o.reason,
                        http_status=200 if o.admitted else 429,
                        queue_ms=o.queue_ms,
                        ttft_ms=ttft_dispatch,
                        duration_ms=o.duration_ms or 1.0,
                        completion_tokens=o.completion_tokens if o.admitted else None,
                        budget_at_decision=None,
                        in_flight_at_decision=None,
                        ttft_arrival_ms=o.ttft_arrival_ms,
                    )
                )
            )
        conn.executemany(_INSERT["decisions"], rows)
        last = max((a.at for a in arrivals), default=0.0)
        to_sample = _TABLE_OF[SampleRecord][1]
        samples = [
            to_sample(SampleRecord(start + s, "default", fit.ceiling, 0, 0, 0, fit.slots, None, None, None, None, 0, 0))
            for s in range(int(last) + 2)
        ]
        conn.executemany(_INSERT["samples"], samples)
        conn.execute("COMMIT")
    finally:
        conn.close()


def recorded_by_model(config: Config, fit: BackendFit, arrivals: Sequence[Arrival]) -> tuple[list[Arrival], dict[str, Outcome]]:
    """Run `arrivals` through the engine under `fit`; the arrivals as a journal would hold them
    (completion tokens only for those that ran) and their outcomes."""
    until = max((a.at for a in arrivals), default=0.0) + 1.0
    outcomes = replay(config, fit, arrivals, until=until)
    recorded = []
    for a in arrivals:
        o = outcomes[a.id]
        recorded.append(
            Arrival(
                a.id, a.at, a.tenant, a.cls, a.prompt_tokens, a.max_tokens,
                a.completion_tokens if o.admitted else None, True,
                "admitted" if o.admitted else "refused", o.reason, o.queue_ms, o.ttft_arrival_ms,
            )
        )  # fmt: skip
    return recorded, outcomes
