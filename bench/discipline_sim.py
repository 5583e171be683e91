"""Queue disciplines under sustained overload, in virtual time (#25): seconds, not minutes.

The real admission core (gate/core) driven by gate/tools/overload_sim: Poisson arrivals, a
backend of 4 slots where each request holds its slot 2.1 s and reaches its first token 0.2 s
after dispatch (saturation 1.90 req/s, close to the tiny model's 1.87), objective 632 ms from
arrival (3x an unloaded TTFT p95 of 211 ms, as in the issue). Compared, per seed:

* ``no control``: one FIFO for every class, 10 s timeout (what the old aging rule amounted to
  once every waiter had aged);
* ``core, no objective``: the core with the example's classes, queue timeouts only;
* ``core, TTFT-aware, mean only``: the same with the objective, T1 on the mean hold alone
  (``in_time_chance = 0``: refused at once when expected to miss on average);
* ``core, TTFT-aware``: the same with T1's chance of a slot in time from the holds' spread
  (queued only when at least 90% likely to make it), T2-T3 as above (waiters refused as soon
  as they are expected to miss);
* for two classes, the same with aging off (strict priority).

``--spread 0.3``: each hold is 2.1 s x a uniform factor in [0.7, 1.3] (llama-server's holds
vary; with holds all alike the mean is exact and the two TTFT-aware rows agree).

    PYTHONPATH=. .venv/bin/python bench/discipline_sim.py [--seeds 1,2,3] [--duration 120] [--spread 0.3]
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gate.core.admission import Admission  # noqa: E402
from gate.tools import overload_sim as sim  # noqa: E402

SLOTS, SERVICE_S, TTFT_S, OBJECTIVE_S = 4, 2.1, 0.2, 0.632
CAPACITY = SLOTS / SERVICE_S


@dataclass(frozen=True)
class Cls:
    name: str
    priority: int
    reserved_tokens: int = 0
    limit_tokens: int | None = None
    queue_depth: int = 64
    queue_timeout_s: float = 10.0
    ttft_objective_ms: float | None = None


def example(objective_ms: float | None) -> list[Cls]:
    return [
        Cls("interactive", 10, reserved_tokens=1024, queue_timeout_s=10.0, ttft_objective_ms=objective_ms),
        Cls("batch", 1, limit_tokens=16384, queue_depth=256, queue_timeout_s=120.0, ttft_objective_ms=objective_ms),
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--duration", type=float, default=120.0)
    ap.add_argument("--spread", type=float, default=0.0, help="holds vary by +- this fraction (default 0)")
    args = ap.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    obj = {"interactive": OBJECTIVE_S, "batch": OBJECTIVE_S}
    scenarios = {
        "3x, one class": [sim.Stream("interactive", 3 * CAPACITY)],
        "two classes (interactive 1x, batch 2x)": [sim.Stream("interactive", CAPACITY), sim.Stream("batch", 2 * CAPACITY)],
        "1x, interactive alone": [sim.Stream("interactive", CAPACITY)],
    }
    schedulers = {
        "no control": lambda: sim.NoControl(SLOTS, 10.0),
        "core, aging off, no objective": lambda: sim.admission(example(None), slots=SLOTS, aging_s=None),
        "core, no objective": lambda: sim.admission(example(None), slots=SLOTS),
        "core, TTFT-aware, mean only": lambda: mean_only(sim.admission(example(OBJECTIVE_S * 1000), slots=SLOTS, ttft_s=TTFT_S)),
        "core, TTFT-aware": lambda: sim.admission(example(OBJECTIVE_S * 1000), slots=SLOTS, ttft_s=TTFT_S),
    }
    print(
        "| scenario | discipline | class | sent | served | refused (at once) | TTFT p50 / p95 | within objective: of served / of sent | min served in a 10 s window |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for scen, streams in scenarios.items():
        for name, make in schedulers.items():
            rows: dict[str, list] = {}
            for seed in seeds:
                r = sim.run(
                    make(),
                    streams,
                    slots=SLOTS,
                    service_s=SERVICE_S,
                    ttft_s=TTFT_S,
                    duration_s=args.duration,
                    objective_s=obj,
                    seed=seed,
                    service_spread=args.spread,
                )
                for cls, c in r.classes.items():
                    rows.setdefault(cls, []).append(c)
            for cls, cs in sorted(rows.items()):
                sent = sum(c.sent for c in cs)
                served = sum(c.served for c in cs)
                within = sum(c.within_objective for c in cs)
                p50 = [c.ttft_p(0.5) for c in cs]
                p95 = [c.ttft_p(0.95) for c in cs]
                print(
                    f"| {scen} | {name} | {cls} | {sent} | {served} | {sum(c.refused for c in cs)} ({sum(c.refused_at_once for c in cs)}) | "
                    f"{_range(p50)} / {_range(p95)} | {within / max(1, served):.0%} / {within / max(1, sent):.0%} | "
                    f"{min(min(c.served_per_window) for c in cs)} |"
                )
    return 0


def mean_only(adm: Admission) -> Admission:
    adm.in_time_chance = 0.0
    return adm


def _range(vs: list[float | None]) -> str:
    xs = [v for v in vs if v is not None]
    if not xs:
        return "-"
    lo, hi = min(xs), max(xs)
    return f"{lo:.2f}s" if abs(hi - lo) < 0.005 else f"{lo:.2f}-{hi:.2f}s"


if __name__ == "__main__":
    raise SystemExit(main())
