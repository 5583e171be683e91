"""How fast the review screen opens on a 1,000,000-decision journal, and pages.

Builds a journal (bench/export_memory.py's generator: N decisions over the last 7 days)
plus one sample per second for those 7 days and a few hundred audit rows, then, in
process and headless (``App.run_test``):

* open: from ``push_screen(ReviewScreen(path))`` (what the live console's ``r`` does) to
  the first page of 200 decisions on screen (range "last 1h", the default), and from
  ``ReviewApp`` start (Textual's own start-up included) to the same point;
* next page / previous page (keys ``n`` / ``p``), each from the key's action to the page
  painted (the Pilot's own ~40 ms per press left out), and the keyset query alone;
* range "all" (key 5: counts 1M rows, buckets 600k samples into 600 chart points), a
  filter on the "all" range, and the CSV export of that filtered view;
* the event loop's longest stall during each step (the reads run on aiosqlite's thread:
  the UI keeps answering keys while SQLite works).

Target: opens in under 2 s. Writes bench/results/review_open.json.

    .venv/bin/python bench/review_open.py [--rows N] [--journal FILE] [--keep]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import platform
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from export_memory import build, finish, journal_location  # noqa: E402
from textual.app import App, ComposeResult  # noqa: E402
from textual.widgets import Input, Static  # noqa: E402

from console.review_app import JournalReader, ReviewApp  # noqa: E402
from console.screens.review import PAGE_SIZE, ReviewScreen  # noqa: E402
from gate.journal import COLUMNS  # noqa: E402

RESULTS = REPO / "bench" / "results" / "review_open.json"
TARGET_OPEN_S = 2.0


def add_samples_and_audit(path: Path, seed: int = 11) -> tuple[int, int]:
    """One sample per second over the decisions' time span, and ~300 audit rows."""
    rng = random.Random(seed)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA synchronous = OFF")
    lo, hi = conn.execute("SELECT MIN(ts), MAX(ts) FROM decisions").fetchone()
    lo, hi = math.floor(lo), math.ceil(hi)
    cols = COLUMNS["samples"]
    sql = f"INSERT INTO samples ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})"

    def sample(t: int) -> tuple:
        budget = 24576 + int(6000 * math.sin(t / 3600))
        in_flight = max(0, int(budget * (0.6 + 0.35 * math.sin(t / 240))))
        p95 = None if t % 311 == 0 else 600 + 500 * math.sin(t / 900) + rng.uniform(0, 150)
        return (
            float(t),
            "default",
            budget,
            in_flight,
            rng.randint(0, 20),
            rng.randint(0, 4),
            4,
            None,
            None,
            p95,
            35.0,
            rng.randint(0, 10),
            rng.randint(0, 3),
            '[{"cls":"interactive","in_flight":1000,"queued":1},{"cls":"batch","in_flight":500,"queued":2}]',
        )

    n_samples = 0
    conn.execute("BEGIN")
    for t0 in range(lo, hi + 1, 50_000):
        rows = [sample(t) for t in range(t0, min(hi + 1, t0 + 50_000))]
        conn.executemany(sql, rows)
        n_samples += len(rows)
    conn.execute("COMMIT")
    acols = COLUMNS["audit"]
    asql = f"INSERT INTO audit ({', '.join(acols)}) VALUES ({', '.join('?' * len(acols))})"
    audit = []
    for t in range(lo, hi, 2000):  # a controller move every ~33 min, an operator change now and then
        audit.append((float(t), "controller", "local", "controller", "decrease", "backend:default", "24576", "19660", ""))
        if rng.random() < 0.05:
            audit.append((t + 7.0, "alice", "10.0.0.7", "console", "set_budget", "backend:default", "19660", "24576", ""))
    conn.executemany(asql, audit)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return n_samples, len(audit)


class StallMeter:
    """The event loop's longest lateness, sampled every 5 ms."""

    def __init__(self) -> None:
        self.worst = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            t = loop.time()
            await asyncio.sleep(0.005)
            self.worst = max(self.worst, loop.time() - t - 0.005)

    def start(self) -> None:
        self.worst = 0.0
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> float:
        assert self._task is not None
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass
        return round(self.worst * 1000, 1)


