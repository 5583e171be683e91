"""The KV layout of a llama-server: one shared pool, or a context of its own per slot.

Over HTTP llama-server (0c1e570) reports the slot count (`/props` `total_slots`) and the
context ONE slot may use (`default_generation_settings.n_ctx`, the same figure as every
`/slots` entry's `n_ctx` and `/v1/models` `meta.n_ctx`), never the total context nor
whether the pool is unified:

  unified (`-np` auto, the default, or `-kvu`): every slot reports the whole pool;
                                                ceiling = n_ctx per slot
  split (`-np N` without `-kvu`):               each slot owns total / N (padded);
                                                ceiling = slots x n_ctx per slot

So the layout is learned by setting that per-slot context against the total, where the
total can be found: a future build's `/props` may say `kv_unified` (used when present),
and a llama-server on this host has its command line in /proc (`-c`, `-np`, `-kvu`,
and their LLAMA_ARG_* variables when its environment is readable). Where nothing tells,
the configured `kv` holds; the default ("auto") assumes unified, the safe side, and says
so (`warnings`), because on `-np 4 -c 2048` that is a quarter of the server.

Nothing here raises; reading /proc is cheap (done when a backend becomes ready).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

_LOOPBACK = {"127.0.0.1", "localhost", "::1", "0.0.0.0", "::", ""}


@dataclass(frozen=True, slots=True)
class ServerArgs:
    """What a llama-server command line says about its slots and context."""

    pid: int
    host: str
    port: int
    ctx: int | None  # -c; None: not given; 0: the model's training context
    n_parallel: int | None  # -np; None or -1: auto (4 slots, unified)
    kv_unified: bool | None  # -kvu / -no-kvu; None: not given

    def describe(self) -> str:
        parts = []
        if self.n_parallel not in (None, -1):
            parts.append(f"-np {self.n_parallel}")
        if self.ctx is not None:
            parts.append(f"-c {self.ctx}")
        if self.kv_unified is not None:
            parts.append("-kvu" if self.kv_unified else "-no-kvu")
        return f"llama-server pid {self.pid}: " + (" ".join(parts) or "default slots and context")


@dataclass(frozen=True, slots=True)
class Layout:
    """The layout in force for one backend and where it comes from."""

    kv: str  # "unified" | "split"
    source: str  # "server" (/props) | "process" (its command line) | "config" | "assumed"
    detail: str  # one line: how it was decided
    warnings: tuple[str, ...] = ()
    #: a unified pool larger than a slot's context (each slot capped, as at the model's training
    #: context): its size from the process's -c; None: a unified slot reports the whole pool
    pool: int | None = None


def _int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def parse_server_args(argv: Sequence[str], env: Mapping[str, str] | None = None, pid: int = 0) -> ServerArgs:
    """llama-server's flags that decide slots and context (later flags win, as in llama.cpp)."""
    env = env or {}
    host = env.get("LLAMA_ARG_HOST", "127.0.0.1")
    port = _int(env.get("LLAMA_ARG_PORT", "8080")) or 8080
    ctx = _int(env["LLAMA_ARG_CTX_SIZE"]) if "LLAMA_ARG_CTX_SIZE" in env else None
    n_par = _int(env["LLAMA_ARG_N_PARALLEL"]) if "LLAMA_ARG_N_PARALLEL" in env else None
    kvu: bool | None = None
    if "LLAMA_ARG_KV_UNIFIED" in env:
        kvu = env["LLAMA_ARG_KV_UNIFIED"].strip().lower() in ("1", "true", "on", "yes", "enabled")
    args = list(argv[1:])
    i = 0
    while i < len(args):
        arg, inline = args[i], None
        if arg.startswith("--") and "=" in arg:
            arg, inline = arg.split("=", 1)
        if arg in ("-kvu", "--kv-unified"):
            kvu = True
        elif arg in ("-no-kvu", "--no-kv-unified"):
            kvu = False
        elif arg in ("--host", "--port", "-c", "--ctx-size", "-np", "--parallel"):
            value = inline
            if value is None and i + 1 < len(args):
                i += 1
                value = args[i]
            if value is not None:
                if arg == "--host":
                    host = value
                elif arg == "--port":
                    port = _int(value) or port
                elif arg in ("-c", "--ctx-size"):
                    ctx = _int(value)
                else:
                    n_par = _int(value)
        i += 1
    return ServerArgs(pid=pid, host=host, port=port, ctx=ctx, n_parallel=n_par, kv_unified=kvu)


