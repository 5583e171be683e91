"""`tokengate config set` / `overrides write`: keys edited in place, validated, comments kept."""

from __future__ import annotations

import contextlib
import io
import json
import os

import pytest

from gate.cli import main
from gate.config import EXAMPLE_CONFIG, parse_config
from gate.config.edit import set_keys


def test_set_keys_replaces_in_its_table_inserts_new_keys_and_appends_missing_tables():
    text = "[budget]\nmin_tokens = 2048  # the floor\n# aging_s = 5\n\n[classes.batch]\npriority = 1\n"
    out = set_keys(
        text,
        [("budget.min_tokens", 1024), ("budget.aging_s", 2.5), ("classes.batch.reserved_tokens", 0), ("classes.interactive.priority", 9)],
    )
    c = parse_config(out + "[classes.interactive]\n" if "[classes.interactive]" not in out else out, "t.toml")
    assert c.budget.min_tokens == 1024 and c.budget.aging_s == 2.5
    assert "min_tokens = 1024  # the floor" in out and "# aging_s = 5" in out
    assert out.count("[budget]") == 1 and out.count("[classes.batch]") == 1


def test_the_example_config_takes_edits_and_stays_valid():
    out = set_keys(EXAMPLE_CONFIG, [("budget.min_tokens", 512), ("classes.interactive.reserved_tokens", 256)])
    c = parse_config(out, "example.toml")
    assert c.budget.min_tokens == 512
    assert c.class_by_name("interactive").reserved_tokens == 256
    assert out.count("\n[budget]") == EXAMPLE_CONFIG.count("\n[budget]")


def run(*argv: str) -> tuple[int, str, str]:
    import contextlib

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def test_config_set_refuses_an_invalid_edit_and_leaves_the_file(tmp_path):
    f = tmp_path / "tokengate.toml"
    f.write_text(EXAMPLE_CONFIG)
    rc, out, err = run("config", "set", str(f), "budget.min_tokens=1024")
    assert rc == 0 and parse_config(f.read_text(), "f").budget.min_tokens == 1024
    rc, out, err = run("config", "set", str(f), "budget.min_tokens=-3")
    assert rc == 2 and "min_tokens" in err
    assert parse_config(f.read_text(), "f").budget.min_tokens == 1024


def test_config_set_through_a_symlink_edits_the_file_it_names_and_keeps_the_link(tmp_path):
    # a what-if trial: the link became a plain file holding the edit, and the managed file it
    # named kept the old values (the gate, started from the link, read them at its next start)
    managed = tmp_path / "managed" / "tokengate.toml"
    managed.parent.mkdir()
    managed.write_text(EXAMPLE_CONFIG)
    os.chmod(managed, 0o640)
    link = tmp_path / "tokengate.toml"
    link.symlink_to(managed)
    rc, out, err = run("config", "set", str(link), "budget.min_tokens=1024")
    assert rc == 0, err
    assert link.is_symlink() and os.readlink(link) == str(managed)
    assert parse_config(managed.read_text(), "m").budget.min_tokens == 1024
    assert os.stat(managed).st_mode & 0o777 == 0o640
    assert not list(tmp_path.glob("*.tokengate-new")) and not list(managed.parent.glob("*.tokengate-new"))


def test_overrides_show_write_and_drop_without_a_running_gate(tmp_path):
    f = tmp_path / "tokengate.toml"
    journal = tmp_path / "tokengate.db"
    f.write_text(EXAMPLE_CONFIG.replace('journal = "tokengate.db"', f'journal = "{journal}"'))
    kept = tmp_path / "tokengate.db.overrides.json"
    kept.write_text(
        json.dumps(
            {
                "v": 1,
                "settings": {"min_tokens": 1024},
                "classes": {"batch": {"queue_depth": 3}},
                "budgets": {},
                "paused": ["batch"],
                "frozen": True,
                "pins": {"default/tiny": False},
            }
        )
    )
    rc, out, err = run("overrides", "--config", str(f))
    assert rc == 0 and "budget.min_tokens=1024" in out and "batch paused" in out and "controller frozen" in out
    assert "model default/tiny unpinned" in out
    # where they come from: the file, not a gate (nothing runs on it), and what happens to them
    assert f"kept in {kept}, not in force: no gate runs on" in err and "the next gate on this journal starts with them" in err
    rc, out, _ = run("overrides", "write", "--config", str(f))
    assert rc == 0
    c = parse_config(f.read_text(), "f")
    assert c.budget.min_tokens == 1024 and c.class_by_name("batch").queue_depth == 3
    left = json.loads(kept.read_text())
    assert left["settings"] == {} and left["classes"] == {} and left["paused"] == ["batch"] and left["frozen"]
    assert left["pins"] == {"default/tiny": False}  # runtime state, as a pause is: kept, not written into the file
    rc, out, _ = run("overrides", "drop", "--config", str(f))
    assert rc == 0 and not kept.exists()


