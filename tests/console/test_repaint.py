"""A tick repaints what changed, never the whole screen.

The console ticks about once a second (and at every snapshot it is sent). A new decision
row used to grow the tail's virtual size, a `layout=True` reactive in Textual: every tick
re-arranged every widget on the screen and the terminal got the whole screen again (~2
full redraws a second at 160x48, whatever the request rate), the console's CPU that an
open console costs a 2-core host beside its gate.
"""

from __future__ import annotations

from textual._compositor import Compositor
from textual.screen import Screen

from tests.console.conftest import decision, make_app, record


async def test_ticks_with_new_decisions_neither_lay_out_nor_redraw_the_whole_screen(gate, monkeypatch):
    layouts: list[bool] = []
    full: list[int] = []
    real_layout = Screen._refresh_layout
    real_full = Compositor.render_full_update

    def counting_layout(self, size=None, scroll=False):
        layouts.append(scroll)
        return real_layout(self, size, scroll)

    def counting_full(self, simplify=False):
        full.append(1)
        return real_full(self, simplify)

    monkeypatch.setattr(Screen, "_refresh_layout", counting_layout)
    monkeypatch.setattr(Compositor, "render_full_update", counting_full)
    app = make_app(gate)
    async with app.run_test(size=(160, 48)) as pilot:
        for _ in range(40):  # more rows than the tail shows, so it scrolls from here on
            record(gate, decision("interactive"))
        await app.tick()
        await pilot.pause()
        await app.tick()  # one tick with nothing new: every panel at its settled size
        await pilot.pause()
        layouts.clear()
        full.clear()
        table = app.decisions.table
        for tick in range(10):
            for _ in range(3):
                newest = decision("interactive")
                record(gate, newest)
            await app.tick()
            await pilot.pause()
            assert table.scroll_y == table.max_scroll_y and table.row_keys[-1] == newest.request_id, tick
        print(f"layouts {len(layouts)} (full {layouts.count(False)}), full redraws {len(full)}")
        assert layouts.count(False) == 0  # no re-arrangement of the screen
        assert full == []  # the terminal gets the changed lines only