class Host(App[None]):
    """Stands in for the live console."""

    def compose(self) -> ComposeResult:
        yield Static("live console")


async def until(pilot, predicate, timeout: float = 60.0) -> None:
    t_end = time.perf_counter() + timeout
    while not predicate():
        if time.perf_counter() > t_end:
            raise SystemExit("timed out waiting for the review screen")
        await asyncio.sleep(0.001)
    await pilot.pause()


def loaded(screen: ReviewScreen, after: object = None) -> bool:
    return screen.error is None and bool(screen.page_rows) and screen.page_rows is not after


def instrument(screen: ReviewScreen) -> dict[str, float]:
    """Time stamps: "key" when a paging action starts, "shown" after the refreshed table
    has been painted (call_after_refresh). Excludes the Pilot's own overhead (~40 ms a press)."""
    marks: dict[str, float] = {}
    fill = screen._fill_decisions

    def timed_fill() -> None:
        fill()
        screen.call_after_refresh(lambda: marks.__setitem__("shown", time.perf_counter()))

    screen._fill_decisions = timed_fill  # type: ignore[method-assign]
    for name in ("action_next_page", "action_prev_page"):
        action = getattr(screen, name)

        def timed(action=action) -> None:
            marks["key"] = time.perf_counter()
            action()

        setattr(screen, name, timed)
    return marks