def test_commands_beside_a_gate_find_its_relative_journal_by_the_config_file(tmp_path, monkeypatch):
    """A trial ran `tokengate log --config /srv/gate/tokengate.toml` from its home: the config's
    relative journal (the gate's working directory) was looked for in the home, "journal file
    not found" while the gate ran. Not here, the config file's folder holds it: that one, said."""
    from gate.config import EXAMPLE_CONFIG as EXAMPLE
    from gate.config.reader import beside_the_file

    srv, home = tmp_path / "srv", tmp_path / "home"
    srv.mkdir()
    home.mkdir()
    f = srv / "tokengate.toml"
    f.write_text(EXAMPLE)
    assert 'journal = "tokengate.db"' in EXAMPLE
    (srv / "tokengate.db").write_bytes(b"")
    (srv / "tokengate.db.overrides.json").write_text(json.dumps({"v": 1, "paused": ["batch"]}))
    monkeypatch.chdir(home)
    config, note = beside_the_file(parse_config(EXAMPLE, "f"), str(f))
    assert config.gate.journal == str(srv / "tokengate.db") and config.gate.control_socket_path() == str(srv / "tokengate.sock")
    assert note is not None and str(srv / "tokengate.db") in note
    rc, out, err = run("overrides", "--config", str(f))
    assert rc == 0 and "batch paused" in out, (out, err)
    assert "reading the one beside" in err
    (home / "tokengate.db").write_bytes(b"")  # one here: the gate's working directory may be here
    assert beside_the_file(parse_config(EXAMPLE, "f"), str(f)) == (parse_config(EXAMPLE, "f"), None)


def test_commands_reading_a_configs_relative_journal_name_the_file_they_read(tmp_path, monkeypatch):
    """A trial ran `tokengate overrides --config prod/tokengate.toml` from another gate's
    directory, mid-incident: the config's relative journal resolved here (as documented, and as
    `serve` reads it), and that gate's overrides were shown as prod's state, with no word of
    which file. The rule stays; every command reading a relative path from a config names it."""
    from gate.config import EXAMPLE_CONFIG as EXAMPLE

    prod, other = tmp_path / "prod", tmp_path / "other"
    prod.mkdir()
    other.mkdir()
    f = prod / "tokengate.toml"
    f.write_text(EXAMPLE)
    for folder, paused in ((prod, "interactive"), (other, "batch")):
        (folder / "tokengate.db").write_bytes(b"")
        (folder / "tokengate.db.overrides.json").write_text(json.dumps({"v": 1, "paused": [paused]}))
    monkeypatch.chdir(other)
    here = f"journal {other / 'tokengate.db'}"
    rc, out, err = run("overrides", "--config", "../prod/tokengate.toml")
    assert rc == 0 and "batch paused" in out  # the rule: the current directory's
    assert f"tokengate overrides: {here} and control socket {other / 'tokengate.sock'} (relative to the current directory" in err
    assert f"the config file's folder holds another journal, {prod / 'tokengate.db'}: if its gate runs there, pass --journal" in err
    rc, out, err = run("overrides", "--config", str(f), "--journal", str(prod / "tokengate.db"))
    assert rc == 0 and "interactive paused" in out
    assert here not in err and "another journal" not in err  # the journal given: only the socket is the config's
    assert f"control socket {other / 'tokengate.sock'} (relative to the current directory" in err
    rc, _, err = run("log", "--config", str(f))
    assert f"tokengate log: {here} (relative to the current directory" in err and "control socket" not in err
    rc, _, err = run("console", "--read-only", "--config", str(f))  # no gate on it: refused, after the note
    assert f"tokengate console: control socket {other / 'tokengate.sock'} (relative" in err and "journal /" not in err
    absolute = prod / "absolute.toml"
    absolute.write_text(EXAMPLE.replace('journal = "tokengate.db"', f'journal = "{prod / "tokengate.db"}"'))
    rc, out, err = run("overrides", "--config", str(absolute))
    assert rc == 0 and "interactive paused" in out and "relative" not in err  # nothing relative: nothing said


def _kept_pause(tmp_path):
    f = tmp_path / "tokengate.toml"
    journal = tmp_path / "tokengate.db"
    f.write_text(EXAMPLE_CONFIG.replace('journal = "tokengate.db"', f'journal = "{journal}"'))
    kept = tmp_path / "tokengate.db.overrides.json"
    kept.write_text(json.dumps({"v": 1, "paused": ["batch"], "frozen": True}))
    return f, journal, kept


