"""The ``tokengate`` command line.

Exit codes: 0 ok, 2 usage or config error (the message names the file, the key and the
problem), 1 runtime failure.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import re
import sys
import textwrap
from collections.abc import Callable, Sequence
from typing import Any, Literal, TextIO

from gate import __version__
from gate.config import EXAMPLE_CONFIG, BackendConfig, Config, ConfigError, load_config, parse_config
from gate.config.checks import limit_warnings, objective_warnings  # also the replay's proposal warnings
from gate.config.reader import beside_the_file, relative_paths_note

EXIT_OK = 0
EXIT_RUNTIME = 1
EXIT_USAGE = 2

_EXIT_CODES = """\
exit codes:
  0  ok
  1  runtime failure
  2  usage or config error (the message names the file, the key and the problem)
"""

_DESCRIPTION = """\
tokengate: a token-aware admission gate for llama.cpp's llama-server.

It sits in front of llama-server and decides, before a request reaches it, whether the
request runs now, waits in a bounded per-class queue, or is refused with a clear answer
(429/503 with Retry-After), so a shared KV cache is never overcommitted. The console shows
slots, GPU memory, classes, denials and the token budget live, and lets the on-call
operator retune, pause, drain and freeze.
"""


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Keep the hand-wrapped descriptions and epilogs as written."""


def _plural(n: int, singular: str, plural: str) -> str:
    return f"{n} {singular if n == 1 else plural}"


