"""`make screenshots`: SVG captures of the console running the demo, for the README.

Runs what ``tokengate console --demo`` runs (the simulator, synthetic traffic, a
GateService, the Textual app) in this one process, headless, with a fixed seed,
but time-lapsed: the simulator and the traffic run ``--speed`` times faster, so
~90 s of demo pass in ~15 s of wall time. The journal lives in a temporary
directory that is removed at the end.

Time-lapse, and why it also warps the clocks: the simulator divides every
duration by ``speed`` and the traffic comes ``speed`` times faster, but the gate
would still measure TTFT, per-minute rates, queue waits and the controller's
window in real seconds (TTFT ``speed`` times too small, so the controller never
sees the SLO in danger), and the chart (10 minutes wide) and the journal would
only span the 15 real seconds. So, in this process only and only while it runs,
``time.time`` and the gate's monotonic clock run ``speed`` times faster too
(``TimeLapse``); everything the console shows is then in demo time, as if the
demo had run for the full 90 s. Nothing outside this module is changed.

Writes into ``screenshots/`` (``--out``):
    main-80x24.svg          the compact layout
    main-160x48.svg         the wide layout (every panel)
    retune-160x48.svg       after ``t``
    drain-confirm-160x48.svg after ``d`` on a class with requests queued
    review-160x48.svg       after ``r`` (then ``5``: the whole journal)

    .venv/bin/python -m console.screenshots [--out screenshots] [--speed 6] [--seconds 15]

Exact bytes vary run to run (ports, wall-clock times, scheduling); what each
shows does not.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import cast

from textual.widgets import Static

SEED = 7
BIG = (160, 48)
SMALL = (80, 24)
#: the demo's traffic (console/run.py) and simulator
RATE_INTERACTIVE = 0.8
RATE_BATCH = 0.15
BURST_EVERY_S = 60.0  # demo seconds: the burst the drain and main shots catch


class TimeLapse:
    """Clocks that run `speed` times faster than real ones from the moment this is made."""

    def __init__(self, speed: float) -> None:
        self.speed = speed
        self._real_time = time.time
        self._real_mono = time.monotonic
        self._t0 = self._real_time()
        self._m0 = self._real_mono()

    def time(self) -> float:
        return self._t0 + (self._real_time() - self._t0) * self.speed

    def monotonic(self) -> float:
        return self._m0 + (self._real_mono() - self._m0) * self.speed

    def demo_seconds(self) -> float:
        return (self._real_mono() - self._m0) * self.speed

    def __enter__(self) -> TimeLapse:
        time.time = self.time  # wall stamps (decisions, samples, audit, the header clock)
        return self

    def __exit__(self, *exc: object) -> None:
        time.time = self._real_time


async def _wait_for(pilot, predicate, timeout_s: float, step_s: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        await pilot.pause(step_s)
    return predicate()


def _save(app, out: Path, name: str) -> None:
    # Not simplified (merged runs): rsvg-convert then misplaces the braille and box glyphs.
    app.save_screenshot(name, str(out))


async def _press(pilot, key: str, done, failure: str, timeout_s: float = 10.0) -> None:
    """Press `key` and wait until `done()` and the screen has caught up.

    Not `pilot.press`: it waits for the process to go idle (up to 1 s, twice), and the
    gate, the simulator and the traffic in this process keep it busy.
    """
    pilot.app.simulate_key(key)
    if not await _wait_for(pilot, done, timeout_s, 0.02):
        raise RuntimeError(failure)
    await pilot.pause(0.05)


async def _review_loaded(pilot, timeout_s: float = 10.0) -> None:
    """Until the review screen has read the journal (as tests/console/test_review.py waits)."""
    from console.screens.review import ReviewScreen

    app = pilot.app
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        await pilot.pause(0.05)
        await app.workers.wait_for_complete()
        await pilot.pause(0.05)
        screen = app.screen
        if isinstance(screen, ReviewScreen) and (screen.error is not None or screen.now is not None):
            if not any(w.is_running for w in app.workers):
                return
    raise RuntimeError("the review screen never finished loading")


async def capture(out: Path, *, speed: float, seconds: float) -> dict[str, str]:
    """Run the demo time-lapsed and write the five SVGs; returns {file: what it shows}."""
    from console.app import TokengateApp
    from console.screens.confirm import ConfirmScreen
    from console.screens.retune import RetuneScreen
    from console.screens.review import ReviewScreen
    from gate.config import parse_config
    from gate.ops.link import InProcessLink
    from gate.service import GateService
    from gate.tools.demo import DEMO_CONFIG, demo_config, demo_parts
    from gate.tools.simulator import SimulatorConfig, serve_simulator
    from gate.tools.traffic import TrafficGenerator

    tmp = Path(tempfile.mkdtemp(prefix="tokengate-screenshots-"))
    logging.basicConfig(filename=str(tmp / "demo.log"), level=logging.WARNING)
    lapse = TimeLapse(speed)
    shots: dict[str, str] = {}
    simulator = traffic = gate = None
    environ = {k: v for k, v in os.environ.items() if k not in ("SSH_CONNECTION", "SSH_CLIENT", "SUDO_USER")}
    environ["USER"] = "oncall"  # not whoever runs `make screenshots`
    with lapse:
        try:
            # As console/run.py, with the simulator and the traffic `speed` times faster.
            sim = SimulatorConfig(slots=4, ctx=8192, kv="unified", seed=SEED, speed=2.0 * speed)
            simulator = await serve_simulator(sim, port=0)
            base = parse_config(DEMO_CONFIG, "<demo>")
            config = demo_config(base, simulator.url)
            gate = GateService(
                config,
                environ=environ,
                clock=lapse.monotonic,
                journal_path=str(tmp / "demo.db"),
                **demo_parts(sim, lambda: simulator.runtime.core.busy_slots),  # SIMULATED: label, GPU panel, model size
            )
            await gate.start(port=0)
            traffic = TrafficGenerator(
                gate.url,
                seed=SEED,
                rate_interactive=RATE_INTERACTIVE,
                rate_batch=RATE_BATCH,
                burst_every_s=BURST_EVERY_S,
                speed=speed,
            )
            await traffic.start()
            app = TokengateApp(InProcessLink(gate), interval_s=0.5, clock=lapse.time)
            async with app.run_test(size=BIG) as pilot:
                # Run past the minute's burst: slots full, queues, queue timeouts (denials).
                await _wait_for(pilot, lambda: lapse.demo_seconds() >= max(seconds * speed, BURST_EVERY_S + 15), seconds + 15)

                def busiest() -> tuple[str, int]:
                    return max(((c, gate.control.queued(c)) for c in ("interactive", "batch")), key=lambda x: x[1])

                await _wait_for(pilot, lambda: busiest()[1] >= 2, 10.0)
                await app.tick()
                await pilot.pause(0.05)
                _save(app, out, "main-160x48.svg")
                shots["main-160x48.svg"] = "main screen, wide layout"

                # The queue may empty between the look and the key (the console then toasts
                # "nothing queued" instead of asking: `make screenshots` failed 4 runs in 4):
                # the key again at the next queue, a few times.
                for _attempt in range(5):
                    await _wait_for(pilot, lambda: busiest()[1] >= 2, 10.0)
                    cls, _ = busiest()
                    app.class_table.select_class(cls)
                    app.simulate_key("d")
                    if await _wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), 2.0, 0.02):
                        break
                else:
                    raise RuntimeError("d did not open the drain dialog (the queue emptied first, 5 times)")
                await pilot.pause(0.05)
                message = str(app.screen.query_one("#confirm-message", Static).content)
                _save(app, out, "drain-confirm-160x48.svg")
                shots["drain-confirm-160x48.svg"] = message
                await _press(pilot, "escape", app._main_active, "escape did not close the dialog")  # No: nothing drained

                await _press(pilot, "t", lambda: isinstance(app.screen, RetuneScreen), "t did not open the retune form")
                _save(app, out, "retune-160x48.svg")
                shots["retune-160x48.svg"] = f"retune form (class {cast(RetuneScreen, app.screen).cls})"
                await _press(pilot, "escape", app._main_active, "escape did not close the form")

                await pilot.resize_terminal(*SMALL)
                await _wait_for(pilot, lambda: app.compact, 5.0)
                await app.tick()
                await pilot.pause(0.05)
                _save(app, out, "main-80x24.svg")
                shots["main-80x24.svg"] = "main screen, compact layout"
                await pilot.resize_terminal(*BIG)
                await _wait_for(pilot, lambda: not app.compact, 5.0)

                await _press(pilot, "r", lambda: isinstance(app.screen, ReviewScreen), "r did not open the review screen")
                await _review_loaded(pilot)
                app.simulate_key("5")  # range: the whole journal (the demo is ~90 s long)
                await _review_loaded(pilot)
                _save(app, out, "review-160x48.svg")
                shots["review-160x48.svg"] = "review screen over the demo's journal"
                await _press(pilot, "q", app._main_active, "q did not close the review screen")
                stats = dict(traffic.status_counts())
                records = len(gate.records)
            print(f"demo: {lapse.demo_seconds():.0f} s of demo time; traffic {stats}; {records} decisions")
        finally:
            if traffic is not None:
                await traffic.stop()
            if gate is not None:
                await gate.stop(grace_s=2.0)
            if simulator is not None:
                await simulator.stop()
            logging.shutdown()
            shutil.rmtree(tmp, ignore_errors=True)
    return shots


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("screenshots"))
    ap.add_argument("--speed", type=float, default=6.0, help="demo seconds per wall second (default 6)")
    ap.add_argument("--seconds", type=float, default=15.0, help="wall seconds of demo before the first shot")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    shots = asyncio.run(capture(args.out, speed=args.speed, seconds=args.seconds))
    for name, what in shots.items():
        size = (args.out / name).stat().st_size
        print(f"{args.out / name}  {size / 1024:.0f} KiB  {what}")
    print(f"done in {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
