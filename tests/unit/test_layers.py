"""The dependency rule of gate/ and console/, read from the source (an AST walk).

Every import counts: module level, inside functions, and under ``if TYPE_CHECKING:``
(a type-only arrow upward is still an arrow a reader has to follow). The rule:

1. Each folder of ``gate/`` imports only the folders below it in ``LAYERS`` (and itself).
2. ``gate/core`` imports the standard library only, and reads no clock.
3. Nothing in ``gate/`` imports ``gate.service`` but the entry points (``gate/serve.py``,
   ``gate/cli.py``).
4. ``console/`` imports only plain data, the link and the journal reader; its launchers
   (``run.py``, ``screenshots.py``) start gates and so may reach further. One exception,
   exactly the package ``gate.tools.replay`` (its ``__init__`` names, not its modules): the
   review screen's what-if (#24) runs the replay engine on the journal window it shows. The
   engine needs gate.config and gate.core, which gate.journal.reader may not wrap without
   the journal layer reaching up into tools; re-exporting it there would hide the arrow,
   so the arrow is named here instead.
5. No import cycle anywhere.

``test_the_rule_catches_*`` are the negative controls: the same checker on small trees that
break a rule must report it, so a checker that reports nothing cannot pass.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: lowest first; a folder may import the folders before it
LAYERS = ("core", "data", "config", "journal", "backend", "fleet", "observe", "http", "ops", "tools")
TOP = ("service", "serve", "cli")
#: what console/ may import of gate (module prefixes)
CONSOLE_MAY = ("gate.data", "gate.core.reasons", "gate.ops.link", "gate.journal.reader", "gate.journal.filters")
#: what console/ may import by exact module name (the what-if's replay entry point, rule 4)
CONSOLE_MAY_EXACT = ("gate.tools.replay",)
CONSOLE_LAUNCHERS = ("console.run", "console.screenshots")
CLOCKS = {
    ("time", "time"),
    ("time", "monotonic"),
    ("time", "perf_counter"),
    ("time", "monotonic_ns"),
    ("time", "time_ns"),
    ("datetime", "now"),
    ("datetime", "utcnow"),
    ("date", "today"),
}


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(root: Path, path: Path) -> Iterator[tuple[int, str]]:
    """(line, absolute module name) of every import in the file, relative ones resolved."""
    name = module_name(root, path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            yield node.lineno, target
            for alias in node.names:  # `from gate.core import admission` imports a module
                yield node.lineno, f"{target}.{alias.name}"


def modules(root: Path) -> dict[str, Path]:
    found = {}
    for top in ("gate", "console"):
        for path in sorted((root / top).rglob("*.py")):
            found[module_name(root, path)] = path
    return found


def layer_of(name: str) -> int | None:
    """Index in LAYERS (TOP after them); None for the gate package itself and non-gate names."""
    parts = name.split(".")
    if parts[0] != "gate" or len(parts) < 2:
        return None
    if parts[1] in LAYERS:
        return LAYERS.index(parts[1])
    if parts[1] in TOP:
        return len(LAYERS) + TOP.index(parts[1])
    return None


def internal(name: str, known: dict[str, Path]) -> str | None:
    """The gate/console module an imported name refers to (a module, or a name in one)."""
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


def violations(root: Path) -> list[str]:
    known = modules(root)
    found: list[str] = []
    graph: dict[str, set[str]] = {m: set() for m in known}
    for mod, path in known.items():
        where = path.relative_to(root)
        mine = layer_of(mod)
        for line, target in imports(root, path):
            dep = internal(target, known)
            if dep is not None and dep != mod and not mod.startswith(dep + "."):
                graph[mod].add(dep)
            top = target.split(".")[0]
            if mod.startswith("gate.core") and top not in ("gate", "__future__") and top not in sys.stdlib_module_names:
                found.append(f"{where}:{line}: the core imports {target}, not the standard library")
            if dep is None or dep == "gate":
                continue
            theirs = layer_of(dep)
            if dep == "gate.service" and mod.startswith("gate.") and mod not in ("gate.cli", "gate.serve"):
                found.append(f"{where}:{line}: imports gate.service (only the entry points may)")
            elif mod.startswith("gate.") and mine is not None and theirs is not None and theirs > mine:
                found.append(f"{where}:{line}: {mod} ({_layer(mine)}) imports {dep} ({_layer(theirs)}), a layer above")
            elif mod.startswith("gate.core") and not dep.startswith("gate.core"):
                found.append(f"{where}:{line}: the core imports {dep}")
            elif mod.startswith("console.") and dep.startswith("gate.") and mod not in CONSOLE_LAUNCHERS:
                if not dep.startswith(CONSOLE_MAY) and dep not in CONSOLE_MAY_EXACT:
                    found.append(f"{where}:{line}: the console imports {dep} (only plain data, the link, the journal reader)")
        if mod.startswith("gate.core"):
            found += [f"{where}:{line}: the core reads the clock ({what})" for line, what in clock_reads(path)]
    found += [f"import cycle: {' -> '.join(c)}" for c in cycles(graph)]
    return list(dict.fromkeys(found))  # `from a import b` names a and a.b: one line each


def _layer(index: int) -> str:
    return (LAYERS + TOP)[index]


def clock_reads(path: Path) -> Iterator[tuple[int, str]]:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if (node.value.id, node.attr) in CLOCKS:
                yield node.lineno, f"{node.value.id}.{node.attr}"


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_tree_keeps_the_dependency_rule():
    found = violations(ROOT)
    assert not found, "\n".join(found)


def test_every_layer_says_what_it_may_know():
    for layer in LAYERS:
        init = ROOT / "gate" / layer / "__init__.py"
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and "May know" in doc, f"gate/{layer}/__init__.py: a docstring saying what it may know"


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in {"gate/__init__.py": "", "console/__init__.py": "", **files}.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    for layer in LAYERS:
        (tmp_path / "gate" / layer).mkdir(parents=True, exist_ok=True)
        (tmp_path / "gate" / layer / "__init__.py").touch()
    return tmp_path


GOOD = {"gate/core/ledger.py": "import math\n", "gate/backend/pool.py": "from gate.core import ledger\n"}


def test_the_rule_passes_a_tree_that_keeps_it(tmp_path):
    assert violations(_tree(tmp_path, GOOD)) == []


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"gate/core/ledger.py": "from gate.backend import pool\n"}, "a layer above"),
        (
            {"gate/core/ledger.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from gate.http.proxy import X\n"},
            "a layer above",
        ),
        ({"gate/core/ledger.py": "def f():\n    from ..backend.pool import Pool\n"}, "a layer above"),
        ({"gate/core/ledger.py": "import httpx\n"}, "not the standard library"),
        ({"gate/core/ledger.py": "import time\nnow = time.monotonic()\n"}, "reads the clock"),
        ({"gate/core/ledger.py": "from gate.data import records\n"}, "gate.core.ledger (core) imports gate.data (data)"),
        ({"gate/http/proxy.py": "from gate import service\n", "gate/service.py": ""}, "only the entry points may"),
        ({"console/app.py": "from gate.backend import pool\n"}, "the console imports gate.backend.pool"),
        (
            {
                "console/app.py": "from gate.tools.replay.engine import replay\n",
                "gate/tools/__init__.py": "",
                "gate/tools/replay/__init__.py": "",
                "gate/tools/replay/engine.py": "",
            },
            "the console imports gate.tools.replay.engine",
        ),
        ({"gate/core/a.py": "from gate.core import b\n", "gate/core/b.py": "from gate.core import a\n"}, "import cycle"),
    ],
    ids=[
        "upward",
        "type-checking",
        "relative-lazy",
        "third-party",
        "clock",
        "core-to-data",
        "service",
        "console",
        "console-replay-module",
        "cycle",
    ],
)
def test_the_rule_catches_a_tree_that_breaks_it(tmp_path, files, expected):
    found = violations(_tree(tmp_path, {**GOOD, **files}))
    assert any(expected in line for line in found), found
