"""Operator changes made at runtime survive a restart of a real `tokengate serve` (finding 5 of #22).

A retune (budget 1536 by hand, min_tokens, a class's shares), a pause and the freeze are
kept beside the journal; after SIGKILL and after SIGTERM the next gate re-applies them
before it listens, with an audit row `restored` each, and shows them as overrides in
force; one command drops them; a SIGHUP reload says which ones it replaces.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator
from pathlib import Path

from gate.data.commands import DropOverrides, Pause, Retune
from gate.ops.link import SocketLink
from tests.integration.fake_upstream import fake_upstream
from tests.integration.gate_harness import wait_until
from tests.integration.test_attach import audit_rows, serve, sock_of, write_config


def since_last_start(tmp_path: Path) -> list[dict]:
    rows = audit_rows(tmp_path)
    last = max(i for i, r in enumerate(rows) if r["action"] == "started")
    # the restore runs before the gate listens, so its rows come just before `started`
    prev = max((i for i, r in enumerate(rows[:last]) if r["action"] in ("stopped", "stopping", "started")), default=-1)
    return rows[prev + 1 :]


@contextlib.asynccontextmanager
async def attached(tmp_path: Path) -> AsyncIterator[SocketLink]:
    """A link to the gate serving in `tmp_path`, once it knows its backend's capacity."""
    link = await SocketLink.connect(sock_of(tmp_path), environ={})
    try:
        await wait_until(lambda: _ready(link), timeout_s=10)
        yield link
    finally:
        await link.close()


async def restart_and_look(tmp_path: Path, config: Path):
    async with serve(tmp_path, config) as proc:
        async with attached(tmp_path) as link:
            snap = await link.snapshot()
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 30)
    return snap


async def _ready(link: SocketLink) -> bool:
    snap = await link.snapshot()
    return bool(snap.backends) and snap.backends[0].budget is not None


async def test_retune_pause_and_freeze_survive_sigkill_and_sigterm_then_drop_in_one_command(tmp_path):
    async with fake_upstream("hang") as fake:
        config = write_config(tmp_path, fake.url)
        async with serve(tmp_path, config) as proc:
            async with attached(tmp_path) as link:
                await link.command(
                    Retune(
                        budget=1536,
                        settings={"min_tokens": 1024, "slo_ttft_p95_ms": 900.0},
                        cls="batch",
                        class_changes={"queue_depth": 3},
                        freeze=True,
                    )
                )
                await link.command(Pause("batch", True))
                before = await link.snapshot()
            assert before.overrides
            proc.send_signal(signal.SIGKILL)  # no drain, no goodbye: what systemd restarts after a crash
            await asyncio.wait_for(proc.wait(), 10)

        for how in ("after SIGKILL", "after SIGTERM"):
            snap = await restart_and_look(tmp_path, config)
            unclean = [r for r in since_last_start(tmp_path) if r["action"] == "unclean_end"]
            assert len(unclean) == (1 if how == "after SIGKILL" else 0), (how, unclean)  # a SIGKILL leaves a mark
            assert snap.backends[0].budget == 1536, how
            assert snap.controller.frozen and snap.controller.slo_ttft_ms == 900.0, how
            batch = next(c for c in snap.classes if c.name == "batch")
            assert batch.paused and batch.queue_depth == 3, how
            assert set(snap.overrides) == set(before.overrides), how
            restored = {(r["target"], r["new_value"]) for r in since_last_start(tmp_path) if r["action"] == "restored"}
            assert {
                ("budget.slo_ttft_p95_ms", "900"),
                ("classes.batch.queue_depth", "3"),
                ("class:batch", "paused"),
                ("controller", "frozen"),
                ("backend:llama", "1536"),
            } <= restored, (how, restored)
            # `started` names the file's digest, as config_in_force does, and says the restored
            # retunes changed what is in force (a trial read two digests for one unchanged file)
            rows = since_last_start(tmp_path)
            (in_force,) = [r["note"] for r in rows if r["action"] == "config_in_force"]
            (started,) = [r["note"] for r in rows if r["action"] == "started"]
            assert f"config {in_force} " in started and "with restored overrides" in started, (in_force, started)

        # one command back to the file; the next start restores nothing
        async with serve(tmp_path, config) as proc:
            async with attached(tmp_path) as link:
                (result,) = await link.command(DropOverrides())
                assert result.action == "overrides_dropped" and "controller frozen" in (result.old_value or "")
                snap = await link.snapshot()
                assert snap.overrides == () and not snap.controller.frozen
                # the budget held by hand (1536, frozen) goes where a start puts it, and is said
                ceiling = snap.backends[0].ceiling
                assert snap.backends[0].budget == ceiling and ceiling != 1536
                assert f"budget 1536 -> {ceiling} on llama (the ceiling, as at start)" in result.message
                assert not next(c for c in snap.classes if c.name == "batch").paused
                assert snap.controller.slo_ttft_ms == 2000.0
        snap = await restart_and_look(tmp_path, config)
        assert snap.overrides == () and not snap.controller.frozen
        assert not [r for r in since_last_start(tmp_path) if r["action"] == "restored"]


