"""A pytest plugin for the gate run: only the tests named in ``$CONFORMANCE_ONLY`` (one node id a
line: those that passed straight) run; the others are deselected, never an error."""

from __future__ import annotations

import os


def pytest_collection_modifyitems(config, items):  # noqa: ANN001, ANN201 - pytest's hook
    path = os.environ.get("CONFORMANCE_ONLY")
    if not path:
        return
    with open(path, encoding="utf-8") as f:
        wanted = {line.rstrip("\n") for line in f if line.strip()}
    keep = [item for item in items if item.nodeid in wanted]
    dropped = [item for item in items if item.nodeid not in wanted]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep
