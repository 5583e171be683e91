"""The console's log beside the journal is as private as the journal (a security review: the
journal, socket, lock and overrides were 0600, the `<journal>.log` the default umask's 0644)."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

from console.run import _log_beside


def test_the_log_beside_the_journal_is_created_private_and_an_open_one_tightened(tmp_path: Path) -> None:
    root = logging.getLogger()
    kept = list(root.handlers)
    old = os.umask(0o022)
    try:
        _log_beside(str(tmp_path / "tokengate.db"))
        assert stat.S_IMODE(os.stat(tmp_path / "tokengate.log").st_mode) == 0o600
        loose = tmp_path / "other.log"
        loose.write_text("")
        loose.chmod(0o644)
        _log_beside(str(tmp_path / "other.db"))
        assert stat.S_IMODE(os.stat(loose).st_mode) == 0o600
    finally:
        os.umask(old)
        for handler in [h for h in root.handlers if h not in kept]:
            root.removeHandler(handler)
            handler.close()
