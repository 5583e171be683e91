"""Is the console still responsive (a key press answered within 100 ms) at ~1,000 req/s?

One process, one event loop, as `tokengate console` runs: a GateService (journal on)
and the TokengateApp, headless via `app.run_test(size=(160, 48))`, refreshing every
1 s. Outside it: bench/fake_upstream.py (a fast FAKE llama-server) and `wrk` sending
requests through the gate, paced with wrk's `delay()` hook (wrk has no rate option
and wrk2 is not packaged): N connections, each waiting D ms after every answer, D
calibrated in a short first run so the gate carries about --rate req/s. The rate
reported is what the gate decided (gate.records.total), not what was asked for.

While the load runs, keys are pressed in rounds: `p`, `p` (pause, then resume, the
idle class "batch"), `space`, `space` (rendering off/on), `?`, `escape` (help open,
closed), with 150-450 ms between presses so they land at every phase of the 1 s tick.
Each press's latency is measured from posting the key event to the app to:
  * "state": the action has run (the class shows PAUSED, the header flag, the
    screen stack), polled every 2 ms;
  * "screen": the first compositor update (`App._display`) after which that state
    shows, i.e. the frame a terminal would have been sent.
Keys are posted with `app.simulate_key` (what Pilot.press sends), not awaited with
`pilot.press`: that waits for the process to look idle (up to 1 s, twice), which a
process serving 1,000 req/s never does.

Also, over the same time: the gate's rate on its own before the console starts (flat
out, the machine's ceiling); the render tick's share of wall time (sum of `app.tick`
durations / wall); Textual's full layouts and compositor refreshes (count, time); how
late a 10 ms sleep wakes (loop lag); garbage-collection pauses by generation; and the
process's CPU (getrusage, all threads, the journal's SQLite thread included). Prints
a table and writes bench/results/console_responsiveness.json (`--no-write`: not).
`--py-spy` profiles the measured part; `--gc-freeze` is an experiment (gc.freeze()
before measuring), not what the console does.

    .venv/bin/python bench/console_responsiveness.py [--rate 1000] [--conns 64] [--rounds 9] [--py-spy] [--gc-freeze]
Needs wrk (Debian package `wrk`).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import os
import platform
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from overhead import free_port, wait_http  # noqa: E402  (bench/ is on sys.path when run as a script)

from console.app import TokengateApp  # noqa: E402
from console.screens.help import HelpScreen  # noqa: E402
from gate.config import parse_config  # noqa: E402
from gate.service import GateService  # noqa: E402

SIZE = (160, 48)
TARGET_MS = 100.0
BODY = '{"messages":[{"role":"user","content":"hello there"}],"max_tokens":8}'
LUA = """wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["X-Tokengate-Class"] = "interactive"
wrk.body = '{body}'
function delay() return {delay_ms} end
"""


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * len(s) + 0.5) - 1))]


class Timings:
    """Time spent in Textual's full layouts and compositor refreshes (class-level wrappers, this process only)."""

    def __init__(self) -> None:
        self.layout_s = self.compose_s = 0.0
        self.layouts = self.composes = 0

    def install(self) -> None:
        from textual.screen import Screen

        layout, compositor = Screen._refresh_layout, Screen._compositor_refresh
        timings = self

        def _refresh_layout(screen, *args, **kwargs):
            started = time.perf_counter()
            try:
                return layout(screen, *args, **kwargs)
            finally:
                timings.layout_s += time.perf_counter() - started
                timings.layouts += 1

        def _compositor_refresh(screen, *args, **kwargs):
            started = time.perf_counter()
            try:
                return compositor(screen, *args, **kwargs)
            finally:
                timings.compose_s += time.perf_counter() - started
                timings.composes += 1

        Screen._refresh_layout = _refresh_layout
        Screen._compositor_refresh = _compositor_refresh

    def reset(self) -> None:
        self.__init__()


TIMINGS = Timings()


