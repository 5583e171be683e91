"""gate/backend/sameserver.py: backends that reach one llama-server, or the gate itself, found by
resolving their hosts (`serve`, `config check --backends`) and by the llama-server's pid.

A first-day trial: `default` at http://127.0.0.1:18510 and `b2` at http://localhost:18510 passed
`config check --backends` (exit 0, both "llama-server pid 28278 ... ceiling 2048"), and the gate
would have admitted 2 x 2,048 tokens into that server's 4 slots."""

from __future__ import annotations

import ipaddress
import logging
from pathlib import Path

import httpx
import pytest

from gate.backend.layout import ServerArgs
from gate.backend.pool import BackendPool
from gate.backend.sameserver import check_places, resolve, same_process
from gate.cli import main
from gate.config import ConfigError, parse_config
from gate.core.admission import TenantPolicy

TRIAL = '[[backends]]\nname = "default"\nurl = "http://127.0.0.1:18510"\n[[backends]]\nname = "b2"\nurl = "http://localhost:18510"\n'


def fake_resolver(table: dict[str, str]):
    def resolver(hosts):
        out = {}
        for h in hosts:
            try:
                out[h] = frozenset({ipaddress.ip_address(h)})
            except ValueError:
                if h in table:
                    out[h] = frozenset(ipaddress.ip_address(a) for a in table[h].split(","))
        return out

    return resolver


def test_localhost_resolves_to_the_loopback_address() -> None:
    assert ipaddress.ip_address("127.0.0.1") in resolve(["localhost"])["localhost"]
    assert resolve(["192.0.2.7"]) == {"192.0.2.7": frozenset({ipaddress.ip_address("192.0.2.7")})}  # no lookup


def test_localhost_and_127_0_0_1_on_one_port_are_refused_naming_both() -> None:
    config = parse_config(TRIAL, "t.toml")  # as written they differ: the textual check passes
    with pytest.raises(ConfigError) as info:
        check_places(config, "t.toml")
    e = info.value
    assert e.key == "backends[1].url"
    assert (
        '"http://localhost:18510" and backends[0].url "http://127.0.0.1:18510" resolve to the same address, 127.0.0.1 port 18510'
        in e.problem
    )
    assert 'backends "default" and "b2" would count twice' in e.problem


def test_other_ports_unresolved_names_and_router_backends_with_their_models_pass() -> None:
    resolver = fake_resolver({"gpu-a": "10.0.0.5", "gpu-b": "10.0.0.5"})
    ok = [
        TRIAL.replace("localhost:18510", "localhost:18511"),
        TRIAL.replace("localhost", "nowhere.invalid"),  # not resolved: left to the probes
        TRIAL.replace("127.0.0.1", "gpu-a").replace("localhost", "gpu-b").replace("url", 'models = ["m"]\nurl', 1) + 'models = ["n"]\n',
    ]
    for text in ok:
        check_places(parse_config(text), "t.toml", resolver=resolver)
    with pytest.raises(ConfigError, match="resolve to the same address, 10.0.0.5 port 18510"):
        check_places(parse_config(TRIAL.replace("127.0.0.1", "gpu-a").replace("localhost", "gpu-b")), "t.toml", resolver=resolver)


@pytest.mark.parametrize(
    ("listen", "host", "table"),
    [
        ("127.0.0.1:18811", "gpu", {"gpu": "127.0.0.1"}),
        ("0.0.0.0:18811", "gpu", {"gpu": "127.0.0.2"}),  # on 0.0.0.0 the gate is at every local address
        ("gate-host:18811", "localhost", {"gate-host": "127.0.0.1", "localhost": "127.0.0.1,::1"}),
    ],
)
def test_a_backend_that_resolves_to_the_gate_s_own_address_is_refused(listen: str, host: str, table: dict[str, str]) -> None:
    config = parse_config(f'[gate]\nlisten = "{listen}"\n[[backends]]\nurl = "http://{host}:18811"\n')
    with pytest.raises(ConfigError) as info:
        check_places(config, "t.toml", resolver=fake_resolver(table))
    assert info.value.key == "backends[0].url" and "where the gate itself listens ([gate] listen" in info.value.problem


def test_a_backend_on_another_host_at_the_listen_port_passes() -> None:
    config = parse_config('[gate]\nlisten = "0.0.0.0:18811"\n[[backends]]\nurl = "http://gpu:18811"\n')
    check_places(config, "t.toml", resolver=fake_resolver({"gpu": "192.0.2.7"}))  # TEST-NET: never this host's


