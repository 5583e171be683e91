"""The README lists every route of the route table, with what the gate does with it."""

from __future__ import annotations

from gate.data.endpoints import PREFLIGHT, ROUTES, UI_ASSET
from tests.data.readme_routes import BEGIN, END, README, table


def test_the_readme_route_table_is_the_generated_one() -> None:
    text = README.read_text()
    block = text[text.index(BEGIN) : text.index(END) + len(END)]
    assert block == table(), "the route table changed: run `python -m tests.data.readme_routes --write`"


def test_every_route_of_the_table_has_a_row() -> None:
    rows = table().splitlines()
    for route in (*ROUTES, UI_ASSET, PREFLIGHT):
        (row,) = [r for r in rows if r.startswith(f"| `{route.name}` |")]
        assert row.count("|") == 3  # a cell with a bare | would split the row
