"""gate.cli: the `tokengate` command line (config check / example, console, serve)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gate import __version__
from gate.cli import main
from gate.config import EXAMPLE_CONFIG

REPO = Path(__file__).resolve().parents[2]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_config_example_prints_the_example(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "config", "example")
    assert code == 0
    assert out == EXAMPLE_CONFIG
    assert err == ""


def test_example_piped_into_check_stdin(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    _, example, _ = run(capsys, "config", "example")
    monkeypatch.setattr(sys, "stdin", io.StringIO(example))
    code, out, err = run(capsys, "config", "check", "-")
    assert code == 0, err
    assert out == "ok: <stdin> (1 backend, 2 classes, 0 tenants)\n"
    assert err == ""


def test_check_counts_what_it_found(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    p = tmp_path / "two.toml"
    p.write_text(
        '[[backends]]\nname = "a"\nurl = "http://a:1"\n[[backends]]\nname = "b"\nurl = "http://b:1"\n'
        "[classes.only]\npriority = 1\n"
        '[[tenants]]\nname = "x"\napi_key_env = "X"\n[[tenants]]\nname = "y"\napi_key_env = "Y"\n'
    )
    code, out, err = run(capsys, "config", "check", str(p))
    assert code == 0, err
    assert out == f"ok: {p} (2 backends, 1 class, 2 tenants)\n"


def test_typo_config_exits_2_naming_the_key(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    p = tmp_path / "tokengate.toml"
    p.write_text('[gate]\nlisten = "127.0.0.1:8081"\nshed_factr = 3\n')
    code, out, err = run(capsys, "config", "check", str(p))
    assert code == 2
    assert out == ""
    assert err == f'{p}: gate.shed_factr: unknown key; did you mean "shed_factor"?\n'


def test_negative_depth_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    p = tmp_path / "tokengate.toml"
    p.write_text("[classes.batch]\npriority = 1\nqueue_depth = -3\n")
    code, out, err = run(capsys, "config", "check", str(p))
    assert code == 2
    assert out == ""
    assert err.strip() == f"{p}: classes.batch.queue_depth: must be a positive integer, got -3"


def test_bad_stdin_names_stdin(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO("[budget]\ndecrease = 1.5\n"))
    code, _, err = run(capsys, "config", "check", "-")
    assert code == 2
    assert err.startswith("<stdin>: budget.decrease: ")


def test_missing_file_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run(capsys, "config", "check", str(tmp_path / "absent.toml"))
    assert code == 2
    assert "absent.toml" in err and "cannot read" in err


def test_toml_syntax_error_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    p = tmp_path / "broken.toml"
    p.write_text("[gate\n")
    code, _, err = run(capsys, "config", "check", str(p))
    assert code == 2
    assert err.startswith(f"{p}: line 1")
    assert "invalid TOML" in err


@pytest.mark.parametrize(
    "argv",
    [[], ["config"], ["config", "check"], ["nope"], ["console", "--bogus"], ["config", "check", "a", "b"]],
)
def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    code, _, err = run(capsys, *argv)
    assert code == 2
    assert "usage: tokengate" in err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--version")
    assert code == 0
    assert out.strip() == f"tokengate {__version__}"


@pytest.mark.parametrize(
    ("argv", "expect"),
    [
        ([], ["console", "config", "exit codes", "2  usage or config error"]),
        (["console"], ["--config", "--demo", "SIMULATED", "--read-only"]),
        (["config", "check"], ["FILE", "standard input", "exit codes"]),
        # the review's what-if (w) was in the README only: at 80 columns the footer cuts it off too
        (["review"], ["What-if (w)", "tokengate replay"]),
    ],
)
def test_help_texts(capsys: pytest.CaptureFixture[str], argv: list[str], expect: list[str]) -> None:
    code, out, _ = run(capsys, *argv, "--help")
    assert code == 0
    for fragment in expect:
        assert fragment in out


def test_overrides_help_gives_each_action_a_line_of_its_own(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    # a first-day trial: the positional `{show,drop,write}` had no help line
    monkeypatch.setenv("COLUMNS", "100")
    code, out, _ = run(capsys, "overrides", "--help")
    assert code == 0
    lines = out.splitlines()
    for action, words in (("show", "list them"), ("drop", "back to the config file"), ("write", "write the retuned settings")):
        assert any(line.split()[:1] == [action] and words in line for line in lines), (action, out)
    code, out, _ = run(capsys, "overrides", "write", "--help")
    assert code == 0 and "--config FILE" in out and "Write the retuned settings into --config" in out


def test_verbose_check_summarises_the_defaults(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    empty = tmp_path / "empty.toml"
    empty.write_text("")
    code, out, err = run(capsys, "config", "check", "-v", str(empty))
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("ok: ")
    assert "127.0.0.1:8081" in out
    assert "backend  default  http://127.0.0.1:8080  kv auto" in out
    assert "adaptive" in out and "2000 ms" in out
    interactive = next(line for line in lines if "interactive" in line)
    assert "priority 10" in interactive and "depth 64" in interactive and "timeout 10 s" in interactive
    batch = next(line for line in lines if line.startswith("class    batch"))
    assert "priority 1 " in batch and "depth 256" in batch and "timeout 120 s" in batch
    assert lines.index(interactive) < lines.index(batch)  # highest priority first
    # the objective in force and where it comes from, though the file sets none: the built-in
    # classes refuse by the SLO's 2000 ms, and the summary said nothing of it
    assert "TTFT objective 2000 ms (the SLO's)" in interactive
    assert "TTFT objective 2000 ms (the SLO's)" in batch


def verbose_check(capsys: pytest.CaptureFixture[str], tmp_path: Path, toml: str) -> str:
    """`tokengate config check -v` of a file holding `toml`: its summary (the check passes)."""
    p = tmp_path / "c.toml"
    p.write_text(toml)
    code, out, err = run(capsys, "config", "check", "-v", str(p))
    assert code == 0, err
    return out


def test_verbose_check_says_the_auto_floor_is_at_least_the_reservations(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # the auto floor is a quarter of the ceiling and never below the classes' reservations
    # (gate.backend.pool.budget_floor); the summary said only "a quarter of the ceiling"
    out = verbose_check(
        capsys, tmp_path, "[classes.chat]\npriority = 5\nreserved_tokens = 1024\n[classes.bulk]\npriority = 1\nreserved_tokens = 256\n"
    )
    assert "min auto (a quarter of the ceiling, at least the classes' reservations, 1280, or half the ceiling on a pool under 2560)" in out


def test_verbose_check_names_a_class_s_own_objective(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = verbose_check(
        capsys,
        tmp_path,
        "[budget]\nslo_ttft_p95_ms = 1500\n[classes.chat]\npriority = 5\nttft_objective_ms = 800\n[classes.bulk]\npriority = 1\n",
    )
    chat = next(line for line in out.splitlines() if line.startswith("class    chat"))
    bulk = next(line for line in out.splitlines() if line.startswith("class    bulk"))
    assert "TTFT objective 800 ms" in chat and "SLO" not in chat
    assert "TTFT objective 1500 ms (the SLO's)" in bulk


def test_verbose_check_reads_the_config(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    p = tmp_path / "c.toml"
    p.write_text(
        '[gate]\nlisten = "[::1]:9999"\n[[backends]]\nurl = "http://gpu:8080"\nkv = "split"\n'
        '[budget]\nmode = "static"\n'
        "[classes.gold]\npriority = 5\nreserved_tokens = 512\nlimit_tokens = 4096\nqueue_depth = 7\n"
    )
    code, out, err = run(capsys, "config", "check", "--verbose", str(p))
    assert code == 0, err
    assert "[::1]:9999" in out
    assert "kv split" in out and "static" in out
    assert "class    gold  priority 5  reserved 512  limit 4096  depth 7" in out


def test_console_without_a_terminal_says_so_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "console")  # pytest's stdin is not a TTY
    assert code == 2
    assert "needs a terminal" in err and "tokengate serve" in err


def test_console_with_bad_config_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    p = tmp_path / "c.toml"
    p.write_text("[classes.batch]\npriority = 1\nqueue_depth = -3\n")
    code, out, err = run(capsys, "console", "--config", str(p))
    assert code == 2
    assert "classes.batch.queue_depth" in err


def test_installed_script_pipes_example_into_check(tmp_path: Path) -> None:
    script = Path(sys.executable).parent / "tokengate"
    assert script.exists(), f"the tokengate script is not installed next to {sys.executable}"
    example = subprocess.run([str(script), "config", "example"], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert example.returncode == 0, example.stderr
    assert example.stdout == EXAMPLE_CONFIG
    check = subprocess.run(
        [str(script), "config", "check", "-"],
        input=example.stdout,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert check.returncode == 0, check.stderr
    assert check.stdout.startswith("ok: <stdin> (1 backend, 2 classes")

    bad = subprocess.run(
        [str(script), "config", "check", "-"],
        input="[classes.batch]\npriority = 1\nqueue_depth = -3\n",
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert bad.returncode == 2
    assert "<stdin>: classes.batch.queue_depth: must be a positive integer, got -3" in bad.stderr


def test_installed_script_in_a_real_shell_pipe(tmp_path: Path) -> None:
    script = Path(sys.executable).parent / "tokengate"
    proc = subprocess.run(
        f'"{script}" config example | "{script}" config check -',
        shell=True,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("ok: <stdin>")


def test_check_warns_of_reservations_over_a_fixed_token_budget(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # What `serve` warns of at start, known from the file alone: the exit status stays 0.
    p = tmp_path / "tokengate.toml"
    p.write_text(EXAMPLE_CONFIG.replace("# token_budget = 16384", "token_budget = 600"))
    assert "token_budget = 600" in p.read_text()
    code, out, err = run(capsys, "config", "check", str(p))
    assert code == 0, err
    assert (
        "warning: backend default (token_budget 600): class reservations (interactive 1024) are over 50% "
        "of the ceiling 600: interactive 300 in force here"
    ) in out
    # the example as it is (no token_budget: the ceiling is llama-server's) has nothing to warn of
    p.write_text(EXAMPLE_CONFIG)
    assert run(capsys, "config", "check", str(p))[1] == f"ok: {p} (1 backend, 2 classes, 0 tenants)\n"


def test_check_backends_says_each_capacity_warning_once_with_what_llama_server_reports(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trial's `config check staging.toml --backends`, token_budget 1024 on `-np 4 -c 2048`
    (split, slots of 512): the reservation warning twice (from the file, then from the backend),
    and from the file alone "batch ... may hold at most 512 tokens ... it never starts", which a
    slot of 512 does start (the gate lowers the default it injects to what the slot holds). With
    --backends the backend's check says them, with the slots llama-server reports; the file's
    alone only where it reports none."""
    import httpx

    p = tmp_path / "staging.toml"
    p.write_text(EXAMPLE_CONFIG.replace("# token_budget = 16384", "token_budget = 1024"))
    up = {"ok": True}

    def handle(request: httpx.Request) -> httpx.Response:
        if not up["ok"]:
            raise httpx.ConnectError("connection refused", request=request)
        if request.url.path == "/health":
            return httpx.Response(200, json={"status": "ok"})
        if request.url.path == "/props":
            return httpx.Response(200, json={"total_slots": 4, "kv_unified": False, "default_generation_settings": {"n_ctx": 512}})
        return httpx.Response(404)

    real = httpx.Client
    monkeypatch.setattr(httpx, "Client", lambda **kw: real(transport=httpx.MockTransport(handle), **kw))
    code, out, err = run(capsys, "config", "check", "--backends", str(p))
    warnings = [line for line in out.splitlines() if line.startswith("warning: ")]
    assert len([w for w in warnings if "class reservations (interactive 1024) are over 50%" in w]) == 1, out
    assert "(split KV, 4 slots of 512)" in warnings[0] and "never starts" not in out, out
    # llama-server not there: the file's token_budget is all there is to check, said under its line
    up["ok"] = False
    code, out, err = run(capsys, "config", "check", "--backends", str(p))
    assert code == 1 and "backend  default  http://127.0.0.1:8080: unreachable" in out, out
    said = out.split("unreachable", 1)[1]
    assert "warning: backend default (token_budget 1024): class reservations (interactive 1024) are over 50%" in said, out
    assert out.count("class reservations") == 1, out