class GcPauses:
    """Each garbage collection's duration, by generation (gc.callbacks)."""

    def __init__(self) -> None:
        self.ms: dict[int, list[float]] = {0: [], 1: [], 2: []}
        self._started = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.ms[info["generation"]].append((time.perf_counter() - self._started) * 1000)

    def summary(self) -> dict:
        return {
            f"gen{g}": {"count": len(v), "total_ms": round(sum(v)), "max_ms": round(max(v), 1) if v else 0.0} for g, v in self.ms.items()
        }


class LoopLag:
    """How late a 10 ms sleep wakes: the wait any callback (a key press too) has for its turn."""

    def __init__(self) -> None:
        self.lags_ms: list[float] = []
        self._task: asyncio.Task | None = None

    async def _run(self) -> None:
        while True:
            started = time.perf_counter()
            await asyncio.sleep(0.01)
            self.lags_ms.append((time.perf_counter() - started - 0.01) * 1000)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


class BenchApp(TokengateApp):
    """The console, with timing hooks: tick durations and the moments frames are produced."""

    CSS_PATH = str(HERE.parent / "console" / "app.tcss")  # relative paths resolve beside the subclass

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.tick_s = 0.0
        self.tick_count = 0
        self.watch = None  # (predicate, callback) checked after every frame

    def tick(self) -> None:
        started = time.perf_counter()
        try:
            super().tick()
        finally:
            self.tick_s += time.perf_counter() - started
            self.tick_count += 1

    def _display(self, screen, renderable) -> None:
        super()._display(screen, renderable)
        now = time.perf_counter()
        if renderable is not None and not self._batch_count and self.watch is not None:
            predicate, callback = self.watch
            if predicate():
                self.watch = None
                callback(now)


CONFIG = """
default_class = "interactive"
[gate]
journal = "{journal}"
[[backends]]
url = "http://127.0.0.1:{port}"
[budget]
mode = "static"
[classes.interactive]
priority = 10
queue_depth = 4096
queue_timeout_s = 60
[classes.batch]
priority = 1
queue_depth = 64
"""


class Wrk:
    """wrk as a subprocess for `duration` seconds (stopped early with SIGINT)."""

    def __init__(self, url: str, lua: Path, conns: int, duration: float) -> None:
        self.cmd = ["wrk", "-t1", f"-c{conns}", f"-d{int(duration)}s", "--latency", "-s", str(lua), url]
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(*self.cmd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)

    async def stop(self) -> str:
        assert self.proc is not None
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            out, _ = await asyncio.wait_for(self.proc.communicate(), 10)
        except TimeoutError:
            self.proc.kill()
            out, _ = await self.proc.communicate()
        return out.decode(errors="replace")