async def test_a_sighup_reload_says_which_runtime_overrides_it_replaces(tmp_path):
    async with fake_upstream("hang") as fake:
        config = write_config(tmp_path, fake.url)
        async with serve(tmp_path, config) as proc:
            async with attached(tmp_path) as link:
                await link.command(Retune(settings={"slo_ttft_p95_ms": 900.0}))
                await link.command(Pause("batch", True))
                # a hang-up of the terminal the gate runs in (tmux closed) is a SIGHUP with the
                # file unchanged: it replaced the operator's retunes with the file's values (a
                # trial); they stay, and the reload's row says so
                proc.send_signal(signal.SIGHUP)
                await wait_until(lambda: any("file is unchanged" in (r["note"] or "") for r in audit_rows(tmp_path)), timeout_s=10)
                snap = await link.snapshot()
                assert snap.controller.slo_ttft_ms == 900.0 and "batch paused" in snap.overrides, snap.overrides
                assert not any(r["action"] == "overrides_replaced" for r in audit_rows(tmp_path))
                # an edited file is the operator's word: its values replace the overrides
                config.write_text(config.read_text().replace("queue_depth = 8", "queue_depth = 9", 1))
                proc.send_signal(signal.SIGHUP)
                await wait_until(lambda: any(r["action"] == "overrides_replaced" for r in audit_rows(tmp_path)), timeout_s=10)
                snap = await link.snapshot()
        (row,) = [r for r in audit_rows(tmp_path) if r["action"] == "overrides_replaced"]
        assert row["old_value"] == "budget.slo_ttft_p95_ms=900"
        assert "still in force: batch paused" in row["note"]
        assert snap.controller.slo_ttft_ms == 2000.0 and snap.overrides == ("batch paused",)


async def test_overrides_show_asks_the_running_gate_and_says_when_a_restart_would_revert_them(tmp_path):
    """An ops trial paused batch and froze the controller on a full journal disk: the file
    could not be written, and `tokengate overrides` read the file alone: "no runtime overrides
    (... absent): the gate runs on its config file", while the pause and the freeze held. It
    now asks the running gate, and says when what it holds is not kept (the console's header
    says so too)."""
    import subprocess

    from gate.data.commands import Freeze
    from tests.integration.test_attach import TOKENGATE

    async with fake_upstream("hang") as fake:
        config = write_config(tmp_path, fake.url)
        async with serve(tmp_path, config):
            async with attached(tmp_path) as link:
                # a directory where the file goes: every write of it fails, as on a full disk
                (tmp_path / "journal.db.overrides.json" / "in-the-way").mkdir(parents=True)
                await link.command(Pause("batch", True))
                await link.command(Freeze(True))
                snap = await link.snapshot()
                assert snap.overrides_not_kept and "journal.db.overrides.json" in snap.overrides_not_kept
                shown = await asyncio.to_thread(
                    subprocess.run, [str(TOKENGATE), "overrides", "--config", str(config)], capture_output=True, text=True, timeout=60
                )
                assert shown.returncode == 0, shown.stderr
                assert "batch paused" in shown.stdout and "controller frozen" in shown.stdout, shown
                assert "NOT kept for a restart" in shown.stderr, shown
                assert f"in force now on the gate on {sock_of(tmp_path)}" in shown.stderr, shown
                (tmp_path / "journal.db.overrides.json" / "in-the-way").rmdir()
                (tmp_path / "journal.db.overrides.json").rmdir()  # the disk takes it again
                await wait_until(lambda: _kept(link), timeout_s=10)  # housekeeping writes it
                shown = await asyncio.to_thread(
                    subprocess.run, [str(TOKENGATE), "overrides", "--config", str(config)], capture_output=True, text=True, timeout=60
                )
                assert "batch paused" in shown.stdout and "NOT kept" not in shown.stderr, shown