async def measure(path: Path) -> dict:
    out: dict = {}
    meter = StallMeter()
    size = (120, 40)

    # 1. push from a running app (the live console's `r`), default range "last 1h"
    host = Host()
    async with host.run_test(size=size) as pilot:
        meter.start()
        t = time.perf_counter()
        screen = ReviewScreen(path)
        host.push_screen(screen)
        await until(pilot, lambda: loaded(screen))
        out["open_push_to_first_page_s"] = round(time.perf_counter() - t, 3)
        out["open_max_loop_stall_ms"] = await meter.stop()
        if screen.error:
            raise SystemExit(screen.error)
        out["rows_in_last_1h"] = screen.total

        # 2. next / previous page, from the key's action to the page painted
        marks = instrument(screen)

        async def turn(key: str, n: int) -> dict[str, float]:
            took = []
            for _ in range(n):
                before = screen.page_rows
                marks.clear()
                await pilot.press(key)
                await until(pilot, lambda: loaded(screen, before) and "shown" in marks)
                took.append(marks["shown"] - marks["key"])
            return {"median": round(statistics.median(took) * 1000, 1), "max": round(max(took) * 1000, 1)}

        meter.start()
        out["next_page_ms"] = await turn("n", 20)
        out["prev_page_ms"] = await turn("p", 10)
        out["paging_max_loop_stall_ms"] = await meter.stop()

        # 3. range "all": counts every row, buckets every sample
        meter.start()
        before = screen.page_rows
        t = time.perf_counter()
        await pilot.press("5")
        await until(pilot, lambda: loaded(screen, before) and not any(w.is_running for w in host.workers))
        out["range_all_s"] = round(time.perf_counter() - t, 3)
        out["range_all_max_loop_stall_ms"] = await meter.stop()
        out["rows_all"] = screen.total
        out["next_page_range_all_ms"] = await turn("n", 10)

        # 4. a filter over everything
        before = screen.page_rows
        t = time.perf_counter()
        await pilot.press("slash")
        screen.query_one("#review-filter", Input).value = "class=batch outcome=refused"
        await pilot.press("enter")
        await until(pilot, lambda: loaded(screen, before))
        out["filter_all_s"] = round(time.perf_counter() - t, 3)
        out["rows_filtered"] = screen.total

        # 5. the CSV export of that filtered view, in a thread (the UI stays live)
        with tempfile.TemporaryDirectory() as tmp:
            screen.export_dir = Path(tmp)
            meter.start()
            t = time.perf_counter()
            await pilot.press("e")
            await until(pilot, lambda: screen.last_export is not None, timeout=600)
            out["export_filtered_s"] = round(time.perf_counter() - t, 3)
            out["export_max_loop_stall_ms"] = await meter.stop()
            out["export_rows"] = screen.last_export[1]
        await pilot.press("escape")
        await pilot.pause()

    # 6. `tokengate review` as a whole: ReviewApp start (Textual start-up included)
    t = time.perf_counter()
    app = ReviewApp(path)
    async with app.run_test(size=size) as pilot:
        await until(pilot, lambda: isinstance(app.screen, ReviewScreen) and loaded(app.screen))
        out["open_app_start_to_first_page_s"] = round(time.perf_counter() - t, 3)
        assert len(app.screen.page_rows) == PAGE_SIZE

    # 7. the keyset query alone
    reader = await JournalReader.open(path)
    try:
        page = await reader.decisions_page(limit=PAGE_SIZE)
        times = []
        for _ in range(50):
            t = time.perf_counter()
            page = await reader.decisions_page(before_id=page[-1]["id"], limit=PAGE_SIZE)
            times.append(time.perf_counter() - t)
        out["keyset_query_ms"] = {"median": round(statistics.median(times) * 1000, 2), "max": round(max(times) * 1000, 2)}
        t = time.perf_counter()
        await reader.count_decisions()
        out["count_all_ms"] = round((time.perf_counter() - t) * 1000, 1)
    finally:
        await reader.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--journal", type=Path, help="where to build the journal (default: a temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the generated journal")
    ap.add_argument("--reuse", action="store_true", help="use --journal as it is (do not rebuild)")
    args = ap.parse_args()

    path, tmp = journal_location(args.journal)
    if args.reuse and path.exists():
        build_s, n_samples, n_audit = 0.0, None, None
        print(f"reusing {path}", flush=True)
    else:
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        print(f"building {args.rows:,} decisions + 7 days of samples in {path} ...", flush=True)
        t = time.perf_counter()
        build(path, args.rows)
        n_samples, n_audit = add_samples_and_audit(path)
        build_s = time.perf_counter() - t
    size_mib = os.path.getsize(path) / 2**20
    print(f"  {build_s:.1f} s, {size_mib:.0f} MiB", flush=True)

    figures = asyncio.run(measure(path))

    print()
    print(
        f"open (push ReviewScreen -> first page, range 1h):   {figures['open_push_to_first_page_s']:.3f} s"
        f"   (target < {TARGET_OPEN_S:.0f} s; loop stall max {figures['open_max_loop_stall_ms']} ms)"
    )
    print(f"open (ReviewApp start -> first page):              {figures['open_app_start_to_first_page_s']:.3f} s")
    print(
        f"next page (key -> painted), range 1h:              median {figures['next_page_ms']['median']} ms, "
        f"max {figures['next_page_ms']['max']} ms"
    )
    print(
        f"prev page (key -> painted), range 1h:              median {figures['prev_page_ms']['median']} ms, "
        f"max {figures['prev_page_ms']['max']} ms   (loop stall max {figures['paging_max_loop_stall_ms']} ms)"
    )
    print(
        f"range all (count {figures['rows_all']:,}, chart, page):   {figures['range_all_s']:.3f} s"
        f"   (loop stall max {figures['range_all_max_loop_stall_ms']} ms)"
    )
    print(f"next page, range all:                              median {figures['next_page_range_all_ms']['median']} ms")
    print(f"filter class=batch outcome=refused, range all:     {figures['filter_all_s']:.3f} s ({figures['rows_filtered']:,} rows)")
    print(
        f"export that view to CSV (thread):                  {figures['export_filtered_s']:.3f} s"
        f" ({figures['export_rows']:,} rows; loop stall max {figures['export_max_loop_stall_ms']} ms)"
    )
    print(f"keyset query alone:                                median {figures['keyset_query_ms']['median']} ms")
    print(f"count all decisions:                               {figures['count_all_ms']} ms")

    result = {
        "rows": args.rows,
        "samples": n_samples,
        "audit": n_audit,
        "journal_mib": round(size_mib, 1),
        "build_seconds": round(build_s, 1),
        "target_open_s": TARGET_OPEN_S,
        "meets_target": figures["open_push_to_first_page_s"] < TARGET_OPEN_S and figures["open_app_start_to_first_page_s"] < TARGET_OPEN_S,
        **figures,
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
    }
    finish(result, RESULTS, path, tmp, keep=args.keep or bool(args.journal))
    return 0 if result["meets_target"] else 1


if __name__ == "__main__":
    sys.exit(main())