def test_config_check_backends_and_serve_exit_2_on_the_trial_s_two_names(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    p = tmp_path / "c.toml"
    p.write_text(f'[gate]\nlisten = "127.0.0.1:18812"\njournal = "{tmp_path / "tg.db"}"\n' + TRIAL)
    assert main(["config", "check", str(p)]) == 0  # textual: as written they differ
    capsys.readouterr()
    for argv in (["config", "check", "--backends", str(p)], ["serve", "--config", str(p)]):
        assert main(argv) == 2, argv
        out, err = capsys.readouterr()
        assert err.startswith(f"{p}: backends[1].url: ") and "resolve to the same address, 127.0.0.1 port 18510" in err, argv
        assert "Traceback" not in err and "backend  default" not in out  # before either is asked
        assert "ok:" not in out, out  # not "ok: c.toml" above the error and its exit 2 (a re-read)
    assert not (tmp_path / "tg.db").exists()  # serve refused before it opened anything


def args(pid: int) -> ServerArgs:
    return ServerArgs(pid=pid, host="0.0.0.0", port=18510, ctx=2048, n_parallel=4, kv_unified=None)


def test_same_process_pairs_backends_of_one_pid_but_router_backends_with_models() -> None:
    config = parse_config(TRIAL.replace("localhost", "[::1]") + '[[backends]]\nname = "c"\nurl = "http://127.0.0.1:18520"\n')
    a, b, c = config.backends
    assert same_process(config.backends, {"default": args(7), "b2": args(7), "c": args(8)}) == [(a, b, args(7))]
    assert same_process(config.backends, {"default": args(7), "b2": None, "c": args(8)}) == []
    routers = parse_config(TRIAL.replace("url", 'models = ["m"]\nurl', 1) + 'models = ["n"]\n').backends
    assert same_process(routers, {"default": args(7), "b2": args(7)}, routers=("default", "b2")) == []
    assert len(same_process(routers, {"default": args(7), "b2": args(7)})) == 1  # not a router: one process


def test_config_check_backends_exits_2_when_two_backends_have_one_llama_server_pid(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # llama-server on [::] (both families), reached as 127.0.0.1 and as [::1]: two addresses,
    # one process; nothing listens here, so each backend's line says unreachable
    from gate.backend import layout

    p = tmp_path / "c.toml"
    p.write_text(TRIAL.replace("localhost", "[::1]"))
    monkeypatch.setattr(layout, "local_server_args", lambda url: args(28278))
    assert main(["config", "check", "--backends", str(p)]) == 2
    out, err = capsys.readouterr()
    assert "backend  default" in out and "backend  b2" in out
    assert err == (
        f'{p}: backends[1].url: backends "default" (http://127.0.0.1:18510) and "b2" (http://[::1]:18510) reach the same '
        "llama-server, llama-server pid 28278: -np 4 -c 2048: its capacity is counted twice, so the gate admits up to "
        "twice what its KV cache holds; give each backend a llama-server of its own\n"
    )


async def test_serve_logs_an_error_when_it_learns_one_pid_for_two_backends(caplog: pytest.LogCaptureFixture) -> None:
    config = parse_config(TRIAL.replace("localhost", "[::1]"))

    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            return httpx.Response(200, json={"status": "ok"})
        return httpx.Response(200, json={"total_slots": 4, "default_generation_settings": {"n_ctx": 512}})

    client = httpx.AsyncClient(transport=httpx.MockTransport(handle))
    pool = BackendPool(config.backends, client, classes=config.classes, tenant_policy=lambda _t: TenantPolicy(), environ={})
    pool._args_finder = lambda url: args(28278)
    try:
        with caplog.at_level(logging.ERROR, logger="tokengate.backends"):
            await pool.probe_all()
            await pool.probe_all()  # said once, not on every probe
        said = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        assert said == [
            'backends "default" (http://127.0.0.1:18510) and "b2" (http://[::1]:18510) reach the same llama-server, '
            "llama-server pid 28278: -np 4 -c 2048: its capacity is counted twice, so the gate admits up to twice what "
            "its KV cache holds; give each backend a llama-server of its own"
        ]
    finally:
        for b in pool:
            if b.gatekeeper is not None:
                b.gatekeeper.close()
        await client.aclose()