def test_check_warns_of_a_ttft_objective_no_first_token_meets(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # A trial set 1 (ms): accepted without a word, the gate then refused every request that
    # would wait and served the others late. A warning (exit 0), naming the key that set it.
    p = tmp_path / "tokengate.toml"
    p.write_text(EXAMPLE_CONFIG.replace("slo_ttft_p95_ms = 2000.0", "slo_ttft_p95_ms = 2.0"))
    code, out, err = run(capsys, "config", "check", str(p))
    assert code == 0, err
    said = [line for line in out.splitlines() if line.startswith("warning: ")]
    assert len(said) == 2, out  # both classes take the SLO as their objective
    assert (
        said[0].startswith("warning: budget.slo_ttft_p95_ms = 2 ms, the time-to-first-token objective of class 'interactive':")
        and "milliseconds, not seconds?" in said[0]
    )
    # a class's own objective is named as such, and a sane one says nothing
    p.write_text(EXAMPLE_CONFIG.replace("# ttft_objective_ms = 2000.0", "ttft_objective_ms = 1", 1))
    code, out, _ = run(capsys, "config", "check", str(p))
    assert code == 0 and out.count("warning: ") == 1 and "warning: classes.interactive.ttft_objective_ms = 1 ms" in out, out


def test_check_warns_of_a_class_limit_no_default_request_fits(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # A first-day trial's limit_tokens = 10 beside default_max_tokens 512 passed without a word:
    # no request of the class without max_tokens can ever start. A warning (exit 0), not an
    # error: requests that send a small max_tokens still run.
    p = tmp_path / "tokengate.toml"
    p.write_text("[classes.interactive]\npriority = 10\nlimit_tokens = 10\n[classes.batch]\npriority = 1\nlimit_tokens = 513\n")
    code, out, err = run(capsys, "config", "check", str(p))
    assert code == 0, err
    said = [line for line in out.splitlines() if line.startswith("warning: ")]
    assert said == [
        "warning: classes.interactive.limit_tokens = 10 is not above its default_max_tokens 512: a request of class "
        "'interactive' without max_tokens holds its prompt and 512 tokens, more than the class may ever hold, so it "
        "is refused (400 context_length_exceeded); only requests that send a smaller max_tokens run. Raise "
        "limit_tokens or lower default_max_tokens"
    ], out


def test_python_dash_m_gate_is_the_tokengate_command(tmp_path: Path) -> None:
    # a checkout run without installing it: `python -m gate` said "cannot be directly executed"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    example = subprocess.run(
        [sys.executable, "-m", "gate", "config", "example"], capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env
    )
    assert example.returncode == 0, example.stderr
    assert example.stdout == EXAMPLE_CONFIG
    bad = subprocess.run([sys.executable, "-m", "gate", "log", "--nope"], capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env)
    assert bad.returncode == 2 and "usage: tokengate" in bad.stderr


@pytest.mark.parametrize("key", ["journal", "control_socket"])
def test_serve_with_a_path_in_a_missing_directory_exits_2_naming_the_key(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, key: str
) -> None:
    """A trial's typo'd journal directory: the gate started, probed the backend, then died
    with `tokengate: error: FileNotFoundError: [Errno 2] No such file or directory` (exit 1),
    naming neither the path nor the key."""
    p = tmp_path / "c.toml"
    missing = tmp_path / "nodir" / "tg.db"
    journal = missing if key == "journal" else tmp_path / "tg.db"
    socket = f'control_socket = "{tmp_path / "nodir" / "tg.sock"}"\n' if key == "control_socket" else ""
    p.write_text(f'[gate]\nlisten = "127.0.0.1:19110"\njournal = "{journal}"\n{socket}')
    code, out, err = run(capsys, "serve", "--config", str(p))
    assert code == 2
    assert f"gate.{key}" in err and str(tmp_path / "nodir") in err and "does not exist" in err
    assert not (tmp_path / "nodir").exists()


@pytest.mark.parametrize("command", ["log", "review", "replay"])
def test_journal_help_says_the_demo_journal_is_read_when_it_is_the_only_one(command, capsys):
    """`tokengate review` and `tokengate replay` without --journal read tokengate-demo.db when
    only the demo's journal is here (find_journal, as the README says of log and review), but
    their --help said "default: ... tokengate.db" alone: an engineer who had just run the demo
    read that their journal was not the one opened."""
    assert main([command, "--help"]) == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert "tokengate-demo.db" in help_text


def test_a_hang_up_while_serve_starts_does_not_kill_the_gate(tmp_path: Path) -> None:
    """A trial sent SIGHUP (what `systemctl reload` sends; systemd's Type=exec calls the
    service started at exec) 0.3 s after `tokengate serve` began: the process died at once,
    nothing logged, and systemd counts death by SIGHUP as a clean exit, so Restart=on-failure
    would not bring it back. A hang-up while it starts is now held and honoured once it runs."""
    script = (
        "import os, signal, sys\n"
        "import gate.cli as cli\n"
        "def load(path):\n"
        "    os.kill(os.getpid(), signal.SIGHUP)  # a reload asked for while the config is read\n"
        "    raise cli.ConfigError(path, 'x', 'stop here')\n"
        "cli.load_config = load\n"
        "sys.exit(cli.main(['serve', '--config', 'nowhere.toml']))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == 2, (proc.returncode, proc.stderr)


@pytest.mark.parametrize("listen", [True, False])
def test_serve_demo_listens_where_the_config_says_else_on_a_free_port(tmp_path: Path, listen: bool) -> None:
    """A first-day trial's `serve --demo --config demo.toml` bound a random port although the file
    set [gate] listen: what the user wrote is where clients are pointed. Without it, a free port
    (never a fight with a real gate on 8081), and the log says which."""
    import signal
    import socket
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = tmp_path / "demo.toml"
    p.write_text((f'[gate]\nlisten = "127.0.0.1:{port}"\n' if listen else "[gate]\n") + 'journal = "demo.db"\n')
    log = tmp_path / "serve.log"
    with open(log, "w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gate", "serve", "--demo", "--config", str(p), "--grace", "0"],
            cwd=tmp_path,
            stderr=stderr,
            stdout=subprocess.DEVNULL,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
    try:
        deadline = time.monotonic() + 60  # the demo's line comes right after "tokengate listening on"
        while "demo: listening on" not in log.read_text() and time.monotonic() < deadline and proc.poll() is None:
            if "tokengate listening on" in log.read_text():
                deadline = min(deadline, time.monotonic() + 3)
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    said = log.read_text()
    line = next((x for x in said.splitlines() if "demo: listening on" in x), said)
    if listen:
        assert f"demo: listening on http://127.0.0.1:{port}, the [gate] listen of {p}" in line, said
    else:
        assert "a free port (set [gate] listen in --config to choose one)" in line and f":{port}," not in line, said


def test_config_check_warns_of_a_journal_directory_serve_would_refuse(tmp_path, capsys):
    # a trial's check said "ok", then serve exited 2 on the missing directory; a warning (exit 0):
    # a file may be checked on another host than the one it serves on
    p = tmp_path / "tg.toml"
    p.write_text(f'[gate]\njournal = "{tmp_path / "nowhere" / "j.db"}"\n')
    code, out, _ = run(capsys, "config", "check", str(p))
    assert code == 0 and out.startswith("ok: ")
    assert f"warning: gate.journal: {tmp_path / 'nowhere' / 'j.db'}: the directory {tmp_path / 'nowhere'} does not exist" in out
    assert "serve` on this host would refuse to start" in out
    (tmp_path / "nowhere").mkdir()
    code, out, _ = run(capsys, "config", "check", str(p))
    assert code == 0 and "warning" not in out


def test_verbose_check_says_the_shared_limits_and_who_may_call(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # `config check -v` said nothing of [shared] (a trial), nor that an open gate in front of a
    # keyed llama-server asks clients for its key
    out = verbose_check(capsys, tmp_path, '[shared]\nredis_url = "redis://:s3cret@10.0.0.5:6379/0"\nfailure_policy = "fail_closed"\n')
    assert "shared   tenant limits across gates on redis://10.0.0.5:6379/0 (prefix 'tokengate:'), fail_closed" in out
    assert "s3cret" not in out
    assert "shared   off" in verbose_check(capsys, tmp_path, "")
    keyed = verbose_check(capsys, tmp_path, '[[backends]]\nname = "a"\nurl = "http://a:1"\napi_key_env = "UP"\n')
    assert "tenants  none (open gate: clients present the backends' own API key, api_key_env)" in keyed