def _audit(journal) -> list[tuple]:
    import sqlite3

    if not journal.exists():
        return []
    with contextlib.closing(sqlite3.connect(journal)) as db:
        return db.execute("SELECT operator, origin, source, action, target, old_value, new_value, note FROM audit").fetchall()


async def test_overrides_drop_with_no_gate_running_is_audited_in_the_journal(tmp_path, monkeypatch):
    """A trial's offline `overrides drop` deleted a paused class and the freeze with no trace."""
    from gate.data.commands import Operator
    from gate.service import GateService
    from tests.fakes import fake_llama_transport

    monkeypatch.setenv("USER", "carol")
    monkeypatch.delenv("SUDO_USER", raising=False)
    monkeypatch.setenv("SSH_CONNECTION", "192.0.2.9 51000 10.0.0.1 22")
    f, journal, kept = _kept_pause(tmp_path)
    rc, out, err = run("overrides", "drop", "--config", str(f))
    assert rc == 0, err
    assert not kept.exists() and "batch paused; controller frozen" in out and f"audited in {journal}" in out
    ((operator, origin, source, action, target, old, new, note),) = _audit(journal)
    assert (operator, origin, source, action, target) == ("carol", "192.0.2.9", "cli", "overrides_dropped", "overrides")
    assert old == "batch paused; controller frozen" and new is None
    assert "no gate ran on" in note and "the next start runs on the config file alone" in note
    assert os.stat(journal).st_mode & 0o077 == 0
    # the next start agrees with the row: nothing restored, nothing paused, nothing frozen
    g = GateService(parse_config(f.read_text()), environ={}, transport=fake_llama_transport())
    try:
        g.control.keep_beside(str(journal), operator=Operator("tokengate", "local"))
        await g.backends.probe_all()
        for b in g.backends:
            g.control.adopt(b)
        assert not g.control.paused and not g.control.frozen and g.control.overrides.lines() == ()
        assert not [a for a in g.recent_audit if a.action in ("restored", "restore_refused")]
    finally:
        await g.client.aclose()
    rc, out, _ = run("overrides", "drop", "--config", str(f))  # nothing left: nothing to audit
    assert rc == 0 and "nothing to drop" in out and len(_audit(journal)) == 1


def test_overrides_drop_refuses_while_a_gate_holds_the_journal_without_its_socket(tmp_path):
    """A gate serving without its control socket (one it could not bind) writes its overrides
    again within a second: a drop beside it would be undone, and the next start restore them."""
    from gate.ops.lock import JournalLock

    f, journal, kept = _kept_pause(tmp_path)
    before = kept.read_text()
    gate = JournalLock(str(journal))
    gate.acquire("gpu-1:4242:20260101T000000Z")
    try:
        rc, out, err = run("overrides", "drop", "--config", str(f))
    finally:
        gate.release()
    assert rc == 1 and "in use by another gate" in err and "gpu-1:4242" in err and "Nothing dropped" in err
    assert kept.read_text() == before and not _audit(journal)


def test_overrides_drop_that_cannot_write_its_audit_row_drops_nothing(tmp_path):
    f, journal, kept = _kept_pause(tmp_path)
    before = kept.read_text()
    journal.write_bytes(b"not a database, not even close: " * 64)
    rc, out, err = run("overrides", "drop", "--config", str(f))
    assert rc == 1 and "the audit row could not be written" in err and "nothing dropped" in err
    assert kept.read_text() == before and not list(tmp_path.glob("*.dropping"))


@pytest.mark.parametrize("bad", ["budget", "min_tokens=3"])
def test_config_set_names_what_it_needs(tmp_path, bad):
    f = tmp_path / "t.toml"
    f.write_text("")
    rc, _, err = run("config", "set", str(f), bad)
    assert rc == 2 and "TABLE.KEY" in err


@pytest.mark.parametrize("action", [[], ["drop"], ["write"]])
def test_overrides_on_a_journal_that_is_not_there_say_so(tmp_path, monkeypatch, action):
    """A trial ran `tokengate overrides` (and `overrides drop`) in the wrong directory, without
    --config: "no runtime overrides ... the gate runs on its config file" and "dropped 0 kept
    overrides", exit 0, about a journal that did not exist."""
    monkeypatch.chdir(tmp_path)
    f = tmp_path / "t.toml"
    f.write_text("")
    rc, out, err = run("overrides", *action, *(["--config", str(f)] if action == ["write"] else []))
    assert rc == 1 and "tokengate.db" in err and "not found" in err and "--config" in err
    assert not list(tmp_path.glob("*.json"))


