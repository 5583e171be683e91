"""Peak memory and time of `tokengate log` exporting a 1,000,000-row journal.

Builds a journal (the real schema, via gate.journal.migrate_sync) with N decision rows of
random but realistic values, then runs `tokengate log --format json|csv|table` as
subprocesses writing to /dev/null and reports each one's peak RSS (from wait4's rusage,
per child) and wall seconds, next to the baseline of `tokengate --version`. The export
streams (fetchmany), so peak RSS should stay near the baseline whatever N is.
Writes bench/results/export_memory.json.

    .venv/bin/python bench/export_memory.py [--rows N] [--journal FILE] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gate.journal import COLUMNS, migrate_sync  # noqa: E402

RESULTS = REPO / "bench" / "results" / "export_memory.json"


def build(path: Path, rows: int, seed: int = 7) -> float:
    """Write ``rows`` decisions over the last 7 days; returns seconds taken."""
    rng = random.Random(seed)
    t = time.perf_counter()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = OFF")  # a throwaway file: speed over durability
    migrate_sync(conn, str(path))
    cols = COLUMNS["decisions"]
    sql = f"INSERT INTO decisions ({', '.join(chr(34) + c + chr(34) for c in cols)}) VALUES ({', '.join('?' * len(cols))})"
    now = time.time()
    start = now - 7 * 86400
    step = (now - start) / max(rows, 1)
    tenants = [f"tenant-{i:02d}" for i in range(40)]
    endpoints = ["/v1/chat/completions"] * 6 + ["/v1/completions", "/completion"]
    refusals = [
        ("refused", "queue_full", 429),
        ("refused", "token_budget_exceeded", 429),
        ("refused", "rate_limited", 429),
        ("refused", "context_length_exceeded", 400),
        ("shed", "shed_overrun", 503),
        ("cancelled", "client_disconnect", 499),
        ("failed", "upstream_error", 502),
    ]

    def row(i: int) -> tuple:
        ts = start + i * step
        cls = "interactive" if rng.random() < 0.7 else "batch"
        prompt = rng.randint(20, 6000)
        max_tokens = rng.choice((128, 256, 512, 1024))
        if rng.random() < 0.85:
            outcome, reason, status = "admitted", "ok", 200
            queue_ms = rng.expovariate(1 / 40.0)
            ttft = rng.uniform(30, 900)
            completion = rng.randint(1, max_tokens)
            duration = ttft + completion * rng.uniform(8, 40)
        else:
            outcome, reason, status = rng.choice(refusals)
            queue_ms = rng.expovariate(1 / 500.0) if reason in ("queue_full", "token_budget_exceeded") else None
            ttft, completion = None, None
            duration = (queue_ms or 0.0) + rng.uniform(0.2, 3.0)
        return (
            ts,
            f"req-{i:08x}{rng.getrandbits(32):08x}",
            rng.choice(tenants),
            cls,
            "default",
            rng.choice(endpoints),
            rng.random() < 0.6,
            prompt,
            "exact" if rng.random() < 0.97 else "estimate",
            max_tokens,
            prompt + max_tokens,
            outcome,
            reason,
            status,
            queue_ms,
            ttft,
            duration,
            completion,
            rng.choice((16384, 20480, 24576, 32768)),
            rng.randint(0, 32768),
        )

    batch = 50_000
    for lo in range(0, rows, batch):
        conn.execute("BEGIN")
        conn.executemany(sql, (row(i) for i in range(lo, min(rows, lo + batch))))
        conn.execute("COMMIT")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return time.perf_counter() - t


def measure(argv: list[str]) -> dict:
    """Run ``argv`` with stdout to /dev/null; its own peak RSS (wait4) and wall time."""
    with open(os.devnull, "wb") as devnull:
        t = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=devnull, stderr=subprocess.PIPE, cwd=REPO)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - t
        proc.returncode = os.waitstatus_to_exitcode(status)
        err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
        if proc.stderr:
            proc.stderr.close()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}): {err}")
    return {"peak_rss_mib": round(usage.ru_maxrss / 1024, 1), "seconds": round(seconds, 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--journal", type=Path, help="where to build the journal (default: a temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the generated journal")
    args = ap.parse_args()

    path, tmp = journal_location(args.journal)
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)

    print(f"building {args.rows:,} decision rows in {path} ...", flush=True)
    build_s = build(path, args.rows)
    size_mib = os.path.getsize(path) / 2**20
    print(f"  {build_s:.1f} s, {size_mib:.0f} MiB", flush=True)

    tokengate = [sys.executable, "-m", "gate.cli"]
    runs = {"baseline (tokengate --version)": measure([*tokengate, "--version"])}
    for fmt in ("json", "csv", "table"):
        runs[f"log --format {fmt}"] = measure([*tokengate, "log", "--journal", str(path), "--format", fmt])

    print()
    print(f"{'command':34} {'peak RSS MiB':>12} {'seconds':>8} {'rows/s':>10}")
    for name, r in runs.items():
        rate = "" if name.startswith("baseline") else f"{args.rows / r['seconds']:,.0f}"
        print(f"{name:34} {r['peak_rss_mib']:12.1f} {r['seconds']:8.2f} {rate:>10}")

    result = {
        "rows": args.rows,
        "journal_mib": round(size_mib, 1),
        "build_seconds": round(build_s, 1),
        "runs": runs,
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
    }
    finish(result, RESULTS, path, tmp, keep=args.keep or bool(args.journal))
    return 0


def journal_location(given: Path | None) -> tuple[Path, str | None]:
    """Where to build the journal: `given`, or a fresh temp dir (returned so it can go)."""
    if given is not None:
        return given, None
    tmp = tempfile.mkdtemp(prefix="tokengate-bench-")
    return Path(tmp) / "journal.db", tmp


def finish(result: dict, results: Path, path: Path, tmp: str | None, *, keep: bool) -> None:
    """Write the figures, and remove the generated journal unless asked to keep it."""
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {results.relative_to(REPO)}")
    if keep:
        print(f"journal kept: {path}")
    elif tmp is not None:
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        os.rmdir(tmp)


if __name__ == "__main__":
    sys.exit(main())
