"""GateLink: the console's one way to a gate.

Three things a console does with a gate: read a snapshot, send a command, hear
about changes (audit rows: its own actions, other consoles', the controller's).
Two implementations:

* `InProcessLink`: the gate runs on the console's own event loop (tests, the
  screenshot generator).
* `SocketLink`: the gate is another process, `tokengate serve` or the embedded
  console's child; the control socket (`gate.control_socket`) carries the same
  snapshots and commands as JSON lines. Rendering never runs on the gate's loop.

Snapshots, commands and results are plain data (`gate.snapshot`, `gate.commands`),
so the console renders either link the same way and imports nothing else of the gate.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from gate.data.commands import ActionResult, Command, CommandError, ssh_origin, to_wire
from gate.data.records import AuditRecord
from gate.data.snapshot import SNAPSHOT_VERSION, GateSnapshot
from gate.data.wire import WireError, decode

if TYPE_CHECKING:
    from gate.ops.ports import ConsoleHost

PROTOCOL_VERSION = 1
#: a snapshot line holds up to 200 decisions (~100 KB); leave room
MAX_LINE = 16 * 1024 * 1024


def _peer_pid(writer: asyncio.StreamWriter) -> int:
    """The process at the other end of a Unix socket (SO_PEERCRED), 0 when not known."""
    sock = writer.get_extra_info("socket")
    try:
        pid, _uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    except (AttributeError, OSError):
        return 0
    return pid


class LinkLost(ConnectionError):
    """The gate went away (it stopped, or the socket closed)."""


#: How long a command waits for the gate's answer. The gate answers a command on its loop in
#: milliseconds; a gate whose process is stopped (SIGSTOP) or whose loop is stuck never did, and
#: the console's apply then waited without a word (a trial: 30 s of an unchanged status line,
#: then the retune landed when the gate was resumed, unannounced).
ANSWER_WAIT_S = 10.0


class NoAnswer(CommandError):
    """The gate did not answer a command within ANSWER_WAIT_S: it may still apply it when it
    answers (the audit will say), so this is neither "applied" nor "refused"."""


@dataclass(frozen=True, slots=True)
class GateInfo:
    """Who the console talks to, and as whom."""

    gate_id: str
    label: str
    listen: str
    journal: str
    operator: str
    origin: str
    read_only: bool
    embedded: bool  # quitting the console stops the gate
    drain_grace_s: float
    where: str = ""  # "embedded", or the socket path
    pid: int = 0  # the gate's process, as the kernel tells the socket's peer (0: not known)


class GateLink(Protocol):
    info: GateInfo

    async def snapshot(self) -> GateSnapshot:
        """The gate now; its `decisions` are only those this link has not handed out yet."""

    async def command(self, command: Command) -> list[ActionResult]:
        """Apply one command (all or nothing); CommandError when refused, with nothing changed."""

    def subscribe(self, listener: Callable[[AuditRecord], None]) -> None:
        """Call `listener` on the console's loop with every audit row from now on."""

    async def stop_gate(self, why: str) -> None:
        """Drain and stop the gate (only a console that started it may; CommandError otherwise)."""

    async def close(self) -> None: ...


