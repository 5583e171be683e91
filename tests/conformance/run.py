"""llama.cpp's own server test suite, straight against llama-server and through the gate, compared.

    python -m tests.conformance.run [--gate-runs passed|all] [--json FILE] [--keep] [-- PYTEST_ARGS]

(``make conformance`` runs it.) The suite is ``tools/server/tests`` of the llama.cpp vendored in
the llama-cpp-python sdist the project builds llama-server from (the sdist is cached by
tests/llama/build_llama_server.sh; fetched with pip the same way when missing). Each run gets its
own copy of the suite, its own port, and ``LLAMA_SERVER_BIN_PATH`` pointing at
tests/conformance/shim.py (straight: the real llama-server; gate: llama-server behind ``tokengate
serve``), with the suite's Hugging Face models swapped for the generated tiny model. The straight
run goes first, then the gate run over the tests that passed straight (``--gate-runs all``: both
side by side over every test).

Tests that assert a specific model's text fail both ways: only the difference counts. The run
fails (exit 1) on any test that passes straight and fails through the gate unless
tests/conformance/differences.toml lists it with its reason; a listed difference that no longer
differs is reported (stale) but does not fail. It prints the counts and the differences; ``--json``
writes them too.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
DIFFERENCES = HERE / "differences.toml"
VERSION = os.environ.get("LLAMA_CPP_PYTHON_VERSION", "0.3.36")
SUITE_IN_SDIST = f"llama_cpp_python-{VERSION}/vendor/llama.cpp/tools/server/tests/"
#: per test; the suite's own longest non-slow tests take ~30 s on 2 busy cores
TEST_TIMEOUT_S = 180


def cache_root() -> Path:
    base = os.environ.get("TOKENGATE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tokengate"
    )
    return Path(base)


def sdist() -> Path:
    """The cached sdist (build_llama_server.sh keeps it); fetched with pip when missing."""
    src = cache_root() / "src"
    path = src / f"llama_cpp_python-{VERSION}.tar.gz"
    if not path.is_file():
        src.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "--no-binary",
                ":all:",
                f"llama-cpp-python=={VERSION}",
                "-d",
                str(src),
            ],
            check=True,
        )
    return path


def extract_suite(archive: Path, dest: Path) -> Path:
    """``tools/server/tests`` of the sdist, copied into ``dest``."""
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(SUITE_IN_SDIST) and (m.isfile() or m.isdir())]
        for m in members:
            m.name = m.name[len(SUITE_IN_SDIST) :]
            if m.name:
                tar.extract(m, dest, filter="data")
    return dest


def llama_server_bin() -> str:
    given = os.environ.get("LLAMA_SERVER_BIN")
    if given:
        return given
    out = subprocess.run(["bash", str(REPO / "tests/llama/build_llama_server.sh")], check=True, stdout=subprocess.PIPE, text=True)
    return out.stdout.strip().splitlines()[-1]


def free_port_block() -> int:
    """A loopback port the kernel just handed out (the suite adds nothing to it without xdist)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Run:
    mode: str
    dir: Path
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    seconds: float = 0.0

    @property
    def junit(self) -> Path:
        return self.dir / "junit.xml"

    @property
    def log(self) -> Path:
        return self.dir / "pytest.log"


def start(run: Run, archive: Path, model: Path, llama: str, pytest_args: list[str], only: Path | None = None) -> None:
    suite = extract_suite(archive, run.dir / "suite")
    shim = run.dir / "llama-server"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{HERE / "shim.py"}" {run.mode} "$@"\n')
    shim.chmod(0o755)
    env = {
        **os.environ,
        "LLAMA_SERVER_BIN_PATH": str(shim),
        "LLAMA_SERVER_BIN": llama,
        "CONFORMANCE_MODEL": str(model),
        "PORT": str(free_port_block()),
        "TMPDIR": str(run.dir),
    }
    env.pop("DEBUG", None)
    if only is not None:  # the plugin deselects every test not listed there
        env["CONFORMANCE_ONLY"] = str(only)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), env.get("PYTHONPATH", "")) if p)
    argv = [
        sys.executable,
        "-m",
        "pytest",
        "unit",
        "-p",
        "no:cacheprovider",
        "-q",
        "-m",
        "not slow",
        f"--timeout={TEST_TIMEOUT_S}",
        f"--junitxml={run.junit}",
        *(["-p", "only_plugin"] if only is not None else []),
        *pytest_args,
    ]
    run.started = time.monotonic()
    with run.log.open("wb") as log:
        run.proc = subprocess.Popen(argv, cwd=suite, env=env, stdout=log, stderr=subprocess.STDOUT)


def wait(run: Run) -> None:
    assert run.proc is not None
    run.proc.wait()
    run.seconds = time.monotonic() - run.started