def _add_config_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="TOML config file (see `tokengate config example`); default: built-in defaults",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tokengate",
        description=_DESCRIPTION,
        epilog=_EXIT_CODES + "\nRun `tokengate COMMAND --help` for a command's options.",
        formatter_class=_Formatter,
    )
    parser.add_argument(
        "--version",
        action="version",
        version=f"tokengate {__version__}",
        help="print the version and exit",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")

    # console
    console = commands.add_parser(
        "console",
        help="the live console: the gate embedded, or attached to a running gate",
        description=(
            "Run the gate and its Textual console in this terminal: slots per backend, GPU\n"
            "memory, classes, denials, the budget curve and the decision tail. Every operator\n"
            "action is journaled with your user name and SSH origin.\n\n"
            "Embedded (the default) is for a quick look or the demo: quitting, or a hang-up of\n"
            "the terminal, drains and stops the gate. In production run `tokengate serve`\n"
            "(systemd) and attach: `tokengate console --attach` talks to it through its control\n"
            "socket; `q` detaches and the gate goes on; several consoles may attach at once."
        ),
        epilog=_EXIT_CODES,
        formatter_class=_Formatter,
    )
    _add_config_arg(console)
    console.add_argument(
        "--demo",
        action="store_true",
        help="run against the built-in llama-server simulator with synthetic interactive and "
        "batch traffic; the screen is labelled SIMULATED. Its gate listens on [gate] listen when --config sets it, "
        "else on a free port",
    )
    console.add_argument(
        "--read-only",
        action="store_true",
        help="watch only: hide every action (retune, pause, drain, freeze, a router's model load, "
        "unload and pin, a what-if's apply); the gate also refuses "
        "commands from this console. With --config F and a gate already running on F: attach read-only",
    )
    console.add_argument(
        "--attach",
        metavar="SOCKET",
        nargs="?",
        const="",
        default=None,
        action="append",
        help="attach to a running gate through its control socket (default: the [gate] control_socket "
        "of --config, else tokengate.sock); q detaches, the gate goes on. Twice or more (NAME=SOCKET "
        "names a gate), or once with a --config holding [[fleet]] tables: the fleet console, a row "
        "per gate and Enter for one gate's console",
    )
    console.set_defaults(func=_cmd_console)

    # serve
    serve = commands.add_parser(
        "serve",
        help="the gate alone, headless (for systemd)",
        description=(
            "Run the admission gate without the console. Clients talk to the `listen` address\n"
            "instead of llama-server. SIGTERM or SIGINT stops admitting (503 shutting_down),\n"
            "lets in-flight requests finish for up to --grace seconds, then exits 0; SIGHUP\n"
            "re-reads --config (applied or refused, audited either way). Consoles attach through\n"
            "the control socket ([gate] control_socket, default beside the journal):\n"
            "`tokengate console --attach`. One gate per journal: a second one exits 2 naming\n"
            "the pid that holds it."
        ),
        epilog=_EXIT_CODES,
        formatter_class=_Formatter,
    )
    _add_config_arg(serve)
    serve.add_argument(
        "--grace",
        metavar="SECONDS",
        type=float,
        default=30.0,
        help="how long to let in-flight requests finish on SIGTERM (default: 30)",
    )
    serve.add_argument(
        "--demo",
        action="store_true",
        help="in front of the built-in llama-server simulator with synthetic traffic (SIMULATED; what `tokengate console "
        "--demo` runs); it listens on [gate] listen when --config sets it, else on a free port (the log says which)",
    )
    serve.add_argument("--seed", type=int, default=7, help=argparse.SUPPRESS)
    serve.add_argument(
        "--log-level",
        default="info",
        choices=("debug", "info", "warning", "error"),
        help="log verbosity on stderr (default: info)",
    )
    serve.set_defaults(func=_cmd_serve)

    # config
    config = commands.add_parser(
        "config",
        help="check a config file or print an annotated example",
        description="Validate a tokengate TOML config, or print an example with every key explained.",
        epilog=_EXIT_CODES,
        formatter_class=_Formatter,
    )
    config_commands = config.add_subparsers(dest="config_command", metavar="ACTION", title="actions")
    config_commands.required = True
    check = config_commands.add_parser(
        "check",
        help="validate a config file",
        description=(
            "Parse and validate FILE. On success print `ok: FILE (...)` and exit 0; on the first\n"
            "problem print `FILE: key.path: problem` to stderr and exit 2. Without --backends nothing\n"
            "is contacted; environment variables named by api_key_env are never read."
        ),
        epilog=_EXIT_CODES,
        formatter_class=_Formatter,
    )
    check.add_argument("file", metavar="FILE", help="the TOML file, or - to read standard input")
    check.add_argument("-v", "--verbose", action="store_true", help="also print the effective settings (defaults filled in)")
    check.add_argument(
        "--backends",
        action="store_true",
        help="also ask each running backend what it reports (slots, per-slot context, KV layout) and\n"
        "say where the config contradicts it, and with [shared] whether its Redis answers and takes\n"
        "the gate's credentials; exit 1 when it does, a backend or Redis is unreachable, or Redis\n"
        "refuses the credentials; 2 when two backends reach one llama-server (their hosts resolve to one\n"
        "address, or its process is one pid) or a backend is the gate's own listen address",
    )
    check.set_defaults(func=_cmd_config_check)
    example = config_commands.add_parser(
        "example",
        help="print an annotated example config (every key, what it does, its default)",
        description=(
            "Print an annotated tokengate.toml listing every key with what it does, its unit and\n"
            "its default. Start from it: tokengate config example > tokengate.toml"
        ),
        epilog=_EXIT_CODES,
        formatter_class=_Formatter,
    )
    example.set_defaults(func=_cmd_config_example)
    set_cmd = config_commands.add_parser(
        "set",
        help="change keys of a config file in place (validated first; comments kept)",
        description=(
            "Set TABLE.KEY=VALUE in FILE, e.g. budget.min_tokens=1024 classes.batch.reserved_tokens=0.\n"
            "A key of a [[backends]] (or [[tenants]], [[fleet]]) table names the table by its place,\n"
            "from 0: backends[0].url=http://127.0.0.1:8080 is the first backend's url.\n"
            "The edited file is validated whole before it is written: a bad edit changes nothing.\n"
            "A running gate applies the file on SIGHUP (systemctl reload tokengate)."
        ),
        epilog=_EXIT_CODES,
        formatter_class=_Formatter,
    )
    set_cmd.add_argument("file", metavar="FILE", help="the TOML file to edit")
    set_cmd.add_argument("edits", metavar="TABLE.KEY=VALUE", nargs="+", help="the keys to set")
    set_cmd.set_defaults(func=_cmd_config_set)

    overrides = commands.add_parser(
        "overrides",
        help="the operator's runtime changes a restart restores: show, drop, or write into the config",
        description=(
            "Retunes, hand budgets, paused classes and the controller's freeze made at runtime are\n"
            "kept beside the journal (<journal>.overrides.json) and restored when the gate starts\n"
            "(a hand budget while the controller is frozen or static: an adaptive one moves it).\n"
            "Without an ACTION: show."
        ),
        epilog=_EXIT_CODES,
        formatter_class=_Formatter,
    )
    # Each action a sub-command, so that --help gives each its own line (a trial's
    # `{show,drop,write}` had none); --config and --journal go before or after it.
    _add_overrides_options(overrides, default=None)
    actions = overrides.add_subparsers(dest="action", metavar="[ACTION]", title="actions")
    for name, text in (
        ("show", "list them (the default): the running gate's, and whether a restart would keep them"),
        (
            "drop",
            "back to the config file (on the running gate, audited); with no gate running the kept file goes, "
            "audited in the journal (refused while a gate holds it)",
        ),
        (
            "write",
            "write the retuned settings into --config (validated), so the file holds them; paused classes, "
            "the freeze and hand budgets are runtime state and stay overrides",
        ),
    ):
        action = actions.add_parser(
            name, help=text, description=textwrap.fill(text[0].upper() + text[1:] + ".", 88), epilog=_EXIT_CODES, formatter_class=_Formatter
        )
        _add_overrides_options(action, default=argparse.SUPPRESS)  # SUPPRESS: one given before ACTION stays
    overrides.set_defaults(func=_cmd_overrides, action="show")

    # log
    log_cmd = commands.add_parser(
        "log",
        help="export the journal (decisions, audit or samples) without a UI",
        description=(
            "Stream journal rows to standard output in the order of their `ts`, oldest first\n"
            "(a decision's ts is its ARRIVAL; its end is ts + duration_ms; the live console's\n"
            "tail shows the end). The journal is opened read-only, so this is safe while the\n"
            "gate is running. Timestamps are ISO-8601 UTC (table, csv); json is JSON Lines\n"
            "with the raw epoch `ts` plus `ts_iso`. Two first-token times: ttft_arrival_ms from\n"
            "arrival, its queue wait included (the console's and the review's TTFT ms), and\n"
            "ttft_ms from dispatch to llama-server (the review's disp. TTFT ms, the controller's).\n"
            "Example: tokengate log --since 2h --format csv > last-2h.csv"
        ),
        epilog=_EXIT_CODES,
        formatter_class=_Formatter,
    )
    log_cmd.add_argument(
        "--journal",
        metavar="FILE",
        default=None,
        help="the SQLite journal (default: tokengate.db, else the demo's tokengate-demo.db)",
    )
    log_cmd.add_argument(
        "--config",
        metavar="FILE",
        help="TOML config file: its [gate] journal is read (when --journal is not given)",
    )
    log_cmd.add_argument(
        "--kind",
        choices=("decisions", "audit", "samples"),
        default="decisions",
        help="which rows (default: decisions)",
    )
    log_cmd.add_argument(
        "--since",
        metavar="WHEN",
        type=_since_arg,
        default=None,
        help="only rows from this long ago (30s, 15m, 2h, 7d), since a time of day (21:10 or 21:10:30, UTC: today, or "
        "yesterday when later than now), an ISO-8601 timestamp (UTC unless it says otherwise) "
        "or epoch seconds (as --format json prints ts); default: all",
    )
    log_cmd.add_argument(
        "--until",
        metavar="WHEN",
        type=_since_arg,
        default=None,
        help="only rows before this moment (the same forms as --since): an incident's window, with --since; default: all",
    )
    log_cmd.add_argument(
        "--class",
        metavar="NAME",
        dest="cls",
        default=None,
        help="only the decisions of this class (an aiperf trace keeps the times of every class: one trace per class, "
        "each replayed with its X-Tokengate-Class header and aiperf's --fixed-schedule-start-offset 0, stay in step)",
    )
    log_cmd.add_argument(
        "--format",
        choices=("table", "json", "csv", "aiperf"),
        default="table",
        help="table (aligned columns), json (JSON Lines), csv (with a header), or aiperf: a trace of the decisions' "
        "arrivals and token counts for `aiperf profile --custom-dataset-type mooncake_trace --fixed-schedule`; default: table",
    )
    log_cmd.set_defaults(func=_cmd_log)

    # review
    review = commands.add_parser(
        "review",
        help="the console over a journal file, read-only",
        description=(
            "Open a journal in the console, read-only (safe while the gate is running): the\n"
            "budget curve with audit events marked, the audit rows, and the decisions paged\n"
            "from SQLite with filters (/) and CSV export of the filtered view (e). Keys 1-5\n"
            "pick the range (15m, 1h, 6h, 24h, all), ending at the journal's newest row.\n"
            "What-if (w): the window shown replayed under thresholds you edit, as\n"
            "`tokengate replay` does (ctrl+r replays, esc closes). Times are UTC."
        ),
        epilog=_EXIT_CODES,
        formatter_class=_Formatter,
    )
    review.add_argument(
        "--journal",
        metavar="FILE",
        default=None,
        help="the SQLite journal (default: the config's gate.journal, else tokengate.db, or the demo's "
        "tokengate-demo.db when only that one is here)",
    )
    review.add_argument(
        "--config",
        metavar="FILE",
        help="TOML config file: only its journal path and TTFT SLO (drawn on the chart) are used",
    )
    review.set_defaults(func=_cmd_review)
    _add_simulate_parser(commands)
    _add_crunch_parser(commands)
    from gate.tools.replay.cli import add_parser as _add_replay_parser

    _add_replay_parser(commands, _Formatter, _EXIT_CODES)
    return parser


def _add_overrides_options(parser: argparse.ArgumentParser, *, default: Any) -> None:
    parser.add_argument("--config", metavar="FILE", default=default, help="the gate's TOML config (its journal and control socket)")
    parser.add_argument("--journal", metavar="FILE", default=default, help="the journal (default: the config's gate.journal)")


def _since_arg(text: str) -> float:
    from gate.journal.export import moment_arg  # the one reading of a moment, replay's too

    return moment_arg(text)


# ------------------------------------------------------------------------------------------
# Commands


def _cmd_config_example(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    out.write(EXAMPLE_CONFIG)
    return EXIT_OK


def _new_class_hint(exc: ConfigError, old_text: str, edits: list[tuple[str, Any]], path: str) -> ConfigError:
    """An edit of a class the file does not have made a new class, and the error was about
    that (a trial's `classes.interactve.queue_depth=32`: "classes.interactve.priority:
    missing"): say it is not one of the file's classes, and which one was likely meant."""
    import difflib

    try:
        known = parse_config(old_text, path).class_names
    except ConfigError:
        return exc
    for dotted, _value in edits:
        parts = dotted.split(".")
        if len(parts) == 3 and parts[0] == "classes" and parts[1] not in known and exc.key.startswith(f"classes.{parts[1]}"):
            close = difflib.get_close_matches(parts[1], known, n=1)
            meant = f"did you mean {close[0]!r}?" if close else "a new class needs its priority"
            hint = f" (classes.{parts[1]} is not one of the file's classes, {', '.join(known)}: {meant})"
            return ConfigError(exc.source, exc.key, exc.problem + hint)
    return exc


def _write_config(path: str, edits: list[tuple[str, Any]]) -> None:
    """Apply `edits` to the file at `path`, validated whole first (ConfigError: nothing written)."""
    import os

    from gate.config.edit import set_keys

    with open(path, encoding="utf-8") as f:
        text = f.read()
    new = set_keys(text, edits)
    try:
        parse_config(new, path)  # raises ConfigError naming the key: the file is untouched
    except ConfigError as exc:
        raise _new_class_hint(exc, text, edits, path) from None
    # The new file takes the old one's owner, group and mode (a root-owned file the service's
    # group reads, 0640, stays so after `sudo tokengate config set`) and is created 0600, so
    # the text (a Redis password, perhaps) is never readable by more than the old file was.
    # Written where a symlink points (config management often links /etc/tokengate/tokengate.toml
    # to a managed file): replaced at the link's own path, the link became a plain file and the
    # file it named kept the old values (a what-if trial).
    target = os.path.realpath(path)
    st = os.stat(target)
    tmp = target + ".tokengate-new"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)  # a leftover of an interrupted edit
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(new)
        with contextlib.suppress(OSError):  # not ours to give away (not root): ours, then
            os.fchown(f.fileno(), st.st_uid, st.st_gid)
        with contextlib.suppress(OSError):
            os.fchmod(f.fileno(), st.st_mode & 0o7777)
    os.replace(tmp, target)


def _cmd_config_set(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from gate.config.edit import parse_value, split_key

    edits = []
    for item in args.edits:
        key, eq, value = item.partition("=")
        if not eq:
            err.write(f"tokengate config set: {item!r}: give TABLE.KEY=VALUE\n")
            return EXIT_USAGE
        try:
            split_key(key.strip())
        except ValueError as exc:
            err.write(f"tokengate config set: {exc}\n")
            return EXIT_USAGE
        edits.append((key.strip(), parse_value(value.strip())))
    try:
        _write_config(args.file, edits)
    except ValueError as exc:  # a key set_keys cannot place (backends.url): nothing written
        err.write(f"tokengate config set: {exc}\n")
        return EXIT_USAGE
    for key, value in edits:
        out.write(f"set {key} = {value!r} in {args.file}\n")
    replaced, started_from = _retunes_a_reload_replaces(args.file)
    if started_from and not _same_file(args.file, started_from):
        # A copy of the gate's config (its journal, so its control socket, shared) was told
        # "the running gate holds runtime retunes that its next reload replaces with this file's
        # values ... overrides write --config other.toml" (a trial): a reload reads the file the
        # gate was started from, never this one
        err.write(
            f"tokengate config set: note: {args.file} is not the running gate's config (the gate on its journal was "
            f"started from {started_from}, which a reload re-reads): the gate does not read this file\n"
        )
    elif replaced:
        # A trial's morning `config set` + `systemctl reload` quietly undid the night's console
        # retunes (audited, toasted, but nobody who ran the reload was told before it).
        err.write(
            f"tokengate config set: note: the running gate holds runtime retunes that its next reload (SIGHUP) "
            f"replaces with this file's values: {'; '.join(replaced)}; to keep them, first run "
            f"`tokengate overrides write --config {args.file}`\n"
        )
    return EXIT_OK


def _same_file(path: str, started_from: str) -> bool:
    """Is `path` the file the gate was started from (resolved by the gate, in its directory)?"""
    if os.path.realpath(path) == started_from:
        return True
    try:
        return os.path.samefile(path, started_from)  # another name for it (a bind mount, a hard link)
    except OSError:
        return False


def _retunes_a_reload_replaces(path: str) -> tuple[list[str], str | None]:
    """The retunes (not pauses, the freeze or hand budgets, which a reload keeps) the gate running
    on the config at `path` (on its journal's control socket) holds that the file now says
    otherwise, and the config file that gate was started from ("": it does not say, a gate
    before it did); ([], None) when no gate runs on it."""
    import asyncio

    from gate.ops.control_socket import is_live
    from gate.ops.link import SocketLink
    from gate.ops.overrides import _fmt

    try:
        config = load_config(path)
    except ConfigError:
        return [], None
    socket_path = config.gate.control_socket_path()
    if not socket_path or not is_live(socket_path):
        return [], None

    async def ask() -> tuple[tuple[str, ...], str]:
        link = await SocketLink.connect(socket_path, read_only=True, client="cli")
        try:
            snap = await link.snapshot()
            return snap.overrides, snap.config_path
        finally:
            await link.close()

    try:
        lines, started_from = asyncio.run(ask())
    except OSError:  # it stopped meanwhile (LinkLost is a ConnectionError)
        return [], None
    classes = {c.name: c for c in config.classes}
    replaced = []
    for line in lines:
        key, eq, value = line.partition("=")
        parts = key.split(".")
        if not eq or parts[0] not in ("budget", "classes"):
            continue  # "batch paused", "controller frozen", "budget 4096 on default": kept by a reload
        if parts[0] == "budget" and len(parts) == 2:
            now = getattr(config.budget, parts[1], None)
        elif len(parts) == 3 and parts[1] in classes:
            now = getattr(classes[parts[1]], parts[2], None)
        else:
            now = None
        if _fmt(now) != value:
            replaced.append(line)
    return replaced, started_from


def _cmd_overrides(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    import asyncio

    from gate.data.commands import DropOverrides
    from gate.ops import overrides as kept
    from gate.ops.control_socket import is_live
    from gate.ops.link import SocketLink

    config = _read_side(args.config, err, "overrides", journal=args.journal is None)
    journal = args.journal or config.gate.journal
    path = kept.path_for(journal)
    current, damaged = kept.load_or_why(path, set_aside=False)  # a gate may run on it: never moved here
    socket_path = config.gate.control_socket_path() or ""
    live = bool(socket_path) and is_live(socket_path)
    if not live and not current and not os.path.exists(journal) and not os.path.exists(path):
        # The wrong directory, or no --config: "no runtime overrides" (exit 0) about a journal
        # that is not there read as "the gate runs on its file" (a trial, at its incident).
        err.write(
            f"tokengate overrides: {journal}: journal file not found (and no {path}): no gate has run on it here; "
            "a gate keeps its overrides beside its [gate] journal: pass --config FILE (the gate's) or --journal FILE\n"
        )
        return EXIT_RUNTIME
    if args.action == "show" and live:
        # The running gate's word, not the file's: a write a full disk refused left the file
        # behind (or absent: "the gate runs on its config file") while a pause and a freeze held.
        async def ask() -> tuple[tuple[str, ...], str]:
            link = await SocketLink.connect(socket_path, read_only=True, client="cli")
            try:
                snap = await link.snapshot()
                return snap.overrides, snap.overrides_not_kept
            finally:
                await link.close()

        lines, not_kept = asyncio.run(ask())
        if not lines:
            out.write(f"no runtime overrides: the gate on {socket_path} runs on its config file\n")
        for line in lines:
            out.write(line + "\n")
        if lines:  # where they come from, beside the lines (stdout stays the lines alone)
            err.write(f"tokengate overrides: in force now on the gate on {socket_path}\n")
        if lines and not_kept:
            err.write(f"tokengate overrides: NOT kept for a restart ({not_kept}): a restart would revert them\n")
        return EXIT_OK
    if damaged and args.action != "drop":
        err.write(
            f"tokengate overrides: {damaged}: what it holds cannot be shown or written; a running gate keeps "
            "its overrides in force and writes the file again at its next change; `overrides drop` removes it\n"
        )
        return EXIT_RUNTIME
    if args.action == "show":
        if not current:
            out.write(f"no runtime overrides ({path} absent): the gate runs on its config file\n")
        for line in current.lines():
            out.write(line + "\n")
        if current:
            err.write(
                f"tokengate overrides: kept in {path}, not in force: no gate runs on {socket_path or 'this config'}; "
                "the next gate on this journal starts with them (`overrides drop` to start on the file alone)\n"
            )
        return EXIT_OK
    if args.action == "drop":
        if live:

            async def drop() -> str:
                link = await SocketLink.connect(socket_path, client="cli")
                try:
                    (result,) = await link.command(DropOverrides(note="tokengate overrides drop"))
                    return result.message
                finally:
                    await link.close()

            out.write(asyncio.run(drop()) + f" (the gate on {socket_path}; audited)\n")
            return EXIT_OK
        return _drop_offline(journal, path, socket_path or "this config", out, err)
    # write
    if not args.config:
        err.write("tokengate overrides write: --config FILE is the file to write them into\n")
        return EXIT_USAGE
    edits = [(f"budget.{k}", v) for k, v in sorted(current.settings.items())]
    edits += [(f"classes.{c}.{k}", v) for c, ch in sorted(current.classes.items()) for k, v in sorted(ch.items())]
    if not edits:
        out.write("no retuned settings to write (paused classes, the freeze, hand budgets and model pins are runtime state)\n")
        return EXIT_OK
    _write_config(args.config, edits)
    for key, value in edits:
        out.write(f"wrote {key} = {value!r} into {args.config}\n")
    if live:
        out.write("the running gate holds them until it re-reads the file: systemctl reload tokengate (SIGHUP)\n")
    else:
        kept.save(path, kept.Overrides(budgets=current.budgets, paused=current.paused, frozen=current.frozen, pins=current.pins))
    return EXIT_OK


def _drop_offline(journal: str, path: str, where: str, out: TextIO, err: TextIO) -> int:
    """`overrides drop` with no gate answering on its control socket: the kept file goes, with an
    audit row in the journal saying who dropped what (it went with no trace before), or nothing
    changes. Under the journal's lock: a gate serving on this journal without its socket (one it
    could not bind) would write its overrides again within a second, and the next start restore
    what the row says was dropped; a gate starting meanwhile finds the journal in use."""
    import sqlite3
    import time

    from gate.data.commands import Operator
    from gate.data.records import AuditRecord
    from gate.journal import JournalError, write_now
    from gate.ops import overrides as kept
    from gate.ops.lock import JournalLock, JournalLocked, new_gate_id

    writer = new_gate_id()
    lock = JournalLock(journal)
    try:
        lock.acquire(f"{writer} (tokengate overrides drop)")
    except JournalLocked as exc:
        err.write(
            f"tokengate overrides drop: {exc}\n"
            f"tokengate overrides drop: that gate does not answer on {where}: it keeps its overrides and would write "
            "them again; drop them on it once its control socket answers, or stop it first. Nothing dropped\n"
        )
        return EXIT_RUNTIME
    try:
        current, damaged = kept.load_or_why(path, set_aside=False)  # read again, under the lock
        if not current and damaged is None:
            out.write(f"no kept overrides ({path} absent): nothing to drop; no gate runs on {where}\n")
            return EXIT_OK
        dropped = current.lines()
        operator = Operator.from_environ()
        note = f"no gate ran on {journal}: {path} removed, the next start runs on the config file alone"
        if damaged is not None:
            note += f" ({damaged})"
        row = AuditRecord(
            ts=time.time(),
            operator=operator.name,
            origin=operator.origin,
            source="cli",
            action="overrides_dropped",
            target="overrides",
            old_value="; ".join(dropped) or None,
            new_value=None,
            note=note,
            gate_id=writer,
        )
        # Set aside first, removed once the row is committed: a row that cannot be written (a
        # read-only or full disk) leaves the file where it was, and no row says what did not happen.
        aside = path + ".dropping"
        os.replace(path, aside)
        try:
            write_now(journal, [row])
        except (sqlite3.Error, OSError, JournalError) as exc:
            os.replace(aside, path)
            err.write(f"tokengate overrides drop: {journal}: the audit row could not be written ({exc}): nothing dropped\n")
            return EXIT_RUNTIME
        os.unlink(aside)
    finally:
        lock.release()
    what = f"{len(dropped)} kept overrides ({'; '.join(dropped)})" if dropped else "an unreadable overrides file"
    out.write(f"dropped {what}: {path} removed; no gate runs on {where}; audited in {journal} (operator {operator.name})\n")
    return EXIT_OK


def _cmd_config_check(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    if args.file == "-":
        source = "<stdin>"
        config = parse_config(sys.stdin.read(), source)
    else:
        source = args.file
        config = load_config(args.file)
    counts = ", ".join(
        (
            _plural(len(config.backends), "backend", "backends"),
            _plural(len(config.classes), "class", "classes"),
            _plural(len(config.tenants), "tenant", "tenants"),
        )
    )
    if getattr(args, "backends", False):
        from gate.backend.sameserver import check_places

        # before "ok": a trial read "ok: dup.toml", then the error and exit 2
        check_places(config, source)  # localhost and 127.0.0.1 on one port: exit 2 before asking either
    out.write(f"ok: {source} ({counts})\n")
    # With --backends, each backend's check says what the file's token_budget contradicts with the
    # capacity llama-server reports (its slots' context too): the file-only warnings are said there
    # only where it reports none. Both were printed: a trial read the reservation warning twice,
    # and "batch ... never starts" from the file alone, where slots of 512 start it (`fit_injected`).
    fixed = [] if getattr(args, "backends", False) else fixed_budget_warnings(config)
    for w in fixed + objective_warnings(config) + limit_warnings(config):
        out.write(f"warning: {w}\n")  # what `serve` would warn at start (a warning: the exit status stays 0)
    try:
        _check_directories(config, source)
    except ConfigError as exc:
        # a warning, not an error: a file may be checked on another host than the one it serves
        # on; said, since `serve` here would exit 2 (a trial read "ok", then serve refused)
        out.write(f"warning: {exc.key}: {exc.problem}: `tokengate serve` on this host would refuse to start\n")
    if args.verbose:
        for line in describe_config(config):
            out.write(line + "\n")
    if getattr(args, "backends", False):
        import os

        from gate.backend import layout
        from gate.backend.pool import check_backend
        from gate.backend.sameserver import same_process, same_process_problem

        rc = EXIT_OK
        routers = []
        for b in config.backends:
            line, warnings, notes = check_backend(b, config.budget, config.classes, environ=os.environ)
            out.write(f"backend  {b.name}  {b.url}: {line}\n")
            if line.startswith("router mode"):
                routers.append(b.name)
            if warnings or "unreachable" in line or line.startswith("not ready"):
                rc = EXIT_RUNTIME
            for w in warnings:
                out.write(f"warning: backend {b.name}: {w}\n")
            if ", ceiling " not in line:  # no capacity reported (unreachable, not ready, a router): the file's alone
                for w in fixed_budget_warnings(config, (b,)):
                    out.write(f"warning: {w}\n")
            for n in notes:
                out.write(f"note: backend {b.name}: {n}\n")  # handled by the gate itself: the exit status stays
        if config.shared.enabled:
            # a wrong password made `serve` run on its failure policy for ever (now it refuses
            # to start); said here before a deploy, as a backend that does not answer is
            from gate.fleet.sharedlimits.client import check_redis, shown_redis_url

            line, ok = asyncio.run(check_redis(config.shared))
            out.write(f"shared   {shown_redis_url(config.shared.redis_url)}: {line}\n")
            if not ok:
                rc = EXIT_RUNTIME
        # what resolving cannot tell (one llama-server on 0.0.0.0 reached as 127.0.0.1 and as
        # ::1), its process can: a trial's two backends both printed "llama-server pid 28278"
        pairs = same_process(config.backends, {b.name: layout.local_server_args(b.url) for b in config.backends}, routers)
        for first, second, server in pairs:
            i = config.backends.index(second)
            err.write(f"{ConfigError(source, f'backends[{i}].url', same_process_problem(first, second, server))}\n")
        return EXIT_USAGE if pairs else rc
    return EXIT_OK


def fixed_budget_warnings(config: Config, backends: Sequence[BackendConfig] | None = None) -> list[str]:
    """What `capacity_warnings` says of a backend whose ceiling the file fixes (token_budget),
    known without asking llama-server: reservations or min_tokens above it, a class left no
    room (one slot's context is unknown here: `config check --backends` asks). `backends`: those
    of `config` to check (default: all)."""
    from gate.backend.pool import capacity_warnings
    from gate.core.admission import Capacity

    out = []
    for b in config.backends if backends is None else backends:
        if b.token_budget is not None:
            cap = Capacity(slots=1, slot_context=sys.maxsize, ceiling=b.token_budget)
            out += [
                f"backend {b.name} (token_budget {b.token_budget}): {w}"
                for w in capacity_warnings(None, cap, config.budget, config.classes)
            ]
    return out


def _fmt_tokens(n: int | None, none: str) -> str:
    return none if n is None else str(n)


def _fmt_num(x: float) -> str:
    return f"{x:g}"


def describe_config(config: Config) -> list[str]:
    """A short human summary of the effective config, one line per item."""
    lines = [f"listen   {config.gate.listen}    journal {config.gate.journal}"]
    for b in config.backends:
        extra = []
        if b.models:
            extra.append("models " + ", ".join(b.models))
        if b.token_budget is not None:
            extra.append(f"token_budget {b.token_budget}")
        if b.max_prefill_tokens is None:
            extra.append("prefill cap auto")
        elif b.max_prefill_tokens:
            extra.append(f"max_prefill_tokens {b.max_prefill_tokens}")
        else:
            extra.append("no prefill cap")
        extra.append(f"long prompts (> {b.prefill_yield_tokens}) yield" if b.prefill_yield_tokens else "no prefill yielding")
        tail = ("  " + "  ".join(extra)) if extra else ""
        lines.append(f"backend  {b.name}  {b.url}  kv {b.kv}{tail}")
    bu = config.budget
    slo = f"TTFT p95 {_fmt_num(bu.slo_ttft_p95_ms)} ms"
    if bu.slo_tpot_p95_ms is not None:
        slo += f", TPOT p95 {_fmt_num(bu.slo_tpot_p95_ms)} ms"
    aging = f"aging {_fmt_num(bu.aging_s)} s" if bu.aging_s else "aging off"
    reserved = sum(c.reserved_tokens for c in config.classes)
    floor = (
        f"min {bu.min_tokens} tokens"
        if bu.min_tokens
        else "min auto (a quarter of the ceiling"
        + (f", at least the classes' reservations, {reserved}, or half the ceiling on a pool under {2 * reserved})" if reserved else ")")
    )
    kept = "free slots kept for higher classes" if bu.keep_slots else "free slots to whoever comes"
    lines.append(f"budget   {bu.mode}, {floor}, SLO {slo}, {aging}, {kept}")
    for c in config.classes:
        default = "  (default)" if c.name == config.default_class else ""
        lines.append(
            f"class    {c.name}  priority {c.priority}  reserved {c.reserved_tokens}  "
            f"limit {_fmt_tokens(c.limit_tokens, 'budget')}  depth {c.queue_depth}  "
            f"timeout {_fmt_num(c.queue_timeout_s)} s"
            # the objective it is refused by and judged against, in force whether set or not
            + (
                f"  TTFT objective {_fmt_num(c.ttft_objective_ms)} ms"
                if c.ttft_objective_ms
                else f"  TTFT objective {_fmt_num(bu.slo_ttft_p95_ms)} ms (the SLO's)"
            )
            + default
        )
    if config.tenants:
        lines.append(f"tenants  {', '.join(t.name for t in config.tenants)}")
    elif any(b.api_key_env for b in config.backends):
        lines.append("tenants  none (open gate: clients present the backends' own API key, api_key_env)")
    else:
        lines.append("tenants  none (open gate)")
    sh = config.shared
    if sh.enabled:
        from gate.fleet.sharedlimits.client import shown_redis_url

        lines.append(
            f"shared   tenant limits across gates on {shown_redis_url(sh.redis_url)} (prefix {sh.key_prefix!r}), "
            f"{sh.failure_policy} when it is out of reach, renewal every {_fmt_num(sh.renew_interval_s)} s"
        )
    else:
        lines.append("shared   off (each gate enforces its tenant limits alone)")
    return lines


def _read_side(path: str | None, err: TextIO, command: str, *, journal: bool = True, socket: bool = True) -> Config:
    """The config at `path` for a command that reads what its gate writes: its journal and
    control socket where the gate has them (`beside_the_file`), said on stderr when moved, and
    where the relative ones it reads (`journal`, `socket`) are (`relative_paths_note`)."""
    config, note = beside_the_file(load_config(path), path)
    if note:
        err.write(f"tokengate {command}: {note}\n")
    else:
        note = relative_paths_note(config, path, journal=journal, socket=socket)
        if note:
            err.write(f"tokengate {command}: {note}\n")
    return config


def _cmd_console(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    watching = (args.attach is not None or args.read_only) and not args.demo  # never starts a gate of its own
    # (an --attach that names its socket reads none of the config's)
    named = any(args.attach or ())
    config = _read_side(args.config, err, "console", journal=False, socket=not named) if watching else load_config(args.config)
    if args.attach is not None and args.demo:
        err.write("tokengate console: --attach and --demo do not go together (the demo runs its own gate)\n")
        return EXIT_USAGE
    if args.read_only and args.attach is None and not args.demo:
        # Watch-only never serves: without a gate on this config there is nothing to watch.
        from gate.ops.control_socket import is_live

        socket_path = config.gate.control_socket_path()
        if not (socket_path and is_live(socket_path)):
            err.write(
                f"tokengate console: --read-only only watches a running gate, and none runs on "
                f"{args.config or 'the default config'} (control socket {socket_path or 'none'}); start one with "
                f"`tokengate serve --config {args.config or 'FILE'}`, or drop --read-only for a quick look "
                "with a gate of its own\n"
            )
            return EXIT_USAGE
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        err.write("tokengate console: needs a terminal (use `tokengate serve` for a headless gate)\n")
        return EXIT_USAGE
    from console.fleet import parse_attach
    from console.run import ConsoleExit, attach_console, attach_fleet, run_console  # Textual only when the console runs

    try:
        if args.attach is not None:
            given = [parse_attach(a) for a in args.attach if a]
            if len(given) > 1 or (not given and config.fleet):
                gates = given or [(f.name, f.socket) for f in config.fleet]
                return asyncio.run(attach_fleet(gates, read_only=args.read_only))
            path = (given[0][1] if given else "") or config.gate.control_socket_path() or "tokengate.sock"
            return asyncio.run(attach_console(path, read_only=args.read_only))
        if not args.demo:
            _check_directories(config, args.config or "the default config")
        return asyncio.run(run_console(config, config_path=args.config, demo=args.demo, read_only=args.read_only))
    except ConsoleExit as exc:
        err.write(f"tokengate console: {exc}\n")
        return EXIT_USAGE


def _cmd_log(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from gate.journal.export import ExportError, export, find_journal, window_moments, window_order_error, yesterday_note

    # flags that do not go together are a usage error (2, as the help says), before any file is read
    if args.cls is not None and args.kind != "decisions":
        err.write("tokengate log: error: --class selects decisions: use it with --kind decisions\n")
        return EXIT_USAGE
    if args.format == "aiperf" and args.kind != "decisions":
        err.write("tokengate log: error: --format aiperf is a trace of requests: use it with --kind decisions\n")
        return EXIT_USAGE
    wrong_order = window_order_error(args.since, args.until)
    if wrong_order:
        err.write(f"tokengate log: error: {wrong_order}\n")
        return EXIT_USAGE
    day_note = yesterday_note(args.since, args.until)
    args.since, args.until = window_moments(args.since, args.until)  # a time-of-day --until on --since's day
    given = args.journal
    if given is None and getattr(args, "config", None):
        given = _read_side(args.config, err, "log", socket=False).gate.journal
    journal, note = find_journal(given)
    if note:
        err.write(f"tokengate log: {note}\n")
    notes: list[str] = []
    try:
        n = export(journal, out, kind=args.kind, fmt=args.format, since_ts=args.since, cls=args.cls, until_ts=args.until, notes=notes)
    except ExportError as e:
        err.write(f"tokengate log: error: {e}\n")
        return EXIT_RUNTIME
    for line in notes:
        err.write(f"tokengate log: {line}\n")
    if n == 0 and args.cls is not None:
        # empty is an answer, but a mistyped class should not look like a quiet incident
        err.write(f"tokengate log: no decisions of class {args.cls!r} in the selection{_unknown_class(journal, args.cls)}\n")
    elif n == 0 and args.format != "table" and not notes:
        # the table says "(no rows)"; an empty trace or file said nothing (a trial's aiperf trace
        # of a window after the journal's end: exit 0, empty, no word)
        err.write(f"tokengate log: no {args.kind} rows in the selection: nothing written\n")
    if n == 0 and day_note:
        err.write(f"tokengate log: {day_note}\n")  # an empty yesterday, for a time of day meant today
    return EXIT_OK


def _unknown_class(journal: str, cls: str) -> str:
    """': the journal has no class X (its classes: ...)' when no decision ever had that class."""
    from gate.journal.export import ExportError, open_read_only

    try:
        conn = open_read_only(journal)
    except ExportError:
        return ""
    try:
        classes = sorted(c for (c,) in conn.execute("SELECT DISTINCT class FROM decisions") if c)
    finally:
        conn.close()
    return "" if cls in classes else f": the journal has no class {cls!r} (its classes: {', '.join(classes) or 'none'})"


def _cmd_review(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    slo_ms: float | None = None
    journal = args.journal
    if args.config:
        config = _read_side(args.config, err, "review", socket=False) if journal is None else load_config(args.config)
        slo_ms = config.budget.slo_ttft_p95_ms
        journal = journal or config.gate.journal
    from gate.journal.export import find_journal

    journal, note = find_journal(journal)
    if note:
        err.write(f"tokengate review: {note}\n")
    from console.review_app import ReviewApp, ReviewError, check_journal

    try:
        check_journal(journal)
    except ReviewError as e:
        err.write(f"tokengate review: error: {e}\n")
        return EXIT_RUNTIME
    from console.run import run_apart

    app = ReviewApp(journal, slo_ttft_ms=slo_ms)
    run_apart(app)
    if app.error:
        err.write(f"tokengate review: error: {app.error}\n")
        return EXIT_RUNTIME
    return app.return_code or EXIT_OK


def _check_directories(config: Config, source: str) -> None:
    """The journal's and the control socket's directories must exist: a typo'd directory made
    the gate start, probe its backends and then die with a bare FileNotFoundError (exit 1,
    no path, no key). Raises ConfigError (exit 2) naming the key and the directory."""
    socket_key = "gate.control_socket" if config.gate.control_socket else "gate.journal"
    for key, path in (("gate.journal", config.gate.journal), (socket_key, config.gate.control_socket_path())):
        if not path or path == ":memory:":
            continue
        directory = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(directory):
            raise ConfigError(source, key, f"{path}: the directory {directory} does not exist (create it, or correct the path)")


def _hold_hangups() -> Callable[[], bool]:
    """Until the gate's loop takes SIGHUP over, a hang-up is held, not fatal: its default
    action ends the process (a trial's `systemctl reload` 0.3 s after start killed the gate,
    and systemd counts death by SIGHUP as clean, so nothing restarted it). The returned
    function says whether one came, for the gate to reload once it runs."""
    import signal

    came: list[int] = []
    signal.signal(signal.SIGHUP, lambda signum, _frame: came.append(signum))
    return lambda: bool(came)


def _cmd_serve(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    held_hangup = _hold_hangups()
    config = load_config(args.config)
    _check_directories(config, args.config or "the default config")
    if not args.demo:  # the demo's backend is its simulator, on a port of its own
        from gate.backend.sameserver import check_places

        # two names of one llama-server (localhost, 127.0.0.1), or of the gate itself: exit 2
        check_places(config, args.config or "the default config")
    logging.basicConfig(level=args.log_level.upper(), stream=err, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # One line per upstream call drowns what matters; the gate logs its own decisions.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    for w in objective_warnings(config) + limit_warnings(config):
        logging.getLogger("tokengate.config").warning("%s", w)
    from gate.fleet.sharedlimits.causes import SharedStartError
    from gate.http.server import ListenError
    from gate.ops.control_socket import SocketInUse
    from gate.ops.lock import JournalLocked
    from gate.serve import serve_until_signalled  # the HTTP stack only when serving

    console_pid = _die_with_parent()
    if console_pid is False:
        err.write("tokengate serve: the console that started this gate is gone\n")
        return EXIT_RUNTIME
    main = serve_until_signalled(
        config,
        config_path=args.config,
        grace_s=args.grace,
        demo=args.demo,
        seed=args.seed,
        held_hangup=held_hangup,
        console_pid=console_pid,
    )
    try:
        try:
            import uvloop  # faster event loop for the headless gate
        except ImportError:
            return asyncio.run(main)
        return uvloop.run(main)
    except (JournalLocked, SocketInUse, ListenError, SharedStartError) as exc:
        err.write(f"tokengate serve: {exc}\n")
        return EXIT_USAGE


# ------------------------------------------------------------------------------------------
# simulate: the built-in llama-server stand-in (gate/tools/simulator/)


def _add_simulate_parser(commands: argparse._SubParsersAction) -> None:
    simulate = commands.add_parser(
        "simulate",
        help="run the built-in llama-server simulator (for demos and benchmarks)",
        description=(
            "Serve a llama-server stand-in: the same endpoints and shapes (/health, /props,\n"
            "/slots, /metrics, /tokenize, /apply-template, the completion routes), N slots, an\n"
            "unbounded FIFO when they are busy, a unified or split KV pool, and decode rates\n"
            "that slow as more slots are busy. Runs until Ctrl-C or SIGTERM. It is a model,\n"
            "not llama-server: measure anything that matters against the real server."
        ),
        epilog=_EXIT_CODES,
        formatter_class=_Formatter,
    )
    simulate.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    simulate.add_argument("--port", type=int, default=8080, help="port to listen on (default: 8080, llama-server's; 0: any free port)")
    simulate.add_argument("--slots", type=_positive_int, default=4, help="parallel slots (default: 4)")
    simulate.add_argument("--ctx", type=_positive_int, default=8192, help="total context in tokens (default: 8192)")
    kv = simulate.add_mutually_exclusive_group()
    kv.add_argument(
        "--unified",
        dest="kv",
        action="store_const",
        const="unified",
        help="one KV pool shared by every slot; when it runs out every active request fails (default)",
    )
    kv.add_argument("--split", dest="kv", action="store_const", const="split", help="each slot gets ctx/slots tokens of its own")
    simulate.set_defaults(kv="unified")
    simulate.add_argument(
        "--decode-tps",
        type=_positive_float,
        default=None,
        metavar="X",
        help="tokens/s one slot generates when it is alone (default: 22.2, i.e. 45 ms/token, an 8B Q4 "
        "model on an A10G); with every slot busy each gets a quarter of that",
    )
    simulate.add_argument(
        "--speed", type=_positive_float, default=1.0, metavar="F", help="run F times faster than the modelled GPU (default: 1)"
    )
    simulate.add_argument("--seed", type=int, default=0, help="seed of the generated text and EOS (default: 0)")
    simulate.set_defaults(func=_cmd_simulate)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1: {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number: {text}")
    return value


def _cmd_simulate(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from gate.tools.simulator import SimulatorConfig

    base = SimulatorConfig()
    ms_alone = base.ms_per_token_alone if args.decode_tps is None else 1000.0 / args.decode_tps
    try:
        config = SimulatorConfig(
            slots=args.slots,
            ctx=args.ctx,
            kv=args.kv,
            ms_per_token_alone=ms_alone,
            ms_per_token_full=ms_alone * base.ms_per_token_full / base.ms_per_token_alone,
            seed=args.seed,
            speed=args.speed,
        )
    except ValueError as e:
        err.write(f"tokengate simulate: error: {e}\n")
        return EXIT_USAGE
    return asyncio.run(_simulate_until_signalled(config, args.host, args.port, out, err))


async def _simulate_until_signalled(config, host: str, port: int, out: TextIO, err: TextIO) -> int:
    import contextlib
    import signal

    from gate.tools.simulator import serve_simulator

    try:
        handle = await serve_simulator(config, host, port)
    except OSError as e:
        err.write(f"tokengate simulate: error: cannot listen on {host}:{port}: {e.strerror or e}\n")
        return EXIT_RUNTIME
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, stop.set)
    out.write(f"tokengate simulator (a SIMULATED llama-server) listening on {handle.url}\n")
    out.write(
        f"slots {config.slots}  ctx {config.ctx} ({config.kv} KV, {config.slot_ctx} per slot)  "
        f"decode {1000.0 / config.ms_per_token_alone:.1f} tok/s alone, "
        f"{1000.0 / config.ms_per_token_full:.1f} each with all busy  "
        f"prefill {config.prefill_tps:g} tok/s  speed x{config.speed:g}  seed {config.seed}\n"
    )
    out.write("Ctrl-C or SIGTERM stops it\n")
    out.flush()
    waiter = asyncio.ensure_future(handle.wait())
    stopper = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for f in (waiter, stopper):
            f.cancel()
        await handle.stop()
    out.write("simulator stopped\n")
    return EXIT_OK


# ------------------------------------------------------------------------------------------
# crunch: calibrate a llama-server before choosing a token budget (gate/tools/crunch/)


_CRUNCH_EXIT_CODES = """\
exit codes:
  0  ok: a token budget is recommended
  1  runtime failure (llama-server out of reach), or no cell met the objective, so no
     budget is recommended (the table is printed all the same)
  2  usage error: the arguments, or the arguments do not fit the server
"""


def _add_crunch_parser(commands: argparse._SubParsersAction) -> None:
    crunch = commands.add_parser(
        "crunch",
        help="measure a llama-server and recommend a token budget",
        description=(
            "Calibrate before you set thresholds. Against llama-server itself (NOT through the\n"
            "gate), sweep concurrency (1, 2, 4, ... up to 2x the server's slots, from /props) x\n"
            "context length (512, 1K, 2K, 4K that fit one slot's context). In each cell keep\n"
            "CONCURRENCY streaming requests in flight, each with a prompt of ~ctx/2 tokens (plain\n"
            "words, sized with /tokenize) and max_tokens = min(ctx/4, --max-tokens), ignore_eos.\n"
            "Per cell print p95 TTFT, p95 time per output token and the tokens in flight\n"
            "(concurrency x (prompt + max_tokens)); mark the cells that breach the objective or\n"
            "had a failed request. Recommend 75% of the largest in-flight count that did not\n"
            "breach (counting at most SLOTS requests: the rest only wait in llama-server's queue),\n"
            "never below one slot's context (the budget also caps one request: less refuses, 400,\n"
            "what llama-server serves); a lower figure becomes min_tokens, the adaptive floor.\n"
            "Edits to the classes (reserved_tokens, default_max_tokens) are printed with why.\n"
            "As config edits and a snippet. Use a server nobody else is using: other\n"
            "traffic skews the numbers, and this load slows it down.\n"
            "Example: tokengate crunch http://127.0.0.1:8080 --slo-ttft-ms 1500 --slo-tpot-ms 80"
        ),
        epilog=_CRUNCH_EXIT_CODES,
        formatter_class=_Formatter,
    )
    crunch.add_argument(
        "url",
        nargs="?",
        default="http://127.0.0.1:8080",
        help="llama-server's base URL (default: http://127.0.0.1:8080)",
    )
    crunch.add_argument(
        "--ctx",
        type=_list_arg("ctx"),
        metavar="LIST",
        default=None,
        help="context lengths to sweep, e.g. 512,1k,2k (default: 512,1K,2K,4K; only those that fit one slot's context are run)",
    )
    crunch.add_argument(
        "--concurrency",
        type=_list_arg("concurrency"),
        metavar="LIST",
        default=None,
        help="concurrency levels, e.g. 1,4,8 (default: 1, 2, 4, ... and the slot count, up to 2x slots)",
    )
    crunch.add_argument(
        "--requests",
        type=_positive_int,
        metavar="N",
        default=None,
        help="requests per cell, at least one per concurrent stream (default: max(2 x concurrency, 4))",
    )
    crunch.add_argument(
        "--max-tokens",
        type=_positive_int,
        metavar="N",
        default=128,
        help="cap on the tokens each request generates; it generates min(ctx/4, N) (default: 128)",
    )
    crunch.add_argument(
        "--slo-ttft-ms",
        type=_positive_float,
        metavar="MS",
        default=2000.0,
        help="objective: p95 time to first token, in ms (default: 2000, the gate's default SLO)",
    )
    crunch.add_argument(
        "--slo-tpot-ms",
        type=_positive_float,
        metavar="MS",
        default=None,
        help="objective: p95 time per output token, in ms (default: not checked)",
    )
    crunch.add_argument(
        "--endpoint",
        choices=("chat", "completion"),
        default="chat",
        help="chat: /v1/chat/completions (the prompt sized after the chat template); "
        "completion: llama-server's native /completion (default: chat)",
    )
    crunch.add_argument(
        "--timeout",
        type=_positive_float,
        metavar="SECONDS",
        default=300.0,
        help="longest wait for one request's next bytes; a request that waits longer fails (default: 300)",
    )
    crunch.add_argument(
        "--api-key-env",
        metavar="NAME",
        default=None,
        help="environment variable holding llama-server's --api-key (default: send none)",
    )
    crunch.add_argument(
        "--json",
        action="store_true",
        help="print the whole table and the recommendation as JSON on stdout (progress stays on stderr)",
    )
    crunch.add_argument(
        "--config",
        metavar="FILE",
        help="the tokengate.toml the recommendation is for: it is printed as the edits that merge into\n"
        "that file (checked against its classes); default: a file made by `tokengate config example`",
    )
    crunch.set_defaults(func=_cmd_crunch)


def _list_arg(what: str):
    def parse(text: str) -> tuple[int, ...]:
        from gate.tools.crunch import parse_ctx_list, parse_int_list

        try:
            return parse_ctx_list(text) if what == "ctx" else parse_int_list(text, what=what)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    parse.__name__ = what  # argparse names the type in its messages
    return parse


def _cmd_crunch(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    import json

    from gate.tools.crunch import CrunchError, CrunchSettings, Slo, format_report, normalize_url, report_to_json, run_crunch

    try:
        url = normalize_url(args.url)
    except ValueError as e:
        err.write(f"tokengate crunch: error: {e}\n")
        return EXIT_USAGE
    api_key = None
    if args.api_key_env:
        api_key = os.environ.get(args.api_key_env)
        if not api_key:
            err.write(f"tokengate crunch: error: environment variable {args.api_key_env} is not set\n")
            return EXIT_USAGE
    settings = CrunchSettings(
        url=url,
        ctx=args.ctx,
        concurrency=args.concurrency,
        requests=args.requests,
        max_tokens=args.max_tokens,
        endpoint=args.endpoint,
        slo=Slo(ttft_ms=args.slo_ttft_ms, tpot_ms=args.slo_tpot_ms),
        timeout_s=args.timeout,
        api_key=api_key,
    )
    try:
        report = asyncio.run(run_crunch(settings, err=err))
    except CrunchError as e:
        err.write(f"tokengate crunch: error: {e}\n")
        return e.exit_code
    if args.json:
        out.write(json.dumps(report_to_json(report), indent=2) + "\n")
    else:
        text = None
        if args.config:
            with open(args.config, encoding="utf-8") as f:
                text = f.read()
        out.write(format_report(report, config_text=text, config_file=args.config))
    if report.recommendation is None:
        # a script's `crunch ... && deploy` went on, exit 0, after "No cell met the objective,
        # so no budget is recommended" (a first-day trial at --slo-ttft-ms 10)
        err.write("tokengate crunch: no cell met the objective: no budget recommended\n")
        return EXIT_RUNTIME
    return EXIT_OK


# ------------------------------------------------------------------------------------------
# Entry point


#: "-15m", as a user writes "15 minutes ago" after --since (argparse takes it for an option)
_MINUS_DURATION = re.compile(r"^-\d+(\.\d+)?[smhd]$", re.IGNORECASE)


def _glued_moments(argv: Sequence[str]) -> list[str]:
    """`--since -15m` as `--since=-15m`: argparse read the value as an unknown option ("expected
    one argument", a trial's guess); the moment's reader takes the minus as "ago" too."""
    out: list[str] = []
    for arg in argv:
        if out and out[-1] in ("--since", "--until") and _MINUS_DURATION.match(arg):
            out[-1] = f"{out[-1]}={arg}"
        else:
            out.append(arg)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """The ``tokengate`` entry point; returns the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(_glued_moments(sys.argv[1:] if argv is None else argv))
    except SystemExit as e:  # --help, --version, usage errors
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    out, err = sys.stdout, sys.stderr
    try:
        code: int = args.func(args, out, err)
        out.flush()
        return code
    except ConfigError as e:
        err.write(f"{e}\n")
        return EXIT_USAGE
    except BrokenPipeError:
        # The reader went away (e.g. `tokengate config example | head`): not our failure.
        _silence_stdout()
        return EXIT_OK
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # noqa: BLE001 - the contract is "1 on runtime failure", with a message
        err.write(f"tokengate: error: {type(e).__name__}: {e}\n")
        return EXIT_RUNTIME


def _die_with_parent() -> int | None | Literal[False]:
    """A gate started by an embedded console drains when that console dies, even by SIGKILL:
    the kernel sends it CONSOLE_GONE (its own signal, so that the audit says the console
    ended rather than "signal SIGTERM"). The console's pid; None when no console started this
    gate; False when that console is already gone."""
    parent = os.environ.pop("TOKENGATE_PARENT_PID", "")
    if not parent.isdigit() or not sys.platform.startswith("linux"):
        return None
    import ctypes

    from gate.serve import CONSOLE_GONE

    PR_SET_PDEATHSIG = 1
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, CONSOLE_GONE)
    if os.getppid() != int(parent):  # the console died before the line above
        return False
    return int(parent)


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
