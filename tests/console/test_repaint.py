"""A tick repaints what changed, never the whole screen.

The console ticks about once a second (and at every snapshot it is sent). A new decision
row used to grow the tail's virtual size, a `layout=True` reactive in Textual: every tick
re-arranged every widget on the screen and the terminal got the whole screen again (~2
full redraws a second at 160x48, whatever the request rate), the console's CPU that an
open console costs a 2-core host beside its gate. And Textual's border titles repaint their
whole widget on every set, even to the same text: the tail's subtitle, set each tick, sent
the tail's 96x30 box to the terminal again. Measured here at 160x48 with 3 new decisions a
tick: 2 screen updates a tick covering 9,160 cells (the screen is 7,680) before, 1 covering
3,360 now (the tail's table, which scrolls by 3 rows, the classes table, whose counts
change, and the subtitle's one row); a tick with nothing new repaints nothing.
"""

from __future__ import annotations

from textual._compositor import Compositor
from textual.screen import Screen

from tests.console.conftest import decision, make_app, record


async def test_ticks_with_new_decisions_neither_lay_out_nor_redraw_the_whole_screen(gate, monkeypatch):
    layouts: list[bool] = []
    full: list[int] = []
    dirty: list[int] = []  # cells marked for repainting, per screen update
    real_layout = Screen._refresh_layout
    real_full = Compositor.render_full_update
    real_update = Compositor.render_update

    def counting_layout(self, size=None, scroll=False):
        layouts.append(scroll)
        return real_layout(self, size, scroll)

    def counting_full(self, simplify=False):
        full.append(1)
        return real_full(self, simplify)

    def counting_update(self, full=False, screen_stack=None, simplify=False):
        screen = self.size.region
        dirty.append(sum(region.intersection(screen).area for region in self._dirty_regions))
        return real_update(self, full, screen_stack, simplify)

    monkeypatch.setattr(Screen, "_refresh_layout", counting_layout)
    monkeypatch.setattr(Compositor, "render_update", counting_update)
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
        dirty.clear()
        for _ in range(3):  # nothing new: nothing to repaint
            await app.tick()
            await pilot.pause()
        assert sum(dirty) == 0
        table = app.decisions.table
        for tick in range(10):
            for _ in range(3):
                newest = decision("interactive")
                record(gate, newest)
            await app.tick()
            await pilot.pause()
            assert table.scroll_y == table.max_scroll_y and app.decisions.visible_request_ids[-1] == newest.request_id, tick
        assert layouts.count(False) == 0  # no re-arrangement of the screen
        assert full == []  # the terminal gets the changed lines only
        assert len(dirty) <= 10  # one screen update a tick
        assert sum(dirty) / 10 < 160 * 48 / 2, dirty  # not every widget: the tail's table, the classes, a border row
