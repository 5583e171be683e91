"""The gate's control socket: consoles attach here (`tokengate console --attach`).

A Unix stream socket, never TCP; mode 0600 (or 0660 with a configured group).
The protocol is one JSON object per line, in both directions:

    -> {"id": 1, "op": "hello", "v": 1, "read_only": false, "origin": "10.1.2.3"}
    <- {"id": 1, "ok": true, "info": {...}}          the gate, and who it takes you for
    -> {"id": 2, "op": "snapshot", "after": 1234}    decisions after sequence number 1234
    <- {"id": 2, "ok": true, "snapshot": {...}}      gate.snapshot.GateSnapshot, encoded
    -> {"id": 3, "op": "command", "command": {"v": 1, "op": "pause", "cls": "batch", "paused": true}}
    <- {"id": 3, "ok": true, "results": [...]}       or {"ok": false, "error": "..."}
    -> {"id": 4, "op": "subscribe"}
    <- {"event": "audit", "record": {...}}           every audit row from then on
    -> {"id": 5, "op": "stop", "why": "hang-up"}     drain and stop: only from the process that
                                                     started the gate (the embedded console)

The operator of a command is the peer's uid, read from the socket (SO_PEERCRED),
never what the client says; the client only adds its SSH origin. A session that
said read_only at hello is refused every command, whatever it sends later.

A console is a window, never a load: what the gate does for consoles is bounded per
second whatever the request rate, the number of consoles and how fast they read.
* Snapshots come from one SnapshotFeed (gate/ops/console_feed.py): built and encoded at
  most every 0.25 s and shared; a reply is the shared bytes plus the asker's new
  decisions. Each console is answered at most every SNAPSHOT_PACE_S.
* Nothing on the gate's own path waits for a console. A session's replies are written
  by that session's task, which reads its next request only once the last reply is on
  its way (a console that stops reading stops asking, and holds one reply); audit
  events go into a mailbox of the newest OUTBOX lines, written by the session's own
  pusher: a stopped console loses the oldest events, it never delays the gate nor
  grows its memory (at most one reply, one event and OUTBOX lines per console).
* The peer's user name is looked up in a thread (NSS may ask a directory server).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import grp
import json
import logging
import os
import pwd
import socket
import stat
import struct
import time
from typing import TYPE_CHECKING, Any

from gate import __version__
from gate.data.commands import CommandError, from_wire
from gate.data.records import AuditRecord, AuditSource
from gate.data.wire import encode
from gate.ops.console_feed import SnapshotFeed
from gate.ops.control import Operator

if TYPE_CHECKING:
    from gate.ops.ports import ConsoleHost

log = logging.getLogger("tokengate.control")

PROTOCOL_VERSION = 1
MAX_LINE = 64 * 1024  # commands are small; a longer line ends the session
OUTBOX = 256  # audit events kept for a console that reads slowly; older ones are dropped
#: the most often one console is sent a snapshot (its fastest refresh is 4 a second; a
#: refresh right after a command may come sooner). Asks in between wait, on its own task.
SNAPSHOT_PACE_S = 0.05


def can_give_to(gid: int) -> bool:
    """May this process chown a file it owns to group `gid`? Root may; anyone else only to a
    group it is in (chown(2))."""
    return os.geteuid() == 0 or gid == os.getegid() or gid in os.getgroups()


def _user_name() -> str:
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return f"uid {os.geteuid()}"


class SocketInUse(Exception):
    """The control socket's path is taken: a live gate answers there, or it is not a socket."""


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of a Unix socket."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", raw)


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def is_live(path: str) -> bool:
    """True when a gate answers on the control socket at `path`."""
    try:
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            return False
    except OSError:
        return False
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(path)
        return True
    except OSError:
        return False
    finally:
        probe.close()


