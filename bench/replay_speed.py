"""How fast `tokengate replay` answers: a 10-minute window of 100,000 synthetic decisions
replayed at the recorded thresholds and under 5 proposals (issue #24's goal: under 10 s on
one core). Writes bench/results/replay_speed.json.

The journal is synthetic (gate/tools/replay/synthetic.py): a seeded workload "recorded" by
the replay engine itself under a known backend model (128 slots, a 65,536-token pool, fast
enough that 167 arrivals/s keep short queues, as a busy production gate would), written as
a real v4 journal. Timed: load_window (SQLite read + the backend fit) + run_replay (6 runs
of the engine: replayed + 5 proposals, one after another: the goal's one core) + the table;
then run_replay again as `tokengate replay` runs it by default, the 6 runs on one worker
process per CPU (`replay_on_jobs_s`; its answer checked equal to the first).

    .venv/bin/python bench/replay_speed.py [--decisions N] [--window-s S]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

from gate.config import parse_config
from gate.tools.replay import BackendFit, load_window, proposal_from_set, run_replay, to_table
from gate.tools.replay.synthetic import recorded_by_model, synthetic_arrivals, write_journal
from gate.tools.replay.workers import default_jobs

CONFIG = """
[budget]
mode = "adaptive"
min_tokens = 16384
slo_ttft_p95_ms = 2000

[classes.interactive]
priority = 10
reserved_tokens = 8192
queue_depth = 64
queue_timeout_s = 10

[classes.batch]
priority = 1
limit_tokens = 49152
queue_depth = 256
queue_timeout_s = 60
"""
FIT = BackendFit(
    slots=128,
    slot_context=65536,
    ceiling=65536,
    ttft_base_s=0.02,
    ttft_per_busy_s=0.0002,
    prefill_tps=60000,
    tpot_alone_s=0.002,
    tpot_per_busy_s=0.00002,
)
PROPOSALS = (
    "budget.mode=static,budget.min_tokens=8192,backend.token_budget=8192",
    "budget.min_tokens=24576,classes.interactive.reserved_tokens=16384",
    "budget.mode=static",
    "classes.batch.limit_tokens=4096",
    "classes.batch.queue_depth=32,classes.batch.queue_timeout_s=10",
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--decisions", type=int, default=100_000)
    ap.add_argument("--window-s", type=float, default=600.0)
    ap.add_argument("--jobs", type=int, default=0, help="worker processes for the second timing (default: the command's)")
    args = ap.parse_args()
    config = parse_config(CONFIG + '\n[[backends]]\nname = "default"\nurl = "http://127.0.0.1:8080"\nkv = "unified"\n')
    arrivals = synthetic_arrivals(args.decisions, args.window_s, seed=24)
    t = time.perf_counter()
    _, outcomes = recorded_by_model(config, FIT, arrivals)
    record_s = time.perf_counter() - t
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "bench.db")
        write_journal(path, config, FIT, arrivals, outcomes)
        load_before = os.getloadavg()[0]
        c0 = time.process_time()
        t0 = time.perf_counter()
        window = load_window(path)
        t1 = time.perf_counter()
        proposals = [proposal_from_set(p, window.config) for p in PROPOSALS]
        answer = run_replay(window, proposals, jobs=1)  # the goal's one core
        table = to_table(answer)
        t2 = time.perf_counter()
        cpu_s = time.process_time() - c0
        # the command's default: the 6 engine runs on one worker process per CPU (at most 6)
        jobs = args.jobs or default_jobs(1 + len(proposals), len(window.arrivals))
        t3 = time.perf_counter()
        side_by_side = run_replay(window, proposals, jobs=jobs) if jobs > 1 else answer
        t4 = time.perf_counter()
        assert json.dumps(side_by_side) == json.dumps(answer), "the workers' answer differs from this process's"
    print(table)
    result = {
        "decisions": args.decisions,
        "window_s": args.window_s,
        "proposals": len(PROPOSALS),
        "load_and_fit_s": round(t1 - t0, 3),
        "replay_s": round(t2 - t1, 3),
        "total_s": round(t2 - t0, 3),
        "total_cpu_s": round(cpu_s, 3),
        "one_engine_run_s": round(record_s, 3),
        # `tokengate replay`'s default (--jobs): the same answer, the runs on worker processes
        "jobs": jobs,
        "replay_on_jobs_s": round(t4 - t3, 3) if jobs > 1 else None,
        "cpus": len(os.sched_getaffinity(0)),
        "goal_s": 10.0,
        "command": " ".join([".venv/bin/python bench/replay_speed.py", *sys.argv[1:]]),
        # 1-minute load average before and after the timed part (a shared VM: wall time runs
        # ahead of CPU time when others are busy)
        "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "python": platform.python_version(),
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
    }
    print(json.dumps(result, indent=2))
    out = Path(__file__).parent / "results" / "replay_speed.json"
    out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
