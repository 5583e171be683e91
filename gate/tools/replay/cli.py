"""The ``tokengate replay`` subcommand: its parser and its command (wired in by gate/cli.py)."""

from __future__ import annotations

import argparse
import calendar
import re
from typing import Any, TextIO

DESCRIPTION = """\
What would a recorded window have looked like under other thresholds?

Re-runs the window's recorded arrivals (time, tenant, class, prompt tokens, max_tokens,
the tokens each request really generated) through the gate's own admission core and a
model of llama-server fitted from the same journal (slots, pool, prefill rate, decode
rate vs occupancy), under the thresholds in force then (the journal's config_in_force
row, and every retune, pause, drain and reload audited in the window) and under each
proposal. The budget controller runs as in the gate, on the modelled latencies.

First the calibration: the replay at the recorded thresholds against what happened, per
class (admitted, refused by reason, queue wait (of the admitted requests, arrival to
dispatch: a refused request's wait is in no figure) and TTFT p50/p95 from arrival, SLO
attainment, tokens/s). The error is |replayed - recorded| / max(|recorded|, floor), the floor
per kind of figure 10 ms, 4 requests, 0.04 of attainment, 4 tokens/s: near zero, one step of
noise (2.5 ms, 1 request, 0.01, 1 token/s) off is 25%. A figure whose calibration error is over
25% is marked '?' in every column (and listed in `untrusted` in JSON): it is not a prediction;
so is a class's TTFT p50/p95 whenever its queue wait at that percentile is (TTFT from arrival holds
the wait).

A window cannot be replayed when the journal predates schema v4, when its rows were
written before that migration, when the writer dropped rows in it, or when no
config_in_force row precedes it: replay says which and exits 1. A window that starts
before the gate that wrote the journal did starts at that gate's start instead, and one
that spans a gate restart replays each part under its gate's thresholds (a note says so).

Each scenario is one run of the engine; they run side by side on worker processes (--jobs),
one per CPU by default (a small window stays in this process), at a low priority.

--set and --config are proposals over the thresholds in force at the window's start (a
retune, reload or restart before the window included): a key at that value changes nothing
(a note says so), another value is held through the window over every recorded change of it.
The journal is --journal (default tokengate.db here), not the --config file's [gate] journal.

Examples:
  tokengate replay --journal tokengate.db --since 2026-12-02T03:00Z --until 2026-12-02T03:10Z
  tokengate replay --since 15m --set budget.min_tokens=1024 --set classes.batch.reserved_tokens=0
  tokengate replay --set "budget.mode=static,backend.token_budget=1536" --format json
  tokengate replay --config candidate.toml
"""

JSON_NOTE = """\
JSON answer (--format json): {"scenarios": [{"name": "recorded", ...}, {"name": "replayed", ...},
{"name": "<--set text or --config file>", ...}], "calibration": {...}, "fit": {...}}; each scenario
has "classes": {NAME: {"admitted", "refused": {REASON: N}, "failed": {REASON: N} (of the admitted: the
backend failed them; a replay keeps a request's recorded failure where it admits it too), "queue_wait_p50_ms", "queue_wait_p95_ms",
"ttft_p50_ms", "ttft_p95_ms", "slo_attainment" (0..1: first token within "slo_objective_ms", the class's TTFT
objective in force at the window's start, or the proposal's), "tokens_per_s", "arrivals"}} and "untrusted"
(the figures, as CLASS.FIGURE, CLASS.refused.REASON or CLASS.failed.REASON, whose calibration error is over 25%,
and CLASS.ttft_pXX_ms wherever CLASS.queue_wait_pXX_ms is one);
"notes": what the window does not show (its start moved to the gate's start, work queued or
running at its start, requests still running in a journal a gate is writing, a gate restart
or kill in it, decisions without a class).
"""


def _when(text: str) -> float:
    from gate.journal.export import moment_arg  # the one reading of a moment, `tokengate log`'s too

    try:
        return moment_arg(text)
    except argparse.ArgumentTypeError as e:
        wrong = _out_of_range(text)
        if not wrong:
            raise
        # (a trial's `--since 2026-13-45T00:00Z` read only "is not a moment", and the forms it
        # listed were the one it had used)
        raise argparse.ArgumentTypeError(str(e).replace("is not a moment: ", f"is not a moment: {wrong}; ", 1)) from None