def claim_path(path: str) -> None:
    """Make `path` free for a new socket: remove a stale one, refuse a live one or a non-socket."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise SocketInUse(f"{path}: exists and is not a socket; move it away or set [gate] control_socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(path)
    except (ConnectionRefusedError, FileNotFoundError):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # stale: its gate died without removing it
        log.info("control socket %s: removed a stale socket file", path)
        return
    except OSError as exc:
        raise SocketInUse(f"{path}: cannot tell whether a gate listens there: {exc}") from None
    finally:
        probe.close()
    raise SocketInUse(f"{path}: another gate is listening on this control socket; attach to it with `tokengate console --attach {path}`")


class _Session:
    __slots__ = (
        "operator",
        "read_only",
        "writer",
        "events",
        "missed",
        "wake",
        "pusher",
        "uid",
        "pid",
        "name",
        "next_snapshot_at",
        "source",
        "greeted",
        "attached_at",
    )

    def __init__(self, pid: int, uid: int, name: str, writer: asyncio.StreamWriter) -> None:
        self.pid = pid
        self.uid = uid
        self.name = name
        self.operator = Operator(name, "local")
        self.read_only = True  # until hello says otherwise
        self.greeted = False  # hello is said once: a read-only session stays read-only
        self.source: AuditSource = "console"  # the audit's source for its commands ("cli": a one-shot command)
        self.writer = writer
        #: audit lines not yet written (subscribed sessions only): the newest OUTBOX of them
        self.events: collections.deque[bytes] | None = None
        self.missed = 0  # events dropped because the console did not read them in time
        self.wake = asyncio.Event()
        self.pusher: asyncio.Task[None] | None = None
        self.next_snapshot_at = 0.0
        self.attached_at = time.monotonic()


class ControlServer:
    """Listens on the control socket and serves snapshots, commands and audit events."""

    def __init__(self, path: str, gate: ConsoleHost, *, group: str = "") -> None:
        self.path = path
        self.gate = gate
        self.group = group
        self._server: asyncio.AbstractServer | None = None
        self._gid: int | None = None
        self._open = False  # between start and close: the socket is kept bound
        self._rebind_error: str | None = None
        self._sessions: set[_Session] = set()
        self._handlers: set[asyncio.Task[Any]] = set()
        self.feed = SnapshotFeed(lambda after, n: gate.snapshot(decisions_after=after, max_decisions=n))

    def claim(self) -> None:
        claim_path(self.path)

    async def start(self) -> None:
        gid = None
        if self.group:
            try:
                gid = grp.getgrnam(self.group).gr_gid
            except KeyError:
                raise SocketInUse(f"[gate] control_socket_group: no group {self.group!r} on this host") from None
            if not can_give_to(gid):
                # the chown failed later with EPERM, said as "cannot be created (Operation not
                # permitted) ... set [gate] control_socket to a writable place": a trial followed the
                # service setup (the ops group made, its user not in it) and no console could attach
                user = _user_name()
                raise SocketInUse(
                    f"[gate] control_socket_group: this gate runs as {user}, which is not in group {self.group!r}, so it "
                    f"cannot give its control socket to that group: under systemd add SupplementaryGroups={self.group} "
                    f"to the unit (deploy/tokengate.service has it), else `usermod -aG {self.group} {user}`"
                )
        self._gid = gid
        self.claim()
        self._open = True
        try:
            self._server = await self._listen()
        except OSError as exc:
            # A read-only or missing directory (the socket's default place is beside the journal,
            # and a failing journal disk must not stop the gate): serve on without consoles, say
            # so naming the file, and bind it once it can be (housekeeping: rebind_if_gone).
            self._rebind_error = f"{exc.strerror or exc}"
            log.error(
                "control socket %s cannot be created (%s): serving without it, consoles cannot attach; "
                "retrying every second (or set [gate] control_socket to a writable place)",
                self.path,
                self._rebind_error,
            )
        self.gate.audit_listeners.append(self._on_audit)

    async def _listen(self) -> asyncio.AbstractServer:
        # Bound 0600 (no window in which others may connect), given its group and mode, and only
        # then listened on: once anyone can connect, the file already has the mode it keeps
        # (listening first let a console, or a test, connect and see 0600 before the chmod).
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        bound = False
        try:
            old_umask = os.umask(0o177)
            try:
                sock.bind(self.path)
                bound = True
            finally:
                os.umask(old_umask)
            if self._gid is not None:
                os.chown(self.path, -1, self._gid)
                os.chmod(self.path, 0o660)
            server = await asyncio.start_unix_server(self._serve, sock=sock, limit=MAX_LINE)
        except BaseException:
            sock.close()
            if bound:  # ours; a file that was there before is not
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.path)
            raise
        self._rebind_error = None
        return server

    async def rebind_if_gone(self) -> bool:
        """Listen again when the socket file was deleted under the running gate (a /tmp cleaner,
        a hand tidying up): without it no console can attach, and nothing said why. Sessions
        attached before go on. A file someone else put there is left alone. True: bound anew.
        Also binds a socket that could not be created at start."""
        if not self._open:
            return False
        try:
            os.lstat(self.path)
        except FileNotFoundError:
            pass
        except OSError:
            return False
        else:
            return False
        try:
            server = await self._listen()
        except OSError as exc:
            message = f"{exc.strerror or exc}"
            if message != self._rebind_error:  # once per cause, not once a second
                log.error("control socket %s was deleted and cannot be bound again (%s): consoles cannot attach", self.path, message)
            self._rebind_error = message
            return False
        if self._server is None:
            log.warning("control socket %s: listening (it could not be created before)", self.path)
        else:
            log.warning("control socket %s was deleted while the gate ran: listening there again", self.path)
            self._server.close()  # the unlinked one accepts nobody; its sessions go on
        self._server = server
        return True

    async def close(self) -> None:
        """Stop listening, end every session, remove the socket file."""
        self._open = False
        if self._on_audit in self.gate.audit_listeners:
            self.gate.audit_listeners.remove(self._on_audit)
        if self._server is None:
            return
        self._server.close()
        for session in tuple(self._sessions):
            self._drop(session)
        for task in tuple(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        self._server = None

    @property
    def opened(self) -> bool:
        """Between `start` and `close`: the gate means to listen (whether it can or not)."""
        return self._open

    @property
    def listening(self) -> bool:
        """Bound and accepting consoles (False while the socket could not be created)."""
        return self._server is not None

    @property
    def sessions(self) -> int:
        return len(self._sessions)

    # ---- one console -------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        sock = writer.get_extra_info("socket")
        try:
            pid, uid, _gid = peer_credentials(sock)
            name = await asyncio.to_thread(user_name, uid)
        except (OSError, asyncio.CancelledError):  # gone already, or the gate is closing
            writer.close()
            self._handlers.discard(task)
            return
        session = _Session(pid, uid, name, writer)
        self._sessions.add(session)
        loop = asyncio.get_running_loop()
        try:
            while True:
                try:
                    line = await reader.readline()
                except (ValueError, asyncio.LimitOverrunError):
                    await self._send(session, _line({"ok": False, "error": f"line longer than {MAX_LINE} bytes"}))
                    break
                if not line:
                    break
                request = _parse(line)
                if isinstance(request, dict) and request.get("op") == "snapshot":
                    wait = session.next_snapshot_at - loop.time()
                    if wait > 0:
                        await asyncio.sleep(wait)  # this console's task only; the gate goes on
                    session.next_snapshot_at = loop.time() + SNAPSHOT_PACE_S
                await self._send(session, self._handle(session, request))
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            # close() ends the sessions: end quietly, or asyncio's stream callback logs the
            # cancellation as an "Exception in callback" traceback at every stop.
            pass
        finally:
            self._drop(session)
            self._handlers.discard(task)

    def _handle(self, session: _Session, request: dict[str, Any] | str) -> bytes:
        """The reply line to one request (`request` is the error when the line was not an object)."""
        if isinstance(request, str):
            return _line({"ok": False, "error": request})
        rid = request.get("id")
        try:
            if request.get("op") == "snapshot":
                after = request.get("after", 0)
                return self.feed.reply(rid, after if isinstance(after, int) and not isinstance(after, bool) and after >= 0 else 0)
            body = self._dispatch(session, request)
        except CommandError as exc:
            body = {"ok": False, "error": str(exc)}
        except Exception as exc:  # noqa: BLE001 - a bad request must not end the gate's service
            log.exception("control socket: request %r failed", request.get("op"))
            body = {"ok": False, "error": f"internal error: {type(exc).__name__}"}
        return _line({"id": rid, **body})

    def _dispatch(self, session: _Session, request: dict[str, Any]) -> dict[str, Any]:
        op = request.get("op")
        gate = self.gate
        if op == "hello":
            if request.get("v") != PROTOCOL_VERSION:
                raise CommandError(f"protocol version {request.get('v')!r} is not {PROTOCOL_VERSION}: upgrade the console")
            if session.greeted:
                # A second hello with read_only false turned a read-only session into a full one.
                raise CommandError("hello was already said on this connection; connect again to change how you attach")
            session.greeted = True
            session.read_only = bool(request.get("read_only", False))
            session.source = "cli" if request.get("client") == "cli" else "console"
            origin = request.get("origin")
            name = session.name
            sudo = request.get("sudo_user")
            if session.uid == 0 and isinstance(sudo, str) and sudo and sudo != name:
                name = f"{sudo} (root)"  # sudo'd: the person, and the identity the kernel vouches for
            session.operator = Operator(name, origin if isinstance(origin, str) and origin else "local")
            # a console's coming and going is the gate log's to say (INFO); a one-shot command
            # (`tokengate status`, `overrides drop`) is said by its audit row when it changes
            # something, and read "console attached" at every poll of a script before 2026-12-07
            log.log(
                logging.INFO if session.source == "console" else logging.DEBUG,
                "%s attached: %s from %s%s",
                session.source,
                name,
                session.operator.origin,
                " (read-only)" if session.read_only else "",
            )
            return {"ok": True, "info": self._info(session)}
        if op == "command":
            if session.read_only:
                raise CommandError("this console attached read-only: the gate refuses its commands")
            results = gate.control.execute(from_wire(request.get("command")), operator=session.operator, source=session.source)
            self.feed.invalidate()  # the console's next snapshot shows what it just did
            return {"ok": True, "results": [encode(r) for r in results]}
        if op == "stop":
            if session.pid != os.getppid() or gate.stop_requested is None:
                raise CommandError("only the console that started this gate may stop it; use SIGTERM (systemctl stop)")
            why = request.get("why")
            gate.stop_requested(f"console: {why}" if isinstance(why, str) and why else "console quit")
            return {"ok": True}
        if op == "subscribe":
            if session.events is None:
                session.events = collections.deque(maxlen=OUTBOX)
                session.pusher = asyncio.get_running_loop().create_task(self._push(session))
            return {"ok": True}
        raise CommandError(f"unknown op {op!r}")

    def _info(self, session: _Session) -> dict[str, Any]:
        gate = self.gate
        return {
            "gate_id": gate.gate_id,
            "version": __version__,
            "label": gate.label,
            "listen": f"{gate.host}:{gate.port}",
            "journal": gate.journal_path if gate.journal_path == ":memory:" else os.path.abspath(gate.journal_path),
            "operator": session.operator.name,
            "origin": session.operator.origin,
            "read_only": session.read_only,
            "classes": list(gate.config.class_names),
            "drain_grace_s": gate.drain_grace_s,
        }

    def _on_audit(self, record: AuditRecord) -> None:
        """Called on the gate's path (a command, the controller): never waits for a console."""
        self.feed.invalidate()  # a change: consoles see it at their next ask
        if not self._sessions:
            return
        line = _line({"event": "audit", "record": encode(record)})
        for session in self._sessions:
            events = session.events
            if events is None:
                continue
            if len(events) == OUTBOX:
                session.missed += 1  # the oldest goes: the snapshot's last 50 audit rows still show it
                if session.missed == 1:
                    log.warning("control socket: %s reads too slowly; dropping its oldest audit events", session.operator.name)
            events.append(line)
            session.wake.set()

    async def _push(self, session: _Session) -> None:
        """The session's audit events, written as fast as the console reads them."""
        assert session.events is not None
        events = session.events
        with contextlib.suppress(ConnectionError, asyncio.CancelledError):
            while True:
                await session.wake.wait()
                session.wake.clear()
                while events:
                    session.writer.write(events.popleft())
                    await session.writer.drain()

    async def _send(self, session: _Session, line: bytes) -> None:
        session.writer.write(line)
        await session.writer.drain()  # this console's task: a console that does not read stops here

    def _drop(self, session: _Session) -> None:
        if session not in self._sessions:
            return
        self._sessions.discard(session)
        if session.greeted:
            log.log(
                logging.INFO if session.source == "console" else logging.DEBUG,
                "%s detached: %s from %s after %s",
                session.source,
                session.operator.name,
                session.operator.origin,
                _held(time.monotonic() - session.attached_at),
            )
        if session.pusher is not None:
            session.pusher.cancel()
        session.writer.close()


def _held(seconds: float) -> str:
    """How long a session was attached: 0.4 s, 12 s, 3 min 5 s, 2 h 4 min."""
    if seconds < 10:
        return f"{seconds:.1f} s"
    s = int(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60} min"


def _parse(line: bytes) -> dict[str, Any] | str:
    """A request object, or what is wrong with the line."""
    try:
        request = json.loads(line)
    except ValueError:
        return "not JSON"
    if not isinstance(request, dict):
        return "a request must be an object"
    return request


def _line(body: dict[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode() + b"\n"