def test_config_set_with_a_typo_in_a_class_name_says_which_class_was_meant(tmp_path):
    """A trial typed `config set F classes.interactve.queue_depth=32` and was told
    "classes.interactve.priority: missing; every class needs a priority": true of a new class,
    but what was wrong was the class's name."""
    f = tmp_path / "tokengate.toml"
    f.write_text(EXAMPLE_CONFIG)
    rc, _, err = run("config", "set", str(f), "classes.interactve.queue_depth=32")
    assert rc == 2 and "classes.interactve" in err and "did you mean 'interactive'" in err
    assert f.read_text() == EXAMPLE_CONFIG
    # a new class given whole is still a new class
    rc, _, err = run("config", "set", str(f), "classes.bulk.priority=0", "classes.bulk.queue_depth=4")
    assert rc == 0, err
    assert parse_config(f.read_text(), "f").class_by_name("bulk").queue_depth == 4


@pytest.mark.skipif(os.geteuid() != 0, reason="changing a file's group to one we are not in needs root")
def test_config_set_keeps_the_files_owner_group_and_mode(tmp_path) -> None:
    """The README's systemd setup keeps the config root-owned and readable by the service's
    group only (0640: it may hold the Redis password). A trial's `sudo tokengate config set`
    on such a file left it root:root: the service could no longer read its own config, and
    the next reload or restart failed. The new file never exists with wider permissions either."""
    f = tmp_path / "tokengate.toml"
    f.write_text(EXAMPLE_CONFIG)
    os.chown(f, 0, 65534)
    os.chmod(f, 0o640)
    seen: list[int] = []
    real_replace = os.replace

    def spy(src, dst):
        seen.append(os.stat(src).st_mode & 0o777)
        return real_replace(src, dst)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(os, "replace", spy)
        rc, out, err = run("config", "set", str(f), "budget.min_tokens=1024")
    assert rc == 0, err
    st = f.stat()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (0, 65534, 0o640)
    assert seen == [0o640]
    assert "min_tokens = 1024" in f.read_text()


@pytest.mark.parametrize(
    ("edit", "hint"),
    [
        ("backends.url=http://127.0.0.1:9000", "backends[0].url"),
        ("tenants.weight=2", "tenants[0].weight"),
        ("backends[3].url=http://127.0.0.1:9000", "1 [[backends]]"),
    ],
)
def test_config_set_of_a_list_table_names_the_indexed_form(tmp_path, edit, hint):
    """A user ran `config set F backends.url=...` on the example and got "F: line 284, column 10:
    invalid TOML: Cannot declare ('backends',) twice" (the file has 282 lines: the line is in
    the edit's own text), and `backends[3].url=...` crashed: "tokengate: error: ValueError:",
    exit 1. [[backends]], [[tenants]] and [[fleet]] are lists: name one, `backends[0].url`
    (what `tokengate crunch` prints); a usage error exits 2 and changes nothing."""
    f = tmp_path / "tokengate.toml"
    f.write_text(EXAMPLE_CONFIG)
    rc, out, err = run("config", "set", str(f), edit)
    assert rc == 2, err
    assert hint in err and "ValueError" not in err and "line " not in err
    assert f.read_text() == EXAMPLE_CONFIG
    rc, _, err = run("config", "set", str(f), "backends[0].url=http://127.0.0.1:9000")
    assert rc == 0, err
    assert parse_config(f.read_text(), "f").backends[0].url == "http://127.0.0.1:9000"


def test_config_set_help_shows_how_to_name_a_backend():
    rc, out, _ = run("config", "set", "--help")
    assert rc == 0 and "backends[0].url" in out


@pytest.mark.parametrize("action", [[], ["write"]])
def test_overrides_show_on_a_damaged_file_says_so_and_moves_nothing(tmp_path, action):
    """A trial ran `tokengate overrides --config F` while the kept file was damaged: it renamed
    the running gate's file to `.bad`, logged "starting from the config file alone" (it starts
    nothing) and answered "no runtime overrides (... absent): the gate runs on its config file",
    exit 0, while that gate held a pause and a retune. A listing reads; it says what it found."""
    f = tmp_path / "tokengate.toml"
    journal = tmp_path / "tokengate.db"
    f.write_text(EXAMPLE_CONFIG.replace('journal = "tokengate.db"', f'journal = "{journal}"'))
    kept = tmp_path / "tokengate.db.overrides.json"
    kept.write_text('{"v": 1, "paused": [')
    rc, out, err = run("overrides", *action, "--config", str(f))
    assert rc == 1 and "unreadable" in err and str(kept) in err
    assert "absent" not in out and "no retuned settings" not in out
    assert kept.read_text() == '{"v": 1, "paused": [' and not (tmp_path / "tokengate.db.overrides.json.bad").exists()
