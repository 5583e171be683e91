"""What llama.cpp's server test suite runs as ``llama-server`` (its ``LLAMA_SERVER_BIN_PATH``).

    python -m tests.conformance.shim straight|gate [llama-server flags...]

The suite starts "llama-server" with its own flags and talks to ``--host``/``--port``. Both
modes swap the suite's Hugging Face models (nothing can be downloaded in CI) for the project's
generated tiny model (tests/llama/make_model.py); ``$CONFORMANCE_MODEL`` names its file.

* ``straight``: the real llama-server with the suite's flags, on the suite's address.
* ``gate``: the real llama-server on a free loopback port, and ``tokengate serve`` in front of it
  on the suite's address, with a config generated from the suite's flags: open mode, or, when the
  suite gives ``--api-key K``, one operator tenant whose key is K (the gate authenticates as
  llama-server would, and sends K upstream); the class's ``default_max_tokens`` is llama-server's
  own default limit (``--n-predict``) when given, else a quarter of one slot's context, so a
  request without a limit fits as it does straight (what an operator sizing the gate would set).

Signals: SIGTERM/SIGINT stop the gate and llama-server (both at once), then the shim exits with
0. Both children also get SIGKILL from the kernel if the shim dies first (PR_SET_PDEATHSIG), so a
suite that SIGKILLs a slow shim leaves no orphan. If llama-server exits on its own (bad flags, no
model), the shim exits with its code, as llama-server would.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]

#: the suite's model flags, dropped (with their value) for the tiny model's --model
_HF_FLAGS = {"--hf-repo", "-hf", "-hfr", "--hf-file", "-hff", "--model-url", "-mu", "--hf-repo-draft", "-hfd"}
#: Hugging Face repos whose GGUF declares mean pooling: the stand-in gets --pooling mean for them
_MEAN_POOLING = ("bert-bge-small",)
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child before exec: the kernel kills it when the shim goes (any way, SIGKILL too)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _flag(args: list[str], *names: str) -> str | None:
    for i, a in enumerate(args):
        if a in names and i + 1 < len(args):
            return args[i + 1]
    return None


def rewrite_model(args: list[str], model: str) -> list[str]:
    """The suite's flags with its Hugging Face model swapped for ``model``."""
    out: list[str] = []
    hf: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        if a in _HF_FLAGS and i + 1 < len(args):
            hf.append(args[i + 1])
            i += 2
            continue
        if a == "--offline":  # nothing to download any more
            i += 1
            continue
        out.append(a)
        i += 1
    if hf and _flag(args, "--model", "-m") is None:
        out += ["--model", model]
        if any(name in repo for repo in hf for name in _MEAN_POOLING) and _flag(args, "--pooling") is None:
            out += ["--pooling", "mean"]
    return out


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _int_flag(args: list[str], *names: str) -> int | None:
    value = _flag(args, *names)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def default_max_tokens(args: list[str]) -> int:
    """llama-server's own default limit when given, else a quarter of one slot's context."""
    n_predict = _int_flag(args, "--n-predict", "-n")
    ctx = _int_flag(args, "--ctx-size", "-c") or 4096
    slots = _int_flag(args, "--parallel", "-np") or 1
    unified = "--kv-unified" in args or "-kvu" in args
    per_slot = ctx if unified else max(1, ctx // slots)
    if n_predict is not None and 0 < n_predict < per_slot:
        return n_predict
    return max(1, per_slot // 4)


def gate_config(args: list[str], backend_port: int, workdir: Path) -> tuple[str, dict[str, str]]:
    """The generated tokengate config for these suite flags, and the environment it reads."""
    host = _flag(args, "--host") or "127.0.0.1"
    port = _flag(args, "--port") or "8080"
    hosts = [h.strip() for h in host.split(",") if h.strip()]
    listen = ", ".join(f'"[{h}]:{port}"' if ":" in h else f'"{h}:{port}"' for h in hosts)
    api_key = _flag(args, "--api-key")
    env: dict[str, str] = {}
    lines = [
        'default_class = "interactive"',
        "[gate]",
        f"listen = [{listen}]",
        f'journal = "{workdir / "journal.db"}"',
        f'control_socket = "{workdir / "control.sock"}"',
        "[budget]",
        'mode = "static"',
        "min_tokens = 1",
        "[classes.interactive]",
        "priority = 10",
        "queue_depth = 256",
        "queue_timeout_s = 120",
        f"default_max_tokens = {default_max_tokens(args)}",
        "max_tokens_cap = 1048576",
        "[[backends]]",
        'name = "llama"',
        f'url = "http://127.0.0.1:{backend_port}"',
    ]
    if api_key is not None:
        env["CONFORMANCE_API_KEY"] = api_key.split(",")[0]
        lines.append('api_key_env = "CONFORMANCE_API_KEY"')
        lines += ["[[tenants]]", 'name = "suite"', 'api_key_env = "CONFORMANCE_API_KEY"', "operator = true"]
    return "\n".join(lines) + "\n", env


def _wait_listening(port: int, proc: subprocess.Popen[bytes], timeout_s: float = 120.0) -> bool:
    """True once llama-server answers HTTP on `port` (any status: it may still be loading)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=1.0)
            return True
        except httpx.HTTPError:
            time.sleep(0.02)
    return False


class Shim:
    def __init__(self) -> None:
        self.children: list[subprocess.Popen[bytes]] = []
        self.stopping = False
        self.workdir: Path | None = None  # the generated config and the gate's journal

    def spawn(self, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(argv, env=env, preexec_fn=_die_with_parent)
        self.children.append(proc)
        return proc

    def stop(self, *_: object) -> None:
        """On SIGTERM/SIGINT: both children down, then exit 0."""
        self.terminate_all()
        sys.exit(0)

    def terminate_all(self) -> None:
        """Both children at once (the suite is done with the server: nothing to drain for), each
        killed after 2 s, so the suite's 5 s wait holds; then the generated config and journal go."""
        if self.stopping:
            return
        self.stopping = True
        running = [proc for proc in self.children if proc.poll() is None]
        for proc in running:
            proc.terminate()
        deadline = time.monotonic() + 2.0
        for proc in running:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def run(self, mode: str, args: list[str]) -> int:
        signal.signal(signal.SIGTERM, self.stop)
        signal.signal(signal.SIGINT, self.stop)
        # The suite never stops a server whose start timed out; when the suite goes, so does this.
        parent = os.getppid()
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the parent went before the line above
            return 0
        llama = os.environ["LLAMA_SERVER_BIN"]
        model = os.environ["CONFORMANCE_MODEL"]
        args = rewrite_model(args, model)
        env = dict(os.environ)
        if mode == "straight":
            os.execv(llama, [llama, *args])  # llama-server itself, as the suite would run it
        backend_port = _free_port()
        backend_args = list(args)
        for name in ("--port", "--host"):
            while name in backend_args:
                i = backend_args.index(name)
                del backend_args[i : i + 2]
        backend_args += ["--host", "127.0.0.1", "--port", str(backend_port)]
        if env.get("AIP_MODE") == "PREDICTION":  # Google Cloud mode listens on AIP_HTTP_PORT
            env["AIP_HTTP_PORT"] = str(backend_port)
        llama_proc = self.spawn([llama, *backend_args], env)
        if not _wait_listening(backend_port, llama_proc):
            if llama_proc.poll() is None:
                llama_proc.kill()
            return llama_proc.wait() or 1
        workdir = self.workdir = Path(tempfile.mkdtemp(prefix="tokengate-shim-"))
        config, extra = gate_config(args, backend_port, workdir)
        (workdir / "gate.toml").write_text(config)
        gate_env = {**env, **extra}
        gate_env.pop("AIP_MODE", None)
        tokengate = str(Path(sys.executable).parent / "tokengate")
        gate_proc = self.spawn(
            [tokengate, "serve", "--config", str(workdir / "gate.toml"), "--grace", "1", "--log-level", "warning"], gate_env
        )
        while True:  # either child ending ends the pair
            for proc in (llama_proc, gate_proc):
                code = proc.poll()
                if code is not None:
                    self.terminate_all()
                    return code or 1
            time.sleep(0.1)


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in ("straight", "gate"):
        print("usage: python -m tests.conformance.shim straight|gate [llama-server flags...]", file=sys.stderr)
        return 2
    return Shim().run(sys.argv[1], sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