_ISO_PARTS = re.compile(r"\s*(\d{4})-(\d\d)-(\d\d)(?:[T ](\d\d):(\d\d)(?::(\d\d))?)?")


def _out_of_range(text: str) -> str:
    """What is out of range in an ISO-8601 time that is one by its shape ("month 13 is not 1 to
    12"); "" when none is (the text is another problem, said as it is)."""
    m = _ISO_PARTS.match(text)
    if m is None:
        return ""
    year, month, day = (int(g) for g in m.groups()[:3])
    if not 1 <= month <= 12:
        return f"month {month} is not 1 to 12"
    days = calendar.monthrange(year, month)[1]
    if not 1 <= day <= days:
        return f"day {day} is not in {year}-{month:02d} (1 to {days})"
    for name, value, most in zip(("hour", "minute", "second"), m.groups()[3:], (23, 59, 59), strict=True):
        if value is not None and int(value) > most:
            return f"{name} {int(value)} is not 0 to {most}"
    return ""


def add_parser(commands: Any, formatter: type[argparse.HelpFormatter], epilog: str) -> None:
    p = commands.add_parser(
        "replay",
        help="what-if: replay a journal window under other thresholds, calibrated against what happened",
        description=DESCRIPTION,
        epilog=JSON_NOTE + "\n" + epilog,
        formatter_class=formatter,
    )
    p.add_argument(
        "--journal",
        metavar="FILE",
        default=None,
        help="the SQLite journal (default: tokengate.db, or the demo's tokengate-demo.db when only that one is here)",
    )
    p.add_argument(
        "--since",
        metavar="WHEN",
        type=_when,
        default=None,
        help="window start: 15m (ago; -15m too), a time of day (21:10 or 21:10:30, UTC: today, or yesterday when later "
        "than now), an ISO-8601 time (UTC unless it says otherwise) or epoch seconds; default: the first decision",
    )
    p.add_argument(
        "--until",
        metavar="WHEN",
        type=_when,
        default=None,
        help="window end, same forms (a time of day that would fall before --since: on --since's day); default: the "
        "last decision (a later moment ends there too, with a note)",
    )
    p.add_argument(
        "--backend", metavar="NAME", default=None, help="the backend to replay (default: the one with most decisions in the window)"
    )
    p.add_argument(
        "--set",
        metavar="KEY=VALUE[,KEY=VALUE]",
        action=_InOrder,
        default=[],
        dest="proposals",
        help="one proposal over the thresholds in force at the window's start (repeat for several): budget.KEY, "
        "classes.NAME.KEY, backend.KEY; several keys in one proposal separated by commas",
    )
    p.add_argument(
        "--config",
        metavar="FILE",
        action=_InOrder,
        default=[],
        dest="configs",
        help="one proposal: another config file's thresholds (repeatable)",
    )
    p.add_argument("--format", choices=("table", "json"), default="table", help="table (default) or json (stable, for scripts)")
    p.add_argument(
        "--jobs",
        metavar="N",
        type=_jobs,
        default=None,
        help="replay the scenarios on N worker processes at once, each at nice 10 so that a gate and llama-server on "
        "the same host keep the CPU (default: one per CPU, at most one per scenario, and 1 for a small window); 1: "
        "one after another in this process. The answer is the same either way; each worker holds its own copy of the "
        "window (~1.3 KB per arrival, measured: 130 MB for 100,000, besides ~40 MB of its own)",
    )
    p.set_defaults(func=cmd_replay)


def _jobs(text: str) -> int:
    try:
        jobs = int(text)
    except ValueError:
        jobs = 0
    if jobs < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of processes, 1 or more, got {text!r}")
    return jobs


class _InOrder(argparse.Action):
    """Appends to its own list, and (option, value) to `scenario_order`: the proposals' columns
    follow the command line, --set and --config mixed (they came --set first before)."""

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option_string: str | None = None
    ) -> None:
        mine = getattr(namespace, self.dest, None) or []
        setattr(namespace, self.dest, [*mine, values])
        order = getattr(namespace, "scenario_order", None) or []
        namespace.scenario_order = [*order, (option_string, values)]


