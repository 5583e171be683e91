"""Start and stop a real llama-server for tests and benchmarks (no pytest here).

    bin = find_llama_server()                    # $LLAMA_SERVER_BIN or the cached build
    with LlamaServer(bin, model, mode="split", ctx=2048) as srv:
        httpx.get(srv.url + "/props")

Modes (llama.cpp 0c1e570):

* ``split``: ``-np 4``: 4 slots, each with its own ``ctx / 4`` of KV cache.
* ``unified``: ``-np 4 -kvu``: 4 slots sharing one pool of ``ctx`` tokens;
  every slot reports the full ``ctx`` as its ``n_ctx``.  (Same as the default
  ``-np auto``, but explicit about the slot count.)

``/props`` does not say which mode is on; ``n_ctx`` per slot is the only sign
over HTTP.  The log line ``initializing, n_slots = 4, n_ctx_slot = N,
kv_unified = 'true'`` says it; :attr:`LlamaServer.kv_unified` reads it.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = Path(__file__).resolve().parent / "build_llama_server.sh"

MODES = ("split", "unified")


class LlamaServerError(RuntimeError):
    """The server could not be built, or did not come up."""


def find_llama_server(*, build_timeout: float = 1800) -> Path:
    """``$LLAMA_SERVER_BIN`` if set, else the path the build script prints last.

    The build script reuses its cached binary (instant) or builds one (~9 min
    cold on 2 cores).  Raises :class:`LlamaServerError` on any failure.
    """
    env_bin = os.environ.get("LLAMA_SERVER_BIN")
    if env_bin:
        path = Path(env_bin)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise LlamaServerError(f"LLAMA_SERVER_BIN={env_bin} is not an executable file")
        return path
    try:
        proc = subprocess.run(
            ["bash", str(BUILD_SCRIPT)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            timeout=build_timeout,
        )
    except subprocess.TimeoutExpired as exc:
        raise LlamaServerError(f"{BUILD_SCRIPT.name} ran past {build_timeout:.0f}s") from exc
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise LlamaServerError(f"{BUILD_SCRIPT.name} failed (exit {proc.returncode}):\n{_tail(proc.stderr)}")
    path = Path(lines[-1])
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise LlamaServerError(f"{BUILD_SCRIPT.name} printed {path}, which is not an executable file")
    return path


def free_port() -> int:
    """A loopback port the kernel just handed out (bind to port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


class LlamaServer:
    """One llama-server subprocess on 127.0.0.1.

    Attributes once started: ``url``, ``port``, ``mode``, ``ctx`` (the total
    ``-c``), ``n_ctx`` (per slot, as the server reports it in ``/props``),
    ``n_slots``, ``log_path`` (stdout + stderr), ``startup_s``, ``kv_unified``
    (from the log).
    """

    def __init__(
        self,
        binary: str | os.PathLike,
        model: str | os.PathLike,
        *,
        mode: str = "unified",
        ctx: int = 2048,
        n_slots: int = 4,
        threads: int = 2,
        extra_args: tuple[str, ...] = (),
        log_path: str | os.PathLike | None = None,
        startup_timeout: float = 60.0,
        port: int | None = None,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
        self.binary = Path(binary)
        self.model = Path(model)
        self.mode = mode
        self.ctx = ctx
        self.n_slots = n_slots
        self.threads = threads
        self.extra_args = tuple(extra_args)
        self.startup_timeout = startup_timeout
        self.log_path = Path(log_path) if log_path else None
        self.port: int | None = None
        self._fixed_port = port  # a restart on the port a gate already points at
        self.n_ctx: int | None = None
        self.startup_s: float | None = None
        self._proc: subprocess.Popen | None = None
        self._log = None

    @property
    def url(self) -> str:
        if self.port is None:
            raise LlamaServerError("server not started")
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        args = [
            str(self.binary),
            "-m",
            str(self.model),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--metrics",
            "-t",
            str(self.threads),
            "-c",
            str(self.ctx),
            "-np",
            str(self.n_slots),
        ]
        if self.mode == "unified":
            args.append("-kvu")
        return args + list(self.extra_args)

    def log_text(self) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")

    def start(self) -> LlamaServer:
        if self._proc is not None:
            raise LlamaServerError("already started")
        if self.log_path is None:
            fd, name = tempfile.mkstemp(prefix=f"llama-server-{self.mode}-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
        started = time.monotonic()
        # The port can be taken between free_port() and the server's bind; retry once.
        for attempt in range(2):
            self.port = self._fixed_port or free_port()
            self._log = open(self.log_path, "ab")
            # LLAMA_ARG_* variables would change the server's settings behind our back.
            env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_ARG_")}
            self._proc = subprocess.Popen(
                self.command(),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C in the test runner does not reach it twice
            )
            try:
                self._wait_healthy(started)
                break
            except LlamaServerError:
                port_clash = self._proc.poll() is not None and "couldn't bind" in self.log_text()
                self.stop()
                if not (port_clash and attempt == 0):
                    raise
        self.startup_s = time.monotonic() - started
        args = self.extra_args
        key = args[args.index("--api-key") + 1] if "--api-key" in args[:-1] else None  # /props needs it then
        props = httpx.get(self.url + "/props", timeout=10, headers={"Authorization": f"Bearer {key}"} if key else None).json()
        self.n_ctx = props["default_generation_settings"]["n_ctx"]
        return self

    def _wait_healthy(self, started: float) -> None:
        deadline = started + self.startup_timeout
        with httpx.Client(timeout=2) as client:
            while True:
                code = self._proc.poll()
                if code is not None:
                    raise LlamaServerError(
                        f"llama-server exited with {code} before it was healthy; "
                        f"command: {' '.join(self.command())}\nlog {self.log_path}:\n{_tail(self.log_text())}"
                    )
                try:
                    if client.get(self.url + "/health").status_code == 200:
                        return
                except httpx.TransportError:
                    pass  # not listening yet
                if time.monotonic() > deadline:
                    raise LlamaServerError(
                        f"llama-server not healthy after {self.startup_timeout:.0f}s; log {self.log_path}:\n{_tail(self.log_text())}"
                    )
                time.sleep(0.05)  # polling a subprocess that offers no readiness signal

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout``; returns the exit status."""
        proc, self._proc = self._proc, None
        code = None
        if proc is not None:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            code = proc.returncode
        if self._log is not None:
            self._log.close()
            self._log = None
        return code

    @property
    def kv_unified(self) -> bool | None:
        """Whether the server logged ``kv_unified = 'true'`` (None: line not found)."""
        m = re.search(r"n_ctx_slot = \d+, kv_unified = '(true|false)'", self.log_text())
        return None if m is None else m.group(1) == "true"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def __enter__(self) -> LlamaServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"LlamaServer(mode={self.mode}, url={self.url if self.port else None}, n_ctx={self.n_ctx})"


class LlamaRouter(LlamaServer):
    """llama-server in router mode: no ``-m``; the models of ``models_dir`` (named by file
    stem) or of a ``preset`` INI file, each loaded on demand into a child process.

    ``-c``/``-np``/``-t`` are passed on to every child and win over a preset's values
    (``ctx=None`` / ``n_slots=None`` leave them to the preset). ``models_max``:
    ``--models-max`` (None: llama-server's default, 4).
    ``children()`` maps each running child's model name to its pid.
    """

    def __init__(
        self,
        binary: str | os.PathLike,
        *,
        models_dir: str | os.PathLike | None = None,
        preset: str | os.PathLike | None = None,
        models_max: int | None = None,
        ctx: int | None = 2048,
        n_slots: int | None = 2,
        threads: int = 2,
        extra_args: tuple[str, ...] = (),
        log_path: str | os.PathLike | None = None,
        startup_timeout: float = 60.0,
    ) -> None:
        if (models_dir is None) == (preset is None):
            raise ValueError("give models_dir or preset")
        super().__init__(
            binary,
            models_dir or preset,
            mode="split",
            ctx=ctx or 0,
            n_slots=n_slots or 0,
            threads=threads,  # type: ignore[arg-type]
            extra_args=extra_args,
            log_path=log_path,
            startup_timeout=startup_timeout,
        )
        self.models_dir = None if models_dir is None else Path(models_dir)
        self.preset = None if preset is None else Path(preset)
        self.models_max = models_max

    def command(self) -> list[str]:
        source = ["--models-dir", str(self.models_dir)] if self.models_dir else ["--models-preset", str(self.preset)]
        args = [
            str(self.binary),
            *source,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--metrics",
            "-t",
            str(self.threads),
        ]
        if self.ctx:
            args += ["-c", str(self.ctx)]
        if self.n_slots:
            args += ["-np", str(self.n_slots)]
        if self.models_max is not None:
            args += ["--models-max", str(self.models_max)]
        return args + list(self.extra_args)

    def children(self) -> dict[str, int]:
        """{model: pid} of the router's running child processes (from /proc)."""
        found: dict[str, int] = {}
        if self.pid is None:
            return found
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid == self.pid and b"--alias" in argv:
                found[argv[argv.index(b"--alias") + 1].decode()] = int(entry.name)
        return found