async def _kept(link: SocketLink) -> bool:
    return not (await link.snapshot()).overrides_not_kept


async def test_config_set_says_which_runtime_retunes_the_next_reload_would_replace(tmp_path):
    """An ops trial retuned the SLO and a queue timeout from the console, then edited another key
    with `tokengate config set` and reloaded: the reload replaced both retunes with the file's
    values (audited, toasted to consoles), and nothing had told whoever edited the file first.
    `config set` now names them, unless the file now holds the same value; a pause stays."""
    import subprocess

    from tests.integration.test_attach import TOKENGATE

    def config_set(*edits: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(TOKENGATE), "config", "set", str(config), *edits], capture_output=True, text=True, timeout=60)

    async with fake_upstream("hang") as fake:
        config = write_config(tmp_path, fake.url)
        async with serve(tmp_path, config):
            async with attached(tmp_path) as link:
                await link.command(Retune(settings={"slo_ttft_p95_ms": 900.0}, cls="batch", class_changes={"queue_depth": 3}))
                await link.command(Pause("batch", True))
            done = await asyncio.to_thread(config_set, "classes.interactive.queue_depth=9")
            assert done.returncode == 0, done.stderr
            assert "budget.slo_ttft_p95_ms=900" in done.stderr and "classes.batch.queue_depth=3" in done.stderr, done.stderr
            assert "overrides write" in done.stderr and "batch paused" not in done.stderr
            done = await asyncio.to_thread(config_set, "budget.slo_ttft_p95_ms=900")  # the file holds it now
            assert "slo_ttft_p95_ms" not in done.stderr and "classes.batch.queue_depth=3" in done.stderr, done.stderr
            # A trial's copy of the gate's config (its journal, so its control socket, shared) was
            # told to `overrides write --config other.toml`: a reload never reads the copy
            other = tmp_path / "other.toml"
            other.write_text(config.read_text())
            copy = await asyncio.to_thread(
                subprocess.run,
                [str(TOKENGATE), "config", "set", str(other), "classes.interactive.queue_depth=9"],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert copy.returncode == 0, copy.stderr
            assert "runtime retunes" not in copy.stderr and "overrides write" not in copy.stderr, copy.stderr
            assert f"{other} is not the running gate's config (the gate on its journal was started from {config}" in copy.stderr
            # the gate's own file, named relative (the gate was given its whole path), is the gate's
            by_link = await asyncio.to_thread(
                subprocess.run,
                [str(TOKENGATE), "config", "set", config.name, "classes.interactive.queue_depth=9"],
                capture_output=True,
                text=True,
                timeout=60,
                cwd=tmp_path,
            )
            assert "classes.batch.queue_depth=3" in by_link.stderr and "not the running gate's" not in by_link.stderr, by_link.stderr
    done = await asyncio.to_thread(config_set, "classes.interactive.queue_depth=7")  # no gate runs: nothing to say
    assert done.returncode == 0 and done.stderr == "", done.stderr
