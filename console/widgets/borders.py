"""Border titles that repaint their border line only, and only when they change.

Textual's `border_title` / `border_subtitle` repaint the whole widget on every set, even
to the same text. The decision tail and the denials panel set their subtitle each tick:
the tail's container (96x30 at 160x48) and everything in it went to the terminal again
every tick, with the table's lines unchanged. Here an unchanged text costs nothing and a
changed one dirties the one border row it is drawn on.
"""

from __future__ import annotations

from textual.geometry import Region
from textual.widget import Widget


def set_border_text(widget: Widget, text: str, *, subtitle: bool = True) -> None:
    """Set `widget`'s border subtitle (or title) to `text` (markup, as Textual reads it)."""
    attr = "border_subtitle" if subtitle else "border_title"
    shown = widget.__dict__.setdefault("_tokengate_border_text", {})
    if shown.get(attr) == text:
        return
    shown[attr] = text
    width, height = widget.outer_size
    if not widget.is_mounted or height < 1:
        setattr(widget, attr, text)  # the first paint draws it whole anyway
        return
    # What the descriptor stores (widget.py, _BorderTitle.__set__), without its whole refresh.
    setattr(widget, f"_{attr}", widget.render_str(text).expand_tabs(4).split()[0])
    row = height - 1 if subtitle else 0
    offset = widget.content_offset  # refresh() takes regions in content space
    widget.refresh(Region(-offset.x, row - offset.y, width, 1))
