"""How many admission decisions per second the pure core makes on one core.

Drives `Admission.offer` + `release` + `advance` with a fixed-seed mix of
classes, tenants and sizes, as the gate would, and prints decisions/s.
Writes bench/results/decide_throughput.json. Goal (issue 2): >= 100,000/s.

    .venv/bin/python bench/decide_throughput.py [--decisions N] [--seed S]
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import time
from dataclasses import dataclass
from pathlib import Path

from gate.core.admission import Admission, Admit, Capacity, Queue, TenantPolicy
from gate.core.ledger import Request


@dataclass(frozen=True)
class Cls:
    name: str
    priority: int
    reserved_tokens: int
    limit_tokens: int | None
    queue_depth: int
    queue_timeout_s: float
    ttft_objective_ms: float | None = None


CLASSES = [
    Cls("interactive", 10, 8192, None, 64, 10.0),
    Cls("batch", 1, 0, 24576, 256, 120.0),
]


def run(decisions: int, seed: int) -> dict:
    rng = random.Random(seed)
    tenants = {f"tenant{i}": TenantPolicy(weight=rng.choice([1.0, 2.0, 4.0])) for i in range(50)}
    adm = Admission(
        CLASSES,
        Capacity(slots=16, slot_context=8192, ceiling=32768, max_prefill_tokens=16384),
        tenant_policy=lambda t: tenants.get(t, TenantPolicy()),
    )
    # Pre-build requests so the timing measures decisions, not the workload generator.
    names = list(tenants)
    reqs = []
    for i in range(decisions):
        cls = "interactive" if rng.random() < 0.7 else "batch"
        prompt = rng.randint(20, 400) if cls == "interactive" else rng.randint(500, 4000)
        reqs.append(Request(f"r{i}", cls, rng.choice(names), prompt, rng.randint(32, 1024), 0.0))

    held: list[str] = []
    outcomes = {"admit": 0, "queue": 0, "refuse": 0, "dispatched": 0}
    now = 0.0
    t0 = time.perf_counter()
    for r in reqs:
        now += 0.0005
        d = adm.offer(r, now)
        if isinstance(d, Admit):
            outcomes["admit"] += 1
            held.append(r.id)
        elif isinstance(d, Queue):
            outcomes["queue"] += 1
        else:
            outcomes["refuse"] += 1
        # Keep the backend busy but moving: prompts finish prefill, and a release
        # (with the dispatch it triggers) follows whenever slots are full or work waits.
        if held:
            adm.first_token(held[len(held) // 2])
        if held and (len(held) >= 12 or adm.waiting()):
            adm.release(held.pop(0), now)
            for a in adm.advance(now).admitted:
                outcomes["dispatched"] += 1
                held.append(a.request.id)
    elapsed = time.perf_counter() - t0
    return {
        "decisions": decisions,
        "seconds": round(elapsed, 4),
        "decisions_per_s": round(decisions / elapsed),
        "outcomes": outcomes,
        "seed": seed,
        "python": platform.python_version(),
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--decisions", type=int, default=200_000)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--repeat", type=int, default=3, help="report the best of N runs")
    args = ap.parse_args()
    runs = [run(args.decisions, args.seed) for _ in range(args.repeat)]
    best = max(runs, key=lambda r: r["decisions_per_s"])
    print(f"{'decisions':>10} {'seconds':>8} {'decisions/s':>12}  outcomes")
    for r in runs:
        print(f"{r['decisions']:>10} {r['seconds']:>8} {r['decisions_per_s']:>12,}  {r['outcomes']}")
    print(f"best: {best['decisions_per_s']:,} decisions/s (goal >= 100,000)")
    out = Path(__file__).parent / "results" / "decide_throughput.json"
    out.write_text(json.dumps({"best": best, "runs": runs}, indent=2) + "\n")


if __name__ == "__main__":
    main()
