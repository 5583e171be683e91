"""The decision tail's table: follows the newest row across layouts, renders a row once, shows
cells as plain printable text, cuts only a fixed-width column (and says so with an ellipsis)."""

from __future__ import annotations

from textual.app import App, ComposeResult

from console.widgets.tail_table import TailTable
from tests.console.conftest import decision, make_app, record

COLUMNS = [("time", "ended", None), ("tenant", "tenant", 6), ("ttft", "TTFT ms", None)]


class OneTable(App):
    """A TailTable alone, with COLUMNS."""

    def compose(self) -> ComposeResult:
        self.table = TailTable(id="t")
        self.table.set_columns(COLUMNS)
        yield self.table


def add_rows(table: TailTable, numbers: range) -> None:
    for i in numbers:
        table.add_row([(f"t{i}", ""), ("acme", ""), (str(i), "")], key=f"r{i}")


def bottom_row_key(table: TailTable) -> str:
    """The row on the last line of the view."""
    return table.row_keys[int(table.scroll_y) + table.scrollable_content_region.height - 2]


async def test_the_tail_keeps_the_newest_row_in_view_tick_after_tick(gate):
    app = make_app(gate)
    async with app.run_test(size=(160, 48)) as pilot:
        table = app.decisions.table
        for _ in range(6):
            newest = None
            for _ in range(30):
                newest = decision("interactive")
                record(gate, newest)
            await app.tick()
            await pilot.pause()  # a layout between ticks, as in a terminal
            assert table.max_scroll_y > 0
            assert table.scroll_y == table.max_scroll_y and app.decisions.following
            assert bottom_row_key(table).rpartition(" ")[0] == newest.request_id


async def test_scrolled_back_it_stays_put_and_scrolling_to_the_end_follows_again():
    app = OneTable()
    async with app.run_test(size=(60, 12)) as pilot:
        table = app.table
        add_rows(table, range(40))
        await pilot.pause()
        assert table.following and bottom_row_key(table) == "r39"
        table.scroll_to(y=5, animate=False, immediate=True)
        assert not table.following
        add_rows(table, range(40, 50))
        await pilot.pause()
        assert table.scroll_y == 5 and not table.following
        table.clear()  # a trim or a filter refills it: not a scroll back to the end
        add_rows(table, range(50))
        await pilot.pause()
        assert not table.following
        table.scroll_to(y=table.max_scroll_y, animate=False, immediate=True)
        assert table.following
        add_rows(table, range(50, 51))
        await pilot.pause()
        assert bottom_row_key(table) == "r50"


async def test_a_new_row_renders_only_itself(monkeypatch):
    app = OneTable()
    async with app.run_test(size=(60, 12)) as pilot:
        table = app.table
        add_rows(table, range(30))
        await pilot.pause()
        height = table.scrollable_content_region.height
        for y in range(height):
            table.render_line(y)
        built = []
        real = TailTable._line
        monkeypatch.setattr(TailTable, "_line", lambda self, *a: built.append(a) or real(self, *a))
        add_rows(table, range(30, 33))
        await pilot.pause()
        for y in range(height):
            table.render_line(y)
        assert len(built) == 3  # the three new rows; the header and the rows still in view are cached
        built.clear()
        table.add_row([("t33", ""), ("acme", ""), ("a much wider cell", "")], key="r33")
        for y in range(height):
            table.render_line(y)
        assert len(built) == height  # a column grew: every line in view is built again, once


async def test_cells_are_printable_plain_text_and_only_a_fixed_width_cuts():
    app = OneTable()
    async with app.run_test(size=(60, 6)) as pilot:
        table = app.table
        table.add_row([("[bold]x[/]", ""), ("ev\x1b[2Jil-corp", "red"), ("123,456,789", "")], key="a")
        await pilot.pause()
        line = table.render_line(1).text
        assert "[bold]x[/]" in line  # markup is text
        assert "\x1b" not in line and "ev?[2…" in line  # fixed width 6: cut, with an ellipsis
        assert "123,456,789" in line  # a number is never cut
        assert table.get_cell("a", "tenant") == "ev?[2Jil-corp"
        assert table.column_width("ttft") == len("123,456,789")


async def test_the_scroll_keys_leave_the_end_and_come_back():
    app = OneTable()
    async with app.run_test(size=(60, 12)) as pilot:
        table = app.table
        add_rows(table, range(40))
        table.focus()
        await pilot.pause()
        await pilot.press("pageup")
        assert not table.following and table.scroll_y < table.max_scroll_y
        add_rows(table, range(40, 41))
        await pilot.pause()
        assert not table.following and bottom_row_key(table) != "r40"
        await pilot.press("end")
        await pilot.pause()
        assert table.following
        add_rows(table, range(41, 42))
        await pilot.pause()
        assert bottom_row_key(table) == "r41"


def top_row_key(table: TailTable) -> str:
    return table.row_keys[int(table.scroll_y)]


async def test_dropping_the_oldest_rows_keeps_a_scrolled_back_view_on_its_rows():
    app = OneTable()
    async with app.run_test(size=(60, 12)) as pilot:
        table = app.table
        add_rows(table, range(400))
        await pilot.pause()
        table.scroll_to(y=250, animate=False, immediate=True)  # 150 rows back from the end
        await pilot.pause()
        assert top_row_key(table) == "r250" and not table.following
        add_rows(table, range(400, 420))
        table.drop_oldest(120)  # the tail's trim
        await pilot.pause()
        assert table.row_count == 300 and table.row_keys[0] == "r120"
        assert top_row_key(table) == "r250" and not table.following  # the same rows, still not following
        table.scroll_to(y=0, animate=False, immediate=True)
        table.drop_oldest(50)  # the rows in view are dropped: the oldest kept shows
        await pilot.pause()
        assert top_row_key(table) == "r170" and not table.following
        table.scroll_to(y=table.max_scroll_y, animate=False, immediate=True)
        await pilot.pause()
        table.drop_oldest(10)  # following: still on the newest
        add_rows(table, range(420, 421))
        await pilot.pause()
        assert table.following and bottom_row_key(table) == "r420"
