"""How a console starts: watch-only never serves (finding 3), a wrong file says what it is (finding 6)."""

from __future__ import annotations

import os
import socket

from tests.integration.fake_upstream import fake_upstream
from tests.integration.test_attach import TOKENGATE, Pty, serve, sock_of, write_config


def test_read_only_console_without_a_gate_is_an_error_and_never_serves(tmp_path):
    config = write_config(tmp_path, "http://127.0.0.1:9")
    port = int(config.read_text().split('listen = "127.0.0.1:')[1].split('"')[0])
    console = Pty(str(TOKENGATE), "console", "--read-only", "--config", str(config), cwd=tmp_path)
    try:
        rc = console.proc.wait(30)
        text = console.read().decode(errors="replace")
    finally:
        console.close()
    assert rc == 2, text
    assert "--read-only only watches a running gate" in text and "tokengate serve --config" in text
    assert not os.path.exists(sock_of(tmp_path)) and not (tmp_path / "journal.db").exists()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # nobody took the gate's port


async def test_attaching_to_the_journal_says_it_is_a_journal_and_what_to_pass(tmp_path):
    async with fake_upstream("hang") as fake:
        config = write_config(tmp_path, fake.url)
        async with serve(tmp_path, config):
            for wrong, said in (
                (tmp_path / "journal.db", "is a journal (SQLite), not a control socket"),
                (config, "is a config file, not a control socket"),
            ):
                console = Pty(str(TOKENGATE), "console", "--attach", str(wrong), cwd=tmp_path)
                try:
                    rc = console.proc.wait(30)
                    text = console.read().decode(errors="replace")
                finally:
                    console.close()
                assert rc == 2, text
                assert said in text, text
                assert "the gate is not running" not in text
            assert f"--attach {tmp_path / 'journal.sock'}" in text or "--attach --config" in text


def test_a_listen_address_in_use_is_named_with_its_key_and_no_traceback(tmp_path):
    import subprocess

    config = write_config(tmp_path, "http://127.0.0.1:9")
    port = int(config.read_text().split('listen = "127.0.0.1:')[1].split('"')[0])
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("127.0.0.1", port))
        holder.listen()
        proc = subprocess.run([str(TOKENGATE), "serve", "--config", str(config)], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert f"cannot listen on 127.0.0.1:{port} ([gate] listen)" in proc.stderr
    assert "Traceback" not in proc.stderr and "never retrieved" not in proc.stderr


async def test_an_attached_console_reconnects_when_its_gate_restarts(tmp_path):
    import asyncio
    import signal

    from tests.integration.gate_harness import wait_until

    async with fake_upstream("hang") as fake:
        config = write_config(tmp_path, fake.url)
        async with serve(tmp_path, config) as proc:
            console = Pty(str(TOKENGATE), "console", "--attach", sock_of(tmp_path), cwd=tmp_path)
            try:
                await wait_until(lambda: console.shows("LIVE"), timeout_s=30)
                proc.send_signal(signal.SIGTERM)  # what systemd does on a restart
                await asyncio.wait_for(proc.wait(), 30)
                await wait_until(lambda: console.shows("waiting up to"), timeout_s=30)
                assert console.proc.poll() is None  # still there, waiting for its gate
                async with serve(tmp_path, config):
                    await wait_until(lambda: console.shows("reconnected to"), timeout_s=30)
                    assert console.proc.poll() is None
            finally:
                console.close()
