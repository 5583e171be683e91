"""The conformance shim (what llama.cpp's suite runs as llama-server) with the real llama-server:
the gate answers on the suite's port, a SIGTERM ends it with 0 and leaves no process behind, and a
SIGKILL of the shim (the suite's last resort) takes both children with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.conformance.shim import REPO
from tests.llama.server import free_port

pytestmark = pytest.mark.llama

SHIM = REPO / "tests/conformance/shim.py"


def children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[1]) == pid:
                out.append(int(entry.name))
    return out


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_gone(pids: list[int], timeout_s: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        left = [p for p in pids if alive(p)]
        if not left:
            return []
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


def start_shim(llama_bin: Path, tmp_path: Path) -> tuple[subprocess.Popen[bytes], int]:
    from tests.llama.make_model import cached_model

    port = free_port()
    env = {**os.environ, "LLAMA_SERVER_BIN": str(llama_bin), "CONFORMANCE_MODEL": str(cached_model("fast")), "TMPDIR": str(tmp_path)}
    args = ["--port", str(port), "--host", "127.0.0.1", "--hf-repo", "ggml-org/test-model-stories260K", "--ctx-size", "512"]
    args += ["--parallel", "2", "--n-predict", "8", "--no-slots"]
    proc = subprocess.Popen([sys.executable, str(SHIM), "gate", *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the shim exited with {proc.returncode}"
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc, port
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    proc.kill()
    pytest.fail("the gate did not answer /health 200 on the suite's port within 60 s")


def test_sigterm_stops_the_gate_and_llama_server_and_exits_0(llama_bin, tmp_path) -> None:
    proc, port = start_shim(llama_bin, tmp_path)
    kids = children(proc.pid)
    try:
        assert len(kids) == 2  # llama-server and tokengate serve
        r = httpx.post(f"http://127.0.0.1:{port}/completion", json={"prompt": "the cat", "n_predict": 2}, timeout=30)
        assert r.status_code == 200 and "x-tokengate-class" in r.headers  # answered through the gate
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=5) == 0  # the suite waits 5 s before it kills
        assert wait_gone(kids) == []
        assert not any(p.name.startswith("tokengate-shim-") for p in tmp_path.iterdir())  # its config and journal removed
    finally:
        proc.kill()
        for pid in kids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_killed_shim_leaves_no_orphan(llama_bin, tmp_path) -> None:
    proc, _ = start_shim(llama_bin, tmp_path)
    kids = children(proc.pid)
    try:
        assert len(kids) == 2
        proc.kill()
        proc.wait(timeout=5)
        assert wait_gone(kids) == []  # PR_SET_PDEATHSIG: the kernel kills both
    finally:
        for pid in kids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
