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
* ``core, TTFT-aware, min rate for aged only``: the same without G1 (b), the core before the
  minimum rate needed no aging (with objectives no waiter ages, so it never applied);
* for two classes, the same with aging off (strict priority).

The two-class and the alone scenarios run at the 632 ms objective and at the example's own
2 s (``tokengate config example``: ``[budget] slo_ttft_p95_ms = 2000``, every class's objective),
where interactive's waiters hold the slots long enough to starve batch without G1 (b).

"longest without a start": per seed, the longest time in the run in which the class started
nothing (under 10 s: served in every 10 s window, aligned or not).

``--spread 0.3``: each hold is 2.1 s x a uniform factor in [0.7, 1.3] (llama-server's holds
vary; with holds all alike the mean is exact and the two TTFT-aware rows agree).

    PYTHONPATH=. .venv/bin/python bench/discipline_sim.py [--seeds 1,2,3] [--duration 120] [--spread 0.3]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gate.core.admission import Admission  # noqa: E402
from gate.tools import overload_sim as sim  # noqa: E402

SLOTS, SERVICE_S, TTFT_S, OBJECTIVE_S, EXAMPLE_OBJECTIVE_S = 4, 2.1, 0.2, 0.632, 2.0
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
    both = [sim.Stream("interactive", CAPACITY), sim.Stream("batch", 2 * CAPACITY)]
    alone = [sim.Stream("interactive", CAPACITY)]
    scenarios = {  # name -> (streams, objective in s)
        "3x, one class": ([sim.Stream("interactive", 3 * CAPACITY)], OBJECTIVE_S),
        "two classes (interactive 1x, batch 2x)": (both, OBJECTIVE_S),
        "1x, interactive alone": (alone, OBJECTIVE_S),
        "two classes, the example's 2 s objective": (both, EXAMPLE_OBJECTIVE_S),
        "1x, interactive alone, the example's 2 s objective": (alone, EXAMPLE_OBJECTIVE_S),
    }
    schedulers: dict[str, Callable[[float], sim.Scheduler]] = {
        "no control": lambda _o: sim.NoControl(SLOTS, 10.0),
        "core, aging off, no objective": lambda _o: sim.admission(example(None), slots=SLOTS, aging_s=None),
        "core, no objective": lambda _o: sim.admission(example(None), slots=SLOTS),
        "core, TTFT-aware, mean only": lambda o: mean_only(sim.admission(example(o * 1000), slots=SLOTS, ttft_s=TTFT_S)),
        "core, TTFT-aware, min rate for aged only": lambda o: aged_only(sim.admission(example(o * 1000), slots=SLOTS, ttft_s=TTFT_S)),
        "core, TTFT-aware, no slots kept (F7 off)": lambda o: no_kept(sim.admission(example(o * 1000), slots=SLOTS, ttft_s=TTFT_S)),
        "core, TTFT-aware": lambda o: sim.admission(example(o * 1000), slots=SLOTS, ttft_s=TTFT_S),
    }
    print(
        "| scenario | discipline | class | sent | served | refused (at once) | TTFT p50 / p95 | within objective: of served / of sent | min served in a 10 s window | longest without a start |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for scen, (streams, objective_s) in scenarios.items():
        obj = {"interactive": objective_s, "batch": objective_s}
        for name, make in schedulers.items():
            rows: dict[str, list] = {}
            gaps: dict[str, list[float]] = {}
            for seed in seeds:
                r = sim.run(
                    make(objective_s),
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
                    gaps.setdefault(cls, []).append(longest_gap(r, cls))
            for cls, cs in sorted(rows.items()):
                sent = sum(c.sent for c in cs)
                served = sum(c.served for c in cs)
                within = sum(c.within_objective for c in cs)
                p50 = [c.ttft_p(0.5) for c in cs]
                p95 = [c.ttft_p(0.95) for c in cs]
                print(
                    f"| {scen} | {name} | {cls} | {sent} | {served} | {sum(c.refused for c in cs)} ({sum(c.refused_at_once for c in cs)}) | "
                    f"{_range(p50)} / {_range(p95)} | {within / max(1, served):.0%} / {within / max(1, sent):.0%} | "
                    f"{min(min(c.served_per_window) for c in cs)} | {_range(gaps[cls], 1)} |"
                )
    return 0


def no_kept(adm: Admission) -> Admission:
    adm.keep_slots = False
    return adm


def mean_only(adm: Admission) -> Admission:
    adm.in_time_chance = 0.0
    return adm


class _AgedOnly(Admission):
    """The core without G1 (b): the minimum rate for aged waiters only (before #25's change)."""

    def _min_rate_due(self, cls: str, now: float) -> bool:
        return False


def aged_only(adm: Admission) -> Admission:
    adm.__class__ = _AgedOnly
    return adm


def longest_gap(result: sim.Result, cls: str) -> float:
    """The longest time within the run without a start of `cls` (any 10 s window: under 10 s)."""
    starts = sorted(
        o.admitted_at for o in result.outcomes if o.request.cls == cls and o.admitted_at is not None and o.admitted_at < result.duration_s
    )
    points = [0.0, *starts, result.duration_s]
    return max(b - a for a, b in zip(points, points[1:], strict=False))


def _range(vs: list[float] | list[float | None], digits: int = 2) -> str:
    xs = [v for v in vs if v is not None]
    if not xs:
        return "-"
    lo, hi = min(xs), max(xs)
    return f"{lo:.{digits}f}s" if abs(hi - lo) < 0.5 * 10**-digits else f"{lo:.{digits}f}-{hi:.{digits}f}s"


if __name__ == "__main__":
    raise SystemExit(main())