def outcomes(junit: Path) -> dict[str, str]:
    """test id -> passed | failed | skipped, from pytest's JUnit XML."""
    result: dict[str, str] = {}
    if not junit.is_file():
        return result
    for case in ET.parse(junit).getroot().iter("testcase"):
        module = case.get("classname", "").replace(".", "/")
        name = f"{module}.py::{case.get('name', '')}"
        state = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                state = "failed"
            elif child.tag == "skipped":
                state = "skipped"
        result[name] = state
    return result


def load_differences(path: Path = DIFFERENCES) -> dict[str, str]:
    """test id -> the documented reason it passes straight and not through the gate."""
    data = tomllib.loads(path.read_text()) if path.is_file() else {}
    out: dict[str, str] = {}
    for entry in data.get("difference", []):
        out[entry["test"]] = entry["reason"]
    return out


def compare(straight: dict[str, str], gate: dict[str, str], documented: dict[str, str]) -> dict[str, object]:
    passed_straight = sorted(t for t, s in straight.items() if s == "passed")
    passed_gate = sorted(t for t, s in gate.items() if s == "passed")
    lost = [t for t in passed_straight if gate.get(t) != "passed"]
    return {
        "tests": len(straight),
        "passed_straight": len(passed_straight),
        "passed_gate": len(passed_gate),
        "documented": {t: documented[t] for t in lost if t in documented},
        "undocumented": [t for t in lost if t not in documented],
        "stale": sorted(t for t in documented if t in straight and t not in lost),  # ran, and no longer differs
        "gained": sorted(t for t in passed_gate if straight.get(t) != "passed"),
    }


def report(result: dict[str, object], seconds: dict[str, float]) -> str:
    documented = result["documented"]
    undocumented = result["undocumented"]
    stale = result["stale"]
    assert isinstance(documented, dict) and isinstance(undocumented, list) and isinstance(stale, list)
    lines = [
        f"conformance: {result['tests']} tests; passed straight {result['passed_straight']}, "
        f"through the gate {result['passed_gate']}; differences {len(documented) + len(undocumented)} "
        f"({len(documented)} documented, {len(undocumented)} not)",
        "conformance: run time " + ", ".join(f"{k} {v:.0f}s" for k, v in seconds.items()),
    ]
    for test, reason in documented.items():
        lines.append(f"  documented  {test}: {reason}")
    for test in undocumented:
        lines.append(f"  REGRESSION  {test}: passes straight, fails through the gate")
    for test in stale:
        lines.append(f"  stale       {test}: listed in differences.toml but no longer differs")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--gate-runs",
        choices=("passed", "all"),
        default="passed",
        help="passed (default): the straight run first, then through the gate only the tests that passed straight "
        "(only those can differ; each gate start costs ~1.3 s more CPU than llama-server's alone); "
        "all: both runs side by side over every test (also shows tests that pass only through the gate)",
    )
    ap.add_argument("--json", help="also write the counts and differences here")
    ap.add_argument("--keep", action="store_true", help="keep the run directories (logs, JUnit XML) and print where")
    ap.add_argument("pytest_args", nargs="*", help="passed to both pytest runs (e.g. -k metrics)")
    args = ap.parse_args(argv)

    sys.path.insert(0, str(REPO))
    from tests.llama.make_model import cached_model

    archive = sdist()
    model = cached_model(size="fast")
    llama = llama_server_bin()
    root = Path(tempfile.mkdtemp(prefix="tokengate-conformance-"))
    runs = [Run("straight", root / "straight"), Run("gate", root / "gate")]
    for r in runs:
        r.dir.mkdir(parents=True)
    t0 = time.monotonic()
    try:
        if args.gate_runs == "all":
            for r in runs:
                start(r, archive, model, llama, args.pytest_args)
            for r in runs:
                wait(r)
        else:
            start(runs[0], archive, model, llama, args.pytest_args)
            wait(runs[0])
            passed = sorted(t for t, state in outcomes(runs[0].junit).items() if state == "passed")
            only = root / "passed-straight.txt"
            only.write_text("".join(t + "\n" for t in passed))
            start(runs[1], archive, model, llama, args.pytest_args, only=only)
            wait(runs[1])
        straight, gate = (outcomes(r.junit) for r in runs)
        if not straight:
            print(f"conformance: the straight run recorded no tests; see {runs[0].log}", file=sys.stderr)
            args.keep = True
            return 1
        result = compare(straight, gate, load_differences())
        seconds = {r.mode: r.seconds for r in runs} | {"total": time.monotonic() - t0}
        print(report(result, seconds))
        if args.json:
            Path(args.json).write_text(json.dumps({**result, "seconds": seconds}, indent=2) + "\n")
        if result["undocumented"]:
            args.keep = True
            return 1
        return 0
    finally:
        if args.keep:
            print(f"conformance: logs and JUnit XML kept in {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