class InProcessLink:
    """A gate on this event loop (tests, the screenshot generator): calls go straight to it."""

    def __init__(self, gate: ConsoleHost, *, read_only: bool = False, embedded: bool = True) -> None:
        self.gate = gate
        self.operator = gate.operator
        self.read_only = read_only
        self._seq = 0
        self._listeners: list[Callable[[AuditRecord], None]] = []
        self.info = GateInfo(
            gate_id=gate.gate_id,
            label=gate.label,
            listen=f"{gate.host}:{gate.port}",
            journal=gate.journal_path,
            operator=self.operator.name,
            origin=self.operator.origin,
            read_only=read_only,
            embedded=embedded,
            drain_grace_s=gate.drain_grace_s,
            where="in-process",
            pid=os.getpid(),
        )

    async def snapshot(self) -> GateSnapshot:
        snap = self.gate.snapshot(decisions_after=self._seq)
        self._seq = snap.decisions_seq
        return snap

    async def command(self, command: Command) -> list[ActionResult]:
        if self.read_only:
            raise CommandError("this console is read-only: the gate refuses its commands")
        return self.gate.control.execute(command, operator=self.operator, source="console")

    async def stop_gate(self, why: str) -> None:
        """Ask the gate to drain and stop (its serve loop decides; see serve_until_signalled)."""
        if self.gate.stop_requested is None:
            raise CommandError("this gate is not stopped from a console")
        self.gate.stop_requested(why)

    def subscribe(self, listener: Callable[[AuditRecord], None]) -> None:
        self._listeners.append(listener)
        self.gate.audit_listeners.append(listener)

    async def close(self) -> None:
        for listener in self._listeners:
            if listener in self.gate.audit_listeners:
                self.gate.audit_listeners.remove(listener)
        self._listeners.clear()


def not_a_socket(path: str) -> str | None:
    """What `path` is when it exists and is not a socket (a journal, a config file...), with
    what to pass instead; None when it is a socket or is not there."""
    import stat

    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    if stat.S_ISSOCK(mode):
        return None
    stem = os.path.splitext(path)[0]
    hint = (
        f"`--attach {stem}.sock`"
        if os.path.exists(stem + ".sock")
        else "the control socket the gate logged at start (`control socket PATH`)"
    )
    if stat.S_ISDIR(mode):
        return f"{path} is a directory, not a control socket: pass {hint}, or `--attach --config FILE`"
    try:
        with open(path, "rb") as f:
            head = f.read(64)
    except OSError:
        head = b""
    if head.startswith(b"SQLite format 3\0"):
        return (
            f"{path} is a journal (SQLite), not a control socket: pass {hint}, or `--attach --config FILE`; "
            f"to read the journal itself: `tokengate review --journal {path}`"
        )
    if path.endswith(".toml"):
        return f"{path} is a config file, not a control socket: pass `--attach --config {path}`"
    return f"{path} is a regular file, not a control socket: pass {hint}, or `--attach --config FILE`"


