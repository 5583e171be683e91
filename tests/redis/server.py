"""Start, pause, stop and restart a real redis-server for tests and benchmarks (no pytest here).

    with RedisServer(tmp_dir) as srv:
        srv.url                      # redis://127.0.0.1:PORT/0 (with password=: redis://default:PW@...)
        srv.pause(); srv.resume()    # SIGSTOP / SIGCONT: a Redis that does not answer
        srv.stop(); srv.start()      # down, then back on the same port (empty: no persistence)

Like the llama-server fixture: a loopback port, a temporary directory, no persistence
(``--save '' --appendonly no``), readiness by PING. ``tests/redis/ensure_redis.sh``
installs the Debian package when ``redis-server`` is missing (``make test`` runs it).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from tests.llama.server import free_port


class RedisServerError(RuntimeError):
    """redis-server is missing, or did not come up."""


def find_redis_server() -> str:
    path = shutil.which("redis-server")
    if path is None:
        raise RedisServerError("redis-server is not installed; run tests/redis/ensure_redis.sh (make test does)")
    return path


def ping(port: int, timeout: float = 0.5, *, password: str | None = None) -> bool:
    """True when a Redis on 127.0.0.1:``port`` answers PING (after AUTH with ``password``)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            if password is not None:
                s.sendall(f"AUTH {password}\r\n".encode())
                if not s.recv(64).startswith(b"+OK"):
                    return False
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """One redis-server subprocess on 127.0.0.1; its port stays the same across restarts."""

    def __init__(
        self, workdir: str | os.PathLike, *, port: int | None = None, startup_timeout: float = 20.0, password: str | None = None
    ) -> None:
        #: requirepass: clients must AUTH with it (the default user's password)
        self.password = password
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.startup_timeout = startup_timeout
        self.log_path = self.workdir / "redis-server.log"
        self._proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        if self.password is not None:
            return f"redis://default:{self.password}@127.0.0.1:{self.port}/0"
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def command(self) -> list[str]:
        return [
            find_redis_server(),
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self.workdir),
            "--daemonize",
            "no",
            "--logfile",
            "",
            *(("--requirepass", self.password) if self.password is not None else ()),
        ]

    def start(self) -> RedisServer:
        if self._proc is not None:
            raise RedisServerError("already started")
        deadline = time.monotonic() + self.startup_timeout
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                self.command(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        while not ping(self.port, password=self.password):
            if self._proc.poll() is not None:
                code = self._proc.returncode
                self._proc = None
                raise RedisServerError(f"redis-server exited with {code}; log {self.log_path}:\n{self.log_text()}")
            if time.monotonic() > deadline:
                self.stop()
                raise RedisServerError(f"redis-server not answering PING after {self.startup_timeout:.0f}s")
            time.sleep(0.01)  # a subprocess with no readiness signal but PING
        return self

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM (SIGCONT first, in case it is paused), then SIGKILL after ``timeout``."""
        proc, self._proc = self._proc, None
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        return proc.returncode

    def pause(self) -> None:
        """SIGSTOP: connections stay open, nothing is answered (a slow or hung Redis)."""
        assert self._proc is not None
        self._proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self._proc is not None
        self._proc.send_signal(signal.SIGCONT)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
