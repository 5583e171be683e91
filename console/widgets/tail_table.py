"""TailTable: an append-only table that renders each row once.

The decision tail gains up to MAX_NEW_ROWS_PER_TICK rows a tick. As a Textual
`DataTable` every new row invalidated every cached cell (its cache keys carry
an update count), so each tick re-rendered every visible cell through Rich, then
scrolled to the end after the refresh, which rendered them all again. Measured
with `tokengate console --attach` in front of the real llama-server at 20 req/s
on a 2-vCPU host (llama-server `-t 2`): the tail's table was ~40-60 ms of the
console's CPU a second, and the gate's p99 went from 37-63 ms (tail not updated)
to 76-112 ms (tail updated); the console was the only difference.

Here a row becomes a `Strip` the first time it is shown, cached by row key (a
row keeps its stripe until the next `clear`), and a tick costs the new rows only (a visible line is a cache
lookup and a crop). The Line API (`render_line`) on a `ScrollView` keeps what
the tail needs of a table: a fixed header line, zebra stripes, per-cell styles,
column widths that fit the widest cell (never cut a number), scrollbars, the
wheel and the scroll keys. Cells are plain strings with a style name: a tenant
name is client-chosen and never read as markup, nor written to the terminal
with its control characters.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rich.cells import cell_len, set_cell_size
from rich.segment import Segment
from rich.style import Style
from textual.geometry import Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

Cell = tuple[str, str]  # (text, rich style name; "" for none)


def _printable(text: str) -> str:
    """What reaches the terminal: a control character (an escape sequence) never does."""
    return text if text.isprintable() else "".join(ch if ch.isprintable() else "?" for ch in text)


#: spaces between two columns by default (DataTable's look: one either side of each cell)
GAP = 2


class TailTable(ScrollView, can_focus=True):
    """Rows appended at the bottom, the oldest dropped by `drop_oldest`; see the module docstring."""

    COMPONENT_CLASSES = {"tail-table--header", "tail-table--even-row"}

    class FollowingChanged(Message):
        """The view left the newest row, or came back to it (say so at once, not at the next row)."""

    DEFAULT_CSS = """
    TailTable {
        background: $surface;
        color: $foreground;
        & > .tail-table--header {
            text-style: bold;
            background: $panel;
            color: $foreground;
        }
        & > .tail-table--even-row {
            background: $surface-lighten-1 50%;
        }
        &:dark > .tail-table--even-row {
            background: $surface-darken-1 40%;
        }
    }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._columns: list[tuple[str, str, int | None]] = []  # key, label, fixed width or None
        self._gap = GAP
        self._widths: list[int] = []
        self._keys: list[str] = []
        self._rows: dict[str, tuple[Sequence[Cell], int]] = {}  # key -> (cells, serial)
        self._serial = 0
        self._strips: dict[str, tuple[Strip, Style]] = {}  # row key -> the line, its background
        self._header: tuple[Strip, Style] | None = None
        #: show the newest row as rows come (and as the widget resizes), until the view is
        #: scrolled away from the end; scrolling back to the end follows again
        self.following = True

    # ---- columns and rows ------------------------------------------------------

    def set_columns(self, columns: Sequence[tuple[str, str, int | None]], *, gap: int = GAP) -> None:
        """(key, label, width) each; width None fits the widest cell; `gap` spaces between
        columns (one more at either edge). Drops every row."""
        self._columns = list(columns)
        self._gap = gap
        self.clear()

    @property
    def column_keys(self) -> list[str]:
        return [key for key, _, _ in self._columns]

    @property
    def labels(self) -> list[str]:
        return [label for _, label, _ in self._columns]

    def clear(self) -> None:
        following = self.following  # emptied to be refilled (a trim, a filter): not a scroll
        self._keys.clear()
        self._rows.clear()
        self._serial = 0  # a row keeps its serial (and stripe) until the next clear
        self._widths = [w if w is not None else cell_len(label) for _, label, w in self._columns]
        self._forget()
        self._resize()
        self.following = following

    def add_row(self, cells: Sequence[Cell], *, key: str) -> None:
        self.add_rows([(key, cells)])

    def add_rows(self, rows: Iterable[tuple[str, Sequence[Cell]]]) -> None:
        """(key, cells) each, appended in order; the table is resized once for all of them."""
        grown = False
        for key, cells in rows:
            if key in self._rows:
                raise ValueError(f"row {key!r} is already in the table")
            if len(cells) != len(self._columns):
                raise ValueError(f"{len(cells)} cells for {len(self._columns)} columns")
            cells = tuple((_printable(text), style) for text, style in cells)
            self._keys.append(key)
            self._rows[key] = (cells, self._serial)
            self._serial += 1
            for i, ((text, _), (_, _, fixed)) in enumerate(zip(cells, self._columns)):
                width = cell_len(text)
                if fixed is None and width > self._widths[i]:
                    self._widths[i] = width
                    grown = True
        if grown:
            self._forget()
        self._resize()

    def drop_oldest(self, n: int) -> None:
        """Remove the `n` oldest rows. A view scrolled back keeps showing the rows it showed
        (scrolled up by `n`; those rows, if dropped, give way to the oldest kept); a following
        view keeps following."""
        n = min(n, len(self._keys))
        if n <= 0:
            return
        for key in self._keys[:n]:
            del self._rows[key]
            self._strips.pop(key, None)
        del self._keys[:n]
        following = self.following
        self._resize()
        if not following:
            self.scroll_to(y=max(0, self.scroll_y - n), animate=False, immediate=True)

    def __contains__(self, key: object) -> bool:
        return key in self._rows

    @property
    def row_count(self) -> int:
        return len(self._keys)

    @property
    def row_keys(self) -> list[str]:
        """Oldest first, newest at the bottom."""
        return list(self._keys)

    def column_width(self, column: str) -> int:
        """Cells of `column` show this many characters (padding aside)."""
        return self._widths[self.column_keys.index(column)]

    def get_cell(self, key: str, column: str) -> str:
        cells, _ = self._rows[key]
        return cells[self.column_keys.index(column)][0]

    # ---- scrolling -------------------------------------------------------------

    def scroll_to_newest(self) -> None:
        """Show the newest row and follow from here: Textual's anchor keeps the end in view at
        every layout (a new row, a resize), with no extra refresh."""
        self.following = True
        if self.is_mounted:
            self.anchor()  # (any scroll_to releases it: the user's scroll, or a test's)

    def on_mount(self) -> None:
        if self.following:
            self.anchor()

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        # A scroll away (the wheel, a key, the scrollbar) has released the anchor already;
        # back at the end, anchor again, once the scroll (maybe animated) is done with.
        following = new_value >= self.max_scroll_y
        if following != self.following:
            self.following = following
            if following:
                self.call_later(self._anchor_at_end)
            self.post_message(self.FollowingChanged())

    def _anchor_at_end(self) -> None:
        if self.following:  # not scrolled away since (rows may have come: anchor() shows them)
            self.anchor()

    # ---- rendering ---------------------------------------------------------------

    def _resize(self) -> None:
        """The new virtual size, without a layout of the screen.

        `virtual_size` is a `layout=True` reactive: set plainly, each new row re-arranged every
        widget on the screen (once a tick, whatever the request rate). A ScrollView's size does
        not depend on its virtual size, so nothing else can move: set it quietly, update the
        scrollbars, keep the newest row in view when following (what the layout's anchor did),
        and repaint this widget only.
        """
        width = sum(self._widths) + self._gap * max(len(self._widths) - 1, 0) + 2
        size = Size(width, len(self._keys) + 1)  # + the header line
        if size != self.virtual_size:
            self.set_reactive(TailTable.virtual_size, size)
            if self.is_mounted:
                self._scroll_update(size)  # scrollbars; the scroll clamped into the new size
                if self.following and self.is_anchored:
                    self.scroll_y = self.max_scroll_y  # the anchor's job, done here (no layout comes)
        self.refresh()

    def _forget(self) -> None:
        self._strips.clear()
        self._header = None

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._forget()

    def _line(self, cells: Sequence[Cell], base: Style) -> Strip:
        segments: list[Segment] = [Segment(" ", base)]
        gap = Segment(" " * self._gap, base)
        for i, ((text, style), width) in enumerate(zip(cells, self._widths)):
            if cell_len(text) > width:  # only a fixed width cuts, and says so
                text = set_cell_size(text, max(width - 1, 0)) + "…"
            if i:
                segments.append(gap)
            segments.append(Segment(set_cell_size(text, width), base + Style.parse(style)))  # parse is cached
        segments.append(Segment(" ", base))
        return Strip(segments)

    def _header_line(self) -> tuple[Strip, Style]:
        if self._header is None:
            base = self.rich_style + self.get_component_rich_style("tail-table--header")
            self._header = (self._line([(label, "") for label in self.labels], base), base)
        return self._header

    def _row_line(self, key: str) -> tuple[Strip, Style]:
        line = self._strips.get(key)
        if line is None:
            cells, serial = self._rows[key]
            base = self.rich_style
            if serial % 2 == 0:  # DataTable's convention: the first row is "even"
                base += self.get_component_rich_style("tail-table--even-row")
            line = self._strips[key] = (self._line(cells, base), base)
        return line

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        width = self.scrollable_content_region.width
        if y == 0:
            strip, base = self._header_line()
        else:
            index = scroll_y + y - 1
            if not 0 <= index < len(self._keys):
                return Strip.blank(width, self.rich_style)
            strip, base = self._row_line(self._keys[index])
        return strip.crop_extend(scroll_x, scroll_x + width, base)  # the row's colour to the edge