class SocketLink:
    """A gate in another process, through its control socket."""

    def __init__(self, path: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.path = path
        self._reader = reader
        self._writer = writer
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._listeners: list[Callable[[AuditRecord], None]] = []
        self._seq = 0
        self.lost = asyncio.Event()
        self._pump = asyncio.get_running_loop().create_task(self._read_loop(), name=f"tokengate-link:{path}")
        self.info: GateInfo  # set by connect()

    @classmethod
    async def connect(
        cls,
        path: str,
        *,
        read_only: bool = False,
        embedded: bool = False,
        environ: dict[str, str] | None = None,
        client: str = "console",
    ) -> SocketLink:
        """Attach to the gate listening on `path`; LinkLost when nothing answers there.

        `embedded`: this console started the gate (quitting it stops the gate). `client`: what
        the audit names as the commands' source ("console", or "cli" for a one-shot command)."""
        env = os.environ if environ is None else environ
        wrong = not_a_socket(path)
        if wrong:
            raise LinkLost(wrong)
        try:
            reader, writer = await asyncio.open_unix_connection(path, limit=MAX_LINE)
        except FileNotFoundError:
            raise LinkLost(f"{path}: no control socket here (is `tokengate serve` running with this config?)") from None
        except ConnectionRefusedError:
            raise LinkLost(f"{path}: nothing listens on this control socket (a stale file: the gate is not running)") from None
        except PermissionError:
            raise LinkLost(f"{path}: permission denied (the socket is mode 0600 for the gate's user, or 0660 for its group)") from None
        link = cls(path, reader, writer)
        try:
            reply = await link._request(
                {
                    "op": "hello",
                    "v": PROTOCOL_VERSION,
                    "read_only": read_only,
                    "origin": ssh_origin(env),
                    "sudo_user": env.get("SUDO_USER", ""),
                    "client": client,
                }
            )
            info = reply["info"]
            link.info = GateInfo(
                gate_id=info["gate_id"],
                label=info["label"],
                listen=info["listen"],
                journal=info["journal"],
                operator=info["operator"],
                origin=info["origin"],
                read_only=info["read_only"],
                embedded=embedded,
                drain_grace_s=float(info.get("drain_grace_s", 0)),
                where=path,
                pid=_peer_pid(writer),
            )
        except BaseException:
            await link.close()
            raise
        return link

    async def snapshot(self) -> GateSnapshot:
        reply = await self._request({"op": "snapshot", "after": self._seq})
        if reply.get("v") != SNAPSHOT_VERSION:
            raise LinkLost(
                f"the gate sends snapshot version {reply.get('v')!r}; this console reads {SNAPSHOT_VERSION}: upgrade one of them"
            )
        try:
            snap = decode(GateSnapshot, reply["snapshot"])
        except (WireError, KeyError, TypeError) as exc:
            raise LinkLost(f"the gate sent a snapshot this console cannot read: {exc}") from None
        self._seq = snap.decisions_seq
        return snap

    async def command(self, command: Command) -> list[ActionResult]:
        reply = await self._request({"op": "command", "command": to_wire(command)}, answer_within_s=ANSWER_WAIT_S)
        return [decode(ActionResult, r) for r in reply["results"]]

    async def stop_gate(self, why: str) -> None:
        """Ask the gate to drain and stop (only the process that started it may)."""
        await self._request({"op": "stop", "why": why})

    def subscribe(self, listener: Callable[[AuditRecord], None]) -> None:
        first = not self._listeners
        self._listeners.append(listener)
        if first:
            asyncio.get_running_loop().create_task(self._request({"op": "subscribe"}))

    async def close(self) -> None:
        self._pump.cancel()
        self._writer.close()
        try:
            await self._writer.wait_closed()
        except (ConnectionError, OSError):
            pass
        self._fail_pending()

    # ---- plumbing ----------------------------------------------------------------

    async def _request(self, body: dict[str, Any], answer_within_s: float | None = None) -> dict[str, Any]:
        if self.lost.is_set():
            raise LinkLost(f"{self.path}: the gate closed the connection (it stopped or restarted)")
        rid = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[rid] = future
        try:
            self._writer.write(json.dumps({"id": rid, **body}).encode() + b"\n")
            await self._writer.drain()
        except (ConnectionError, OSError) as exc:
            self._pending.pop(rid, None)
            raise LinkLost(f"{self.path}: {exc}") from None
        try:
            reply = await asyncio.wait_for(future, answer_within_s)
        except TimeoutError:
            self._pending.pop(rid, None)  # a late answer finds no one waiting, and is dropped
            raise NoAnswer(
                f"no answer from the gate within {answer_within_s:.0f} s (is its process stopped or stuck?): the command was "
                "sent and may still take effect when the gate answers; its audit will say (tokengate log --kind audit)"
            ) from None
        if not reply.get("ok"):
            raise CommandError(str(reply.get("error") or "refused"))
        return reply

    async def _read_loop(self) -> None:
        try:
            while True:
                line = await self._reader.readline()
                if not line:
                    break
                try:
                    message = json.loads(line)
                except ValueError:
                    continue
                if "event" in message:
                    self._event(message)
                    continue
                future = self._pending.pop(message.get("id"), None)
                if future is not None and not future.done():
                    future.set_result(message)
        except (ConnectionError, OSError, ValueError):
            pass
        finally:
            self.lost.set()
            self._fail_pending()

    def _event(self, message: dict[str, Any]) -> None:
        if message.get("event") != "audit":
            return
        try:
            record = decode(AuditRecord, message.get("record"))
        except WireError:
            return
        for listener in self._listeners:
            listener(record)

    def _fail_pending(self) -> None:
        for future in self._pending.values():
            if not future.done():
                future.set_exception(LinkLost(f"{self.path}: the gate closed the connection (it stopped or restarted)"))
        self._pending.clear()