def wrk_latency_ms(out: str) -> dict:
    units = {"us": 1e-3, "ms": 1.0, "s": 1000.0}
    res = {}
    for p in ("50", "99"):
        m = re.search(rf"^\s+{p}%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
        res[f"p{p}_ms"] = float(m.group(1)) * units[m.group(2)] if m else None
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    res["non_2xx"] = int(non2xx.group(1)) if non2xx else 0
    errors = re.search(r"Socket errors:.*", out)
    res["socket_errors"] = errors.group(0) if errors else None
    return res


async def measured_rate(gate: GateService, seconds: float) -> float:
    n0, t0 = gate.records.total, time.perf_counter()
    await asyncio.sleep(seconds)
    return (gate.records.total - n0) / (time.perf_counter() - t0)


async def run(args, tmp: Path, up_port: int) -> dict:
    config = parse_config(CONFIG.format(journal=tmp / "journal.db", port=up_port), "<bench>")
    gate = GateService(config)
    await gate.start(port=0)
    url = f"{gate.url}/v1/chat/completions"
    app = BenchApp(gate, interval_s=1.0)
    result: dict = {}
    lag = LoopLag()
    try:
        # --- the gate alone, flat out (no delay), for the headroom this machine has ---
        lua = tmp / "load.lua"
        lua.write_text(LUA.format(body=BODY, delay_ms=0))
        wrk = Wrk(url, lua, args.conns, 60)
        await wrk.start()
        await asyncio.sleep(1.0)
        gate_alone = await measured_rate(gate, 4.0)
        await wrk.stop()
        TIMINGS.install()
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            # --- calibrate wrk's delay to the wanted rate, with the console running ---
            conns = args.conns
            delay_ms = max(0, round(conns * 1000 / args.rate) - 1)
            calibration = []
            for _ in range(3):
                lua.write_text(LUA.format(body=BODY, delay_ms=delay_ms))
                wrk = Wrk(url, lua, conns, 60)
                await wrk.start()
                await asyncio.sleep(1.0)
                rate = await measured_rate(gate, 3.0)
                await wrk.stop()
                calibration.append({"delay_ms": delay_ms, "rate": round(rate)})
                if abs(rate - args.rate) / args.rate < 0.07 or rate <= 0:
                    break
                # rate ~= conns / (delay + latency): solve for the latency, then for the delay
                latency_ms = max(0.0, conns * 1000 / rate - delay_ms)
                new = max(0, round(conns * 1000 / args.rate - latency_ms))
                if new == delay_ms:
                    break
                delay_ms = new
            lua.write_text(LUA.format(body=BODY, delay_ms=delay_ms))

            # --- the measured run ---
            wrk = Wrk(url, lua, conns, args.warmup + 600)
            await wrk.start()
            await pyspy_start(args, tmp, result)
            await asyncio.sleep(args.warmup)
            app.class_table.focus()
            app.class_table.select_class("batch")
            await pilot.pause(0.05)

            n0 = gate.records.total
            ru0 = resource.getrusage(resource.RUSAGE_SELF)
            w0 = time.perf_counter()
            app.tick_s = 0.0
            app.tick_count = 0
            TIMINGS.reset()
            if args.gc_freeze:  # an experiment: what the pauses cost (the console does not do this)
                gc.collect()
                gc.freeze()
            pauses = GcPauses()
            gc.callbacks.append(pauses)
            lag.start()

            def paused() -> bool:
                return "PAUSED" in str(app.class_table.get_cell("batch", "paused"))

            presses: list[dict] = []
            keys = [
                ("p", "pause batch", paused),
                ("p", "resume batch", lambda: not paused()),
                ("space", "pause rendering", lambda: app.header.paused),
                ("space", "resume rendering", lambda: not app.header.paused),
                ("question_mark", "help", lambda: isinstance(app.screen, HelpScreen)),
                ("escape", "close help", lambda: len(app.screen_stack) == 1),
            ]
            for r in range(args.rounds):
                for i, (key, what, done) in enumerate(keys):
                    await asyncio.sleep(0.15 + 0.3 * (((r * len(keys) + i) * 7919) % 100) / 100)
                    presses.append(await press(app, key, what, done))
            wall = time.perf_counter() - w0
            await lag.stop()
            gc.callbacks.remove(pauses)
            ru1 = resource.getrusage(resource.RUSAGE_SELF)
            n1 = gate.records.total
            await pyspy_stop(result)
            wrk_out = await wrk.stop()
    finally:
        await gate.stop(grace_s=5.0)

    state = [p["state_ms"] for p in presses if p["state_ms"] is not None]
    screen = [p["screen_ms"] for p in presses if p["screen_ms"] is not None]
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    by_key: dict[str, list[float]] = {}
    for p in presses:
        if p["screen_ms"] is not None:
            by_key.setdefault(p["what"], []).append(p["screen_ms"])
    result.update(
        target_rate=args.rate,
        achieved_rate=round((n1 - n0) / wall, 1),
        gate_alone_max_rate=round(gate_alone, 1),
        wrk={"connections": conns, "delay_ms": delay_ms, "calibration": calibration, **wrk_latency_ms(wrk_out)},
        presses=len(presses),
        unanswered=sum(1 for p in presses if p["screen_ms"] is None),
        state_ms={"p50": round(pct(state, 50), 1), "p99": round(pct(state, 99), 1), "max": round(max(state), 1)},
        screen_ms={"p50": round(pct(screen, 50), 1), "p99": round(pct(screen, 99), 1), "max": round(max(screen), 1)},
        screen_ms_by_key={k: {"p50": round(pct(v, 50), 1), "max": round(max(v), 1)} for k, v in by_key.items()},
        target_ms=TARGET_MS,
        meets_target=pct(screen, 99) <= TARGET_MS and all(p["screen_ms"] is not None for p in presses),
        measured_s=round(wall, 1),
        ticks=app.tick_count,
        tick_ms_mean=round(app.tick_s / max(app.tick_count, 1) * 1000, 1),
        tick_share=round(app.tick_s / wall, 4),
        textual_layouts=TIMINGS.layouts,
        textual_layout_ms_mean=round(TIMINGS.layout_s / max(TIMINGS.layouts, 1) * 1000, 1),
        textual_layout_share=round(TIMINGS.layout_s / wall, 4),
        textual_compositor_refreshes=TIMINGS.composes,
        textual_compositor_share=round(TIMINGS.compose_s / wall, 4),
        gc_pauses=pauses.summary(),
        gc_freeze=args.gc_freeze,
        loop_lag_ms={"p50": round(pct(lag.lags_ms, 50), 1), "p99": round(pct(lag.lags_ms, 99), 1), "max": round(max(lag.lags_ms), 1)},
        process_cpu_share=round(cpu / wall, 3),
        raw_ms=[(p["what"], p["state_ms"], p["screen_ms"]) for p in presses],
    )
    return result


async def press(app: BenchApp, key: str, what: str, done) -> dict:
    """Post one key; time until `done()` holds (state) and until a frame shows it (screen)."""
    loop = asyncio.get_running_loop()
    shown: asyncio.Future[float] = loop.create_future()
    app.watch = (done, lambda t: shown.done() or shown.set_result(t))
    t0 = time.perf_counter()
    app.simulate_key(key)
    state_at = None
    deadline = t0 + 5.0
    while time.perf_counter() < deadline and (state_at is None or not shown.done()):
        if state_at is None and done():
            state_at = time.perf_counter()
        await asyncio.sleep(0.002)
    app.watch = None
    screen_at = shown.result() if shown.done() else None
    return {
        "key": key,
        "what": what,
        "state_ms": None if state_at is None else (state_at - t0) * 1000,
        "screen_ms": None if screen_at is None else (screen_at - t0) * 1000,
    }


_spy: dict = {}


async def pyspy_start(args, tmp: Path, result: dict) -> None:
    """py-spy on this very process for the measured part (--py-spy): where the loop's time goes."""
    if not args.py_spy:
        return
    exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    out = tmp / "profile.txt"
    proc = await asyncio.create_subprocess_exec(
        exe,
        "record",
        "--pid",
        str(os.getpid()),
        "--rate",
        "200",
        "--format",
        "raw",
        "--output",
        str(out),
        "--nonblocking",
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    _spy.update(proc=proc, out=out)


async def pyspy_stop(result: dict) -> None:
    proc = _spy.get("proc")
    if proc is None:
        return
    proc.send_signal(signal.SIGINT)
    try:
        await asyncio.wait_for(proc.wait(), 20)
    except TimeoutError:
        proc.kill()
    out: Path = _spy["out"]
    if out.exists():
        result["py_spy"] = summarize_raw(out.read_text())


def summarize_raw(text: str, top: int = 40) -> dict:
    """Collapsed stacks -> share of samples per function (self and inclusive) on the main thread."""
    total = 0
    own: dict[str, int] = {}
    incl: dict[str, int] = {}
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = stack.split(";")
        total += n
        leaf = frames[-1]
        own[leaf] = own.get(leaf, 0) + n
        for f in set(frames[1:]):
            incl[f] = incl.get(f, 0) + n

    def rank(d: dict[str, int]) -> list[tuple[str, float]]:
        return [(k, round(v / total, 3)) for k, v in sorted(d.items(), key=lambda kv: -kv[1])[:top]]

    return {"samples": total, "self": rank(own), "inclusive": rank(incl)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=1000.0, help="requests per second through the gate")
    ap.add_argument("--conns", type=int, default=64, help="wrk connections (each request waits ~30 ms for its journal commit)")
    ap.add_argument("--rounds", type=int, default=9, help="rounds of 6 key presses")
    ap.add_argument("--warmup", type=float, default=5.0, help="seconds of load before the first press")
    ap.add_argument("--py-spy", action="store_true", help="profile the measured part with py-spy")
    ap.add_argument("--gc-freeze", action="store_true", help="experiment: gc.freeze() before measuring")
    ap.add_argument("--no-write", action="store_true", help="do not write bench/results/console_responsiveness.json")
    args = ap.parse_args()
    if shutil.which("wrk") is None:
        print("wrk not found: apt-get install wrk", file=sys.stderr)
        return 2
    # The fake upstream has no /slots: the telemetry warning would repeat every second.
    logging.basicConfig(level=logging.ERROR)
    load_before = os.getloadavg()
    tmp = Path(tempfile.mkdtemp(prefix="tokengate-console-bench-"))
    up_port = free_port()
    upstream = subprocess.Popen(
        [sys.executable, str(HERE / "fake_upstream.py"), "--port", str(up_port), "--slots", "256"],
        stdout=subprocess.DEVNULL,
    )
    try:
        wait_http(f"http://127.0.0.1:{up_port}/health")
        result = asyncio.run(run(args, tmp, up_port))
    finally:
        upstream.send_signal(signal.SIGTERM)
        try:
            upstream.wait(10)
        except subprocess.TimeoutExpired:
            upstream.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    result["machine"] = {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        # other work on the machine competes for the same cores: note how busy it was
        "loadavg_1m_before": round(load_before[0], 2),
        "loadavg_1m_after": round(os.getloadavg()[0], 2),
    }

    s, st = result["screen_ms"], result["state_ms"]
    print(
        f"gate rate        {result['achieved_rate']:.0f} req/s (target {args.rate:.0f}; the gate alone, flat out: "
        f"{result['gate_alone_max_rate']:.0f}; wrk {result['wrk']['connections']} conns, delay {result['wrk']['delay_ms']} ms, "
        f"p50 {result['wrk']['p50_ms']} ms, non-2xx {result['wrk']['non_2xx']})"
    )
    print(f"{'':<17}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}")
    print(f"{'press -> state':<17}{st['p50']:>9.1f}{st['p99']:>9.1f}{st['max']:>9.1f}")
    print(
        f"{'press -> screen':<17}{s['p50']:>9.1f}{s['p99']:>9.1f}{s['max']:>9.1f}   ({result['presses']} presses, "
        f"{result['unanswered']} unanswered; target p99 <= {TARGET_MS:.0f} ms: {'met' if result['meets_target'] else 'MISSED'})"
    )
    for what, v in result["screen_ms_by_key"].items():
        print(f"  {what:<15}{v['p50']:>9.1f}{'':>9}{v['max']:>9.1f}")
    lag = result["loop_lag_ms"]
    print(f"loop lag         {lag['p50']:>9.1f}{lag['p99']:>9.1f}{lag['max']:>9.1f}   (a 10 ms sleep wakes this late)")
    print(f"tick             {result['tick_ms_mean']:.1f} ms mean x {result['ticks']} = {result['tick_share']:.1%} of wall")
    print(
        f"textual          {result['textual_layouts']} full layouts, {result['textual_layout_ms_mean']:.1f} ms mean = "
        f"{result['textual_layout_share']:.1%} of wall; compositor refreshes {result['textual_compositor_share']:.1%} of wall "
        f"(overlaps the layouts)"
    )
    g2 = result["gc_pauses"]["gen2"]
    print(
        f"gc               {g2['count']} full collections, {g2['total_ms']} ms in all, longest {g2['max_ms']} ms"
        f"{' (after gc.freeze())' if args.gc_freeze else ''}"
    )
    print(f"process CPU      {result['process_cpu_share']:.0%} of one core (all threads)")
    if "py_spy" in result:
        print("py-spy, inclusive share of samples:")
        for name, share in result["py_spy"]["inclusive"]:
            if not name.startswith(("Runner.", "run ", "main ", "BaseEventLoop.", "Handle._run")):
                print(f"  {share:6.1%}  {name}")
        print("py-spy, self share of samples:")
        for name, share in result["py_spy"]["self"][:15]:
            print(f"  {share:6.1%}  {name}")
    if not args.no_write:
        (HERE / "results").mkdir(exist_ok=True)
        (HERE / "results" / "console_responsiveness.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