def local_server_args(url: str, proc_root: str = "/proc") -> ServerArgs | None:
    """The command line of the one llama-server on this host that listens on `url`'s port.

    None when the URL is not loopback, /proc is not there, or none matches. Several match
    during a restart: the old process finishes its running tasks (~30 s) after it has let the
    port go, the new one already listens. The one started last is then the one that listens
    (only one process can bind the port, and a later one that failed to bind has exited):
    taken when /proc says when each started. Before, two matches meant "not known", and a
    restarted llama-server's layout was assumed unified: a trial's gate ran at 512 of a
    2,048-token split pool, 8 minutes on, until the server's next restart."""
    try:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return None
    if (parts.hostname or "") not in _LOOPBACK:
        return None
    found: list[ServerArgs] = []
    started: list[int | None] = []  # when each of `found` started
    try:
        entries = os.listdir(proc_root)
    except OSError:
        return None
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(os.path.join(proc_root, entry, "cmdline"), "rb") as f:
                raw = f.read()
        except OSError:
            continue
        argv = [a.decode(errors="replace") for a in raw.split(b"\0") if a]
        if not argv or "llama-server" not in os.path.basename(argv[0]):
            continue
        env: dict[str, str] = {}
        try:
            with open(os.path.join(proc_root, entry, "environ"), "rb") as f:
                for item in f.read().split(b"\0"):
                    key, _, value = item.decode(errors="replace").partition("=")
                    if key.startswith("LLAMA_ARG_"):
                        env[key] = value
        except OSError:
            pass  # another user's process: its command line alone
        args = parse_server_args(argv, env, pid=int(entry))
        if args.port == port and args.host in _LOOPBACK | {parts.hostname}:
            found.append(args)
            started.append(_started(os.path.join(proc_root, entry, "stat")))
    if len(found) <= 1:
        return found[0] if found else None
    last = max((s for s in started if s is not None), default=None)
    if None in started or started.count(last) != 1:
        return None  # not known which one listens
    return found[started.index(last)]


def _started(stat_path: str) -> int | None:
    """A process's start time (clock ticks since boot: /proc/PID/stat's 22nd field), or None."""
    try:
        with open(stat_path, "rb") as f:
            raw = f.read()
        # the 2nd field, the command's name in parentheses, may hold spaces: count after its ")"
        return int(raw[raw.rindex(b")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def learn_layout(props: Mapping[str, Any], configured: str, args: ServerArgs | None, n_ctx_train: int | None = None) -> Layout:
    """The layout from the server's own figures; the configured `kv` only where they do not tell.

    `configured` is the config's `kv`: "auto" (learn; assume unified and say so), or an
    operator's "unified"/"split", which a learned layout that disagrees overrides, loudly:
    the server's own figures are what its KV cache is."""
    slots = props.get("total_slots")
    per_slot = (props.get("default_generation_settings") or {}).get("n_ctx")
    if not isinstance(slots, int) or not isinstance(per_slot, int):
        return Layout("unified" if configured == "auto" else configured, "config", "no /props figures")
    learned: tuple[str, str, str] | None = None  # kv, source, detail
    pool: int | None = None
    if isinstance(props.get("kv_unified"), bool):
        kv = "unified" if props["kv_unified"] else "split"
        learned = (kv, "server", f"/props kv_unified={str(props['kv_unified']).lower()}")
    elif slots == 1:
        learned = ("unified", "server", "one slot: its context is the pool")
    elif args is not None:
        total = args.ctx if args.ctx else (n_ctx_train if args.ctx == 0 else None)
        say = f"{args.describe()}; {slots} slots of {per_slot} tokens"
        # -kvu, or -np auto (llama-server then sets kv_unified), is one shared pool whatever the
        # figures: a slot's context below the total there is a cap (the model's training context,
        # --kv-unified-per-slot), and slots x that cap may pass the pool (-c 8192 on a 4096-token
        # model: 4 x 4096), which counted as split admits twice what the cache holds.
        if args.kv_unified is True or args.n_parallel in (None, -1):
            cap = ""
            if total and per_slot < total:
                # the pool is the whole -c: a ceiling of one slot's cap left half of it unused
                cap, pool = f", each slot capped at {per_slot} of the pool of {total}", total
            learned = ("unified", "process", f"{say}: unified ({'-kvu' if args.kv_unified else '-np auto'}{cap})")
        elif total:
            if per_slot >= total:
                learned = ("unified", "process", f"{say}: each slot sees the whole {total}")
            elif per_slot * slots == total:
                learned = ("split", "process", f"{say}: {slots} x {per_slot} = the total {total}")
            elif per_slot * slots > total:  # llama-server rounds each slot's context up (-np 4 -c 512: 4 x 256)
                learned = ("split", "process", f"{say}: {slots} x {per_slot} = {slots * per_slot}, -c {total} rounded up per slot")
        if learned is None:
            if args.kv_unified is None:
                learned = ("split", "process", f"{say}: split (-np without -kvu)")
            else:
                learned = ("split", "process", f"{say}: split (-no-kvu)")
    if learned is not None:
        kv, source, detail = learned
        warnings: tuple[str, ...] = ()
        if configured not in ("auto", kv):
            warnings = (
                f'config says kv = "{configured}" but llama-server runs a {kv} KV cache ({detail}): using {kv}; set kv = "{kv}" or "auto"',
            )
        return Layout(kv, source, detail, warnings, pool if kv == "unified" else None)
    if configured != "auto":
        return Layout(configured, "config", f'kv = "{configured}" (not visible over HTTP)')
    return Layout(
        "unified",
        "assumed",
        "not visible over HTTP: assumed unified, the safe side",
        (
            f"KV layout unknown (llama-server does not report it): assuming unified, ceiling "
            f"{per_slot} = one slot's context; if it runs -np {slots} without -kvu its pool is "
            f'{slots} x {per_slot} = {slots * per_slot}: set kv = "split" (or "unified" to say it is)',
        ),
    )