def _journal_of_config(args: argparse.Namespace, read: str) -> str | None:
    """When the default journal is not there and a --config is given: the journal that file's
    gate writes, and the command that replays it (`tokengate log --config F` and `tokengate
    review --config F` read F's journal; here --config is a proposal, and the engineer who
    typed it as there got only "tokengate.db: no such journal file")."""
    import os

    from gate.config import ConfigError, load_config

    for name in args.configs:
        try:
            written = load_config(name).gate.journal
        except (ConfigError, OSError):
            continue
        if written and os.path.isfile(written) and os.path.abspath(written) != os.path.abspath(read):
            return (
                f"--config is a proposal here, not where the journal is: {name}'s gate writes {written}; to replay that "
                f"journal: tokengate replay --journal {written} [--config {name}]"
            )
    return None


def _same_thresholds(proposals: list[Any]) -> str | None:
    """Two proposals that replay the same thresholds (one column would repeat the other under
    another name): the same text, the same keys in another order, one file by two paths."""
    from gate.config.thresholds import thresholds_json

    first: dict[tuple[str, frozenset[str]], str] = {}
    for p in proposals:
        key = (thresholds_json(p.config), p.pinned)
        if key in first:
            if first[key] == p.name:
                return f"proposal given twice: {p.name}"
            if not p.pinned:
                # (a trial's two proposals, each at the gate's start value of a key retuned before the
                # window, were refused as "the same thresholds": they were, silently, no change at all)
                return (
                    f"{first[key]} and {p.name} both change nothing: each gives the thresholds in force at the window's start "
                    "(the replayed column)"
                )
            return f"{first[key]} and {p.name} propose the same thresholds: keep one"
        first[key] = p.name
    return None


def cmd_replay(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from gate.config import ConfigError, load_config
    from gate.journal.export import find_journal, window_moments, window_order_error, yesterday_note
    from gate.tools.replay import ReplayError, load_window, proposal_from_config, proposal_from_set, run_replay, to_json, to_table
    from gate.tools.replay.workers import WORKERS_FROM, default_jobs

    wrong_order = window_order_error(args.since, args.until)
    if wrong_order:
        err.write(f"tokengate replay: error: {wrong_order}\n")  # a usage error: 2, as the help says
        return 2
    day_note = yesterday_note(args.since, args.until)
    args.since, args.until = window_moments(args.since, args.until)  # a time-of-day --until on --since's day
    journal, note = find_journal(args.journal)
    if note:
        err.write(f"tokengate replay: {note}\n")
    try:
        window = load_window(journal, args.since, args.until, args.backend)
    except ReplayError as e:
        err.write(f"tokengate replay: cannot replay: {e}\n")
        if day_note:  # the error prints yesterday's date: say that it was read so, and why
            err.write(f"tokengate replay: {day_note}\n")
        hint = _journal_of_config(args, journal) if args.journal is None else None
        if hint:
            err.write(f"tokengate replay: {hint}\n")
        return 1
    if day_note:
        # said when it replays too: a trial's `--since 23:50` at 22:45 UTC replayed from the gate's
        # start, and only the note that the window starts there said anything of it
        err.write(f"tokengate replay: {day_note}\n")
    try:
        # in the order given on the command line, --set and --config mixed (the table's columns)
        proposals = [
            proposal_from_set(value, window.config)
            if option == "--set"
            else proposal_from_config(value, load_config(value), window.config, window.backend)
            for option, value in getattr(args, "scenario_order", [])
        ]
    except (ValueError, ConfigError) as e:
        err.write(f"tokengate replay: error: {e}\n")
        return 2
    same = _same_thresholds(proposals)
    if same:
        err.write(f"tokengate replay: error: {same}\n")
        return 2
    arrivals = len(window.arrivals) + len(window.lead)
    jobs = args.jobs or default_jobs(1 + len(proposals), arrivals)
    if err.isatty() and arrivals * (1 + len(proposals)) >= WORKERS_FROM:
        # a minute or more with nothing on the screen reads as a hang (100,000 arrivals: ~22 s
        # per scenario and core); said on stderr, so that --format json stays clean
        where = f"on {jobs} worker processes (nice 10)" if jobs > 1 else "in this process (--jobs 1)"
        err.write(f"tokengate replay: replaying {arrivals:,} arrivals x {1 + len(proposals)} scenarios {where} ...\n")
        err.flush()
    try:
        answer = run_replay(window, proposals, jobs=jobs)
    except ReplayError as e:  # a worker process died (killed, out of memory)
        err.write(f"tokengate replay: error: {e}\n")
        return 1
    out.write((to_json(answer) if args.format == "json" else to_table(answer)) + "\n")
    return 0
