"""llama.cpp's own server test suite, straight against llama-server and through the gate, compared.

    python -m tests.conformance.run [--gate-runs passed|all] [--json FILE] [--keep] [-- PYTEST_ARGS]
    python -m tests.conformance.run --baseline [-- PYTEST_ARGS]      # CI: the gate side only
    python -m tests.conformance.run --write-baseline                 # refresh tests/conformance/baseline.json

(``make conformance`` runs the first, ``make conformance-ci`` the second, which .ci/run calls.) The suite is ``tools/server/tests`` of the llama.cpp vendored in
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

**Baseline** (CI's budget: the straight run alone takes 400-540 s on 2 cores): the straight
outcomes are stored in tests/conformance/baseline.json, under a key of what decides them: the
llama.cpp version, a hash of the suite's files, the model file, and a hash of the shim.
``--baseline`` runs only the gate side, over the tests that passed straight there, and compares
as above; a key that does not match what this checkout would run (a llama.cpp upgrade, an edited
shim, another model) is an error that names the refresh command, ``--write-baseline`` (a straight
run of the whole suite; commit the file it writes).
"""

from __future__ import annotations

import argparse
import hashlib
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
BASELINE = HERE / "baseline.json"
REFRESH = "python -m tests.conformance.run --write-baseline"
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


def suite_hash(archive: Path) -> str:
    """sha256 over the suite's files in the sdist (names and contents, in name order)."""
    digest = hashlib.sha256()
    with tarfile.open(archive) as tar:
        members = sorted((m for m in tar.getmembers() if m.name.startswith(SUITE_IN_SDIST) and m.isfile()), key=lambda m: m.name)
        for m in members:
            f = tar.extractfile(m)
            assert f is not None
            digest.update(m.name[len(SUITE_IN_SDIST) :].encode() + b"\0" + f.read() + b"\0")
    return digest.hexdigest()


def baseline_key(archive: Path, model: Path) -> dict[str, str]:
    """What decides the straight outcomes (the baseline is valid for these only)."""
    return {
        "llama_cpp_python": VERSION,
        "suite_sha256": suite_hash(archive),
        "model": model.name,  # tests/llama/make_model.py names the file by its parameters' hash
        "shim_sha256": hashlib.sha256((HERE / "shim.py").read_bytes()).hexdigest(),
    }


class BaselineMismatch(Exception):
    """The stored baseline was measured for another llama.cpp, suite, model or shim."""


def load_baseline(key: dict[str, str], path: Path = BASELINE) -> dict[str, str]:
    """The stored straight outcomes (test id -> state), or BaselineMismatch saying what differs."""
    if not path.is_file():
        raise BaselineMismatch(f"no baseline at {path}; write it with: {REFRESH}")
    data = json.loads(path.read_text())
    stored = data.get("key", {})
    changed = [f"{k}: stored {stored.get(k)!r}, now {v!r}" for k, v in key.items() if stored.get(k) != v]
    if changed:
        raise BaselineMismatch(
            f"{path.name} was measured for another setup ({'; '.join(changed)}); re-measure it with: {REFRESH} (and commit it)"
        )
    outcomes = data.get("outcomes")
    if not isinstance(outcomes, dict) or not outcomes:
        raise BaselineMismatch(f"{path} holds no outcomes; write it with: {REFRESH}")
    return {str(t): str(state) for t, state in outcomes.items()}


def write_baseline(key: dict[str, str], straight: dict[str, str], seconds: float, path: Path = BASELINE) -> None:
    data = {
        "key": key,
        "refresh": REFRESH,
        "straight_seconds": round(seconds),
        "passed": sum(1 for state in straight.values() if state == "passed"),
        "outcomes": dict(sorted(straight.items())),
    }
    path.write_text(json.dumps(data, indent=1) + "\n")


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
    # where it lies in llama.cpp's tree: its test_tools_builtin.py greps "the project root", four
    # levels above its test files, and expects one match. From RUN/suite/unit that was /tmp itself,
    # which held the straight run's copy (and any kept run's): "Total matches: 2" through the gate
    suite = extract_suite(archive, run.dir / "llama.cpp" / "tools" / "server" / "tests")
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
    stored = ap.add_mutually_exclusive_group()
    stored.add_argument(
        "--baseline",
        action="store_true",
        help=f"the gate side only, against the straight outcomes stored in {BASELINE.name} (CI: make conformance-ci)",
    )
    stored.add_argument("--write-baseline", action="store_true", help=f"a straight run of the whole suite, stored in {BASELINE.name}")
    ap.add_argument("--json", help="also write the counts and differences here")
    ap.add_argument("--keep", action="store_true", help="keep the run directories (logs, JUnit XML) and print where")
    ap.add_argument("pytest_args", nargs="*", help="passed to both pytest runs (e.g. -k metrics)")
    args = ap.parse_args(argv)
    if args.write_baseline and args.pytest_args:
        ap.error("--write-baseline measures the whole suite: no pytest arguments")

    sys.path.insert(0, str(REPO))
    from tests.llama.make_model import cached_model

    archive = sdist()
    model = cached_model(size="fast")
    stored_straight: dict[str, str] | None = None
    if args.baseline or args.write_baseline:
        key = baseline_key(archive, model)
    if args.baseline:
        try:
            stored_straight = load_baseline(key)
        except BaselineMismatch as exc:
            print(f"conformance: {exc}", file=sys.stderr)
            return 2
    llama = llama_server_bin()
    root = Path(tempfile.mkdtemp(prefix="tokengate-conformance-"))
    runs = [Run("straight", root / "straight"), Run("gate", root / "gate")]
    for r in runs:
        r.dir.mkdir(parents=True)
    t0 = time.monotonic()
    try:
        if stored_straight is not None:  # the gate side only
            passed = sorted(t for t, state in stored_straight.items() if state == "passed")
        elif args.gate_runs == "all" and not args.write_baseline:
            for r in runs:
                start(r, archive, model, llama, args.pytest_args)
            for r in runs:
                wait(r)
        else:
            start(runs[0], archive, model, llama, args.pytest_args)
            wait(runs[0])
            passed = sorted(t for t, state in outcomes(runs[0].junit).items() if state == "passed")
        straight = stored_straight if stored_straight is not None else outcomes(runs[0].junit)
        if not straight:
            print(f"conformance: the straight run recorded no tests; see {runs[0].log}", file=sys.stderr)
            args.keep = True
            return 1
        if args.write_baseline:
            write_baseline(key, straight, runs[0].seconds)
            print(f"conformance: {BASELINE} written: {len(straight)} tests, {len(passed)} passed straight, {runs[0].seconds:.0f}s")
            return 0
        if args.gate_runs == "passed" or stored_straight is not None:
            only = root / "passed-straight.txt"
            only.write_text("".join(t + "\n" for t in passed))
            start(runs[1], archive, model, llama, args.pytest_args, only=only)
            wait(runs[1])
        gate = outcomes(runs[1].junit)
        if stored_straight is not None and args.pytest_args:  # a subset (-k): only the tests it selected
            straight = {t: state for t, state in straight.items() if t in gate}
        result = compare(straight, gate, load_differences())
        timed = [runs[1]] if stored_straight is not None else runs
        seconds = {r.mode: r.seconds for r in timed} | {"total": time.monotonic() - t0}
        print(report(result, seconds) + (f"\nconformance: straight outcomes from {BASELINE.name}" if stored_straight is not None else ""))
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
